"""traceq.intervals against hand-worked answers and a brute-force point-counting reference."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceq import intervals

# --- brute-force reference: mark every integer ns point in [0, LIMIT), share nothing with the code


LIMIT = 200


def covered(starts, ends):
    points = [False] * LIMIT
    for s, e in zip(starts, ends):
        for t in range(int(s), int(e)):
            points[t] = True
    return points


def runs(points):
    """Maximal runs of covered points as [start, end) pairs: disjoint, non-touching, non-empty."""
    out = []
    t = 0
    while t < LIMIT:
        if points[t]:
            start = t
            while t < LIMIT and points[t]:
                t += 1
            out.append((start, t))
        else:
            t += 1
    return out


def pairs(result):
    starts, ends = result
    return list(zip(starts.tolist(), ends.tolist()))


def assert_int64_pair(result):
    starts, ends = result
    assert starts.dtype == np.int64 and ends.dtype == np.int64
    assert starts.ndim == 1 and starts.shape == ends.shape


@st.composite
def interval_sets(draw, max_size=14):
    """Random intervals in [0, LIMIT), unsorted; some copy, touch, nest in or end at an earlier one."""
    draws = draw(
        st.lists(
            st.tuples(st.integers(0, LIMIT - 1), st.integers(0, 40), st.sampled_from(KINDS)),
            max_size=max_size,
        )
    )
    spans = []
    for start, length, kind in draws:
        if not spans or kind == "fresh":
            spans.append((start, min(start + length, LIMIT)))
            continue
        s, e = spans[start % len(spans)]
        if kind == "duplicate":
            spans.append((s, e))
        elif kind == "touching":
            spans.append((e, min(e + length, LIMIT)))
        elif kind == "nested":
            inner = min(s + 1, e)
            spans.append((inner, max(inner, e - 1)))
        else:  # zero-length at an existing end
            spans.append((e, e))
    return (
        np.array([s for s, _ in spans], dtype=np.int64),
        np.array([e for _, e in spans], dtype=np.int64),
    )


KINDS = ["fresh", "fresh", "fresh", "duplicate", "touching", "nested", "empty"]


PROPERTY = settings(max_examples=300, deadline=None)


# --- property tests against the reference


@pytest.mark.slow
@PROPERTY
@given(interval_sets())
def test_union_equals_maximal_runs_of_covered_points(a):
    expected = runs(covered(*a))
    a_copy = (a[0].copy(), a[1].copy())
    got = intervals.union(a)
    assert pairs(got) == expected
    assert_int64_pair(got)
    np.testing.assert_array_equal(a[0], a_copy[0])  # input not sorted or clipped in place
    np.testing.assert_array_equal(a[1], a_copy[1])
    # Real traces carry epoch ns (~1.7e18): a float round trip anywhere would lose the last digits.
    shift = 1_700_000_000_123_456_789
    shifted = intervals.union((a[0] + shift, a[1] + shift))
    assert pairs(shifted) == [(s + shift, e + shift) for s, e in expected]


@pytest.mark.slow
@PROPERTY
@given(interval_sets(), interval_sets())
def test_intersection_equals_points_covered_by_both(a, b):
    ca, cb = covered(*a), covered(*b)
    expected = runs([x and y for x, y in zip(ca, cb)])
    got = intervals.intersection(a, b)
    assert pairs(got) == expected
    assert_int64_pair(got)


@pytest.mark.slow
@PROPERTY
@given(interval_sets(), interval_sets())
def test_difference_equals_points_covered_by_a_not_b(a, b):
    ca, cb = covered(*a), covered(*b)
    expected = runs([x and not y for x, y in zip(ca, cb)])
    got = intervals.difference(a, b)
    assert pairs(got) == expected
    assert_int64_pair(got)


@pytest.mark.slow
@PROPERTY
@given(interval_sets())
def test_total_length_counts_covered_points(a):
    length = intervals.total_length(a)
    assert type(length) is int
    assert length == sum(covered(*a))


@pytest.mark.slow
@PROPERTY
@given(interval_sets(), interval_sets())
def test_overlap_split_counts_covered_points(comm, compute):
    cc, cp = covered(*comm), covered(*compute)
    split = intervals.overlap_split(comm, compute)
    assert split.comm_ns == sum(cc)
    assert split.overlapped_comm_ns == sum(x and y for x, y in zip(cc, cp))
    assert split.exposed_comm_ns == sum(x and not y for x, y in zip(cc, cp))
    if split.comm_ns == 0:
        assert math.isnan(split.overlap_ratio)
    else:
        assert split.overlap_ratio == split.overlapped_comm_ns / split.comm_ns


@pytest.mark.slow
@PROPERTY
@given(interval_sets(), interval_sets(), interval_sets())
def test_breakdown_counts_covered_points(comm, compute, memcpy):
    cc, cp, cm = covered(*comm), covered(*compute), covered(*memcpy)
    all_starts = [*comm[0], *compute[0], *memcpy[0]]
    all_ends = [*comm[1], *compute[1], *memcpy[1]]
    window_ns = int(max(all_ends)) - int(min(all_starts)) if all_starts else 0
    busy = sum(x or y or z for x, y, z in zip(cc, cp, cm))
    expected = {
        "comm_ns": sum(cc),
        "compute_ns": sum(cp),
        "overlapped_comm_ns": sum(x and y for x, y in zip(cc, cp)),
        "exposed_comm_ns": sum(x and not y for x, y in zip(cc, cp)),
        "exposed_memcpy_ns": sum(z and not x and not y for x, y, z in zip(cc, cp, cm)),
        "busy_ns": busy,
        "window_ns": window_ns,
        "idle_ns": window_ns - busy,
    }
    got = intervals.breakdown(comm, compute, memcpy)
    assert got.as_dict() == expected
    assert all(type(v) is int for v in got.as_dict().values())


@pytest.mark.slow
@PROPERTY
@given(interval_sets(), interval_sets(), interval_sets(), st.integers(0, 50), st.integers(0, 50))
def test_breakdown_identity_sums_to_window(comm, compute, memcpy, before, after):
    for window in (None, (-before, LIMIT + after)):
        b = intervals.breakdown(comm, compute, memcpy, window=window)
        total = b.compute_ns + b.exposed_comm_ns + b.exposed_memcpy_ns + b.idle_ns
        assert total == b.window_ns
        assert b.idle_ns >= 0
    assert b.window_ns == LIMIT + after + before


# --- hand-worked examples


def test_union_merges_overlapping_nested_touching_and_drops_zero_length():
    # [0,10) + [5,15) overlap -> [0,15); [15,20) touches -> [0,20); [2,3) nested -> nothing new;
    # [30,30) is zero-length -> dropped; [40,50) twice -> [40,50). Input order shuffled.
    starts = [40, 15, 0, 30, 2, 5, 40]
    ends = [50, 20, 10, 30, 3, 15, 50]
    assert pairs(intervals.union((starts, ends))) == [(0, 20), (40, 50)]
    assert intervals.total_length((starts, ends)) == 20 + 10


def test_intersection_and_difference_by_hand():
    # a = [0,10) + [20,30); b = [5,25).
    # a ∩ b = [5,10) + [20,25); a − b = [0,5) + [25,30); b − a = [10,20).
    a = ([0, 20], [10, 30])
    b = ([5], [25])
    assert pairs(intervals.intersection(a, b)) == [(5, 10), (20, 25)]
    assert pairs(intervals.difference(a, b)) == [(0, 5), (25, 30)]
    assert pairs(intervals.difference(b, a)) == [(10, 20)]


def test_intersection_of_touching_pieces_is_merged():
    # a = [0,10); b = [0,5) + [5,10) (touching, not merged in the input) -> a ∩ b = [0,10), one piece.
    assert pairs(intervals.intersection(([0], [10]), ([0, 5], [5, 10]))) == [(0, 10)]


def test_intervals_that_only_touch_do_not_intersect():
    # [0,10) and [10,20) share no nanosecond.
    assert pairs(intervals.intersection(([0], [10]), ([10], [20]))) == []
    assert pairs(intervals.difference(([0], [10]), ([10], [20]))) == [(0, 10)]


def test_overlap_split_by_hand():
    # comm U = [0,15) + [20,30) = 25 ns; compute = [10,25).
    # overlapped = [10,15) + [20,25) = 10; exposed = [0,10) + [25,30) = 15; ratio = 10/25.
    split = intervals.overlap_split(([0, 5, 20], [10, 15, 30]), ([10], [25]))
    assert (split.comm_ns, split.overlapped_comm_ns, split.exposed_comm_ns) == (25, 10, 15)
    # the window is their extent, [0, 30): busy [0, 30) too, no idle
    assert (split.compute_ns, split.busy_ns, split.window_ns, split.idle_ns) == (15, 30, 30, 0)
    assert split.overlap_ratio == pytest.approx(0.4)


def test_overlap_ratio_is_nan_without_comm():
    split = intervals.overlap_split(([], []), ([0], [10]))
    assert (split.comm_ns, split.overlapped_comm_ns, split.exposed_comm_ns) == (0, 0, 0)
    assert math.isnan(split.overlap_ratio)


def test_overlap_split_is_frozen():
    split = intervals.overlap_split(([0], [10]), ([0], [5]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        split.comm_ns = 1  # type: ignore[misc]


def test_breakdown_by_hand_with_and_without_window():
    # comm U = [0,15) + [20,30) = 25; compute = [10,25) = 15; comm ∪ compute = [0,30).
    # overlapped = [10,15) + [20,25) = 10; exposed comm = 25 - 10 = 15.
    # memcpy = [12,22) (hidden under compute) + [30,40) (touches comm's end, exposed) -> 10.
    # busy = [0,40) = 40. Window None: 0..40 = 40, idle 0. Window (0,100): idle 60.
    # Identity: 15 + 15 + 10 + 0 = 40 and 15 + 15 + 10 + 60 = 100.
    comm = ([0, 5, 20], [10, 15, 30])
    compute = ([10], [25])
    memcpy = ([30, 12], [40, 22])
    expected = {
        "comm_ns": 25,
        "compute_ns": 15,
        "overlapped_comm_ns": 10,
        "exposed_comm_ns": 15,
        "exposed_memcpy_ns": 10,
        "busy_ns": 40,
        "window_ns": 40,
        "idle_ns": 0,
    }
    assert intervals.breakdown(comm, compute, memcpy).as_dict() == expected
    assert intervals.breakdown(comm, compute, memcpy, window=(0, 100)).as_dict() == {
        **expected,
        "window_ns": 100,
        "idle_ns": 60,
    }


def test_breakdown_window_includes_zero_length_kernels():
    # A zero-duration comm kernel at 5 ns and compute [10,20): window 5..20 = 15, busy 10, idle 5.
    b = intervals.breakdown(([5], [5]), ([10], [20]), ([], []))
    assert (b.window_ns, b.busy_ns, b.idle_ns, b.comm_ns) == (15, 10, 5, 0)


def test_breakdown_of_nothing_is_all_zero():
    b = intervals.breakdown(([], []), ([], []), ([], [])).as_dict()
    assert set(b.values()) == {0}
    assert len(b) == 8
    assert intervals.breakdown(([], []), ([], [])).as_dict() == b  # memcpy left out: none


def test_empty_sets_give_empty_results():
    assert pairs(intervals.union(([], []))) == []
    assert pairs(intervals.intersection(([], []), ([0], [10]))) == []
    assert pairs(intervals.difference(([0], [10]), ([], []))) == [(0, 10)]
    assert intervals.total_length((np.array([], dtype=np.int64), np.array([], dtype=np.int64))) == 0


def test_accepts_lists_tuples_and_any_integer_dtype():
    expected = [(0, 20)]
    assert pairs(intervals.union(((0, 10), (10, 20)))) == expected
    assert pairs(intervals.union((np.array([0, 10], np.int32), np.array([10, 20], np.int32)))) == expected
    assert pairs(intervals.union((np.array([0, 10], np.uint64), np.array([10, 20], np.uint16)))) == expected


# --- input validation


def test_mismatched_lengths_raise_interval_error_naming_the_input():
    with pytest.raises(intervals.IntervalError, match=r"comm: 2 starts but 1 ends"):
        intervals.overlap_split(([0, 1], [5]), ([], []))


def test_end_before_start_raises_interval_error():
    with pytest.raises(intervals.IntervalError, match=r"interval 1 ends before it starts \(start=7 ns, end=6 ns\)"):
        intervals.union(([0, 7], [5, 6]))
    with pytest.raises(intervals.IntervalError, match=r"^b: "):
        intervals.difference(([0], [1]), ([3], [2]))


def test_two_dimensional_input_raises_interval_error():
    with pytest.raises(intervals.IntervalError, match="1-D"):
        intervals.union(([[0, 1]], [[2, 3]]))
    with pytest.raises(intervals.IntervalError, match="1-D"):
        intervals.total_length((0, 5))


def test_float_times_raise_interval_error():
    # Kineto's float microseconds must be converted to integer ns before they get here.
    with pytest.raises(intervals.IntervalError, match="integer ns"):
        intervals.union(([0.0, 1.5], [1.0, 2.0]))


def test_values_beyond_int64_raise_interval_error():
    with pytest.raises(intervals.IntervalError, match="int64"):
        intervals.union((np.array([0], np.uint64), np.array([2**63], np.uint64)))
    with pytest.raises(intervals.IntervalError):
        intervals.union(([0], [2**70]))


def test_bad_window_raises_interval_error():
    empty = ([], [])
    with pytest.raises(intervals.IntervalError, match="window: end 5 ns is before start 10 ns"):
        intervals.breakdown(empty, empty, empty, window=(10, 5))
    with pytest.raises(intervals.IntervalError, match="window"):
        intervals.breakdown(empty, empty, empty, window=(0.5, 10))
    # a whole number as a float is most often microseconds: not taken for ns
    with pytest.raises(intervals.IntervalError, match="is not integer ns"):
        intervals.breakdown(empty, empty, empty, window=(0.0, 30.0))
    with pytest.raises(intervals.IntervalError, match="window"):
        intervals.breakdown(empty, empty, empty, window=(0, 1, 2))


def test_breakdown_rejects_a_set_that_is_not_a_pair():
    with pytest.raises(intervals.IntervalError, match=r"memcpy: expected a \(starts, ends\) pair"):
        intervals.breakdown(([], []), ([], []), ([0], [1], [2]))


def test_interval_error_is_a_value_error_of_the_module_itself():
    """Copied into another profiler, the module needs nothing of traceq: its error is its own ValueError."""
    with pytest.raises(ValueError):
        intervals.union(([1], [0]))
    assert intervals.IntervalError.__module__ == "traceq.intervals"


# --- packaging


def test_import_loads_no_heavy_dependency():
    code = (
        "import sys, traceq.intervals; "
        "heavy = {'pandas', 'polars', 'duckdb', 'pyarrow', 'torch', 'plotly'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_breakdown_clips_intervals_to_the_window():
    # comm [0, 100), compute [50, 300), window [0, 200): compute counts [50, 200) only, by hand:
    # comm 100, compute 150, overlapped [50, 100) = 50, exposed [0, 50) = 50, busy [0, 200) = 200, idle 0
    got = intervals.breakdown(([0], [100]), ([50], [300]), ([], []), window=(0, 200))
    assert got.as_dict() == {"comm_ns": 100, "compute_ns": 150, "overlapped_comm_ns": 50, "exposed_comm_ns": 50,
                   "exposed_memcpy_ns": 0, "busy_ns": 200, "window_ns": 200, "idle_ns": 0}
    # wholly outside the window: no length; a memcpy straddling the end counts up to it
    got = intervals.breakdown(([300], [400]), ([-50], [20]), ([180], [260]), window=(0, 200))
    assert (got.comm_ns, got.compute_ns, got.exposed_memcpy_ns, got.idle_ns) == (0, 20, 20, 160)


@pytest.mark.slow
@PROPERTY
@given(interval_sets(), interval_sets(), interval_sets(), st.integers(0, LIMIT), st.integers(0, LIMIT))
def test_breakdown_identity_holds_in_any_window(comm, compute, memcpy, a, b):
    lo, hi = min(a, b), max(a, b)
    got = intervals.breakdown(comm, compute, memcpy, window=(lo, hi))
    assert got.compute_ns + got.exposed_comm_ns + got.exposed_memcpy_ns + got.idle_ns == hi - lo
    assert 0 <= got.idle_ns <= hi - lo and got.busy_ns <= hi - lo
    # the same as clipping by hand first
    clip = lambda pair: ([min(max(s, lo), hi) for s in pair[0]], [min(max(e, lo), hi) for e in pair[1]])  # noqa: E731
    assert got == intervals.breakdown(clip(comm), clip(compute), clip(memcpy), window=(lo, hi))
