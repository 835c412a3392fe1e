"""The figures around the intervals (DESIGN §3, §5): the open last step left out of default figures and
said so, runs an option empties named, ratios and rates as ratios of sums; on hand-made traces worked
out by hand and on every corpus run."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.tracegen import TraceBuilder
from traceq.catalog import RATE_WEIGHTS
from traceq.cli import app
from traceq.errors import EmptySelection
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric, metric_report
from traceq.report.selection import StepSelection
from traceq.report.summary import summary

US = 1_000
EVERY = StepSelection(skip_steps=0, include_last=True)


def lagging_gpu(path: Path, rank: int = 0) -> Path:
    """A GPU behind its CPU (held-out negq's shape). CPU steps 1, 2, 3: [0, 100), [100, 200), [200, 300) us.
    Step 1 launches a GEMM at 10 us that runs [20, 150); step 2 one at 110 running [150, 280); step 3 one
    at 210 running [280, 410) and one at 220 running [410, 450).

    Windows: step 1 [20, 150) = 130 us, step 2 [150, 280) = 130, step 3 (open: the drain) [280, 450) = 170.
    Compute fills each window: 130, 130, 170 us; no idle."""
    t = TraceBuilder(rank=rank)
    for n in (1, 2, 3):
        t.step(n, (n - 1) * 100 * US, n * 100 * US)
    t.kernel("ampere_sgemm_128x64_tn", 20 * US, 150 * US, launch_ns=10 * US)
    t.kernel("ampere_sgemm_128x64_tn", 150 * US, 280 * US, launch_ns=110 * US)
    t.kernel("ampere_sgemm_128x64_tn", 280 * US, 410 * US, launch_ns=210 * US)
    t.kernel("ampere_sgemm_128x64_tn", 410 * US, 450 * US, launch_ns=220 * US)
    return t.write(path)


def one_step(path: Path) -> Path:
    """One CPU step [0, 100) us launching a GEMM at 10 us that runs [20, 60): window 40 us, compute 40."""
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100 * US)
    t.kernel("ampere_sgemm_128x64_tn", 20 * US, 60 * US, launch_ns=10 * US)
    return t.write(path)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "w.duckdb"
    files = [lagging_gpu(tmp_path / "lag" / "rank0.json"), one_step(tmp_path / "single" / "rank0.json")]
    assert ingest_traces(files, path, threads=1).ok
    return path


def test_the_open_last_step_is_left_out_by_default_and_said(db: Path) -> None:
    report = metric_report(db, "compute,window", by="run,rank", runs=["lag"])
    table, notes = report.table, report.notes
    row = table.row(0, named=True)
    assert (row["steps"], row["compute_us"], row["window_us"]) == (2, 130.0, 130.0)
    assert "run lag: the last step of each rank (step 3) is left out: its device window is open" in "\n".join(notes)
    every = compute_metric(db, "compute,window", by="run,rank", runs=["lag"], selection=EVERY).row(0, named=True)
    assert (every["steps"], every["compute_us"], every["window_us"]) == (3, pytest.approx(430 / 3), pytest.approx(430 / 3))
    # HTA's way drops the last step too; with --include-last and --drop-last together, neither is guessed
    assert compute_metric(db, "compute", by="run,rank,step", runs=["lag"],
                          selection=StepSelection(drop_last=True))["step"].to_list() == [1, 2]
    with pytest.raises(Exception, match="include_last keeps each rank's last step and drop_last drops it"):
        StepSelection(include_last=True, drop_last=True)


def test_a_rank_whose_only_step_is_the_last_keeps_it_with_a_note(db: Path) -> None:
    report = metric_report(db, "compute", by="run,rank", runs=["single"])
    table, notes = report.table, report.notes
    assert table.select("steps", "compute_us").row(0) == (1, 40.0)
    assert any(n.startswith("run single: rank 0 has one step, also its last, kept") for n in notes)


@pytest.mark.slow
def test_a_run_an_option_empties_is_named_and_everything_empty_is_an_error(db: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["summary", "--db", str(db), "--skip-steps", "1"])
    assert done.exit_code == 0, done.output
    assert "run single: no step left by the selection (warm-up steps skipped: 1" in done.stderr
    assert "it has steps 1..1: it is not in this report" in done.stderr
    dropped = runner.invoke(app, ["report", "--db", str(db), "--drop-last"])
    assert dropped.exit_code == 0 and "run single: no step left by the selection" in dropped.stderr
    every = runner.invoke(app, ["summary", "--db", str(db), "--skip-steps", "100"])
    assert every.exit_code == 1 and "no step is selected" in every.stderr
    with pytest.raises(EmptySelection, match="run lag: steps 1..3"):
        summary(db, selection=StepSelection(skip_steps=100))


def test_the_cli_options_of_the_last_step() -> None:
    text = CliRunner().invoke(app, ["report", "--help"], env={"COLUMNS": "200"}).stdout
    assert "--include-last" in text and "--drop-last" in text


# --- every corpus run


@pytest.mark.slow
def test_no_default_figure_holds_an_open_last_step(corpus_db: Path) -> None:
    all_steps = StepSelection(skip_steps=0, include_last=True, drop_incomplete=False)
    every = compute_metric(corpus_db, "compute", by="run,rank,device,step", selection=all_steps)
    default = compute_metric(corpus_db, "compute", by="run,rank,device,step", selection=StepSelection(skip_steps=0))
    last = every.filter(pl.col("step") >= 0).group_by("run", "rank").agg(pl.col("step").max().alias("last"),
                                                                       pl.col("step").n_unique().alias("n"))
    held = default.join(last, on=["run", "rank"]).filter((pl.col("step") == pl.col("last")) & (pl.col("n") > 1))
    assert held.height == 0, held
    # every run of the warehouse is in the default report, with steps or one whole-trace window
    assert set(default["run"]) == set(every["run"])


def test_the_default_means_are_the_means_without_the_last_step_on_resnet50(corpus_db: Path) -> None:
    """The 2021 resnet50 sample: its last window loses its trailing idle (window 122.4 ms against 151.9)."""
    run = "resnet50_profiler_api_num_workers_0/worker0"  # names no rank and no job: a run of its own
    steps = compute_metric(corpus_db, "idle,window", by="run,rank,step", runs=[run], selection=EVERY)
    closed = steps.filter(pl.col("step") < steps["step"].max())
    mean = compute_metric(corpus_db, "idle,window", by="run,rank", runs=[run], selection=StepSelection(skip_steps=0))
    assert mean["idle_us"][0] == pytest.approx(closed["idle_us"].mean())
    assert mean["window_us"][0] == pytest.approx(closed["window_us"].mean())
    assert steps["window_us"][-1] < 0.85 * closed["window_us"].mean()


@pytest.mark.slow
def test_every_ratio_equals_its_sums_on_every_corpus_run(corpus_db: Path) -> None:
    for by in ("run,rank", "run"):
        table = compute_metric(corpus_db, "overlap_ratio,overlapped_comm,comm", by=by)
        with_comm = table.filter(pl.col("comm_us") > 0)
        assert with_comm.height >= 8
        for r in with_comm.iter_rows(named=True):
            assert r["overlap_ratio"] * r["comm_us"] == pytest.approx(r["overlapped_comm_us"], rel=1e-9, abs=1e-3), r


@pytest.mark.slow
def test_rates_are_total_over_total_time_the_same_in_report_summary_and_scaling(corpus_db: Path) -> None:
    """The H200 runs carry tokens_per_step (8192) and world size 1: tokens_per_s = 8192 / mean step time."""
    from traceq.report.scaling import scaling_report

    runs = ["h200-ddp", "h200-seq2048", "h200-compile"]
    steps = compute_metric(corpus_db, "step_time", by="run,rank,step", runs=runs)
    expected = {run: 8192 / (part["step_time_ms"].mean() / 1e3)
                for (run,), part in steps.group_by("run")}
    reported = dict(compute_metric(corpus_db, "tokens_per_s", by="run", runs=runs).select("run", "tokens_per_s").rows())
    summed = dict(summary(corpus_db, by="run", runs=runs).table.select("run", "tokens_per_s").rows())
    scaled = dict(scaling_report(corpus_db, runs=runs).table.select("run", "tokens_per_s").rows())
    for run in runs:
        assert reported[run] == pytest.approx(expected[run], rel=1e-9)
        assert summed[run] == pytest.approx(expected[run], rel=1e-9)
        assert scaled[run] == pytest.approx(expected[run], rel=1e-9)


def test_every_rate_has_a_denominator_in_the_step_rows(corpus_db: Path) -> None:
    from traceq.report.metrics import step_metrics
    from traceq.store.warehouse import opened

    with opened(corpus_db) as con:
        rows = step_metrics(con, runs=["fused_traces"], cross_rank=True)
    assert set(RATE_WEIGHTS.values()) <= set(rows.columns)


@pytest.mark.slow
def test_no_corpus_run_vanishes_without_a_note(corpus_db: Path) -> None:
    """`summary --drop-last` and `--skip-steps 3` used to drop 4 and 5 of the corpus runs silently."""
    from traceq.store.warehouse import connect

    with connect(corpus_db, read_only=True) as con:
        runs = {r for (r,) in con.sql("select distinct run from traces").fetchall()}
    for selection in (StepSelection(drop_last=True), StepSelection(skip_steps=3), StepSelection(skip_steps=100)):
        try:
            report = summary(corpus_db, by="run", selection=selection)
            table, notes = report.table, report.notes
        except EmptySelection:
            continue
        named = {n.split(":")[0].removeprefix("run ") for n in notes if ": no step left by the selection" in n}
        assert named, selection
        assert set(table["run"]) | named == runs, selection
        assert not set(table["run"]) & named


def test_two_unrelated_traces_of_one_corpus_folder_are_two_runs(corpus_db: Path) -> None:
    """tracelens/h100 holds a Qwen and a BERT trace, neither naming a rank or a job: they used to be ranks
    -1 and -2 of one run, averaged together (a 16 s window with a 2 s one)."""
    from traceq.store.warehouse import connect

    with connect(corpus_db, read_only=True) as con:
        rows = con.sql("select run, file_rank from traces where path like '%/tracelens/h100/%' order by run").fetchall()
    assert rows == [("h100/Qwen_Qwen1.5-0.5B-Chat__1016005", -1), ("h100/gaunernst_bert-small-uncased__1016001", -1)]


def test_a_cpu_only_trace_keeps_its_last_step_its_windows_are_its_cpu_spans(tmp_path: Path) -> None:
    """gloo runs: no device activity, each step's window is its CPU span, so the last one is closed."""
    t = TraceBuilder(rank=0)
    for n in (1, 2, 3):
        t.step(n, (n - 1) * 100 * US, n * 100 * US)
    db = tmp_path / "w.duckdb"
    assert ingest_traces([t.write(tmp_path / "gloo" / "rank0.json")], db, threads=1).ok
    report = metric_report(db, "window,idle", by="run,rank,step")
    table, notes = report.table, report.notes
    assert table.select("step", "window_us", "idle_us").rows() == [(1, 100.0, 100.0), (2, 100.0, 100.0), (3, 100.0, 100.0)]
    assert not any("left out" in n or "also its last" in n for n in notes)


@pytest.mark.slow
def test_a_step_less_multi_rank_run_names_no_slowest_rank(tmp_path: Path) -> None:
    """Four ranks with no step marker and no launch event (NCCL kernels only): each is one whole-trace
    window (step -1), whose span is no step time. Rank 2's span is the longest (it starts first), yet
    `report --by run` names no slowest rank from it, and a note says why; by rank the spans still show."""
    spans = {0: (20, 100), 1: (15, 100), 2: (0, 100), 3: (30, 110)}
    for rank, (s, e) in spans.items():
        t = TraceBuilder(rank=rank)
        t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", s * US, (s + 5) * US)
        t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", (e - 5) * US, e * US)
        t.write(tmp_path / "stepless" / f"rank{rank}.json",
                distributedInfo={"backend": "nccl", "rank": rank, "world_size": 4})
    db = tmp_path / "w.duckdb"
    assert ingest_traces([tmp_path / "stepless"], db, threads=1).ok
    report = metric_report(db, "step_time_ms", by="run")
    row = report.table.row(0, named=True)
    assert row["ranks"] == 4 and row["slowest_rank"] is None and row["slowest_step_time_ms"] is None
    assert any("whose span is not a step time, so no slowest rank is named" in n for n in report.notes), report.notes
    by_rank = compute_metric(db, "step_time_ms", by="run,rank")
    assert by_rank.sort("rank")["step_time_ms"].to_list() == [0.08, 0.085, 0.1, 0.08]
    result = CliRunner().invoke(app, ["report", "--db", str(db), "--metric", "idle_unknown", "--by", "run"])
    assert result.exit_code == 0, result.output
