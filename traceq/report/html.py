"""One self-contained HTML report (plotly's JavaScript inline, works offline).

:func:`report_data` gathers the frames from the warehouse, :func:`render_html` turns frames into
the page (figures from :mod:`traceq.report.plots`), :func:`write_html_report` does both.
"""

from __future__ import annotations

import datetime as _dt
import html as _html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from traceq.catalog import BREAKDOWN_NOTE
from traceq.errors import ConfigError, EmptySelection
from traceq.report import crossrank
from traceq.report.aggregation import mean_of
from traceq.report.collectives import MATCHED, collectives_report
from traceq.report.metrics import breakdown_metrics, nothing_selected, require_runs, step_metrics
from traceq.report.notes import (
    FLOPS_CONVENTION,
    NVML_NOTE,
    PEAK_NOTE,
    peak_table_text,
    selection_notes,
    step_window_notes,
    steps_used,
)
from traceq.report.power import power_series, power_status, step_wall_times
from traceq.report.result import html_notes, html_table
from traceq.report.scaling import SCALING_NOTES, per_run, scaling_from_runs
from traceq.report.selection import StepSelection
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

SUMMARY_COLUMNS = ("step_time_ms", "tokens_per_s", "global_tokens_per_s", "tflops", "mfu", "power_w", "energy_j",
                   "tokens_per_j", "compute_us", "exposed_comm_us", "overlap_ratio", "idle_us")


@dataclass
class ReportData:
    """Everything the HTML report shows, as frames."""

    steps: pl.DataFrame
    by_collective: pl.DataFrame
    scaling: pl.DataFrame
    power: pl.DataFrame
    windows: pl.DataFrame
    power_status: pl.DataFrame
    waits: pl.DataFrame
    bandwidth: pl.DataFrame
    cross_rank_notes: list[str] = field(default_factory=list)
    scaling_by: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def report_data(
    db: Warehouse = DEFAULT_DB,
    *,
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
    scaling_by: Sequence[str] = (),
    steps: pl.DataFrame | None = None,
) -> ReportData:
    """Read the frames of the HTML report for the selected steps of ``runs`` (default: all); ``steps``:
    the step rows of :func:`~traceq.report.metrics.step_metrics` for them, where the caller has them."""
    with opened(db) as con, crossrank.matched(con, runs):  # matched once for the page
        if steps is None:
            require_runs(con, runs)
            steps = step_metrics(con, selection=selection, runs=runs, cross_rank=True)
        if steps.height == 0:
            raise EmptySelection(nothing_selected(con, selection, runs))
        window_notes = selection_notes(con, selection, runs) + step_window_notes(con, steps, selection)
        coll = breakdown_metrics(con, "exposed_comm_by_collective_us", selection=selection, runs=runs)
        by_collective = coll.group_by("run", "collective_type").agg(pl.col("exposed_comm_by_collective_us").mean())
        scaling = scaling_from_runs(per_run(steps, scaling_by), scaling_by)
        chosen = steps["run"].unique().to_list()
        waits, bandwidth, cross_notes = _cross_rank(con, selection, chosen, steps)
        data = ReportData(
            steps=steps, by_collective=by_collective, scaling=scaling,
            power=power_series(con, chosen), windows=step_wall_times(con, chosen),
            power_status=power_status(con).filter(pl.col("run").is_in(chosen)), waits=waits, bandwidth=bandwidth,
            cross_rank_notes=cross_notes, scaling_by=list(scaling_by),
        )
    data.notes = [*steps_used(steps), *window_notes]
    return data


