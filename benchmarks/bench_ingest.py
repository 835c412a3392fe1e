"""Time traceq against HTA (and a parse-only limit) on the same trace files, in one run.

    python benchmarks/make_large_trace.py                  # once: benchmarks/out/nccl_data_500mb.json
    python benchmarks/bench_ingest.py                      # that file, all tools
    python benchmarks/bench_ingest.py FILE... --repeats 3 --hta-repeats 1
    python benchmarks/bench_ingest.py --corpus             # every corpus trace with NCCL/RCCL kernels
    python benchmarks/bench_ingest.py --skip-hta           # traceq + parse limit only

Every measurement runs in a fresh subprocess:
- ``hta``: ``TraceAnalysis`` load + ``get_comm_comp_overlap(visualize=False)`` (via
  ``tests/hta_reference.run_hta_overlap``, which applies the pandas-3 compatibility patch);
- ``traceq ingest`` / ``traceq report``: ``traceq ingest FILE --db TMP.duckdb`` then
  ``traceq report --metric exposed_comm --whole-trace --db TMP.duckdb --format csv`` (a fresh
  database per repeat; ``traceq total`` = both, seconds summed, peak = the larger);
- ``msgspec parse``: decompress + ``msgspec.json.decode`` into a typed Struct that keeps only
  ph/cat/name/pid/tid/ts/dur and a few args: what one core can do at best with the file;
- ``duckdb parse``: the reader's chunks as batch files + DuckDB's JSON reader on every core reading
  the columns traceq reads, aggregated (no typing, filtering or writing): the engine's parse limit.

Reported per tool: median wall seconds over the repeats (interpreter start-up included), CPU seconds
(user+sys of the process and its children, less sensitive to other load on the machine), MB/s of
uncompressed JSON (1 MB = 1e6 bytes), peak RSS in MiB and the speed-up over HTA. The timed runs are
not watched; memory comes from one more run per tool, sampled (watching a process takes CPU from
it: 0.25 s of a 3.2 s ingest on 2 cores). Peak RSS is ``peak_rss_mb``: the largest sum of RSS over
the process tree, sampled every 50 ms in that run (counts worker processes, at least ``ru_maxrss``);
``maxrss_mb`` (in the JSON results) is ``wait4()``'s ``ru_maxrss``: the largest single process of the tree. Results are also written as JSON to ``benchmarks/out/bench_<time>.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_measure import measure  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / ".." / "shared" / "corpus"
OUT_DIR = REPO / "benchmarks" / "out"
DEFAULT_FILE = OUT_DIR / "nccl_data_500mb.json"
PY = sys.executable
TRACEQ = Path(PY).parent / "traceq"
SAMPLE_S = 0.05  # memory sampling interval of the one memory run per tool

# --------------------------------------------------------------------------------------------------
# the three contenders

HTA_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
import hta_reference
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
res = hta_reference.run_hta_overlap([sys.argv[2]], ranks=[int(sys.argv[3])] if sys.argv[3] != "-" else None)
t2 = time.perf_counter()
print(json.dumps({"overlap_pctg": res, "import_s": t1 - t0, "load_and_overlap_s": t2 - t1}))
"""

PARSE_CHILD = r"""
import gzip, json, sys, time
import msgspec

class Args(msgspec.Struct):
    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    stream: int | str | None = None
    device: int | str | None = None
    rank: int | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")

class Event(msgspec.Struct):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: Args | None = None

class Trace(msgspec.Struct):
    traceEvents: list[Event] = []

path = sys.argv[1]
t0 = time.perf_counter()
if path.endswith(".gz"):
    with gzip.open(path, "rb") as fh:
        data = fh.read()
else:
    with open(path, "rb") as fh:
        data = fh.read()
t1 = time.perf_counter()
if data.lstrip()[:1] == b"[":
    events = msgspec.json.decode(data, type=list[Event])
else:
    events = msgspec.json.decode(data, type=Trace).traceEvents
t2 = time.perf_counter()
n_kernels = sum(1 for e in events if e.cat in ("kernel", "Kernel"))
print(json.dumps({"events": len(events), "kernels": n_kernels, "read_s": t1 - t0, "decode_s": t2 - t1}))
"""


