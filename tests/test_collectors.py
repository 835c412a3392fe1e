"""Tests of traceq.collectors: real profiler runs on CPU (one process and a 2-rank gloo job),
the power sampler against a fake NVML with known readings, and misconfiguration errors."""

from __future__ import annotations

import ast
import functools
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
from traceq.collectors import (
    CollectorConfig,
    CollectorConfigError,
    CollectorError,
    PowerSampler,
    TraceCollector,
    count_non_embedding_params,
)
from traceq.collectors.power import MAX_ERRORS_PER_CALL

ROOT = Path(__file__).resolve().parents[1]
COLLECTORS = ROOT / "collectors"


# ---------------------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=8)
def load_trace(path: Path) -> dict:
    """A gzip Kineto trace with `ts`/`dur` kept exact (Decimal)."""
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wall_ns(ts_us: Decimal, offset_ns: int) -> int:
    """The documented rule: wall_ns = ts_us * 1000 + offset_ns."""
    return int(ts_us * 1000) + offset_ns


def profiler_steps(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]


@pytest.fixture
def no_dist_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


class FakeNVML:
    """Two GPUs with fixed power (250 W, 300 W) and energy counters that add 1000 mJ per read."""

    def __init__(self, fail_power_on: int | None = None, fail_init: bool = False):
        self.fail_power_on = fail_power_on
        self.fail_init = fail_init
        self.energy = {0: 5_000_000, 1: 7_000_000}
        self.shutdown_called = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("driver not loaded")

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-0000000{handle}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle == self.fail_power_on:
            raise OSError("GPU is lost")
        return {0: 250_000, 1: 300_000}[handle]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy[handle] += 1000
        return self.energy[handle]


def run_steps(tc: TraceCollector, steps: int, work=None) -> None:
    import torch

    x = torch.randn(32, 32)
    for _ in range(steps):
        for _ in range(3):
            x = torch.tanh(x @ x.T)
        if work:
            work()
        tc.step()


# --------------------------------------------------------------------------- import hygiene


def test_importing_collectors_loads_no_torch_and_no_analysis_stack():
    code = (
        "import sys, traceq.collectors\n"
        "bad = [m for m in ('torch', 'pynvml', 'duckdb', 'polars', 'plotly', 'numpy') if m in sys.modules]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_collectors_source_imports_only_stdlib_torch_pynvml_and_itself():
    allowed = set(sys.stdlib_module_names) | {"torch", "pynvml", "__future__"}
    for path in COLLECTORS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                if name.startswith("traceq"):
                    assert name.startswith("traceq.collectors"), f"{path.name} imports {name}"
                else:
                    assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_missing_torch_gives_a_clear_error(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # makes `import torch` raise ImportError\n"
        "from traceq.collectors import TraceCollector, CollectorError\n"
        "try:\n"
        f"    TraceCollector(run='r', out_dir={str(tmp_path)!r})\n"
        "except CollectorError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "needs PyTorch" in out and "pip install" in out
    assert not any(tmp_path.iterdir()), "nothing may be written when torch is missing"


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"active": 0}, ["active=0", "at least one step"]),
        ({"active": 5, "warmup_steps": 5}, ["warmup_steps=5 >= active=5", "set warmup_steps below active"]),
        ({"wait": -1}, ["wait=-1", ">= 0"]),
        ({"warmup": 1.5}, ["warmup=1.5", "integer"]),
        ({"repeat": -2}, ["repeat=-2"]),
        ({"tp": 0}, ["tp=0", "use 1"]),
        ({"tokens_per_step": 0}, ["tokens_per_step=0"]),
        ({"run": "a/b"}, ["run='a/b'", "no slashes"]),
        ({"run": ""}, ["run=''"]),
        ({"power_interval_ms": 0}, ["power_interval_ms=0", "100 ms"]),
        ({"power_gpus": "mine"}, ["power_gpus='mine'", "'own'"]),
        ({"peak_tflops": -1}, ["peak_tflops=-1"]),
        ({"extra": {"f": object()}}, ["extra", "plain JSON"]),
    ],
)
def test_misconfiguration_names_the_option_and_the_fix(options, words):
    options = {"run": "r", **options}
    with pytest.raises(CollectorConfigError) as info:
        CollectorConfig(**options)
    for word in words:
        assert word in str(info.value)
    with pytest.raises(CollectorConfigError):  # the keyword form validates the same way
        TraceCollector(**options)


