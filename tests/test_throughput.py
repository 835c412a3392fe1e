"""Throughput, FLOPs/MFU, exposed comm by collective and process group, and the aggregation of steps ->
ranks -> runs, on hand-made traces whose answers are worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.tracegen import TraceBuilder
from traceq.catalog import METRIC_NAMES
from traceq.cli import app
from traceq.errors import ConfigError
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric, metric_report
from traceq.report.selection import StepSelection
from traceq.store.run_metadata import set_run_metadata
from traceq.store.warehouse import connect

EVERY = StepSelection(include_last=True)  # these hand-made traces' figures are worked out for every step

MS = 1_000_000
US = 1_000
# N = 1e6, L = 2, H = 4, Q = 16, T = 100: 6N + 12LHQT = 6,000,000 + 153,600 = 6,153,600 FLOPs per token
MODEL = {"n_params_non_embedding": 1_000_000, "n_layers": 2, "n_heads": 4, "head_dim": 16, "seq_len": 100}
FLOPS_PER_STEP = 6_153_600 * 4000


def write_rank(run_dir: Path, rank: int, step_ms: list[int], meta: dict | None) -> Path:
    t = TraceBuilder(rank=rank)
    start = 0
    for n, dur in enumerate(step_ms, start=1):
        t.step(n, start * MS, (start + dur) * MS)
        t.kernel("void gemm_kernel()", start * MS + 10 * US, start * MS + 50 * US, launch_ns=start * MS + 1 * US)
        start += dur
    path = t.write(run_dir / f"rank{rank}.trace.json")
    if meta is not None:
        (run_dir / f"rank{rank}.run.json").write_text(json.dumps({"rank": rank, **meta}))
    return path


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    """run job: 2 ranks, steps r0 = 100, 200 ms and r1 = 100, 400 ms; run job2: 1 rank file, 100, 100 ms.
    Both: world_size 2, 4000 tokens per step (2000 per GPU)."""
    meta = {"world_size": 2, "tokens_per_step": 4000, "warmup_steps": 0, "tp": 1, "model": "tiny", **MODEL}
    files = [write_rank(tmp_path / "job", 0, [100, 200], meta), write_rank(tmp_path / "job", 1, [100, 400], meta),
             write_rank(tmp_path / "job2", 0, [100, 100], meta)]
    db = tmp_path / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    return db


def test_every_new_metric_is_listed() -> None:
    assert {"tokens_per_s", "global_tokens_per_s", "tflops", "mfu", "power_w", "energy_j", "tokens_per_j",
            "exposed_comm_by_collective_us", "exposed_comm_by_pg_us", "step_time_ms"} <= set(METRIC_NAMES)


def test_tokens_per_second_per_gpu_and_global_by_hand(two_runs: Path) -> None:
    steps = compute_metric(two_runs, "tokens_per_s", by=["run", "rank", "step"], runs=["job"], selection=EVERY)
    # 2000 tokens per GPU per step over 0.1, 0.2 s (rank 0) and 0.1, 0.4 s (rank 1)
    assert steps["tokens_per_s"].to_list() == pytest.approx([20_000, 10_000, 20_000, 5_000])
    glob = compute_metric(two_runs, "global_tokens_per_s", by=["run", "rank", "step"], runs=["job"], selection=EVERY)
    assert glob["global_tokens_per_s"].to_list() == pytest.approx([40_000, 20_000, 40_000, 10_000])


def test_tflops_and_mfu_follow_the_flops_convention_and_the_peak(two_runs: Path) -> None:
    set_run_metadata(two_runs, "job", {"peak_tflops": 0.5})
    rows = compute_metric(two_runs, "tflops", by=["run", "rank", "step"], runs=["job"], selection=EVERY)
    # 2.46144e10 FLOPs per step / 2 GPUs / 0.1 s = 1.23072e11 FLOP/s = 0.123072 TFLOP/s
    assert rows["tflops"].to_list() == pytest.approx([0.123072, 0.061536, 0.123072, 0.030768])
    report = metric_report(two_runs, "mfu", by=["run", "rank", "step"], runs=["job"], selection=EVERY)
    mfu, notes = report.table, report.notes
    assert mfu["mfu"].to_list() == pytest.approx([0.246144, 0.123072, 0.246144, 0.061536])
    text = "\n".join(notes)
    assert "6·N + 12·L·H·Q·T" in text and "H100 SXM 989" in text and "A100 312" in text
    assert f"run job: {FLOPS_PER_STEP:.4g} FLOPs/step (6N+12LHQT); peak 0.5 TFLOP/s (user)" in text


def test_user_flops_replace_the_convention(two_runs: Path) -> None:
    set_run_metadata(two_runs, "job", {"flops_per_step": 2e11, "peak_tflops": 1.0})
    rows = compute_metric(two_runs, "tflops", by=["run", "rank", "step"], runs=["job"], selection=EVERY)
    assert rows["tflops"][0] == pytest.approx(2e11 / 2 / 0.1 / 1e12)  # 1.0 TFLOP/s
    set_run_metadata(two_runs, "job2", {"model_flops_per_token": 1e6, "gpu_model": "NVIDIA A100-SXM4-80GB"})
    report = metric_report(two_runs, "mfu", by=["run", "rank", "step"], runs=["job2"])
    mfu, notes = report.table, report.notes
    # 1e6 x 4000 / 2 / 0.1 s = 2e10 FLOP/s = 0.02 TFLOP/s; / 312
    assert mfu["mfu"][0] == pytest.approx(0.02 / 312)
    assert any("model_flops_per_token" in n and "312 TFLOP/s (table, A100 for 'NVIDIA A100-SXM4-80GB')" in n for n in notes)


@pytest.mark.slow
def test_steps_then_ranks_then_runs(two_runs: Path) -> None:
    per_rank = compute_metric(two_runs, "tokens_per_s", by=["run", "rank"], runs=["job"], selection=EVERY)
    assert per_rank.select("rank", "steps", "tokens_per_s", "tokens_per_s_median", "tokens_per_s_p10",
                           "tokens_per_s_p90").rows() == [
        # a rate over steps is total tokens / total time (DESIGN §5): 2 x 2000 / 0.3 s, 2 x 2000 / 0.5 s;
        # the spread stays per step (20,000 and 10,000; 20,000 and 5,000 tokens/s)
        (0, 2, pytest.approx(4000 / 0.3), pytest.approx(15_000), pytest.approx(11_000), pytest.approx(19_000)),
        (1, 2, pytest.approx(8_000), pytest.approx(12_500), pytest.approx(6_500), pytest.approx(18_500)),
    ]
    per_run = compute_metric(two_runs, "tokens_per_s", by=["run"], selection=EVERY)
    job = per_run.filter(per_run["run"] == "job").row(0, named=True)
    # the run: 4 rank-steps x 2000 tokens / (0.1 + 0.2 + 0.1 + 0.4 s); min and max over the ranks' figures
    assert (job["ranks"], job["tokens_per_s"], job["tokens_per_s_min"], job["tokens_per_s_max"]) == (
        2, pytest.approx(10_000), pytest.approx(8_000), pytest.approx(4000 / 0.3))
    assert (job["slowest_rank"], job["slowest_step_time_ms"]) == (1, pytest.approx(250.0))
    # --by a metadata column: job (10,000) and job2 (2 x 2000 / 0.2 s = 20,000) over world size 2. A group's
    # row is its runs: per rank-step, job has 2000 tokens in 0.2 s and job2 2000 in 0.1 s, so the group
    # 2000 tokens in 0.15 s (its step_time_ms row: 150 ms) = 13,333 tokens/s, and 13,333 x 0.15 s = 2000
    # tokens; pooling its 6 rank-steps (6 x 2000 / 1.0 s = 12,000) contradicted the row's 150 ms
    by_ws = compute_metric(two_runs, "tokens_per_s,step_time", by=["world_size"], selection=EVERY).row(0, named=True)
    assert (by_ws["world_size"], by_ws["runs"], by_ws["ranks"]) == (2, 2, 3)
    assert by_ws["tokens_per_s"] == pytest.approx(2000 / 0.15)
    assert by_ws["step_time_ms"] == pytest.approx(150.0)
    assert (by_ws["tokens_per_s_min"], by_ws["tokens_per_s_max"]) == (pytest.approx(10_000), pytest.approx(20_000))
    assert (by_ws["slowest_run"], by_ws["slowest_rank"]) == ("job", 1)
    with_meta = compute_metric(two_runs, "step_time_ms", by=["run", "model", "tp"], selection=EVERY)
    assert with_meta.select("run", "model", "tp", "step_time_ms").rows() == [
        ("job", "tiny", 1, pytest.approx(200.0)), ("job2", "tiny", 1, pytest.approx(100.0))]


def test_report_by_metadata_from_the_cli_and_bad_columns(two_runs: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["report", "--include-last", "--metric", "tokens_per_s", "--by", "world_size,model", "--format", "json",
                             "--db", str(two_runs)])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)[0]["tokens_per_s"] == pytest.approx(2000 / 0.15)  # as test_steps_then_ranks_then_runs
    assert "steps used: run job: steps 1..2" in ok.stderr
    bad = runner.invoke(app, ["report", "--by", "colour", "--db", str(two_runs)])
    assert bad.exit_code == 1 and "unknown column(s) ['colour']" in bad.stderr


def test_missing_tokens_per_step_is_said_not_guessed(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "bare", 0, [100], None)], db, threads=1)
    report = metric_report(db, "tokens_per_s", by=["run"])
    frame, notes = report.table, report.notes
    assert frame["tokens_per_s"].to_list() == [None]
    assert any("traceq runs set bare --tokens-per-step N" in n for n in notes)
    set_run_metadata(db, "bare", {"tokens_per_step": 500, "world_size": 1})
    assert compute_metric(db, "tokens_per_s", by=["run"], selection=EVERY)["tokens_per_s"].to_list() == [pytest.approx(5_000)]


NCCL_AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
PG0 = {"Collective name": "allreduce", "Process Group Name": "0", "Process Group Description": "default_pg"}
PG1_AR = {"Collective name": "allreduce", "Process Group Name": "1", "Process Group Description": "tp"}
PG1_AG = {"Collective name": "_allgather_base", "Process Group Name": "1", "Process Group Description": "tp"}


def collective_trace() -> TraceBuilder:
    """Step 1 (0..200 us): compute [10, 40], [105, 120]; AllReduce/default_pg [30, 60];
    AllGather/tp [50, 80]; AllReduce/tp [100, 110]. Step 2 (200..400 us): AllGather/tp [210, 220] only.

    Step 1 exposed: total U(comm) − U(compute) = [40, 80] + [100, 105] = 45 us.
    AllReduce: [30, 60] + [100, 110] − compute = [40, 60] + [100, 105] = 25; AllGather: [50, 80] = 30.
    default_pg: [40, 60] = 20; tp: [50, 80] + [100, 105] = 35. Both pairs sum to 55 > 45 ([50, 60] twice).
    Step 2: AllGather 10, AllReduce 0; tp 10, default_pg 0.
    """
    t = TraceBuilder(rank=0)
    t.step(1, 0, 200 * US)
    t.step(2, 200 * US, 400 * US)
    t.kernel("void gemm_kernel()", 10 * US, 40 * US, launch_ns=1 * US)
    t.kernel("void gemm_kernel()", 105 * US, 120 * US, launch_ns=2 * US)
    t.kernel(NCCL_AR, 30 * US, 60 * US, stream=20, launch_ns=3 * US, **PG0)
    t.kernel(NCCL_AG, 50 * US, 80 * US, stream=21, launch_ns=4 * US, **PG1_AG)
    t.kernel(NCCL_AR, 100 * US, 110 * US, stream=21, launch_ns=5 * US, **PG1_AR)
    t.kernel(NCCL_AG, 210 * US, 220 * US, stream=21, launch_ns=201 * US, **PG1_AG)
    return t


@pytest.mark.slow
def test_exposed_comm_by_collective_and_process_group_by_hand(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_traces([collective_trace().write(tmp_path / "job" / "rank0.json")], db, threads=1)
    total = compute_metric(db, "exposed_comm", by=["run", "rank", "step"], selection=EVERY)
    assert total["exposed_comm_us"].to_list() == [45.0, 10.0]
    by_type = compute_metric(db, "exposed_comm_by_collective", by=["run", "rank", "step"], selection=EVERY)
    assert by_type.select("step", "collective_type", "exposed_comm_by_collective_us").rows() == [
        (1, "AllGather", 30.0), (1, "AllReduce", 25.0), (2, "AllGather", 10.0), (2, "AllReduce", 0.0)]
    by_pg = compute_metric(db, "exposed_comm_by_pg", by=["run", "rank", "step"], selection=EVERY)
    assert by_pg.select("step", "process_group", "exposed_comm_by_pg_us").rows() == [
        (1, "default_pg (0)", 20.0), (1, "tp (1)", 35.0), (2, "default_pg (0)", 0.0), (2, "tp (1)", 10.0)]
    # mean over both steps, absent collectives counting as 0
    report = metric_report(db, "exposed_comm_by_collective", by=["run", "rank"], selection=EVERY)
    mean, notes = report.table, report.notes
    assert mean.select("collective_type", "exposed_comm_by_collective_us").rows() == [("AllGather", 20.0), ("AllReduce", 12.5)]
    assert any("can sum to more than exposed_comm_us" in n for n in notes)


def test_steps_without_gpu_activity_still_get_throughput(tmp_path: Path) -> None:
    t = TraceBuilder(rank=0)
    t.step(1, 0, 50 * MS)  # a CPU-only trace (gloo): no kernel at all
    path = t.write(tmp_path / "cpu" / "rank0.json")
    (tmp_path / "cpu" / "rank0.run.json").write_text(json.dumps({"rank": 0, "world_size": 1, "tokens_per_step": 100}))
    db = tmp_path / "w.duckdb"
    ingest_traces([path], db, threads=1)
    with connect(db, read_only=True) as con:
        from traceq.report.metrics import step_metrics

        row = step_metrics(con).row(0, named=True)
    # the step's CPU span is its window, and nothing ran in it
    assert row["tokens_per_s"] == pytest.approx(2_000) and row["exposed_comm_us"] == 0
    assert row["window_us"] == row["idle_us"] == 50_000
    with pytest.raises(ConfigError, match="metric='tokens_per_s': measured per step"):
        metric_report(db, "tokens_per_s", whole_trace=True)


def test_a_run_json_of_traceq_0_1_still_ingests(tmp_path: Path) -> None:
    """0.1's collector wrote `device` where it now writes `device_type`; its other keys kept their names."""
    meta = {"world_size": 1, "tokens_per_step": 2000, "warmup_steps": 0, "device": "cuda",
            "gpu_model": "NVIDIA H100 80GB HBM3", "peak_tflops": 989.0, "peak_tflops_source": "table", **MODEL}
    path = write_rank(tmp_path / "old", 0, [100, 100], meta)
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    from traceq.report.runs import list_runs

    run = list_runs(db).row(0, named=True)
    assert (run["device_type"], run["gpu_model"], run["peak_tflops"]) == ("cuda", "NVIDIA H100 80GB HBM3", 989.0)
    # 2000 tokens in 100 ms on one GPU: 20,000 tokens/s; 6,153,600 FLOPs per token -> 123.072 TFLOP/s
    mfu = compute_metric(db, "mfu", by="run", selection=EVERY)["mfu"][0]
    assert mfu == pytest.approx(20_000 * 6_153_600 / 989e12)


