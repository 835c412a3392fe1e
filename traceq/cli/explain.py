"""``traceq explain``: why the step is slow, as findings largest first, each with its evidence and the command
to look closer (:mod:`traceq.report.explain`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from traceq.cli.base import DbOption, Format, FormatOption, RunOption, app, echo, selecting_steps, show, show_notes, shown
from traceq.store.warehouse import DEFAULT_DB


@app.command()
@selecting_steps
def explain(
    db: DbOption = Path(DEFAULT_DB),
    run: RunOption = None,
    fmt: FormatOption = Format.table,
    html: Annotated[Optional[Path], typer.Option(help="Also write the findings as a self-contained HTML page (their bounds as bars, the table).")] = None,
    selection: Any = None,
) -> None:
    """Why the step is slow: findings, largest first, each with its evidence and the next command.

    A finding says what (exposed communication per collective type, waiting for a late rank and who,
    idle by cause, exposed memcpy, the kernel categories that dominate compute with MFU, step-time
    variation, power and energy per token, the critical path per rank), how much (ms per step and share
    of the step), its bound (the time on the critical path it accounts for: what fixing it could save at
    most) and the figures behind it, each one another traceq command prints (--format json: the
    evidence column names them). A finding whose input is missing says what would enable it.

    Examples:

      traceq explain --run job1

      traceq explain --run job1 --steps 11:60 --html why.html

      traceq explain --run job1 --format json
    """
    from traceq.report.explain import explain as find
    from traceq.report.explain import write_explain_html

    report = find(db, runs=run, selection=selection)
    if html is not None:
        write_explain_html(report, html)
    if fmt is Format.table:  # a numbered list reads better than a table of sentences
        echo(report.title, err=True)
        show_notes(report.notes, fmt)
        for line in findings_text(report.table, len(set(report.table["run"].to_list())) > 1):
            echo(line)
    else:
        show(report, fmt)
    if html is not None:
        echo(f"wrote {shown(html)}", err=True)


def findings_text(table: Any, runs: bool) -> list[str]:
    """The findings as a terminal shows them: numbered, the sentence, then its bound and next command, then
    its evidence, each wrapped to the terminal's width; ``runs``: say each finding's run."""
    import shutil
    import textwrap

    width = max(60, min(shutil.get_terminal_size((120, 24)).columns, 160))
    lines: list[str] = []
    for i, f in enumerate(table.iter_rows(named=True), 1):
        head = f"{i}. " + (f"[{f['run']}] " if runs else "") + f["finding"]
        lines += textwrap.wrap(head, width, subsequent_indent="   ")
        figures = (f"bound {f['bound_ms']:,.3g} ms a step · " if f["bound_ms"] is not None else "") + f"next: {f['next']}"
        lines += textwrap.wrap(figures, width, initial_indent="   ", subsequent_indent="     ")
        if f["evidence"]:
            lines += textwrap.wrap("evidence: " + f["evidence"], width, initial_indent="   ", subsequent_indent="     ")
    if not lines:
        lines.append("no finding: nothing in the selected steps reaches 1 % of the step")
    return lines
