"""Does a faster inflate shorten a .json.gz ingest? zlib (the standard library), ISA-L (``isal``) and
zlib-ng (``zlib-ng``), in one run, on the same files.

    python benchmarks/make_large_trace.py --source ../shared/corpus/traceq_h200/h200-ddp/rank0.trace.json.gz \
        --size-mb 500 --gzip                                  # once: benchmarks/out/rank0_500mb.json(.gz)
    python benchmarks/bench_gzip.py benchmarks/out/rank0_500mb.json.gz --repeats 3

Two figures per library, each a median over ``--repeats`` runs in a fresh process:
- ``inflate``: the file's bytes inflated alone, in MB of JSON per CPU-second;
- ``ingest``: ``traceq.ingest_traces`` of the file into a fresh warehouse with that library's GzipFile
  in ``traceq.ingest.reader`` (wall and CPU seconds), and its ratio to the same ingest with zlib.
A library that is not installed is left out. The uncompressed file beside it (``.json``), where it
exists, is ingested too: the ratio of ``.json.gz`` to ``.json`` is what the compression costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

OPENERS = {
    "zlib": "import gzip; OPEN = gzip.GzipFile",
    "isal": "from isal.igzip import IGzipFile as OPEN",
    "zlib-ng": "from zlib_ng.gzip_ng import GzipFile as OPEN",
}

INFLATE_CHILD = r"""
import json, sys, time
{opener}
start = time.process_time()
with open(sys.argv[1], "rb") as raw, OPEN(fileobj=raw, mode="rb") as f:
    n = 0
    while chunk := f.read(1 << 20):
        n += len(chunk)
print(json.dumps({{"bytes": n, "cpu_s": time.process_time() - start}}))
"""

INGEST_CHILD = r"""
import json, resource, shutil, sys, tempfile, time
from pathlib import Path
{opener}
import traceq.ingest.reader as reader
if sys.argv[1].endswith(".gz"):
    reader._GzipFile = OPEN
from traceq.ingest import ingest_traces
folder = Path(tempfile.mkdtemp(prefix="bench-gzip-"))
try:
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    summary = ingest_traces([sys.argv[1]], folder / "w.duckdb", name="bench")
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
finally:
    shutil.rmtree(folder)
assert summary.ok, [f.message for f in summary.files]
cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "events": summary.files[0].events}}))
"""


def _child(code: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _installed(opener: str) -> bool:
    return subprocess.run([sys.executable, "-c", opener], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help=".json.gz trace files")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    for path in args.files:
        print(f"== {path.name}")
        rows = []
        for name, opener in OPENERS.items():
            if not _installed(opener):
                print(f"   {name}: not installed, left out")
                continue
            inflated = [_child(INFLATE_CHILD.format(opener=opener), path) for _ in range(args.repeats)]
            ingested = [_child(INGEST_CHILD.format(opener=opener), path) for _ in range(args.repeats)]
            rows.append((name, inflated[0]["bytes"] / 1e6 / _median(inflated, "cpu_s"), _median(ingested, "wall_s"),
                         _median(ingested, "cpu_s")))
        plain = path.with_suffix("") if path.suffix == ".gz" else None
        json_row = None
        if plain is not None and plain.exists():
            ingested = [_child(INGEST_CHILD.format(opener=OPENERS["zlib"]), plain) for _ in range(args.repeats)]
            json_row = (_median(ingested, "wall_s"), _median(ingested, "cpu_s"))
        base_wall = rows[0][2]
        print(f"   {'inflate':10s} {'MB JSON/CPU-s':>14s} {'ingest wall s':>14s} {'CPU s':>8s} {'vs zlib':>8s}"
              f" {'vs .json':>9s}")
        for name, rate, wall, cpu in rows:
            versus_json = f"{wall / json_row[0]:8.2f}x" if json_row else "        -"
            print(f"   {name:10s} {rate:14.0f} {wall:14.2f} {cpu:8.2f} {wall / base_wall:7.2f}x {versus_json}")
        if json_row:
            print(f"   {'.json':10s} {'':>14s} {json_row[0]:14.2f} {json_row[1]:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
