"""Annotated Perfetto traces of runs (``traceq export --perfetto``; README: See it on the timeline).

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
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceq import query
from traceq.catalog import WHOLE_TRACE_STEP
from traceq.errors import ConfigError, EmptySelection
from traceq.perfetto.pftrace import TraceWriter, require_perfetto
from traceq.report import crossrank
from traceq.report.metrics import nothing_selected, require_runs, step_metrics
from traceq.report.notes import steps_used
from traceq.report.power import power_series
from traceq.report.selection import StepSelection, query_params
from traceq.scratch import atomic_file
from traceq.store.frames import to_polars
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import duckdb
    import polars as pl

# Per-step counters: (track name, column of step_metrics in ns, what it shows). In ns, the unit of the
# timeline: the value is the report's `<name>_us` × 1000, exactly.
COUNTERS = (
    ("exposed_comm", "exposed_comm_ns", "communication with no compute beside it in the step's device window "
     "(traceq report --metric exposed_comm_us, in ns)"),
    ("overlapped_comm", "overlapped_comm_ns", "communication hidden behind compute in the window (overlapped_comm_us, in ns)"),
    ("idle", "idle_ns", "the window with no activity on the device (idle_us, in ns)"),
    ("exposed_comm_wait", "exposed_comm_wait_ns", "exposed communication spent waiting for the last rank to arrive "
     "(exposed_comm_wait_us, in ns; collectives matched across the run's ranks)"),
    ("exposed_comm_transfer", "exposed_comm_transfer_ns", "exposed communication spent moving data "
     "(exposed_comm_transfer_us, in ns); waiting + transfer = exposed_comm"),
)
FETCH_ROWS = 20_000  # device events fetched from DuckDB at a time
_ONE_RANK = "the run holds one rank"
_RANKS = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")


@dataclass(frozen=True)
class ClockOffset:
    """How one rank was placed on its run's clock.

    Args:
        run, rank: the rank.
        offset_ns: added to the rank's wall-clock times (= -skew_ns; 0 without an estimate).
        status: reference | estimated | no estimate.
        reason: why there is no estimate (empty otherwise).
        ref_rank: the run's reference rank (None: none).
        skew_ns: the rank's clock minus the reference's (+: ahead), None without an estimate.
        n_matched: collectives behind the estimate.
    """

    run: str
    rank: int
    offset_ns: int
    status: str
    reason: str = ""
    ref_rank: int | None = None
    skew_ns: int | None = None
    n_matched: int = 0

    def label(self) -> str:
        """One line for the process's labels, e.g. "clock: offset -700.000 us onto rank 0's clock (skew
        +700.000 us over 2 collectives)"."""
        if self.status == "reference":
            return "clock: reference (offset 0)"
        if self.status == "estimated":
            return (f"clock: offset {self.offset_ns / 1000:+,.3f} us onto rank {self.ref_rank}'s clock "
                    f"(skew {self.skew_ns / 1000:+,.3f} us over {self.n_matched} collectives)")
        return f"clock: no estimate ({self.reason}); on its own wall clock"


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


MAX_RANKS = 1 << 20  # more than any run's (2048 in the study), far fewer than a list can hold


