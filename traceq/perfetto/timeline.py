"""Annotated Perfetto traces of runs (``traceq export --perfetto``; docs/how-to/perfetto.md).

One process per (run, rank). Its tracks: the CPU spans of the selected steps; per device, the steps'
device windows, a counter per step for exposed comm, overlapped comm, idle and exposed comm split into
waiting and transfer (the rows of :func:`traceq.report.metrics.step_metrics`, in ns: the numbers of
``traceq report``), and every stream of the device with each kernel, copy and set named and classified
(class, category, collective type, process group, message size, wait and transfer in its args); power
per step and the NVML samples where the run has a power log.

**Nothing is lost.** Perfetto's importer drops slices that overlap on one track, and kernels of one
stream do overlap (graph replay). Each event goes on the first lane of its stream whose last event has
ended when it starts; lanes after the first are tracks of their own, ``GPU 0 stream 7 (overlap 1)``.
Slices never overlap on a track.

**One clock.** The ranks of a run are placed on the wall clock of its reference rank (its lowest rank
with a collective) with the clock-skew estimate of ``traceq check`` (``sql/clock_skew.sql``: the median
difference of the end times of the same collective). skew_ns > 0 means the rank's clock is ahead of the
reference's; the offset applied to the rank's wall-clock times is offset_ns = -skew_ns. A rank without
an estimate stays on its own wall clock, and the trace says so. Each run's timeline starts at 0: its
first event; the wall-clock time of that 0, and every offset, are in each process's labels and in the
trace's metadata (``cr-traceq``).

**Bounded.** The step selection and ``ranks`` choose what is written. The events are read in one query
ordered by process, device, stream and time, fetched a batch at a time, and written as they come, a
batch of packets at a time: Python holds a batch and the per-step rows, not the run; DuckDB sorts the
events first (within the report memory limit, spilling past it), and the per-step report behind the
counters covers every rank of the selected runs (the wait split needs them all).

This module checks the target, reads the rows and writes the file; the parts have a module each:
:mod:`~traceq.perfetto.ranks` (the ranks asked for), :mod:`~traceq.perfetto.clocks` (each rank on its
run's clock), :mod:`~traceq.perfetto.plan` (the processes, steps, windows, counters and paths to write),
:mod:`~traceq.perfetto.lanes` (slices packed on tracks where none overlaps) and
:mod:`~traceq.perfetto.writing` (the plan and the device events as packets, through ``pftrace``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from traceq import query
from traceq.errors import ConfigError, EmptySelection
from traceq.perfetto.clocks import ClockOffset, clock_notes
from traceq.perfetto.pftrace import TraceWriter, require_perfetto
from traceq.perfetto.plan import Plan, make_plan, place_paths
from traceq.perfetto.ranks import only_ranks, parse_ranks
from traceq.perfetto.writing import write_plan
from traceq.report import crossrank
from traceq.report.metrics import nothing_selected, require_runs, step_metrics
from traceq.report.notes import steps_used
from traceq.report.selection import StepSelection, query_params
from traceq.scratch import atomic_file
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import duckdb

FETCH_ROWS = 20_000  # device events fetched from DuckDB at a time


@dataclass(frozen=True)
class TimelineSummary:
    """What :func:`export_perfetto` wrote.

    Args:
        path: the trace file.
        size_bytes: its size.
        seconds: time taken.
        runs: the runs written.
        processes: processes written (one per run and rank).
        slices: device events written as slices (kernels, copies, sets).
        overlap_tracks: extra tracks made for events that overlap on their stream.
        counter_values: counter values written.
        clocks: each rank's placement on its run's clock.
        origins_wall_ns: per run, the wall-clock ns (the reference rank's clock) of the timeline's 0.
        notes: lines to print beside it (steps used, clocks, overlaps).
    """

    path: Path
    size_bytes: int
    seconds: float
    runs: tuple[str, ...]
    processes: int
    slices: int
    overlap_tracks: int
    counter_values: int
    clocks: tuple[ClockOffset, ...]
    origins_wall_ns: dict[str, int]
    notes: tuple[str, ...]


def export_perfetto(
    db: Warehouse = DEFAULT_DB,
    path: str | Path = "traceq.pftrace",
    *,
    runs: Sequence[str] | None = None,
    selection: StepSelection = StepSelection(),
    ranks: str | Sequence[int] | None = None,
    overwrite: bool = False,
    critical_path: bool = False,
) -> TimelineSummary:
    """Write the selected steps of ``runs`` as one Perfetto trace, every rank of a run on one clock.

    Args:
        db: warehouse path (a DuckDB file or a Parquet directory) or an open connection.
        path: the trace file to write (``.pftrace``; open it in https://ui.perfetto.dev).
        runs: only these runs (None: every run, one group of processes per run).
        selection: which steps (warm-up skip, range, incomplete last step), as in the reports.
        ranks: only these ranks ("0-7", "0,2,5" or a sequence of ints; None: every rank).
        overwrite: replace ``path`` if it exists.
        critical_path: also write each step's critical path across ranks (docs/explanation/across-ranks.md: the critical path): on each
            rank a track of the path's segments there, and an arrow (a flow) where the path jumps from a
            rank that waited at a collective to the rank it waited for.

    The file is written under a temporary name beside ``path`` and renamed when complete: a failure
    leaves nothing half-written. Raises ConfigError for a bad path or rank list, EmptySelection when the
    runs, ranks or steps leave nothing (saying what exists). Needs the ``perfetto`` package
    (pip install "traceq[perfetto]").
    """
    started = time.perf_counter()
    target = _target(Path(path), db, overwrite)
    wanted = parse_ranks(ranks)
    require_perfetto()
    with opened(db) as con, crossrank.matched(con, runs) as matched:
        require_runs(con, runs)
        rows = step_metrics(con, selection=selection, runs=runs, cross_rank=True)
        if rows.height == 0:
            raise EmptySelection(nothing_selected(con, selection, runs))
        rows, notes = only_ranks(rows, wanted, ranks)
        plan = make_plan(con, rows, selection, matched)
        if critical_path:
            notes += place_paths(con, plan, selection)
        with atomic_file(target) as f:
            counts = write_plan(TraceWriter(f), plan, _device_events(con, plan, matched))
    notes = [*steps_used(rows), *clock_notes(plan.clocks), *counts.notes(), *notes]
    return TimelineSummary(
        path=target, size_bytes=target.stat().st_size, seconds=time.perf_counter() - started,
        runs=tuple(dict.fromkeys(p.run for p in plan.processes)), processes=len(plan.processes),
        slices=counts.slices, overlap_tracks=counts.overlap_tracks, counter_values=counts.counter_values,
        clocks=tuple(plan.clocks), origins_wall_ns=dict(plan.origins), notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------------------
# reading the device events


def _device_events(con: duckdb.DuckDBPyConnection, plan: Plan, matched: str) -> Iterator[tuple]:
    """The rows of sql/timeline_kernels.sql in process, device, stream and time order, a batch at a time."""
    if not plan.spans:
        return
    statement = (f"select * from ({query.statement(con, 'timeline_kernels', {'comm_instances': matched})})\n"
                 "order by proc, device, stream nulls first, ts_ns, dur_ns, name")
    result = con.execute(statement, query.params_of(statement, {**query_params(), "spans": plan.spans}))
    while batch := result.fetchmany(FETCH_ROWS):
        yield from batch


# --------------------------------------------------------------------------------------------------
# the file


def _target(path: Path, db: Warehouse, overwrite: bool) -> Path:
    """``path`` checked: not a directory, not the warehouse, in a directory that exists, new unless ``overwrite``."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; give the trace a file name, e.g. {path / 'run.pftrace'}")
    if isinstance(db, str | Path) and path.exists() and Path(db).exists() and path.resolve() == Path(db).resolve():
        raise ConfigError(f"{path}: is the warehouse; give the trace another file name")
    if not path.parent.is_dir():
        raise ConfigError(f"{path}: no directory {path.parent}; make it first, or write the trace elsewhere")
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: exists; overwrite it (--overwrite), or give the trace another file name")
    return path
