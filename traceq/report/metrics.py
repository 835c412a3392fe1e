"""Metrics per (run, rank, step) from the warehouse, and their aggregation across steps, ranks and runs.

A report's step rows are one statement that leaves DuckDB once: ``sql/step_metrics.sql`` (per selected
step; ``sql/trace_metrics.sql`` over the whole trace) composes the interval figures of each window
(``sql/window_metrics.sql``: ``sql/interval_breakdown.sql`` with, where asked, idle by cause and the
split across ranks), throughput, FLOPs and power (``sql/step_throughput.sql``) and the run's metadata
(``sql/run_metadata.sql``); a breakdown's rows are ``sql/breakdown_metrics.sql``. Every join happens in
DuckDB, over the selected runs alone. This module then converts to the units in the metric names and
aggregates the step rows through :mod:`traceq.report.aggregation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING

import duckdb

from traceq import query
from traceq.catalog import (
    BREAKDOWNS,
    CROSS_RANK,
    GROUP_COLUMNS,
    IDLE_PARTS,
    META_COLUMNS,
    METRICS,
    NS_COLUMN_OF,
    PER_STEP_METRICS,
    columns,
    resolve_metric,
)
from traceq.errors import ConfigError, EmptySelection
from traceq.report import crossrank
from traceq.report.aggregation import aggregate
from traceq.report.notes import metric_notes, selection_notes, step_window_notes
from traceq.report.result import Report
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import import_in_background, to_polars
from traceq.store.schema import require_side_tables
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:  # imported where used: a report imports it while DuckDB runs the first query
    import polars as pl


def list_metrics() -> pl.DataFrame:
    """Every metric with its unit and one-line definition."""
    import polars as pl

    return pl.DataFrame([{"name": m.name, "unit": m.unit, "definition": m.definition} for m in METRICS])


def run_metadata_frame(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per run with the metadata columns a report can group by (``sql/run_metadata.sql``)."""
    return to_polars(query.run(con, "run_metadata", query_params()).select(f"run, {', '.join(META_COLUMNS)}"))


def interval_breakdown(
    con: duckdb.DuckDBPyConnection, whole_trace: bool, selection: StepSelection = StepSelection(),
    idle_parts: bool = False,
    cross_rank: bool = False,
    runs: Sequence[str] | None = None,
) -> pl.DataFrame:
    """Interval metrics (ns) per window: per (trace, rank, device, step) of the selected steps, or per
    (trace, rank, device) over the whole timeline (step -1). Device activity (``activity`` gpu), or for
    traces without any, CPU-side gloo communication and operators (``activity`` cpu, device -1).
    ``idle_parts``: with idle split by cause (``sql/idle_breakdown.sql``; null on CPU-only traces).
    ``cross_rank``: with communication split into wait and transfer by collectives matched within
    ``runs`` (``sql/split_activity.sql``), and the stragglers (``sql/stragglers.sql``; docs/explanation/across-ranks.md).
    One statement, ``sql/window_metrics.sql``."""
    with crossrank.matched(con, runs) if cross_rank else nullcontext(None) as table:
        rows = query.run(con, "window_metrics", query_params(selection, runs), bind=_bind(whole_trace, idle_parts, table))
        return _asked(to_polars(rows), idle_parts, cross_rank)


_IDLE_NS = ("idle_sync_ns", "idle_host_bound_ns", "idle_other_ns", "idle_unknown_ns")
_SPLIT_NS = ("comm_wait_ns", "comm_transfer_ns", "exposed_comm_wait_ns", "exposed_comm_transfer_ns")
_STRAGGLER_COLUMNS = ("matched_count", "arrived_last_count", "wait_caused_ns", "wait_ns")


def _bind(whole_trace: bool, idle_parts: bool, instances: str | None) -> dict[str, str]:
    """The inputs of ``sql/window_metrics.sql`` for a report: the windows it measures, the idle split where
    asked, and the split across ranks over the matched collectives in the table ``instances`` (None: none)."""
    return {
        "windows": "trace_windows" if whole_trace else "selected_windows",
        **({} if idle_parts else {"idle_breakdown": "no_idle_breakdown"}),
        **({"device_activity": "split_activity", "comm_instances": instances} if instances else {"stragglers": "no_stragglers"}),
    }


