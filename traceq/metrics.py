"""Metrics per (run, rank, step) from the warehouse, and their aggregation across steps and ranks.

The interval figures come from ``sql/gpu_breakdown.sql`` (integer ns); this module selects steps,
converts to the units in the metric names and aggregates: steps first (mean, median, p10, p90),
then ranks (mean, min, max and the slowest rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from traceq.errors import ConfigError
from traceq.warehouse import DEFAULT_DB, connect, sql_text


@dataclass(frozen=True)
class Metric:
    """One metric: its name (as in the CLI, SQL and README), unit and definition."""

    name: str
    unit: str
    definition: str


METRICS: tuple[Metric, ...] = (
    Metric("comm_kernel_us", "us", "sum of communication kernel durations (the study's communication load)"),
    Metric("compute_kernel_us", "us", "sum of compute kernel durations (the study's computational load)"),
    Metric("comm_us", "us", "|U(comm)|: time at least one communication kernel runs, streams merged"),
    Metric("compute_us", "us", "|U(compute)|: time at least one compute kernel runs, streams merged"),
    Metric("overlapped_comm_us", "us", "|U(comm) ∩ U(compute)|: communication hidden behind compute"),
    Metric("exposed_comm_us", "us", "|U(comm) − U(compute)|: communication with no compute beside it"),
    Metric("exposed_memcpy_us", "us", "|U(memcpy ∪ memset) − U(compute) − U(comm)|"),
    Metric("idle_us", "us", "device window − |U(all GPU activity)|; window = first kernel start to last kernel end"),
    Metric("window_us", "us", "device window of the step: first GPU activity start to last end"),
    Metric("overlap_ratio", "ratio", "overlapped_comm_us / comm_us (HTA's comp_comm_overlap_pctg / 100)"),
    Metric("step_time_ms", "ms", "duration of the ProfilerStep#N CPU span (the clock for throughput)"),
)
METRIC_NAMES = tuple(m.name for m in METRICS)
# `--metric exposed_comm` and `--metric exposed_comm_us` both work.
_ALIASES = {m.name.removesuffix("_us").removesuffix("_ms"): m.name for m in METRICS}
GROUP_COLUMNS = ("run", "rank", "device", "step")
_NS_COLUMNS = {
    "comm_kernel_us": "comm_kernel_ns",
    "compute_kernel_us": "compute_kernel_ns",
    "comm_us": "comm_ns",
    "compute_us": "compute_ns",
    "overlapped_comm_us": "overlapped_comm_ns",
    "exposed_comm_us": "exposed_comm_ns",
    "exposed_memcpy_us": "exposed_memcpy_ns",
    "idle_us": "idle_ns",
    "window_us": "window_ns",
}


@dataclass(frozen=True)
class StepSelection:
    """Which steps a report uses (DESIGN §3).

    Args:
        skip_steps: leading profiled steps to skip; None = the run's ``warmup_steps`` metadata, else 0.
        step_min, step_max: keep ProfilerStep numbers in [step_min, step_max] (None = unbounded).
        drop_incomplete: drop a last step that the end of the trace cut.
        drop_last: drop the last step always (what HTA does).
    """

    skip_steps: int | None = None
    step_min: int | None = None
    step_max: int | None = None
    drop_incomplete: bool = True
    drop_last: bool = False

    @classmethod
    def parse(cls, steps: str | None = None, skip_steps: int | None = None, drop_last: bool = False) -> StepSelection:
        """From CLI text: ``steps`` as "a:b" (inclusive ProfilerStep numbers; either side may be empty)."""
        lo = hi = None
        if steps:
            left, sep, right = steps.partition(":")
            try:
                lo = int(left) if left.strip() else None
                hi = int(right) if right.strip() else None
                if not sep:
                    hi = lo
            except ValueError:
                raise ConfigError(f"--steps {steps!r}: expected a:b with ProfilerStep numbers, e.g. 11:60") from None
            if lo is not None and hi is not None and hi < lo:
                raise ConfigError(f"--steps {steps!r}: the end is before the start")
        if skip_steps is not None and skip_steps < 0:
            raise ConfigError(f"--skip-steps {skip_steps}: must be 0 or more")
        return cls(skip_steps=skip_steps, step_min=lo, step_max=hi, drop_last=drop_last)


def list_metrics() -> pl.DataFrame:
    """Every metric with its unit and one-line definition."""
    return pl.DataFrame([m.__dict__ for m in METRICS])


def resolve_metric(name: str) -> str:
    """Canonical metric name for ``name`` (accepts the name without its unit suffix)."""
    if name in METRIC_NAMES:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    raise ConfigError(f"unknown metric {name!r}; `traceq metrics` lists them: {', '.join(METRIC_NAMES)}")


def step_metrics(
    con: duckdb.DuckDBPyConnection,
    *,
    window: str = "steps",
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
) -> pl.DataFrame:
    """One row per (run, rank, device, step) with every interval metric (``--window steps``), or per
    (run, rank, device) over the whole trace and every kernel (``--window trace``, step = -1)."""
    if window not in ("steps", "trace"):
        raise ConfigError(f"--window {window!r}: use steps or trace")
    whole = window == "trace"
    con.execute(
        sql_text("selected_steps.sql"),
        {
            "skip_steps": selection.skip_steps,
            "step_min": selection.step_min,
            "step_max": selection.step_max,
            "drop_incomplete": selection.drop_incomplete,
            "drop_last": selection.drop_last,
        },
    )
    frame = con.sql(sql_text("gpu_breakdown.sql"), params={"whole_trace": whole}).pl()
    traces = con.sql("select trace_id, run from traces").pl()
    frame = frame.join(traces, on="trace_id", how="left")
    if runs:
        frame = frame.filter(pl.col("run").is_in(list(runs)))
    return frame.with_columns(
        *[(pl.col(ns) / 1000).round(3).alias(us) for us, ns in _NS_COLUMNS.items()],
        (pl.col("step_time_ns") / 1e6).alias("step_time_ms"),
    ).sort("run", "rank", "device", "step")


def compute_metric(
    db: str | Path | duckdb.DuckDBPyConnection = DEFAULT_DB,
    metric: str = "exposed_comm_us",
    *,
    by: Sequence[str] = ("run", "rank"),
    window: str = "steps",
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
) -> pl.DataFrame:
    """One metric aggregated to the grain ``by``.

    Args:
        db: warehouse path or an open connection.
        metric: a name from :data:`METRICS` (``exposed_comm`` works for ``exposed_comm_us``).
        by: subset of run, rank, device, step. Steps are aggregated when ``step`` is not in
            ``by`` (mean, median, p10, p90 over steps); ranks when ``rank`` is not (mean, min,
            max of the per-rank means, and the slowest rank by step time).
        window: "steps" (selected steps; kernels attributed by DESIGN §3) or "trace" (every kernel).
        selection: which steps (warm-up skip, range, incomplete last step).
        runs: only these runs.

    Returns a polars DataFrame; the column named after the metric holds the (mean) value.
    """
    name = resolve_metric(metric)
    bad = [c for c in by if c not in GROUP_COLUMNS]
    if bad:
        raise ConfigError(f"--by {','.join(by)}: unknown column(s) {bad}; use any of {', '.join(GROUP_COLUMNS)}")
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else connect(db, read_only=True)
    try:
        rows = step_metrics(con, window=window, selection=selection, runs=runs)
    finally:
        if con is not db:
            con.close()
    return aggregate(rows, name, by)


def aggregate(rows: pl.DataFrame, metric: str, by: Sequence[str]) -> pl.DataFrame:
    """Aggregate step rows of :func:`step_metrics` for ``metric`` to the grain ``by``."""
    by = list(dict.fromkeys(by))
    if "step" in by:
        keep = [*by, metric] + (["step_time_ms"] if metric != "step_time_ms" else [])
        return rows.select(keep).sort(by)
    value = pl.col(metric)
    per_rank = rows.group_by(["run", "rank", *(["device"] if "device" in by else [])]).agg(
        pl.len().alias("steps"),
        value.mean().alias(metric),
        value.median().alias(f"{metric}_median"),
        value.quantile(0.1, "linear").alias(f"{metric}_p10"),
        value.quantile(0.9, "linear").alias(f"{metric}_p90"),
        pl.col("step_time_ms").mean().alias("step_time_ms_mean"),
    )
    if "rank" in by:
        return per_rank.sort(by)
    group = [c for c in by if c != "rank"] or ["run"]
    return (
        per_rank.sort("step_time_ms_mean", descending=True, nulls_last=True)
        .group_by(group, maintain_order=True)
        .agg(
            pl.len().alias("ranks"),
            pl.col(metric).mean().alias(metric),
            pl.col(metric).min().alias(f"{metric}_min"),
            pl.col(metric).max().alias(f"{metric}_max"),
            pl.col("rank").first().alias("slowest_rank"),
            pl.col("step_time_ms_mean").first().alias("slowest_step_time_ms"),
        )
        .sort(group)
    )
