"""traceq at real density: runs of 1, 8 and 64 ranks x 50 steps of ~1,270 kernels a rank-step
(``make_density.py``), each command in a fresh process, and the critical path checked against the known
late rank of every step.

    python benchmarks/bench_density.py                                  # 1, 8, 64 ranks x 50 steps
    python benchmarks/bench_density.py --ranks 1 8 --repeats 3 --timeout 600
    python benchmarks/bench_density.py --ranks 8 --only critical-path critical-path-segments
    python benchmarks/bench_density.py --big                            # 2048 ranks, sparser (below)

Per run (built, or reused when its ``.truth.json`` says the same ranks, steps, density and seed): a fresh
warehouse per ingest repeat (the last one kept), then on it ``traceq report --metric exposed_comm``,
``summary``, ``stragglers``, ``critical-path`` (every selected step, csv), ``critical-path --segments``
(csv) and ``export --perfetto``; then ``critical-path`` over the first 5 and 25 steps (``--steps 2:6``,
``2:26``: its memory does not grow with the steps) and under ``TRACEQ_MEMORY_LIMIT=1GB``. Each command: wall seconds, CPU seconds (user + sys of the process tree)
and peak RSS of the tree (sampled every 50 ms by ``proc_measure.py``, at least ``ru_maxrss``), medians
of ``--repeats`` (peaks: the largest), each also as a ratio to ``traceq report`` on the same warehouse.
Ingest runs ``--ingest-repeats`` times (default: ``--repeats``, 1 from 64 ranks up). A command is run
under ``timeout --timeout`` and a watchdog that kills it (by pid) when the tree's RSS passes
``--max-rss-gb``: a timeout or kill is recorded, not waited for, and the command is not repeated.

Check (``--no-check`` skips it): from ``critical-path --format csv`` and ``--segments --format csv``, in
every step reported (the open last step is left out, as traceq does by default) the rank with the most
time on the path (``top_rank``) is the step's late rank of its ``.truth.json``, and the segments tile the
step: in ``order``, each starts (``path_start_ns``) where the one before ended, none is empty or negative,
and their ``dur_ns`` sum to the step's ``span_ms``. Exits 1 if a step fails (or a command failed).

``--big``: 2048 ranks x 6 steps, every 4th template device event kept (~310 kernels + 25 collectives a
rank-step; ~11 M events, 4.2 GB of JSON: as many events as 64 ranks x 50 steps at full density), ingest
once, every other command once. Chosen for this 2-core, 24 GB machine: at full density one step of 2048
ranks is ~2.5 GB of JSON, so 50 steps would be ~125 GB (~2 hours of ingest here); 6 steps keep 5 whole
steps after the open last one for the path and the check; the sparser step keeps the step's length, its
25 collectives per rank (51,200 matched collective kernels a step: the part of the path's work that grows
with ranks) and its kernels' real names. (2048 x 3 steps x every 8th event, 1.2 GB, ran in 90 s here.)
Results: the table on stdout, all figures in
``benchmarks/out/bench_density_<time>.json``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_density  # noqa: E402
import proc_measure  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
PY = sys.executable
TRACEQ = str(Path(PY).with_name("traceq"))
COMMANDS = ("ingest", "report", "summary", "stragglers", "critical-path", "critical-path-segments", "export-perfetto",
            "critical-path-5-steps", "critical-path-25-steps", "critical-path-1GB")
SAMPLE_S = 0.05


def _command(name: str, db: Path, tmp: Path) -> list[str]:
    """The command line of a command other than ingest, on warehouse ``db``."""
    if name == "critical-path-1GB":  # TRACEQ_MEMORY_LIMIT honoured: the walk holds less beside DuckDB's 1 GB
        return ["env", "TRACEQ_MEMORY_LIMIT=1GB", TRACEQ, *_args("critical-path", db, tmp)]
    return [TRACEQ, *_args(name, db, tmp)]


def _args(name: str, db: Path, tmp: Path) -> list[str]:
    """The traceq arguments of a command other than ingest, on warehouse ``db``."""
    return {
        "report": ["report", "--metric", "exposed_comm", "--format", "csv"],
        "summary": ["summary", "--format", "csv"],
        "stragglers": ["stragglers", "--format", "csv"],
        "critical-path": ["critical-path", "--format", "csv"],
        "critical-path-segments": ["critical-path", "--segments", "--format", "csv"],
        # memory flat in steps: the first 5 and 25 steps against every step (critical-path)
        "critical-path-5-steps": ["critical-path", "--steps", "2:6", "--format", "csv"],
        "critical-path-25-steps": ["critical-path", "--steps", "2:26", "--format", "csv"],
        "export-perfetto": ["export", "--perfetto", str(tmp / "density.pftrace"), "--overwrite"],
    }[name] + ["--db", str(db)]


class Watchdog:
    """Kills this process's descendants (by pid) when their RSS together passes ``max_bytes``."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.25):
            rss, _ = proc_measure.tree_memory(me)
            if rss > self.max_bytes:
                self.fired = True
                for pid in reversed(proc_measure._descendants(me)):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass


