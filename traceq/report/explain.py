"""Why the step is slow (``traceq explain``; docs/explanation/findings.md): the findings of each run, largest
first by their bound, each with its evidence and the command to look closer.

:func:`explain` runs the reports other commands print (``report``, ``stragglers``, ``collectives``,
``kernels``, ``summary``, ``critical-path``) once over the selected runs (:func:`figures`), reads the
findings off their tables (:mod:`traceq.report.finding_kinds`) and orders them: the findings of time by
their bound, largest first, then the context (power, the path per rank), then what a missing input would
enable. The report's ``rows`` hold each finding's evidence, one figure a row, with the command that prints it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from traceq.errors import EmptySelection, TraceqError
from traceq.report.finding_kinds import findings_of
from traceq.report.findings import METRICS, MIN_PCT, PATH_TOP, Figures, Finding
from traceq.report.result import Report, RunNote
from traceq.report.selection import StepSelection
from traceq.store.warehouse import DEFAULT_DB, Warehouse

if TYPE_CHECKING:
    import polars as pl

COLUMNS = ("run", "finding", "ms_per_step", "pct_of_step", "bound_ms", "evidence", "next")
BOUND_NOTE = (
    "bound_ms: the time on the critical path a finding accounts for, per step: what removing its cause could save "
    "at most (without a path: its own time); ms_per_step and pct_of_step: its time per rank-step and share of the "
    "step (step_time_ms); evidence: the figures behind it, each printed by the command named (the rows of "
    "--format json say which command, column and row); a link's nominal rate is not known to traceq: busbw stands alone"
)


def explain(
    db: Warehouse = DEFAULT_DB,
    *,
    runs: Sequence[str] | None = None,
    selection: StepSelection = StepSelection(),
) -> Report:
    """The findings of the selected steps of ``runs`` (None: every run), largest first by their bound.

    Columns: ``run``, ``finding`` (one sentence), ``ms_per_step``, ``pct_of_step``, ``bound_ms`` (time on the
    critical path it accounts for per step; None for a finding that is not time), ``evidence`` (its figures,
    each with the command that prints it), ``next`` (a command to look closer). ``rows``: one row per figure
    of evidence (finding number, command, column, row, aggregation, value, role). Raises
    :class:`~traceq.errors.EmptySelection` when the selection leaves no step.
    """
    fig = figures(db, runs=runs, selection=selection)
    shown: list[Finding] = []
    notes: list[str] = [BOUND_NOTE, *fig.notes]
    for run in fig.metrics["run"].to_list():
        large, small = findings_of(fig, run)
        shown += ordered(large)
        if small:
            left = "; ".join(f"{f.topic} {f.pct_of_step:.2f} %" for f in small)
            notes.append(RunNote(f"findings below {MIN_PCT:g} % of the step, not listed", f"run {run}: {left}"))
    if fig.missing.get("critical_path"):
        notes.append(f"no critical path, so each bound is the finding's own time: {fig.missing['critical_path']}")
    notes.append("the commands read the same warehouse: add --db PATH where it is not traceq.duckdb")
    which = ", ".join(fig.metrics["run"].to_list()[:4]) + (" ..." if fig.metrics.height > 4 else "")
    return Report(findings_table(shown), notes, f"why the step is slow: {which} ({selection.describe()})",
                  evidence_rows(shown), narrow=("evidence", "run", "pct_of_step"))


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """Findings of time by bound, largest first; then context; then what a missing input would enable."""
    timed = sorted((f for f in findings if f.bound_ms is not None), key=lambda f: -f.bound_ms)
    rest = [f for f in findings if f.bound_ms is None and f.kind != "missing"]
    return [*timed, *rest, *(f for f in findings if f.kind == "missing")]


def findings_table(findings: Sequence[Finding]) -> pl.DataFrame:
    """One row per finding, :data:`COLUMNS`."""
    import polars as pl

    return pl.DataFrame(
        [{"run": f.run, "finding": f.text, "ms_per_step": f.ms_per_step, "pct_of_step": f.pct_of_step,
          "bound_ms": f.bound_ms, "evidence": "; ".join(e.short() for e in f.evidence), "next": f.next}
         for f in findings],
        schema={"run": pl.String, "finding": pl.String, "ms_per_step": pl.Float64, "pct_of_step": pl.Float64,
                "bound_ms": pl.Float64, "evidence": pl.String, "next": pl.String},
    )


def evidence_rows(findings: Sequence[Finding]) -> pl.DataFrame:
    """One row per figure of evidence: finding (its row number, 0 first), kind, topic, command, column, where (the row,
    a JSON object of column: value), agg, value, role."""
    import polars as pl

    rows = [{"finding": i, "kind": f.kind, "topic": f.topic, "command": e.command, "column": e.column,
             "where": json.dumps(dict(e.where)), "agg": e.agg, "value": e.value, "role": e.role}
            for i, f in enumerate(findings) for e in f.evidence]
    return pl.DataFrame(rows, schema={"finding": pl.Int64, "kind": pl.String, "topic": pl.String, "command": pl.String, "column": pl.String,
                                      "where": pl.String, "agg": pl.String, "value": pl.Float64, "role": pl.String})


def selection_flags(selection: StepSelection) -> str:
    """The command-line options that make the same step selection."""
    out = []
    if selection.step_min is not None or selection.step_max is not None:
        lo = "" if selection.step_min is None else selection.step_min
        hi = "" if selection.step_max is None else selection.step_max
        out.append(f"--steps {lo}:{hi}")
    if selection.skip_steps is not None:
        out.append(f"--skip-steps {selection.skip_steps}")
    if selection.include_last:
        out.append("--include-last")
    if selection.drop_last:
        out.append("--drop-last")
    return " ".join(out)


def figures(db: Warehouse = DEFAULT_DB, *, runs: Sequence[str] | None = None,
            selection: StepSelection = StepSelection()) -> Figures:
    """The tables the findings read, each from the report another command prints, once over ``runs``."""
    from traceq.report.collectives import collectives_report, stragglers_report
    from traceq.report.critical_path import critical_path
    from traceq.report.kernels import kernel_report
    from traceq.report.metrics import metric_report, side_by_side
    from traceq.report.summary import summary

    per_rank = metric_report(db, list(METRICS), by="run,rank", selection=selection, runs=runs, cross_rank=True)
    fig = Figures(
        metrics=side_by_side(per_rank.rows, METRICS, ["run"]), ranks=per_rank.table,
        steps=side_by_side(per_rank.rows, ["step_time_ms"], ["run", "rank", "step"]),
        summary=summary(db, by="run", selection=selection, runs=runs).table, flags=selection_flags(selection),
        notes=[n for n in per_rank.notes if isinstance(n, RunNote) or n.startswith("run ")])  # per run, not conventions
    optional = {
        "by_type": lambda: metric_report(db, "exposed_comm_by_collective_us", by="run", selection=selection, runs=runs).table,
        "by_type_ranks": lambda: metric_report(db, "exposed_comm_by_collective_us", by="run,rank", selection=selection,
                                               runs=runs).table,
        "stragglers": lambda: stragglers_report(db, selection=selection, runs=runs).table,
        "collectives": lambda: collectives_report(db, by="run,collective_type", selection=selection, runs=runs).table,
        "categories": lambda: kernel_report(db, by="run", level="category", top=PATH_TOP, selection=selection,
                                            runs=runs).table,
        "kernels": lambda: kernel_report(db, by="run", top=PATH_TOP, selection=selection, runs=runs).table,
    }
    for name, make in optional.items():
        try:
            setattr(fig, name, make())
        except EmptySelection as exc:  # nothing of that kind in the selection: the findings of it say so
            fig.missing[name] = str(exc)
    try:
        path = critical_path(db, runs=runs, selection=selection)
        fig.path_steps, fig.path_ranks = path.steps, path.ranks()
        fig.path_kernels = path.kernels(None)
    except TraceqError as exc:
        fig.missing["critical_path"] = str(exc)
    return fig


def write_explain_html(report: Report, path: str | Path) -> Path:
    """The findings as one self-contained page: their bounds and times as bars, then the table with its notes."""
    import plotly.graph_objects as go

    from traceq.report.html import page_figure, page_section, write_page

    table = report.table.filter(report.table["ms_per_step"].is_not_null())
    labels = [f"{i + 1}. {t[:60]}" for i, t in enumerate(table["finding"].to_list())]
    fig = go.Figure([go.Bar(y=labels, x=table["bound_ms"].to_list(), name="bound (ms a step)", orientation="h"),
                     go.Bar(y=labels, x=table["ms_per_step"].to_list(), name="its time (ms a step)", orientation="h")])
    fig.update_layout(barmode="group", yaxis={"autorange": "reversed"}, height=120 + 40 * max(len(labels), 1),
                      margin={"l": 20, "r": 20, "t": 30, "b": 30}, xaxis_title="ms per step")
    runs = report.table["run"].unique(maintain_order=True).to_list()
    sections = [page_section("What bounds the step", page_figure(fig, "findings")),
                page_section("Findings, largest first", report.html())]
    return write_page(path, "traceq explain", "Why the step is slow", f"run(s) {', '.join(runs)}", sections)
