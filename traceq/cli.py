"""The traceq command line: a thin layer over the library. The only module that prints or exits."""

from __future__ import annotations

import inspect
import io
import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from traceq.catalog import GROUP_COLUMNS, RUN_KEYS
from traceq.errors import ConfigError, TraceqError
from traceq.store.warehouse import DEFAULT_DB

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
    result_callback=lambda *_, **__: _say_migrations(),
)

DbOption = Annotated[Path, typer.Option("--db", help="DuckDB warehouse file.", show_default=True)]


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


# the step selection and output options the reports share
StepsOption = Annotated[Optional[str], typer.Option("--steps", help="Step numbers to use, inclusive, e.g. 11:60.")]
SkipStepsOption = Annotated[Optional[int], typer.Option("--skip-steps", help="Leading profiled steps to skip (default: the run's warmup_steps metadata, else 0).")]
DropLastOption = Annotated[bool, typer.Option("--drop-last/--no-drop-last", help="Drop each rank's last step always, even a rank's only step (what HTA does).")]
IncludeLastOption = Annotated[bool, typer.Option("--include-last", help="Keep each rank's last step. By default it is left out: its device window is open (it ends with the GPU's drain, so it holds the backlog of earlier steps); a rank whose only step is the last keeps it.")]
RunOption = Annotated[Optional[list[str]], typer.Option("--run", help="Only this run (repeatable).")]
FormatOption = Annotated[Format, typer.Option("--format", help="Output format.")]
WholeTraceOption = Annotated[bool, typer.Option("--whole-trace", help="Every collective of the trace, not only the selected steps'.")]


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


def _echo(text: Any = "", *, err: bool = False, nl: bool = True) -> None:
    """A line (or the text of lines) to the terminal, its control characters written out: a name holding
    ESC or a newline is shown, never obeyed (:mod:`traceq.terminal`)."""
    from traceq.terminal import visible

    typer.echo(visible(str(text)), err=err, nl=nl)


def _say_migrations() -> None:
    """A writing command that migrated a warehouse made by an older traceq says so."""
    from traceq.store.warehouse import migrations

    for line in migrations():
        _echo(f"note: {line}", err=True)


def _fail(error: str | TraceqError) -> None:
    _say_migrations()  # a command that fails after migrating a warehouse still says so
    message = error.cli_message() if isinstance(error, ConfigError) else str(error)
    _echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


