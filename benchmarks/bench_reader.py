"""The reader alone: CPU seconds to cut a trace into chunks, and to write them as the batch files DuckDB
parses, without parsing them.

    python benchmarks/bench_reader.py benchmarks/out/rank0_500mb.json benchmarks/out/rank0_500mb.json.gz
    PYTHONPATH=/tmp/base python benchmarks/bench_reader.py FILES   # another tree, from a scratch folder

For each file, ``--repeats`` times (median): ``cut``, ``traceq.ingest.reader.read_trace_ranges`` with
every chunk taken and dropped; ``cut + write``, the chunks written as batch files in a scratch folder
(``traceq.ingest.native.batch_files``, in ``/dev/shm`` as ingest does) and removed. Process CPU (one
thread works: no DuckDB runs).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path

import traceq
from traceq.ingest.native import batch_files, scratch_base
from traceq.ingest.reader import read_trace_ranges

CHUNK_BYTES = 8 << 20  # traceq.ingest.pipeline.INGEST_CHUNK_BYTES


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def once(path: Path, write: bool) -> float:
    before = cpu_s()
    _, chunks = read_trace_ranges(path, CHUNK_BYTES)
    if write:
        with tempfile.TemporaryDirectory(dir=scratch_base()) as scratch:
            for batch in batch_files(chunks, scratch):
                batch.remove()
    else:
        for _ in chunks:
            pass
    return cpu_s() - before


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"traceq from {Path(traceq.__file__).parent}")
    print(f"{'file':28s} {'cut CPU s':>10s} {'cut + write CPU s':>18s}")
    for path in args.files:
        cut = statistics.median(once(path, False) for _ in range(args.repeats))
        written = statistics.median(once(path, True) for _ in range(args.repeats))
        print(f"{path.name:28s} {cut:10.2f} {written:18.2f}")


if __name__ == "__main__":
    main()