# The parse-only limit of the engine traceq ingests with: the reader's chunks as the batch files traceq
# parses (traceq.ingest.native: scratch files) and DuckDB's JSON reader (every core)
# reading the columns traceq reads, aggregated instead of typed, filtered and written.
DUCKDB_PARSE_CHILD = r"""
import json, sys, time
from pathlib import Path
import duckdb
from traceq.ingest.native import batch_files, scratch_dir
from traceq.ingest.reader import read_trace_ranges

ARGS = ('STRUCT("External id" VARCHAR, correlation VARCHAR, device VARCHAR, stream VARCHAR, rank VARCHAR, '
        '"Collective name" VARCHAR, "Process Group Name" VARCHAR, "Process Group Description" VARCHAR, '
        '"Process Group Ranks" VARCHAR, "Group size" VARCHAR, "In msg nelems" VARCHAR, "Out msg nelems" VARCHAR, '
        'dtype VARCHAR, "Seq" VARCHAR, name VARCHAR, labels VARCHAR)')
QUERY = ("select count(*), max(ph), max(cat), max(name), max(pid), max(tid), max(ts), max(dur), max(args) "
         "from read_json(?, format='array', maximum_object_size=16777216, columns={ph: 'VARCHAR', cat: 'VARCHAR', "
         "name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', ts: 'JSON', dur: 'JSON', args: '" + ARGS + "'})")
con = duckdb.connect()
events = 0
t0 = time.perf_counter()
with scratch_dir() as scratch:
    header, chunks = read_trace_ranges(Path(sys.argv[1]), 8 << 20)
    for files in batch_files(chunks, scratch):
        events += con.execute(QUERY, [files.names]).fetchall()[0][0]
        files.remove()
print(json.dumps({"events": events, "seconds": time.perf_counter() - t0}))
"""


def run_child(code: str, *args: str, sample_s: float | None) -> dict:
    """``python -c code args...`` measured; its last JSON line of output as ``result``."""
    r = measure([PY, "-c", code, *args], sample_s=sample_s)
    r["result"] = _last_json(r["stdout"])
    return r


def run_traceq(path: Path, sample_s: float | None) -> dict:
    """``traceq ingest`` then ``traceq report`` on a fresh database: {"ingest", "report", "total"}."""
    if not TRACEQ.exists():
        missing = {"rc": None, "error": f"{TRACEQ} not found"}
        return {"ingest": missing, "report": missing, "total": missing}
    with tempfile.TemporaryDirectory(prefix="bench_traceq_") as tmp:
        db = Path(tmp) / "bench.duckdb"
        ing = measure([str(TRACEQ), "ingest", str(path), "--db", str(db)], sample_s=sample_s)
        if ing["rc"] != 0:
            failed = {"rc": None, "error": "ingest failed"}
            return {"ingest": ing, "report": failed, "total": failed}
        rep = measure(
            [str(TRACEQ), "report", "--metric", "exposed_comm", "--whole-trace", "--db", str(db), "--format", "csv"],
            sample_s=sample_s,
        )
        rep["result"] = rep["stdout"][-4000:]
        try:
            ing["db_mb"] = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 1e6
        except OSError:
            pass
    total = {"rc": ing["rc"] or rep["rc"], "result": rep.get("result")}
    for key in ("seconds", "cpu_s"):
        total[key] = ing[key] + rep[key]
    for key in ("peak_rss_mb", "peak_pss_mb", "maxrss_mb"):
        total[key] = max(ing[key], rep[key])
    total["loadavg_after"] = rep["loadavg_after"]
    return {"ingest": ing, "report": rep, "total": total}


def _last_json(text: str):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                pass
    return None


# --------------------------------------------------------------------------------------------------
# files


def uncompressed_mb(path: Path) -> float:
    if not path.name.endswith(".gz"):
        return path.stat().st_size / 1e6
    n = 0
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            n += len(chunk)
    return n / 1e6


_COMM_NAME_RE = re.compile(rb'"name"\s*:\s*"(?:nccl|rccl)[^"]*"', re.IGNORECASE)


def has_nccl_kernels(path: Path) -> bool:
    """True if some event with cat kernel/Kernel has a name containing nccl/rccl (checked in a subprocess)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        if not _COMM_NAME_RE.search(fh.read()):
            return False
    r = subprocess.run([PY, "-c", _SCAN_CHILD, str(path)], capture_output=True, text=True)
    return r.stdout.strip() == "yes"


_SCAN_CHILD = r"""
import gzip, sys, msgspec
class E(msgspec.Struct):
    cat: str | None = None
    name: str | None = None