def run_once(cmd: list[str], timeout_s: int, max_rss_gb: float) -> dict:
    """``cmd`` under ``timeout`` and the memory watchdog, measured (proc_measure.measure)."""
    with Watchdog(int(max_rss_gb * 2**30)) as dog:
        got = proc_measure.measure(["timeout", "-k", "10", str(timeout_s), *cmd], sample_s=SAMPLE_S)
    got["status"] = ("ok" if got["rc"] == 0 else f"killed above {max_rss_gb:g} GB RSS" if dog.fired
                     else f"timeout after {timeout_s} s" if got["rc"] in (124, 137) else f"failed (rc {got['rc']})")
    return got


def repeated(make_cmd, repeats: int, timeout_s: int, max_rss_gb: float, cleanup=None) -> dict:
    """Medians of wall and CPU over ``repeats`` runs of ``make_cmd(i)``, the largest peak RSS; the first
    run that fails ends the repeats and is what is returned."""
    runs = []
    for i in range(repeats):
        if cleanup is not None:
            cleanup(i)
        got = run_once(make_cmd(i), timeout_s, max_rss_gb)
        if got["status"] != "ok":
            return {**got, "repeats": len(runs) + 1}
        runs.append(got)
    best = dict(runs[-1])
    best["seconds"] = statistics.median(r["seconds"] for r in runs)
    best["cpu_s"] = statistics.median(r["cpu_s"] for r in runs)
    best["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    best["all_seconds"] = [round(r["seconds"], 2) for r in runs]
    best["repeats"] = len(runs)
    return best


def ensure_run(ranks: int, steps: int, keep_every: int, seed: int, processes: int) -> tuple[Path, dict, bool]:
    """The run's folder and truth (built unless one with the same parameters is there); built or not."""
    out = make_density.default_out(ranks, steps, keep_every)
    truth_path = make_density.truth_path(out)
    if truth_path.exists():
        truth = json.loads(truth_path.read_text())
        same = (truth.get("ranks"), truth.get("steps"), truth.get("keep_every"), truth.get("seed")) == \
            (ranks, steps, keep_every, seed)
        if same and len(list(out.glob("rank*.trace.json.gz"))) == ranks:
            return out, truth, False
    truth = make_density.build(make_density.SOURCE, out, ranks, steps, keep_every=keep_every, seed=seed,
                               processes=processes)
    return out, truth, True


def check(truth: dict, steps_csv: str, segments_csv: str) -> dict:
    """The late rank is the path's top rank and the segments tile the step, in every step reported."""
    steps = list(csv.DictReader(io.StringIO(steps_csv)))
    by_step: dict[int, list[dict]] = {}
    for row in csv.DictReader(io.StringIO(segments_csv)):
        by_step.setdefault(int(row["step"]), []).append(row)
    failures, top_ok, tile_ok = [], 0, 0
    for row in steps:
        step = int(row["step"])
        want = truth["late_rank"][str(step)]
        got = int(row["top_rank"])
        if got == want:
            top_ok += 1
        else:
            failures.append(f"step {step}: top rank {got} ({row['top_rank_ms']} ms), late rank {want}")
        segs = sorted(by_step.get(step, []), key=lambda r: int(r["order"]))
        span_ns = round(float(row["span_ms"]) * 1e6)
        total = sum(int(r["dur_ns"]) for r in segs)
        problems = []
        if not segs:
            problems.append("no segments")
        if total != span_ns:
            problems.append(f"segments sum to {total} ns, span {span_ns} ns")
        for a, b in zip(segs, segs[1:]):
            if int(a["path_start_ns"]) + int(a["dur_ns"]) != int(b["path_start_ns"]):
                problems.append(f"gap or overlap after order {a['order']}")
                break
        if any(int(r["dur_ns"]) <= 0 or int(r["end_ns"]) - int(r["start_ns"]) != int(r["dur_ns"]) for r in segs):
            problems.append("an empty or negative segment")
        if problems:
            failures.append(f"step {step}: " + "; ".join(problems))
        else:
            tile_ok += 1
    return {"steps": len(steps), "top_rank_ok": top_ok, "tiling_ok": tile_ok,
            "passed": bool(steps) and not failures, "failures": failures[:20]}


def bench_run(ranks: int, steps: int, keep_every: int, args) -> dict:
    """Build (or reuse) one run and measure every command on it."""
    folder, truth, built = ensure_run(ranks, steps, keep_every, args.seed, args.processes)
    files = sorted(folder.glob("rank*.trace.json.gz"), key=lambda p: int(p.name[4:].split(".")[0]))
    result: dict = {
        "ranks": ranks, "steps": steps, "keep_every": keep_every, "folder": str(folder), "built_now": built,
        "build_s": truth["seconds"], "json_mb": round(truth["json_bytes"] / 1e6, 1),
        "gz_mb": round(truth["gz_bytes"] / 1e6, 1), "events": truth["events"],
        "kernels_per_rank_step": truth["kernels_per_rank_step"],
        "device_events_per_rank_step": truth["device_events_per_rank_step"], "commands": {},
    }
    print(f"\n== {ranks} ranks x {steps} steps ({truth['kernels_per_rank_step']} kernels a rank-step): "
          f"{result['json_mb']:,} MB JSON, {result['gz_mb']:,} MB gz, "
          f"{'built' if built else 'reused, built'} in {truth['seconds']} s", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"density{ranks}_", dir=args.tmp))
    db = work / "density.duckdb"

    def fresh(_i: int) -> None:
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)

    wanted = [c for c in COMMANDS if c in args.only]
    if "ingest" in wanted or not db.exists():
        reps = args.ingest_repeats or (1 if ranks >= 64 else args.repeats)
        got = repeated(lambda i: [TRACEQ, "ingest", *map(str, files), "--db", str(db), "--name", folder.name, "-q"],
                       reps, args.timeout, args.max_rss_gb, cleanup=fresh)
        result["commands"]["ingest"] = got
        _line("ingest", got)
        if got["status"] != "ok":
            return result
    for name in wanted:
        if name == "ingest":
            continue
        reps = 1 if ranks >= 2048 else args.repeats
        got = repeated(lambda i, n=name: _command(n, db, work), reps, args.timeout, args.max_rss_gb)
        result["commands"][name] = got
        _line(name, got)
    cmds = result["commands"]
    base = cmds.get("report")
    for got in cmds.values():
        if base is not None and base["status"] == "ok" and got["status"] == "ok":
            got["x_report_wall"] = got["seconds"] / base["seconds"]
            got["x_report_cpu"] = got["cpu_s"] / base["cpu_s"]
            got["x_report_rss"] = got["peak_rss_mb"] / base["peak_rss_mb"]
    if not args.no_check:
        path, segs = cmds.get("critical-path"), cmds.get("critical-path-segments")
        if path and segs and path["status"] == segs["status"] == "ok":
            result["check"] = check(truth, path["stdout"], segs["stdout"])
        else:
            result["check"] = {"passed": False, "failures": ["critical-path did not finish: nothing to check"]}
        c = result["check"]
        print(f"   check: {c.get('top_rank_ok', 0)}/{c.get('steps', 0)} steps with the late rank on top, "
              f"{c.get('tiling_ok', 0)}/{c.get('steps', 0)} tiled"
              + ("" if c["passed"] else f"; FAILED: {c['failures'][:3]}"), flush=True)
    for got in cmds.values():  # keep the JSON small: the outputs are checked above
        got["stdout_lines"] = got["stdout"].count("\n")
        got["stdout_head"] = got["stdout"][:300]
        del got["stdout"]
    pftrace = work / "density.pftrace"
    if pftrace.exists():
        result["pftrace_mb"] = round(pftrace.stat().st_size / 1e6, 1)
    if not args.keep_db:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _line(name: str, got: dict) -> None:
    print(f"   {name:24s} {got['status']:>8s}  {got['seconds']:8.2f} s  {got['cpu_s']:8.2f} CPU s  "
          f"{got['peak_rss_mb']:8.0f} MiB", flush=True)


