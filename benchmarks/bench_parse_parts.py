"""Where the ingest's CPU goes: the parse statement in parts, then the ingest phase by phase.

    python benchmarks/bench_parse_parts.py                      # benchmarks/out/nccl_data_500mb.json
    python benchmarks/bench_parse_parts.py FILE --repeats 5

1. The trace is cut into the batch files ``traceq ingest`` parses (``traceq.ingest.reader`` and
   ``traceq.ingest.native.batch_files``, in a scratch directory), and ``sql/read_events.sql`` runs over all of
   them in four forms, interleaved, each ``--repeats`` times (process CPU seconds, medians):
   - ``elements``: ``count(*)`` over the JSON reader: DuckDB finds the elements and reads no column;
   - ``columns``: the reader's columns (ph, cat, name, pid, tid, ts, dur, args), each counted;
   - ``typed``: the typed columns of the statement (``final``), each counted;
   - ``materialized``: the statement as the ingest runs it, its rows materialized.
2. One in-process ingest into a new warehouse with the read-ahead thread replaced by a loop, so that
   the process CPU of each phase (parse, count, writes, steps) is its own.

The process CPU includes DuckDB's threads; the machine's noise is 5-10 % between identical runs.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from traceq.catalog import StepMarker, event_categories  # noqa: E402
from traceq.ingest import loader, pipeline, readahead, writer  # noqa: E402
from traceq.ingest.native import Executor  # noqa: E402
from traceq.ingest.native import BATCH_BYTES, batch_files  # noqa: E402
from traceq.ingest.reader import read_trace_ranges  # noqa: E402
from traceq.query import params_of, sql_text  # noqa: E402
from traceq.store.warehouse import connect  # noqa: E402


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def parse_forms(full: str, final_columns: list[str]) -> dict[str, tuple[str, bool]]:
    """The four forms of ``full`` (sql/read_events.sql; ``final_columns``: the columns of its rows):
    name -> (statement, materialize)."""
    end_of_raw = full.find("\n),\n\nclassified")
    if end_of_raw < 0 or "select * from final" not in full:
        raise SystemExit("sql/read_events.sql changed shape: update parse_forms()")
    raw = full[:end_of_raw] + "\n)\n"
    counted = ", ".join(f"count({c})" for c in final_columns)
    return {
        "elements": (raw + "select count(*) from raw", False),
        "columns": (raw + "select count(ph), count(cat), count(name), count(pid), count(tid), count(ts), "
                          "count(dur), count(args), count(file_no) from raw", False),
        "typed": (full.replace("select * from final", f"select {counted} from final"), False),
        "materialized": (full, True),
    }


def time_forms(names: list[str], repeats: int) -> dict[str, float]:
    con = connect(":memory:")
    con.execute("set preserve_insertion_order = false")
    con.execute(sql_text("macros.sql"))
    params = {
        "files": names, "file_parts": [0] * len(names), "file_all_ops": [False] * len(names),
        "max_object_bytes": max(Path(n).stat().st_size for n in names) + 1,
        **event_categories().sql_params(), **StepMarker().sql_params(),
    }
    full = sql_text("read_events.sql")
    forms = parse_forms(full, con.sql(full, params=params_of(full, params)).columns)  # bound, not run
    spent: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for name, (statement, materialize) in forms.items():
            before = cpu_s()
            rel = con.sql(statement, params=params_of(statement, params))
            if materialize:
                rel = rel.materialize()
            else:
                rel.fetchall()
            del rel
            spent[name].append(cpu_s() - before)
    con.close()
    return {name: statistics.median(values) for name, values in spent.items()}


def phases(path: Path, db: Path) -> tuple[float, dict[str, float]]:
    """One in-process ingest without the read-ahead thread: process CPU per phase."""
    spent: dict[str, float] = defaultdict(float)

    def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            before = cpu_s()
            try:
                return f(*args, **kwargs)
            finally:
                spent[name] += cpu_s() - before
        return run

    class Timed(Executor):  # the ingest's statements, timed by phase (the seam tests inject faults through)
        def parse(self, cursor, statement, params):
            return timed("parse (with the batch files and the digest beside it)", super().parse)(cursor, statement, params)

        def run(self, con, statement, params, rows):
            label = "count" if statement.startswith("-- batch_counts") else "writes"
            return timed(label, super().run)(con, statement, params, rows)

    saved = [(writer, "derive", writer.derive), (readahead, "prefetch", readahead.prefetch)]
    writer.derive = timed("steps and attribution", writer.derive)
    readahead.prefetch = lambda items, stop, discard, interrupt: iter(items)  # the read-ahead, in this thread
    try:
        before = cpu_s()
        summary = loader.ingest_traces([path], db, executor=Timed())
        total = cpu_s() - before
    finally:
        for module, name, f in saved:
            setattr(module, name, f)
    if not summary.ok:
        raise SystemExit(f"{path}: {summary.files[0].message}")
    return total, dict(spent)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", nargs="?", default=str(ROOT / "benchmarks/out/nccl_data_500mb.json"))
    ap.add_argument("--repeats", type=int, default=3, help="runs of each form of the parse (median)")
    args = ap.parse_args(argv)
    path = Path(args.file)
    if not path.exists():
        raise SystemExit(f"{path}: not found; make it with python benchmarks/make_large_trace.py")
    with tempfile.TemporaryDirectory(prefix="traceq-parse-parts-") as scratch:
        _, chunks = read_trace_ranges(path, pipeline.INGEST_CHUNK_BYTES)
        names = [n for batch in batch_files(chunks, scratch, BATCH_BYTES) for n in batch.names]
        started = time.perf_counter()
        forms = time_forms(names, args.repeats)
        print(f"{path.name}: {len(names)} batch files; the parse statement, CPU s (medians of {args.repeats}):")
        for name, seconds in forms.items():
            print(f"  {name:14s} {seconds:6.2f}")
        print(f"  ({time.perf_counter() - started:.0f} s)")
    with tempfile.TemporaryDirectory(prefix="traceq-parse-parts-db-") as d:
        total, spent = phases(path, Path(d) / "w.duckdb")
    print("in-process ingest, no read-ahead thread, CPU s:")
    for name, seconds in spent.items():
        print(f"  {name:54s} {seconds:6.2f}")
    print(f"  {'the rest (connect, schema, traces row, commit)':54s} {total - sum(spent.values()):6.2f}")
    print(f"  {'total':54s} {total:6.2f}")


if __name__ == "__main__":
    main()
