"""How batches of an uncompressed trace reach DuckDB: named pipes filled by ``splice`` (traceq until
issue 23) against scratch files (a ``sendfile`` copy of each range, in ``/dev/shm`` or on disk).

    python benchmarks/bench_transport.py benchmarks/out/nccl_data_500mb.json benchmarks/out/nccl_data_1500mb.json

Each mode runs ``traceq.ingest.ingest_traces`` on the file in a fresh process (``--repeats`` timed runs,
median; one more run sampled for peak RSS of the process tree and the peak use of ``/dev/shm``).
``pipes`` is only measurable on a traceq that still has them (before issue 23); ``files`` is traceq's
transport since. ``--memory-limits 256MB 384MB`` tries DuckDB buffer pools.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_measure import measure  # noqa: E402

CHILD = r"""
import sys, tempfile
import traceq.ingest.native as native
from traceq import scratch
mode, path, db, limit = sys.argv[1:5]
if limit:
    import traceq.ingest.loader
    traceq.ingest.loader.INGEST_MEMORY_LIMIT = limit
if mode.startswith("files") and hasattr(native, "_pipes_work"):
    native._pipes_work = lambda directory: False
if mode == "files-disk":
    scratch.scratch_base = lambda room: tempfile.gettempdir()
from traceq.ingest import ingest_traces
summary = ingest_traces([path], db)
assert summary.ok, summary.files[0].message
"""


def shm_peak(stop: threading.Event, out: list[int]) -> None:
    base = shutil.disk_usage("/dev/shm").used
    while not stop.is_set():
        out[0] = max(out[0], shutil.disk_usage("/dev/shm").used - base)
        time.sleep(0.02)


def run(mode: str, path: Path, sample: bool, limit: str = "") -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_transport_") as tmp:
        stop, peak = threading.Event(), [0]
        watcher = threading.Thread(target=shm_peak, args=(stop, peak))
        if sample:
            watcher.start()
        r = measure([sys.executable, "-c", CHILD, mode, str(path), str(Path(tmp) / "t.duckdb"), limit],
                    sample_s=0.05 if sample else None)
        stop.set()
        if sample:
            watcher.join()
        r["shm_peak_mb"] = peak[0] / 2**20
    if r["rc"] != 0:
        raise SystemExit(f"{mode} {path}: {r['stderr_tail']}")
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--modes", nargs="+", default=["pipes", "files", "files-disk"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-limits", nargs="+", default=[""], help="DuckDB buffer pools to try ('': traceq's)")
    args = ap.parse_args(argv)
    rows = []
    for path in args.files:
        for mode, limit in [(m, lim) for m in args.modes for lim in args.memory_limits]:
            timed = [run(mode, path, False, limit) for _ in range(args.repeats)]
            mem = run(mode, path, True, limit)
            rows.append({
                "file": path.name, "mode": mode, "memory_limit": limit, "seconds": statistics.median(r["seconds"] for r in timed),
                "cpu_s": statistics.median(r["cpu_s"] for r in timed), "peak_rss_mb": mem["peak_rss_mb"],
                "shm_peak_mb": mem["shm_peak_mb"], "load": max(r["loadavg_after"] for r in timed),
                "all_seconds": [round(r["seconds"], 2) for r in timed],
            })
            print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
