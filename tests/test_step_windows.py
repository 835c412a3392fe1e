"""Device windows (docs/explanation/metrics.md: device windows, steps): per-step figures that tile the device
timeline, on a hand-made trace whose GPU lags its CPU by more than a step, and on every corpus trace against a
brute-force reference written apart from the SQL (tests/step_reference.py) and against the interval API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from tests import step_reference as reference
from tests.conftest import CORPUS, corpus_files
from tests.tracegen import TraceBuilder
from traceq import intervals
from traceq.cli import app
from traceq.errors import EmptySelection
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric, metric_report, step_metrics
from traceq.report.selection import StepSelection, relation
from traceq.store.warehouse import connect

US = 1000
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
METRICS = ("comm_kernel_ns", "compute_kernel_ns", "comm_ns", "compute_ns", "overlapped_comm_ns", "exposed_comm_ns",
           "exposed_memcpy_ns", "busy_ns", "window_ns", "idle_ns")
EVERY_STEP = StepSelection(skip_steps=0, include_last=True, drop_incomplete=False)


def lagging_trace() -> TraceBuilder:
    """Steps 1, 2, 3 with CPU spans [0,100), [100,200), [200,300) us; the GPU runs 150 us behind.

    step 1 launches A (gemm, [160,190), launch 10) and C1 (all-reduce, [180,270), launch 50);
    step 2 launches B (gemm, [250,300), launch 110) and M (memcpy, [300,320), launch 150);
    step 3 launches D (gemm, [330,360), launch 210) and C3 (all-reduce, [350,400), launch 250);
    P (gemm, [5,15)) has no launch event: launched before the profiler started.

    Windows: first activity launched by each step: 160, 250, 330; the last ends at 400 (all us), so
    W1 [160,250), W2 [250,330), W3 [330,400), and P lies before the first window.
    W1: A 30 compute; C1 clipped to [180,250) 70 comm; overlapped [180,190) 10; exposed 60; idle 0.
    W2: C1's tail [250,270) 20 comm, hidden by B [250,300) 50; M [300,320) 20 exposed memcpy;
        busy [250,320) 70 of 80: idle 10.
    W3: D 30 compute; C3 50 comm; overlapped [350,360) 10; exposed 40; idle 0.
    (traceq 0.1 gave step 1 all of C1 (90 us) and step 2 the idle time between its own kernels only.)
    """
    t = TraceBuilder(rank=0)
    for n in (1, 2, 3):
        t.step(n, (n - 1) * 100 * US, n * 100 * US)
    t.kernel("ampere_sgemm_128x64_nn", 160 * US, 190 * US, launch_ns=10 * US)
    t.kernel(NCCL, 180 * US, 270 * US, stream=20, launch_ns=50 * US)
    t.kernel("ampere_sgemm_128x64_nn", 250 * US, 300 * US, launch_ns=110 * US)
    t.kernel("Memcpy DtoD (Device -> Device)", 300 * US, 320 * US, launch_ns=150 * US, cat="gpu_memcpy")
    t.kernel("ampere_sgemm_128x64_nn", 330 * US, 360 * US, launch_ns=210 * US)
    t.kernel(NCCL, 350 * US, 400 * US, stream=20, launch_ns=250 * US)
    t.kernel("ampere_sgemm_128x64_nn", 5 * US, 15 * US)
    return t


EXPECTED = {  # step -> metrics in us, worked out above
    1: dict(window=90, compute=30, comm=70, overlapped_comm=10, exposed_comm=60, exposed_memcpy=0, idle=0,
            comm_kernel=70, compute_kernel=30),
    2: dict(window=80, compute=50, comm=20, overlapped_comm=20, exposed_comm=0, exposed_memcpy=20, idle=10,
            comm_kernel=20, compute_kernel=50),
    3: dict(window=70, compute=30, comm=50, overlapped_comm=10, exposed_comm=40, exposed_memcpy=0, idle=0,
            comm_kernel=50, compute_kernel=30),
}


@pytest.fixture()
def lagging_db(tmp_path: Path) -> Path:
    db = tmp_path / "w.duckdb"
    assert ingest_traces([lagging_trace().write(tmp_path / "job" / "rank0.json")], db, threads=1).ok
    return db


def test_windows_of_a_gpu_that_lags_by_more_than_a_step_match_hand_computation(lagging_db: Path) -> None:
    with connect(lagging_db, read_only=True) as con:
        rows = {r["step"]: r for r in step_metrics(con, selection=EVERY_STEP).iter_rows(named=True)}
        windows = relation(con, "device_windows").order("step").fetchall()
    assert [(w[3], w[4] // US, w[5] // US, w[6]) for w in windows] == [(1, 160, 250, False), (2, 250, 330, False),
                                                                     (3, 330, 400, False)]
    for step, expected in EXPECTED.items():
        got = {name: rows[step][f"{name}_ns"] / US for name in expected}
        assert got == expected, step
        assert rows[step]["step_time_ms"] == 0.1
    # every step's figures together: the span of the windows, 160..400 us, nothing counted twice
    assert sum(rows[s]["comm_ns"] for s in rows) == 140 * US  # C1 90 + C3 50, each once


def test_activity_before_the_first_step_is_reported_not_folded_into_step_one(lagging_db: Path) -> None:
    report = metric_report(lagging_db, "exposed_comm", by=["run", "rank", "step"], selection=EVERY_STEP)
    frame, notes = report.table, report.notes
    assert frame["exposed_comm_us"].to_list() == [60.0, 0.0, 40.0]
    assert any("0.010 ms (1 events) before the first step's window" in n for n in notes), notes
    whole = compute_metric(lagging_db, "compute", by=["run", "rank"], whole_trace=True)
    assert whole["compute_us"].to_list() == [120.0]  # P counts over the whole trace: 10 + 30 + 50 + 30
    with connect(lagging_db, read_only=True) as con:
        outside = relation(con, "outside_steps").fetchall()
    assert [o[3:] for o in outside] == [(10 * US, 1, 0, 0)]


def test_a_trace_without_steps_is_one_window_in_every_default_report(tmp_path: Path) -> None:
    t = lagging_trace()
    t.events = [e for e in t.events if not e["name"].startswith("ProfilerStep#")]
    path = t.write(tmp_path / "nosteps" / "rank0.json")
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    result = CliRunner().invoke(app, ["report", "--metric", "comm", "--db", str(db), "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].startswith("nosteps,0,1,140.0,")  # C1 + C3 over 5..400 us
    assert "rank 0 has no step marker: reported over its whole trace as one window (step -1)" in result.stderr
    assert "--step-marker" in result.stderr
    idle = compute_metric(db, "idle", by=["run", "rank", "step"])
    assert idle.select("step", "idle_us").rows() == [(-1, 395.0 - 10 - 90 - 70 - 70)]  # 5..400 minus busy


def decode_trace() -> TraceBuilder:
    """A decode loop whose steps are named like vLLM's on B300: 'step[DECODE bs=16]', 3 of them,
    one kernel each; no ProfilerStep."""
    t = TraceBuilder(rank=0)
    for i in range(3):
        t.events.append({"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=16]", "pid": 100, "tid": 1,
                         "ts": i * 100.0, "dur": 80.0, "args": {}})
        t.kernel("void decode_attention_kernel()", (i * 100 + 20) * US, (i * 100 + 50) * US, launch_ns=(i * 100 + 5) * US)
    return t


def test_step_marker_names_steps_that_are_not_profiler_steps(tmp_path: Path) -> None:
    path = decode_trace().write(tmp_path / "decode" / "rank0.json")
    plain, marked = tmp_path / "plain.duckdb", tmp_path / "marked.duckdb"
    assert ingest_traces([path], plain, threads=1).ok
    assert compute_metric(plain, "compute", by=["run", "rank", "step"])["step"].to_list() == [-1]
    result = CliRunner().invoke(app, ["ingest", str(path), "--db", str(marked), "--step-marker", r"^step\[DECODE", "-q"])
    assert result.exit_code == 0, result.output
    steps = compute_metric(marked, "compute", by=["run", "rank", "step"], selection=EVERY_STEP)
    # numbered in time order; windows 20..120, 120..220, 220..250 us
    assert steps.select("step", "compute_us", "step_time_ms").rows() == [(1, 30.0, 0.08), (2, 30.0, 0.08), (3, 30.0, 0.08)]
    assert compute_metric(marked, "idle", by=["run", "rank", "step"], selection=EVERY_STEP)["idle_us"].to_list() == [70.0, 70.0, 0.0]
    with connect(marked, read_only=True) as con:
        assert con.sql("select step_marker from traces").fetchall() == [(r"^step\[DECODE",)]
    bad = CliRunner().invoke(app, ["ingest", str(path), "--db", str(tmp_path / "x.duckdb"), "--step-marker", "step[("])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: --step-marker 'step[(': not a regular expression")


def test_a_step_marker_with_a_number_group_numbers_the_steps(tmp_path: Path) -> None:
    t = decode_trace()
    for i, e in enumerate(e for e in t.events if e["cat"] == "user_annotation"):
        e["name"] = f"train_step_{40 + i}"
    db = tmp_path / "w.duckdb"
    assert ingest_traces([t.write(tmp_path / "j" / "rank0.json")], db, threads=1, step_marker=r"^train_step_(\d+)$").ok
    assert compute_metric(db, "compute", by=["run", "rank", "step"], selection=EVERY_STEP)["step"].to_list() == [40, 41, 42]


def test_empty_selections_are_errors_that_say_what_exists(lagging_db: Path, tmp_path: Path) -> None:
    for selection, runs, text in [
        (StepSelection.parse("900:1000"), None, "no step is selected (steps 900..1000"),
        (StepSelection(skip_steps=100), None, "no step is selected (warm-up steps skipped: 100"),
        (StepSelection(), ["nosuchrun"], "no run 'nosuchrun' in the warehouse; it holds job"),
    ]:
        with pytest.raises(EmptySelection) as err:
            compute_metric(lagging_db, "exposed_comm", selection=selection, runs=runs)
        assert text in str(err.value)
    assert "run job: steps 1..3 (3 per rank)" in str(err.value) or "it holds job" in str(err.value)
    runner = CliRunner()
    for args, text in [(["--steps", "900:1000"], "run job: steps 1..3 (3 per rank)"),
                       (["--skip-steps", "100"], "run job: steps 1..3"),
                       (["--run", "nosuchrun"], "it holds job")]:
        result = runner.invoke(app, ["report", "--db", str(lagging_db), *args])
        assert result.exit_code == 1 and text in result.stderr, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    empty = tmp_path / "empty.duckdb"
    connect(empty).close()
    result = runner.invoke(app, ["report", "--db", str(empty)])
    assert result.exit_code == 1 and "holds no trace yet" in result.stderr


# --------------------------------------------------------------------------------- on the corpus


@pytest.fixture(scope="module")
def every_window(corpus_db: Path) -> pl.DataFrame:
    """Interval metrics of every step window of the corpus (no warm-up skip, no step dropped)."""
    with connect(corpus_db, read_only=True) as con:
        rows = step_metrics(con, selection=EVERY_STEP)
        paths = pl.DataFrame(con.sql("select trace_id, path, file_rank from traces").fetchall(),
                             schema=["trace_id", "path", "file_rank"], orient="row")
    return rows.filter(pl.col("device").is_not_null()).join(paths, on="trace_id")


@pytest.mark.slow
def test_idle_is_never_negative_nor_longer_than_the_window(every_window: pl.DataFrame) -> None:
    assert every_window.height >= 50  # 59 windows in the corpus as of this writing
    assert (every_window["idle_ns"] >= 0).all() and (every_window["idle_ns"] <= every_window["window_ns"]).all()
    lhs = every_window["compute_ns"] + every_window["exposed_comm_ns"] + every_window["exposed_memcpy_ns"] + every_window["idle_ns"]
    assert (lhs == every_window["window_ns"]).all()


def test_windows_tile_each_device_timeline(corpus_db: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        windows = relation(con, "device_windows").order("trace_id, rank, device, step").pl()
    for _, w in windows.group_by("trace_id", "rank", "device"):
        starts, ends = w["start_ns"].to_numpy(), w["end_ns"].to_numpy()
        assert (ends >= starts).all() and (starts[1:] == ends[:-1]).all()


def _activity(con, trace_id: int, rank: int, device: int) -> pl.DataFrame:
    return relation(con, "device_activity").filter(
        f"trace_id = {trace_id} and rank = {rank} and device = {device}").pl()


def _span_figures(activity: pl.DataFrame, lo: int, hi: int) -> dict[str, int]:
    """The interval metrics of one device over [lo, hi), with the interval API (numpy, apart from SQL)."""
    clipped = activity.with_columns(pl.col("start_ns").clip(lo, hi), pl.col("end_ns").clip(lo, hi))

    def pair(*classes: str) -> tuple[np.ndarray, np.ndarray]:
        g = clipped.filter(pl.col("class").is_in(classes))
        return g["start_ns"].to_numpy(), g["end_ns"].to_numpy()

    figures = intervals.breakdown(pair("comm"), pair("compute"), pair("memcpy", "memset"), window=(lo, hi)).as_dict()
    lengths = clipped["end_ns"] - clipped["start_ns"]
    figures["comm_kernel_ns"] = int(lengths.filter(clipped["class"] == "comm").sum())
    figures["compute_kernel_ns"] = int(lengths.filter(clipped["class"] == "compute").sum())
    return figures


@pytest.mark.slow
def test_steps_sum_to_the_whole_timeline_over_their_windows(corpus_db: Path, every_window: pl.DataFrame) -> None:
    """For every device: all its steps, and the middle ones where it has 3 or more, summed per metric,
    equal the figures of the whole timeline over the span of those windows, to the ns."""
    checked = 0
    with connect(corpus_db, read_only=True) as con:
        for (trace_id, rank, device), rows in every_window.filter(pl.col("device") >= 0).group_by(
                "trace_id", "rank", "device"):
            rows = rows.sort("step")
            activity = _activity(con, trace_id, rank, device)
            ranges = [rows] + ([rows.slice(1, rows.height - 2)] if rows.height >= 3 else [])
            for part in ranges:
                lo = part["window_start_ns"].min()
                hi = (part["window_start_ns"] + part["window_ns"]).max()
                expected = _span_figures(activity, lo, hi)
                for name in METRICS:
                    assert part[name].sum() == expected[name], (trace_id, rank, device, name)
                checked += 1
    assert checked >= 20


def _reference_rank(ref_rank: int, file_rank: int | None) -> int:
    """The reference knows a rank from the trace alone (-1 when it names none); traceq takes one from the
    file name or gives the file one of its own, stored as the trace's file_rank."""
    return file_rank if ref_rank == -1 and file_rank is not None else ref_rank


