"""The Perfetto engine: traceq's classification, step windows and interval metrics in PerfettoSQL
(``sql/perfetto/``, the package ``traceq`` of PerfettoSQL modules), run by Perfetto's trace processor on
trace files directly, with no warehouse (docs/how-to/perfetto.md).

Perfetto computes every figure itself, from its own import of the JSON: the classification rules,
event categories and step marker go in as tables, never written twice. What it does not do the same
way as the DuckDB engine is said in notes: slices its importer moved or dropped, and times it read
through 64-bit floats (where a trace's timestamps carry more digits than a double holds).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceq import catalog
from traceq.catalog import StepMarker, check_rank, check_run_name
from traceq.errors import ConfigError, EmptySelection
from traceq.perfetto.processor import PerfettoTrace, open_trace

if TYPE_CHECKING:
    import polars as pl

    from traceq.report.result import Report
    from traceq.report.selection import StepSelection

# The metrics this engine computes: the interval times (each read from its ns column of
# traceq_interval_breakdown), then overlap_ratio and step_time_ms
METRICS = tuple(m.name for m in catalog.METRICS if m.source == "interval" and m.ns_column)
OTHER_METRICS = ("overlap_ratio", "step_time_ms")
GRAIN = ("run", "rank", "device", "step")
NS_COLUMNS = ("comm_kernel_ns", "compute_kernel_ns", "comm_ns", "compute_ns", "overlapped_comm_ns",
              "exposed_comm_ns", "exposed_memcpy_ns", "busy_ns", "idle_ns", "window_ns")
# Device roles: the slice counts Perfetto's import gives, checked against the trace's event counts
DEVICE_ROLES = ("kernel", "memcpy", "memset")
# A double holds a time in us to the ns below 2**42 us (ULP 2**-10 us, under half a ns after x1000).
EXACT_US = 2**42


# ---------------------------------------------------------------------------------------------
# one file


@dataclass
class TraceResult:
    """What the Perfetto engine computed for one file: its steps, the interval metrics of every
    window (scope 'step' and 'trace'), and the notes on how Perfetto read it; ``metadata``: the
    run-level part of the collector's run.json beside it (None without one), as ingest stores it."""

    path: Path
    run: str
    steps: pl.DataFrame
    windows: pl.DataFrame
    notes: list[str] = field(default_factory=list)
    slice_counts: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None


def analyse_trace(path: Path, run: str, file_rank: int, binary: Path | None,
                  marker: StepMarker = StepMarker()) -> TraceResult:
    """Load ``path`` in a trace processor and compute its steps and interval metrics in PerfettoSQL."""
    import polars as pl

    with counting_events(path) as events, open_trace(path, binary, file_rank, marker) as trace:
        trace.load("interval_breakdown")
        steps = trace.query("select rank, step, start_ns, end_ns, step_time_ns, launches_without_gpu_work, source "
                            "from traceq_steps order by rank, step")
        windows = trace.query("select * from traceq_interval_breakdown order by scope, rank, device, step")
        slice_counts, notes = import_notes(trace, events.result())
    typed = {c: pl.Int64 for c in ("rank", "step", "start_ns", "end_ns", "step_time_ns", "launches_without_gpu_work")}
    steps = steps.cast(typed) if steps.height else pl.DataFrame(schema={**typed, "source": pl.String})
    wtyped = {"rank": pl.Int64, "device": pl.Int64, "step": pl.Int64, "window_start_ns": pl.Int64, **dict.fromkeys(NS_COLUMNS, pl.Int64)}
    windows = windows.cast(wtyped) if windows.height else pl.DataFrame(schema={"scope": pl.String, **wtyped})
    return TraceResult(path, run, steps, windows, notes, slice_counts)


@contextmanager
def counting_events(path: Path) -> Iterator[Future[dict[str, int]]]:
    """The trace's own count of its device events (:func:`traceq.ingest.census.count_device_events`),
    read in a thread meanwhile (the trace processor is another process)."""
    from traceq.ingest.census import count_device_events

    with ThreadPoolExecutor(max_workers=1) as census:
        yield census.submit(count_device_events, path)


