"""The runs and trace files of a warehouse, with their metadata as typed columns (``traceq runs``)."""

from __future__ import annotations

import duckdb
import polars as pl

from collections.abc import Sequence

from traceq import query
from traceq.errors import EmptySelection
from traceq.report.result import Report
from traceq.report.selection import query_params
from traceq.store.frames import to_polars
from traceq.store.schema import require_side_tables
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened


# the runs' columns a narrow terminal leaves out first, the least read first: run, traces, ranks, world
# size, GPU, peak, tokens and FLOPs stay longest (--format csv or json gives them all)
RUN_COLUMNS_LAST = ("set_by_user", "device_type", "peak_tflops_source", "flops_source", "peak_gpu", "cp", "pp", "tp",
                    "dp", "gpus_per_node", "nodes", "model_flops_per_token", "warmup_steps", "seq_len", "model")


def run_metadata(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per run: its metadata as typed columns (see ``sql/run_metadata.sql``)."""

    return to_polars(query.run(con, "run_metadata", query_params()).order("run"))


def runs_report(db: Warehouse = DEFAULT_DB, *, traces: bool = False, runs: Sequence[str] | None = None) -> Report:
    """The runs of the warehouse with their metadata (:func:`list_runs`), or with ``traces`` their trace
    files (:func:`list_traces`); ``runs``: only these (EmptySelection naming the runs held when one is
    not there)."""
    table = list_traces(db) if traces else list_runs(db)
    held = set(table["run"].to_list())  # a run is there while a trace of it is: both listings hold every run
    missing = [r for r in runs or () if r not in held]
    if missing:
        raise EmptySelection(f"no run {', '.join(map(repr, missing))} in {db}; it holds "
                             + (", ".join(sorted(held)[:8]) + (", ..." if len(held) > 8 else "") if held else "none"))
    if runs:
        table = table.filter(pl.col("run").is_in(list(runs)))
    title = f"{table.height} trace file(s)" if traces else f"{table.height} run(s)"
    # the path is what a listing of traces is for: it stays, and the figures and labels beside it go first
    narrow = ("step_marker", "device_events", "events", "first_step", "last_step", "rank_source", "gpu_model",
              "steps") if traces else RUN_COLUMNS_LAST
    return Report(table, (), title, narrow=narrow)


def list_runs(db: Warehouse = DEFAULT_DB) -> pl.DataFrame:
    """Runs in the warehouse: traces, ranks, the typed metadata and which values were set by hand."""
    with opened(db) as con:
        require_side_tables(con)
        meta = run_metadata(con)
        counts = to_polars(con.sql(
            """
            select t.run, count(distinct t.trace_id) as traces, count(distinct s.rank) as ranks_with_steps,
                   (select string_agg(key, ',' order by key) from run_settings as u
                    where u.run = t.run and u.key <> 'peak_tflops_source') as set_by_user
            from traces as t
            left join steps as s using (trace_id)
            group by t.run
            """
        ))
    return counts.join(meta, on="run", how="left").sort("run")


def list_traces(db: Warehouse = DEFAULT_DB) -> pl.DataFrame:
    """Every trace file in the warehouse with what traceq took from it: its run, ranks, steps, GPU and
    where its rank came from. A (run, rank, step) comes from one file, so every report row traces back
    to one of these."""
    with opened(db) as con:
        return to_polars(con.sql(
            """
            select
                t.run,
                array_to_string(list_sort(list(distinct s.rank)), ',') as ranks,  -- in rank order, every time
                t.rank_source,
                count(s.step) filter (where s.source = 'marker') as steps,
                min(s.step) filter (where s.source = 'marker') as first_step,
                max(s.step) filter (where s.source = 'marker') as last_step,
                t.gpu_model,
                t.n_events as events,
                t.n_gpu_events as device_events,
                t.step_marker,
                t.path
            from traces as t
            left join steps as s using (trace_id)
            group by t.trace_id, t.run, t.rank_source, t.gpu_model, t.n_events, t.n_gpu_events, t.step_marker, t.path
            order by t.run, min(s.rank), t.path
            """
        ))
