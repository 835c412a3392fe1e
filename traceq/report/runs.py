"""The runs and trace files of a warehouse, with their metadata as typed columns (``traceq runs``)."""

from __future__ import annotations

import duckdb
import polars as pl

from traceq import query
from traceq.report.selection import query_params
from traceq.store.frames import to_polars
from traceq.store.schema import require_side_tables
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened


def run_metadata(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per run: its metadata as typed columns (see ``sql/run_metadata.sql``)."""

    return to_polars(query.run(con, "run_metadata", query_params()).order("run"))


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
                string_agg(distinct s.rank::varchar, ',') as ranks,
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