def _asked(frame: pl.DataFrame, idle_parts: bool, cross_rank: bool) -> pl.DataFrame:
    """``frame`` without the columns of the parts a report did not ask for (null or 0 there: nothing measured
    them; without matching, nothing is known to be waiting)."""
    return frame.drop(*(() if idle_parts else _IDLE_NS), *(() if cross_rank else (*_SPLIT_NS, *_STRAGGLER_COLUMNS)))


def step_metrics(
    con: duckdb.DuckDBPyConnection,
    *,
    whole_trace: bool = False,
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
    idle_parts: bool = False,
    cross_rank: bool = False,
) -> pl.DataFrame:
    """One row per (run, rank, device, step) of the selected steps with every metric, or with
    ``whole_trace`` one per (run, rank, device) over the whole timeline and every kernel (step -1).

    A selected step without device activity (a step that launched nothing) still gets a row: its
    interval metrics are null (device null) and its throughput metrics are filled. Throughput and
    power metrics are null over the whole trace. Every row carries the run's metadata columns
    (:data:`~traceq.catalog.META_COLUMNS`).

    The rows are one statement (``sql/step_metrics.sql``, or ``sql/trace_metrics.sql`` over the whole
    trace) and leave DuckDB once; here they only get the units of the metric names.
    """
    require_side_tables(con)
    name = "trace_metrics" if whole_trace else "step_metrics"
    with crossrank.matched(con, runs) if cross_rank else nullcontext(None) as table:
        rows = query.run(con, name, query_params(selection, runs), bind=_bind(whole_trace, idle_parts, table))
        # run now (materialized; to_polars waits for polars): polars may still be importing meanwhile (metric_report)
        frame = _asked(to_polars(rows.materialize()), idle_parts, cross_rank)
    import polars as pl

    return frame.with_columns(
        *[(pl.col(ns) / 1000).round(3).alias(us) for us, ns in NS_COLUMN_OF.items() if ns in frame.columns],
        (pl.col("step_time_ns") / 1e6).round(6).alias("step_time_ms"),
        *([(pl.col("arrived_last_count") / pl.when(pl.col("matched_count") > 0).then(pl.col("matched_count")))
           .alias("arrived_last_share")] if cross_rank else []),
    ).sort("run", "rank", "device", "step")


def breakdown_metrics(
    con: duckdb.DuckDBPyConnection,
    metric: str,
    *,
    whole_trace: bool = False,
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
) -> pl.DataFrame:
    """Rows of ``exposed_comm_by_collective_us`` (key column collective_type) or
    ``exposed_comm_by_pg_us`` (key column process_group): one per (run, rank, device, step, key),
    with comm_us of that key, step_time_ms and the run's metadata columns. One statement
    (``sql/breakdown_metrics.sql``) over the runs of ``runs`` alone."""
    dimension, key = BREAKDOWNS[metric]
    bind = {"windows": "trace_windows" if whole_trace else "selected_windows"}
    rows = query.run(con, "breakdown_metrics", {**query_params(selection, runs), "dimension": dimension}, bind=bind)
    frame = to_polars(rows.materialize()).rename({"key": key})  # materialized: as in step_metrics
    import polars as pl

    return frame.with_columns(
        (pl.col("exposed_comm_ns") / 1000).round(3).alias(metric),
        (pl.col("comm_ns") / 1000).round(3).alias("comm_us"),
        (pl.col("step_time_ns") / 1e6).round(6).alias("step_time_ms"),
    ).sort("run", "rank", "device", "step", key)