def table(results: list[dict]) -> str:
    """The figures as a markdown table: one row per (run, command)."""
    lines = ["| ranks x steps | command | status | wall s | CPU s | peak RSS MiB | x report wall | x report CPU | x report RSS |",
             "|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        label = f"{res['ranks']} x {res['steps']}" + (f" (1/{res['keep_every']})" if res["keep_every"] > 1 else "")
        for name, got in res["commands"].items():
            ratio = [f"{got[k]:.2f}" if k in got else "-" for k in ("x_report_wall", "x_report_cpu", "x_report_rss")]
            lines.append(f"| {label} | {name} | {got['status']} | {got['seconds']:.2f} | {got['cpu_s']:.2f} | "
                         f"{got['peak_rss_mb']:.0f} | {' | '.join(ratio)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[1, 8, 64])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--keep-every", type=int, default=1, help="density: keep every k-th template device event")
    ap.add_argument("--big", action="store_true", help="2048 ranks x 6 steps, --keep-every 4 (instead of --ranks)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ingest-repeats", type=int, help="default: --repeats, 1 from 64 ranks up")
    ap.add_argument("--only", nargs="*", choices=COMMANDS, default=list(COMMANDS))
    ap.add_argument("--timeout", type=int, default=600, help="seconds a command may run")
    ap.add_argument("--max-rss-gb", type=float, default=12.0, help="kill a command whose tree RSS passes this")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--keep-db", action="store_true", help="keep each run's warehouse and Perfetto file (under --tmp)")
    ap.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1), help="for building the runs")
    ap.add_argument("--seed", type=int, default=48)
    ap.add_argument("--tmp", type=Path, default=OUT / "density_db", help="where the warehouses go")
    args = ap.parse_args(argv)
    args.tmp.mkdir(parents=True, exist_ok=True)
    runs = [(2048, 6, 4)] if args.big else [(r, args.steps, args.keep_every) for r in args.ranks]
    results = {"cores": os.cpu_count(), "loadavg_start": os.getloadavg(), "timeout_s": args.timeout, "runs": []}
    for ranks, steps, keep in runs:
        results["runs"].append(bench_run(ranks, steps, keep, args))
    results["loadavg_end"] = os.getloadavg()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"bench_density_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    print("\n" + table(results["runs"]))
    print(f"\nloadavg start {results['loadavg_start']} end {results['loadavg_end']}; figures in {path}")
    failed = [r for r in results["runs"] if not args.no_check and not r.get("check", {}).get("passed", False)]
    failed += [r for r in results["runs"] if any(g["status"] != "ok" for g in r["commands"].values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
