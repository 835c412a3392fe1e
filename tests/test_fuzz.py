"""Fuzz the parser with mutated traces: truncated, flipped, inserted and deleted bytes, before or after
gzip. Nothing may escape but TraceqError, whose message names the file; a file that fails leaves no rows.
`benchmarks/fuzz_parser.py` runs the same idea for longer."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import CORPUS
from tests.fuzzing import ELEMENT_SPOT, TOKENS, VALUE_SPOT, VALUES, parse, read_seeds, row_counts
from tests.tracegen import TraceBuilder
from traceq.errors import TraceqError
from traceq.ingest import ingest_traces

# Small real traces (when the corpus is here) and a hand-made one: the inputs that get mutated.
CORPUS_SEEDS = (
    "kineto_docs/after_fix_trace.json",
    "hta/call_stack/backward_thread.json",
    "hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
    "hta/triton_example/triton_example.json.gz",
)


def _hand_made() -> bytes:
    b = TraceBuilder(rank=1)
    b.step(1, 0, 100_000)
    b.kernel("ampere_sgemm_128x64_nn", 10_000, 30_000, launch_ns=5_000)
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40_000, 60_000, stream=20, launch_ns=35_000,
             **{"Collective name": "allreduce", "Seq": 1})
    b.events.append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "python"}})
    return json.dumps(b.document()).encode()


SEEDS = [_hand_made(), *read_seeds(CORPUS, CORPUS_SEEDS)]


@st.composite
def mutated_trace(draw: st.DrawFn) -> tuple[bytes, bool]:
    """(file bytes, gzip?) from a seed with 1-4 mutations; gzip may be applied before a mutation."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    compressed = False
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("truncate", "flip", "insert", "token", "delete", "duplicate", "gzip", "value", "element")))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op in ("value", "element"):  # structure-aware: stays valid JSON (unless gzip came first)
            spots = list((VALUE_SPOT if op == "value" else ELEMENT_SPOT).finditer(data))
            if spots:
                m = spots[draw(st.integers(0, len(spots) - 1))]
                value = draw(st.sampled_from(VALUES))
                if op == "value":
                    data[m.start() : m.end()] = value
                else:
                    data[m.start() + 1 : m.start() + 1] = b", " + value
        elif op == "truncate":
            del data[pos:]
        elif op == "flip":
            if data:
                data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "token":
            data[pos:pos] = draw(st.sampled_from(TOKENS))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 64))]
        elif op == "duplicate":
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 256))]
        elif not compressed:
            data = bytearray(gzip.compress(bytes(data), mtime=0))
            compressed = True
    return bytes(data), compressed


FUZZ = settings(max_examples=500, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(trace=mutated_trace(), chunk_bytes=st.sampled_from([64, 512, 4096, 1 << 20]))
def test_parser_raises_nothing_but_traceq_error(trace: tuple[bytes, bool], chunk_bytes: int, tmp_path_factory) -> None:
    data, compressed = trace
    path = tmp_path_factory.getbasetemp() / ("fuzz.json.gz" if compressed else "fuzz.json")
    path.write_bytes(data)
    try:
        parse(path, chunk_bytes)
    except TraceqError as exc:
        assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)


_names = itertools.count()


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "w.duckdb"


@pytest.mark.slow
@settings(FUZZ, max_examples=30)
@given(trace=mutated_trace())
def test_ingest_ingests_or_fails_cleanly(trace: tuple[bytes, bool], fuzz_db: Path) -> None:
    data, compressed = trace
    path = fuzz_db.parent / f"rank{next(_names)}.json{'.gz' if compressed else ''}"
    path.write_bytes(data)
    before = row_counts(fuzz_db)
    summary = ingest_traces([path], fuzz_db, threads=1, chunk_bytes=256)  # raises only on a bug
    (result,) = summary.files
    assert result.status in ("ingested", "skipped", "failed")
    if result.status == "failed":
        assert result.message.startswith(f"{path}: ") and "\n" not in result.message
        assert row_counts(fuzz_db) == before
    elif result.status == "ingested":
        assert row_counts(fuzz_db)[0] == before[0] + 1
