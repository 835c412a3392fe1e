"""Reference computation of per-step GPU power and energy, straight from a run's raw files.

Written APART from traceq's SQL: it reads nothing from ``traceq/`` nor ``sql/``, only the data files
of one run directory (``rank0.trace.json.gz``, ``rank0.run.json``, ``rank0.power.jsonl``), and uses
only the standard library. Tests compare traceq's figures against it.

What it computes, per ``ProfilerStep#N`` (the design contract):

Steps
  CPU events with ``ph == "X"``, ``cat == "user_annotation"`` and name ``ProfilerStep#N``. Times are
  exact integer nanoseconds: JSON numbers are parsed as ``Decimal``; ``start = round(ts * 1000)``,
  ``end = start + round(dur * 1000)`` (half-even rounding). Several events of one N merge into
  min(start)..max(end). Wall-clock ns = trace ns + offset, where offset is the trace's
  ``baseTimeNanoseconds``, else ``run.json`` ``clock.offset_ns``. The step's window is
  ``[start, end)`` mapped to wall time; ``window_s`` is its length in seconds.

power_w
  Power samples (``kind == "power"``, ``power_w`` at ``wall_ns``) of one GPU are a step function: a
  sample's value holds from its ``wall_ns`` until the next power sample of the same GPU (for the last
  sample: the ``end`` record's ``wall_ns``, or only the cap when the log has no end record), but for
  at most ``max(2 * interval_ms, 1000 ms)`` after the sample (``interval_ms`` from the header, default
  100). power_w of a GPU is the time-weighted mean of that function over the window (divided by the
  covered time); if the held samples leave any part of the window uncovered (or the GPU has no
  samples there) the step's power_w is None. Several GPUs: the sum of their means (None if any GPU
  has a gap).

energy_j
  With energy-counter records (``kind == "energy"``, ``energy_mj`` at ``wall_ns``): per GPU, the
  counter as a function of time is the straight line through its *changes*: the records sorted by
  ``wall_ns``, keeping only those whose value differs from the record before (the first record
  kept). (The H200 corpus's counter moves only about every 100 ms, in ~60-73 J ticks, so a ~87 ms
  step often starts and ends on the same reading: the difference of raw reads is 0 J there.) The
  step's energy runs from its window's start to the next step's start (the last step: its end), so
  that steps tile; each boundary is interpolated exactly (``Fraction``) between the two kept records
  around it; a boundary before the first kept record or after the last has no value. energy_j is the
  difference over 1000, summed over the GPUs, source ``"energy counter"``, used only when every GPU
  has a value at both boundaries. Otherwise, if power_w is known: ``power_w * window_s``, source
  ``"power integral"``. Otherwise both are None.

tokens_per_j
  ``tokens_per_step`` (run.json) / energy_j when both are known and energy_j > 0, else None.
"""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
NS_PER_S = Decimal(10**9)


def _number(value):
    """A JSON number as Decimal (bools and non-finite values are not numbers), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        return None
    value = Decimal(value)
    return value if value.is_finite() else None


def _ns(value: Decimal) -> int:
    """Microseconds -> integer nanoseconds, rounded half-even."""
    return int(round(value * 1000))


def read_steps(trace_path: Path) -> tuple[dict[int, tuple[int, int]], int | None]:
    """{N: (start_ns, end_ns) on the trace clock} of the ProfilerStep#N CPU spans, and baseTimeNanoseconds."""
    with gzip.open(trace_path, "rt", encoding="utf-8") as handle:
        trace = json.load(handle, parse_float=Decimal)
    steps: dict[int, tuple[int, int]] = {}
    for event in trace.get("traceEvents", []):
        if not isinstance(event, dict) or event.get("ph") != "X" or event.get("cat") != "user_annotation":
            continue
        match = STEP_NAME.match(str(event.get("name", "")))
        ts, dur = _number(event.get("ts")), _number(event.get("dur"))
        if match is None or ts is None or dur is None or dur < 0:
            continue
        start = _ns(ts)
        end = start + _ns(dur)
        n = int(match.group(1))
        if n in steps:
            start, end = min(start, steps[n][0]), max(end, steps[n][1])
        steps[n] = (start, end)
    base = trace.get("baseTimeNanoseconds")
    base = int(base) if _number(base) is not None else None
    return steps, base


def read_power_log(path: Path) -> dict:
    """The power log's header, power samples, energy marks and end time, grouped per GPU."""
    header: dict = {}
    power: dict[int, list[tuple[int, Decimal]]] = {}
    energy: dict[int, list[tuple[int, int, int]]] = {}
    end_ns = None
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line, parse_float=Decimal)
            kind = record.get("kind")
            if kind == "header":
                header = record
            elif kind == "power" and record.get("power_w") is not None:
                power.setdefault(record["gpu"], []).append((int(record["wall_ns"]), Decimal(record["power_w"])))
            elif kind == "energy" and record.get("energy_mj") is not None:
                energy.setdefault(record["gpu"], []).append(
                    (int(record["wall_ns"]), int(record["step"]), int(record["energy_mj"])))
            elif kind == "end":
                end_ns = int(record["wall_ns"])
    for samples in power.values():
        samples.sort(key=lambda sample: sample[0])
    interval_ms = header.get("interval_ms")
    interval_ms = Decimal(100) if interval_ms is None else Decimal(interval_ms)
    max_hold_ns = int(max(2 * interval_ms, Decimal(1000)) * 1_000_000)
    return {"header": header, "power": power, "energy": energy, "end_ns": end_ns, "max_hold_ns": max_hold_ns}