def test_default_schedule_follows_the_study():
    """Steps 11-60 of the study, every one closed: 61 recorded (the last one's window is open, left out)."""
    config = CollectorConfig(run="r")
    assert (config.wait, config.warmup, config.active, config.repeat) == (0, 1, 61, 1)
    assert config.warmup_steps == 10


@pytest.mark.slow
def test_degrees_that_do_not_fit_the_world_fail_before_any_file(tmp_path, no_dist_env):
    tc = TraceCollector(run="r", out_dir=tmp_path, tp=2)
    with pytest.raises(CollectorConfigError, match=r"tp\*pp\*cp = 2 does not divide world_size 1"):
        tc.start()
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_second_collector_for_the_same_run_and_rank_is_refused(tmp_path, no_dist_env):
    with TraceCollector(run="r", out_dir=tmp_path, active=2, warmup_steps=0) as tc:
        run_steps(tc, 4)
    before = (tmp_path / "r" / "rank0.trace.json.gz").read_bytes()
    with pytest.raises(CollectorConfigError, match=r"rank0\.run\.json: already exists.*overwrite=True"):
        TraceCollector(run="r", out_dir=tmp_path, active=2, warmup_steps=0).start()
    assert (tmp_path / "r" / "rank0.trace.json.gz").read_bytes() == before
    with TraceCollector(run="r", out_dir=tmp_path, active=2, warmup_steps=0, overwrite=True) as tc:
        run_steps(tc, 4)
    assert json.loads((tmp_path / "r" / "rank0.run.json").read_text())["complete"] is True


# --------------------------------------------------------------------------- one process, real profiler


@pytest.mark.slow
def test_trace_time_maps_to_wall_clock_by_base_time(tmp_path, no_dist_env):
    import torch

    brackets = {}

    def region():
        name = f"region{len(brackets)}"
        before = time.time_ns()
        with torch.profiler.record_function(name):
            entered = time.time_ns()
            torch.randn(64, 64).matmul(torch.randn(64, 64))
            leaving = time.time_ns()
        brackets[name] = (before, entered, leaving, time.time_ns())

    with TraceCollector(run="clock", out_dir=tmp_path, active=4, warmup_steps=1) as tc:
        run_steps(tc, 6, work=region)
    meta = json.loads((tmp_path / "clock" / "rank0.run.json").read_text())
    trace = load_trace(tmp_path / "clock" / meta["trace_file"])
    offset = meta["clock"]["offset_ns"]
    assert offset == trace["baseTimeNanoseconds"]
    found = 0
    for event in trace["traceEvents"]:
        if event.get("name") in brackets:
            before, entered, leaving, after = brackets[event["name"]]
            assert before <= wall_ns(event["ts"], offset) <= entered
            assert leaving <= wall_ns(event["ts"] + event["dur"], offset) <= after
            found += 1
    assert found == 4  # the regions of the 4 recorded steps
    start, end = meta["clock"]["start"]["time_ns"], meta["clock"]["end"]["time_ns"]
    for step in profiler_steps(trace):
        assert start <= wall_ns(step["ts"], offset) <= end


def test_collector_drives_a_fake_nvml_power_log(tmp_path, no_dist_env):
    fake = FakeNVML()
    with TraceCollector(run="p", out_dir=tmp_path, active=2, warmup_steps=0, power_interval_ms=5, nvml=fake) as tc:
        run_steps(tc, 3, work=lambda: time.sleep(0.01))
    records = read_lines(tmp_path / "p" / "rank0.power.jsonl")
    assert records[0]["source"] == "nvml" and records[0]["run"] == "p" and records[0]["rank"] == 0
    energy_steps = sorted({r["step"] for r in records if r["kind"] == "energy"})
    assert energy_steps == [0, 1, 2, 3, 4]  # start, three .step() calls, and the exit
    assert any(r["kind"] == "power" for r in records)
    assert records[-1]["kind"] == "end" and fake.shutdown_called


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_repeated_windows_write_one_trace_per_cycle(tmp_path, no_dist_env):
    with TraceCollector(run="rep", out_dir=tmp_path, warmup=1, active=2, repeat=2, warmup_steps=0, power=False) as tc:
        run_steps(tc, 8)
    run_dir = tmp_path / "rep"
    meta = json.loads((run_dir / "rank0.run.json").read_text())
    assert [t["file"] for t in meta["trace_files"]] == ["rank0.trace.json.gz", "rank0.cycle1.trace.json.gz"]
    assert meta["power_file"] is None and not (run_dir / "rank0.power.jsonl").exists()
    assert [e["name"] for e in profiler_steps(load_trace(run_dir / "rank0.cycle1.trace.json.gz"))] == [
        "ProfilerStep#4", "ProfilerStep#5"]
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "rank0.cycle1.trace.json.gz", "rank0.run.json", "rank0.trace.json.gz"]  # no temporary file left


