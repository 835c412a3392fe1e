"""What a timeline export writes, planned before a byte is written: one process per (run, rank), its traces'
shifts onto the run's timeline (whose 0 is the run's first event), its CPU steps, device windows with their
counters, power per step and NVML samples, and (on request) its segments of the critical path."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from traceq import query
from traceq.perfetto.clocks import ClockOffset, clock_offset
from traceq.report.power import power_series
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars

if TYPE_CHECKING:
    import duckdb
    import polars as pl

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


@dataclass
class Window:
    """One step's device window on the timeline with its counters (ns, in the order of COUNTERS)."""

    ts: int
    dur: int
    step: int
    values: tuple[int, ...]


@dataclass
class Process:
    """One (run, rank): its traces' shifts onto the run's timeline, its steps, windows and counters."""

    index: int
    run: str
    rank: int
    clock: ClockOffset
    shifts: dict[int, int]  # trace_id -> ns added to the trace's times (wall offset + clock offset - origin)
    windows: dict[int, list[Window]] = field(default_factory=dict)  # device -> windows in time order
    steps: list[tuple[int, int, int, str]] = field(default_factory=list)  # (start, end, step, source), timeline ns
    power: list[tuple[int, float]] = field(default_factory=list)  # (CPU step start, power_w), timeline ns
    power_end: int | None = None
    samples: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # NVML gpu -> (ts, W)
    # the critical path's segments on this rank: (timeline ns, dur, name, kind, args, flow out, flow in)
    path: list[tuple[int, int, str, str, tuple[tuple[str, Any], ...], int | None, int | None]] = field(default_factory=list)


@dataclass
class Plan:
    """Everything a timeline export writes but the device events, which are read as they are written."""

    processes: list[Process]
    clocks: list[ClockOffset]
    origins: dict[str, int]  # run -> wall-clock ns of its timeline's 0
    spans: list[dict[str, int]]  # the $spans of sql/timeline_kernels.sql
    selection: str  # the step selection, described (in the metadata)


def make_plan(con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, selection: StepSelection, matched: str) -> Plan:
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
    return Plan(processes, [p.clock for p in processes], origins, spans, selection.describe())


def _processes(clock: pl.DataFrame) -> list[Process]:
    """One process per (run, rank) of the rows of sql/timeline_clock.sql, in run and rank order."""
    processes: list[Process] = []
    for r in clock.sort("run", "rank", "trace_id").iter_rows(named=True):
        if not processes or (processes[-1].run, processes[-1].rank) != (r["run"], r["rank"]):
            processes.append(Process(len(processes), r["run"], r["rank"], clock_offset(r["run"], r["rank"], r), {}))
        processes[-1].shifts[r["trace_id"]] = r["shift_ns"]
    return processes


def _place(by_key: dict[tuple[str, int], Process], windows: pl.DataFrame, steps: pl.DataFrame,
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
        p.windows.setdefault(device, []).append(Window(start + p.shifts[t], dur, step, tuple(values)))
    for p, t, start, end, step, source in in_order(steps, "start_ns", "end_ns", "step", "source"):
        p.steps.append((start + p.shifts[t], end + p.shifts[t], step, source))
    for p, t, start, end, watts in in_order(power, "start_ns", "end_ns", "power_w"):
        p.power.append((start + p.shifts[t], watts))
        p.power_end = max(p.power_end or 0, end + p.shifts[t])


def place_paths(con: duckdb.DuckDBPyConnection, plan: Plan, selection: StepSelection) -> list[str]:
    """Each run's critical paths onto its processes (:attr:`Process.path`), a segment at its own rank's
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


def _place_batch(segments: pl.DataFrame, run: str, by_key: dict[tuple[str, int], Process],
                 flows: Iterator[int]) -> None:
    """A batch's segments onto the processes of their ranks (:func:`place_paths`)."""
    for _, part in segments.sort("step", "order").group_by("step", maintain_order=True):
        before: tuple[Process, int] | None = None  # where the previous segment of the step was placed
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


def _power_samples(
    con: duckdb.DuckDBPyConnection, processes: list[Process], steps: pl.DataFrame,
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
    con: duckdb.DuckDBPyConnection, processes: list[Process], spans: list[dict[str, int]], steps: pl.DataFrame,
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