class T(msgspec.Struct):
    traceEvents: list[E] = []
p = sys.argv[1]
data = (gzip.open if p.endswith(".gz") else open)(p, "rb").read()
evs = msgspec.json.decode(data, type=list[E]) if data.lstrip()[:1] == b"[" else msgspec.json.decode(data, type=T).traceEvents
ok = any(e.cat in ("kernel", "Kernel") and ("nccl" in (e.name or "").lower() or "rccl" in (e.name or "").lower()) for e in evs)
print("yes" if ok else "no")
"""


def corpus_files() -> list[Path]:
    if not CORPUS.is_dir():
        sys.exit(f"corpus not found at {CORPUS.resolve()} (expected ../shared/corpus beside the repo)")
    files = sorted(p for p in CORPUS.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")))
    return [p for p in files if has_nccl_kernels(p)]


def display_name(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(CORPUS.resolve()))
    except ValueError:
        try:
            return str(path.resolve().relative_to(REPO))
        except ValueError:
            return str(path)


# --------------------------------------------------------------------------------------------------
# main


def summarize(runs: list[dict], memory: dict | None) -> dict:
    """Median seconds and CPU seconds of the timed ``runs`` (not sampled); peak memory of the one
    sampled ``memory`` run (and at least every run's ru_maxrss)."""
    ok = [r for r in runs if r.get("rc") == 0]
    if not ok:
        r = runs[-1] if runs else {}
        tail = (r.get("stderr_tail") or "").strip().splitlines()
        err = r.get("error") or f"rc={r.get('rc')}: {tail[-1] if tail else ''}"
        return {"ok": False, "error": str(err), "runs": runs}
    sampled = [memory] if memory and memory.get("rc") == 0 else []
    return {
        "ok": True,
        "seconds": statistics.median(r["seconds"] for r in ok),
        "all_seconds": [round(r["seconds"], 3) for r in ok],
        "cpu_s": statistics.median(r.get("cpu_s", 0.0) for r in ok),
        "loadavg_after": [round(r.get("loadavg_after", 0.0), 2) for r in ok],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ok + sampled),
        "maxrss_mb": max(r["maxrss_mb"] for r in ok + sampled),
        "memory_run_seconds": round(memory["seconds"], 3) if sampled else None,
        "result": ok[-1].get("result"),
        "runs": len(ok),
    }


def measured(run, repeats: int, ok=lambda r: r.get("rc") == 0) -> tuple[list, object]:
    """``repeats`` timed calls of ``run(sample_s)`` without memory sampling, then one sampled call
    for peak memory (the sampling itself takes CPU from the command: see proc_measure.measure)."""
    timed = []
    for _ in range(repeats):
        timed.append(run(None))
        if not ok(timed[-1]):
            return timed, None  # not installed / failing: do not repeat
    return timed, run(SAMPLE_S)


def bench_file(path: Path, args) -> dict:
    mb = uncompressed_mb(path)
    name = display_name(path)
    print(f"== {name} ({mb:.1f} MB uncompressed)", file=sys.stderr, flush=True)
    rows: dict[str, dict] = {}
    if not args.skip_hta:
        rank = "-" if args.rank is None else str(args.rank)
        rows["hta"] = summarize(
            *measured(lambda s: run_child(HTA_CHILD, str(REPO / "tests"), str(path), rank, sample_s=s), args.hta_repeats)
        )
        print(f"   hta: {_brief(rows['hta'])}", file=sys.stderr, flush=True)
    if not args.skip_traceq:
        timed, memory = measured(lambda s: run_traceq(path, s), args.repeats, ok=lambda r: r["total"].get("rc") == 0)
        for part in ("ingest", "report", "total"):
            rows[f"traceq {part}"] = summarize([t[part] for t in timed], memory[part] if memory else None)
        print(f"   traceq total: {_brief(rows['traceq total'])}", file=sys.stderr, flush=True)
    if not args.skip_parse:
        if not args.skip_msgspec:
            rows["msgspec parse"] = summarize(*measured(lambda s: run_child(PARSE_CHILD, str(path), sample_s=s), args.repeats))
            print(f"   msgspec parse: {_brief(rows['msgspec parse'])}", file=sys.stderr, flush=True)
        rows["duckdb parse"] = summarize(
            *measured(lambda s: run_child(DUCKDB_PARSE_CHILD, str(path), sample_s=s), args.repeats)
        )
        print(f"   duckdb parse: {_brief(rows['duckdb parse'])}", file=sys.stderr, flush=True)
    return {"file": name, "path": str(path), "mb": mb, "tools": rows}


