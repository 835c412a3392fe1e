"""The traceq command line: a thin layer over the library. The only module that prints or exits."""

from __future__ import annotations

import io
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from traceq.errors import TraceqError
from traceq.warehouse import DEFAULT_DB

app = typer.Typer(
    name="traceq",
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
)

DbOption = Annotated[Path, typer.Option("--db", help="DuckDB warehouse file.", show_default=True)]


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


class Window(str, Enum):
    steps = "steps"
    trace = "trace"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


@app.command()
def ingest(
    inputs: Annotated[list[str], typer.Argument(help="Trace files (.json, .json.gz), globs or directories.")],
    db: DbOption = Path(DEFAULT_DB),
    run: Annotated[Optional[str], typer.Option(help="Run name for every file (default: the parent directory's name).")] = None,
    rank: Annotated[Optional[int], typer.Option(help="Rank for files that name none (no distributedInfo, no per-event rank, none in the file name).")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Decoding processes (default: one per CPU; 0 = none).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Load Kineto traces into the warehouse (one transaction per file; re-ingesting is a no-op).

    Example:

      traceq ingest runs/llama-8n/*.json.gz --db runs.duckdb --run llama-8n
    """
    from traceq.ingest import ingest_traces

    try:
        summary = _with_progress(
            lambda progress: ingest_traces(inputs, db, run=run, rank=rank, workers=workers, progress=progress),
            enabled=not quiet and sys.stderr.isatty(),
        )
    except TraceqError as exc:
        _fail(str(exc))
        return
    for f in summary.files:
        if f.status == "ingested":
            ranks = ",".join("unknown" if r == -1 else str(r) for r in f.ranks) or "none"
            typer.echo(f"ingested {f.path}: run {f.run}, rank {ranks}, {f.events:,} events ({f.gpu_events:,} on GPU) in {f.seconds:.2f} s")
        elif f.status == "skipped":
            typer.echo(f"skipped {f.message}")
        else:
            typer.echo(f"failed {f.message}", err=True)
    counts = {s: len(summary.by_status(s)) for s in ("ingested", "skipped", "failed")}
    typer.echo(f"{counts['ingested']} ingested, {counts['skipped']} skipped, {counts['failed']} failed -> {db}")
    if not summary.ok:
        raise typer.Exit(code=1)


def _with_progress(work: Any, enabled: bool) -> Any:
    if not enabled:
        return work(None)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("ingest"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[files]}"), TimeRemainingColumn(),
        console=__import__("rich.console").console.Console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task("ingest", total=None, files="")
        state = {"done": 0, "files": 0}

        def progress(event: str, info: dict[str, Any]) -> None:
            if event == "start":
                state["files"] = info["files"]
                bar.update(task, total=info["bytes"], files=f"0/{info['files']} files")
            elif event == "file_read" or (event == "bytes" and "bytes" in info):
                bar.advance(task, info["bytes"])
            elif event == "done":
                state["done"] += 1
                bar.update(task, files=f"{state['done']}/{state['files']} files")

        return work(progress)


@app.command()
def report(
    metric: Annotated[str, typer.Option(help="Metric name (see `traceq metrics`); the unit suffix may be left off.")] = "exposed_comm",
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Grain: comma-separated subset of run,rank,device,step.")] = "run,rank",
    window: Annotated[Window, typer.Option(help="steps: the selected steps (kernels attributed to steps); trace: the whole trace, every kernel.")] = Window.steps,
    steps: Annotated[Optional[str], typer.Option(help="ProfilerStep numbers to use, inclusive, e.g. 11:60 or 5: .")] = None,
    skip_steps: Annotated[Optional[int], typer.Option(help="Leading profiled steps to skip (default: the run's warmup_steps metadata, else 0).")] = None,
    drop_last: Annotated[bool, typer.Option(help="Always drop each rank's last step (what HTA does); by default only a cut last step is dropped.")] = False,
    run: Annotated[Optional[list[str]], typer.Option("--run", help="Only this run (repeatable).")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Aggregate a metric across steps, ranks and runs.

    Steps are aggregated (mean, median, p10, p90) unless --by has step; ranks (mean, min, max,
    slowest rank) unless --by has rank.

    Examples:

      traceq report --metric exposed_comm

      traceq report --metric exposed_comm --by run,rank,step --format csv

      traceq report --metric overlap_ratio --by run --window trace --format json
    """
    from traceq.metrics import StepSelection, compute_metric

    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last)
        frame = compute_metric(
            db, metric, by=[c.strip() for c in by.split(",") if c.strip()], window=window.value,
            selection=selection, runs=run,
        )
    except TraceqError as exc:
        _fail(str(exc))
        return
    if fmt is Format.table:
        used = "whole trace, every kernel" if window is Window.trace else _steps_note(selection)
        typer.echo(f"{metric} by {by} ({used})", err=True)
    _emit(frame, fmt)


def _steps_note(selection: Any) -> str:
    skip = "the run's warmup_steps, 0 if unset" if selection.skip_steps is None else str(selection.skip_steps)
    parts = [f"warm-up steps skipped: {skip}"]
    if selection.step_min is not None or selection.step_max is not None:
        parts.append(f"ProfilerStep {selection.step_min or ''}:{selection.step_max or ''}")
    parts.append("dropping every last step" if selection.drop_last else "dropping a cut last step")
    return ", ".join(parts)


def _emit(frame: Any, fmt: Format) -> None:
    import polars as pl

    if fmt is Format.csv:
        buf = io.StringIO()
        frame.write_csv(buf)
        typer.echo(buf.getvalue(), nl=False)
    elif fmt is Format.json:
        typer.echo(json.dumps(frame.to_dicts(), indent=1, default=str))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(show_edge=False, pad_edge=False)
        rows = [[_cell(v) for v in row] for row in frame.iter_rows()]
        widths = [max([len(name), *(len(r[i]) for r in rows)]) for i, name in enumerate(frame.columns)]
        for name in frame.columns:
            table.add_column(name, justify="right" if frame.schema[name].is_numeric() else "left", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        Console(width=sum(widths) + 3 * len(widths) + 1, soft_wrap=False).print(table)
        del pl


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}"
    return str(value)


@app.command()
def metrics(fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table) -> None:
    """List every metric with its unit and one-line definition.

    Example:

      traceq metrics --format csv
    """
    from traceq.metrics import list_metrics

    _emit(list_metrics(), fmt)


@app.command()
def runs(
    db: DbOption = Path(DEFAULT_DB),
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """List the runs in the warehouse with their traces and ranks.

    Example:

      traceq runs --db runs.duckdb
    """
    from traceq.warehouse import connect

    try:
        con = connect(db, read_only=True)
    except TraceqError as exc:
        _fail(str(exc))
        return
    try:
        frame = con.sql(
            """
            select t.run, count(distinct t.trace_id) as traces,
                   count(distinct s.rank) as ranks_with_steps, max(t.world_size) as world_size,
                   sum(t.n_events) as events, any_value(r.metadata) as metadata
            from traces as t
            left join steps as s using (trace_id)
            left join runs as r on r.run = t.run
            group by t.run order by t.run
            """
        ).pl()
    finally:
        con.close()
    _emit(frame, fmt)


@app.command()
def rules(
    add: Annotated[Optional[Path], typer.Option(help="CSV of rules to add: priority,pattern,class,category,collective.")] = None,
    db: DbOption = Path(DEFAULT_DB),
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Show the kernel classification rules, or add your own (they apply to data already ingested).

    A rule is an RE2 regular expression on the kernel name; the lowest priority that matches wins
    (user rules win ties). Example, to count a custom all-reduce kernel as communication:

      echo 'priority,pattern,class,category,collective' > my_rules.csv

      echo '5,^my_allreduce_kernel,comm,custom,AllReduce' >> my_rules.csv

      traceq rules --add my_rules.csv
    """
    from traceq.warehouse import add_rules, connect

    try:
        con = connect(db, read_only=add is None)
        try:
            if add is not None:
                n = add_rules(con, add)
                typer.echo(f"added {n} rule(s) from {add}", err=True)
            frame = con.sql("select * from kernel_rules order by priority, source desc").pl()
        finally:
            con.close()
    except TraceqError as exc:
        _fail(str(exc))
        return
    _emit(frame, fmt)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
