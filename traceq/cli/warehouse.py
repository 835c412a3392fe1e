"""Commands on the warehouse itself: ``runs``, ``rules``, ``check``, ``sql``, ``export``."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from traceq.catalog import RUN_KEYS
from traceq.cli.base import (
    DbOption,
    DropLastOption,
    Engine,
    EngineOption,
    Format,
    FormatOption,
    IncludeLastOption,
    RunOption,
    SkipStepsOption,
    StepsOption,
    TraceProcessorOption,
    app,
    echo,
    emit,
    resolved,
    show, shown)
from traceq.errors import ConfigError
from traceq.store.warehouse import DEFAULT_DB


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


class RunCommands(TyperGroup):
    """``traceq runs``' subcommands (set, rm, rename); a word that names none of them is said in one line
    with the command that shows one run."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            raise ConfigError(f"traceq runs has no command {args[0]!r} (set, rm, rename); "
                              f"to show one run: traceq runs --run {args[0]}")
        return super().resolve_command(ctx, args)


runs_app = typer.Typer(cls=RunCommands, add_completion=False, rich_markup_mode=None)
app.add_typer(runs_app, name="runs")


@runs_app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context,
    db: DbOption = Path(DEFAULT_DB),
    run: RunOption = None,
    traces: Annotated[bool, typer.Option("--traces", help="List the trace files instead: their run, ranks, steps, GPU and path.")] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """List the runs in the warehouse with their metadata; set metadata of one run, remove or rename one.

    Metadata comes from the collectors' rank<r>.run.json files; for traces recorded without them,
    set it here (values set here win over the collector's and survive later ingests). The peak of
    --gpu-model comes from traceq's table; a GPU the table does not know, or a name that could mean
    several of its GPUs (H100: SXM, PCIe, NVL), needs --peak-tflops with it (or the full model).
    Removing and renaming are one transaction each; a name another run has is refused.

    Examples:

      traceq runs --db runs.duckdb

      traceq runs --traces --run llama-8n --db runs.duckdb

    \b
      traceq runs set llama-8n --world-size 8 --tp 2 --tokens-per-step 4194304 --gpu-model 'H100 SXM' --db runs.duckdb

      traceq runs rename trace_filter recsys-128r --db runs.duckdb

      traceq runs rm old-attempt --db runs.duckdb
    """
    from traceq.report.runs import runs_report

    if ctx.invoked_subcommand is None:
        show(runs_report(db, traces=traces, runs=run), fmt)


RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run's name (traceq runs lists them).", show_default=False)]


@runs_app.command("set")
@_with_run_key_options
def set_metadata(run: RunArgument, db: DbOption = Path(DEFAULT_DB), fmt: FormatOption = Format.table,
                 **metadata: Any) -> None:
    """Set metadata of one run (the options below); then show the run.

    Example:

    \b
      traceq runs set llama-8n --world-size 8 --tp 2 --tokens-per-step 4194304 --gpu-model 'H100 SXM'
    """
    from traceq.report.runs import runs_report
    from traceq.store.run_metadata import set_run_metadata

    given = {k: v for k, v in metadata.items() if v is not None}
    if not given:
        raise ConfigError(f"nothing to set for run {run}; pass e.g. --tokens-per-step N (traceq runs set --help)")
    set_run_metadata(db, run, given)
    echo(f"set {', '.join(sorted(given))} of run {run}", err=True)
    show(runs_report(db, runs=[run]), fmt)


@runs_app.command("rm")
def remove(run: RunArgument, db: DbOption = Path(DEFAULT_DB), fmt: FormatOption = Format.table) -> None:
    """Remove a run and all of its data, in one transaction; then list the runs left.

    Example:

      traceq runs rm old-attempt
    """
    from traceq.report.runs import runs_report
    from traceq.store.manage import remove_run

    removed = remove_run(db, run)
    rows = sum(n for table, n in removed.items() if table != "traces")
    echo(f"removed run {run}: {removed.get('traces', 0)} trace(s), {rows:,} rows", err=True)
    show(runs_report(db), fmt)


@runs_app.command("rename")
def rename(run: RunArgument, new: Annotated[str, typer.Argument(metavar="NEW", help="Its new name (one no other run has).", show_default=False)],
           db: DbOption = Path(DEFAULT_DB), fmt: FormatOption = Format.table) -> None:
    """Rename a run, in one transaction; then list the runs.

    Example:

      traceq runs rename trace_filter recsys-128r
    """
    from traceq.report.runs import runs_report
    from traceq.store.manage import rename_run

    moved = rename_run(db, run, new)
    echo(f"renamed run {run} to {new} ({moved} trace(s))", err=True)
    show(runs_report(db), fmt)


