"""Scale figures for traceq: memory against trace size, speed, many ranks, Parquet, a Dask cluster.

    python benchmarks/bench_scale.py                    # everything (~5 min on 2 cores; builds the traces once)
    python benchmarks/bench_scale.py --only memory speed
    python benchmarks/bench_scale.py --sizes 100 500    # smaller memory sweep

Sections (each prints a table; all figures also go to ``benchmarks/out/bench_scale_<time>.json``):

- ``memory``: ``traceq ingest`` of 100 MB, 500 MB and 1.5 GB traces (``make_large_trace.py``: the
  steps of ``nccl_data.json.gz`` replicated with shifted times and fresh ids). Peak memory is
  sampled every 20 ms from ``/proc`` over the whole process tree:
  ``peak_rss_mb`` sums RSS (pages shared between the forked workers and the main process counted
  once per process: an upper bound), ``peak_pss_mb`` sums PSS (shared pages split: what the tree
  really holds). ``maxrss_mb`` is ``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the largest process.
- ``speed``: ingest + ``traceq report --metric exposed_comm --whole-trace`` of the 500 MB trace,
  end to end (fresh processes), as MB/s and MB/s per core; against the parse-only limit of one core:
  read (+ decompress) + msgspec typed decode (traceq's own Event Struct) of the whole file, with the
  GC thresholds ingest workers use (and with Python's defaults), the same in the reader's chunks,
  and the chunks decoded to Arrow (``decode_chunk``, what a worker does).
- ``ranks``: a synthetic 64-rank run (``make_ranks.py``: nccl_data.json.gz under 64 rank numbers)
  ingested with all cores and with one process (threads=1), then reported.
- ``report2048``: a warehouse of 2048 ranks x 50 steps synthesised directly in SQL
  (:func:`synthesize_run`), reported by run and by rank.
- ``collectives``: a run of 2048 ranks x 50 steps x 100 collectives synthesised in the warehouse
  (:func:`synthesize_collectives`: the sizes and transfer times of the merged 4-rank RCCL corpus
  trace's collectives, three ranks delayed), then ``traceq stragglers``, ``traceq collectives`` and
  ``traceq report --metric exposed_comm_wait,exposed_comm_transfer``.
- ``critical_path``: ``traceq critical-path`` of every step of such a run of 2048 ranks x 50 steps with
  4 collectives per step (8 kernels per rank and step, the report benchmark's kind), then 20; and HTA's
  critical path (one rank: it has no cross-rank path) on the merged RCCL file in the same run.
- ``rules``: ``traceq kernels`` on a warehouse of 10,000 distinct kernel names after ``traceq rules
  --add`` of 100,000 rules (prefixes, anchored patterns with a wildcard, case-insensitive classes);
  against the per-pair join traceq used before (each name against each rule, a pattern compiled per
  pair) on 100 of the names, scaled to 10,000, and checked to give the same rules on those 100.
- ``selection``: ``traceq report --run`` of a small real run (the corpus' H200 overlap trace), in a
  warehouse of its own and beside the 1.5 GB trace ingested as another run (medians of 3 at least);
  the report of every run; ``traceq diff`` of two step ranges of the small run.
- ``parquet``: ``traceq export --parquet`` of the 64-rank warehouse, and the report run on it.
- ``perfetto``: ``traceq export --perfetto`` of the 64-rank warehouse (every rank, and ``--ranks 0-7``)
  and of the synthetic 2048-rank run: seconds, file size, peak memory.
- ``dask``: ``traceq ingest-cluster`` of the 64 ranks on a local two-worker Dask cluster (skipped
  when dask is not installed).

1 MB = 1e6 bytes. Wall times are medians of ``--repeats`` runs; the machine may be shared, so
CPU seconds are given beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proc_measure  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
PY = sys.executable
TRACEQ = str(Path(PY).with_name("traceq"))
SOURCE = REPO.parent / "shared" / "corpus" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
CORES = os.cpu_count() or 1
SAMPLE_S = 0.02


def measure(cmd: list[str]) -> dict:
    """:func:`proc_measure.measure`, sampling every :data:`SAMPLE_S`; a failed command raises."""
    result = proc_measure.measure(cmd, sample_s=SAMPLE_S)
    if result["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result['rc']}): {result['stderr_tail']}")
    return result


def repeated(cmd_factory, repeats: int) -> dict:
    """Median wall over ``repeats`` runs (``cmd_factory(i)`` -> (cmd, cleanup)); peaks are maxima."""
    runs = []
    for i in range(repeats):
        cmd, cleanup = cmd_factory(i)
        try:
            runs.append(measure(cmd))
        finally:
            cleanup()
    best = dict(runs[0])
    best["seconds"] = statistics.median(r["seconds"] for r in runs)
    best["cpu_s"] = statistics.median(r["cpu_s"] for r in runs)
    for key in ("peak_rss_mb", "peak_pss_mb", "maxrss_mb"):
        best[key] = max(r[key] for r in runs)
    best["all_seconds"] = [round(r["seconds"], 2) for r in runs]
    return best


def _rm(*paths: Path) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
            Path(str(p) + ".wal").unlink(missing_ok=True)


def _rows(db: Path) -> dict[str, int]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f"select count(*) from {t}").fetchall()[0][0] for t in ("traces", "gpu_events", "host_events", "steps")}
    finally:
        con.close()


# --------------------------------------------------------------------------------------------------
# inputs


def large_trace(size_mb: int) -> Path:
    path = OUT / f"nccl_data_{size_mb}mb.json"
    if not path.exists():
        print(f"building {path.name} ...", file=sys.stderr)
        subprocess.run([PY, str(REPO / "benchmarks" / "make_large_trace.py"), "--size-mb", str(size_mb), "--out", str(path)],
                       check=True, stdout=subprocess.DEVNULL)
    return path


def rank_dir(ranks: int) -> Path:
    out = OUT / f"ranks{ranks}"
    if not (out / f"rank{ranks - 1}.trace.json.gz").exists():
        print(f"building {out.name} ...", file=sys.stderr)
        subprocess.run([PY, str(REPO / "benchmarks" / "make_ranks.py"), "--ranks", str(ranks), "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def json_mb(paths: list[Path]) -> float:
    from traceq.ingest.plan import json_size

    return sum(json_size(p) for p in paths) / 1e6


def synthesize_run(db: str | Path, *, ranks: int, steps: int, run: str = "synthetic", kernels: int = 8) -> None:
    """Write a run of ``ranks`` x ``steps`` straight into the warehouse at ``db`` (no trace files).

    Each rank is one trace; each step (100 us CPU span) has ``kernels`` kernels on the device:
    compute kernels covering 0-60 us of the step and comm kernels (ncclDevKernel AllReduce, with
    collective args) covering 40-100 us, spread over several streams. So for every rank and step:
    compute 60 us, comm 60 us, overlapped 20 us, exposed comm 40 us, idle 0.
    """
    from traceq.store.warehouse import connect

    half = max(1, kernels // 2)
    con = connect(db)
    try:
        con.begin()
        first = con.execute("select coalesce(max(trace_id), 0) + 1 from traces").fetchall()[0][0]
        con.execute("insert into runs (run) values (?) on conflict do nothing", [run])
        con.execute(
            """
            insert into traces (trace_id, run, path, content_digest, size_bytes, rank_source, file_rank, world_size,
                n_events, n_gpu_events, n_host_events, n_dropped)
            select $first + r, $run, 'synthetic/rank' || r, 'synthetic-' || $run || '-' || r, 0, 'distributedInfo', r,
                $ranks, 0, $steps * $kernels, 0, 0
            from range($ranks) as t(r)
            """,
            {"first": first, "run": run, "ranks": ranks, "steps": steps, "kernels": 2 * half},
        )
        con.execute(
            """
            insert into names (trace_id, name_id, name)
            select $first + r, n.id, n.name
            from range($ranks) as t(r)
            cross join (values (0, 'void gemm_kernel<bf16>()'),
                               (1, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)'),
                               (2, 'ProfilerStep#')) as n(id, name)
            """,
            {"first": first, "ranks": ranks},
        )
        con.execute(
            """
            insert into steps (trace_id, rank, step, start_ns, end_ns, step_time_ns, launches_without_gpu_work, source)
            select $first + r, r, s, s * 100000, s * 100000 + 100000, 100000, 0, 'marker'
            from range($ranks) as t(r) cross join range(1, $steps + 1) as u(s)
            """,
            {"first": first, "ranks": ranks, "steps": steps},
        )
        # kernel k < half: compute, [k*60/half, (k+1)*60/half] us with 2 us of overlap to the next;
        # kernel k >= half: comm, [40 + j*60/half, 40 + (j+1)*60/half] us
        con.execute(
            """
            insert into gpu_events (trace_id, rank, device, stream, kind, name_id, start_ns, dur_ns, correlation,
                collective, pg_name, group_size, step, step_source)
            select
                $first + r, r, 0, 7 + k % 4, 1,
                case when k < $half then 0 else 1 end,
                s * 100000 + case when k < $half then (k * 60000) // $half else 40000 + ((k - $half) * 60000) // $half end,
                60000 // $half + case when k + 1 = $half or k + 1 = 2 * $half then 0 else 2000 end,
                (s * 1000 + k),
                case when k >= $half then 'allreduce' end,
                case when k >= $half then '0' end,
                case when k >= $half then $ranks end,
                s, 'launch'
            from range($ranks) as t(r) cross join range(1, $steps + 1) as u(s) cross join range(2 * $half) as v(k)
            """,
            {"first": first, "ranks": ranks, "steps": steps, "half": half},
        )
        con.execute(
            """
            insert into host_events (trace_id, rank, cat, name_id, pid, tid, start_ns, dur_ns)
            select $first + r, r, 'user_annotation', 2, 1, 1, s * 100000, 100000
            from range($ranks) as t(r) cross join range(1, $steps + 1) as u(s)
            """,
            {"first": first, "ranks": ranks, "steps": steps},
        )
        con.commit()
    finally:
        con.close()


def synthesize_collectives(
    db: str | Path, template: list[tuple[str, int, int]], *, ranks: int, steps: int, collectives: int,
    delayed: dict[int, int], run: str = "collectives",
) -> None:
    """Write a run of ``ranks`` x ``steps`` x ``collectives`` matched collectives straight into the warehouse.

    ``template``: (collective type, bytes, transfer ns) of real collective instances (a corpus trace's),
    cycled over the slots of a step. Every rank runs the same collectives in the same order in one process
    group of all ranks (Seq numbered). Slot c of step s is 1 ms long; on every rank a compute kernel runs
    over its first 520 us; rank r arrives at the collective at 500 us + (r % 7) us, plus ``delayed[r]`` us
    for a delayed rank (at every fifth step), and every rank's kernel ends at 500 us + the latest
    arrival's offset + the transfer. So each instance's transfer is its template's, the last rank to
    arrive is the delayed one where one is, and the others wait for it.
    """
    from traceq.store.warehouse import connect

    con = connect(db)
    try:
        con.begin()
        con.execute("insert into runs (run) values (?) on conflict do nothing", [run])
        con.execute("create temp table template as select * from (values " + ", ".join(
            f"({i}, '{kind}', {size}, {transfer})" for i, (kind, size, transfer) in enumerate(template)
        ) + ") as t(i, kind, bytes, transfer_ns)")
        con.execute("create temp table delays as select * from (values " + ", ".join(
            f"({r}, {d})" for r, d in delayed.items()) + ") as t(rank, delay_us)")
        con.execute(
            """
            insert into traces (trace_id, run, path, content_digest, size_bytes, rank_source, file_rank, world_size,
                n_events, n_gpu_events, n_host_events, n_dropped)
            select 1 + r, $run, 'synthetic/rank' || r, 'synthetic-' || $run || '-' || r, 0, 'distributedInfo', r,
                $ranks, 0, $steps * $collectives * 2, 0, 0
            from range($ranks) as t(r)
            """,
            {"run": run, "ranks": ranks, "steps": steps, "collectives": collectives},
        )
        con.execute(
            """
            insert into names (trace_id, name_id, name)
            select 1 + r, n.id, n.name
            from range($ranks) as t(r)
            cross join (values (0, 'void gemm_kernel<bf16>()'),
                               (1, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)'),
                               (2, 'ProfilerStep#')) as n(id, name)
            """,
            {"ranks": ranks},
        )
        step_ns = collectives * 1_000_000
        con.execute(
            """
            insert into steps (trace_id, rank, step, start_ns, end_ns, step_time_ns, launches_without_gpu_work, source)
            select 1 + r, r, s, s * $step_ns, (s + 1) * $step_ns, $step_ns, 0, 'marker'
            from range($ranks) as t(r) cross join range(1, $steps + 1) as u(s)
            """,
            {"ranks": ranks, "steps": steps, "step_ns": step_ns},
        )
        con.execute(
            """
            insert into host_events (trace_id, rank, cat, name_id, pid, tid, start_ns, dur_ns)
            select 1 + r, r, 'user_annotation', 2, 1, 1, s * $step_ns, $step_ns
            from range($ranks) as t(r) cross join range(1, $steps + 1) as u(s)
            """,
            {"ranks": ranks, "steps": steps, "step_ns": step_ns},
        )
        con.execute(
            """
            insert into gpu_events (trace_id, rank, device, stream, kind, name_id, start_ns, dur_ns, correlation,
                collective, pg_name, pg_ranks, group_size, in_nelems, out_nelems, dtype, seq, step, step_source)
            with slots as (
                select r, s, c, t.kind, t.bytes, t.transfer_ns,
                       s * $step_ns + c * 1000000 as slot_ns,
                       case when s % 5 = 0 then coalesce(d.delay_us, 0) else 0 end as delay_us
                from range($ranks) as a(r) cross join range(1, $steps + 1) as b(s) cross join range($collectives) as k(c)
                inner join template as t on t.i = c % $n_template
                left join delays as d on d.rank = r
            ),
            latest as (select s, c, max((r % 7) * 1000 + delay_us * 1000) as latest_ns from slots group by all)
            select 1 + r, r, 0, 7, 1, 0, slot_ns, 520000, s * 100000 + c * 2, null, null, null, null, null, null,
                   null, null, s, 'launch'
            from slots
            union all
            select 1 + r, r, 0, 20, 1, 1,
                   slot_ns + 500000 + (r % 7) * 1000 + delay_us * 1000,
                   latest_ns + transfer_ns - ((r % 7) * 1000 + delay_us * 1000),
                   s * 100000 + c * 2 + 1, lower(kind), '0', null, $ranks,
                   case when kind = 'AllGather' then bytes // 2 // $ranks else bytes // 2 end,
                   case when kind = 'AllGather' then bytes // 2 else bytes // 2 end, 'BFloat16',
                   s * $collectives + c, s, 'launch'
            from slots inner join latest using (s, c)
            """,
            {"ranks": ranks, "steps": steps, "collectives": collectives, "step_ns": step_ns, "n_template": len(template)},
        )
        con.commit()
    finally:
        con.close()


def corpus_template(tmp: Path) -> list[tuple[str, int, int]]:
    """(collective type, bytes, transfer ns) of the matched instances of the merged 4-rank RCCL corpus trace."""
    from traceq.ingest import ingest_traces
    from traceq.report.collectives import instances_report

    source = REPO.parent / "shared" / "corpus" / "amd_hpctraining" / "fused_traces" / "merged_all_events.json.gz"
    db = tmp / "template.duckdb"
    _rm(db)
    assert ingest_traces([source], db, threads=1).ok
    rows = instances_report(db).table.filter("arrived_last").sort("instance")
    _rm(db)
    return [(r["collective_type"], int(r["size_bytes"]), round(r["transfer_us"] * 1000)) for r in rows.iter_rows(named=True)]


# --------------------------------------------------------------------------------------------------
# sections


def bench_memory(sizes: list[int], repeats: int, tmp: Path) -> list[dict]:
    rows = []
    for size in sizes:
        trace = large_trace(size)
        mb = trace.stat().st_size / 1e6
        db = tmp / f"mem{size}.duckdb"
        res = repeated(lambda i: ([TRACEQ, "ingest", str(trace), "--db", str(db), "-q"], lambda: None if i == repeats - 1 else _rm(db)), repeats)
        rows.append({
            "trace_mb": round(mb), "seconds": round(res["seconds"], 2), "cpu_s": round(res["cpu_s"], 2),
            "mb_per_s": round(mb / res["seconds"], 1),
            "peak_rss_mb": round(res["peak_rss_mb"]), "peak_pss_mb": round(res["peak_pss_mb"]),
            "maxrss_mb": round(res["maxrss_mb"]),
            "rss_bytes_per_json_byte": round(res["peak_rss_mb"] * 2**20 / (mb * 1e6), 3),
            **_rows(db),
        })
        _rm(db)
    return rows


def _parse_limit(path: Path) -> dict:
    """Seconds of one core to read + decode ``path`` with traceq's typed decoder, and to Arrow."""
    code = f"""
import gc, json, time
from pathlib import Path
# no gc.set_threshold: ingest no longer changes it (measured: no gain, BENCHMARKS.md)
from traceq.ingest.decode import _FAST, decode_chunk
from traceq.ingest.reader import read_trace
from traceq.ingest.pipeline import INGEST_CHUNK_BYTES
t0 = time.process_time(); n = 0
header, chunks = read_trace(Path({str(path)!r}), INGEST_CHUNK_BYTES)
read_s = decode_s = arrow_s = 0.0
while True:
    t = time.process_time()
    c = next(chunks, None)
    read_s += time.process_time() - t
    if c is None:
        break
    t = time.process_time(); events = _FAST.decode(b"[" + c + b"]"); decode_s += time.process_time() - t
    n += len(events); del events
    t = time.process_time(); decode_chunk(c); arrow_s += time.process_time() - t
print(json.dumps({{"read_s": read_s, "decode_s": decode_s, "arrow_s": arrow_s, "events": n}}))
"""
    res = measure([PY, "-c", code])
    return json.loads(res["stdout"])


def _raw_parse_limit(path: Path) -> dict:
    """Decompress + typed msgspec decode of the whole file in one piece (no chunking), one core."""
    code = f"""
import gzip, json, time
from traceq.ingest.decode import Event
import msgspec
class Doc(msgspec.Struct):
    traceEvents: list[Event]
t = time.process_time()
raw = open({str(path)!r}, "rb").read()
data = gzip.decompress(raw) if raw[:2] == b"\\x1f\\x8b" else raw
read_s = time.process_time() - t
t = time.process_time()
doc = msgspec.json.decode(data, type=Doc)
decode_s = time.process_time() - t
n = len(doc.traceEvents)
del doc
import gc
gc.set_threshold(100_000, 50, 100)  # the thresholds ingest set until 0.2 (now left alone: no gain)
t = time.process_time()
doc = msgspec.json.decode(data, type=Doc)
print(json.dumps({{"read_s": read_s, "decode_s": decode_s, "decode_tuned_gc_s": time.process_time() - t, "events": n}}))
"""
    return json.loads(measure([PY, "-c", code])["stdout"])


def bench_speed(repeats: int, tmp: Path) -> dict:
    trace = large_trace(500)
    mb = trace.stat().st_size / 1e6
    db = tmp / "speed.duckdb"
    ingest = repeated(lambda i: ([TRACEQ, "ingest", str(trace), "--db", str(db), "-q"], lambda: None if i == repeats - 1 else _rm(db)), repeats)
    report = repeated(lambda i: ([TRACEQ, "report", "--metric", "exposed_comm", "--whole-trace", "--db", str(db), "--format", "csv"], lambda: None), repeats)
    rows = _rows(db)
    _rm(db)
    chunked = _parse_limit(trace)
    whole = _raw_parse_limit(trace)
    total_s = ingest["seconds"] + report["seconds"]
    limit_core_s = whole["read_s"] + whole["decode_tuned_gc_s"]
    return {
        "trace_mb": round(mb),
        "ingest_s": round(ingest["seconds"], 2), "ingest_cpu_s": round(ingest["cpu_s"], 2),
        "ingest_all_s": ingest["all_seconds"],
        "report_s": round(report["seconds"], 2),
        "total_s": round(total_s, 2),
        "mb_per_s": round(mb / total_s, 1),
        "mb_per_s_per_core": round(mb / total_s / CORES, 1),
        "mb_per_cpu_s": round(mb / (ingest["cpu_s"] + report["cpu_s"]), 1),
        "peak_rss_mb": round(max(ingest["peak_rss_mb"], report["peak_rss_mb"])),
        "parse_limit_mb_per_core_s": round(mb / limit_core_s, 1),
        "parse_limit_default_gc_mb_per_core_s": round(mb / (whole["read_s"] + whole["decode_s"]), 1),
        "parse_limit_chunked_mb_per_core_s": round(mb / (chunked["read_s"] + chunked["decode_s"]), 1),
        "decode_to_arrow_mb_per_core_s": round(mb / (chunked["read_s"] + chunked["arrow_s"]), 1),
        "ingest_share_of_parse_limit": round((mb / total_s / CORES) / (mb / limit_core_s), 2),
        "hta_reference_s": "~60 s, 2.7 GB (bench_ingest.py measures it in the same run)",
        **rows,
    }


def bench_ranks(repeats: int, tmp: Path, ranks: int = 64) -> dict:
    folder = rank_dir(ranks)
    files = sorted(folder.glob("*.json.gz"))
    mb = json_mb(files)
    db = tmp / "ranks.duckdb"
    serial = repeated(lambda i: ([TRACEQ, "ingest", str(folder), "--db", str(db), "-q", "--threads", "1"], lambda: _rm(db)), 1)
    parallel = repeated(lambda i: ([TRACEQ, "ingest", str(folder), "--db", str(db), "-q"], lambda: None if i == repeats - 1 else _rm(db)), repeats)
    report = repeated(lambda i: ([TRACEQ, "report", "--metric", "exposed_comm", "--by", "run", "--db", str(db), "--format", "csv"], lambda: None), repeats)
    rows = _rows(db)
    return {
        "ranks": ranks, "json_mb": round(mb), "files": len(files),
        "serial_s": round(serial["seconds"], 2), "parallel_s": round(parallel["seconds"], 2),
        "speedup": round(serial["seconds"] / parallel["seconds"], 2),
        "parallel_mb_per_s": round(mb / parallel["seconds"], 1),
        "parallel_cpu_s": round(parallel["cpu_s"], 1),
        "peak_rss_mb": round(parallel["peak_rss_mb"]), "peak_pss_mb": round(parallel["peak_pss_mb"]),
        "report_s": round(report["seconds"], 2),
        "report_line": report["stdout"].strip().splitlines()[-1][:160],
        **rows,
    }


def bench_report2048(repeats: int, tmp: Path, ranks: int = 2048, steps: int = 50) -> dict:
    db = tmp / "synthetic2048.duckdb"
    _rm(db)
    started = time.perf_counter()
    synthesize_run(db, ranks=ranks, steps=steps, run=f"synthetic{ranks}")
    build_s = time.perf_counter() - started
    by_run = repeated(lambda i: ([TRACEQ, "report", "--metric", "exposed_comm", "--by", "run", "--db", str(db), "--format", "csv"], lambda: None), repeats)
    by_rank = repeated(lambda i: ([TRACEQ, "report", "--metric", "exposed_comm", "--by", "run,rank", "--db", str(db), "--format", "csv"], lambda: None), repeats)
    rows = _rows(db)
    _rm(db)
    return {
        "ranks": ranks, "steps_per_rank": steps, "metric_rows": ranks * steps, "build_s": round(build_s, 2),
        "report_by_run_s": round(by_run["seconds"], 2), "report_by_rank_s": round(by_rank["seconds"], 2),
        "peak_rss_mb": round(max(by_run["peak_rss_mb"], by_rank["peak_rss_mb"])),
        "by_run_line": by_run["stdout"].strip().splitlines()[-1][:160],
        **rows,
    }


def bench_collectives(repeats: int, tmp: Path, ranks: int = 2048, steps: int = 50, collectives: int = 100) -> dict:
    db = tmp / "collectives.duckdb"
    _rm(db)
    delayed = {3: 40, 700: 25, 1500: 10}
    started = time.perf_counter()
    synthesize_collectives(db, corpus_template(tmp), ranks=ranks, steps=steps, collectives=collectives, delayed=delayed)
    build_s = time.perf_counter() - started
    out = {"ranks": ranks, "steps_per_rank": steps, "collectives_per_step": collectives,
           "comm_kernels": ranks * steps * collectives, "delayed_ranks": str(delayed), "build_s": round(build_s, 1)}
    for name, args in (
        ("stragglers", ["stragglers"]),
        ("collectives", ["collectives", "--by", "collective_type,size_bucket"]),
        ("report_exposed_wait", ["report", "--metric", "exposed_comm_wait,exposed_comm_transfer", "--by", "run"]),
    ):
        got = repeated(lambda i, a=args: ([TRACEQ, *a, "--db", str(db), "--format", "csv"], lambda: None), repeats)
        out[f"{name}_s"] = round(got["seconds"], 2)
        out[f"{name}_peak_rss_mb"] = round(got["peak_rss_mb"])
        out[f"{name}_first_rows"] = " | ".join(got["stdout"].strip().splitlines()[1:3])[:200]
    _rm(db)
    return out


def bench_critical_path(repeats: int, tmp: Path, ranks: int = 2048, steps: int = 50) -> dict:
    """``traceq critical-path`` of every step of a synthetic run: 2048 ranks x 50 steps (8 kernels per rank
    and step, the report benchmark's kind: 4 compute, 4 matched collectives with corpus sizes, 3 ranks
    delayed), then 20 collectives per step; and the peer, HTA's critical path (one rank, one step of the
    merged 4-rank RCCL file), in the same run."""
    out: dict = {"ranks": ranks, "steps_per_rank": steps}
    delayed = {3: 40, 700: 25, 1500: 10}
    template = corpus_template(tmp)
    for collectives in (4, 20):
        db = tmp / f"path{collectives}.duckdb"
        _rm(db)
        synthesize_collectives(db, template, ranks=ranks, steps=steps, collectives=collectives, delayed=delayed)
        got = repeated(lambda i: ([TRACEQ, "critical-path", "--db", str(db), "--include-last", "--format", "csv"],
                                  lambda: None), repeats)
        rows = got["stdout"].strip().splitlines()
        out[f"kernels_{collectives}"] = ranks * steps * collectives * 2
        out[f"path_{collectives}_s"] = round(got["seconds"], 2)
        out[f"path_{collectives}_cpu_s"] = round(got["cpu_s"], 2)
        out[f"path_{collectives}_peak_rss_mb"] = round(got["peak_rss_mb"])
        out[f"path_{collectives}_steps"] = len(rows) - 1
        out[f"path_{collectives}_step5"] = next((r for r in rows if r.split(",")[1] == "5"), "")[:160]
        _rm(db)
    out.update(_hta_critical_path(tmp))
    return out


def _hta_critical_path(tmp: Path) -> dict:
    """HTA's critical path (it covers one rank) of step 10, rank 0, of the merged RCCL file: seconds, or why
    it did not run."""
    source = REPO.parent / "shared" / "corpus" / "amd_hpctraining" / "fused_traces" / "merged_all_events.json.gz"
    folder = tmp / "hta_cp"
    folder.mkdir(exist_ok=True)
    shutil.copy(source, folder / source.name)
    code = ("import time; from hta.trace_analysis import TraceAnalysis; a = TraceAnalysis(trace_dir=%r); t = time.time(); "
            "r = a.critical_path_analysis(rank=0, annotation='ProfilerStep#10', instance_id=0); "
            "print('HTA_OK', round(time.time() - t, 2), bool(r and r[1]))" % str(folder))
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=900)
    shutil.rmtree(folder, ignore_errors=True)
    done = [line for line in proc.stdout.splitlines() if line.startswith("HTA_OK")]
    if done:
        return {"hta_one_rank_s": float(done[0].split()[1])}
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"hta_one_rank": f"failed: {last[:160]}"}