def held_intervals(samples: list[tuple[int, Decimal]], end_ns: int | None, max_hold_ns: int):
    """[(from_ns, to_ns, watts)]: each sample held until the next one / the end record, capped."""
    intervals = []
    for i, (at, watts) in enumerate(samples):
        if i + 1 < len(samples):
            until = samples[i + 1][0]
        else:
            until = end_ns if end_ns is not None else at + max_hold_ns
        until = min(until, at + max_hold_ns)
        if until > at:
            intervals.append((at, until, watts))
    return intervals


def mean_power(intervals, start: int, end: int) -> Decimal | None:
    """Time-weighted mean watts over [start, end); None if the intervals leave a gap in it."""
    if end <= start:
        return None
    covered = 0
    weighted = Decimal(0)
    for at, until, watts in intervals:
        overlap = min(until, end) - max(at, start)
        if overlap > 0:
            covered += overlap
            weighted += watts * overlap
    if covered != end - start:  # intervals of one GPU do not overlap, so less means a gap
        return None
    return weighted / covered


def first_mark(marks: list[tuple[int, int, int]], step: int) -> tuple[int, int] | None:
    """(wall_ns, energy_mj) of the earliest energy record with this step number."""
    hits = [(at, mj) for at, n, mj in marks if n == step]
    return min(hits) if hits else None


def counter_at(marks: list[tuple[int, int, int]], at_ns: int) -> Fraction | None:
    """The energy counter (mJ) at wall-clock ``at_ns``: linear between the records where it changed."""
    changes: list[tuple[int, int]] = []
    for wall_ns, _, mj in sorted(marks):
        if not changes or changes[-1][1] != mj:
            changes.append((wall_ns, mj))
    for (t0, e0), (t1, e1) in zip(changes, changes[1:]):
        if t0 <= at_ns <= t1:
            return e0 + Fraction(e1 - e0) * Fraction(at_ns - t0, t1 - t0)
    if changes and at_ns == changes[-1][0]:
        return Fraction(changes[-1][1])
    return None


def _to_float(value):
    return None if value is None else float(value)


def step_power(run_dir: Path) -> dict[int, dict]:
    """{N: {"window_s", "power_w", "energy_j", "energy_source", "tokens_per_j"}} for one rank-0 run dir."""
    run_dir = Path(run_dir)
    steps, base = read_steps(run_dir / "rank0.trace.json.gz")
    run = json.loads((run_dir / "rank0.run.json").read_text(encoding="utf-8"))
    offset = base if base is not None else int(run["clock"]["offset_ns"])
    tokens = run.get("tokens_per_step")
    log = read_power_log(run_dir / "rank0.power.jsonl")
    held = {gpu: held_intervals(samples, log["end_ns"], log["max_hold_ns"]) for gpu, samples in log["power"].items()}

    result: dict[int, dict] = {}
    for n in sorted(steps):
        start, end = steps[n][0] + offset, steps[n][1] + offset
        window_s = Decimal(end - start) / NS_PER_S

        power_w = None
        if held:
            means = [mean_power(intervals, start, end) for intervals in held.values()]
            power_w = None if any(m is None for m in means) else sum(means, Decimal(0))

        energy_j, source = None, None
        if log["energy"]:
            later = [m for m in steps if m > n]
            energy_end = steps[min(later)][0] + offset if later else end
            pairs = [(counter_at(marks, start), counter_at(marks, energy_end)) for marks in log["energy"].values()]
            if all(a is not None and b is not None and b >= a for a, b in pairs):
                delta = sum((b - a for a, b in pairs), Fraction(0)) / 1000
                energy_j = Decimal(delta.numerator) / Decimal(delta.denominator)
                source = "energy counter"
        if energy_j is None and power_w is not None:
            energy_j, source = power_w * window_s, "power integral"

        tokens_per_j = None
        if tokens is not None and energy_j is not None and energy_j > 0:
            tokens_per_j = Decimal(tokens) / energy_j

        result[n] = {
            "window_s": float(window_s),
            "power_w": _to_float(power_w),
            "energy_j": _to_float(energy_j),
            "energy_source": source,
            "tokens_per_j": _to_float(tokens_per_j),
        }
    return result


def energy_mark_offsets(run_dir: Path) -> dict[int, float | None]:
    """{N: ms from ProfilerStep#N's wall-clock start to the earliest energy record with step N} (GPU 0 or the first GPU)."""
    run_dir = Path(run_dir)
    steps, base = read_steps(run_dir / "rank0.trace.json.gz")
    run = json.loads((run_dir / "rank0.run.json").read_text(encoding="utf-8"))
    offset = base if base is not None else int(run["clock"]["offset_ns"])
    log = read_power_log(run_dir / "rank0.power.jsonl")
    if not log["energy"]:
        return {n: None for n in steps}
    marks = log["energy"][min(log["energy"])]
    out = {}
    for n in sorted(steps):
        mark = first_mark(marks, n)
        out[n] = None if mark is None else (mark[0] - (steps[n][0] + offset)) / 1e6
    return out
