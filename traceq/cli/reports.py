"""Commands that report: ``report``, ``summary``, ``kernels``, ``collectives``, ``stragglers``, ``diff``,
``scaling``, ``metrics`` (``critical-path``: :mod:`traceq.cli.paths`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from traceq.catalog import GROUP_COLUMNS
from traceq.cli.base import (
    DbOption,
    Engine,
    EngineOption,
    Format,
    FormatOption,
    FullNamesOption,
    IncludeLastOption,
    RunOption,
    TraceProcessorOption,
    WholeTraceOption,
    app,
    echo,
    emit,
    resolved,
    selecting_steps,
    show, shown)
from traceq.errors import ConfigError
from traceq.store.warehouse import DEFAULT_DB


@app.command()
@selecting_steps
def report(
    metric: Annotated[str, typer.Option(help="Metric name (see `traceq metrics`; the unit suffix may be left off), or several, comma-separated, side by side.")] = "exposed_comm",
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help=f"Grain: comma-separated subset of {', '.join(GROUP_COLUMNS)} (the last ones are run metadata).")] = "run,rank",
    whole_trace: Annotated[bool, typer.Option("--whole-trace", help="Report the whole timeline and every kernel, not the selected steps' windows.")] = False,
    run: Annotated[Optional[list[str]], typer.Option("--run", help="Only this run (repeatable).")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    html: Annotated[Optional[Path], typer.Option(callback=resolved, help="Also write a self-contained HTML report (plots, tables) of the selected runs and steps to this file.")] = None,
    traces: Annotated[Optional[list[str]], typer.Argument(help="With --engine perfetto: trace files, globs or directories, read directly (no warehouse).", show_default=False)] = None,
    engine: EngineOption = Engine.duckdb,
    trace_processor: TraceProcessorOption = None,
    name: Annotated[Optional[str], typer.Option("--name", metavar="RUN", help="With --engine perfetto: the run the trace files belong to (default: each file's directory's name, as traceq ingest --name).")] = None,
    rank: Annotated[Optional[int], typer.Option(help="With --engine perfetto: the rank of traces that name none.")] = None,
    step_marker: Annotated[Optional[str], typer.Option(help="With --engine perfetto: a regular expression on the names of the step spans (as traceq ingest --step-marker).")] = None,
    selection: Any = None,
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

    \b
      traceq report --metric overlap_ratio --by run --whole-trace --format json

    \b
      traceq report --metric tokens_per_s --by world_size,tp --html report.html

    \b
      traceq report --engine perfetto --metric exposed_comm --by run,rank,step runs/rank*.json.gz

    --engine perfetto computes the interval metrics (comm, compute, overlapped, exposed, idle, ...)
    with Perfetto's trace processor from the trace files themselves, independently of the DuckDB
    engine; it finds the binary from --trace-processor, then $TRACEQ_TRACE_PROCESSOR, then the
    perfetto package's download. There --name RUN names the files' run (default: each file's
    directory) and --rank N the rank of files that name none.
    """
    from traceq.catalog import BREAKDOWNS
    from traceq.report.metrics import metric_names, metric_report

    if engine is Engine.perfetto or traces:
        result = _perfetto_report(traces, engine, metric, by, whole_trace, selection, run, name, rank, html,
                                  trace_processor, step_marker)
    elif name is not None:
        raise ConfigError("names the run of trace files read with --engine perfetto; the warehouse's runs are "
                          "selected with --run", param="name", value=name)
    elif step_marker is not None:
        raise ConfigError("the warehouse keeps the marker each file was ingested with; ingest again with "
                          "--step-marker, or read the traces with --engine perfetto", param="step_marker", value=step_marker)
    else:
        result = metric_report(db, metric, by=by, whole_trace=whole_trace, selection=selection, runs=run,
                               cross_rank=html is not None and not whole_trace)  # the page shows waiting too
    if html is not None:
        from traceq.report.html import write_html_report

        # the report's step rows serve the page too, unless they are per collective or the whole trace
        reuse = not whole_trace and not set(metric_names(metric)) & set(BREAKDOWNS)
        write_html_report(db, html, selection=selection, runs=run, steps=result.rows if reuse else None)
    show(result, fmt)
    if html is not None:
        echo(f"wrote {shown(html)}", err=True)