def rule_patterns(count: int, seed: int = 2) -> list[str]:
    """``count`` classification patterns of three kinds: a name fragment, an anchored pattern with a
    wildcard, a case-insensitive character class."""
    import random

    rng = random.Random(seed)
    patterns = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.5:
            patterns.append("kernel_" + "".join(rng.choices("abcdefgh", k=6)))
        elif kind < 0.8:
            patterns.append(f"^void at::native::kernel_{''.join(rng.choices('abcdefgh', k=4))}.*<{rng.randrange(10_000)}>$")
        else:
            patterns.append("(?i)KERNEL_[a-c]{3}" + "".join(rng.choices("abcdefgh", k=3)))
    return patterns


def bench_selection(repeats: int, tmp: Path) -> list[dict]:
    """A report of one small run (a real H200 trace of the corpus, 9 steps reported) in a warehouse
    of its own, and beside the 1.5 GB trace ingested as another run: the statements read the selected
    runs' rows only, so the ratio is the cost of what the warehouse holds besides. Also the report of
    every run (what a selection applied afterwards paid) and ``diff`` of two step ranges of the run."""
    small_trace = REPO.parent / "shared" / "corpus" / "traceq_h200" / "h200-overlap"
    small, both = tmp / "small.duckdb", tmp / "both.duckdb"
    _rm(small, both)
    subprocess.run([TRACEQ, "ingest", str(small_trace), "--db", str(small), "-q"], check=True, stdout=subprocess.DEVNULL)
    shutil.copy(small, both)
    subprocess.run([TRACEQ, "ingest", str(large_trace(1500)), "--name", "big", "--db", str(both), "-q"], check=True,
                   stdout=subprocess.DEVNULL)
    cases = [
        ("report --run h200-overlap", small, ["report", "--run", "h200-overlap"]),
        ("report --run h200-overlap", both, ["report", "--run", "h200-overlap"]),
        ("report --run h200-overlap --steps 2:6", small, ["report", "--run", "h200-overlap", "--steps", "2:6"]),
        ("report --run h200-overlap --steps 2:6", both, ["report", "--run", "h200-overlap", "--steps", "2:6"]),
        ("report (every run)", both, ["report"]),
        ("diff h200-overlap,steps=2:5 ,steps=6:9", small, ["diff", "h200-overlap,steps=2:5", "h200-overlap,steps=6:9"]),
        ("diff h200-overlap,steps=2:5 ,steps=6:9", both, ["diff", "h200-overlap,steps=2:5", "h200-overlap,steps=6:9"]),
    ]
    rows, alone = [], {}
    for label, db, args in cases:
        m = repeated(lambda _i, a=args, d=db: ([TRACEQ, *a, "--db", str(d)], lambda: None), repeats)
        row = {"command": label, "warehouse": "with the 1.5 GB run" if db == both else "the run alone",
               "seconds": round(m["seconds"], 2), "cpu_s": round(m["cpu_s"], 2), "peak_rss_mb": round(m["peak_rss_mb"]),
               "all_seconds": m["all_seconds"]}
        if db == small:
            alone[label] = m["seconds"]
        elif label in alone:
            row["x_alone"] = round(m["seconds"] / alone[label], 2)
        rows.append(row)
    return rows


