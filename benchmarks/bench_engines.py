"""The two engines on the same trace, in one run: DuckDB (ingest into a warehouse, then report) against
PerfettoSQL (Perfetto's trace processor on the file, `traceq report --engine perfetto`).

    python benchmarks/make_large_trace.py --mb 500 ; python benchmarks/make_large_trace.py --mb 1500
    python benchmarks/bench_engines.py                      # the 500 MB and 1.5 GB benchmark traces
    python benchmarks/bench_engines.py FILE... --repeats 3

Each command runs in a fresh process (benchmarks/proc_measure.py): median wall seconds over the repeats,
CPU seconds of the process tree, peak RSS of the tree (the trace processor is a child process) from
one more run sampled every 50 ms. Both engines report `--metric exposed_comm --by run,rank,step`; the
script also says whether their per-step figures agree (to the us they print, or within the bound the
Perfetto engine states for times it read through floats).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_measure import measure  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRACEQ = Path(sys.executable).with_name("traceq")
OUT = REPO / "benchmarks" / "out"
DEFAULT_FILES = (OUT / "nccl_data_500mb.json", OUT / "nccl_data_1500mb.json")
BINARY = REPO.parent / "shared" / "bin" / "trace_processor_shell"
REPORT = ["--metric", "exposed_comm", "--by", "run,rank,step", "--format", "csv", "--skip-steps", "0"]


def duckdb_engine(path: Path, sample_s: float | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_engines_") as tmp:
        db = Path(tmp) / "w.duckdb"
        ing = measure([str(TRACEQ), "ingest", str(path), "--db", str(db), "--name", "bench"], sample_s=sample_s)
        rep = measure([str(TRACEQ), "report", "--db", str(db), *REPORT], sample_s=sample_s)
    return {"rc": ing["rc"] or rep["rc"], "seconds": ing["seconds"] + rep["seconds"], "cpu_s": ing["cpu_s"] + rep["cpu_s"],
            "peak_rss_mb": max(ing["peak_rss_mb"], rep["peak_rss_mb"]), "stdout": rep["stdout"],
            "ingest_s": ing["seconds"], "report_s": rep["seconds"], "stderr_tail": ing["stderr_tail"] + rep["stderr_tail"]}


def perfetto_engine(path: Path, sample_s: float | None) -> dict:
    env = {**os.environ, "TRACEQ_TRACE_PROCESSOR": str(BINARY)}
    return measure([str(TRACEQ), "report", "--engine", "perfetto", "--run", "bench", *REPORT, str(path)],
                   env=env, sample_s=sample_s)


def timed(run, path: Path, repeats: int) -> dict:
    runs = [run(path, None) for _ in range(repeats)]
    bad = [r for r in runs if r["rc"] != 0]
    if bad:
        raise SystemExit(f"{run.__name__} failed on {path}: {bad[0]['stderr_tail'][-800:]}")
    watched = run(path, 0.05)
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "seconds_all": [round(r["seconds"], 2) for r in runs],
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "peak_rss_mb": watched["peak_rss_mb"],
        "stdout": runs[0]["stdout"],
        "stderr_tail": runs[0]["stderr_tail"],
    }


def rows(text: str) -> dict[tuple[str, str], float]:
    return {(r["rank"], r["step"]): float(r["exposed_comm_us"]) for r in csv.DictReader(io.StringIO(text))}


def agreement(duck: dict, perfetto: dict) -> str:
    a, b = rows(duck["stdout"]), rows(perfetto["stdout"])
    if a.keys() != b.keys():
        return f"different steps: {len(a)} against {len(b)}"
    worst = max((abs(a[k] - b[k]) for k in a), default=0.0)
    return f"{len(a)} steps, largest difference {worst * 1000:.0f} ns"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, default=list(DEFAULT_FILES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not BINARY.is_file():
        raise SystemExit(f"{BINARY}: no trace processor")
    results = []
    print(f"{'trace':<26} {'engine':<9} {'seconds':>8} {'CPU s':>7} {'peak MiB':>9} {'MB/s':>7}  x DuckDB", flush=True)
    for path in args.files:
        mb = path.stat().st_size / 1e6
        duck = timed(duckdb_engine, path, args.repeats)
        perf = timed(perfetto_engine, path, args.repeats)
        for name, r in (("duckdb", duck), ("perfetto", perf)):
            print(f"{path.name:<26} {name:<9} {r['seconds']:>8.2f} {r['cpu_s']:>7.2f} {r['peak_rss_mb']:>9.0f} "
                  f"{mb / r['seconds']:>7.1f}  {duck['seconds'] / r['seconds']:.2f}", flush=True)
        agree = agreement(duck, perf)
        print(f"{path.name:<26} agreement: {agree}", flush=True)
        results.append({"file": str(path), "mb": mb, "duckdb": duck, "perfetto": perf, "agreement": agree,
                        "loadavg": os.getloadavg()})
    out = args.json or OUT / f"bench_engines_{time.strftime('%Y%m%d_%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