def import_notes(trace: PerfettoTrace, events: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """(device slices by role, the notes on how Perfetto's import of the loaded ``trace`` differs from the
    trace's own ``events`` and from traceq's reader)."""
    counts = trace.query("select role, count(*) as n from traceq_events where role in ('kernel', 'memcpy', 'memset') group by role")
    stats = trace.query("select name, sum(value) as value from stats where value > 0 "
                        "and (severity in ('error', 'data_loss') or name like 'slice_%') group by name")
    fractional = trace.query("select max(abs(start_ns)) as top_ns, "
                             "max(start_ns % 1000 <> 0 or dur_ns % 1000 <> 0) as fraction from traceq_device_events")
    sliced = {role: int(n) for role, n in counts.iter_rows()}
    return sliced, _import_notes(trace.path, sliced, events, dict(stats.iter_rows()), fractional)


def _import_notes(path: Path, sliced: dict[str, int], events: dict[str, int], stats: dict[str, int],
                  fractional: pl.DataFrame) -> list[str]:
    """What Perfetto's import of ``path`` changed, in words: device events it did not keep (the
    trace's event counts against its slice counts), overlapping slices it moved onto overflow tracks
    (kept: traceq reads slices wherever they are), times it read through doubles."""
    notes = []
    differ = [role for role in DEVICE_ROLES if events.get(role, 0) != sliced.get(role, 0)]
    if differ:
        detail = ", ".join(f"{sliced.get(r, 0)} {r} events where traceq reads {events.get(r, 0)}" for r in differ)
        notes.append(f"{path}: Perfetto's importer read {detail} (traceq reads those whose ts and dur are numbers, "
                     "dur >= 0): the engines' figures differ by the events the other did not read")
    spilled = stats.get("slice_spill_overlapping_complete_event", 0)
    if spilled:
        notes.append(f"{path}: {spilled} slice(s) overlap others on their track; Perfetto's importer moved them onto "
                     "overflow tracks, and traceq counts them there (nothing lost)")
    for name, value in stats.items():
        if name != "slice_spill_overlapping_complete_event" and value:
            notes.append(f"{path}: Perfetto's importer reports {name} = {value}")
    top_ns, fraction = fractional.row(0) if fractional.height else (None, None)
    if top_ns is not None and fraction and top_ns / 1000 >= EXACT_US:
        notes.append(f"{path}: its times have more digits than a 64-bit float holds (up to {top_ns / 1e9:,.0f} s with "
                     f"ns fractions); Perfetto reads them as floats, so its times and figures can be off by up to "
                     f"{time_error_ns(top_ns)} ns per interval edge (--engine duckdb reads them exactly)")
    return notes


def time_error_ns(top_ns: int) -> int:
    """The most a time of magnitude ``top_ns`` can move when read as a double in us and scaled to
    ns: half an ULP of the us value, scaled, plus half an ULP of the product, plus the rounding to an
    integer, rounded up."""
    return math.ceil(math.ulp(top_ns / 1000) * 1000 / 2 + math.ulp(float(top_ns)) / 2 + 1)


# ---------------------------------------------------------------------------------------------
# a report over files


def run_file_metadata(path: Path) -> dict[str, Any] | None:
    """The run-level part of the collector's run.json beside ``path`` (None without one), read as
    ingest reads it: TraceFormatError naming the file when it is not a run.json."""
    from traceq.ingest.sidecar import find_side_file, read_run_file
    from traceq.store.run_metadata import run_level

    meta_path = find_side_file(path, ".run.json")
    return None if meta_path is None else run_level(read_run_file(meta_path))


def run_metadata(results: Sequence[TraceResult]) -> dict[str, dict[str, Any]]:
    """Per run, its files' run.json metadata merged in the order of the files, as ingest merges it
    into ``runs.metadata`` (runs without one are absent)."""
    from traceq.store.run_metadata import merged_metadata

    merged: dict[str, dict[str, Any]] = {}
    for result in results:
        if result.metadata is not None:
            merged[result.run] = merged_metadata(merged.get(result.run, {}), result.metadata)
    return merged


def analyse_files(
    inputs: Sequence[str | Path], *, name: str | None = None, rank: int | None = None,
    binary: Path | None = None, marker: StepMarker = StepMarker(), processors: int | None = None,
) -> list[TraceResult]:
    """Every trace of ``inputs`` (files, globs, directories) through the Perfetto engine, ``processors``
    at once (one trace processor each; default: one per CPU). ``name``: the run of every file, as
    :func:`traceq.ingest.ingest_traces` takes it. Ranks as the DuckDB engine gives them: distributedInfo, else
    the events' args.rank, else ``rank``, else the file name, else -1, -2, ... within the run; runs as
    ingest gives them (:mod:`traceq.ingest.identity`): a file that names no rank and no job is a run of its
    own, unless its events name ranks. Each file's run.json (beside it, as ingest finds it) is read
    into its result's ``metadata``: its warmup_steps is the run's default warm-up, as on DuckDB."""
    from traceq.identity import GIVEN_RANKS, Claim, rankless_ranks, refuse_overlap
    from traceq.ingest.identity import header_identity, no_rank_note, run_of
    from traceq.ingest.plan import expand_inputs

    check_rank(rank)
    run = name if name is None else check_run_name(name, "name")
    paths = expand_inputs(inputs)
    if not paths:
        raise ConfigError("no trace files found", param="inputs", value=" ".join(map(str, inputs)))
    metadata = [run_file_metadata(path) for path in paths]  # a run.json that is none fails before the work
    named = [header_identity(path, rank) for path in paths]
    # a file without rank or job is its own run, unless its events name ranks (seen after the analysis)
    runs = [run_of(path, run, names_rank=r is not None, job=job) for path, (r, _, job) in zip(paths, named)]
    own = rankless_ranks([None if r is not None else u for (r, _, _), u in zip(named, runs)])
    jobs = [(path, u, r if r is not None else n, r is not None, run_of(path, run, names_rank=True, job=job),
             run is None and not job) for path, (r, _, job), u, n in zip(paths, named, runs, own)]
    processors = processors or min(len(jobs), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=processors) as pool:  # the work runs in the trace processors
        results = list(pool.map(lambda job: analyse_trace(*job[:3], binary=binary, marker=marker), jobs))
    for (path, run_name, file_rank, is_named, job_run, alone), result, meta in zip(jobs, results, metadata):
        result.metadata = meta
        if is_named:
            continue
        if (result.steps["rank"] == file_rank).any():
            result.notes.append(no_rank_note(path, run_name, file_rank, alone=alone, verb="reported"))
        else:  # its events name their ranks: one job, in its directory's run
            result.run = job_run
    refuse_overlap([], [Claim(i, str(r.path), r.run, rank, step) for i, r in enumerate(results)
                        for rank, step in r.steps.select("rank", "step").iter_rows()],
                   rank_given=[i for i, (_, source, _) in enumerate(named) if source in GIVEN_RANKS])
    return results


def step_rows(results: Sequence[TraceResult], *, whole_trace: bool, selection: StepSelection) -> pl.DataFrame:
    """One row per (run, rank, device, step) of the selected steps' windows (or per device over the
    whole trace, step -1), shaped like :func:`traceq.report.metrics.step_metrics`'s interval columns;
    the steps are selected by ``sql/selected_steps.sql`` over the steps Perfetto found, the warm-up
    by default each run's warmup_steps (:func:`run_metadata`)."""
    import polars as pl

    metadata = run_metadata(results)
    frames = []
    for trace_id, result in enumerate(results, start=1):
        if not sum(result.slice_counts.values()):
            continue  # no device activity: outside this engine (perfetto_report says so)
        windows = result.windows.filter(pl.col("scope") == ("trace" if whole_trace else "step")).drop("scope")
        if whole_trace:
            frame = windows.with_columns(pl.lit(None, pl.Int64).alias("step_time_ns"))
        else:  # a selected step that launched nothing keeps its row (null interval metrics), as on DuckDB
            chosen = selected_steps(result.steps, selection, metadata.get(result.run))
            steps = result.steps.join(chosen, on=["rank", "step"], how="semi")
            frame = steps.select("rank", "step", "step_time_ns").join(windows, on=["rank", "step"], how="left")
        frames.append(frame.with_columns(pl.lit(result.run).alias("run"), pl.lit(trace_id).alias("trace_id")))
    rows = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()
    if rows.height == 0:
        return rows

    return rows.with_columns(
        *[(pl.col(catalog.NS_COLUMN_OF[us]) / 1000).round(3).alias(us) for us in METRICS],
        (pl.when(pl.col("comm_ns") > 0).then(pl.col("overlapped_comm_ns") / pl.col("comm_ns"))).alias("overlap_ratio"),
        (pl.col("step_time_ns") / 1e6).round(6).alias("step_time_ms"),
    ).sort("run", "rank", "device", "step")


def selected_steps(steps: pl.DataFrame, selection: StepSelection, metadata: dict[str, Any] | None = None) -> pl.DataFrame:
    """(rank, step) of the steps ``selection`` keeps, by ``sql/selected_steps.sql`` itself (run in an
    in-memory DuckDB over Perfetto's steps: one definition of the selection for both engines).
    ``metadata``: the run's (:func:`run_metadata`; its warmup_steps is the warm-up skip unless
    ``selection`` gives one), None for a run without."""
    import json

    import duckdb

    from traceq import query
    from traceq.report.selection import query_params

    con = duckdb.connect()
    try:
        frame = steps.with_columns(trace_id=1)
        con.register("steps", frame.to_arrow())
        con.execute("create table traces as select 1 as trace_id, 'run' as run, 1 as n_gpu_events")  # GPU traces only
        con.execute("create table runs as select 'run' as run, ?::json as metadata",
                    [None if metadata is None else json.dumps(metadata)])
        return query.run(con, "selected_steps", query_params(selection)).select("rank, step").pl()
    finally:
        con.close()


def steps_used(rows: pl.DataFrame) -> list[str]:
    """One line per run: the steps its rows cover (the DuckDB engine's "steps used" note)."""
    import polars as pl

    per_run = rows.group_by("run").agg(
        pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"),
        pl.struct("rank", "step").n_unique().alias("n"), pl.col("rank").n_unique().alias("ranks"),
    ).sort("run")
    parts = [f"run {run}: steps {lo}..{hi}, {n} rank-steps over {ranks} rank(s)" for run, lo, hi, n, ranks in per_run.iter_rows()]
    return [f"steps used: {'; '.join(parts)}"] if parts else []


def _steps_held(results: Sequence[TraceResult]) -> str:
    """The steps each run has, in words (what an empty selection leaves to choose from)."""
    import polars as pl

    steps = pl.concat([r.steps.with_columns(run=pl.lit(r.run)) for r in results if r.steps.height])
    per_rank = steps.filter(pl.col("source") == "marker").group_by("run", "rank").agg(
        pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"), pl.len().alias("n"))
    per_run = per_rank.group_by("run").agg(pl.col("lo").min(), pl.col("hi").max(), pl.col("n").max()).sort("run")
    parts = [f"run {run}: steps {lo}..{hi} ({n} per rank)" for run, lo, hi, n in per_run.iter_rows()]
    return ", ".join(parts) or "no run has step markers"


def perfetto_report(
    inputs: Sequence[str | Path], metric: str | Sequence[str] = "exposed_comm_us", *,
    by: str | Sequence[str] = ("run", "rank"), whole_trace: bool = False, selection: StepSelection | None = None,
    name: str | None = None, rank: int | None = None, binary: Path | None = None, step_marker: str | None = None,
) -> Report:
    """:func:`traceq.report.metrics.metric_report` computed by the Perfetto engine from trace files.

    Only the interval metrics (``METRICS``, overlap_ratio, step_time_ms) and the grain run, rank,
    device, step: throughput, power and the cross-rank split need the warehouse (``--engine duckdb``).
    ``step_marker``: a regular expression on the step spans' names, as ``traceq ingest --step-marker``
    (None: ProfilerStep#N); ConfigError when it is not one. ``name`` and ``rank``: the run of the files and
    the rank of those that name none, as :func:`traceq.ingest.ingest_traces` takes them.
    """
    import polars as pl

    from traceq.catalog import columns
    from traceq.report.metrics import metric_names, side_by_side
    from traceq.report.result import Report
    from traceq.report.selection import StepSelection

    selection = selection or StepSelection()
    names = metric_names(metric)
    for asked in names:
        if asked not in METRICS and asked not in OTHER_METRICS:
            raise ConfigError(
                f"the Perfetto engine computes {', '.join([*METRICS, *OTHER_METRICS])}; "
                "for the others use --engine duckdb (the warehouse)", param="metric", value=asked)
        if whole_trace and asked == "step_time_ms":
            raise ConfigError("measured per step: it has no whole-trace value", param="metric", value=asked)
    grain = columns(by, GRAIN)
    results = analyse_files(inputs, name=name, rank=rank, binary=binary, marker=StepMarker.parse(step_marker))
    rows = step_rows(results, whole_trace=whole_trace, selection=selection)
    notes = [n for r in results for n in r.notes]
    cpu_only = [str(r.path) for r in results if not sum(r.slice_counts.values())]
    if cpu_only:
        notes.append(f"no device activity in {', '.join(cpu_only)}: the Perfetto engine reports GPU traces "
                     "(--engine duckdb reports CPU-only ones too)")
    for result in results:
        for (rank,) in result.steps.filter(pl.col("source") == "whole_trace").select("rank").iter_rows():
            notes.append(f"run {result.run}: rank {rank} has no step marker: reported over its whole trace as one "
                         "window (step -1); name its steps with --step-marker REGEX")
    if rows.height == 0:
        raise EmptySelection(f"no step is selected ({selection.describe()}); " + (
            "no trace has device activity" if len(cpu_only) == len(results) else _steps_held(results)))
    metadata = run_metadata(results)
    if not whole_trace:
        notes.extend(steps_used(rows))
        if selection.skip_steps is None:
            notes.extend(warmup_notes(rows, metadata))
    used = "whole trace, every kernel" if whole_trace else selection.describe(metadata=bool(metadata))
    return Report(side_by_side(rows, names, grain), notes, f"{','.join(names)} by {','.join(grain)} ({used}; Perfetto engine)",
                  rows)


def warmup_notes(rows: pl.DataFrame, metadata: dict[str, dict[str, Any]]) -> list[str]:
    """What the default warm-up skip was for the runs of ``rows``: the warmup_steps of each run's run.json;
    a run without one skips none (said once for all such runs)."""
    runs = sorted(set(rows["run"].to_list()))
    if not metadata:
        return ["trace files carry no run metadata: no warm-up step is skipped unless --skip-steps"]
    notes = [f"run {run}: {_warmup(metadata[run])} warm-up step(s) skipped (the warmup_steps of its run.json; "
             "--skip-steps overrides)" for run in runs if run in metadata]
    bare = [run for run in runs if run not in metadata]
    if bare:
        notes.append(f"run{'s' if len(bare) > 1 else ''} {', '.join(bare)}: no run.json beside the trace files, "
                     "so no warm-up step is skipped unless --skip-steps")
    return notes


def _warmup(metadata: dict[str, Any]) -> int:
    """warmup_steps as ``sql/selected_steps.sql`` reads it (a value that is no integer: 0)."""
    try:
        return int(metadata.get("warmup_steps") or 0)
    except (TypeError, ValueError):
        return 0


def trace_sql(
    sql: str, trace: Path, *, rank: int | None = None, binary: Path | None = None, step_marker: str | None = None,
    max_rows: int | None = None,
) -> Report:
    """The rows of ``sql`` (PerfettoSQL) on ``trace`` loaded in a trace processor with traceq's modules
    loaded (traceq_device_events, traceq_steps, traceq_device_windows, traceq_interval_breakdown, ...), as a
    report's table, with notes on how Perfetto's import differs from traceq's reader; at most ``max_rows``
    rows (None: all). EngineError with the trace processor's message when the query fails, ConfigError
    for a statement that gives no rows."""
    from traceq.ingest.identity import header_identity
    from traceq.report.result import Report

    check_rank(rank)
    if not trace.is_file():
        raise ConfigError(f"{trace}: not a trace file; give one trace file, then the query")
    file_rank, _, _ = header_identity(trace, rank)
    marker = StepMarker.parse(step_marker)
    with counting_events(trace) as events, open_trace(trace, binary, -1 if file_rank is None else file_rank, marker) as loaded:
        loaded.load("interval_breakdown")
        rows = loaded.query(sql)
        if not rows.columns:
            raise ConfigError(f"not a query (it returns no rows): {sql[:80]!r}; give a SELECT")
        _, notes = import_notes(loaded, events.result())
    return Report.of_query(rows, notes, max_rows)
