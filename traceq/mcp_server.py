"""traceq for coding agents: an MCP server on stdio (``traceq mcp``; the official ``mcp`` SDK, ``pip install
'traceq[mcp]'``) whose tools are the read-only reports and the sandboxed SQL console (docs/how-to/mcp.md).

Each tool calls the Python API on the warehouse (a path: every call opens it read-only and closes it) and
gives the report back as data (:class:`ToolReport`): its title, columns, its first ``max_rows`` rows (default
:data:`SHOWN_ROWS`, at most :data:`MOST_ROWS`), how many rows the table has, and its notes whole (with one
more saying how to get the rest when rows were left out). A bad argument (an unknown run, a bad metric or
steps, SQL that writes) is the tool's error result, its text traceq's message naming the fix; the server
goes on to the next call.

Imported only by ``traceq mcp``: it needs the ``mcp`` SDK (and its pydantic), which ``import traceq`` never loads.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

from pydantic import Field

import traceq
from traceq.errors import TraceqError
from traceq.report.result import Report
from traceq.report.selection import StepSelection

SHOWN_ROWS = 100  # rows a tool gives unless asked for more
MOST_ROWS = 10_000  # rows a tool gives at most (more: the command line's --format csv)

INSTRUCTIONS = (
    "traceq's reports on one warehouse of PyTorch profiler traces, read-only: start with `runs` (the runs and "
    "their metadata) and `summary` (where each GPU's step time goes); then `report` (any metric, `metrics` lists "
    "them), `kernels`, `collectives`, `stragglers`, `critical_path` (which rank and kernel held each step), "
    "`diff` (two runs, step ranges or ranks) and `sql` (your own DuckDB query over traceq's relations). "
    "Each gives a table (rows, up to max_rows) and notes to read beside it: steps used, conventions, what is missing."
)
SQL_FIX = ("the sql tool reads the warehouse and nothing else: give one SELECT (or WITH ... SELECT) over its "
           "tables and traceq's relations; writes, COPY, ATTACH, INSTALL, SET and other files are refused")


class ToolReport(TypedDict):
    """A report as a tool gives it: ``rows`` (the first ``max_rows`` of the table, one object per row, keyed
    by ``columns``), ``row_count`` (the table's rows; for ``sql``, counted up to :data:`MOST_ROWS`) and
    ``notes`` (what to read beside it)."""

    title: str
    columns: list[str]
    rows: list[dict[str, Any]]
    row_count: int
    notes: list[str]


def tool_report(report: Report, max_rows: int, tool: str, command: str, counted_to: int | None = None) -> ToolReport:
    """``report`` as :class:`ToolReport`: its table's first ``max_rows`` rows as JSON values, and a note
    saying how many there are and how to get them all (``tool`` again with more rows, or ``command``, the
    command line, when they are more than :data:`MOST_ROWS`). ``counted_to``: the table holds at most this
    many of the rows (a query's first ones), so a table as long may stand for more."""
    table, notes = report.table, list(report.notes)
    if table.height > max_rows:
        more = counted_to is not None and table.height >= counted_to
        fix = (f"call {tool} again with max_rows={table.height} for all of them" if not more and table.height <= MOST_ROWS
               else f"narrow the selection, or run `{command} --format csv` for all of them")
        notes.append(f"{'at least ' if more else ''}{table.height:,} rows: the first {max_rows:,} are given "
                     f"(max_rows={max_rows}); {fix}")
    return ToolReport(title=report.title, columns=list(table.columns), row_count=table.height,
                      rows=[{k: json_value(v) for k, v in row.items()} for row in table.head(max_rows).to_dicts()],
                      notes=[str(n) for n in notes])


def json_value(value: Any) -> Any:
    """``value`` (a cell of a polars table) as JSON holds it: NaN and infinities as null, times as ISO 8601
    text, durations in seconds, decimals as integers where whole (else floats), lists and structs element by element."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):  # DuckDB's sum of integers: exact as a JSON integer
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.hex()
    return value


# one call at a time: the SDK runs each in a thread of its own, and the SQL console's connection closes
# the database to files and settings (DuckDB's are the database's, which connections open at once share)
_ONE_CALL = threading.Lock()


def answering(fix: str = "") -> Callable[[Callable[..., ToolReport]], Callable[..., ToolReport]]:
    """A tool run one call at a time, whose traceq errors (a bad argument: their message names it and the
    fix) are the tool's error result, ``fix`` after them, as are the machine's (one line, as the command line
    says them); the SDK gives any other exception's text to no one (a bug, its traceback on stderr)."""
    from mcp.server.mcpserver.exceptions import ToolError

    from traceq.store.warehouse import environment_error

    def wrap(tool: Callable[..., ToolReport]) -> Callable[..., ToolReport]:
        @functools.wraps(tool)
        def answered(*args: Any, **kwargs: Any) -> ToolReport:
            try:
                with _ONE_CALL:
                    return tool(*args, **kwargs)
            except TraceqError as exc:
                raise ToolError(f"{exc}" + (f" ({fix})" if fix else "")) from None
            except Exception as exc:  # what the machine got wrong (a full disk, no memory, a damaged file) is said too
                machine = environment_error(exc)
                if machine is None:
                    raise
                raise ToolError(machine) from None

        return answered

    return wrap


# the arguments the tools share, named and described as the Python API's
Runs = Annotated[list[str] | str | None, Field(description="Only these runs (a name, or a list of names; the `runs` tool lists them); default: every run.")]
Steps = Annotated[str | None, Field(description="Step numbers (N of ProfilerStep#N), inclusive: '11:60', '5:' (step 5 on), '12' (one step).")]
SkipSteps = Annotated[int | None, Field(ge=0, description="Leading profiled steps to skip (default: the run's warmup_steps metadata, else 0).")]
DropLast = Annotated[bool, Field(description="Drop each rank's last step always (what HTA does).")]
IncludeLast = Annotated[bool, Field(description="Keep each rank's last step (left out by default: its device window is open).")]
WholeTrace = Annotated[bool, Field(description="The whole trace, not only the selected steps.")]
MaxRows = Annotated[int, Field(ge=1, le=MOST_ROWS, description=f"Rows to give, the table's first; a note says how many there are. At most {MOST_ROWS:,}.")]


def _runs(run: list[str] | str | None) -> list[str] | None:
    return [run] if isinstance(run, str) else run


def _selection(steps: str | None, skip_steps: int | None, drop_last: bool, include_last: bool) -> StepSelection:
    return StepSelection.parse(steps, skip_steps, drop_last, include_last)


class Tools:
    """The tools on one warehouse, ``db``: each a method whose docstring is what an agent reads."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def runs(self, run: Runs = None, traces: Annotated[bool, Field(description="The trace files instead: run, rank, steps, GPU, path.")] = False,
             max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """The runs in the warehouse with their metadata (world size, GPU, tokens per step, ...), or their trace files."""
        from traceq.report.runs import runs_report

        return tool_report(runs_report(self.db, traces=traces, runs=_runs(run)), max_rows, "runs", "traceq runs")

    def metrics(self, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """Every metric the `report` tool takes, with its unit and one-line definition."""
        return tool_report(Report(traceq.list_metrics(), title="metrics"), max_rows, "metrics", "traceq metrics")

    def report(self, metric: Annotated[str, Field(description="Metric name (the `metrics` tool lists them; the unit suffix may be left off), or several, comma-separated.")] = "exposed_comm",
               by: Annotated[str, Field(description="Grain: comma-separated run, rank, step, device or run metadata columns (world_size, tp, model, ...).")] = "run,rank",
               run: Runs = None, steps: Steps = None, skip_steps: SkipSteps = None, drop_last: DropLast = False,
               include_last: IncludeLast = False, whole_trace: WholeTrace = False, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """A metric aggregated across steps, ranks and runs (mean, median, p10, p90 of the steps; mean, min, max and the slowest rank or run), as `traceq report`."""
        result = traceq.metric_report(self.db, metric, by=by, whole_trace=whole_trace, runs=_runs(run),
                                      selection=_selection(steps, skip_steps, drop_last, include_last))
        return tool_report(result, max_rows, "report", "traceq report")

    def summary(self, by: Annotated[str, Field(description="Grain: comma-separated run, rank, device, step or run metadata columns.")] = "run,rank",
                run: Runs = None, steps: Steps = None, skip_steps: SkipSteps = None, drop_last: DropLast = False,
                include_last: IncludeLast = False, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """Where each GPU's step time goes: step time, compute, overlapped and exposed comm, exposed memcpy and idle (ms and % of the device window), tokens/s, MFU and power where known."""
        result = traceq.summary(self.db, by=by, runs=_runs(run), selection=_selection(steps, skip_steps, drop_last, include_last))
        return tool_report(result, max_rows, "summary", "traceq summary")

    def kernels(self, by: Annotated[str, Field(description="Grain: comma-separated run, rank, step.")] = "run",
                level: Annotated[str, Field(description="kernel (one row per kernel name) or category (gemm, attention, nccl, ...).")] = "kernel",
                top: Annotated[int, Field(ge=1, description="Rows per group of by, the most device time first.")] = 20,
                unclassified: Annotated[bool, Field(description="Only kernels no rule classifies (category other).")] = False,
                run: Runs = None, steps: Steps = None, skip_steps: SkipSteps = None, drop_last: DropLast = False,
                include_last: IncludeLast = False, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """The kernels (or categories) the device time goes to over the selected steps: count, total, share, mean, min and max duration."""
        result = traceq.kernel_report(self.db, by=by, level=level, top=top, unclassified=unclassified, runs=_runs(run),
                                      selection=_selection(steps, skip_steps, drop_last, include_last))
        return tool_report(result, max_rows, "kernels", "traceq kernels")

    def collectives(self, by: Annotated[str, Field(description="Grain: comma-separated run, collective_type, process_group, size_bucket, inter_node.")] = "run,collective_type,process_group,size_bucket",
                    instances: Annotated[bool, Field(description="One row per communication kernel instead (its instance, rank, wait and transfer; every step).")] = False,
                    run: Runs = None, steps: Steps = None, skip_steps: SkipSteps = None, drop_last: DropLast = False,
                    include_last: IncludeLast = False, whole_trace: WholeTrace = False, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """Collectives matched across the ranks of each run: instances, mean size, transfer time, per-rank wait, algorithm and bus bandwidth (nccl-tests conventions)."""
        if instances:
            result = traceq.instances_report(self.db, runs=_runs(run))
        else:
            result = traceq.collectives_report(self.db, by=by, whole_trace=whole_trace, runs=_runs(run),
                                               selection=_selection(steps, skip_steps, drop_last, include_last))
        return tool_report(result, max_rows, "collectives", "traceq collectives")

    def stragglers(self, by_step: Annotated[bool, Field(description="One row per rank and step, not per rank.")] = False,
                   run: Runs = None, steps: Steps = None, skip_steps: SkipSteps = None, drop_last: DropLast = False,
                   include_last: IncludeLast = False, whole_trace: WholeTrace = False, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """Who arrives last at the collectives, how often, and how much waiting it causes the other ranks; the ranks that caused the most waiting first."""
        result = traceq.stragglers_report(self.db, by_step=by_step, whole_trace=whole_trace, runs=_runs(run),
                                          selection=_selection(steps, skip_steps, drop_last, include_last))
        return tool_report(result, max_rows, "stragglers", "traceq stragglers")

    def critical_path(self, view: Annotated[Literal["steps", "segments", "ranks", "kernels"], Field(description="steps: one row per step (span, last rank, time by kind, what held it); segments: the path itself; ranks: time on the path per rank; kernels: the kernels most on the paths.")] = "steps",
                      top: Annotated[int, Field(ge=1, description="Rows of the kernels view.")] = 20,
                      run: Runs = None, steps: Steps = None, skip_steps: SkipSteps = None, drop_last: DropLast = False,
                      include_last: IncludeLast = False, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """The critical path across ranks: which rank, and which of its work (compute, transfer, idle), made each step as long as it was."""
        path = traceq.critical_path(self.db, runs=_runs(run), segments=view == "segments",
                                    selection=_selection(steps, skip_steps, drop_last, include_last))
        return tool_report(path.report(view, top), max_rows, "critical_path", "traceq critical-path")

    def explain(self, run: Runs = None, steps: Steps = None, skip_steps: SkipSteps = None, drop_last: DropLast = False,
                include_last: IncludeLast = False, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """Why the step is slow: the findings, largest first, each with its evidence, its bound (the time on the critical path it accounts for) and the next command."""
        result = traceq.explain(self.db, runs=_runs(run), selection=_selection(steps, skip_steps, drop_last, include_last))
        return tool_report(result, max_rows, "explain", "traceq explain")

    def diff(self, a: Annotated[str, Field(description="Side A: RUN, or RUN,rank=N and/or RUN,steps=a:b.")],
             b: Annotated[str, Field(description="Side B, the same way.")],
             skip_steps: SkipSteps = None, include_last: IncludeLast = False, max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """Two runs, two step ranges of a run, or two ranks compared: every metric, exposed comm per collective type and kernel time per category, with the delta (B - A) and whether it is beyond the step-to-step spread."""
        result = traceq.diff(self.db, a, b, skip_steps=skip_steps, include_last=include_last)
        return tool_report(result, max_rows, "diff", "traceq diff")

    def sql(self, query: Annotated[str, Field(description="One DuckDB SELECT over the warehouse's tables (gpu_events, host_events, steps, traces, ...) and traceq's relations (gpu_activity, device_windows, selected_steps, interval_breakdown, comm_instances, ...).")],
            max_rows: MaxRows = SHOWN_ROWS) -> ToolReport:
        """Your own read-only query over traceq's classification, step windows and metrics, as `traceq sql`: the warehouse and nothing else (no other file, no extension, no settings). row_count counts the query's rows up to 10,000."""
        return tool_report(traceq.warehouse_sql(query, self.db, max_rows=MOST_ROWS), max_rows, "sql", "traceq sql",
                           counted_to=MOST_ROWS)


TOOL_NAMES = ("runs", "metrics", "report", "summary", "kernels", "collectives", "stragglers", "critical_path", "explain",
              "diff", "sql")


def build_server(db: Path) -> Any:
    """The MCP server (``mcp.server.mcpserver.MCPServer``) whose tools read the warehouse ``db``."""
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations  # the SDK's own types package

    server = MCPServer("traceq", instructions=INSTRUCTIONS, version=traceq.__version__, log_level="WARNING")
    tools = Tools(db)
    reading = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    for name in TOOL_NAMES:
        tool = answering(SQL_FIX if name == "sql" else "")(getattr(tools, name))
        server.add_tool(tool, name=name, annotations=reading, structured_output=True)
    return server


def serve(db: Path) -> None:
    """Serve the tools on the warehouse ``db`` over stdio until the client closes it; WarehouseError first
    when ``db`` is not a warehouse traceq reads (missing, another kind of file, made by another traceq)."""
    from traceq.store.warehouse import opened

    with opened(db):  # refused here, in one line, rather than at the agent's first call
        pass
    build_server(db).run("stdio")