def compute_metric(
    db: Warehouse = DEFAULT_DB,
    metric: str | Sequence[str] = "exposed_comm_us",
    *,
    by: str | Sequence[str] = ("run", "rank"),
    whole_trace: bool = False,
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
) -> pl.DataFrame:
    """One metric aggregated to the grain ``by``.

    Args:
        db: warehouse path (a DuckDB file or a Parquet directory) or an open connection.
        metric: a name from :data:`~traceq.catalog.METRICS` (``exposed_comm`` works for ``exposed_comm_us``),
            or several (a list or a comma-separated string): their columns side by side.
        by: column names, as a sequence or a comma-separated string, from
            :data:`~traceq.catalog.GROUP_COLUMNS` (run, rank, device, step and run metadata columns
            such as world_size, tp, gpu_model). Steps are aggregated when ``step`` is not in ``by``
            (mean, median, p10, p90 over steps); ranks when ``rank`` is not (the mean over the run's
            rank-steps, min and max of the per-rank means, and the slowest rank by step time); runs
            when ``run`` is not either (mean, min, max of the run means, and the slowest run). A rate
            is a ratio of sums at every grain (:func:`aggregate`).
        whole_trace: the whole timeline and every kernel instead of the selected steps' windows.
        selection: which steps (warm-up skip, range, incomplete last step).
        runs: only these runs.

    Returns a polars DataFrame; the column named after the metric holds the (mean) value. The
    breakdown metrics add their key column (collective_type or process_group) to ``by``. Raises
    :class:`~traceq.errors.EmptySelection` when the selection leaves nothing.
    """
    return metric_report(db, metric, by=by, whole_trace=whole_trace, selection=selection, runs=runs).table


def metric_report(
    db: Warehouse = DEFAULT_DB,
    metric: str | Sequence[str] = "exposed_comm_us",
    *,
    by: str | Sequence[str] = ("run", "rank"),
    whole_trace: bool = False,
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
    cross_rank: bool = False,
) -> Report:
    """:func:`compute_metric` as a :class:`~traceq.report.result.Report`: the table, the notes a reader
    needs beside it (steps used, FLOPs convention and peak, power availability, breakdown overlap,
    windows), and as ``rows`` the step rows behind the table (one per step, or per step and key for a
    breakdown metric; every metric), for a caller that shows them again (the HTML report), so that every
    metric is computed once. Arguments as :func:`compute_metric`; ``cross_rank``: the rows carry the
    cross-rank figures (docs/explanation/across-ranks.md) even where no metric asks for them."""
    names = metric_names(metric)
    grain = columns(by, GROUP_COLUMNS)
    for name in names:
        if whole_trace and name in PER_STEP_METRICS:
            raise ConfigError("measured per step (over the step's time): it has no whole-trace value",
                              param="metric", value=name)
    breakdowns = [n for n in names if n in BREAKDOWNS]
    if breakdowns and len(names) > 1:
        raise ConfigError("a breakdown (one row per collective type or process group) is reported alone",
                          param="metric", value=",".join(names))
    title = f"{','.join(names)} by {','.join(grain)} ({'whole trace, every kernel' if whole_trace else selection.describe()})"
    if breakdowns:
        grain = [*grain, BREAKDOWNS[names[0]][1]]
    # polars (0.09 s to import) loads while DuckDB opens the warehouse and runs the interval query
    cross_rank = cross_rank or bool(set(names) & set(CROSS_RANK))
    with import_in_background("polars"), opened(db) as con, \
            crossrank.matched(con, runs) if cross_rank and not breakdowns else nullcontext():  # matched once
        require_runs(con, runs)
        if breakdowns:
            rows = breakdown_metrics(con, names[0], whole_trace=whole_trace, selection=selection, runs=runs)
        else:
            rows = step_metrics(con, whole_trace=whole_trace, selection=selection, runs=runs,
                                idle_parts=bool(set(names) & set(IDLE_PARTS)), cross_rank=cross_rank)
        if rows.height == 0:
            if breakdowns and (whole_trace or steps_selected(con, selection, runs)):
                raise EmptySelection(f"no communication kernel in the {'traces' if whole_trace else 'selected steps'}"
                                     f" of {_which_runs(runs)}: {names[0]} has nothing to split")
            raise EmptySelection(nothing_selected(con, selection, runs))
        notes: list[str] = []
        for name in names:
            notes += [n for n in metric_notes(con, rows, name, whole_trace) if n not in notes]
        if set(names) & set(CROSS_RANK):
            notes.extend(crossrank.matching_notes(con, runs))
        if not whole_trace:
            notes.extend(selection_notes(con, selection, runs))
            notes.extend(step_window_notes(con, rows, selection))
    return Report(side_by_side(rows, names, grain), notes, title, rows)