@app.command()
def rules(
    add: Annotated[Optional[Path], typer.Option(help="CSV of rules to add: priority,pattern,class,category,collective.")] = None,
    db: DbOption = Path(DEFAULT_DB),
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Show the kernel classification rules, or add your own (they apply to data already ingested).

    The table shows how many there are and the first screen of them; --format csv lists every rule.
    A warehouse holds at most 10,000 rules of your own.

    A rule is an RE2 regular expression on the kernel name; the lowest priority that matches wins
    (user rules win ties). Example, to count a custom all-reduce kernel as communication:

      echo 'priority,pattern,class,category,collective' > my_rules.csv

      echo '5,^my_allreduce_kernel,comm,custom,AllReduce' >> my_rules.csv

      traceq rules --add my_rules.csv
    """
    from traceq.store.manage import add_rule_file
    from traceq.store.manage import rules as rule_table

    if add is not None:
        added, total = add_rule_file(db, add)
        echo(f"added {added} rule(s) from {add}: {total} rule(s) now (traceq rules lists them)")
        return
    frame = rule_table(db)
    if fmt is Format.table:
        user = frame.filter(frame["source"] == "user").height
        on_screen = min(frame.height, RULES_SCREEN)
        echo(f"{frame.height:,} rules ({frame.height - user:,} builtin, {user:,} yours)"
             + (f"; the first {on_screen:,} (the ones that win first) shown: --format csv lists them all"
                if on_screen < frame.height else ""), err=True)
        frame = frame.head(on_screen)
    emit(frame, fmt)


RULES_SCREEN = 40  # rules a table shows (CSV and JSON: every rule)


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
    duplicate events, values of a collector's run.json or power log left out (not numbers).

    Exit code: 0 when nothing needs attention (no finding, or only severity info); 1 when a
    finding has severity warning, or the warehouse cannot be read.

    Example:

      traceq check --db runs.duckdb --format json
    """
    from traceq.report.check import check_warehouse, needs_attention

    findings = check_warehouse(db, skew_threshold_us=skew_threshold_us)
    if findings.table.height or fmt is not Format.table:
        show(findings, fmt)
    else:
        echo(findings.title, err=True)
    if needs_attention(findings):
        raise typer.Exit(code=1)


@app.command()
def sql(
    words: Annotated[list[str], typer.Argument(metavar="[TRACE] QUERY", help="The query; with --engine perfetto, the trace file before it.", show_default=False)],
    db: DbOption = Path(DEFAULT_DB),
    engine: EngineOption = Engine.duckdb,
    trace_processor: TraceProcessorOption = None,
    rank: Annotated[Optional[int], typer.Option(help="With --engine perfetto: the rank of a trace that names none.")] = None,
    step_marker: Annotated[Optional[str], typer.Option(help="With --engine perfetto: a regular expression on the names of the step spans (as traceq ingest --step-marker).")] = None,
    max_rows: Annotated[int, typer.Option("--max-rows", help="Print at most this many rows (the query's first ones), and say so when there were more.", min=1)] = 100_000,
    max_mb: Annotated[float, typer.Option("--max-mb", help="Hold at most this many MB of rows (the query's first ones; --engine duckdb), and say so when there were more.", min=0.001)] = 64,
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

    \b
      traceq sql "select class, count(*), sum(dur_ns) from gpu_activity group by class"

    \b
      traceq sql --engine perfetto runs/rank0.json.gz "select scope, step, exposed_comm_ns from traceq_interval_breakdown"
    """
    from traceq.perfetto.engine import trace_sql
    from traceq.report.adhoc import warehouse_sql
    from traceq.perfetto.processor import trace_processor_binary

    if engine is Engine.perfetto:
        if len(words) != 2:
            raise ConfigError("give one trace file, then the query", param="words", value=" ".join(words))
        result = trace_sql(words[1], Path(words[0]), rank=rank, binary=trace_processor_binary(trace_processor),
                           step_marker=step_marker, max_rows=max_rows)
    else:
        if step_marker is not None:
            raise ConfigError("the warehouse keeps the marker each file was ingested with", param="step_marker", value=step_marker)
        if len(words) != 1:
            raise ConfigError("give the query alone (the DuckDB engine reads the warehouse, --db); "
                              "to query a trace file use --engine perfetto", param="words", value=" ".join(words))
        result = warehouse_sql(words[0], db, max_rows=max_rows, max_bytes=int(max_mb * 1e6))
    show(result, fmt)


@app.command()
def export(
    parquet: Annotated[Optional[Path], typer.Option("--parquet", callback=resolved, help="Output directory (hive-style run=/rank= folders) for the whole warehouse as Parquet.")] = None,
    perfetto: Annotated[Optional[Path], typer.Option("--perfetto", callback=resolved, help="Output trace file (.pftrace) of the selected runs, ranks and steps, for ui.perfetto.dev.")] = None,
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

    \b
      traceq export --perfetto run.pftrace --run job1 --steps 11:14 --ranks 0-7

      traceq export --perfetto run.pftrace --run job1 --critical-path
    """
    if (parquet is None) == (perfetto is None):
        raise ConfigError("give one of --parquet DIR (the warehouse as Parquet) and --perfetto FILE (a trace for ui.perfetto.dev)")
    if parquet is not None:
        chosen = [o for o, given in (("--run", run is not None), ("--steps", steps is not None),
                                     ("--skip-steps", skip_steps is not None), ("--drop-last", drop_last),
                                     ("--include-last", include_last), ("--ranks", ranks is not None),
                                     ("--critical-path", critical_path)) if given]
        if chosen:
            raise ConfigError(f"{', '.join(chosen)}: only with --perfetto (they choose what the trace holds); --parquet writes the whole warehouse")
        from traceq.store.export import export_parquet

        written = export_parquet(db, parquet, overwrite=overwrite)
        tables = ", ".join(f"{name} {n:,}" for name, n in written.items() if n)
        echo(f"exported {shown(db)} -> {shown(parquet)} (rows: {tables})")
        return
    from traceq.report.selection import StepSelection
    from traceq.perfetto.timeline import export_perfetto

    selection = StepSelection.parse(steps, skip_steps, drop_last, include_last)
    done = export_perfetto(db, perfetto, runs=run, selection=selection, ranks=ranks, overwrite=overwrite,
                           critical_path=critical_path)
    for note in done.notes:
        echo(f"note: {note}", err=True)
    echo(f"wrote {shown(perfetto)}: {done.size_bytes / 1e6:,.1f} MB, {len(done.runs)} run(s), {done.processes} rank(s), "
               f"{done.slices:,} GPU events, {done.counter_values:,} counter values in {done.seconds:.1f} s; "
               "open it in https://ui.perfetto.dev")


