"""Power logs and run metadata beside traces: loaded at ingest, joined to each step's wall-clock window,
and turned into power_w / energy_j / tokens_per_j whose answers are worked out by hand."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import require_module
from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric, step_metrics
from traceq.report.selection import StepSelection
from traceq.store.warehouse import connect

BASE = 1_700_000_000_000_000_000  # baseTimeNanoseconds: wall-clock ns of trace time 0
MS = 1_000_000


def header(source: str = "nvml", gpus: int = 1, **extra: Any) -> dict[str, Any]:
    return {"kind": "header", "traceq_power_log": 1, "source": source,
            "reason": None if source == "nvml" else "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
            "interval_ms": 100.0, "gpus": [{"gpu": g, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{g}"} for g in range(gpus)],
            "clock": "wall_ns = time.time_ns()", "note": "NVML power is a ~1 s moving average", **extra}


def power(at_ms: float, watts: float, step: int, gpu: int = 0) -> dict[str, Any]:
    return {"kind": "power", "wall_ns": BASE + int(at_ms * MS), "step": step, "gpu": gpu, "power_w": watts}


def energy(at_ms: float, mj: int, step: int, gpu: int = 0) -> dict[str, Any]:
    return {"kind": "energy", "wall_ns": BASE + int(at_ms * MS), "step": step, "gpu": gpu, "energy_mj": mj}


def write_rank(run_dir: Path, rank: int, lines: list[dict[str, Any]] | None, meta: dict[str, Any] | None,
               steps: tuple[tuple[int, int], ...] = ((0, 100), (100, 300)), base: int | None = BASE) -> Path:
    """rank<r>.trace.json (+ run.json, power.jsonl): steps 1, 2, ... over the given [start, end] ms of trace time."""
    t = TraceBuilder(rank=rank)
    for n, (lo, hi) in enumerate(steps, start=1):
        t.step(n, lo * MS, hi * MS)
        t.kernel("void gemm_kernel()", lo * MS + 1000, lo * MS + 5000, launch_ns=lo * MS + 10)
    top = {"baseTimeNanoseconds": base} if base is not None else {}
    trace = t.write(run_dir / f"rank{rank}.trace.json", **top)
    if meta is not None:
        (run_dir / f"rank{rank}.run.json").write_text(json.dumps({"rank": rank, **meta}))
    if lines is not None:
        (run_dir / f"rank{rank}.power.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return trace


META = {"world_size": 2, "tokens_per_step": 6000, "warmup_steps": 0, "gpu_model": "NVIDIA A100-SXM4-80GB",
        "peak_tflops": 312.0, "peak_tflops_source": "table"}


def step_rows(db: Path) -> list[dict[str, Any]]:
    with connect(db, read_only=True) as con:
        rows = step_metrics(con, selection=StepSelection(skip_steps=0, include_last=True))
    return rows.sort("rank", "step").to_dicts()


def test_constant_300_w_and_energy_counter_give_hand_computed_step_power(tmp_path: Path) -> None:
    # steps 1 [0, 100] ms and 2 [100, 300] ms of wall time after BASE; 300 W throughout; the energy
    # counter reads 1,000,000 mJ at step 1's start, +30 J at step 2's start, +60 J at step 3's start.
    lines = [header(), power(-50, 300, 0), energy(0, 1_000_000, 1), power(50, 300, 1), energy(100, 1_030_000, 2),
             power(150, 300, 2), power(250, 300, 2), energy(300, 1_090_000, 3),
             {"kind": "end", "wall_ns": BASE + 320 * MS, "step": 3, "samples": 4, "errors": 0}]
    db = tmp_path / "w.duckdb"
    summary = ingest_traces([write_rank(tmp_path / "job", 0, lines, META)], db, threads=1)
    assert summary.ok, summary.files
    s1, s2 = step_rows(db)
    assert (s1["power_w"], s2["power_w"]) == (pytest.approx(300.0), pytest.approx(300.0))
    assert (s1["energy_j"], s2["energy_j"]) == (pytest.approx(30.0), pytest.approx(60.0))
    assert s1["energy_source"] == s2["energy_source"] == "energy counter"
    # 6000 tokens per step over 2 ranks: 3000 tokens on this GPU; 3000 / 30 J and 3000 / 60 J
    assert (s1["tokens_per_j"], s2["tokens_per_j"]) == (pytest.approx(100.0), pytest.approx(50.0))
    assert (s1["tokens_per_s"], s2["tokens_per_s"]) == (pytest.approx(30_000.0), pytest.approx(15_000.0))
    with connect(db, read_only=True) as con:
        windows = con.sql("select step, start_wall_ns - $b, end_wall_ns - $b, offset_source from step_wall_times order by step",
                          params={"b": BASE}).fetchall()
    assert windows == [(1, 0, 100 * MS, "baseTimeNanoseconds"), (2, 100 * MS, 300 * MS, "baseTimeNanoseconds")]


def test_energy_counter_is_interpolated_at_step_boundaries_so_a_step_between_ticks_is_not_0_j(tmp_path: Path) -> None:
    """A counter that ticks coarsely (DESIGN §6): read at 0, 100, 200 and 300 ms as 1,000,000,
    1,000,000 (no tick yet), 1,120,000 and 1,180,000 mJ. The line through its changes runs through
    (0, 1,000,000), (200, 1,120,000) and (300, 1,180,000): 600 mJ/ms, then 600 mJ/ms.
    Steps [0, 90], [100, 190], [200, 290] ms; each step's energy runs to the next step's start, the
    last step's to its end:
      step 1: E(100) - E(0)   = 1,060,000 - 1,000,000 = 60 J (raw reads: 0 J)
      step 2: E(200) - E(100) = 1,120,000 - 1,060,000 = 60 J (raw reads: 120 J)
      step 3: E(290) - E(200) = 1,174,000 - 1,120,000 = 54 J
    and the sum, 174 J, is E(290) - E(0)."""
    lines = [header(), power(-10, 600, 0), energy(0, 1_000_000, 1), energy(100, 1_000_000, 2),
             power(90, 600, 1), power(190, 600, 2), energy(200, 1_120_000, 3), energy(300, 1_180_000, 4),
             {"kind": "end", "wall_ns": BASE + 310 * MS, "step": 4, "samples": 3, "errors": 0}]
    db = tmp_path / "w.duckdb"
    steps = ((0, 90), (100, 190), (200, 290))
    assert ingest_traces([write_rank(tmp_path / "job", 0, lines, META, steps=steps)], db, threads=1).ok
    rows = step_rows(db)
    assert [r["energy_j"] for r in rows] == [pytest.approx(60.0, abs=1e-9), pytest.approx(60.0, abs=1e-9),
                                             pytest.approx(54.0, abs=1e-9)]
    assert {r["energy_source"] for r in rows} == {"energy counter"}


def test_a_boundary_after_the_counter_last_moved_falls_back_to_the_power_integral(tmp_path: Path) -> None:
    # reads 1,000,000 at 0 and 50 ms, 1,030,000 at 80 ms, then 1,030,000 at 100 and 300: the line ends at
    # 80 ms (its last change), so step 1 [0, 100] and step 2 [100, 300] have no counter value at their
    # ends: 300 W x 0.1 s = 30 J and 300 W x 0.2 s = 60 J from the power samples instead of 0 J
    lines = [header(), power(-10, 300, 0), energy(0, 1_000_000, 1), energy(50, 1_000_000, 1),
             energy(80, 1_030_000, 1), energy(100, 1_030_000, 2), power(90, 300, 1), power(190, 300, 2),
             energy(300, 1_030_000, 3), {"kind": "end", "wall_ns": BASE + 300 * MS, "step": 3, "samples": 3, "errors": 0}]
    db = tmp_path / "w.duckdb"
    assert ingest_traces([write_rank(tmp_path / "job", 0, lines, META)], db, threads=1).ok
    s1, s2 = step_rows(db)
    assert (s1["energy_j"], s2["energy_j"]) == (pytest.approx(30.0), pytest.approx(60.0))
    assert s1["energy_source"] == s2["energy_source"] == "power integral"


def test_power_is_time_weighted_between_samples_and_integrated_without_a_counter(tmp_path: Path) -> None:
    # step 1 [0, 100]: 200 W held over [0, 50), 400 W over [50, 100) -> 300 W, 30 J (no energy records)
    # step 2 [100, 300]: 250 W over [100, 200), 350 W over [200, 300) -> 300 W, 60 J
    lines = [header(), power(-10, 200, 0), power(50, 400, 1), power(100, 250, 2), power(200, 350, 2),
             {"kind": "end", "wall_ns": BASE + 300 * MS, "step": 3, "samples": 4, "errors": 0}]
    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "job", 0, lines, META)], db, threads=1)
    s1, s2 = step_rows(db)
    assert (s1["power_w"], s2["power_w"]) == (pytest.approx(300.0), pytest.approx(300.0))
    assert (s1["energy_j"], s2["energy_j"]) == (pytest.approx(30.0), pytest.approx(60.0))
    assert s1["energy_source"] == "power integral"


def test_two_gpus_in_one_log_add_up_and_share_the_tokens(tmp_path: Path) -> None:
    # a rank that logged both GPUs of its node: 100 W + 200 W; tokens of 2 GPUs = 6000 * 2 / 2
    lines = [header(gpus=2), power(-10, 100, 0, gpu=0), power(-10, 200, 0, gpu=1), power(90, 100, 1, gpu=0),
             power(90, 200, 1, gpu=1), power(190, 100, 2, gpu=0), power(190, 200, 2, gpu=1),
             power(290, 100, 2, gpu=0), power(290, 200, 2, gpu=1)]
    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "job", 0, lines, META)], db, threads=1)
    s1, _ = step_rows(db)
    assert s1["power_w"] == pytest.approx(300.0) and s1["power_gpu_count"] == 2
    assert s1["tokens_per_j"] == pytest.approx(6000 / 30.0)


def test_a_gap_longer_than_a_second_is_not_bridged(tmp_path: Path) -> None:
    # samples every 100 ms, except none between 110 and 1390 ms: a sample stands for at most
    # max(2 intervals, 1 s), so 110 holds until 1110 and step 2 [100, 1400] is not covered over [1110, 1390]
    lines = [header(), power(-10, 300, 0), power(90, 300, 1), power(110, 300, 2), power(1390, 300, 2),
             {"kind": "end", "wall_ns": BASE + 1400 * MS, "step": 3, "samples": 4, "errors": 0}]
    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "job", 0, lines, META, steps=((0, 100), (100, 1400)))], db, threads=1)
    s1, s2 = step_rows(db)
    assert s1["power_w"] == pytest.approx(300.0)
    assert s2["power_w"] is None and s2["energy_j"] is None and s2["tokens_per_j"] is None


def test_unavailable_power_log_gives_empty_metrics_and_the_report_says_unavailable(tmp_path: Path) -> None:
    # even if numbers followed an "unavailable" header, they would not be used
    lines = [header("unavailable", gpus=0), power(0, 999, 1)]
    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "job", 0, lines, META)], db, threads=1)
    rows = step_rows(db)
    assert all(r["power_w"] is None and r["energy_j"] is None and r["tokens_per_j"] is None for r in rows)
    assert {r["power_source"] for r in rows} == {"unavailable"}
    with connect(db, read_only=True) as con:
        assert con.sql("select count(*) from power_samples").fetchall() == [(0,)]
    result = CliRunner().invoke(app, ["report", "--metric", "power_w", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "power unavailable (NVMLError_LibraryNotFound" in result.stderr


def test_no_power_log_says_so(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "job", 0, None, META)], db, threads=1)
    assert all(r["power_source"] is None and r["power_w"] is None for r in step_rows(db))
    result = CliRunner().invoke(app, ["report", "--metric", "energy_j", "--db", str(db)])
    assert "power unavailable: no power log" in result.stderr


def test_a_power_log_cut_by_a_crash_loads_and_a_corrupt_one_fails_the_trace(tmp_path: Path) -> None:
    lines = [header(), power(-10, 300, 0), power(90, 300, 1)]
    trace = write_rank(tmp_path / "cut", 0, lines, META, steps=((0, 100),))
    log = tmp_path / "cut" / "rank0.power.jsonl"
    log.write_text(log.read_text() + '{"kind": "power", "wall_')  # the crash cut the last line
    db = tmp_path / "w.duckdb"
    assert ingest_traces([trace], db, threads=1).ok
    assert step_rows(db)[0]["power_w"] == pytest.approx(300.0)

    bad = write_rank(tmp_path / "bad", 1, lines, META, steps=((0, 50),))
    bad_log = tmp_path / "bad" / "rank1.power.jsonl"
    bad_log.write_text("garbage\n" + bad_log.read_text())
    result = ingest_traces([bad], db, threads=1)
    assert result.files[0].status == "failed" and "rank1.power.jsonl" in result.files[0].message
    with connect(db, read_only=True) as con:  # nothing of the failed trace is left behind
        assert con.sql("select count(*) from traces where run = 'bad'").fetchall() == [(0,)]
        assert con.sql("select count(*) from step_wall_times").fetchall() == [(1,)]


@pytest.mark.slow
def test_run_json_fills_run_metadata_and_user_settings_win(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    run_dir = tmp_path / "llama"
    meta = {**META, "tp": 2, "pp": 1, "model": "llama-7b", "host": "node7", "clock": {"offset_ns": BASE}}
    ingest_traces([write_rank(run_dir, 0, None, meta)], db, threads=1)
    runner = CliRunner()
    listed = runner.invoke(app, ["runs", "--format", "json", "--db", str(db)])
    row = json.loads(listed.stdout)[0]
    assert (row["run"], row["world_size"], row["tp"], row["model"], row["tokens_per_step"]) == ("llama", 2, 2, "llama-7b", 6000)
    assert row["gpu_model"] == "NVIDIA A100-SXM4-80GB" and row["peak_tflops"] == 312.0
    with connect(db, read_only=True) as con:
        stored = json.loads(con.sql("select metadata from runs").fetchall()[0][0])
        assert "host" not in stored and "clock" not in stored  # per-rank values stay in run_files
        assert con.sql("select rank, metadata->>'host' from run_files").fetchall() == [(0, "node7")]

    result = runner.invoke(app, ["runs", "set", "llama", "--tokens-per-step", "8000", "--gpu-model", "H100 SXM", "--db", str(db)])
    assert result.exit_code == 0, result.output
    # a later rank's run.json does not undo what the user set
    ingest_traces([write_rank(run_dir, 1, None, meta)], db, threads=1)
    row = json.loads(runner.invoke(app, ["runs", "--run", "llama", "--format", "json", "--db", str(db)]).stdout)[0]
    assert row["tokens_per_step"] == 8000 and row["gpu_model"] == "H100 SXM"
    assert row["peak_tflops"] == 989.0 and row["peak_tflops_source"] == "table"
    assert row["set_by_user"] == "gpu_model,tokens_per_step"  # the peak comes from the table when reported
    runner.invoke(app, ["runs", "set", "llama", "--peak-tflops", "900", "--db", str(db)])
    runner.invoke(app, ["runs", "set", "llama", "--gpu-model", "A100", "--db", str(db)])  # a hand-set peak stays
    row = json.loads(runner.invoke(app, ["runs", "--run", "llama", "--format", "json", "--db", str(db)]).stdout)[0]
    assert (row["peak_tflops"], row["peak_tflops_source"], row["gpu_model"]) == (900.0, "user", "A100")


def test_runs_set_errors_are_one_line_with_the_fix(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "job", 0, None, None)], db, threads=1)
    runner = CliRunner()
    for args, text in [
        (["runs", "set", "nope", "--tp", "2"], "no run 'nope'"),
        (["runs", "set", "job"], "nothing to set"),
        (["runs", "set", "job", "--tp", "0"], "must be positive"),
        # a GPU the peak table does not know would leave MFU without a peak: not without --peak-tflops
        (["runs", "set", "job", "--gpu-model", "Mystery Accelerator 9000"], "not in the peak table"),
    ]:
        result = runner.invoke(app, [*args, "--db", str(db)])
        assert result.exit_code == 1 and text in result.stderr, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1
    ok = runner.invoke(app, ["runs", "set", "job", "--gpu-model", "Mystery Accelerator 9000", "--peak-tflops", "100",
                             "--db", str(db), "--format", "json"])
    assert ok.exit_code == 0, ok.output
    row = json.loads(ok.stdout)[0]
    assert (row["gpu_model"], row["peak_tflops"], row["peak_tflops_source"]) == ("Mystery Accelerator 9000", 100.0, "user")


def test_trace_without_base_time_uses_run_json_offset(tmp_path: Path) -> None:
    offset = BASE - 5 * MS
    meta = {**META, "trace_file": "rank0.trace.json", "trace_files": [{"file": "rank0.trace.json", "cycle": 0, "offset_ns": offset}]}
    db = tmp_path / "w.duckdb"
    ingest_traces([write_rank(tmp_path / "job", 0, None, meta, base=None)], db, threads=1)
    with connect(db, read_only=True) as con:
        got = con.sql("select start_wall_ns, offset_source from step_wall_times where step = 1").fetchall()
    assert got == [(offset, "run.json")]


class ConstantNVML:
    """One GPU drawing 250 W; the energy counter integrates it over wall time (mJ)."""

    def __init__(self) -> None:
        self.t0 = time.time_ns()
        self.energy_reads_ns: list[int] = []  # the clock this fake counter integrates over, per read

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: return 1
    def nvmlDeviceGetHandleByIndex(self, index: int) -> int: return index
    def nvmlDeviceGetName(self, handle: int) -> str: return "NVIDIA H100 80GB HBM3"
    def nvmlDeviceGetUUID(self, handle: int) -> str: return "GPU-0000"
    def nvmlDeviceGetPowerUsage(self, handle: int) -> int: return 250_000
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        now = time.time_ns()
        self.energy_reads_ns.append(now)
        return 10_000_000 + (now - self.t0) * 250 // 1_000_000


@pytest.mark.slow
def test_collector_trace_maps_into_wall_clock_and_joins_its_power_log(tmp_path: Path, monkeypatch) -> None:
    """The collector's own files: every step window lies inside the collector's lifetime (run.json
    clock start/end) and the fake NVML's 250 W comes back as each step's power."""
    torch = require_module("torch", "torch is a test dependency: pip install torch==2.13.0, then -e .[test]")
    from traceq.collectors import TraceCollector

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    x = torch.randn(64, 64)
    nvml = ConstantNVML()
    with TraceCollector(out_dir=tmp_path, run="real", wait=0, warmup=1, active=3, warmup_steps=0,
                        tokens_per_step=4096, power_interval_ms=5, nvml=nvml) as tc:
        for _ in range(5):
            for _ in range(20):
                x = torch.tanh(x @ x)
            time.sleep(0.03)
            tc.step()
    run_dir = tmp_path / "real"
    db = tmp_path / "w.duckdb"
    assert ingest_traces([run_dir / "rank0.trace.json.gz"], db, threads=1).ok
    meta = json.loads((run_dir / "rank0.run.json").read_text())
    with connect(db, read_only=True) as con:
        windows = con.sql("select step, start_wall_ns, end_wall_ns, offset_source from step_wall_times order by step").fetchall()
        rows = step_metrics(con, selection=StepSelection(include_last=True)).sort("step").to_dicts()
        read_steps = [step for (step,) in con.sql(
            "select step from power_samples where kind = 'energy' order by wall_ns").fetchall()]
    assert len(read_steps) == len(nvml.energy_reads_ns)  # one log record per counter read, in order
    assert [w[0] for w in windows] == [1, 2, 3]
    for _, start, end, source in windows:
        assert source == "baseTimeNanoseconds"
        assert meta["clock"]["start"]["time_ns"] <= start < end <= meta["clock"]["end"]["time_ns"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["power_w"] == pytest.approx(250.0)
        assert r["energy_source"] == "energy counter"
        # energy of step N: the counter interpolated to step N's start and step N+1's (the last step:
        # its end). The fake counter integrates 250 W over its own clock, so that is 250 W x that time,
        # give or take the lag of the sampler's wall_ns stamps behind the reads (a loaded machine can
        # delay them): 1 ms allowed, 0.25 J.
        k = [w[0] for w in windows].index(r["step"])
        until = windows[k + 1][1] if k + 1 < len(windows) else windows[k][2]
        assert r["energy_j"] == pytest.approx(250.0 * (until - windows[k][1]) / 1e9, abs=0.25)
        assert r["tokens_per_j"] == pytest.approx(4096 / r["energy_j"])
    assert compute_metric(db, "power_w", by=["run"])["power_w"].to_list() == [pytest.approx(250.0)]