def parse_ranks(ranks: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """Ranks from CLI text ("0-7", "0,2,5", "0-3,8") or a sequence; None: every rank."""
    if ranks is None:
        return None
    if not isinstance(ranks, str):
        return tuple(sorted({int(r) for r in ranks}))
    out: set[int] = set()
    for part in ranks.split(","):
        m = _RANKS.match(part)
        if not m:
            raise ConfigError("expected rank numbers and ranges, e.g. 0-7 or 0,2,5", param="ranks", value=ranks)
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ConfigError(f"the range {part.strip()} ends before it starts", param="ranks", value=ranks)
        if hi - lo >= MAX_RANKS:
            raise ConfigError(f"the range {part.strip()} holds over {MAX_RANKS:,} ranks; no run has that many",
                              param="ranks", value=ranks)
        out.update(range(lo, hi + 1))
        if len(out) > MAX_RANKS:
            raise ConfigError(f"over {MAX_RANKS:,} ranks; no run has that many", param="ranks", value=ranks)
    return tuple(sorted(out))


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
        critical_path: also write each step's critical path across ranks (README: The critical path): on each
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
        rows, notes = _only_ranks(rows, wanted, ranks)
        plan = _plan(con, rows, selection, matched)
        if critical_path:
            notes += _place_paths(con, plan, selection)
        with atomic_file(target) as f:
            counts = _write(TraceWriter(f), plan, _device_events(con, plan, matched))
    notes = [*steps_used(rows), *_clock_notes(plan.clocks), *counts.notes(), *notes]
    return TimelineSummary(
        path=target, size_bytes=target.stat().st_size, seconds=time.perf_counter() - started,
        runs=tuple(dict.fromkeys(p.run for p in plan.processes)), processes=len(plan.processes),
        slices=counts.slices, overlap_tracks=counts.overlap_tracks, counter_values=counts.counter_values,
        clocks=tuple(plan.clocks), origins_wall_ns=dict(plan.origins), notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------------------
# what to write


@dataclass
class _Window:
    """One step's device window on the timeline with its counters (ns, in the order of COUNTERS)."""

    ts: int
    dur: int
    step: int
    values: tuple[int, ...]


@dataclass
class _Process:
    """One (run, rank): its traces' shifts onto the run's timeline, its steps, windows and counters."""

    index: int
    run: str
    rank: int
    clock: ClockOffset
    shifts: dict[int, int]  # trace_id -> ns added to the trace's times (wall offset + clock offset - origin)
    windows: dict[int, list[_Window]] = field(default_factory=dict)  # device -> windows in time order
    steps: list[tuple[int, int, int, str]] = field(default_factory=list)  # (start, end, step, source), timeline ns
    power: list[tuple[int, float]] = field(default_factory=list)  # (CPU step start, power_w), timeline ns
    power_end: int | None = None
    samples: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # NVML gpu -> (ts, W)
    # the critical path's segments on this rank: (timeline ns, dur, name, kind, args, flow out, flow in)
    path: list[tuple[int, int, str, str, tuple[tuple[str, Any], ...], int | None, int | None]] = field(default_factory=list)


@dataclass
class _Plan:
    processes: list[_Process]
    clocks: list[ClockOffset]
    origins: dict[str, int]  # run -> wall-clock ns of its timeline's 0
    spans: list[dict[str, int]]  # the $spans of sql/timeline_kernels.sql
    selection: str


def _plan(con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, selection: StepSelection, matched: str) -> _Plan:
    """Processes, clocks, windows and counters of the step rows ``rows``, on each run's timeline (its 0:
    its first event)."""
    import polars as pl

    keys = rows.select("run", "rank").unique()
    runs = keys["run"].unique().to_list()  # the clocks and steps of these runs only
    clock = to_polars(query.run(con, "timeline_clock", query_params(runs=runs))).join(keys, on=["run", "rank"], how="semi")
    processes = _processes(clock)
    by_key = {(p.run, p.rank): p for p in processes}
    shifts = clock.select("trace_id", "rank", "run", "shift_ns")
    steps = to_polars(query.run(con, "timeline_steps", query_params(selection, runs))).join(
        shifts, on=["trace_id", "rank"], how="inner")
    windows = (rows.filter(pl.col("device").is_not_null())
               .select("trace_id", "rank", "device", "step", "window_start_ns", "window_ns",
                       *(column for _, column, _ in COUNTERS))
               .join(shifts, on=["trace_id", "rank"], how="inner"))
    spans = [
        {"proc": by_key[(run, rank)].index, "trace_id": t, "rank": rank, "device": d, "lo_ns": lo, "hi_ns": hi,
         "shift_ns": shift}
        for run, rank, t, d, shift, lo, hi in windows.group_by("run", "rank", "trace_id", "device", "shift_ns")
        .agg(pl.col("window_start_ns").min(), (pl.col("window_start_ns") + pl.col("window_ns")).max().alias("hi"))
        .sort("run", "rank", "trace_id", "device").iter_rows()
    ]
    samples = _power_samples(con, processes, steps)
    origins = _origins(con, processes, spans, steps, windows, samples, matched)
    for p in processes:
        p.shifts = {t: shift - origins[p.run] for t, shift in p.shifts.items()}
    power = (rows.filter(pl.col("power_w").is_not_null()).select("trace_id", "rank", "step", "power_w").unique()
             .join(steps, on=["trace_id", "rank", "step"]))
    _place(by_key, windows, steps, power)
    for (run, rank, gpu), readings in samples.items():
        by_key[(run, rank)].samples[gpu] = [(ts - origins[run], watts) for ts, watts in readings]
    spans = [{**s, "shift_ns": s["shift_ns"] - origins[processes[s["proc"]].run]} for s in spans]
    return _Plan(processes, [p.clock for p in processes], origins, spans, selection.describe())


def _processes(clock: pl.DataFrame) -> list[_Process]:
    """One process per (run, rank) of the rows of sql/timeline_clock.sql, in run and rank order."""
    processes: list[_Process] = []
    for r in clock.sort("run", "rank", "trace_id").iter_rows(named=True):
        if not processes or (processes[-1].run, processes[-1].rank) != (r["run"], r["rank"]):
            processes.append(_Process(len(processes), r["run"], r["rank"], _clock_offset(r["run"], r["rank"], r), {}))
        processes[-1].shifts[r["trace_id"]] = r["shift_ns"]
    return processes


def _place(by_key: dict[tuple[str, int], _Process], windows: pl.DataFrame, steps: pl.DataFrame,
           power: pl.DataFrame) -> None:
    """The windows with their counters, the CPU steps and the power per step of each process, in
    timeline order (the shifts of the processes already hold their run's origin)."""
    import polars as pl

    def in_order(frame: pl.DataFrame, start: str, *columns: str) -> Iterator[tuple]:
        """(process, trace_id, start, *columns) of each row, in timeline order."""
        ordered = frame.sort(pl.col(start) + pl.col("shift_ns"), "step").select("run", "rank", "trace_id", start, *columns)
        for run, rank, t, *rest in ordered.iter_rows():
            yield by_key[(run, rank)], t, *rest

    counters = [column for _, column, _ in COUNTERS]
    for p, t, start, dur, device, step, *values in in_order(windows, "window_start_ns", "window_ns", "device", "step",
                                                            *counters):
        p.windows.setdefault(device, []).append(_Window(start + p.shifts[t], dur, step, tuple(values)))
    for p, t, start, end, step, source in in_order(steps, "start_ns", "end_ns", "step", "source"):
        p.steps.append((start + p.shifts[t], end + p.shifts[t], step, source))
    for p, t, start, end, watts in in_order(power, "start_ns", "end_ns", "power_w"):
        p.power.append((start + p.shifts[t], watts))
        p.power_end = max(p.power_end or 0, end + p.shifts[t])


def _place_paths(con: duckdb.DuckDBPyConnection, plan: _Plan, selection: StepSelection) -> list[str]:
    """Each run's critical paths onto its processes (:attr:`_Process.path`), a segment at its own rank's
    place on the timeline; a flow joins the two segments around each jump. Returns notes."""
    from traceq.report.path_batches import walking

    by_key = {(p.run, p.rank): p for p in plan.processes}
    flows = itertools.count(1)
    notes = []
    for run in dict.fromkeys(p.run for p in plan.processes):
        with walking(con, runs=[run], selection=selection) as (_, batches):
            steps = jumps = 0
            for batch in batches:  # a batch of steps at a time: the paths are never held whole
                steps, jumps = steps + batch.steps.height, jumps + batch.jumps.height
                _place_batch(batch.segments, run, by_key, flows)
        notes.append(f"run {run}: the critical path of {steps} step(s) is on a 'critical path' track "
                     f"of the ranks it crosses, with {jumps} arrow(s) where it jumps to the rank "
                     "another waited for")
    return notes


def _place_batch(segments: pl.DataFrame, run: str, by_key: dict[tuple[str, int], _Process],
                 flows: Iterator[int]) -> None:
    """A batch's segments onto the processes of their ranks (:func:`_place_paths`)."""
    for _, part in segments.sort("step", "order").group_by("step", maintain_order=True):
        before: tuple[_Process, int] | None = None  # where the previous segment of the step was placed
        for seg in part.iter_rows(named=True):
            p = by_key.get((run, seg["rank"]))
            if p is None or seg["trace_id"] not in p.shifts:  # a rank left out of the export
                before = None
                continue
            flow = None
            if before is not None and before[0] is not p:  # the path jumped: an arrow from there to here
                flow = next(flows)
                ts, dur, name, kind, args, _, into = before[0].path[before[1]]
                before[0].path[before[1]] = (ts, dur, name, kind, args, flow, into)
            args = (("step", seg["step"]), ("kind", seg["kind"]), ("collective_type", seg["collective_type"]),
                    ("process_group", seg["process_group"]), ("path_start_ns", seg["path_start_ns"]))
            p.path.append((seg["start_ns"] + p.shifts[seg["trace_id"]], seg["dur_ns"],
                           seg["name"] or seg["kind"].replace("_", " "), seg["kind"], args, None, flow))
            before = (p, len(p.path) - 1)


def _clock_offset(run: str, rank: int, r: dict[str, Any]) -> ClockOffset:
    ref, skew, n = r["ref_rank"], r["skew_ns"], r["n_matched"] or 0
    if rank == ref:
        return ClockOffset(run, rank, 0, "reference", ref_rank=ref)
    if skew is not None:
        return ClockOffset(run, rank, -skew, "estimated", ref_rank=ref, skew_ns=skew, n_matched=n)
    if r["run_ranks"] <= 1:
        why = _ONE_RANK
    elif rank < 0:
        why = "the trace names no rank"
    elif ref is None:
        why = "no collective of the run matched across ranks"
    else:
        why = f"no collective matched with rank {ref}"
    return ClockOffset(run, rank, 0, "no estimate", why, ref_rank=ref)


def _power_samples(
    con: duckdb.DuckDBPyConnection, processes: list[_Process], steps: pl.DataFrame,
) -> dict[tuple[str, int, int], list[tuple[int, int | float]]]:
    """NVML samples inside each process's selected CPU steps, on the reference wall clock (not yet
    moved to the run's origin): (run, rank, gpu) -> [(ns, W)]."""
    import polars as pl

    if not processes:
        return {}
    samples = power_series(con, sorted({p.run for p in processes}))
    if samples.height == 0:
        return {}
    # the selected steps' wall-clock span per rank (shift_ns includes the clock offset)
    spans = steps.group_by("run", "rank").agg((pl.col("start_ns") + pl.col("shift_ns")).min().alias("lo"),
                                               (pl.col("end_ns") + pl.col("shift_ns")).max().alias("hi"))
    offsets = pl.DataFrame({"run": [p.run for p in processes], "rank": [p.rank for p in processes],
                            "clock_ns": [p.clock.offset_ns for p in processes]})
    kept = (samples.join(offsets, on=["run", "rank"]).join(spans, on=["run", "rank"])
            .with_columns((pl.col("wall_ns") + pl.col("clock_ns")).alias("ts"))
            .filter((pl.col("ts") >= pl.col("lo")) & (pl.col("ts") <= pl.col("hi")))
            .sort("run", "rank", "gpu", "ts"))
    out: dict[tuple[str, int, int], list[tuple[int, int | float]]] = {}
    for run, rank, gpu, ts, watts in kept.select("run", "rank", "gpu", "ts", "power_w").iter_rows():
        out.setdefault((run, rank, gpu), []).append((ts, watts))
    return out


def _origins(
    con: duckdb.DuckDBPyConnection, processes: list[_Process], spans: list[dict[str, int]], steps: pl.DataFrame,
    windows: pl.DataFrame, samples: dict[tuple[str, int, int], list[tuple[int, int | float]]], matched: str,
) -> dict[str, int]:
    """Per run, the earliest time written (reference wall clock): the timeline's 0."""
    import polars as pl

    first: dict[str, int] = {}

    def seen(run: str, ns: int | None) -> None:
        if ns is not None:
            first[run] = min(first.get(run, ns), ns)

    for frame, start in ((steps, "start_ns"), (windows, "window_start_ns")):
        for run, ns in frame.group_by("run").agg((pl.col(start) + pl.col("shift_ns")).min()).iter_rows():
            seen(run, ns)
    for (run, _, _), rows in samples.items():
        seen(run, rows[0][0])
    if spans:
        params = {**query_params(), "spans": spans}
        for proc, ns in query.run(con, "timeline_kernels", params, {"comm_instances": matched}).aggregate(
                "proc, min(ts_ns)", "proc").fetchall():
            seen(processes[proc].run, ns)
    return {p.run: first.get(p.run, 0) for p in processes}


def _only_ranks(rows: pl.DataFrame, wanted: tuple[int, ...] | None, given: object) -> tuple[pl.DataFrame, list[str]]:
    """``rows`` of the ranks asked for; EmptySelection (naming the ranks held) when none is there."""
    import polars as pl

    if wanted is None:
        return rows, []
    held = rows.select("run", "rank").unique().sort("run", "rank")
    kept = rows.filter(pl.col("rank").is_in(list(wanted)))
    if kept.height == 0:
        listing = "; ".join(f"run {run}: {_ranges(g['rank'].to_list())}" for (run,), g in held.group_by("run", maintain_order=True))
        raise EmptySelection(f"no selected step on these ranks; the selected steps are on {listing}",
                             param="ranks", value=given)
    notes = []
    for (run,), g in held.group_by("run", maintain_order=True):
        missing = sorted(set(wanted) - set(g["rank"].to_list()))
        if missing and len(missing) < len(wanted):
            notes.append(f"run {run}: no selected step on rank {_ranges(missing)}")
    return kept, notes


def _ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts = []
    for _, group in itertools.groupby(enumerate(sorted(ranks)), lambda x: x[1] - x[0]):
        g = [r for _, r in group]
        parts.extend([f"{g[0]}-{g[-1]}"] if len(g) > 1 and g[0] >= 0 else map(str, g))
    return ", ".join(parts)


def _clock_notes(clocks: list[ClockOffset]) -> list[str]:
    """Per run: how many ranks the clock-skew estimate moved, and which ranks have none and why; the runs
    of one rank in one line."""
    notes = []
    alone = [c.run for c in clocks if c.reason == _ONE_RANK]
    if alone:
        notes.append(f"{len(alone)} run(s) of one rank, with no other clock to align to: {', '.join(alone)}")
    for run, group in itertools.groupby((c for c in clocks if c.reason != _ONE_RANK), lambda c: c.run):
        group = list(group)
        moved = [c for c in group if c.status == "estimated"]
        missing = [c for c in group if c.status == "no estimate"]
        ref = next((c.ref_rank for c in group if c.ref_rank is not None), None)
        parts = []
        if moved:
            far = max(moved, key=lambda c: abs(c.offset_ns))
            parts.append(f"{len(moved)} rank(s) placed on rank {ref}'s clock by the clock-skew estimate of traceq "
                         f"check (largest offset: rank {far.rank}, {far.offset_ns / 1000:+,.3f} us)")
        for reason, same in itertools.groupby(sorted(missing, key=lambda c: c.reason), lambda c: c.reason):
            parts.append(f"no clock estimate for rank {_ranges([c.rank for c in same])} ({reason}): on its own wall clock")
        if parts:
            notes.append(f"run {run}: " + "; ".join(parts))
    return notes


# --------------------------------------------------------------------------------------------------
# reading the device events


def _device_events(con: duckdb.DuckDBPyConnection, plan: _Plan, matched: str) -> Iterator[tuple]:
    """The rows of sql/timeline_kernels.sql in process, device, stream and time order, a batch at a time."""
    if not plan.spans:
        return
    statement = (f"select * from ({query.statement(con, 'timeline_kernels', {'comm_instances': matched})})\n"
                 "order by proc, device, stream nulls first, ts_ns, dur_ns, name")
    result = con.execute(statement, query.params_of(statement, {**query_params(), "spans": plan.spans}))
    while batch := result.fetchmany(FETCH_ROWS):
        yield from batch


# --------------------------------------------------------------------------------------------------
# writing


@dataclass
class _Counts:
    slices: int = 0
    overlap_tracks: int = 0
    counter_values: int = 0
    overlaps: dict[tuple[str, int], int] = field(default_factory=dict)  # (run, rank) -> slices on extra tracks

    def notes(self) -> list[str]:
        if not self.overlaps:
            return []
        where = ", ".join(f"run {run} rank {rank}: {n}" for (run, rank), n in sorted(self.overlaps.items())[:8])
        more = f" and {len(self.overlaps) - 8} more ranks" if len(self.overlaps) > 8 else ""
        return [f"slices that overlap an earlier one on their stream (or step track) are on extra tracks named "
                f"'... (overlap N)', where Perfetto keeps them: {where}{more}"]


class _Lanes:
    """The tracks of one stream (or step track): each slice goes on the first lane whose last slice has
    ended when it starts (slices in start order), so that no two slices of a track overlap; a lane
    after the first is a track of its own, '<name> (overlap N)', made when first needed."""

    def __init__(self, writer: TraceWriter, p: _Process, parent: int, name: str, order: Iterator[int],
                 description: str | None, counts: _Counts) -> None:
        self._writer, self._p, self._parent, self._name = writer, p, parent, name
        self._order, self._description, self._counts = order, description, counts
        self._ends: list[int] = []
        self._tracks: list[int] = []

    def slice(self, ts: int, dur: int, name: str, category: str, args: Sequence[tuple[str, Any]], **flows: int | None) -> None:
        lane = next((i for i, end in enumerate(self._ends) if end <= ts), len(self._ends))
        if lane == len(self._ends):
            self._ends.append(ts + dur)
            self._tracks.append(self._writer.track(
                self._parent, self._name if lane == 0 else f"{self._name} (overlap {lane})", next(self._order),
                self._description if lane == 0 else f"slices of {self._name} that overlap an earlier one still open there"))
            self._counts.overlap_tracks += lane > 0
        self._ends[lane] = ts + dur
        if lane:
            key = (self._p.run, self._p.rank)
            self._counts.overlaps[key] = self._counts.overlaps.get(key, 0) + 1
        self._writer.slice(self._tracks[lane], ts, dur, name, category, args, **flows)


def _write(writer: TraceWriter, plan: _Plan, events: Iterator[tuple]) -> _Counts:
    counts = _Counts()
    writer.metadata("traceq", json.dumps(_metadata(plan), sort_keys=True))
    pending = next(events, None)
    for p in plan.processes:
        process = writer.process(p.index + 1, f"{p.run} rank {p.rank}", [f"run {p.run}", p.clock.label()],
                                 _describe(p, plan.origins[p.run]))
        order = itertools.count()
        _write_steps(writer, p, process, order, counts)
        while pending is not None and pending[0] == p.index:
            pending = _write_stream(writer, p, process, order, pending, events, counts)
    writer.flush()
    return counts


def _write_steps(writer: TraceWriter, p: _Process, process: int, order: Iterator[int], counts: _Counts) -> None:
    """The CPU steps, power, and per device its step windows and their counters."""
    if p.steps:
        lanes = _Lanes(writer, p, process, "CPU steps", order,
                       "the CPU span of each selected step (ProfilerStep#N or the --step-marker span)", counts)
        for start, end, step, source in p.steps:
            lanes.slice(start, end - start, "whole trace (no step marker)" if source == "whole_trace" else f"step {step}",
                        "step", (("step", step),))
    if p.power:
        track = writer.track(process, "power_w per step (W)", next(order),
                             "power_w of each step (traceq report): NVML power over the step's CPU span, summed "
                             "over the GPUs of the rank's power log", unit_name="W")
        counts.counter_values += _step_counter(writer, track, [(ts, w, None) for ts, w in p.power], p.power_end)
    for gpu, samples in sorted(p.samples.items()):
        track = writer.track(process, f"GPU {gpu} power, NVML samples (W)", next(order),
                             "NVML power readings (a ~1 s moving average on A100/H100)", unit_name="W")
        for ts, watts in samples:
            writer.counter(track, ts, float(watts))
        counts.counter_values += len(samples)
    if p.path:
        lanes = _Lanes(writer, p, process, "critical path", order,
                       "this rank's segments of each step's critical path across ranks (traceq critical-path); "
                       "arrows: where the path jumps from a rank that waited at a collective to the rank it waited for",
                       counts)
        for ts, dur, name, kind, args, flow_out, flow_in in sorted(p.path, key=lambda x: x[0]):
            lanes.slice(ts, dur, name, kind, args, flow_out=flow_out, flow_in=flow_in)
    for device, rows in sorted(p.windows.items()):
        where = _device_label(device)
        lanes = _Lanes(writer, p, process, f"{where} steps (device windows)", order,
                       "each step's device window: from the first activity the step launched to the next step's; "
                       "every counter of the step measures all activity inside it", counts)
        for w in rows:
            lanes.slice(w.ts, w.dur, "whole trace" if w.step == WHOLE_TRACE_STEP else f"step {w.step}",
                        "step", (("step", w.step), ("window_ns", w.dur)))
        for i, (name, _, description) in enumerate(COUNTERS):
            track = writer.track(process, f"{where} {name} per step", next(order), description, unit_ns=True)
            counts.counter_values += _step_counter(writer, track, [(w.ts, w.values[i], w.ts + w.dur) for w in rows], None)


def _step_counter(writer: TraceWriter, track: int, values: list[tuple[int, Any, int | None]], end: int | None) -> int:
    """A value per step from its start (ts, value, end of its window or None), back to 0 where a window
    ends without the next one starting there, and at ``end`` (or the last window's end)."""
    written = 0
    for i, (ts, value, stop) in enumerate(values):
        writer.counter(track, ts, value)
        written += 1
        following = values[i + 1][0] if i + 1 < len(values) else None
        stop = stop if stop is not None else (end if following is None else None)
        if stop is not None and (following is None or following > stop):
            writer.counter(track, stop, 0 if isinstance(value, int) else 0.0)
            written += 1
    return written


def _write_stream(
    writer: TraceWriter, p: _Process, process: int, order: Iterator[int], row: tuple, events: Iterator[tuple],
    counts: _Counts,
) -> tuple | None:
    """Every event of the stream of ``row`` (rows in time order); returns the first row of the next
    stream (None at the end)."""
    proc, device, stream = row[0], row[1], row[2]
    lanes = _Lanes(writer, p, process, f"{_device_label(device)} stream {'?' if stream is None else stream}", order,
                   None, counts)
    while row is not None and row[0] == proc and row[1] == device and row[2] == stream:
        (_, _, _, ts, dur, name, klass, category, collective, group, group_size, seq, size, matched, wait,
         transfer) = row
        args: tuple[tuple[str, Any], ...] = (("class", klass), ("category", category))
        if klass == "comm":
            args += (("collective_type", collective), ("process_group", group), ("group_size", group_size),
                     ("seq", seq), ("size_bytes", size), ("matched", matched), ("wait_ns", wait),
                     ("transfer_ns", transfer))
        lanes.slice(ts, dur, name, klass, args)
        counts.slices += 1
        row = next(events, None)
    return row


def _device_label(device: int) -> str:
    return "CPU" if device < 0 else f"GPU {device}"


def _describe(p: _Process, origin: int) -> str:
    return (f"run {p.run}, rank {p.rank}. {p.clock.label()}. Time 0 of this run's timeline is {origin} ns of "
            "the reference rank's wall clock (ns since the Unix epoch where the trace gives one).")


def _metadata(plan: _Plan) -> dict[str, Any]:
    """The trace's metadata (cr-traceq in Perfetto's metadata table): the clock of every rank."""
    runs: dict[str, Any] = {}
    for c in plan.clocks:
        run = runs.setdefault(c.run, {"origin_wall_ns": plan.origins[c.run], "reference_rank": c.ref_rank, "ranks": {}})
        run["ranks"][str(c.rank)] = {"offset_ns": c.offset_ns, "status": c.status, "reason": c.reason or None,
                                     "skew_ns": c.skew_ns, "collectives": c.n_matched}
    return {
        "written_by": "traceq export --perfetto",
        "steps": plan.selection,
        "clock": "each rank's wall-clock times + offset_ns = the reference rank's clock; offset_ns = -skew_ns, "
                 "skew_ns > 0: the rank's clock is ahead of the reference's (traceq check); timeline 0 = "
                 "origin_wall_ns",
        "runs": runs,
    }


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
