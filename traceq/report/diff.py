"""Two sets of steps compared (``traceq diff A B``): two runs, two step ranges of one run, two ranks.
Every metric, exposed comm per collective type and kernel time per category, with the delta and
whether the delta is larger than the step-to-step spread, so that a user sees at once whether a
change is real."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from traceq import query
from traceq.catalog import BREAKDOWNS, METRIC_NAMES, RATE_WEIGHTS
from traceq.errors import ConfigError, EmptySelection
from traceq.report import crossrank
from traceq.report.aggregation import rate_parts, ratio_of_sums
from traceq.report.metrics import breakdown_metrics, nothing_selected, require_runs, step_metrics
from traceq.report.result import Report
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import duckdb
    import polars as pl

SCALARS = tuple(m for m in METRIC_NAMES if m not in BREAKDOWNS)
# metric: every scalar metric, in its unit; collective: exposed comm (us) per collective type;
# category: kernel time (us) launched per step, per kernel category
SECTIONS = ("metric", "collective", "category")
NOTES = (
    "a, b: means over each side's selected rank-steps (ratios and rates: their sums' ratio); each rank's open last "
    "step left out unless include_last (--include-last); p10/p90: the spread of its steps; beyond_spread: |delta| > "
    "the wider p90 - p10 of the two sides",
    "metric rows are in each metric's unit; collective rows: exposed comm (us) per collective type; "
    "category rows: kernel time (us) launched per step, per kernel category",
)


@dataclass(frozen=True)
class Side:
    """One side of a diff: a run, optionally one rank of it and a step range (``RUN[,rank=N][,steps=a:b]``)."""

    run: str
    rank: int | None = None
    steps: str | None = None

    @classmethod
    def parse(cls, text: str) -> Side:
        run, *options = [part.strip() for part in text.split(",")]
        if not run:
            raise ConfigError(f"side {text!r}: give RUN, RUN,rank=N, RUN,steps=a:b or RUN,rank=N,steps=a:b")
        given: dict[str, str] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in ("rank", "steps") or key in given:
                raise ConfigError(f"side {text!r}: unknown part {option!r}; a side is RUN[,rank=N][,steps=a:b]")
            given[key] = value
        try:
            rank = int(given["rank"]) if "rank" in given else None
        except ValueError:
            raise ConfigError(f"side {text!r}: rank=N takes a number") from None
        return cls(run, rank, given.get("steps"))

    def label(self) -> str:
        return ",".join([self.run, *([f"rank={self.rank}"] if self.rank is not None else []),
                         *([f"steps={self.steps}"] if self.steps else [])])


def diff(
    db: Warehouse = DEFAULT_DB, a: str | Side = "", b: str | Side = "", *, skip_steps: int | None = None,
    include_last: bool = False,
) -> Report:
    """Side ``a`` against side ``b`` (a run, ``RUN,rank=N`` and/or ``RUN,steps=a:b``, or a :class:`Side`), one
    row per quantity: ``section`` (:data:`SECTIONS`), ``name``, ``a``, ``b``
    (means over each side's rank-steps), ``delta`` (b − a), ``delta_pct``, the step-to-step spread of
    each side (``a_p10``, ``a_p90``, ``b_p10``, ``b_p90``) and ``beyond_spread``: |delta| larger than
    the wider of the two p90 − p10 spreads (a change steps alone do not explain). Per collective type:
    exposed comm; per kernel category: kernel time launched per step.
    """
    import polars as pl

    sides = [s if isinstance(s, Side) else Side.parse(s) for s in (a, b)]
    with opened(db) as con:
        for side in sides:
            require_runs(con, [side.run])
        with crossrank.matched(con, sorted({side.run for side in sides})):  # matched once for both sides
            frames = [_side_rows(con, side, skip_steps, include_last) for side in sides]
    parts = [_compare(SECTIONS[0], frames[0][0], frames[1][0])]
    # a collective type or kernel category seen on one side only is 0 on every step of the other
    for index, section, keys in ((1, SECTIONS[1], ["rank", "device", "step"]), (2, SECTIONS[2], ["rank", "step"])):
        names = pl.concat([f[index].select("name") for f in frames]).unique()
        filled = []
        for f in frames:
            steps = f[3].filter(pl.col("device").is_not_null()) if "device" in keys else f[3]
            grid = steps.select(keys).unique().join(names, how="cross")
            filled.append(grid.join(f[index], on=[*keys, "name"], how="left").with_columns(pl.col("value").fill_null(0.0)))
        parts.append(_compare(section, *filled))
    out = pl.concat(parts, how="vertical")
    spread = pl.max_horizontal(pl.col("a_p90") - pl.col("a_p10"), pl.col("b_p90") - pl.col("b_p10"))
    table = out.with_columns(
        (pl.col("b") - pl.col("a")).alias("delta"),
        pl.when(pl.col("a") != 0).then((pl.col("b") - pl.col("a")) / pl.col("a").abs() * 100).alias("delta_pct"),
    ).with_columns(
        (pl.col("delta").abs() > spread).alias("beyond_spread"),
    ).select("section", "name", "a", "b", "delta", "delta_pct", "beyond_spread", "a_p10", "a_p90", "b_p10", "b_p90")
    return Report(table, NOTES, f"A = {sides[0].label()}, B = {sides[1].label()}",
                  narrow=("a_p10", "a_p90", "b_p10", "b_p90", "delta"))


def _side_rows(
    con: duckdb.DuckDBPyConnection, side: Side, skip_steps: int | None, include_last: bool
) -> tuple[pl.DataFrame, ...]:
    """One side's rows in long form (name, value per rank-step): the metrics, the collective types and
    the kernel categories (each where seen), and the side's (rank, device, step) keys."""
    import polars as pl

    require_runs(con, [side.run])
    selection = StepSelection.parse(side.steps, skip_steps, include_last=include_last)
    steps = step_metrics(con, selection=selection, runs=[side.run], idle_parts=True, cross_rank=True)
    if side.rank is not None:
        steps = steps.filter(pl.col("rank") == side.rank)
    if steps.height == 0:
        what = f"rank {side.rank} of " if side.rank is not None else ""
        raise EmptySelection(f"{side.label()}: no steps of {what}run {side.run} selected; "
                             + nothing_selected(con, selection, [side.run]))
    keys = ["rank", "device", "step"]
    metrics = steps.unpivot(index=keys, on=list(SCALARS), variable_name="name", value_name="value")
    # rates carry their numerator and denominator: a side's figure is their ratio of sums (docs/explanation/metrics.md)
    rates = [steps.select(*keys, pl.lit(m).alias("name"), num.alias("num"), den.alias("den"))
             for m in RATE_WEIGHTS if m in SCALARS and RATE_WEIGHTS[m] in steps.columns for num, den in [rate_parts(m)]]
    metrics = metrics.join(pl.concat(rates), on=[*keys, "name"], how="left", nulls_equal=True)
    collectives = breakdown_metrics(con, "exposed_comm_by_collective_us", selection=selection, runs=[side.run])
    if side.rank is not None:
        collectives = collectives.filter(pl.col("rank") == side.rank)
    collectives = collectives.select(*keys, pl.col("collective_type").alias("name"),
                                     pl.col("exposed_comm_by_collective_us").alias("value"))
    kernels = to_polars(query.run(con, "kernel_times", query_params(selection, [side.run])))
    if side.rank is not None:
        kernels = kernels.filter(pl.col("rank") == side.rank)
    categories = kernels.group_by("rank", "step", pl.col("category").alias("name")).agg(
        (pl.col("total_ns").sum() / 1e3).alias("value"))
    return metrics.with_columns(pl.col("value").cast(pl.Float64)), collectives, categories, steps.select(keys)


def _compare(section: str, rows_a: pl.DataFrame, rows_b: pl.DataFrame) -> pl.DataFrame:
    import polars as pl

    def stats(rows: pl.DataFrame, side: str) -> pl.DataFrame:
        mean = pl.col("value").mean()
        if "den" in rows.columns:  # a rate: the ratio of its sums (traceq.report.aggregation.mean_of)
            mean = ratio_of_sums(pl.col("num"), pl.col("den")).otherwise(mean)
        return rows.group_by("name").agg(
            mean.alias(side),
            pl.col("value").quantile(0.1, "linear").alias(f"{side}_p10"),
            pl.col("value").quantile(0.9, "linear").alias(f"{side}_p90"),
        )

    order = {name: i for i, name in enumerate(SCALARS)}
    table = stats(rows_a, "a").join(stats(rows_b, "b"), on="name", how="full", coalesce=True)
    table = table.with_columns(pl.lit(section).alias("section"))
    if section == SECTIONS[0]:
        return table.sort(pl.col("name").replace_strict(order, default=len(order)))
    return table.sort(pl.max_horizontal(pl.col("a").fill_null(0), pl.col("b").fill_null(0)), descending=True)


def write_diff_html(report: Report, path: str | Path, a: str, b: str) -> Path:
    """The diff as one self-contained HTML page: the deltas beyond the spread as bars, then the table."""
    import polars as pl

    from traceq.report import plots
    from traceq.report.html import page_figure, page_section, write_page

    real = report.table.filter(pl.col("beyond_spread") & pl.col("delta_pct").is_not_null())
    sections = []
    if real.height:
        sections.append(page_section("Changes beyond the step-to-step spread", page_figure(plots.diff_figure(real, a, b), "diff")))
    sections.append(page_section("Every quantity", report.html()))
    return write_page(path, f"traceq diff: {a} vs {b}", "traceq diff", f"A = {a} · B = {b}", sections)