def _perfetto_report(traces: list[str] | None, engine: Engine, metric: str, by: str, whole_trace: bool,
                     selection: Any, run: list[str] | None, name: str | None, rank: int | None, html: Path | None,
                     trace_processor: Path | None, step_marker: str | None) -> Any:
    """``report --engine perfetto``: the checks of its options, then the report."""
    from traceq.perfetto.engine import perfetto_report
    from traceq.perfetto.processor import trace_processor_binary

    if engine is not Engine.perfetto:
        raise ConfigError("trace files are read by --engine perfetto; for the DuckDB engine ingest them first "
                          "(traceq ingest TRACES), then report on the warehouse", param="traces", value=" ".join(traces or ()))
    if not traces:
        raise ConfigError("give the trace files to read (the Perfetto engine reads no warehouse)", param="engine", value="perfetto")
    if html is not None:
        raise ConfigError("the HTML report reads the warehouse: use --engine duckdb", param="html", value=str(html))
    if run:
        raise ConfigError("the Perfetto engine reports the trace files given; --name RUN names their run",
                          param="run", value=",".join(run))
    return perfetto_report(traces, metric, by=by, whole_trace=whole_trace, selection=selection,
                           name=name, rank=rank, binary=trace_processor_binary(trace_processor),
                           step_marker=step_marker)


@app.command()
@selecting_steps
def summary(
    traces: Annotated[Optional[list[str]], typer.Argument(help="Trace files, globs or directories to summarise without a warehouse (ingested into a temporary one); default: the warehouse's runs.")] = None,
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Grain: comma-separated run, rank, device, step or run metadata columns.")] = "run,rank",
    run: RunOption = None,
    fmt: FormatOption = Format.table,
    html: Annotated[Optional[Path], typer.Option(callback=resolved, help="Also write the summary as a self-contained HTML page (the shares as stacked bars, the table).")] = None,
    selection: Any = None,
) -> None:
    """Where each GPU's step time goes, on one screen: step time, then compute, overlapped comm,
    exposed comm, exposed memcpy and idle as ms per step and as % of the device window (compute +
    exposed comm + exposed memcpy + idle = 100 %), then tokens/s, MFU and power where known.

    Examples:

      traceq summary --db runs.duckdb

      traceq summary runs/job1/*.json.gz          # no warehouse kept

      traceq summary --by run --steps 11:60 --format csv

    \b
      traceq summary --by run,rank,step --run llama-8n --html steps.html   # step by step
    """
    from traceq.ingest import temporary_warehouse
    from traceq.report.summary import summary as summarise
    from traceq.report.summary import write_summary_html

    if traces:
        with temporary_warehouse(traces) as (db, ingested):
            for f in ingested.by_status("failed"):
                echo(f"failed {f.message}", err=True)
            for note in [*ingested.notes, *(n for f in ingested.files for n in f.notes)]:
                echo(f"note: {note}", err=True)
            result = summarise(db, by=by, selection=selection, runs=run)
    else:
        result = summarise(db, by=by, selection=selection, runs=run)
    if html is not None:
        write_summary_html(result, html, by)
    show(result, fmt)
    if html is not None:
        echo(f"wrote {shown(html)}", err=True)


@app.command()
@selecting_steps
def kernels(
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Grain: comma-separated run, rank, step.")] = "run",
    level: Annotated[str, typer.Option(help="kernel (one row per kernel name) or category (gemm, attention, elementwise, norm, optimizer, nccl, memcpy, other, ...).")] = "kernel",
    top: Annotated[int, typer.Option(help="Rows per group of --by, the most device time first.")] = 20,
    unclassified: Annotated[bool, typer.Option("--unclassified", help="Only kernels no rule classifies (category other): candidates for `traceq rules --add`.")] = False,
    run: RunOption = None,
    fmt: FormatOption = Format.table,
    full_names: FullNamesOption = False,
    selection: Any = None,
) -> None:
    """The kernels (or categories) the device time goes to, over the selected steps: count, total,
    share of the group's kernel time, mean, min and max duration. A kernel counts in the step that
    launched it; durations are summed (kernels side by side count twice). The table shows kernel
    names short (at most 60 characters, unique within the table); --full-names, CSV and JSON keep
    them whole.

    Examples:

      traceq kernels --top 10

      traceq kernels --level category --by run,rank

    \b
      traceq kernels --unclassified --format csv      # then write rules for them: traceq rules --add
    """
    from traceq.report.kernels import kernel_report

    show(kernel_report(db, by=by, level=level, top=top, selection=selection, runs=run, unclassified=unclassified), fmt,
         full_names)


