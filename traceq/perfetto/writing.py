"""A planned timeline written as Perfetto packets: per process, its CPU steps, power, critical path,
device windows and counters, then every stream of its device events as they are read."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from traceq.catalog import WHOLE_TRACE_STEP
from traceq.perfetto.lanes import Counts, Lanes
from traceq.perfetto.plan import COUNTERS, Plan, Process

if TYPE_CHECKING:
    from traceq.perfetto.pftrace import TraceWriter


def write_plan(writer: TraceWriter, plan: Plan, events: Iterator[tuple]) -> Counts:
    """Write ``plan`` on ``writer``: the metadata, then per process its steps and counters and the rows of
    ``events`` that are its (rows in process, device, stream and time order, as sql/timeline_kernels.sql
    gives them). Returns what was written."""
    counts = Counts()
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


def _write_steps(writer: TraceWriter, p: Process, process: int, order: Iterator[int], counts: Counts) -> None:
    """The CPU steps, power, and per device its step windows and their counters."""
    if p.steps:
        lanes = Lanes(writer, p, process, "CPU steps", order,
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
        lanes = Lanes(writer, p, process, "critical path", order,
                      "this rank's segments of each step's critical path across ranks (traceq critical-path); "
                      "arrows: where the path jumps from a rank that waited at a collective to the rank it waited for",
                      counts)
        for ts, dur, name, kind, args, flow_out, flow_in in sorted(p.path, key=lambda x: x[0]):
            lanes.slice(ts, dur, name, kind, args, flow_out=flow_out, flow_in=flow_in)
    for device, rows in sorted(p.windows.items()):
        where = _device_label(device)
        lanes = Lanes(writer, p, process, f"{where} steps (device windows)", order,
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
    writer: TraceWriter, p: Process, process: int, order: Iterator[int], row: tuple, events: Iterator[tuple],
    counts: Counts,
) -> tuple | None:
    """Every event of the stream of ``row`` (rows in time order); returns the first row of the next
    stream (None at the end)."""
    proc, device, stream = row[0], row[1], row[2]
    lanes = Lanes(writer, p, process, f"{_device_label(device)} stream {'?' if stream is None else stream}", order,
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


def _describe(p: Process, origin: int) -> str:
    return (f"run {p.run}, rank {p.rank}. {p.clock.label()}. Time 0 of this run's timeline is {origin} ns of "
            "the reference rank's wall clock (ns since the Unix epoch where the trace gives one).")


def _metadata(plan: Plan) -> dict[str, Any]:
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