@pytest.mark.slow
@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: str(p.relative_to(CORPUS)))
def test_per_step_figures_equal_the_brute_force_reference(every_window: pl.DataFrame, path: Path) -> None:
    ours = every_window.filter(pl.col("path") == str(path.resolve()))
    file_rank = ours["file_rank"][0] if ours.height else None
    launched = {(w["rank"], w["device"], w["step"]): w["launched"] for w in reference.step_windows(path)}
    expected = {}
    for r in reference.step_metrics(path):
        if not launched[(r["rank"], r["device"], r["step"])]:  # a step that launched nothing here: no window
            assert r["window_ns"] == 0
            continue
        step = -1 if r["step"] is None else r["step"]
        expected[(_reference_rank(r["rank"], file_rank), r["device"], step)] = r
    got = {(r["rank"], r["device"], r["step"]): r for r in ours.filter(pl.col("device") >= 0).iter_rows(named=True)}
    assert set(got) == set(expected)
    for key, ref in expected.items():
        assert got[key]["window_start_ns"] == ref["start_ns"], key
        assert {m: got[key][m] for m in METRICS} == {m: ref[m] for m in METRICS}, key


@pytest.mark.slow
@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: str(p.relative_to(CORPUS)))
def test_activity_outside_the_windows_and_the_whole_trace_equal_the_reference(corpus_db: Path, path: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        trace_id, file_rank = con.execute("select trace_id, file_rank from traces where path = ?",
                                          [str(path.resolve())]).fetchall()[0]
        outside = {(r[1], r[2]): r[3:] for r in relation(con, "outside_steps").filter(f"trace_id = {trace_id}").fetchall()}
        whole = step_metrics(con, whole_trace=True).filter((pl.col("trace_id") == trace_id) & (pl.col("device") >= 0))
    expected_outside = {(_reference_rank(o["rank"], file_rank), o["device"]): (o["before_ns"], o["n_before"], o["after_ns"], o["n_after"])
                        for o in reference.outside(path) if o["n_before"] + o["n_after"]}
    assert {k: v for k, v in outside.items() if v[1] + v[3] and k[1] >= 0} == expected_outside  # the CPU: not here
    expected_whole = {(_reference_rank(w["rank"], file_rank), w["device"]): w for w in reference.whole_trace(path)}
    got_whole = {(r["rank"], r["device"]): r for r in whole.iter_rows(named=True)}
    assert set(got_whole) == set(expected_whole)
    for key, ref in expected_whole.items():
        assert {m: got_whole[key][m] for m in METRICS} == {m: ref[m] for m in METRICS}, key
