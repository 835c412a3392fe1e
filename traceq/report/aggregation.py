"""The aggregation of step rows (docs/explanation/metrics.md): a rank's row over its steps (mean, median, p10,
p90), a run's over its rank-steps (with min, max and the slowest rank of its ranks' rows), a group's over
its runs (grouped by metadata columns); and the one formula by which every report pools a metric over
rows (:func:`mean_of`: a ratio or rate as a ratio of sums)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from traceq.catalog import RATE_NUMERATORS, RATE_WEIGHTS, WHOLE_TRACE_STEP

if TYPE_CHECKING:  # imported where used: a report imports it while DuckDB runs the first query
    import polars as pl


def mean_of(metric: str, value: str | None = None, weight: str | None = None) -> pl.Expr:
    """The one formula by which ``metric`` aggregates over step rows (docs/explanation/metrics.md): a ratio or rate
    (:data:`~traceq.catalog.RATE_WEIGHTS`) as a ratio of sums, Σ numerator / Σ denominator over the rows
    where both are known (null where the denominators sum to 0); any other metric as the plain mean.
    ``value``/``weight``: other column names holding the value and its denominator."""
    import polars as pl

    if metric not in RATE_WEIGHTS:
        return pl.col(value or metric).mean()
    return ratio_of_sums(*rate_parts(metric, value, weight))


def ratio_of_sums(num: pl.Expr, den: pl.Expr) -> pl.Expr:
    """Σ num / Σ den, null where the denominators sum to 0 (or to nothing)."""
    import polars as pl

    return pl.when(den.sum() > 0).then(num.sum() / den.sum())


def rate_parts(metric: str, value: str | None = None, weight: str | None = None) -> tuple[pl.Expr, pl.Expr]:
    """A rate's numerator and denominator per row, null where either is unknown."""
    import polars as pl

    w = pl.col(weight or RATE_WEIGHTS[metric]).cast(pl.Float64)
    if value is None and metric in RATE_NUMERATORS:
        n = pl.col(RATE_NUMERATORS[metric]).cast(pl.Float64)
    else:
        n = pl.col(value or metric) * w
    known = n.is_not_null() & w.is_not_null()
    return pl.when(known).then(n), pl.when(known).then(w)


def _per_step_parts(metric: str) -> list[pl.Expr]:
    """A rate's Σ numerator and Σ denominator over a run's rank-steps, each divided by the rank-steps its
    denominator is measured over (as _num, _den): the run's mean numerator and denominator per rank-step,
    which a group of runs averages like any other figure of its runs."""
    import polars as pl

    num, den = rate_parts(metric)
    measured = pl.col(RATE_WEIGHTS[metric]).count()
    return [pl.when(measured > 0).then(num.sum() / measured).alias("_num"),
            pl.when(measured > 0).then(den.sum() / measured).alias("_den")]


def aggregate(rows: pl.DataFrame, metric: str, by: Sequence[str]) -> pl.DataFrame:
    """Aggregate step rows of :func:`step_metrics` for ``metric`` to the grain ``by`` (docs/explanation/metrics.md).

    Every figure of a row comes from one aggregation, by :func:`mean_of`: a rank's row pools its steps,
    a run's row pools its rank-steps (a rank cut short weighs by the steps it has; the min, max and
    slowest rank describe its ranks' rows), a group's row (``by`` columns other than run and rank) its
    runs: the mean of their values, a rate the ratio of the means of their numerators and denominators.
    So on every row a rate × its denominator = its numerator. The spread (median, p10, p90) is per step.
    """
    import polars as pl

    by = list(dict.fromkeys(by))
    if "step" in by:
        keep = [*by, metric] + (["step_time_ms"] if metric != "step_time_ms" else [])
        return rows.select(keep).sort(by, maintain_order=True)
    value = pl.col(metric)
    rate = metric in RATE_WEIGHTS
    others = [c for c in by if c not in ("run", "rank")]
    per_rank = rows.group_by(["run", "rank", *others]).agg(
        pl.len().alias("steps"),
        mean_of(metric).alias(metric),
        value.median().alias(f"{metric}_median"),
        value.quantile(0.1, "linear").alias(f"{metric}_p10"),
        value.quantile(0.9, "linear").alias(f"{metric}_p90"),
        pl.col("step_time_ms").mean().alias("step_time_ms_mean"),
        # the slowest rank is named from step times: a step-less rank's whole-trace span is none (docs/explanation/metrics.md)
        pl.col("step_time_ms").filter(pl.col("step") != WHOLE_TRACE_STEP).mean().alias("_step_ms"),
    )
    if "rank" in by:  # runs apart within a rank: group_by's order is not the same every time
        return per_rank.drop("_step_ms").sort(list(dict.fromkeys([*by, "run"])))
    # a run's value pools its rank-steps, by the formula a rank's row uses over its steps
    pooled = rows.group_by(["run", *others]).agg(mean_of(metric).alias(metric),
                                                  *(_per_step_parts(metric) if rate else []))
    per_run = (
        # ties go to the lowest rank, so the answer does not change between runs
        per_rank.sort(["_step_ms", "rank"], descending=[True, False], nulls_last=True)
        .group_by(["run", *others], maintain_order=True)
        .agg(
            pl.len().alias("ranks"),
            pl.col(metric).min().alias(f"{metric}_min"),
            pl.col(metric).max().alias(f"{metric}_max"),
            pl.col("rank").filter(pl.col("_step_ms").is_not_null()).first().alias("slowest_rank"),
            pl.col("_step_ms").first().alias("slowest_step_time_ms"),
        )
        .join(pooled, on=["run", *others], how="left", nulls_equal=True, maintain_order="left")
        .select("run", *others, "ranks", metric, pl.exclude("run", *others, "ranks", metric))
    )
    if "run" in by or not others:
        per_run = per_run.drop("_num", "_den", strict=False)
        return per_run.select([c for c in by if c in per_run.columns] + [c for c in per_run.columns if c not in by]).sort(
            [c for c in by if c in per_run.columns] or ["run"]
        )
    # a group's row averages its runs; a rate there is the ratio of its runs' mean numerators and denominators
    mean = ratio_of_sums(pl.col("_num"), pl.col("_den")) if rate else pl.col(metric).mean()
    return (
        per_run.sort(["slowest_step_time_ms", "run"], descending=[True, False], nulls_last=True)
        .group_by(others, maintain_order=True)
        .agg(
            pl.len().alias("runs"),
            pl.col("ranks").sum().alias("ranks"),
            mean.alias(metric),
            pl.col(metric).min().alias(f"{metric}_min"),
            pl.col(metric).max().alias(f"{metric}_max"),
            pl.col("run").first().alias("slowest_run"),
            pl.col("slowest_rank").first().alias("slowest_rank"),
            pl.col("slowest_step_time_ms").first().alias("slowest_step_time_ms"),
        )
        .drop("_num", "_den", strict=False)
        .sort(others, nulls_last=True)
    )
