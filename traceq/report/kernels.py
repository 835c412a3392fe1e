"""Which kernels the time goes to (``traceq kernels``): the top kernels and categories by device
time over the selected steps (or per step), with their share, count and mean duration, and the
kernels no rule classifies, so that rules can be added for them (``traceq rules --add``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from traceq import query
from traceq.catalog import columns
from traceq.errors import ConfigError, EmptySelection
from traceq.report.metrics import nothing_selected, require_runs
from traceq.report.notes import selection_notes
from traceq.report.result import Report
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import polars as pl

GRAINS = ("run", "rank", "step")
LEVELS = ("kernel", "category")
UNCLASSIFIED = "other"  # the category of a compute kernel that no rule matched


MAX_TOP = 10_000_000  # more rows than any trace has kernel names; beyond a 64-bit LIMIT


def kernel_report(
    db: Warehouse = DEFAULT_DB,
    *,
    by: str | Sequence[str] = ("run",),
    level: str = "kernel",
    top: int | None = 20,
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
    unclassified: bool = False,
) -> Report:
    """The kernels (``level="kernel"``) or categories (``"category"``) with the most device time, per
    group of ``by`` (run, rank, step), ``top`` of each group (None: all).

    Columns: the ``by`` columns, ``class``, ``category`` (and ``name`` for kernels), ``count``,
    ``total_ms``, ``share_pct`` (of the group's kernel time: durations summed, so kernels running
    side by side count twice), ``mean_us``, ``min_us``, ``max_us``. ``unclassified``: only the kernels no
    rule matched (category 'other').
    """
    import polars as pl

    grain = columns(by, GRAINS)
    if level not in LEVELS:
        raise ConfigError(f"one of {', '.join(LEVELS)}", param="level", value=level)
    if top is not None and top < 1:
        raise ConfigError("must be 1 or more", param="top", value=top)
    if top is not None and top > MAX_TOP:
        raise ConfigError(f"must be at most {MAX_TOP:,} (rows per group)", param="top", value=top)
    with opened(db) as con:
        require_runs(con, runs)
        rows = to_polars(query.run(con, "kernel_times", query_params(selection, runs))
                         .join(con.table("traces").select("trace_id, run"), "trace_id"))
        if rows.height == 0:
            raise EmptySelection(nothing_selected(con, selection, runs))
        notes = selection_notes(con, selection, runs)  # a run the selection leaves out is named, never dropped silently
    keys = ["class", "category", *(["name"] if level == "kernel" else [])]
    table = rows.group_by([*grain, *keys]).agg(
        pl.col("count").sum(), pl.col("total_ns").sum(), pl.col("min_ns").min(), pl.col("max_ns").max(),
    )
    share = pl.col("total_ns") / pl.col("total_ns").sum().over(grain) * 100 if grain else (
        pl.col("total_ns") / pl.col("total_ns").sum() * 100)
    table = table.with_columns(
        (pl.col("total_ns") / 1e6).alias("total_ms"),
        share.alias("share_pct"),
        (pl.col("total_ns") / pl.col("count") / 1e3).alias("mean_us"),
        (pl.col("min_ns") / 1e3).alias("min_us"),
        (pl.col("max_ns") / 1e3).alias("max_us"),
    ).sort([*grain, "total_ns", *keys], descending=[*([False] * len(grain)), True, *([False] * len(keys))])
    if unclassified:  # after the shares: a share is of the group's whole kernel time
        table = table.filter((pl.col("class") == "compute") & (pl.col("category") == UNCLASSIFIED))
    if top is not None:
        table = table.group_by(grain, maintain_order=True).head(top) if grain else table.head(top)
    table = table.select(*grain, *keys, "count", "total_ms", "share_pct", "mean_us", "min_us", "max_us")
    what = ("unclassified " if unclassified else "") + ("categories" if level == "category" else "kernels")
    title = f"{'every' if top is None else f'top {top}'} {what} by device time, by {','.join(grain)} ({selection.describe()})"
    # on a narrow terminal: the name, its total and its share stay longest
    return Report(table, notes, title, narrow=("min_us", "max_us", "mean_us", "class", "count"),
                  names=("name",) if level == "kernel" else ())