def _cross_rank(
    con: duckdb.DuckDBPyConnection, selection: StepSelection, runs: Sequence[str], steps: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """Waiting per (run, rank, step) of the runs with matched collectives, busbw per (run, collective
    type, size bucket) of matched instances, and the matching notes. ``steps``: the report's step rows,
    whose split is used where they have it."""
    if "comm_wait_ns" not in steps.columns:  # rows of a report that did not split communication
        steps = step_metrics(con, selection=selection, runs=runs, cross_rank=True)
    split = steps.filter(pl.col("device").is_not_null())
    matched_runs = split.group_by("run").agg(pl.col("matched_count").sum()).filter(pl.col("matched_count") > 0)["run"]
    waits = (
        split.filter(pl.col("run").is_in(matched_runs.implode()))
        .group_by("run", "rank", "step").agg((pl.col("comm_wait_ns").sum() / 1e3).alias("comm_wait_us"))
    )
    try:
        table = collectives_report(con, by=("run", "collective_type", "size_bucket"), selection=selection, runs=runs).table
        bandwidth = table.filter(pl.col("basis") == MATCHED)
    except EmptySelection:
        bandwidth = pl.DataFrame()
    return waits, bandwidth, crossrank.matching_notes(con, runs)


def write_html_report(
    db: Warehouse,
    path: str | Path,
    *,
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
    scaling_by: Sequence[str] = (),
    steps: pl.DataFrame | None = None,
) -> Path:
    """Write the HTML report of the warehouse ``db`` to ``path``; returns the path. ``steps``: the step
    rows for the selection, where the caller has computed them already (each metric is computed once)."""
    return _write(path, render_html(report_data(db, selection=selection, runs=runs, scaling_by=scaling_by, steps=steps)))


def render_html(data: ReportData) -> str:
    """The report page as one string: inline plotly.js, figures, tables and notes."""
    from traceq.report import plots

    sections: list[str] = []
    runs = sorted(data.steps["run"].unique().to_list())
    sections.append(page_section("Runs", html_table(summary(data.steps)) + html_notes([
        *data.notes,
        "means over the selected rank-steps; ratios and rates (overlap_ratio, tokens/s, TFLOP/s, MFU, power, "
        "tokens/J) are ratios of sums, Σ overlapped / Σ comm, Σ tokens / Σ step time, as in every report and the "
        "scaling table",
        "each rank's last step is left out unless --include-last: its device window is open (it ends with the "
        "GPU's drain, so it holds the backlog of earlier steps or lacks its trailing idle)",
    ])))

    gpu_rows = data.steps.filter(pl.col("window_us").is_not_null())
    if gpu_rows.height:
        fig = plots.step_breakdown_figure(gpu_rows)
        body = page_figure(fig, "steps") + html_notes([
            "each step's device window runs from the first device activity it launched to the first the next step "
            "launched (the last: to the end of the activity the steps launched), so windows tile the timeline and a "
            "step counts all activity in its window, whichever step launched it; a rank without steps is step -1, "
            "its whole trace",
            "compute here is compute time without communication beside it; compute + overlapped comm = compute_us; "
            "the stack adds up to the window"])
    else:
        body = page_figure(plots.step_time_figure(data.steps), "steps") + html_notes(
            ["no GPU activity in these traces (CPU-only run): the per-step device breakdown needs kernels"])
    sections.append(page_section("Per-step breakdown", body))

    if data.by_collective.height:
        body = page_figure(plots.collective_figure(data.by_collective), "collectives") + html_notes([BREAKDOWN_NOTE])
    else:
        body = html_notes(["no communication kernels in the selected steps"])
    sections.append(page_section("Exposed communication by collective", body))

    body = ""
    if data.waits.height:
        body += page_figure(plots.wait_heatmap_figure(data.waits), "waits")
    if data.bandwidth.height:
        body += page_figure(plots.busbw_figure(data.bandwidth), "busbw")
    if not body:
        body = html_notes(["no collectives matched across ranks in the selected steps (it needs every rank of a "
                       "process group in the run)"])
    sections.append(page_section("Across ranks: waiting and bus bandwidth", body + html_notes(data.cross_rank_notes)))

    scaling = data.scaling
    body = ""
    if scaling["world_size"].drop_nulls().n_unique() >= 2 and scaling["global_tokens_per_s"].drop_nulls().len():
        body += page_figure(plots.scaling_figure(scaling, data.scaling_by), "scaling")
    else:
        body += html_notes(["scaling curves need runs at two or more world sizes with tokens_per_step"])
    body += html_table(scaling) + html_notes([*SCALING_NOTES, FLOPS_CONVENTION, PEAK_NOTE.format(table=peak_table_text())])
    sections.append(page_section("Scaling", body))

    if data.power.height:
        body = page_figure(plots.power_figure(data.power, data.windows), "power") + html_notes([NVML_NOTE])
    else:
        body = ""
    missing = data.power_status.filter(pl.col("source") != "nvml")
    if missing.height or not data.power.height:
        lines = [f"run {r['run']}: power unavailable ("
                 + (r["reason"] or "the log says NVML was absent" if r["source"] == "unavailable" else "no power log ingested")
                 + ")" for r in missing.iter_rows(named=True)]
        body += f'<p class="unavailable">Power unavailable for {len(missing)} of {len(runs)} run(s); no watts are shown ' \
                "where NVML gave none.</p>" + html_notes(lines)
    sections.append(page_section("Power", body))

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return page_html(f"traceq report: {', '.join(runs)}", "traceq report",
                     f"{len(runs)} run(s): {', '.join(runs)} · {stamp}", sections)


def page_html(title: str, heading: str, meta: str, sections: Sequence[str]) -> str:
    """One self-contained page: plotly's JavaScript inline (works offline), the sections in order."""
    from plotly.offline import get_plotlyjs

    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_html.escape(title)}</title>"
        f"<style>{_CSS}</style>\n<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head><body>\n"
        f"<h1>{_html.escape(heading)}</h1><p class=\"meta\">{_html.escape(meta)}</p>\n"
        + "\n".join(sections) + "\n</body></html>\n"
    )