@pytest.mark.slow
def test_flops_per_step_alone_gives_tflops_and_mfu_and_a_missing_input_is_named(tmp_path: Path) -> None:
    """A model without tokens (ResNet, recsys): FLOPs per step and a peak are enough (DESIGN §5)."""
    from traceq.report.scaling import scaling_report

    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "resnet", 0, [100, 300, 100], None)], db, threads=1)
    set_run_metadata(db, "resnet", {"flops_per_step": 4e11})
    report = metric_report(db, "tflops,mfu", by="run")
    table, notes = report.table, report.notes
    # world size 2 (distributedInfo), steps 1 and 2 (the last left out): 2 x 4e11 / 2 / 0.4 s = 1 TFLOP/s
    assert table["tflops"].to_list() == [pytest.approx(1.0)]
    assert table["mfu"].to_list() == [None]
    text = "\n".join(notes)
    assert "tokens_per_step unknown" not in text
    assert "run resnet: 4e+11 FLOPs/step (flops_per_step); GPU unknown, so mfu is empty: traceq runs set resnet --gpu-model" in text
    scaling_notes = "\n".join(scaling_report(db).notes)
    assert "run resnet: GPU unknown, so mfu is empty" in scaling_notes and "no run has a peak" not in scaling_notes
    set_run_metadata(db, "resnet", {"gpu_model": "NVIDIA A100-SXM4-80GB"})
    assert compute_metric(db, "mfu", by="run")["mfu"].to_list() == [pytest.approx(1.0 / 312)]
    assert scaling_report(db).table["mfu"].to_list() == [pytest.approx(1.0 / 312)]
