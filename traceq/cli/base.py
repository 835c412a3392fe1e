"""What every command shares: the application, its one error boundary, the options and output.

A command parses its options, calls the library and prints what it gets back. The errors a user can
fix (:class:`~traceq.errors.TraceqError`: a bad option, a file that is not a trace, a selection that
leaves nothing) end any command at one place, the command group's :meth:`Commands.invoke`: one line
on stderr, exit 1.
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import os
import sys
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from traceq.errors import ConfigError, TraceqError


class Commands(TyperGroup):
    """traceq's commands: a :class:`~traceq.errors.TraceqError` out of any of them is said in one line
    (exit 1), after the note of a migration the command made."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except TraceqError as exc:
            fail(exc)


app = typer.Typer(
    name="traceq",
    cls=Commands,
    help=(
        "Where the time, the communication and the energy of distributed PyTorch training go.\n\n"
        "Load Kineto traces into a DuckDB warehouse, then report exposed vs overlapped "
        "communication per GPU and step.\n\n"
        "Example:\n\n"
        "  traceq ingest runs/job1/*.json.gz\n\n"
        "  traceq report --metric exposed_comm"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    result_callback=lambda *_, **__: say_migrations(),
)


def resolved(ctx: Any, param: Any, value: Any) -> Any:
    """An option's path as the one path the command checks and opens (``~`` expanded, absolute,
    resolved: :func:`~traceq.store.location.user_path`); ``-``, ``:memory:``, an option-like or URL
    value refused in one line. A Typer callback of every --db and output path."""
    from traceq.store.location import user_path

    if value is None:
        return None
    return user_path(value, max(param.opts, key=len) if param.opts else param.name)


DbOption = Annotated[Path, typer.Option("--db", help="DuckDB warehouse file (or a directory `traceq export --parquet` wrote).",
                                        show_default=True, callback=resolved)]


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


# the step selection and output options the reports share
StepsOption = Annotated[Optional[str], typer.Option("--steps", help="Step numbers to use (N of ProfilerStep#N, or of --step-marker), inclusive, e.g. 11:60, or 5: for step 5 on.")]
SkipStepsOption = Annotated[Optional[int], typer.Option("--skip-steps", help="Leading profiled steps to skip (default: the run's warmup_steps metadata, else 0).")]
DropLastOption = Annotated[bool, typer.Option("--drop-last/--no-drop-last", help="Drop each rank's last step always, even a rank's only step (what HTA does).")]
IncludeLastOption = Annotated[bool, typer.Option("--include-last", help="Keep each rank's last step. By default it is left out: its device window is open (it ends with the GPU's drain, so it holds the backlog of earlier steps); a rank whose only step is the last keeps it.")]
RunOption = Annotated[Optional[list[str]], typer.Option("--run", help="Only this run (repeatable).")]
NameOption = Annotated[Optional[str], typer.Option("--name", metavar="RUN", help="The run the traces go to (default: each file's directory's name).")]
FormatOption = Annotated[Format, typer.Option("--format", help="Output format.")]
WholeTraceOption = Annotated[bool, typer.Option("--whole-trace", help="Every collective of the trace, not only the selected steps'.")]
FullNamesOption = Annotated[bool, typer.Option("--full-names", help="Kernel names whole in the table (by default a table shows them short: at most 60 characters, unique within the table; CSV, JSON and HTML keep them whole).")]


def shown(path: Any) -> str:
    """A path as a message shows it: relative to the working directory where it lies below it (the
    options hold the resolved path, :func:`resolved`; ``traceq.duckdb`` reads better than its absolute
    path), else whole."""
    path, here = Path(path), Path.cwd()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def selecting_steps(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command``, which takes ``selection`` (a :class:`~traceq.report.selection.StepSelection`), as a
    command that has the step options every report shares in its place: --steps, --skip-steps,
    --drop-last and --include-last."""
    signature = inspect.signature(command, eval_str=True)
    kept = [p for p in signature.parameters.values() if p.name != "selection"]
    options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
               for name, annotation, default in (("steps", StepsOption, None), ("skip_steps", SkipStepsOption, None),
                                                 ("drop_last", DropLastOption, False),
                                                 ("include_last", IncludeLastOption, False))]

    @functools.wraps(command)
    def with_selection(*args: Any, steps: str | None = None, skip_steps: int | None = None, drop_last: bool = False,
                       include_last: bool = False, **kwargs: Any) -> Any:
        from traceq.report.selection import StepSelection

        return command(*args, selection=StepSelection.parse(steps, skip_steps, drop_last, include_last), **kwargs)

    with_selection.__signature__ = signature.replace(parameters=[*kept, *options])  # type: ignore[attr-defined]
    with_selection.__annotations__ = {p.name: p.annotation for p in (*kept, *options)}
    return with_selection


class Engine(str, Enum):
    duckdb = "duckdb"
    perfetto = "perfetto"


EngineOption = Annotated[Engine, typer.Option("--engine", help="duckdb: the warehouse (--db); perfetto: trace files, through Perfetto's trace processor.")]
TraceProcessorOption = Annotated[Optional[Path], typer.Option("--trace-processor", help="Perfetto's trace_processor_shell binary (default: $TRACEQ_TRACE_PROCESSOR, else the perfetto package's download).")]


@app.callback()
def _start() -> None:
    # migrations noted before this command (by library calls in this process) are not this command's to say
    from traceq.store.warehouse import migrations

    migrations()


def echo(text: Any = "", *, err: bool = False, nl: bool = True) -> None:
    """A line (or the text of lines) to the terminal, its control characters written out: a name holding
    ESC or a newline is shown, never obeyed (:mod:`traceq.terminal`)."""
    from traceq.terminal import visible

    typer.echo(visible(str(text)), err=err, nl=nl)


def say_migrations() -> None:
    """A writing command that migrated a warehouse made by an older traceq says so."""
    from traceq.store.warehouse import migrations

    for line in migrations():
        echo(f"note: {line}", err=True)


def fail(error: str | TraceqError) -> None:
    """End the command: ``error`` in one line on stderr (after the note of a migration it made), exit 1."""
    say_migrations()
    message = error.cli_message() if isinstance(error, ConfigError) else str(error)
    echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


def show(report: Any, fmt: Format, full_names: bool = False) -> None:
    """A :class:`~traceq.report.result.Report` as every command shows one: its title (for a table) and
    notes on stderr, its table on stdout as ``fmt`` says; a table shows the kernel names of the report's
    ``names`` columns short, unless ``full_names`` (CSV and JSON keep them whole)."""
    if fmt is Format.table and report.title:
        echo(report.title, err=True)
    show_notes(report.notes, fmt)
    emit(report.table, fmt, report.narrow, () if full_names else report.names)


def show_notes(notes: Any, fmt: Format) -> None:
    """Notes on stderr: with a table, each kind of note about runs once, naming the runs
    (:func:`~traceq.report.result.grouped_notes`); with CSV or JSON, every note whole."""
    if fmt is Format.table:
        from traceq.report.result import grouped_notes

        notes = grouped_notes(notes)
    for note in notes:
        echo(f"note: {note}", err=True)


def emit(frame: Any, fmt: Format, drop_first: tuple[str, ...] = (), names: tuple[str, ...] = ()) -> None:
    """``frame`` as CSV, JSON or a table; a table shows the kernel names of the columns ``names`` short
    (:func:`~traceq.report.result.with_short_names`), and, wider than the terminal, leaves columns out
    (the ``drop_first`` ones first, then as :func:`_fit` says) and says which."""
    if fmt in (Format.csv, Format.json):
        frame = _without_float_noise(frame)
    elif names:
        from traceq.report.result import with_short_names

        frame = with_short_names(frame, names)
    if fmt is Format.csv:
        typer.echo(_csv(frame), nl=False)
    elif fmt is Format.json:
        typer.echo(json.dumps(frame.to_dicts(), indent=1, default=str))  # JSON escapes control characters
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(show_edge=False, pad_edge=False)
        rows = [[_cell(v) for v in row] for row in frame.iter_rows()]
        room = _terminal_width()
        full = _widths(frame.columns, rows)
        widths = list(full)
        text = [i for i, name in enumerate(frame.columns) if not frame.schema[name].is_numeric()]
        empty = {i for i in range(len(frame.columns)) if not any(r[i] for r in rows)}
        shown, same = _one_line(frame.columns, full, room, empty, drop_first, text, rows, names)
        if shown is None and room is not None and sum(widths) + 3 * len(widths) + 1 > room:
            # text (a kernel's name, a path, a finding) is what names a row: it is wrapped, never cut,
            # in at least _TEXT_CELL characters, and figures are left out before it is narrowed further
            for i in text:
                widths[i] = min(full[i], max(_TEXT_CELL, len(frame.columns[i])))
        if shown is None:
            shown, same = _fit(frame.columns, widths, room, empty, drop_first, set(text)), set()
        for i in sorted(same):
            echo(f"note: {frame.columns[i]} is {rows[0][i]} on every row (left out to fit the terminal)", err=True)
        if room is not None:  # the room left goes back to the wrapped columns, the longest first
            spare = room - (sum(widths[i] for i in shown) + 3 * len(shown) + 1)
            for i in sorted((i for i in shown if i in text), key=lambda i: widths[i] - full[i]):
                grow = min(max(spare, 0), full[i] - widths[i])
                widths[i] += grow
                spare -= grow
        if len(shown) + len(same) < len(frame.columns):
            left = [c for i, c in enumerate(frame.columns) if i not in shown and i not in same]
            echo(f"note: {len(left)} column(s) left out to fit the terminal: {', '.join(left)} "
                       "(--format csv or json gives every column)", err=True)
        for i in shown:
            name = frame.columns[i]
            if widths[i] < full[i]:
                table.add_column(_cell(name), justify="left", width=widths[i], overflow="fold")
            else:
                table.add_column(_cell(name), justify="right" if frame.schema[name].is_numeric() else "left", no_wrap=True)
        for row in rows:
            table.add_row(*(row[i] for i in shown))
        Console(width=sum(widths[i] for i in shown) + 3 * len(shown) + 1, soft_wrap=False).print(table)


def emit_stream(frames: Iterator[Any], fmt: Format) -> int:
    """Frames of one table as they come (a report too large to hold), as CSV (one header) or one JSON
    array, written as each frame arrives: the same text as :func:`emit` of them all. Returns the rows."""
    if fmt not in (Format.csv, Format.json):
        raise ValueError(f"streamed as csv or json, not {fmt.value}")
    rows = 0
    for frame in frames:
        if not frame.height:
            continue
        frame = _without_float_noise(frame)
        if fmt is Format.csv:
            typer.echo(_csv(frame, header=rows == 0), nl=False)
        else:  # json.dumps(list, indent=1)'s text, a frame's items at a time
            items = json.dumps(frame.to_dicts(), indent=1, default=str)[2:-2]
            typer.echo(("[\n" if rows == 0 else ",\n") + items, nl=False)
        rows += frame.height
    if fmt is Format.json:
        typer.echo("\n]" if rows else "[]")
    return rows


def _csv(frame: Any, header: bool = True) -> str:
    """``frame`` as CSV text, control characters in its text written out."""
    import polars as pl

    from traceq.terminal import CONTROLS, ESCAPES

    buf = io.StringIO()
    # CSV has no lists or structs (DuckDB's LIST, STRUCT, MAP): each such value as its JSON text
    frame = frame.with_columns(
        pl.Series(name, [None if v is None else json.dumps(v, default=str) for v in frame[name].to_list()], dtype=pl.String)
        for name, dtype in frame.schema.items() if dtype.is_nested()
    )
    text = [name for name in frame.columns if frame.schema[name] == pl.String]
    frame.with_columns(frame[c].str.replace_many(CONTROLS, ESCAPES) for c in text).write_csv(buf, include_header=header)
    return buf.getvalue()


def _without_float_noise(frame: Any) -> Any:
    """``frame`` with its floats at 15 significant digits, all a float64 holds for sure: figures in ms
    made of integer ns came out as ``12854.103000000001``; now ``12854.103``."""
    import polars as pl

    floats = [name for name, dtype in frame.schema.items() if dtype in (pl.Float32, pl.Float64)]
    return frame.with_columns(pl.col(floats).round_sig_figs(15)) if floats else frame


_TEXT_CELL = 16  # characters of a text column, at least, when the table is wider than the terminal


def _widths(columns: list[str], rows: list[list[str]]) -> list[int]:
    return [max([len(name), *(len(r[i]) for r in rows)]) for i, name in enumerate(columns)]


# Left out first when a table is wider than the terminal: columns with no value, the spread of a
# mean, the slowest rank or run, a part's ms where its % is shown, then figures from the right, then
# text from the right (the first column, the key, always stays)
_SPREAD = ("_median", "_p10", "_p90", "_min", "_max")


def _fit(
    columns: list[str], widths: list[int], room: int | None, empty: set[int] = frozenset(), drop_first: tuple[str, ...] = (),
    text: set[int] = frozenset(),
) -> list[int]:
    """Indexes of the columns to show in ``room`` characters (all where room is None): figures are left
    out before ``text`` columns (what names a row: a kernel, a path), each from the right."""
    shown = list(range(len(columns)))

    def width() -> int:
        return sum(widths[i] for i in shown) + 3 * len(shown) + 1

    if room is None:
        return shown
    order: list[int] = [i for i in shown if i in empty]
    order += [columns.index(c) for c in drop_first if c in columns and columns.index(c) not in order]
    tiers = (
        lambda c, i: c.endswith(_SPREAD),
        lambda c, i: c.startswith("slowest_"),
        lambda c, i: c.endswith("_ms") and c.removesuffix("_ms") + "_pct" in columns,
        lambda c, i: i > 0 and i not in text,
        lambda c, i: i > 0,
    )
    for tier in tiers:
        order += [i for i in reversed(shown) if tier(columns[i], i) and i not in order]
    for i in order:
        if width() <= room:
            break
        shown.remove(i)
    return shown


def _one_line(
    columns: list[str], widths: list[int], room: int | None, empty: set[int], drop_first: tuple[str, ...],
    text: list[int], rows: list[list[str]], names: tuple[str, ...],
) -> tuple[list[int] | None, set[int]]:
    """(The columns to show, the text columns left out for holding one value on every row) where a table
    of kernel names (``names``, short) fits ``room`` a line a row by leaving out only what matters least:
    empty columns, text with one value on every row (said in a note), the ``drop_first`` ones; (None,
    set()) where it does not (then text wraps, :func:`_fit`)."""
    if room is None or not any(c in names for c in columns):
        return None, set()
    same = {i for i in text if len(rows) > 1 and rows[0][i] and all(r[i] == rows[0][i] for r in rows)}
    shown = [i for i in range(len(columns)) if i not in empty and i not in same]
    left = set(empty) | same
    for i in [columns.index(c) for c in drop_first if c in columns]:
        if sum(widths[j] for j in shown) + 3 * len(shown) + 1 <= room:
            break
        if i in shown:
            shown.remove(i)
            left.add(i)
    if sum(widths[j] for j in shown) + 3 * len(shown) + 1 > room:
        return None, set()
    for i in sorted(left, key=lambda i: widths[i]):  # what fits again comes back, the narrowest first
        if i not in empty and sum(widths[j] for j in shown) + 3 * (len(shown) + 1) + 1 + widths[i] <= room:
            shown = sorted([*shown, i])
    return shown, {i for i in same if i not in shown}


def _terminal_width() -> int | None:
    """The terminal's width when there is one to fit (stdout a terminal, or COLUMNS set); else None:
    a table written to a file or a pipe keeps every column."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    return None


def _cell(value: Any) -> str:
    """A table cell as text: control characters written out, Rich markup (``[bold]``) shown as typed."""
    from rich.markup import escape

    from traceq.terminal import visible

    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}"
    return escape(visible(str(value)))