def bench_rules(repeats: int, tmp: Path, names: int = 10_000, rules: int = 100_000, sample: int = 100) -> dict:
    """``traceq kernels`` with ``rules`` user rules over ``names`` kernel names; the former per-pair
    join on ``sample`` names, scaled."""
    import random

    import duckdb

    from traceq.store.warehouse import connect

    db, csv_path = tmp / "rules.duckdb", tmp / "rules.csv"
    _rm(db)
    synthesize_run(db, ranks=1, steps=2)
    rng = random.Random(1)
    kernel_names = [f"void at::native::kernel_{''.join(rng.choices('abcdefgh', k=12))}<{i}>" for i in range(names)]
    con = connect(db)
    con.execute("insert into names select 1, 3 + i, $1[i + 1] from range(len($1)) as t(i)", [kernel_names])
    con.execute("""insert into gpu_events (trace_id, rank, device, stream, kind, name_id, start_ns, dur_ns, step, step_source)
                   select 1, 0, 0, 7, 1, 3 + i, 100000 + i, 1, 1, 'launch' from range($1) as t(i)""", [names])
    con.close()
    patterns = rule_patterns(rules)
    with csv_path.open("w") as f:
        f.write("priority,pattern,class,category,collective\n")
        f.writelines(f'{i},"{p}",compute,user_{i % 7},\n' for i, p in enumerate(patterns))
    added = measure([TRACEQ, "rules", "--add", str(csv_path), "--db", str(db)])
    got = repeated(lambda i: ([TRACEQ, "kernels", "--db", str(db), "--format", "csv", "--top", "5"], lambda: None), repeats)
    out: dict = {"names": names, "rules": rules, "rules_add_s": round(added["seconds"], 2),
                 "kernels_s": round(got["seconds"], 2), "kernels_cpu_s": round(got["cpu_s"], 2),
                 "kernels_peak_rss_mb": round(got["peak_rss_mb"])}
    from traceq import classify

    con = duckdb.connect(str(db), read_only=True)
    subset = kernel_names[:sample]
    start = time.perf_counter()
    joined = dict(con.execute(
        "select n, min(i) from unnest($1) as t(n), (select unnest($2) as p, unnest(range(len($2))) as i) "
        "where regexp_matches(n, p) group by n", [subset, patterns]).fetchall())
    join_s = time.perf_counter() - start
    start = time.perf_counter()
    fast = classify.first_rules(con, subset, patterns)
    out["same_rules_on_sample"] = joined == fast
    out["sample_join_s"] = round(join_s, 2)
    out["sample_chunked_s"] = round(time.perf_counter() - start, 2)
    out["per_pair_join_scaled_s"] = round(join_s * names / sample)
    out["ratio_join_over_kernels"] = round(out["per_pair_join_scaled_s"] / out["kernels_s"])
    con.close()
    _rm(db, csv_path)
    return out


