"""Many small rank files in one ingest: time per file and the fixed cost per file.

    python benchmarks/make_ranks.py --ranks 512 --out benchmarks/out/small512 --source A --source B ...
    python benchmarks/bench_many_files.py benchmarks/out/small64 benchmarks/out/small512

For each folder: ``traceq ingest FOLDER -q`` into a fresh warehouse (``--repeats`` timed runs, median;
one more sampled for peak RSS). The fixed cost per file is what is left of a file's time once the
start-up of the command (an ingest of one tiny corpus trace) and its bytes at the speed of a large
file (the 500 MB benchmark trace, same run) are taken away:
``(seconds - startup - MB * large_s_per_mb) / files``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_measure import measure  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TRACEQ = Path(sys.executable).parent / "traceq"
TINY = REPO.parent / "shared" / "corpus" / "hta" / "call_stack" / "backward_thread.json"
LARGE = REPO / "benchmarks" / "out" / "nccl_data_500mb.json"


def ingest(paths: list[Path], repeats: int) -> dict:
    runs = []
    for n in range(repeats + 1):
        with tempfile.TemporaryDirectory(prefix="bench_many_") as tmp:
            r = measure([str(TRACEQ), "ingest", *map(str, paths), "--db", str(Path(tmp) / "w.duckdb"), "-q"],
                        sample_s=0.05 if n == repeats else None)
        if r["rc"] != 0:
            raise SystemExit(f"ingest failed: {r['stderr_tail']}")
        runs.append(r)
    timed = runs[:repeats]
    return {"seconds": statistics.median(r["seconds"] for r in timed), "cpu_s": statistics.median(r["cpu_s"] for r in timed),
            "peak_rss_mb": runs[-1]["peak_rss_mb"], "load": max(r["loadavg_after"] for r in timed),
            "all_seconds": [round(r["seconds"], 2) for r in timed]}


def json_mb(paths: list[Path]) -> float:
    total = 0
    for p in paths:
        total += len(gzip.decompress(p.read_bytes())) if p.name.endswith(".gz") else p.stat().st_size
    return total / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    startup = ingest([TINY], args.repeats)
    large = ingest([LARGE], args.repeats)
    s_per_mb = (large["seconds"] - startup["seconds"]) / json_mb([LARGE])
    print(json.dumps({"startup_s": startup["seconds"], "large_s": large["seconds"], "large_s_per_mb": s_per_mb}), flush=True)
    for folder in args.folders:
        files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
        mb = json_mb(files)
        r = ingest([folder], args.repeats)
        fixed = (r["seconds"] - startup["seconds"] - mb * s_per_mb) / len(files)
        print(json.dumps({"folder": folder.name, "files": len(files), "json_mb": round(mb, 1), **r,
                          "s_per_file": r["seconds"] / len(files), "fixed_s_per_file": fixed,
                          "mb_per_cpu_s": mb / r["cpu_s"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