def write_page(path: str | Path, title: str, heading: str, meta: str, sections: Sequence[str]) -> Path:
    """:func:`page_html` written to ``path``."""
    return _write(path, page_html(title, heading, meta, sections))


def _write(path: str | Path, text: str) -> Path:
    """``text`` at ``path``, whole or not at all: written to a temporary file beside it and renamed over
    ``path`` at the end (an earlier page survives a full disk)."""
    from traceq.scratch import atomic_file

    out = Path(path)
    try:
        with atomic_file(out) as f:
            f.write(text.encode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write the HTML page ({exc.strerror}); check the directory") from None
    return out


def summary(steps: pl.DataFrame) -> pl.DataFrame:
    """Per run: ranks, rank-steps and the mean of each headline metric over ranks and steps."""
    present = [c for c in SUMMARY_COLUMNS if c in steps.columns]
    per_step = steps.unique(subset=["run", "rank", "device", "step"], keep="first")
    return (
        per_step.group_by("run")
        .agg(pl.col("world_size").first(), pl.col("rank").n_unique().alias("ranks"),
             pl.len().alias("rank_steps"), *[mean_of(c).alias(c) for c in present])
        .sort("run")
    )


def page_section(title: str, body: str) -> str:
    """A titled section of a page (``body``: HTML), as every traceq page lays one out."""
    return f"<section><h2>{_html.escape(title)}</h2>\n{body}\n</section>"


def page_figure(fig: object, div_id: str) -> str:
    """A plotly figure as a page's fragment (plotly.js itself is inlined once per page)."""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,  # type: ignore[attr-defined]
                       config={"displaylogo": False, "responsive": True})








_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 24px; color: #222; }
h1 { margin-bottom: 0; } .meta { color: #666; margin-top: 4px; }
section { margin: 28px 0; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.scroll { overflow-x: auto; max-width: 100%; }
.notes { color: #555; font-size: 13px; } .unavailable { color: #a33; font-weight: 600; }
"""
