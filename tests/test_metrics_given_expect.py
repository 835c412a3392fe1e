"""Given/expect tests of the SQL metrics on tiny hand-made traces, answers worked out by hand."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.tracegen import TraceBuilder
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric, step_metrics
from traceq.report.selection import StepSelection, relation
from traceq.store.warehouse import connect

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def one_step_trace() -> TraceBuilder:
    """Step 1 (CPU span 0..100 us) with kernels on four streams; times in ns.

    compute A [10000, 30000] s7, B [25000, 40000] s8, F [80000, 80000] (zero length), G [90000, 95000]
    comm    C [35000, 60000] s20, E [65000, 75000] s21
    memcpy  D [55000, 70000] s7
    """
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100_000)
    t.kernel("void gemm_kernel<float>()", 10_000, 30_000, stream=7, launch_ns=1_000)
    t.kernel("void elementwise_kernel<float>()", 25_000, 40_000, stream=8, launch_ns=2_000)
    t.kernel(NCCL, 35_000, 60_000, stream=20, launch_ns=3_000)
    t.kernel("Memcpy DtoD (Device -> Device)", 55_000, 70_000, stream=7, launch_ns=4_000, cat="gpu_memcpy")
    t.kernel(NCCL, 65_000, 75_000, stream=21, launch_ns=5_000)
    t.kernel("void fill_kernel()", 80_000, 80_000, stream=7, launch_ns=6_000)
    t.kernel("void relu_kernel()", 90_000, 95_000, stream=7, launch_ns=7_000)
    return t


def test_interval_metrics_of_one_step_match_hand_computation(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_traces([one_step_trace().write(tmp_path / "job" / "rank0.json")], db, threads=1)
    with connect(db) as con:
        row = step_metrics(con).row(0, named=True)
    # U(compute) = [10,40] + [90,95] us = 35 us; U(comm) = [35,60] + [65,75] = 35 us
    assert row["compute_ns"] == 35_000
    assert row["comm_ns"] == 35_000
    # comm ∩ compute = [35,40] -> 5 us; exposed = 35 - 5 = 30 us
    assert row["overlapped_comm_ns"] == 5_000
    assert row["exposed_comm_ns"] == 30_000
    # memcpy [55,70] minus comm [55,60],[65,70] minus compute -> [60,65] = 5 us
    assert row["exposed_memcpy_ns"] == 5_000
    # window 10..95 = 85 us; busy = [10,75] + [90,95] = 70 us; idle 15 us
    assert row["window_ns"] == 85_000
    assert row["idle_ns"] == 15_000
    assert row["comm_kernel_ns"] == 35_000  # 25 + 10
    assert row["compute_kernel_ns"] == 40_000  # 20 + 15 + 0 + 5
    assert row["overlap_ratio"] == pytest.approx(5 / 35)
    assert row["step_time_ms"] == pytest.approx(0.1)
    assert row["compute_ns"] + row["exposed_comm_ns"] + row["exposed_memcpy_ns"] + row["idle_ns"] == row["window_ns"]


def two_step_trace() -> TraceBuilder:
    """Steps 1 (0..100 us) and 2 (100..200 us).

    - K1 launched at 50 us (step 1) runs 120..130 us, i.e. during step 2's CPU span: belongs to step 1.
    - K2 launched at 150 us (step 2) runs 160..170 us.
    - nccl N2 launched at 155 us runs 165..185 us: 5 us overlapped with K2, 15 us exposed, in step 2.
    - G has no launch event; the device-side ProfilerStep#2 annotation (140..199 us) contains it.
    - U has no launch event and starts after every step: unattributed.
    """
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100_000)
    t.step(2, 100_000, 200_000)
    t.kernel("void gemm_kernel()", 120_000, 130_000, launch_ns=50_000)
    t.kernel("void gemm_kernel()", 160_000, 170_000, launch_ns=150_000)
    t.kernel(NCCL, 165_000, 185_000, stream=20, launch_ns=155_000)
    t.kernel("void graph_kernel()", 190_000, 195_000)
    t.kernel("void late_kernel()", 300_000, 301_000)
    t.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#2", "pid": 0, "tid": 7,
                     "ts": 140.0, "dur": 59.0, "args": {"device": 0}})
    return t


def test_kernels_belong_to_the_step_that_launched_them(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_traces([two_step_trace().write(tmp_path / "job" / "rank0.json.gz")], db, threads=1)
    with connect(db) as con:
        gpu_activity = relation(con, "gpu_activity")  # noqa: F841 (the SQL reads it by name)
        rows = con.sql(
            "select name, step, step_source from gpu_activity order by start_ns"
        ).fetchall()
    assert rows == [
        ("void gemm_kernel()", 1, "launch"),
        ("void gemm_kernel()", 2, "launch"),
        (NCCL, 2, "launch"),
        ("void graph_kernel()", 2, "device_annotation"),
        ("void late_kernel()", None, None),
    ]


@pytest.mark.slow
def test_step_selection_and_whole_trace_window(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_traces([two_step_trace().write(tmp_path / "job" / "rank0.json")], db, threads=1)
    # by default the last step (its device window open) is left out
    assert compute_metric(db, "exposed_comm", by=["run", "rank", "step"])["step"].to_list() == [1]
    every = StepSelection(include_last=True)
    per_step = compute_metric(db, "exposed_comm", by=["run", "rank", "step"], selection=every)
    assert per_step["step"].to_list() == [1, 2]
    assert per_step["exposed_comm_us"].to_list() == [0.0, 15.0]
    skipped = compute_metric(db, "exposed_comm", by=["run", "rank", "step"],
                             selection=StepSelection(skip_steps=1, include_last=True))
    assert skipped["step"].to_list() == [2]
    only_1 = compute_metric(db, "exposed_comm", by=["run", "rank", "step"], selection=StepSelection.parse("1:1"))
    assert only_1["step"].to_list() == [1]
    hta_like = compute_metric(db, "exposed_comm", by=["run", "rank", "step"], selection=StepSelection(drop_last=True))
    assert hta_like["step"].to_list() == [1]
    # whole trace: every kernel, the unattributed one included; comm 20 us, 5 us hidden by K2
    whole = compute_metric(db, "comm", by=["run", "rank"], whole_trace=True)
    assert whole["comm_us"].to_list() == [20.0]
    # mean over the two steps of exposed comm (0 and 15 us)
    agg = compute_metric(db, "exposed_comm", by=["run", "rank"], selection=every)
    assert agg.select("steps", "exposed_comm_us", "exposed_comm_us_median").row(0) == (2, 7.5, 7.5)


def test_rank_comes_from_event_args_when_a_file_merges_ranks(tmp_path: Path) -> None:
    t = TraceBuilder(rank=None)
    for r in (0, 1):
        t.step(1, 0, 100_000, rank=r)
        t.kernel(NCCL, 10_000 + r * 1000, 20_000, launch_ns=1_000, rank=r, device=r)
    db = tmp_path / "w.duckdb"
    ingest_traces([t.write(tmp_path / "merged" / "all.json")], db, threads=1)
    frame = compute_metric(db, "comm", by=["run", "rank"])
    assert frame.select("rank", "comm_us").rows() == [(0, 10.0), (1, 9.0)]
    with connect(db) as con:
        assert con.sql("select rank_source from traces").fetchall() == [("event args",)]


def test_rank_from_file_name_and_unknown(tmp_path: Path) -> None:
    named = TraceBuilder(rank=None)
    named.step(1, 0, 10_000)
    anonymous = TraceBuilder(rank=None)
    anonymous.step(1, 0, 10_000)
    anonymous.kernel("k", 0, 1, launch_ns=0)  # distinct content
    db = tmp_path / "w.duckdb"
    ingest_traces([named.write(tmp_path / "r" / "worker-rank_7.json"), anonymous.write(tmp_path / "r" / "x.json")], db, threads=1)
    with connect(db) as con:
        got = con.sql("select file_rank, rank_source from traces order by trace_id").fetchall()
    assert got == [(7, "file name"), (-1, "unknown")]  # a rank of its own: -1, the first free one


@pytest.mark.slow
def test_user_rules_reclassify_existing_data(tmp_path: Path) -> None:
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100_000)
    t.kernel("my_custom_allreduce_kernel", 10_000, 20_000, launch_ns=1_000)
    db = tmp_path / "w.duckdb"
    ingest_traces([t.write(tmp_path / "j" / "rank0.json")], db, threads=1)
    assert compute_metric(db, "comm")["comm_us"].to_list() == [0.0]
    rules = tmp_path / "rules.csv"
    rules.write_text("priority,pattern,class,category,collective\n5,^my_custom_allreduce,comm,custom,AllReduce\n")
    from traceq.store.schema import add_rules

    with connect(db) as con:
        gpu_activity = relation(con, "gpu_activity")  # noqa: F841 (the SQL reads it by name)
        add_rules(con, rules)
    assert compute_metric(db, "comm")["comm_us"].to_list() == [10.0]
    with connect(db, read_only=True) as con:
        gpu_activity = relation(con, "gpu_activity")  # noqa: F841 (the SQL reads it by name)
        assert con.sql("select collective_type from gpu_activity").fetchall() == [("AllReduce",)]
    assert isinstance(compute_metric(db, "comm"), pl.DataFrame)


def cpu_gloo_trace() -> TraceBuilder:
    """Step 1 (0..100 us). Main thread: aten::mm [10,40] us, c10d::allreduce_ [40,41] (enqueue only,
    not compute), aten::add [60,70]. pt_gloo_runloop thread: gloo:all_reduce [41,65].
    comm 24 us; compute [10,40] + [60,70] = 40 us; overlapped [60,65] = 5 us; exposed 19 us;
    window: the step's CPU span 0..100 = 100 us; busy [10,40] + [41,70] = 59 us; idle 41 us."""
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100_000)

    def op(cat: str, name: str, tid: int, start_ns: int, end_ns: int) -> None:
        t.events.append({"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid,
                         "ts": start_ns / 1000, "dur": (end_ns - start_ns) / 1000, "args": {}})

    op("cpu_op", "aten::mm", 1, 10_000, 40_000)
    op("cpu_op", "c10d::allreduce_", 1, 40_000, 41_000)
    op("cpu_op", "aten::add", 1, 60_000, 70_000)
    op("user_annotation", "gloo:all_reduce", 2, 41_000, 65_000)
    t.events.append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 2, "args": {"name": "pt_gloo_runloop"}})
    return t