@app.command()
def ingest(
    inputs: Annotated[list[str], typer.Argument(help="Trace files (.json, .json.gz), globs or directories.")],
    db: DbOption = Path(DEFAULT_DB),
    run: Annotated[Optional[str], typer.Option(help="Run name for every file (default: the parent directory's name).")] = None,
    rank: Annotated[Optional[int], typer.Option(help="Rank for files that name none (no distributedInfo, no per-event rank, none in the file name); without it each such file gets a rank of its own: -1, -2, ...")] = None,
    step_marker: Annotated[Optional[str], typer.Option(help="Regular expression naming the steps, for traces whose steps are not ProfilerStep#N, e.g. '^step\\[DECODE' or 'Optimizer.step#'. A group that captures an integer numbers the steps; else they are numbered 1, 2, ... in time order.")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Cores to parse on (default: all; 0 or 1 = one).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Ingest files that are in the warehouse already: each one's earlier trace is replaced in the same transaction (e.g. to move it under another --run).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Load Kineto traces into the warehouse (each file all or nothing; re-ingesting is a no-op unless --force).

    Steps are the ProfilerStep#N spans unless --step-marker names others; a trace with no step is
    reported over its whole timeline as one window. Each file's ranks belong to it alone: a file whose
    run already holds a step of one of its ranks is refused (the same trace twice, or two jobs in one
    run: use --run).

    Examples:

      traceq ingest runs/llama-8n/*.json.gz --db runs.duckdb --run llama-8n

      traceq ingest vllm_decode.json.gz --step-marker '^step\\[DECODE'
    """
    from traceq.ingest import ingest_traces

    try:
        summary = _with_progress(
            lambda progress: ingest_traces(
                inputs, db, run=run, rank=rank, workers=workers, progress=progress, step_marker=step_marker,
                force=force,
            ),
            enabled=not quiet and sys.stderr.isatty(),
        )
    except TraceqError as exc:
        _fail(exc)
        return
    for note in summary.notes:
        _echo(f"note: {note}", err=True)
    for f in summary.files:
        if f.status == "ingested":
            ranks = ",".join(str(r) for r in f.ranks) or "none"
            _echo(f"ingested {f.path}: run {f.run}, rank {ranks}, {f.events:,} events ({f.gpu_events:,} on GPU) in {f.seconds:.2f} s")
            for note in f.notes:
                _echo(f"note: {note}", err=True)
        elif f.status == "skipped":
            _echo(f"skipped {f.message}")
        else:
            _echo(f"failed {f.message}", err=True)
    counts = {s: len(summary.by_status(s)) for s in ("ingested", "skipped", "failed")}
    _echo(f"{counts['ingested']} ingested, {counts['skipped']} skipped, {counts['failed']} failed -> {db}")
    if not summary.ok:
        raise typer.Exit(code=1)


def _with_progress(work: Any, enabled: bool) -> Any:
    if not enabled:
        return work(None)
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

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
    metric: Annotated[str, typer.Option(help="Metric name (see `traceq metrics`; the unit suffix may be left off), or several, comma-separated, side by side.")] = "exposed_comm",
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help=f"Grain: comma-separated subset of {', '.join(GROUP_COLUMNS)} (the last ones are run metadata).")] = "run,rank",
    whole_trace: Annotated[bool, typer.Option("--whole-trace", help="Report the whole timeline and every kernel, not the selected steps' windows.")] = False,
    steps: Annotated[Optional[str], typer.Option(help="Step numbers to use (N of ProfilerStep#N, or of --step-marker), inclusive, e.g. 11:60 or 5: .")] = None,
    skip_steps: Annotated[Optional[int], typer.Option(help="Leading profiled steps to skip (default: the run's warmup_steps metadata, else 0).")] = None,
    drop_last: DropLastOption = False,
    include_last: IncludeLastOption = False,
    run: Annotated[Optional[list[str]], typer.Option("--run", help="Only this run (repeatable).")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    html: Annotated[Optional[Path], typer.Option(help="Also write a self-contained HTML report (plots, tables) of the selected runs and steps to this file.")] = None,
    traces: Annotated[Optional[list[str]], typer.Argument(help="With --engine perfetto: trace files, globs or directories, read directly (no warehouse).", show_default=False)] = None,
    engine: EngineOption = Engine.duckdb,
    trace_processor: TraceProcessorOption = None,
    rank: Annotated[Optional[int], typer.Option(help="With --engine perfetto: the rank of traces that name none.")] = None,
    step_marker: Annotated[Optional[str], typer.Option(help="With --engine perfetto: a regular expression on the names of the step spans (as traceq ingest --step-marker).")] = None,
) -> None:
    """Aggregate a metric across steps, ranks and runs.

    Steps are aggregated (mean, median, p10, p90) unless --by has step; ranks (mean, min, max,
    slowest rank) unless --by has rank; runs (mean, min, max, slowest run) unless --by has run.
    Notes on stderr say which steps were used, the FLOPs convention and peak behind tflops/mfu,
    and where power comes from (or that it is unavailable).

    Examples:

      traceq report --metric exposed_comm

      traceq report --metric exposed_comm --by run,rank,step --format csv

      traceq report --metric exposed_comm,idle,step_time --by run

      traceq report --metric overlap_ratio --by run --whole-trace --format json

      traceq report --metric tokens_per_s --by world_size,tp --html report.html

      traceq report --engine perfetto --metric exposed_comm --by run,rank,step runs/rank*.json.gz

    --engine perfetto computes the interval metrics (comm, compute, overlapped, exposed, idle, ...)
    with Perfetto's trace processor from the trace files themselves, independently of the DuckDB
    engine; it finds the binary from --trace-processor, then $TRACEQ_TRACE_PROCESSOR, then the
    perfetto package's download. There --run NAME names the files' run (default: each file's
    directory) and --rank N the rank of files that name none.
    """
    from traceq.catalog import BREAKDOWNS
    from traceq.report.metrics import step_report
    from traceq.report.selection import StepSelection

    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
        if engine is Engine.perfetto or traces:
            result = _perfetto_report(traces, engine, metric, by, whole_trace, selection, run, rank, html, trace_processor,
                                      step_marker)
        elif step_marker is not None:
            raise ConfigError("the warehouse keeps the marker each file was ingested with; ingest again with "
                              "--step-marker, or read the traces with --engine perfetto", param="step_marker", value=step_marker)
        else:
            result = step_report(db, metric, by=by, whole_trace=whole_trace, selection=selection, runs=run,
                                 cross_rank=html is not None and not whole_trace)  # the page shows waiting too
        if html is not None:
            from traceq.report.html import write_html_report

            # the report's step rows serve the page too, unless they are per collective or the whole trace
            reuse = not whole_trace and not set(result.metrics) & set(BREAKDOWNS)
            write_html_report(db, html, selection=selection, runs=run, steps=result.rows if reuse else None)
    except TraceqError as exc:
        _fail(exc)
        return
    if fmt is Format.table:
        used = "whole trace, every kernel" if whole_trace else _steps_note(selection)
        if engine is Engine.perfetto:  # trace files carry no run metadata
            used = used.replace("the run's warmup_steps, 0 if unset", "none unless --skip-steps") + "; Perfetto engine"
        _echo(f"{result.metric} by {by} ({used})", err=True)
    for note in result.notes:
        _echo(f"note: {note}", err=True)
    _emit(result.table, fmt)
    if html is not None:
        _echo(f"wrote {html}", err=True)


def _perfetto_report(traces: list[str] | None, engine: Engine, metric: str, by: str, whole_trace: bool,
                     selection: Any, run: list[str] | None, rank: int | None, html: Path | None,
                     trace_processor: Path | None, step_marker: str | None) -> Any:
    """``report --engine perfetto``: the checks of its options, then the report."""
    from traceq.catalog import StepMarker
    from traceq.report.perfettosql import perfetto_report, trace_processor_binary

    if engine is not Engine.perfetto:
        raise ConfigError("trace files are read by --engine perfetto; for the DuckDB engine ingest them first "
                          "(traceq ingest TRACES), then report on the warehouse", param="traces", value=" ".join(traces or ()))
    if not traces:
        raise ConfigError("give the trace files to read (the Perfetto engine reads no warehouse)", param="engine", value="perfetto")
    if html is not None:
        raise ConfigError("the HTML report reads the warehouse: use --engine duckdb", param="html", value=str(html))
    if run and len(run) > 1:
        raise ConfigError("with --engine perfetto, --run names the traces' run (once)", param="run", value=",".join(run))
    return perfetto_report(traces, metric, by=by, whole_trace=whole_trace, selection=selection,
                           run=run[0] if run else None, rank=rank, binary=trace_processor_binary(trace_processor),
                           marker=StepMarker.parse(step_marker))


@app.command()
def sql(
    words: Annotated[list[str], typer.Argument(metavar="[TRACE] QUERY", help="The query; with --engine perfetto, the trace file before it.", show_default=False)],
    db: DbOption = Path(DEFAULT_DB),
    engine: EngineOption = Engine.duckdb,
    trace_processor: TraceProcessorOption = None,
    rank: Annotated[Optional[int], typer.Option(help="With --engine perfetto: the rank of a trace that names none.")] = None,
    step_marker: Annotated[Optional[str], typer.Option(help="With --engine perfetto: a regular expression on the names of the step spans (as traceq ingest --step-marker).")] = None,
    max_rows: Annotated[int, typer.Option("--max-rows", help="Print at most this many rows (the query's first ones), and say so when there were more.", min=1)] = 100_000,
    fmt: FormatOption = Format.table,
) -> None:
    """Run your own query over traceq's classification, step windows and metrics.

    --engine duckdb (the default): DuckDB SQL on the warehouse, read-only, and on nothing else (no
    other file, no extension, no settings: COPY TO, read_csv and INSTALL are refused). Besides its tables
    (gpu_events, host_events, steps, traces, ...) the query may name traceq's relations:
    gpu_activity (every device event, classified), device_activity, device_windows,
    selected_steps, selected_windows, trace_windows, interval_breakdown (the metrics of the
    selected steps' windows, in ns), comm_instances.

    --engine perfetto: PerfettoSQL on one trace file, loaded in Perfetto's trace processor with
    traceq's modules: traceq_device_events, traceq_steps, traceq_step_attribution,
    traceq_device_windows, traceq_windows, traceq_interval_breakdown, next to Perfetto's own
    tables (slice, thread, args, ...) and standard library.

    Examples:

      traceq sql "select class, count(*), sum(dur_ns) from gpu_activity group by class"

      traceq sql --engine perfetto runs/rank0.json.gz "select scope, step, exposed_comm_ns from traceq_interval_breakdown"
    """
    from traceq.catalog import StepMarker
    from traceq.report.adhoc import trace_sql, warehouse_sql
    from traceq.report.perfettosql import trace_processor_binary

    notes: list[str] = []
    try:
        if engine is Engine.perfetto:
            if len(words) != 2:
                raise ConfigError("give one trace file, then the query", param="words", value=" ".join(words))
            frame, notes = trace_sql(words[1], Path(words[0]), rank=rank, binary=trace_processor_binary(trace_processor),
                                     marker=StepMarker.parse(step_marker))
        else:
            if step_marker is not None:
                raise ConfigError("the warehouse keeps the marker each file was ingested with", param="step_marker", value=step_marker)
            if len(words) != 1:
                raise ConfigError("give the query alone (the DuckDB engine reads the warehouse, --db); "
                                  "to query a trace file use --engine perfetto", param="words", value=" ".join(words))
            frame = warehouse_sql(words[0], db, max_rows=max_rows)
    except TraceqError as exc:
        _fail(exc)
        return
    if frame.height > max_rows:
        frame = frame.head(max_rows)
        notes.append(f"the query gives more than {max_rows:,} rows: the first {max_rows:,} are printed (--max-rows)")
    for note in notes:
        _echo(f"note: {note}", err=True)
    _emit(frame, fmt)


@app.command()
def summary(
    traces: Annotated[Optional[list[str]], typer.Argument(help="Trace files, globs or directories to summarise without a warehouse (ingested into a temporary one); default: the warehouse's runs.")] = None,
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Grain: comma-separated run, rank, device, step or run metadata columns.")] = "run,rank",
    steps: StepsOption = None,
    skip_steps: SkipStepsOption = None,
    drop_last: DropLastOption = False,
    include_last: IncludeLastOption = False,
    run: RunOption = None,
    fmt: FormatOption = Format.table,
    html: Annotated[Optional[Path], typer.Option(help="Also write the summary as a self-contained HTML page (the shares as stacked bars, the table).")] = None,
) -> None:
    """Where each GPU's step time goes, on one screen: step time, then compute, overlapped comm,
    exposed comm, exposed memcpy and idle as ms per step and as % of the device window (compute +
    exposed comm + exposed memcpy + idle = 100 %), then tokens/s, MFU and power where known.

    Examples:

      traceq summary --db runs.duckdb

      traceq summary runs/job1/*.json.gz          # no warehouse kept

      traceq summary --by run --steps 11:60 --format csv

      traceq summary --by run,rank,step --run llama-8n --html steps.html   # step by step
    """
    import tempfile

    from traceq.report.selection import StepSelection
    from traceq.report.summary import PARTS
    from traceq.report.summary import summary as summarise
    from traceq.report.summary import write_summary_html

    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
        with tempfile.TemporaryDirectory(prefix="traceq-summary-") as scratch:
            if traces:
                from traceq.ingest import ingest_traces

                db = Path(scratch) / "summary.duckdb"
                ingested = ingest_traces(traces, db)
                for f in ingested.by_status("failed"):
                    _echo(f"failed {f.message}", err=True)
                for note in [*ingested.notes, *(n for f in ingested.files for n in f.notes)]:
                    _echo(f"note: {note}", err=True)
            table, notes = summarise(db, by=by, selection=selection, runs=run)
        if html is not None:
            write_summary_html(table, html, by, notes)
    except TraceqError as exc:
        _fail(exc)
        return
    if fmt is Format.table:
        _echo(f"summary by {by} ({_steps_note(selection)}); ms per step, % of the device window", err=True)
    for note in notes:
        _echo(f"note: {note}", err=True)
    # on a narrow terminal: step time and the shares of compute, exposed comm and idle stay longest
    _emit(table, fmt, drop_first=(*(f"{p}_ms" for p in PARTS), "overlapped_comm_pct", "exposed_memcpy_pct", "steps"))
    if html is not None:
        _echo(f"wrote {html}", err=True)


@app.command()
def kernels(
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Grain: comma-separated run, rank, step.")] = "run",
    level: Annotated[str, typer.Option(help="kernel (one row per kernel name) or category (gemm, attention, elementwise, norm, optimizer, nccl, memcpy, other, ...).")] = "kernel",
    top: Annotated[int, typer.Option(help="Rows per group of --by, the most device time first.")] = 20,
    unclassified: Annotated[bool, typer.Option("--unclassified", help="Only kernels no rule classifies (category other): candidates for `traceq rules --add`.")] = False,
    steps: StepsOption = None,
    skip_steps: SkipStepsOption = None,
    drop_last: DropLastOption = False,
    include_last: IncludeLastOption = False,
    run: RunOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """The kernels (or categories) the device time goes to, over the selected steps: count, total,
    share of the group's kernel time, mean, min and max duration. A kernel counts in the step that
    launched it; durations are summed (kernels side by side count twice).

    Examples:

      traceq kernels --top 10

      traceq kernels --level category --by run,rank

      traceq kernels --unclassified --format csv      # then write rules for them: traceq rules --add
    """
    from traceq.report.kernels import kernel_table
    from traceq.report.selection import StepSelection

    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
        table = kernel_table(db, by=by, level=level, top=top, selection=selection, runs=run, unclassified=unclassified)
    except TraceqError as exc:
        _fail(exc)
        return
    if fmt is Format.table:
        what = "categories" if level == "category" else "kernels"
        _echo(f"top {top} {what} by device time, by {by} ({_steps_note(selection)})", err=True)
    # on a narrow terminal: the name, its total and its share stay longest
    _emit(table, fmt, drop_first=("min_us", "max_us", "mean_us", "class", "count"))


@app.command()
def collectives(
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Grain: comma-separated run, collective_type, process_group, size_bucket, inter_node.")] = "run,collective_type,process_group,size_bucket",
    instances: Annotated[bool, typer.Option("--instances", help="One row per communication kernel instead: its instance, rank, wait and transfer (every step).")] = False,
    whole_trace: WholeTraceOption = False,
    steps: StepsOption = None,
    skip_steps: SkipStepsOption = None,
    drop_last: DropLastOption = False,
    include_last: IncludeLastOption = False,
    run: RunOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Collectives matched across the ranks of each run: per collective type, process group and
    message size, the instances, their mean size, transfer time and per-rank wait, and the algorithm
    and bus bandwidth (nccl-tests conventions). An instance's transfer is its shortest kernel over
    the ranks (the last to arrive waited least); the rest of each rank's kernel is waiting. Kernels
    that cannot be matched (a rank missing, no process group, point-to-point) are rows of their own
    whose bandwidth comes from the kernel's whole duration: a lower bound.

    Examples:

      traceq collectives --run llama7b-256n

      traceq collectives --by collective_type,size_bucket --format csv

      traceq collectives --instances --run llama7b-256n --format json
    """
    from traceq.report.collectives import collectives_table, instance_table
    from traceq.report.selection import StepSelection

    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
        if instances:
            table, notes = instance_table(db, runs=run), []
        else:
            table, notes = collectives_table(db, by=by, selection=selection, whole_trace=whole_trace, runs=run)
    except TraceqError as exc:
        _fail(exc)
        return
    if fmt is Format.table:
        used = "every kernel" if instances or whole_trace else _steps_note(selection)
        _echo(f"collectives by {'instance' if instances else by} ({used})", err=True)
        for note in notes:
            _echo(f"note: {note}", err=True)
    _emit(table, fmt, drop_first=("algbw_gbps", "inter_node", "group_size", "ordinal", "seq", "reason", "device"))


@app.command()
def stragglers(
    db: DbOption = Path(DEFAULT_DB),
    by_step: Annotated[bool, typer.Option("--by-step", help="One row per rank and step, not per rank.")] = False,
    whole_trace: WholeTraceOption = False,
    steps: StepsOption = None,
    skip_steps: SkipStepsOption = None,
    drop_last: DropLastOption = False,
    include_last: IncludeLastOption = False,
    run: RunOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Who arrives last at the collectives, how often, and how much waiting it causes the other ranks.

    Per rank, over the selected steps: matched_count (collectives it took part in), arrived_last_count
    and arrived_last_share (it arrived last: its kernel was the shortest of the instance),
    wait_caused_us (the waiting the others did there) and its own waiting, wait_us. The ranks that
    caused the most waiting come first.

    Examples:

      traceq stragglers --run llama7b-256n

      traceq stragglers --by-step --steps 11:60 --format csv
    """
    from traceq.report.collectives import stragglers_table
    from traceq.report.selection import StepSelection

    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
        table, notes = stragglers_table(db, by_step=by_step, selection=selection, whole_trace=whole_trace, runs=run)
    except TraceqError as exc:
        _fail(exc)
        return
    if fmt is Format.table:
        _echo(f"stragglers by run,rank{',step' if by_step else ''} "
                   f"({'whole trace' if whole_trace else _steps_note(selection)})", err=True)
        for note in notes:
            _echo(f"note: {note}", err=True)
    _emit(table, fmt, drop_first=("matched_count",))


class PathView(str, Enum):
    steps = "steps"
    segments = "segments"
    ranks = "ranks"
    kernels = "kernels"


@app.command("critical-path")
def critical_path(
    db: DbOption = Path(DEFAULT_DB),
    run: Annotated[Optional[str], typer.Option("--run", help="The run (may be left out when the warehouse holds one).")] = None,
    step: Annotated[Optional[list[int]], typer.Option("--step", help="Only this step number (repeatable).")] = None,
    segments: Annotated[bool, typer.Option("--segments", help="The path itself: one row per segment (rank, start, end, kind, kernel, collective).")] = False,
    ranks: Annotated[bool, typer.Option("--ranks", help="Per rank over the steps: time on the path, share, steps on it, the waiting its lateness cost.")] = False,
    kernels: Annotated[bool, typer.Option("--kernels", help="The kernels and collectives most on the paths.")] = False,
    top: Annotated[int, typer.Option(help="Rows of --kernels.", min=1, max=10_000_000)] = 20,
    html: Annotated[Optional[Path], typer.Option(help="Also write the path as a self-contained HTML page: ranks as lanes, the path across them (the --step given, else the longest step).")] = None,
    steps: StepsOption = None,
    skip_steps: SkipStepsOption = None,
    drop_last: DropLastOption = False,
    include_last: IncludeLastOption = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Which rank, and which of its work, made each step as long as it was: the critical path across ranks.

    Per step, the walk starts at the end of the step on the rank whose device window ends last and goes
    back to the step's start. On a rank, time goes to what its device was doing: compute (with the
    kernel), the transfer part of a collective, memcpy/memset, or idle (host-bound, sync, other). Where
    the rank was waiting at a matched collective, the path jumps to the rank that arrived last, at the
    moment its kernel started, and goes on there. The segments add up to the step's span.

    Per step (default): span, the last rank to end, ranks crossed, jumps, time by kind (ms), the rank and
    the kernel most on the path, and a sentence saying it.

    Examples:

      traceq critical-path --run job1

      traceq critical-path --run job1 --step 12 --segments

      traceq critical-path --run job1 --ranks

      traceq critical-path --run job1 --html cp.html
    """
    from traceq.report.critical_path import critical_path as compute
    from traceq.report.critical_path import write_critical_path_html
    from traceq.report.selection import StepSelection

    if sum((segments, ranks, kernels)) > 1:
        _fail(ConfigError("give one of --segments, --ranks and --kernels"))
    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
        result = compute(db, run=run, selection=selection, steps=step)
        drawn = write_critical_path_html(str(html), result, step[0] if step else None) if html is not None else None
    except TraceqError as exc:
        _fail(exc)
        return
    if segments:
        table = result.segments.drop("instance_id", "trace_id")
    elif ranks:
        table = result.ranks()
    elif kernels:
        table = result.kernels(top)
    else:
        table = result.steps
    if fmt is Format.table:
        _echo(f"critical path of run {result.steps['run'][0]} ({_steps_note(selection)})", err=True)
        for note in result.notes:
            _echo(f"note: {note}", err=True)
        if not (segments or ranks or kernels):
            for s in result.steps["step"].to_list()[:20]:
                _echo(f"  {result.sentence(s)}", err=True)
    _emit(table, fmt, drop_first=("path_start_ns", "category", "process_group", "top_kernel_ms", "copy_ms", "wait_ms",
                                  "compute_ms", "waited_for", "steps"))
    if drawn is not None:
        _echo(f"wrote {html} (step {drawn})", err=True)


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="Side A: RUN, or RUN,rank=N and/or RUN,steps=a:b.")],
    b: Annotated[str, typer.Argument(help="Side B, the same way.")],
    db: DbOption = Path(DEFAULT_DB),
    skip_steps: Annotated[Optional[int], typer.Option(help="Leading profiled steps to skip on both sides (default: each run's warmup_steps metadata, else 0).")] = None,
    include_last: IncludeLastOption = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    html: Annotated[Optional[Path], typer.Option(help="Also write the diff as a self-contained HTML page.")] = None,
) -> None:
    """Compare two runs, two step ranges of a run, or two ranks: every metric, exposed comm per
    collective type and kernel time per category, as means over each side's rank-steps, with the
    delta (B − A) and whether it is larger than the step-to-step spread (the wider p90 − p10 of the
    two sides): a change the steps' own variation does not explain.

    Examples:

      traceq diff llama-8n llama-16n

      traceq diff llama-8n,steps=11:30 llama-8n,steps=31:60

      traceq diff llama-8n,rank=0 llama-8n,rank=3 --format csv
    """
    from traceq.report.diff import diff as compare
    from traceq.report.diff import write_diff_html

    notes = ["a, b: means over each side's selected rank-steps (ratios and rates: their sums' ratio); "
             "each rank's open last step left out unless --include-last; p10/p90: the spread of its steps; "
             "beyond_spread: |delta| > the wider p90 - p10 of the two sides",
             "metric rows are in each metric's unit; collective rows: exposed comm (us) per collective type; "
             "category rows: kernel time (us) launched per step, per kernel category"]
    try:
        table = compare(db, a, b, skip_steps=skip_steps, include_last=include_last)
        if html is not None:
            write_diff_html(table, str(html), a, b, notes)
    except TraceqError as exc:
        _fail(exc)
        return
    if fmt is Format.table:
        _echo(f"A = {a}, B = {b}", err=True)
        for note in notes:
            _echo(f"note: {note}", err=True)
    _emit(table, fmt, drop_first=("a_p10", "a_p90", "b_p10", "b_p90", "delta"))
    if html is not None:
        _echo(f"wrote {html}", err=True)


def _steps_note(selection: Any) -> str:
    skip = "the run's warmup_steps, 0 if unset" if selection.skip_steps is None else str(selection.skip_steps)
    parts = [f"warm-up steps skipped: {skip}"]
    if selection.step_min is not None or selection.step_max is not None:
        parts.append(f"steps {selection.step_min or ''}:{selection.step_max or ''}")
    parts.append("dropping every last step" if selection.drop_last
                 else "keeping the last step" if selection.include_last
                 else "leaving out the open last step (--include-last keeps it)")
    return ", ".join(parts)


def _emit(frame: Any, fmt: Format, drop_first: tuple[str, ...] = ()) -> None:
    """``frame`` as CSV, JSON or a table; a table wider than the terminal leaves columns out (the
    ``drop_first`` ones first, then as :func:`_fit` says) and says which."""
    if fmt in (Format.csv, Format.json):
        frame = _without_float_noise(frame)
    if fmt is Format.csv:
        import polars as pl

        from traceq.terminal import CONTROLS, ESCAPES

        buf = io.StringIO()
        text = [name for name in frame.columns if frame.schema[name] == pl.String]
        frame.with_columns(frame[c].str.replace_many(CONTROLS, ESCAPES) for c in text).write_csv(buf)
        typer.echo(buf.getvalue(), nl=False)
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
        if room is not None and sum(widths) + 3 * len(widths) + 1 > room:
            # text (a kernel's name, a path, a finding) is what names a row: it is wrapped, never cut,
            # in at least _TEXT_CELL characters, and figures are left out before it is narrowed further
            for i in text:
                widths[i] = min(full[i], max(_TEXT_CELL, len(frame.columns[i])))
        empty = {i for i in range(len(frame.columns)) if not any(r[i] for r in rows)}
        shown = _fit(frame.columns, widths, room, empty, drop_first, set(text))
        if room is not None:  # the room left goes back to the wrapped columns, the longest first
            spare = room - (sum(widths[i] for i in shown) + 3 * len(shown) + 1)
            for i in sorted((i for i in shown if i in text), key=lambda i: widths[i] - full[i]):
                grow = min(max(spare, 0), full[i] - widths[i])
                widths[i] += grow
                spare -= grow
        if len(shown) < len(frame.columns):
            left = [c for i, c in enumerate(frame.columns) if i not in shown]
            _echo(f"note: {len(left)} column(s) left out to fit the terminal: {', '.join(left)} "
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


@app.command()
def metrics(fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table) -> None:
    """List every metric with its unit and one-line definition.

    Example:

      traceq metrics --format csv
    """
    from traceq.report.metrics import list_metrics

    _emit(list_metrics(), fmt)


def runs(
    target: Annotated[Optional[list[str]], typer.Argument(metavar="[set|rm|rename] [RUN] [NEW]", help="A run to show; `set RUN` with the options below to set its metadata; `rm RUN` to remove it and all of its data; `rename RUN NEW`.")] = None,
    db: DbOption = Path(DEFAULT_DB),
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    traces: Annotated[bool, typer.Option("--traces", help="List the trace files instead: their run, ranks, steps, GPU and path.")] = False,
    **metadata: Any,
) -> None:
    """List the runs in the warehouse with their metadata, set metadata of one run, remove or rename one.

    Metadata comes from the collectors' rank<r>.run.json files; for traces recorded without them,
    set it here (values set here win over the collector's and survive later ingests). The peak of
    --gpu-model comes from traceq's table; a GPU the table does not know needs --peak-tflops with it.
    Removing and renaming are one transaction each; a name another run has is refused.

    Examples:

      traceq runs --db runs.duckdb

      traceq runs --traces --db runs.duckdb

      traceq runs set llama-8n --world-size 8 --tp 2 --tokens-per-step 4194304 --gpu-model 'H100 SXM' --db runs.duckdb

      traceq runs rename trace_filter recsys-128r --db runs.duckdb

      traceq runs rm old-attempt --db runs.duckdb
    """
    from traceq.report.runs import list_runs, list_traces
    from traceq.store.run_metadata import set_run_metadata

    words = list(target or [])
    action = words[0] if words and words[0] in ("set", "rm", "rename") else None
    if action is not None:
        words = words[1:]
    setting = action == "set"
    if action in ("rm", "rename"):
        _manage_run(action, words, db, bool({k: v for k, v in metadata.items() if v is not None}))
        words = []
    if len(words) > 1:
        _fail(f"traceq runs takes one run name, got {' '.join(words)}; e.g. traceq runs set RUN --tp 2")
        return
    given = {k: v for k, v in metadata.items() if v is not None}
    try:
        if given or setting:
            if not words:
                _fail("traceq runs set needs a run name: traceq runs set RUN --tokens-per-step N")
                return
            if not given:
                _fail(f"nothing to set for run {words[0]}; pass e.g. --tokens-per-step N (see traceq runs --help)")
                return
            set_run_metadata(db, words[0], given)
            _echo(f"set {', '.join(sorted(given))} of run {words[0]}", err=True)
        frame = list_traces(db) if traces else list_runs(db)
    except TraceqError as exc:
        _fail(exc)
        return
    if words:
        import polars as pl

        frame = frame.filter(pl.col("run") == words[0])
        if frame.height == 0:
            _fail(f"no run {words[0]!r} in {db}; `traceq runs` lists them")
            return
    # the path is what --traces is for: it stays, and the figures and labels beside it go first
    _emit(frame, fmt, drop_first=("step_marker", "device_events", "events", "first_step", "last_step", "rank_source",
                                  "gpu_model", "steps") if traces else ())


def _manage_run(action: str, words: list[str], db: Path, with_options: bool) -> None:
    """`traceq runs rm RUN` and `traceq runs rename RUN NEW` (then the runs are listed)."""
    from traceq.store.manage import remove_run, rename_run

    wanted = {"rm": ["RUN"], "rename": ["RUN", "NEW"]}[action]
    if len(words) != len(wanted) or with_options:
        _fail(f"usage: traceq runs {action} {' '.join(wanted)} (and no metadata options)")
    try:
        if action == "rm":
            removed = remove_run(db, words[0])
            rows = sum(n for table, n in removed.items() if table != "traces")
            _echo(f"removed run {words[0]}: {removed.get('traces', 0)} trace(s), {rows:,} rows", err=True)
        else:
            moved = rename_run(db, words[0], words[1])
            _echo(f"renamed run {words[0]} to {words[1]} ({moved} trace(s))", err=True)
    except TraceqError as exc:
        _fail(exc)


def _with_run_key_options(command: Any) -> Any:
    """``command`` with one option per settable run metadata key of the catalogue (--world-size, --tp,
    --gpu-model, ...): their names, types and help come from :data:`traceq.catalog.RUN_KEYS` alone."""
    signature = inspect.signature(command, eval_str=True)
    fixed = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    generated = [
        inspect.Parameter(
            key.key, inspect.Parameter.KEYWORD_ONLY, default=None,
            annotation=Annotated[Optional[key.kind], typer.Option(help=f"Set: {key.help}.")],
        )
        for key in RUN_KEYS
    ]
    command.__signature__ = signature.replace(parameters=[*fixed, *generated])
    command.__annotations__ = {**{p.name: p.annotation for p in fixed}, **{p.name: p.annotation for p in generated}}
    return command


app.command()(_with_run_key_options(runs))


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
    from traceq.store.frames import to_polars
    from traceq.store.schema import add_rules, list_rules
    from traceq.store.warehouse import opened

    try:
        with opened(db, read_only=add is None) as con:
            if add is not None:
                n = add_rules(con, add)
                total = con.execute("select count(*) from kernel_rules").fetchone()[0]
                _echo(f"added {n} rule(s) from {add}: {total} rule(s) now (traceq rules lists them)")
                return
            frame = to_polars(list_rules(con))
    except TraceqError as exc:
        _fail(exc)
        return
    _emit(frame, fmt)


@app.command()
def scaling(
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Run metadata columns that split runs into separate series, e.g. model,tp.")] = "",
    steps: StepsOption = None,
    skip_steps: SkipStepsOption = None,
    drop_last: DropLastOption = False,
    include_last: IncludeLastOption = False,
    run: RunOption = None,
    fmt: FormatOption = Format.table,
    html: Annotated[Optional[Path], typer.Option(help="Also write the HTML report (scaling curves with the ideal line) to this file.")] = None,
    metric: Annotated[Optional[str], typer.Option(help="A collective figure across runs instead of tokens/s: busbw_gbps, algbw_gbps, transfer_us or wait_us, per collective type.")] = None,
) -> None:
    """Scaling across runs: global tokens/s against world size, the ideal linear line from the
    smallest run, efficiency, marginal tokens/s per added GPU, MFU and tokens per joule. With
    --metric, a collective figure per collective type against world size and nodes instead
    (see `traceq collectives`).

    Examples:

      traceq scaling --db runs.duckdb --by model --html scaling.html

      traceq scaling --metric busbw_gbps

      traceq scaling --metric transfer_us --by model      # collective latency against nodes
    """
    from traceq.report.scaling import scaling_report
    from traceq.report.selection import StepSelection

    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
        if metric is not None:
            from traceq.report.collectives import collective_scaling

            if html is not None:
                raise ConfigError("draws the tokens/s scaling curves; with --metric, leave it out "
                                  "(`traceq report --html` shows busbw against message size)", param="html", value=str(html))

            frame, notes = collective_scaling(db, metric, by=by, selection=selection, runs=run)
            if fmt is Format.table:
                _echo(f"{metric} across {frame['run'].n_unique()} run(s) ({_steps_note(selection)})", err=True)
                for note in notes:
                    _echo(f"note: {note}", err=True)
            _emit(frame, fmt)
            return
        frame, notes, rows = scaling_report(db, by=by, selection=selection, runs=run)
        if html is not None:
            from traceq.report.html import write_html_report

            group = [c.strip() for c in by.split(",") if c.strip()]
            write_html_report(db, html, selection=selection, runs=run, scaling_by=group, steps=rows)
    except TraceqError as exc:
        _fail(exc)
        return
    if fmt is Format.table:
        _echo(f"scaling across {frame.height} run(s) ({_steps_note(selection)})", err=True)
    for note in notes:
        _echo(f"note: {note}", err=True)
    _emit(frame, fmt)
    if html is not None:
        _echo(f"wrote {html}", err=True)


@app.command()
def check(
    db: DbOption = Path(DEFAULT_DB),
    skew_threshold_us: Annotated[float, typer.Option(help="Report a rank's clock skew beyond this many microseconds.")] = 50.0,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Data-quality report: what to know about each trace and run before trusting a number.

    One row per finding: kernels overlapping on one stream, kernels without a launch event or
    launched by no step, device activity before the first step's window or after the last, windows
    that had to be moved to keep them in order, traces without steps (one window over the whole
    trace), devices with communication but no compute, ranks the file did not name, ranks whose
    steps two traces hold, missing metadata, incomplete steps, ranks with different step counts,
    clock skew between ranks (from the end times of the same collective), events dropped by ingest,
    duplicate events.

    Exit code: 0 when nothing needs attention (no finding, or only severity info); 1 when a
    finding has severity warning, or the warehouse cannot be read.

    Example:

      traceq check --db runs.duckdb --format json
    """
    from traceq.report.check import check_warehouse, needs_attention

    try:
        findings = check_warehouse(db, skew_threshold_us=skew_threshold_us)
    except TraceqError as exc:
        _fail(exc)
        return
    n_warn = findings.filter(findings["severity"] == "warning").height
    if fmt is Format.table:
        _echo(f"{n_warn} warning(s), {findings.height - n_warn} info finding(s) in {db}", err=True)
    if findings.height or fmt is not Format.table:
        _emit(findings, fmt, drop_first=("count", "rank", "path"))  # the finding (check, severity, detail) stays
    if needs_attention(findings):
        raise typer.Exit(code=1)


@app.command()
def export(
    parquet: Annotated[Optional[Path], typer.Option("--parquet", help="Output directory (hive-style run=/rank= folders) for the whole warehouse as Parquet.")] = None,
    perfetto: Annotated[Optional[Path], typer.Option("--perfetto", help="Output trace file (.pftrace) of the selected runs, ranks and steps, for ui.perfetto.dev.")] = None,
    db: DbOption = Path(DEFAULT_DB),
    overwrite: Annotated[bool, typer.Option(help="Replace an earlier export in the directory, or the trace file.")] = False,
    run: RunOption = None,
    steps: StepsOption = None,
    skip_steps: SkipStepsOption = None,
    drop_last: DropLastOption = False,
    include_last: IncludeLastOption = False,
    ranks: Annotated[Optional[str], typer.Option("--ranks", help="--perfetto: only these ranks, e.g. 0-7 or 0,2,5 (default: every rank).")] = None,
    critical_path: Annotated[bool, typer.Option("--critical-path", help="--perfetto: also each step's critical path across ranks (traceq critical-path): a track on each rank it crosses, an arrow where it jumps to the rank another waited for.")] = False,
) -> None:
    """Write the warehouse as Parquet (partitioned by run and rank), or runs as an annotated
    Perfetto trace: give exactly one of --parquet DIR and --perfetto FILE.

    Parquet: reports run on the directory directly (--db DIR); polars, DuckDB or Spark read it
    without traceq, e.g. polars.scan_parquet("DIR/gpu_events/**/*.parquet").

    Perfetto: one process per run and rank, all ranks of a run on one clock (the clock-skew
    estimate of `traceq check`), each GPU stream with its kernels named and classified, the steps,
    and per-step counters (exposed comm, overlapped comm, idle, waiting vs transfer, power). Open the
    file in https://ui.perfetto.dev. --run, --steps, --skip-steps, --drop-last and --ranks choose
    what it holds (the same steps as `traceq report`).

    Examples:

      traceq export --parquet runs_parquet --db runs.duckdb

      traceq report --metric exposed_comm --db runs_parquet

      traceq export --perfetto run.pftrace --run job1 --steps 11:14 --ranks 0-7

      traceq export --perfetto run.pftrace --run job1 --critical-path
    """
    if (parquet is None) == (perfetto is None):
        _fail("give one of --parquet DIR (the warehouse as Parquet) and --perfetto FILE (a trace for ui.perfetto.dev)")
    if parquet is not None:
        chosen = [o for o, given in (("--run", run is not None), ("--steps", steps is not None),
                                     ("--skip-steps", skip_steps is not None), ("--drop-last", drop_last),
                                     ("--include-last", include_last), ("--ranks", ranks is not None),
                                     ("--critical-path", critical_path)) if given]
        if chosen:
            _fail(f"{', '.join(chosen)}: only with --perfetto (they choose what the trace holds); --parquet writes the whole warehouse")
        from traceq.store.export import export_parquet

        try:
            written = export_parquet(db, parquet, overwrite=overwrite)
        except TraceqError as exc:
            _fail(exc)
            return
        tables = ", ".join(f"{name} {n:,}" for name, n in written.items() if n)
        _echo(f"exported {db} -> {parquet} (rows: {tables})")
        return
    from traceq.report.selection import StepSelection
    from traceq.report.timeline import export_perfetto

    try:
        selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
        done = export_perfetto(db, perfetto, runs=run, selection=selection, ranks=ranks, overwrite=overwrite,
                               critical_path=critical_path)
    except TraceqError as exc:
        _fail(exc)
        return
    for note in done.notes:
        _echo(f"note: {note}", err=True)
    _echo(f"wrote {perfetto}: {done.size_bytes / 1e6:,.1f} MB, {len(done.runs)} run(s), {done.processes} rank(s), "
               f"{done.slices:,} GPU events, {done.counter_values:,} counter values in {done.seconds:.1f} s; "
               "open it in https://ui.perfetto.dev")


@app.command()
def migrate(db: DbOption = Path(DEFAULT_DB)) -> None:
    """Bring a warehouse made by an older traceq up to this traceq's schema, in one transaction.

    Reports never write to the warehouse: on an older one they stop and name this command. A writing
    command (ingest, runs set/rm/rename, rules --add, import-parquet) migrates it too, and says so.
    A DuckDB file that is not a traceq warehouse, or one made by a newer traceq, is left untouched.

    Example:

      traceq migrate --db runs-2025.duckdb
    """
    from traceq.store.schema import SCHEMA_VERSION
    from traceq.store.warehouse import connect, migrations

    if not db.exists():
        _fail(f"{db}: no warehouse here; give --db the warehouse to migrate")
    try:
        connect(db).close()
    except TraceqError as exc:
        _fail(exc)
        return
    done = migrations()
    _echo(done[0] if done else f"{db}: already at schema {SCHEMA_VERSION}; nothing to do")


@app.command("ingest-cluster")
def ingest_cluster(
    inputs: Annotated[list[str], typer.Argument(help="Trace files, globs or directories, at paths every worker can read.")],
    parquet: Annotated[Path, typer.Option("--parquet", help="Output directory (same layout as `traceq export`), on storage every worker can write.")],
    scheduler: Annotated[Optional[str], typer.Option(help="Dask scheduler address, e.g. tcp://10.0.0.5:8786 (default: a local cluster).")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes of the local cluster (default: one per CPU); ignored with --scheduler.")] = None,
    run: Annotated[Optional[str], typer.Option(help="Run name for every file (default: the parent directory's name).")] = None,
    rank: Annotated[Optional[int], typer.Option(help="Rank for files that name none.")] = None,
) -> None:
    """Ingest traces on a Dask cluster, one task per file, into a Parquet directory.

    Needs the dask extra (pip install "traceq[dask]") here and on every worker. Files already in
    the directory are skipped. Report on the directory, or load it into a warehouse with
    `traceq import-parquet`.

    Example:

      traceq ingest-cluster /shared/runs/job1 --parquet /shared/tq/job1 --scheduler tcp://head:8786

      traceq report --metric exposed_comm --db /shared/tq/job1
    """
    from traceq.ingest.cluster import ingest_with_dask

    try:
        summary = ingest_with_dask(inputs, parquet, scheduler=scheduler, local_workers=workers, run=run, rank=rank)
    except TraceqError as exc:
        _fail(exc)
        return
    for note in summary.notes:
        _echo(f"note: {note}", err=True)
    for f in summary.files:
        if f.status == "failed":
            _echo(f"failed {f.message}", err=True)
        elif f.status == "skipped":
            _echo(f"skipped {f.message}")
    counts = {s: len(summary.by_status(s)) for s in ("ingested", "skipped", "failed")}
    _echo(f"{counts['ingested']} ingested, {counts['skipped']} skipped, {counts['failed']} failed -> {parquet}")
    if not summary.ok:
        raise typer.Exit(code=1)


@app.command("import-parquet")
def import_parquet_command(
    parquet: Annotated[Path, typer.Argument(help="Parquet directory written by `traceq export` or `traceq ingest-cluster`.")],
    db: DbOption = Path(DEFAULT_DB),
) -> None:
    """Load a Parquet directory into the warehouse (traces already in it are skipped).

    Example:

      traceq import-parquet /shared/tq/job1 --db runs.duckdb
    """
    from traceq.store.export import import_parquet

    try:
        added = import_parquet(parquet, db)
    except TraceqError as exc:
        _fail(exc)
        return
    _echo(f"imported {added} trace(s) from {parquet} -> {db}")


_OS_PHRASES = ("no space left on device", "read-only file system", "disk quota exceeded", "file too large")


def _environment_error(exc: BaseException) -> str | None:
    """One line for what the machine, not traceq, got wrong (a full disk, a read-only file system,
    no memory, a damaged warehouse file); None for anything else."""
    import duckdb

    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    if isinstance(exc, MemoryError | duckdb.OutOfMemoryException):
        return f"out of memory ({str(exc).splitlines()[0] if str(exc) else 'MemoryError'}); free memory or use a smaller input"
    if not isinstance(exc, duckdb.Error):
        return None
    first = str(exc).splitlines()[0]
    lower = first.lower()
    if any(phrase in lower for phrase in _OS_PHRASES):
        return f"{first}; the file system said no: free space, or use a writable place for --db and outputs"
    if isinstance(exc, duckdb.IOException | duckdb.SerializationException) or "corrupt" in lower:
        damaged = any(w in first.lower() for w in ("could not read enough bytes", "corrupt", "checksum", "serializ"))
        hint = ("; the warehouse file is damaged or cut short: copy it again, or ingest the traces into a new one"
                if damaged else "")
        return f"{first}{hint}"
    return None


def _interrupted_exit() -> None:
    from traceq.scratch import remove_process_scratch

    remove_process_scratch()
    os._exit(130)


def main() -> None:
    """Console-script entry point.

    When the command is done (its files closed, its connections closed), the process ends without
    tearing the interpreter down: freeing the modules of DuckDB, polars and pyarrow one by one takes
    0.03-0.04 s of a 0.5 s ``traceq report`` (0.50-0.51 vs 0.54-0.55 s, 4 runs each, alternated). The
    CLI's choice for its own process; the library ends nothing. An uncaught exception still ends it the
    usual way.
    """
    from traceq.scratch import remove_process_scratch, remove_stale_scratch_everywhere

    from traceq.interrupts import is_interrupt, noting_interrupts

    remove_stale_scratch_everywhere()  # what a killed ingest left, as soon as its owner is gone
    try:
        # Ctrl-C in a DuckDB statement comes out as DuckDB's error; a statement that heeds no signal
        # ends with the process, 6 s after Ctrl-C (its writes are a transaction DuckDB undoes)
        with noting_interrupts(knock_s=1.0, knocks=5, stuck=_interrupted_exit):
            app()  # click's standalone mode ends with SystemExit(int); Ctrl-C with SystemExit(130)
        code: Any = 0
    except SystemExit as exc:
        code = exc.code or 0
    except BaseException as exc:
        if is_interrupt(exc):
            code = 130  # as typer ends a KeyboardInterrupt: silently, 128 + SIGINT
        elif (message := _environment_error(exc)) is not None:
            _echo(f"error: {message}", err=True)
            code = 1
        else:
            raise  # a bug: the traceback is due
    remove_process_scratch()  # os._exit runs no atexit handlers
    sys.stdout.flush()  # click has made a closed pipe's stdout quiet (PacifyFlushWrapper)
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    main()