def bench_parquet(repeats: int, tmp: Path) -> dict:
    db = tmp / "ranks.duckdb"
    if not db.exists():
        bench_ranks(1, tmp)
    out = tmp / "ranks_parquet"
    _rm(out)
    export = measure([TRACEQ, "export", "--parquet", str(out), "--db", str(db)])
    size_mb = sum(f.stat().st_size for f in out.rglob("*.parquet")) / 1e6
    reports = {}
    for name, source in (("duckdb", db), ("parquet", out)):
        reports[name] = repeated(lambda i: ([TRACEQ, "report", "--metric", "exposed_comm", "--by", "run,rank", "--db", str(source), "--format", "csv"], lambda: None), repeats)
    return {
        "export_s": round(export["seconds"], 2), "parquet_mb": round(size_mb, 1),
        "files": sum(1 for _ in out.rglob("*.parquet")),
        "warehouse_mb": round(db.stat().st_size / 1e6, 1),
        "report_duckdb_s": round(reports["duckdb"]["seconds"], 2),
        "report_parquet_s": round(reports["parquet"]["seconds"], 2),
        "same_report": reports["duckdb"]["stdout"] == reports["parquet"]["stdout"],
    }


def bench_perfetto(repeats: int, tmp: Path) -> dict:
    """``traceq export --perfetto`` of the 64-rank warehouse (every rank, then ranks 0-7), and of the
    2048-rank x 50-step run of :func:`synthesize_run` (memory against the size of the run)."""
    db = tmp / "ranks.duckdb"
    if not db.exists():
        bench_ranks(1, tmp)
    synthetic = tmp / "perfetto2048.duckdb"
    _rm(synthetic)
    synthesize_run(synthetic, ranks=2048, steps=50, run="synthetic2048")
    out = {}
    for name, source, extra in (("all_ranks", db, []), ("ranks_0_7", db, ["--ranks", "0-7"]),
                                ("synthetic2048", synthetic, [])):
        trace = tmp / f"{name}.pftrace"
        cmd = [TRACEQ, "export", "--perfetto", str(trace), "--db", str(source), "--overwrite", *extra]
        got = repeated(lambda i, c=cmd: (c, lambda: None), repeats)
        out[f"{name}_s"] = round(got["seconds"], 2)
        out[f"{name}_cpu_s"] = round(got["cpu_s"], 2)
        out[f"{name}_mb"] = round(trace.stat().st_size / 1e6, 1)
        out[f"{name}_peak_rss_mb"] = round(got["peak_rss_mb"])
        out[f"{name}_line"] = got["stdout"].strip()[-160:]
        _rm(trace)
    out["gpu_events"] = _rows(db)["gpu_events"]
    out["synthetic2048_gpu_events"] = _rows(synthetic)["gpu_events"]
    _rm(synthetic)
    return out