@app.command()
@selecting_steps
def collectives(
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Grain: comma-separated run, collective_type, process_group, size_bucket, inter_node (collective_type brings nccl_algo and nccl_proto).")] = "run,collective_type,process_group,size_bucket",
    instances: Annotated[bool, typer.Option("--instances", help="One row per communication kernel instead: its instance, rank, wait and transfer (every step).")] = False,
    whole_trace: WholeTraceOption = False,
    run: RunOption = None,
    fmt: FormatOption = Format.table,
    selection: Any = None,
) -> None:
    """Collectives matched across the ranks of each run: per collective type, process group and
    message size, the instances, their mean size, transfer time and per-rank wait, and the algorithm
    and bus bandwidth (nccl-tests conventions). An instance's transfer is its shortest kernel over
    the ranks (the last to arrive waited least); the rest of each rank's kernel is waiting. Kernels
    that cannot be matched (a rank missing, no process group, point-to-point) are rows of their own
    whose bandwidth comes from the kernel's whole duration: a lower bound. Beside the collective type,
    nccl_algo and nccl_proto: NCCL's algorithm and protocol as far as the kernel's name establishes
    them (a type with several gets a row for each; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING logs them).

    Examples:

      traceq collectives --run llama7b-256n

      traceq collectives --by collective_type,size_bucket --format csv

      traceq collectives --instances --run llama7b-256n --format json
    """
    from traceq.report.collectives import collectives_report, instances_report

    if instances:
        show(instances_report(db, runs=run), fmt)
    else:
        show(collectives_report(db, by=by, selection=selection, whole_trace=whole_trace, runs=run), fmt)


@app.command()
@selecting_steps
def stragglers(
    db: DbOption = Path(DEFAULT_DB),
    by_step: Annotated[bool, typer.Option("--by-step", help="One row per rank and step, not per rank.")] = False,
    whole_trace: WholeTraceOption = False,
    run: RunOption = None,
    fmt: FormatOption = Format.table,
    selection: Any = None,
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
    from traceq.report.collectives import stragglers_report

    show(stragglers_report(db, by_step=by_step, selection=selection, whole_trace=whole_trace, runs=run), fmt)


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="Side A: RUN, or RUN,rank=N and/or RUN,steps=a:b.")],
    b: Annotated[str, typer.Argument(help="Side B, the same way.")],
    db: DbOption = Path(DEFAULT_DB),
    skip_steps: Annotated[Optional[int], typer.Option(help="Leading profiled steps to skip on both sides (default: each run's warmup_steps metadata, else 0).")] = None,
    include_last: IncludeLastOption = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    html: Annotated[Optional[Path], typer.Option(callback=resolved, help="Also write the diff as a self-contained HTML page.")] = None,
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

    result = compare(db, a, b, skip_steps=skip_steps, include_last=include_last)
    if html is not None:
        write_diff_html(result, html, a, b)
    show(result, fmt)
    if html is not None:
        echo(f"wrote {shown(html)}", err=True)


@app.command()
@selecting_steps
def scaling(
    db: DbOption = Path(DEFAULT_DB),
    by: Annotated[str, typer.Option(help="Run metadata columns that split runs into separate series, e.g. model,tp.")] = "",
    run: RunOption = None,
    fmt: FormatOption = Format.table,
    html: Annotated[Optional[Path], typer.Option(callback=resolved, help="Also write the HTML report (scaling curves with the ideal line) to this file.")] = None,
    metric: Annotated[Optional[str], typer.Option(help="A collective figure across runs instead of tokens/s: busbw_gbps, algbw_gbps, transfer_us or wait_us, per collective type.")] = None,
    selection: Any = None,
) -> None:
    """Scaling across runs: global tokens/s against world size, the ideal linear line from the
    smallest run, efficiency, marginal tokens/s per added GPU, MFU and tokens per joule. With
    --metric, a collective figure per collective type against world size and nodes instead
    (see `traceq collectives`).

    Examples:

      traceq scaling --db runs.duckdb --by model --html scaling.html

      traceq scaling --metric busbw_gbps

    \b
      traceq scaling --metric transfer_us --by model      # collective latency against nodes
    """
    from traceq.report.scaling import scaling_report

    if metric is not None:
        from traceq.report.collectives import collective_scaling

        if html is not None:
            raise ConfigError("draws the tokens/s scaling curves; with --metric, leave it out "
                              "(`traceq report --html` shows busbw against message size)", param="html", value=str(html))

        show(collective_scaling(db, metric, by=by, selection=selection, runs=run), fmt)
        return
    result = scaling_report(db, by=by, selection=selection, runs=run)
    if html is not None:
        from traceq.report.html import write_html_report

        group = [c.strip() for c in by.split(",") if c.strip()]
        write_html_report(db, html, selection=selection, runs=run, scaling_by=group, steps=result.rows)
    show(result, fmt)
    if html is not None:
        echo(f"wrote {shown(html)}", err=True)


@app.command()
def metrics(fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table) -> None:
    """List every metric with its unit and one-line definition.

    Example:

      traceq metrics --format csv
    """
    from traceq.report.metrics import list_metrics

    emit(list_metrics(), fmt)
