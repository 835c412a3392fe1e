"""The SQL metrics (sql/interval_breakdown.sql) and traceq.intervals agree on random kernel sets."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from traceq import intervals
from traceq.metrics import breakdown_metrics, step_metrics
from traceq.warehouse import connect

KINDS = {"comm": (1, "ncclDevKernel_AllReduce_Sum_f32"), "compute": (1, "void gemm_kernel()"),
         "memcpy": (2, "Memcpy DtoD"), "memset": (3, "Memset (Device)")}

event = st.tuples(
    st.sampled_from(sorted(KINDS)),
    st.integers(0, 300),  # start
    st.integers(0, 60),  # duration (zero-length kernels included)
    st.integers(0, 3),  # stream
)


def warehouse_with(events: list[tuple[str, int, int, int]]):
    con = connect(":memory:")
    con.execute("insert into runs (run) values ('r')")
    con.execute(
        "insert into traces (trace_id, run, path, content_sha256, size_bytes, rank_source, n_events, n_gpu_events,"
        " n_host_events, n_dropped) values (1, 'r', 'x', 'h', 0, 'option', 0, 0, 0, 0)"
    )
    for name_id, (kind, name) in enumerate(KINDS.values()):
        con.execute("insert into names values (1, ?, ?)", [name_id, name])
    ids = {cls: i for i, cls in enumerate(KINDS)}
    con.executemany(
        "insert into gpu_events (trace_id, rank, device, stream, kind, name_id, start_ns, dur_ns, step)"
        " values (1, 0, 0, ?, ?, ?, ?, ?, 1)",
        [[stream, KINDS[cls][0], ids[cls], start, dur] for cls, start, dur, stream in events],
    )
    return con


@settings(max_examples=50, deadline=None)
@given(st.lists(event, min_size=1, max_size=25))
def test_sql_breakdown_equals_interval_api_on_random_kernels(events: list[tuple[str, int, int, int]]) -> None:
    con = warehouse_with(events)
    row = step_metrics(con, window="trace").row(0, named=True)

    def pair(*classes: str) -> tuple[np.ndarray, np.ndarray]:
        sel = [(s, s + d) for c, s, d, _ in events if c in classes]
        return np.array([a for a, _ in sel], dtype=np.int64), np.array([b for _, b in sel], dtype=np.int64)

    expected = intervals.breakdown(pair("comm"), pair("compute"), pair("memcpy", "memset"))
    for name, value in expected.items():
        assert row[name] == value, name
    assert row["comm_kernel_ns"] == sum(d for c, _, d, _ in events if c == "comm")
    assert row["compute_kernel_ns"] == sum(d for c, _, d, _ in events if c == "compute")


COLLECTIVES = {"AllReduce": "ncclDevKernel_AllReduce_Sum_f32", "AllGather": "ncclDevKernel_AllGather_RING_LL",
               "compute": "void gemm_kernel()"}
labelled_kernel = st.tuples(st.sampled_from(sorted(COLLECTIVES)), st.integers(0, 300), st.integers(0, 60),
                            st.integers(0, 3))


@settings(max_examples=50, deadline=None)
@given(st.lists(labelled_kernel, min_size=1, max_size=25))
def test_exposed_comm_by_collective_equals_interval_api(kernels: list[tuple[str, int, int, int]]) -> None:
    """sql/exposed_comm_by_collective.sql: per collective type, |U(its comm) - U(compute)|."""
    con = connect(":memory:")
    con.execute("insert into runs (run) values ('r')")
    con.execute(
        "insert into traces (trace_id, run, path, content_sha256, size_bytes, rank_source, n_events, n_gpu_events,"
        " n_host_events, n_dropped) values (1, 'r', 'x', 'h', 0, 'option', 0, 0, 0, 0)"
    )
    ids = {label: i for i, label in enumerate(COLLECTIVES)}
    con.executemany("insert into names values (1, ?, ?)", [[i, COLLECTIVES[label]] for label, i in ids.items()])
    con.executemany(
        "insert into gpu_events (trace_id, rank, device, stream, kind, name_id, start_ns, dur_ns, step)"
        " values (1, 0, 0, ?, 1, ?, ?, ?, 1)",
        [[stream, ids[label], start, dur] for label, start, dur, stream in kernels],
    )
    frame = breakdown_metrics(con, "exposed_comm_by_collective_us", window="trace")
    got = dict(zip(frame["collective_type"], frame["exposed_comm_ns"]))

    def pair(label: str) -> tuple[np.ndarray, np.ndarray]:
        sel = [(s, s + d) for c, s, d, _ in kernels if c == label]
        return np.array([a for a, _ in sel], dtype=np.int64), np.array([b for _, b in sel], dtype=np.int64)

    nothing = (np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    expected = {
        label: intervals.breakdown(pair(label), pair("compute"), nothing)["exposed_comm_ns"]
        for label in ("AllReduce", "AllGather") if any(c == label for c, *_ in kernels)
    }
    assert got == expected