def bench_dask(tmp: Path, ranks: int = 64) -> dict:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return {"skipped": "dask[distributed] is not installed (pip install 'traceq[dask]')"}
    folder = rank_dir(ranks)
    out = tmp / "dask_parquet"
    _rm(out)
    res = measure([TRACEQ, "ingest-cluster", str(folder), "--parquet", str(out), "--processes", str(min(2, CORES))])
    report = measure([TRACEQ, "report", "--metric", "exposed_comm", "--by", "run", "--db", str(out), "--format", "csv"])
    mb = json_mb(sorted(folder.glob("*.json.gz")))
    return {
        "workers": min(2, CORES), "json_mb": round(mb), "seconds_incl_cluster_start": round(res["seconds"], 2),
        "mb_per_s": round(mb / res["seconds"], 1), "report_s": round(report["seconds"], 2),
        "report_line": report["stdout"].strip().splitlines()[-1][:160],
    }


# --------------------------------------------------------------------------------------------------


def _print_table(title: str, rows: list[dict] | dict) -> None:
    rows = rows if isinstance(rows, list) else [rows]
    print(f"\n== {title}")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    for k in keys:
        print(f"  {k:36s} " + "  ".join(f"{str(r.get(k, '')):>14s}" for r in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sections = ["memory", "speed", "ranks", "report2048", "collectives", "critical_path", "rules", "selection", "parquet",
                "perfetto", "dask"]
    ap.add_argument("--only", nargs="*", choices=sections, default=sections)
    ap.add_argument("--sizes", nargs="*", type=int, default=[100, 500, 1500], help="memory sweep, MB of JSON")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict = {"cores": CORES, "python": sys.version.split()[0], "loadavg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp_name:
        tmp = Path(tmp_name)
        if "memory" in args.only:
            results["memory"] = bench_memory(args.sizes, args.repeats, tmp)
            _print_table("memory: traceq ingest of one trace (peak over main + workers)", results["memory"])
        if "speed" in args.only:
            results["speed"] = bench_speed(args.repeats, tmp)
            _print_table(f"speed: ingest + report --whole-trace, 500 MB trace, {CORES} cores", results["speed"])
        if "ranks" in args.only or "parquet" in args.only:
            results["ranks"] = bench_ranks(args.repeats, tmp)
            _print_table("ranks: 64 rank files (nccl_data.json.gz renumbered)", results["ranks"])
        if "report2048" in args.only:
            results["report2048"] = bench_report2048(args.repeats, tmp)
            _print_table("report2048: 2048 ranks x 50 steps synthesised in the warehouse", results["report2048"])
        if "collectives" in args.only:
            results["collectives"] = bench_collectives(args.repeats, tmp)
            _print_table("collectives: 2048 ranks x 50 steps x 100 collectives (corpus sizes, 3 ranks delayed)",
                         results["collectives"])
        if "critical_path" in args.only:
            results["critical_path"] = bench_critical_path(args.repeats, tmp)
            _print_table("critical_path: traceq critical-path, 2048 ranks x 50 steps (4, then 20 collectives per step)",
                         results["critical_path"])
        if "rules" in args.only:
            results["rules"] = bench_rules(args.repeats, tmp)
            _print_table("rules: traceq kernels, 10,000 kernel names, 100,000 user rules", results["rules"])
        if "selection" in args.only:
            results["selection"] = bench_selection(max(args.repeats, 3), tmp)
            _print_table("selection: one small run's report alone and beside a 1.5 GB run", results["selection"])
        if "parquet" in args.only:
            results["parquet"] = bench_parquet(args.repeats, tmp)
            _print_table("parquet: export of the 64-rank warehouse, report on it", results["parquet"])
        if "perfetto" in args.only:
            results["perfetto"] = bench_perfetto(args.repeats, tmp)
            _print_table("perfetto: export --perfetto of the 64-rank warehouse", results["perfetto"])
        if "dask" in args.only:
            results["dask"] = bench_dask(tmp)
            _print_table("dask: ingest-cluster of the 64 ranks, local 2-worker cluster", results["dask"])
    results["loadavg_end"] = os.getloadavg()
    path = OUT / f"bench_scale_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nloadavg start {results['loadavg_start']} end {results['loadavg_end']}; figures in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