def _brief(row: dict) -> str:
    if not row.get("ok"):
        return "FAILED " + row.get("error", "")[:200]
    return f"{row['seconds']:.2f} s, {row['peak_rss_mb']:.0f} MB"


def print_table(results: list[dict]) -> None:
    head = ("file", "MB", "tool", "seconds", "CPU s", "MB/s", "peak RSS MiB", "x HTA")
    lines = []
    notes: list[str] = []
    for res in results:
        hta = res["tools"].get("hta")
        hta_s = hta["seconds"] if hta and hta.get("ok") else None
        for tool, row in res["tools"].items():
            if row.get("ok"):
                s = row["seconds"]
                speed = f"{hta_s / s:.1f}" if hta_s and tool != "hta" else ("1.0" if tool == "hta" else "")
                lines.append(
                    (res["file"], f"{res['mb']:.1f}", tool, f"{s:.2f}", f"{row['cpu_s']:.2f}", f"{res['mb'] / s:.1f}",
                     f"{row['peak_rss_mb']:.0f}", speed)
                )
            else:
                notes.append(f"[{len(notes) + 1}] {res['file']} {tool}: {row.get('error', 'failed')}")
                lines.append((res["file"], f"{res['mb']:.1f}", tool, "n/a", "", "", "", f"[{len(notes)}]"))
    widths = [max(len(str(x[i])) for x in [head] + lines) for i in range(len(head))]
    fmt = "  ".join("{:<%d}" % w if i in (0, 2) else "{:>%d}" % w for i, w in enumerate(widths))
    print(fmt.format(*head))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        print(fmt.format(*line))
    for note in notes:
        print(note)
    print(
        "\nx HTA = HTA seconds / tool seconds (higher is faster). seconds: median wall time of a fresh process;"
        "\nCPU s: its user+sys time (children included), the steadier figure on a shared machine."
        f"\n{os.cpu_count()} CPUs; 1-min load average now {os.getloadavg()[0]:.2f} (per run in the JSON)."
    )
    for res in results:
        hta = res["tools"].get("hta")
        if hta and hta.get("ok") and hta.get("result"):
            print(f"HTA comp_comm_overlap_pctg {res['file']}: {hta['result'].get('overlap_pctg')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help=f"trace files (default {DEFAULT_FILE.relative_to(REPO)})")
    ap.add_argument("--corpus", action="store_true", help="every corpus trace with NCCL/RCCL kernels")
    ap.add_argument("--repeats", type=int, default=3, help="repeats for traceq and the parse limit (median)")
    ap.add_argument("--hta-repeats", type=int, default=1, help="repeats for HTA (median)")
    ap.add_argument("--rank", type=int, default=None, help="rank to give HTA (default: distributedInfo.rank or 0)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--skip-traceq", action="store_true")
    ap.add_argument("--skip-parse", action="store_true")
    ap.add_argument("--skip-msgspec", action="store_true", help="of the parse limits, DuckDB's only")
    ap.add_argument("--json", type=Path, default=None, help="where to write the results (default benchmarks/out/bench_<time>.json)")
    args = ap.parse_args(argv)

    files = list(args.files)
    if args.corpus:
        files += corpus_files()
    if not files:
        if not DEFAULT_FILE.exists():
            sys.exit(f"{DEFAULT_FILE} not found: run `python benchmarks/make_large_trace.py` first")
        files = [DEFAULT_FILE]
    results = [bench_file(p, args) for p in files]
    print_table(results)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = args.json or OUT_DIR / f"bench_{time.strftime('%Y%m%d_%H%M%S')}.json"
    meta = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "argv": sys.argv[1:]}
    with open(out, "w") as fh:
        json.dump({"meta": meta, "results": results}, fh, indent=1, default=str)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
