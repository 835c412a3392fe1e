"""The SQL metrics (sql/interval_breakdown.sql) and traceq.intervals agree on random kernel sets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceq import intervals
from traceq.report.metrics import breakdown_metrics, step_metrics
from traceq.store.warehouse import connect

KINDS = {"comm": (1, "ncclDevKernel_AllReduce_Sum_f32"), "compute": (1, "void gemm_kernel()"),
         "memcpy": (2, "Memcpy DtoD"), "memset": (3, "Memset (Device)")}

event = st.tuples(
    st.sampled_from(sorted(KINDS)),
    st.integers(0, 300),  # start
    st.integers(0, 60),  # duration (zero-length kernels included)
    st.integers(0, 3),  # stream
)


def warehouse_with(events: list[tuple[str, int, int, int]], kinds: dict[str, tuple[int, str]] = KINDS):
    """A warehouse of one trace whose GPU events are ``events`` (label, start, dur, stream); ``kinds``
    maps each label to its event kind and kernel name."""
    con = connect(":memory:")
    con.execute("insert into runs (run) values ('r')")
    con.execute(
        "insert into traces (trace_id, run, path, content_digest, size_bytes, rank_source, n_events, n_gpu_events,"
        " n_host_events, n_dropped) values (1, 'r', 'x', 'h', 0, 'option', 0, 0, 0, 0)"
    )
    for name_id, (kind, name) in enumerate(kinds.values()):
        con.execute("insert into names values (1, ?, ?)", [name_id, name])
    ids = {label: i for i, label in enumerate(kinds)}
    con.executemany(
        "insert into gpu_events (trace_id, rank, device, stream, kind, name_id, start_ns, dur_ns, step)"
        " values (1, 0, 0, ?, ?, ?, ?, ?, 1)",
        [[stream, kinds[label][0], ids[label], start, dur] for label, start, dur, stream in events],
    )
    return con


def intervals_of(events: list[tuple[str, int, int, int]], *labels: str) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the events with one of ``labels``."""
    sel = [(s, s + d) for label, s, d, _ in events if label in labels]
    return np.array([a for a, _ in sel], dtype=np.int64), np.array([b for _, b in sel], dtype=np.int64)


@pytest.mark.slow
@settings(max_examples=50, deadline=None)
@given(st.lists(event, min_size=1, max_size=25))
def test_sql_breakdown_equals_interval_api_on_random_kernels(events: list[tuple[str, int, int, int]]) -> None:
    con = warehouse_with(events)
    row = step_metrics(con, whole_trace=True).row(0, named=True)
    expected = intervals.breakdown(
        intervals_of(events, "comm"), intervals_of(events, "compute"), intervals_of(events, "memcpy", "memset")
    ).as_dict()
    for name, value in expected.items():
        assert row[name] == value, name
    assert row["comm_kernel_ns"] == sum(d for c, _, d, _ in events if c == "comm")
    assert row["compute_kernel_ns"] == sum(d for c, _, d, _ in events if c == "compute")


COLLECTIVES = {
    "AllReduce": (1, "ncclDevKernel_AllReduce_Sum_f32"),
    "AllGather": (1, "ncclDevKernel_AllGather_RING_LL"),
    "compute": (1, "void gemm_kernel()"),
}
labelled_kernel = st.tuples(st.sampled_from(sorted(COLLECTIVES)), st.integers(0, 300), st.integers(0, 60),
                            st.integers(0, 3))


@settings(max_examples=50, deadline=None)
@given(st.lists(labelled_kernel, min_size=1, max_size=25))
@pytest.mark.slow
def test_exposed_comm_by_collective_equals_interval_api(kernels: list[tuple[str, int, int, int]]) -> None:
    """sql/exposed_comm_by_collective.sql: per collective type, |U(its comm) - U(compute)|."""
    con = warehouse_with(kernels, COLLECTIVES)
    frame = breakdown_metrics(con, "exposed_comm_by_collective_us", whole_trace=True)
    got = dict(zip(frame["collective_type"], frame["exposed_comm_ns"]))
    compute, nothing = intervals_of(kernels, "compute"), intervals_of([], "memcpy")
    expected = {
        label: intervals.breakdown(intervals_of(kernels, label), compute, nothing).exposed_comm_ns
        for label in ("AllReduce", "AllGather") if any(c == label for c, *_ in kernels)
    }
    assert got == expected
