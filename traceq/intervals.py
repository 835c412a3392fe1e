"""Interval algebra on integer-nanosecond spans: union, intersection, difference, overlap.

Depends on numpy and the standard library only, so other profilers can copy or import it alone (its
one exception, :class:`IntervalError`, is a ValueError).

One convention in, two kinds of result out:

- An interval set is one argument, a ``(starts, ends)`` pair of 1-D arrays (or lists) of integer
  nanoseconds, half-open ``[start, end)``, in any order, possibly overlapping, nested, duplicated or
  zero-length; an :class:`Intervals` is such a pair.
- A set operation (:func:`union`, :func:`intersection`, :func:`difference`) gives an :class:`Intervals`,
  normalised: int64 arrays, sorted, disjoint and non-touching, without zero-length intervals. A
  measurement (:func:`breakdown`, :func:`overlap_split`) gives a :class:`Breakdown` of integer ns;
  :func:`total_length` gives the one number it measures.

Every function is O(n log n) (one sort plus vectorised sweeps).

    >>> import numpy as np
    >>> from traceq import intervals
    >>> comm = (np.array([0, 5, 20]), np.array([10, 15, 30]))  # ns; U = [0,15) + [20,30)
    >>> compute = ([10], [25])
    >>> split = intervals.overlap_split(comm, compute)
    >>> split.comm_ns, split.overlapped_comm_ns, split.exposed_comm_ns, split.overlap_ratio
    (25, 10, 15, 0.4)
    >>> intervals.breakdown(comm, compute, memcpy=([30], [40])).exposed_memcpy_ns
    10
    >>> intervals.union(comm).starts.tolist(), intervals.union(comm).ends.tolist()
    ([0, 20], [15, 30])

Metric definitions (docs/explanation/metrics.md) live in ``breakdown``; the other functions are the
building blocks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "Breakdown",
    "IntervalError",
    "Intervals",
    "breakdown",
    "difference",
    "intersection",
    "overlap_split",
    "total_length",
    "union",
]


class Intervals(NamedTuple):
    """An interval set: ``starts`` and ``ends`` (exclusive), int64 ns. What the set operations return
    (normalised), and what any function takes where it takes a ``(starts, ends)`` pair."""

    starts: np.ndarray
    ends: np.ndarray


Spans = tuple[np.ndarray, np.ndarray]


class IntervalError(ValueError):
    """Input that is not a set of integer-nanosecond intervals; the message names the argument and the fix."""


_INT64_MAX = np.iinfo(np.int64).max
_NONE: Spans = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


def union(intervals: Any) -> Intervals:
    """The union of an interval set, U(intervals): sorted, disjoint, non-touching, no zero-length ones.

    Args:
        intervals: ``(starts, ends)``, integer ns (1-D array-likes of equal length, ``end >= start``).
    """
    return Intervals(*_union(*_validate(intervals, "intervals")))


def intersection(a: Any, b: Any) -> Intervals:
    """U(a) ∩ U(b), normalised like :func:`union`. ``a``, ``b``: ``(starts, ends)`` pairs, integer ns."""
    return Intervals(*_combine(_union(*_validate(a, "a")), _union(*_validate(b, "b")), keep_a_only=False, keep_both=True))


def difference(a: Any, b: Any) -> Intervals:
    """U(a) − U(b): the time of ``a`` not covered by ``b``, normalised like :func:`union`. ``a``, ``b``:
    ``(starts, ends)`` pairs, integer ns."""
    return Intervals(*_combine(_union(*_validate(a, "a")), _union(*_validate(b, "b")), keep_a_only=True, keep_both=False))


def total_length(intervals: Any) -> int:
    """|U(intervals)|: the covered length in ns, overlaps counted once, as a Python int.
    ``intervals``: ``(starts, ends)``, integer ns."""
    return _length(union(intervals))


@dataclass(frozen=True)
class Breakdown:
    """One GPU's time (docs/explanation/metrics.md), all integer ns, under the names of traceq's metrics:

    ``comm_ns`` |U(comm)|, ``compute_ns`` |U(compute)|, ``overlapped_comm_ns`` |U(comm) ∩ U(compute)|,
    ``exposed_comm_ns`` |U(comm) − U(compute)|, ``exposed_memcpy_ns`` |U(memcpy) − U(compute) − U(comm)|,
    ``busy_ns`` |U(all)|, ``window_ns`` and ``idle_ns`` (window − busy). Always
    ``overlapped_comm_ns + exposed_comm_ns == comm_ns`` and
    ``compute_ns + exposed_comm_ns + exposed_memcpy_ns + idle_ns == window_ns``.
    """

    comm_ns: int
    compute_ns: int
    overlapped_comm_ns: int
    exposed_comm_ns: int
    exposed_memcpy_ns: int
    busy_ns: int
    window_ns: int
    idle_ns: int

    @property
    def overlap_ratio(self) -> float:
        """overlapped_comm_ns / comm_ns (HTA's comp_comm_overlap_pctg / 100); nan when there is no comm."""
        if self.comm_ns == 0:
            return math.nan
        return self.overlapped_comm_ns / self.comm_ns

    def as_dict(self) -> dict[str, int]:
        """The figures by name (for a table row)."""
        return asdict(self)


def overlap_split(comm: Any, compute: Any) -> Breakdown:
    """How much communication time compute hides: :func:`breakdown` of ``comm`` and ``compute`` alone
    (``comm_ns``, ``overlapped_comm_ns``, ``exposed_comm_ns``, ``overlap_ratio``; the window is their
    extent). ``comm``, ``compute``: ``(starts, ends)`` pairs, integer ns."""
    return breakdown(comm, compute)


def breakdown(comm: Any, compute: Any, memcpy: Any = _NONE, window: tuple[int, int] | None = None) -> Breakdown:
    """Break one GPU's time into the figures of docs/explanation/metrics.md (:class:`Breakdown`), all in integer ns.

    Args:
        comm: ``(starts, ends)`` of communication kernels, integer ns.
        compute: ``(starts, ends)`` of compute kernels, integer ns.
        memcpy: ``(starts, ends)`` of memcpy and memset activity, integer ns (default: none).
        window: ``(start, end)`` of the device window in ns; when None, the earliest start to the
            latest end over all three sets (zero-length intervals included), or empty when all
            three are empty. Intervals are clipped to a given window: only their time inside it
            counts, so ``idle_ns`` is never negative nor longer than the window.
    """
    raw = {name: _validate(pair, name) for name, pair in (("comm", comm), ("compute", compute), ("memcpy", memcpy))}
    if window is not None:
        lo, hi = _window_pair(window)
        raw = {name: _clip(spans, lo, hi) for name, spans in raw.items()}
    comm_u = _union(*raw["comm"])
    compute_u = _union(*raw["compute"])
    memcpy_u = _union(*raw["memcpy"])

    comm_ns = _length(comm_u)
    overlapped_ns = _length(_combine(comm_u, compute_u, keep_a_only=False, keep_both=True))
    gpu_u = _union(*_concat(comm_u, compute_u))
    exposed_memcpy_ns = _length(_combine(memcpy_u, gpu_u, keep_a_only=True, keep_both=False))
    busy_ns = _length(_union(*_concat(gpu_u, memcpy_u)))
    window_ns = _window_length(window, raw.values())
    return Breakdown(
        comm_ns=comm_ns,
        compute_ns=_length(compute_u),
        overlapped_comm_ns=overlapped_ns,
        exposed_comm_ns=comm_ns - overlapped_ns,
        exposed_memcpy_ns=exposed_memcpy_ns,
        busy_ns=busy_ns,
        window_ns=window_ns,
        idle_ns=window_ns - busy_ns,
    )


# --- internals -------------------------------------------------------------------------------


def _validate(pair: Any, name: str) -> Spans:
    starts, ends = _as_pair(pair, name)
    s = _as_int64(starts, f"{name} starts")
    e = _as_int64(ends, f"{name} ends")
    if s.shape != e.shape:
        raise IntervalError(
            f"{name}: {s.shape[0]} starts but {e.shape[0]} ends; pass one end per start"
        )
    bad = np.flatnonzero(e < s)
    if bad.size:
        i = int(bad[0])
        raise IntervalError(
            f"{name}: interval {i} ends before it starts (start={int(s[i])} ns, end={int(e[i])} ns);"
            f" {bad.size} such interval(s); pass end >= start"
        )
    return s, e


def _as_int64(values: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError, OverflowError) as exc:
        raise IntervalError(f"{what}: cannot be read as an integer array ({exc}); pass integer ns") from exc
    if arr.ndim != 1:
        raise IntervalError(f"{what}: expected a 1-D array, got shape {arr.shape}; pass one value per interval")
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind == "u":
        if int(arr.max()) > _INT64_MAX:
            raise IntervalError(f"{what}: a value exceeds the int64 range; pass ns that fit in int64")
        return arr.astype(np.int64)
    if arr.dtype.kind == "f" and np.isnan(arr).any():  # a nullable integer column (pandas Int64) with NA
        i = int(np.flatnonzero(np.isnan(arr))[0])
        raise IntervalError(f"{what}: value {i} is missing (NA or NaN), {int(np.isnan(arr).sum())} in all; "
                            "drop or fill the intervals without times first")
    if arr.dtype.kind != "i":
        raise IntervalError(
            f"{what}: dtype {arr.dtype} is not an integer type; convert times to integer ns first"
        )
    return arr.astype(np.int64, copy=False)


def _as_pair(pair: Any, name: str) -> tuple[Any, Any]:
    try:
        starts, ends = pair
    except (TypeError, ValueError) as exc:
        raise IntervalError(f"{name}: expected a (starts, ends) pair of arrays; got {type(pair).__name__}"
                            + (f" of {len(pair)}" if hasattr(pair, "__len__") else "")
                            + ": a list of (start, end) pairs is zip(*pairs) away") from exc
    return starts, ends


def _clip(spans: Spans, lo: int, hi: int) -> Spans:
    """The parts of ``spans`` inside [lo, hi); an interval wholly outside keeps no length."""
    s, e = spans
    s, e = np.clip(s, lo, hi), np.clip(e, lo, hi)
    return s, e


def _union(s: np.ndarray, e: np.ndarray) -> Spans:
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s.copy(), e.copy()
    order = np.argsort(s)
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)  # furthest end seen so far, left to right
    # Strict '>': a start equal to the reach so far touches the group and merges into it.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], reach[:-1], out=new[1:])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def _combine(a: Spans, b: Spans, *, keep_a_only: bool, keep_both: bool) -> Spans:
    """Sweep two normalised sets; keep elementary segments covered by a only and/or by both."""
    points = np.sort(np.concatenate((*a, *b)))
    if points.size < 2:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    # Dedupe by hand: np.union1d/np.unique are many times slower here (hash-based in numpy 2.x).
    points = points[np.append(True, points[1:] != points[:-1])]
    lo, hi = points[:-1], points[1:]
    # Every boundary of a and b is a point, so coverage is constant on [lo, hi): test lo.
    in_a, in_b = _covers(a, lo), _covers(b, lo)
    keep = np.zeros(lo.size, dtype=bool)
    if keep_a_only:
        keep |= in_a & ~in_b
    if keep_both:
        keep |= in_a & in_b
    return _merge_touching(lo[keep], hi[keep])


