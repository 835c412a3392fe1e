"""Fuzz the trace parser for longer than CI does (tests/test_fuzz.py): mutate small traces and check
that nothing but TraceqError escapes.

    python benchmarks/fuzz_parser.py                          # 5000 iterations
    python benchmarks/fuzz_parser.py --iterations 100000 --seed 7 --ingest-every 20

Each iteration takes a seed trace (the small corpus traces below when ../shared/corpus is here,
plus a hand-made one), applies 1-4 random mutations (truncate, flip a bit, insert random bytes or
a JSON token, delete, duplicate a range, gzip, put a wrong-typed value in place of a value, add a
non-object element to the event array, nest a value 100-5000 levels deep, insert up to 1 MB of
whitespace) and parses it as ingest does (reader + decode, with a
random chunk size). Every ``--ingest-every``-th input also goes through ``ingest_traces`` into a
scratch warehouse, which must then hold the file whole or not at all.

Prints the outcomes (parsed, failed grouped by the kind of message) and every escape (an exception
other than TraceqError, or an input still parsing after ``--hang-s``): what happened and the input,
saved under ``--out``. Exit code 1 when anything escaped.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import random
import re
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from traceq.errors import TraceqError
from traceq.ingest import ingest_traces

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.fuzzing import ELEMENT_SPOT, TOKENS, VALUE_SPOT, VALUES, parse, read_seeds, row_counts  # noqa: E402  (shared with tests/test_fuzz.py)

CORPUS = REPO.parent / "shared" / "corpus"
CORPUS_SEEDS = (
    "kineto_docs/after_fix_trace.json",
    "hta/call_stack/backward_thread.json",
    "hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
)
HAND_MADE = {
    "schemaVersion": 1,
    "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
    "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 100, "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "pid": 0, "tid": 7, "ts": 10.0, "dur": 20.0,
         "args": {"device": 0, "stream": 7, "correlation": 1001}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1, "ts": 5.0, "dur": 1.0,
         "args": {"correlation": 1001}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
         "ts": 40.123, "dur": 20.5, "args": {"stream": 20, "correlation": 1002, "Collective name": "allreduce", "Seq": 1}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "python"}},
    ],
}
CHUNK_SIZES = (64, 512, 4096, 1 << 20)


def seeds() -> list[bytes]:
    return [json.dumps(HAND_MADE).encode(), *read_seeds(CORPUS, CORPUS_SEEDS)]


def mutate(rng: random.Random, data: bytes) -> tuple[bytes, bool]:
    """(mutated bytes, gzip-compressed?)."""
    buf = bytearray(data)
    compressed = False
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(("truncate", "flip", "insert", "token", "delete", "duplicate", "gzip", "value", "element",
                         "nest", "spaces"))
        pos = rng.randrange(max(1, len(buf)))
        if op == "nest":  # a value nested hundreds or thousands of levels deep
            spots = list(VALUE_SPOT.finditer(buf))
            if spots:
                m = rng.choice(spots)
                depth = rng.choice((100, 999, 1000, 5000))
                opener, closer = rng.choice(((b"[", b"]"), (b'{"a": ', b"}")))
                buf[m.start() : m.end()] = opener * depth + b"1" + closer * depth
        elif op == "spaces":  # a run of whitespace, up to 1 MB
            buf[pos:pos] = rng.choice((b" ", b"\n", b"\t")) * rng.choice((1, 4096, 1 << 20))
        elif op in ("value", "element"):
            spots = list((VALUE_SPOT if op == "value" else ELEMENT_SPOT).finditer(buf))
            if spots:
                m = rng.choice(spots)
                if op == "value":
                    buf[m.start() : m.end()] = rng.choice(VALUES)
                else:
                    buf[m.start() + 1 : m.start() + 1] = b", " + rng.choice(VALUES)
        elif op == "truncate":
            del buf[pos:]
        elif op == "flip":
            if buf:
                buf[pos] ^= 1 << rng.randrange(8)
        elif op == "insert":
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == "token":
            buf[pos:pos] = rng.choice(TOKENS)
        elif op == "delete":
            del buf[pos : pos + rng.randint(1, 64)]
        elif op == "duplicate":
            buf[pos:pos] = buf[pos : pos + rng.randint(1, 256)]
        elif not compressed:
            buf = bytearray(gzip.compress(bytes(buf), mtime=0))
            compressed = True
    return bytes(buf), compressed


def kind_of(message: str, path: Path) -> str:
    """A failure message without the file name and the details: what kind of failure it was."""
    text = message.removeprefix(f"{path}: ")
    return re.sub(r"\d[\d,]*", "N", re.split(r" \(|;|: ", text, maxsplit=1)[0])


class _Hang(BaseException):
    """Raised by SIGALRM in the middle of an input that took too long."""


def _hang(signum: int, frame: object) -> None:
    raise _Hang


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0, help="random seed (same seed, same inputs)")
    ap.add_argument("--ingest-every", type=int, default=50, help="also ingest every N-th input (0: never)")
    ap.add_argument("--hang-s", type=int, default=60, help="an input that takes longer is a finding (a hang)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "fuzz", help="where escapes are saved")
    args = ap.parse_args()

    signal.signal(signal.SIGALRM, _hang)
    rng = random.Random(args.seed)
    sources = seeds()
    outcomes: collections.Counter[str] = collections.Counter()
    escapes: list[tuple[int, str, Path]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        db = work / "fuzz.duckdb"
        for i in range(args.iterations):
            data, compressed = mutate(rng, rng.choice(sources))
            path = work / f"rank{i}.json{'.gz' if compressed else ''}"
            path.write_bytes(data)
            signal.alarm(args.hang_s)
            try:
                if args.ingest_every and i % args.ingest_every == 0:
                    before = row_counts(db)
                    result = ingest_traces([path], db, threads=1, chunk_bytes=256).files[0]
                    after = row_counts(db)
                    whole = after[0] == before[0] + 1 if result.status == "ingested" else after == before
                    if not whole or (result.status == "failed" and not result.message.startswith(f"{path}: ")):
                        raise AssertionError(f"ingest {result.status}: rows {before} -> {after}: {result.message}")
                    outcomes[f"ingest {result.status}"] += 1
                parse(path, rng.choice(CHUNK_SIZES))
                outcomes["parsed"] += 1
            except TraceqError as exc:
                if not str(exc).startswith(f"{path}: ") or "\n" in str(exc):
                    escapes.append((i, f"badly formed message: {exc!r}", path))
                outcomes[f"failed: {kind_of(str(exc), path)}"] += 1
            except _Hang:
                escapes.append((i, f"hang: still parsing after {args.hang_s} s\n{traceback.format_exc(limit=4)}", path))
                outcomes["HANG"] += 1
            except Exception:  # noqa: BLE001 - the point: anything else is a finding
                escapes.append((i, traceback.format_exc(limit=4), path))
                outcomes["ESCAPED"] += 1
            finally:
                signal.alarm(0)
            if not any(e[2] == path for e in escapes):
                path.unlink()
            else:
                args.out.mkdir(parents=True, exist_ok=True)
                path.replace(args.out / path.name)
    seconds = time.perf_counter() - started

    print(f"{args.iterations} inputs from {len(sources)} seed traces in {seconds:.1f} s (seed {args.seed})")
    for outcome, n in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {n:7d}  {outcome}")
    for i, what, path in escapes:
        print(f"\nESCAPE at input {i} (saved as {args.out / path.name}):\n{what}")
    print(f"\n{len(escapes)} escape(s)")
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())