def metric_names(metric: str | Sequence[str]) -> list[str]:
    """The metrics of ``metric`` (one name, a list, or a comma-separated string), resolved and without
    repeats; ConfigError when it names none."""
    given = metric.split(",") if isinstance(metric, str) else list(metric)
    names = list(dict.fromkeys(resolve_metric(m.strip()) for m in given if m.strip()))
    if not names:
        raise ConfigError("give a metric name (traceq metrics lists them)", param="metric", value=metric)
    return names


def side_by_side(rows: pl.DataFrame, names: Sequence[str], grain: Sequence[str]) -> pl.DataFrame:
    """``rows`` aggregated to ``grain`` (:func:`aggregate`) for each metric of ``names``, their columns
    side by side."""
    if "step" in grain:  # the step rows themselves, nothing aggregated: their metric columns side by side
        keep = list(dict.fromkeys([*grain, *names, "step_time_ms"]))
        return rows.select(keep).sort(list(dict.fromkeys(grain)), maintain_order=True)
    table = aggregate(rows, names[0], grain)
    for name in names[1:]:
        more = aggregate(rows, name, grain)
        # per-rank rows keep their run even where the grain has none: a rank number is no key alone
        keys = [c for c in dict.fromkeys(("run", "rank", *grain)) if c in table.columns and c in more.columns]
        own = [c for c in more.columns if c.startswith(name) and c not in table.columns]
        table = table.join(more.select(*keys, *own), on=keys, how="left", nulls_equal=True)
    return table


def selected_step_rows(
    con: duckdb.DuckDBPyConnection, selection: StepSelection, runs: Sequence[str] | None, *, idle_parts: bool = False,
) -> pl.DataFrame:
    """:func:`step_metrics` of the selected steps of ``runs``; EmptySelection (saying what exists) when
    no run of that name is in the warehouse or the selection leaves nothing."""
    require_runs(con, runs)
    rows = step_metrics(con, selection=selection, runs=runs, idle_parts=idle_parts)
    if rows.height == 0:
        raise EmptySelection(nothing_selected(con, selection, runs))
    return rows


def require_runs(con: duckdb.DuckDBPyConnection, runs: Sequence[str] | None) -> None:
    """EmptySelection when the warehouse holds no trace, or no run of ``runs``; it names those it holds."""
    held = [r for (r,) in con.execute("select distinct run from traces order by run").fetchall()]
    if not held:
        raise EmptySelection("the warehouse holds no trace yet; ingest some first (traceq ingest TRACES)")
    missing = [r for r in runs or () if r not in held]
    if missing:
        raise EmptySelection(
            f"no run {', '.join(map(repr, missing))} in the warehouse; it holds {_listing(held)}"
        )


def steps_selected(con: duckdb.DuckDBPyConnection, selection: StepSelection, runs: Sequence[str] | None) -> bool:
    """Whether ``selection`` leaves a step window of ``runs`` (None: every run)."""
    return bool(query.run(con, "selected_windows", query_params(selection, runs)).limit(1).fetchall())


def nothing_selected(con: duckdb.DuckDBPyConnection, selection: StepSelection, runs: Sequence[str] | None) -> str:
    """What to say when ``selection`` leaves no step: the selection, and the steps each run has."""
    rows = con.execute(
        """
        select t.run, min(s.step) filter (where s.source = 'marker'), max(s.step) filter (where s.source = 'marker'),
               max(n) as per_rank, bool_or(s.source = 'whole_trace')
        from steps as s
        inner join traces as t using (trace_id)
        inner join (select trace_id, rank, count(*) as n from steps group by all) using (trace_id, rank)
        where $runs is null or list_contains($runs, t.run)
        group by t.run order by t.run
        """,
        {"runs": list(runs) if runs else None},
    ).fetchall()
    held = []
    for run, lo, hi, per_rank, whole in rows:
        parts = [f"steps {lo}..{hi} ({per_rank} per rank)"] if lo is not None else []
        if whole:
            parts.append("ranks without steps (one window over the whole trace)")
        held.append(f"run {run}: {', '.join(parts)}")
    return f"no step is selected ({selection.describe()}); {_listing(held, 8)}"


def _which_runs(runs: Sequence[str] | None) -> str:
    return "any run" if not runs else f"run {runs[0]}" if len(runs) == 1 else f"runs {_listing(runs)}"


def _listing(items: Sequence[str], most: int = 20) -> str:
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")