def _covers(spans: Spans, points: np.ndarray) -> np.ndarray:
    starts, ends = spans
    idx = np.searchsorted(starts, points, side="right") - 1
    hit = idx >= 0
    hit[hit] = points[hit] < ends[idx[hit]]
    return hit


def _merge_touching(s: np.ndarray, e: np.ndarray) -> Spans:
    """Merge sorted, disjoint segments where one ends exactly where the next starts."""
    if s.size == 0:
        return s, e
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.not_equal(s[1:], e[:-1], out=new[1:])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], e[last]


def _concat(a: Spans, b: Spans) -> Spans:
    return np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1]))


def _length(spans: Spans) -> int:
    starts, ends = spans
    return int((ends - starts).sum())


def _window_length(window: tuple[int, int] | None, sets: Any) -> int:
    if window is not None:
        lo, hi = _window_pair(window)
        return hi - lo
    sets = list(sets)
    starts = np.concatenate([s for s, _ in sets])
    if starts.size == 0:
        return 0
    ends = np.concatenate([e for _, e in sets])
    return int(ends.max()) - int(starts.min())


def _window_pair(window: Any) -> tuple[int, int]:
    lo, hi = _as_pair(window, "window")
    # integers only: a float here is most often microseconds (Kineto's unit), and 25.0 would pass for 25 ns
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (lo, hi)):
        raise IntervalError(f"window: {window!r} is not integer ns; convert to integer ns first")
    lo_i, hi_i = int(lo), int(hi)
    if hi_i < lo_i:
        raise IntervalError(f"window: end {hi_i} ns is before start {lo_i} ns; pass (start_ns, end_ns)")
    return lo_i, hi_i
