"""The study's per-GPU picture on one screen (``traceq summary``): step time, then where the device
window went (compute, overlapped comm, exposed comm, exposed memcpy, idle) as ms and as a share of the
window, then tokens/s, MFU and power where known."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from traceq.catalog import GROUP_COLUMNS, WHOLE_TRACE_STEP, columns
from traceq.report.aggregation import mean_of
from traceq.report.metrics import selected_step_rows, side_by_side
from traceq.report.notes import metric_notes, selection_notes, step_window_notes
from traceq.report.result import Report
from traceq.report.selection import StepSelection
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import polars as pl

# The parts of a device window: compute + exposed comm + exposed memcpy + idle = window, and
# overlapped comm is the part of the compute time that communication ran beside.
PARTS = ("compute", "overlapped_comm", "exposed_comm", "exposed_memcpy", "idle")
KNOWN_WHERE_GIVEN = ("tokens_per_s", "mfu", "power_w")


def summary(
    db: Warehouse = DEFAULT_DB,
    *,
    by: str | Sequence[str] = ("run", "rank"),
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
) -> Report:
    """One row per group of ``by`` (default run and rank; with ``step``, per step) over the selected
    steps, with the notes a reader needs beside it and the step rows behind it.

    Every figure of a row comes from the aggregation ``report`` makes at that grain
    (:func:`traceq.report.aggregation.aggregate`, docs/explanation/metrics.md): a rank's row pools its steps, a run's row its
    rank-steps, a group's row its runs; a rank's row keeps its run, as in ``report``.

    Columns: ``steps`` (device-steps pooled), ``step_range`` (the steps used: 'a..b', or 'whole trace'),
    ``step_time_ms`` (mean), for each part of the window
    ``<part>_ms`` (mean per step) and ``<part>_pct`` (its share of the row's device window: the part over
    the window, so that compute, exposed comm, exposed memcpy and idle add up to 100), then
    ``tokens_per_s``, ``mfu`` and ``power_w`` (ratios of sums, as every report aggregates them; empty
    where unknown).
    """
    import polars as pl

    grain = columns(by, GROUP_COLUMNS)
    with opened(db) as con:
        rows = selected_step_rows(con, selection, runs)
        notes = selection_notes(con, selection, runs) + step_window_notes(con, rows, selection)  # steps: a column
        for name in ("mfu", "power_w"):  # their full notes where they have values, else one line for all
            if rows[name].is_not_null().any():
                notes += [n for n in metric_notes(con, rows, name) if n not in notes and not n.startswith("steps used")]
        if rows["mfu"].is_null().all() or rows["power_w"].is_null().all():
            notes.append("tokens_per_s, mfu and power_w are empty where a run lacks tokens_per_step, its model FLOPs "
                         "or GPU peak, or a power log; `traceq report --metric mfu` (or power_w) says what is missing")
    table = _values(rows, ["step_time_ms", *(f"{part}_us" for part in PARTS), "window_us", *KNOWN_WHERE_GIVEN], grain)
    keys = [*(["run"] if "run" in table.columns and "run" not in grain else []), *grain]  # a rank keeps its run
    numbered = pl.col("step").filter(pl.col("step") != WHOLE_TRACE_STEP)
    steps = rows.group_by(keys).agg(
        pl.col("window_us").is_not_null().sum().alias("steps"),  # the device-steps pooled
        # the steps used, as a range ('whole trace' for a rank without step markers)
        pl.when(numbered.count() > 0).then(pl.format("{}..{}", numbered.min(), numbered.max()))
        .otherwise(pl.lit("whole trace")).alias("step_range"))
    table = table.join(steps, on=keys, how="left", nulls_equal=True).select(
        *keys, "steps", "step_range", "step_time_ms",
        *[expr for part in PARTS for expr in (
            (pl.col(f"{part}_us") / 1000).alias(f"{part}_ms"),
            # a share of the row's own window: the part over the window, both aggregated alike
            (pl.col(f"{part}_us") / pl.col("window_us") * 100).alias(f"{part}_pct"),
        )],
        *KNOWN_WHERE_GIVEN,
    )
    title = f"summary by {','.join(grain)} ({selection.describe()}); ms per step, % of the device window"
    # on a narrow terminal: step time and the shares of compute, exposed comm and idle stay longest
    narrow = (*(f"{p}_ms" for p in PARTS), "overlapped_comm_pct", "exposed_memcpy_pct", "step_range", "steps")
    return Report(table.sort(keys, nulls_last=True), notes, title, rows, narrow)


def _values(rows: pl.DataFrame, names: Sequence[str], grain: Sequence[str]) -> pl.DataFrame:
    """Each metric of ``names`` aggregated to ``grain`` as ``report`` aggregates it
    (:func:`traceq.report.metrics.side_by_side`; a rank's row keeps its run), or with ``step`` in the grain,
    the rank-steps that share a key pooled by the same formula (:func:`traceq.report.aggregation.mean_of`)."""
    if "step" in grain:
        return rows.group_by(grain).agg(mean_of(name).alias(name) for name in names)
    table = side_by_side(rows, names, grain)
    return table.select(*[c for c in table.columns if c in ("run", "rank", *grain)], *names)


def write_summary_html(report: Report, path: str | Path, by: str | Sequence[str]) -> Path:
    """The summary as one self-contained HTML page: each row's shares of the device window as stacked
    bars, then the table and its notes."""
    from traceq.report import plots
    from traceq.report.html import page_figure, page_section, write_page
    from traceq.report.result import html_notes

    grain = columns(by, GROUP_COLUMNS)
    table = report.table
    runs = sorted(table["run"].unique().to_list()) if "run" in table.columns else []
    sections = [
        page_section("Where the device window goes", page_figure(plots.summary_figure(table, grain), "summary")
                 + html_notes(["compute here is compute without communication beside it; compute + exposed comm + "
                           "exposed memcpy + idle = 100 % of the device window, overlapped comm is part of compute"])),
        page_section("Per " + ", ".join(grain), report.html()),
    ]
    meta = f"by {', '.join(grain)}" + (f" · {len(runs)} run(s): {', '.join(runs)}" if runs else "")
    return write_page(path, "traceq summary", "traceq summary", meta, sections)