def test_cpu_gloo_communication_is_measured_on_cpu_only_traces(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_traces([cpu_gloo_trace().write(tmp_path / "cpu" / "rank0.json")], db, threads=1)
    with connect(db) as con:
        row = step_metrics(con).row(0, named=True)
    assert row["activity"] == "cpu"
    assert (row["comm_ns"], row["compute_ns"], row["overlapped_comm_ns"], row["exposed_comm_ns"]) == (
        24_000, 40_000, 5_000, 19_000
    )
    assert (row["window_ns"], row["idle_ns"]) == (100_000, 41_000)


@pytest.mark.slow
def test_gpu_and_cpu_only_traces_in_one_warehouse_each_get_their_own_rows(tmp_path: Path) -> None:
    """A warehouse with GPU traces only has no CPU-side rows (that sweep is skipped); one with a
    CPU-only trace beside them has both, with the values of each trace alone (one_step_trace and
    cpu_gloo_trace, worked out above)."""
    db = tmp_path / "w.duckdb"
    ingest_traces([one_step_trace().write(tmp_path / "gpu" / "rank0.json")], db, threads=1)
    with connect(db) as con:
        assert step_metrics(con)["activity"].to_list() == ["gpu"]
    ingest_traces([cpu_gloo_trace().write(tmp_path / "cpu" / "rank0.json")], db, threads=1)
    with connect(db) as con:
        rows = {r["run"]: r for r in step_metrics(con).iter_rows(named=True)}
    assert {run: r["activity"] for run, r in rows.items()} == {"gpu": "gpu", "cpu": "cpu"}
    assert (rows["gpu"]["comm_ns"], rows["gpu"]["exposed_comm_ns"]) == (35_000, 30_000)
    assert (rows["cpu"]["comm_ns"], rows["cpu"]["exposed_comm_ns"]) == (24_000, 19_000)