def test_a_loop_that_ends_inside_the_window_still_writes_its_steps(tmp_path, no_dist_env):
    with TraceCollector(run="short", out_dir=tmp_path, active=60) as tc:
        run_steps(tc, 4)
    meta = json.loads((tmp_path / "short" / "rank0.run.json").read_text())
    trace = load_trace(tmp_path / "short" / meta["trace_file"])
    assert [e["name"] for e in profiler_steps(trace)] == [f"ProfilerStep#{n}" for n in (1, 2, 3, 4)]
    assert meta["complete"] and meta["steps_seen"] == 4


# --------------------------------------------------------------------------- the power sampler alone


def test_power_sampler_logs_known_readings_with_wall_clock_and_step(tmp_path):
    path = tmp_path / "power.jsonl"
    sampler = PowerSampler(path, interval_ms=10, nvml=FakeNVML(), header={"run": "r", "rank": 3}).start()
    sampler.mark_step(0)
    time.sleep(0.06)
    sampler.mark_step(1)
    time.sleep(0.06)
    sampler.stop()
    records = read_lines(path)
    header = records[0]
    assert header["kind"] == "header" and header["source"] == "nvml" and header["reason"] is None
    assert header["interval_ms"] == 10 and header["rank"] == 3 and "moving average" in header["note"]
    assert [g["gpu"] for g in header["gpus"]] == [0, 1]
    assert header["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    power = [r for r in records if r["kind"] == "power"]
    assert {(r["gpu"], r["power_w"]) for r in power} == {(0, 250.0), (1, 300.0)}
    assert len(power) >= 6  # ~12 rounds of 2 GPUs expected in 120 ms; allow a slow machine
    energy = [(r["step"], r["gpu"], r["energy_mj"]) for r in records if r["kind"] == "energy"]
    assert energy == [(0, 0, 5_001_000), (0, 1, 7_001_000), (1, 0, 5_002_000), (1, 1, 7_002_000)]
    body = records[1:]
    assert all(isinstance(r["wall_ns"], int) and isinstance(r["step"], int) for r in body)
    assert [r["wall_ns"] for r in body] == sorted(r["wall_ns"] for r in body)
    assert header["start_wall_ns"] <= body[0]["wall_ns"] and abs(body[0]["wall_ns"] - time.time_ns()) < 60e9
    assert {r["step"] for r in power} <= {0, 1}
    assert body[-1]["kind"] == "end" and body[-1]["errors"] == 0


def test_power_sampler_flushes_as_it_goes(tmp_path):
    path = tmp_path / "power.jsonl"
    sampler = PowerSampler(path, interval_ms=20, nvml=FakeNVML()).start()
    try:
        deadline = time.monotonic() + 2
        while not any(r["kind"] == "power" for r in read_lines(path)) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert any(r["kind"] == "power" for r in read_lines(path)), "power samples must reach the file while running"
        sampler.mark_step(7)
        while not any(r.get("step") == 7 and r["kind"] == "energy" for r in read_lines(path)):
            assert time.monotonic() < deadline, "a step boundary must reach the file while running"
            time.sleep(0.005)
        assert not any(r["kind"] == "end" for r in read_lines(path))
    finally:
        sampler.stop()


def test_power_sampler_records_nvml_failures_and_keeps_sampling(tmp_path):
    path = tmp_path / "power.jsonl"
    with PowerSampler(path, interval_ms=2, nvml=FakeNVML(fail_power_on=1)):
        time.sleep(0.15)
    records = read_lines(path)
    errors = [r for r in records if r["kind"] == "error"]
    assert errors and all(r["gpu"] == 1 and r["call"] == "nvmlDeviceGetPowerUsage" for r in errors)
    assert "GPU is lost" in errors[0]["error"] and len(errors) <= MAX_ERRORS_PER_CALL
    assert not any(r["kind"] == "power" and r["gpu"] == 1 for r in records), "no number is invented for gpu 1"
    assert sum(r["kind"] == "power" and r["gpu"] == 0 for r in records) > len(errors) / 2
    assert records[-1]["errors"] > 0


def test_power_sampler_selects_gpus_by_uuid(tmp_path):
    path = tmp_path / "power.jsonl"
    with PowerSampler(path, interval_ms=5, nvml=FakeNVML(), gpus=["00000001-aaaa-bbbb-cccc-dddddddddddd"]) as s:
        s.mark_step(0)
        time.sleep(0.03)
    records = read_lines(path)
    assert [g["gpu"] for g in records[0]["gpus"]] == [1]
    assert {r["gpu"] for r in records if "gpu" in r} == {1}


def test_power_log_without_nvml_says_unavailable_and_holds_no_numbers(tmp_path):
    path = tmp_path / "power.jsonl"
    sampler = PowerSampler(path, nvml=FakeNVML(fail_init=True)).start()
    sampler.mark_step(0)
    sampler.mark_step(1)
    sampler.stop()
    records = read_lines(path)
    assert len(records) == 1
    assert records[0]["source"] == "unavailable" and "driver not loaded" in records[0]["reason"]
    assert records[0]["gpus"] == [] and threading.active_count() >= 1


# --------------------------------------------------------------------------- a real 2-rank gloo job


# gloo_run: tests/conftest.py (shared with the critical-path tests)


@pytest.mark.slow
def test_gloo_job_writes_every_rank_file_and_nothing_else(gloo_run):
    _, run_dir = gloo_run
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == [f"rank{r}.{kind}" for r in (0, 1) for kind in ("power.jsonl", "run.json", "trace.json.gz")]


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_job_traces_are_kineto_with_the_recorded_steps(gloo_run, rank):
    parallel, run_dir = gloo_run
    trace = load_trace(run_dir / f"rank{rank}.trace.json.gz")
    assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["backend"] == "gloo"
    assert trace["traceq"] == {"run": "t", "rank": rank, "world_size": 2, "run_file": f"rank{rank}.run.json"}
    steps = profiler_steps(trace)
    assert sorted(e["name"] for e in steps) == sorted(f"ProfilerStep#{n}" for n in (1, 2, 3, 4))
    assert all(e["cat"] == "user_annotation" and e["ph"] == "X" for e in steps)
    runloop = {e["tid"] for e in trace["traceEvents"]
               if e.get("ph") == "M" and e["name"] == "thread_name" and "pt_gloo_runloop" in e["args"]["name"]}
    gloo = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("gloo:")]
    c10d = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("c10d::")]
    expected = {"ddp": "gloo:all_reduce", "fsdp": "gloo:all_gather"}[parallel]
    assert expected in {e["name"] for e in gloo}
    assert runloop and {e["tid"] for e in gloo} <= runloop
    # One runloop op per c10d launch on the main thread, paired first-in first-out (no id links them).
    runs_as = {"c10d::allreduce_": "gloo:all_reduce", "c10d::broadcast_": "gloo:broadcast",
               "c10d::_allgather_base_": "gloo:all_gather", "c10d::_reduce_scatter_base_": "gloo:all_reduce"}
    by_start = lambda events: sorted(events, key=lambda e: e["ts"])  # noqa: E731
    assert len(gloo) == len(c10d) > 0
    assert [runs_as[e["name"]] for e in by_start(c10d)] == [e["name"] for e in by_start(gloo)]


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_job_run_metadata(gloo_run, rank):
    parallel, run_dir = gloo_run
    meta = json.loads((run_dir / f"rank{rank}.run.json").read_text())
    expected = {
        "traceq_run_metadata": 1, "complete": True, "run": "t", "rank": rank, "local_rank": rank,
        "world_size": 2, "rank_source": "torch.distributed", "backend": "gloo", "nodes": 1, "gpus_per_node": 2,
        "tp": 1, "pp": 1, "cp": 1, "dp": 2, "tokens_per_step": 8 * 64 * 2, "seq_len": 64, "n_layers": 2,
        "n_heads": 4, "head_dim": 16, "device_type": "cpu", "gpu_model": None, "peak_tflops": None,
        "warmup_steps": 1, "profiled_steps": 4, "first_profiled_step": 1, "steps_seen": 6,
        "trace_file": f"rank{rank}.trace.json.gz", "power_file": f"rank{rank}.power.jsonl", "errors": [],
        "schedule": {"wait": 0, "warmup": 1, "active": 4, "repeat": 1}, "cuda_version": None,
    }
    assert {key: meta[key] for key in expected} == expected
    assert meta["n_params_non_embedding"] == 116_480  # 2 blocks of 49,920 + final norm 128 + head 16,384
    assert meta["torch_version"].startswith("2.") and meta["extra"]["parallel"] == parallel
    trace = load_trace(run_dir / meta["trace_file"])
    clock = meta["clock"]
    assert clock["offset_ns"] == trace["baseTimeNanoseconds"] == meta["trace_files"][0]["offset_ns"]
    assert clock["start"]["time_ns"] < clock["end"]["time_ns"]
    assert clock["start"]["monotonic_ns"] < clock["end"]["monotonic_ns"]
    for step in profiler_steps(trace):  # the recorded steps lie inside the collector's lifetime
        assert clock["start"]["time_ns"] <= wall_ns(step["ts"], clock["offset_ns"]) <= clock["end"]["time_ns"]


@pytest.mark.slow
def test_gloo_job_collectives_match_across_ranks_as_counted_from_the_traces(gloo_run, tmp_path):
    """The gloo spans are the collectives of a CPU run. Counted apart from traceq, from each rank's trace:
    the k-th span of a name on rank 0 and on rank 1 are one instance; its transfer is the shorter of the
    two durations and the other rank waited the difference. A broadcast is rooted, and the two ranks'
    files have clocks of their own: its arrival is not inferable, so no wait and no straggler."""
    from traceq.ingest import ingest_traces
    from traceq.report.collectives import instances_report

    _, run_dir = gloo_run
    files = sorted(run_dir.glob("rank*.trace.json.gz"))
    db = tmp_path / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    durations: dict[tuple[str, int], dict[int, int]] = {}
    for rank in (0, 1):
        events = load_trace(run_dir / f"rank{rank}.trace.json.gz")["traceEvents"]
        spans = sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:")),
                       key=lambda e: (Decimal(str(e["ts"])), Decimal(str(e["dur"]))))
        seen: dict[str, int] = {}
        for e in spans:
            seen[e["name"]] = seen.get(e["name"], 0) + 1
            durations.setdefault((e["name"], seen[e["name"]]), {})[rank] = int(Decimal(str(e["dur"])) * 1000)
    kinds = {"gloo:all_reduce": "AllReduce", "gloo:all_gather": "AllGather", "gloo:broadcast": "Broadcast"}
    expected = {}
    for (name, k), by_rank in durations.items():
        assert set(by_rank) == {0, 1}, (name, k)  # both ranks recorded the same collectives
        transfer = min(by_rank.values())
        last = min(by_rank, key=lambda r: (by_rank[r], r))
        for rank, dur in by_rank.items():
            rooted = kinds[name] == "Broadcast"
            expected[(kinds[name], k, rank)] = (0, dur, False) if rooted else (dur - transfer, transfer, rank == last)
    rows = instances_report(db).table
    assert rows["matched"].all() and rows.height == len(expected) > 0
    got = {(r["collective_type"], r["ordinal"], r["rank"]): (round(r["wait_us"] * 1000), round(r["transfer_us"] * 1000),
                                                           r["arrived_last"]) for r in rows.iter_rows(named=True)}
    assert got == expected


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_job_power_log_is_unavailable_without_numbers(gloo_run, rank):
    _, run_dir = gloo_run
    lines = (run_dir / f"rank{rank}.power.jsonl").read_text().splitlines()
    assert len(lines) == 1
    header = json.loads(lines[0])
    assert header["source"] == "unavailable" and header["reason"] and header["gpus"] == []
    assert header["rank"] == rank and not {"power_w", "energy_mj"} & set(header)


# --------------------------------------------------------------------------- small helpers


def test_non_embedding_params_leave_out_embeddings_and_count_tied_weights_once():
    import torch.nn as nn

    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3), nn.Linear(4, 10, bias=False))
    assert count_non_embedding_params(model) == 4 * 3 + 3 + 40
    model[2].weight = model[0].weight  # tied LM head
    assert count_non_embedding_params(model) == 4 * 3 + 3


def test_step_before_start_is_a_clear_error():
    with pytest.raises(CollectorError, match="before start"):
        TraceCollector(run="r").step()
