"""Real NVML power, checked against itself: the H200 runs the collectors recorded carry power every
100 ms and the energy counter at step boundaries. traceq's per-step power_w, energy_j and tokens_per_j
equal tests/power_reference.py, a computation from the raw files written apart from the SQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import power_reference
from tests.conftest import corpus_path
from traceq.ingest import ingest_traces
from traceq.report.metrics import metric_report, step_metrics
from traceq.report.selection import StepSelection
from traceq.store.warehouse import connect

RUNS = ("h200-compile", "h200-ddp", "h200-graph", "h200-overlap", "h200-seq2048", "h200-seq8192")


@pytest.fixture(scope="module")
def h200_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("h200") / "w.duckdb"
    assert ingest_traces([corpus_path(f"traceq_h200/{run}") for run in RUNS], db).ok
    return db


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_step_power_and_energy_equal_a_reference_from_the_raw_log(h200_db: Path, run: str) -> None:
    expected = power_reference.step_power(corpus_path(f"traceq_h200/{run}"))
    with connect(h200_db, read_only=True) as con:
        rows = step_metrics(con, selection=StepSelection(skip_steps=0, include_last=True), runs=[run])
    got = {r["step"]: r for r in rows.iter_rows(named=True)}
    assert sorted(got) == sorted(expected) and len(got) >= 10
    for step, want in expected.items():
        row = got[step]
        assert row["step_time_ns"] / 1e9 == pytest.approx(want["window_s"], rel=1e-12), step
        assert row["power_w"] == pytest.approx(want["power_w"], rel=1e-9), step
        assert row["energy_j"] == pytest.approx(want["energy_j"], rel=1e-12, abs=1e-9), step
        assert row["energy_source"] == want["energy_source"], step
        assert row["tokens_per_j"] == (None if want["tokens_per_j"] is None else pytest.approx(want["tokens_per_j"])), step


def test_the_notes_say_where_each_power_figure_comes_from(h200_db: Path) -> None:
    notes = metric_report(h200_db, "tokens_per_j,energy_j,power_w", by="run", runs=["h200-ddp"]).notes
    text = "\n".join(notes)
    assert "run h200-ddp: power from NVML (1 log(s), 32 samples, 24 energy counter reads)" in text
    # steps 3..19 (warm-up 2, the last open): interpolated, the counter gives every one of them joules
    assert "run h200-ddp: energy_j from the NVML energy counter on 17 of 17 steps" in text
    assert "the counter moved on" not in text


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_no_step_at_hundreds_of_watts_reads_0_j_and_the_steps_sum_to_the_counter(h200_db: Path, run: str) -> None:
    """The H200 counter ticks about every 100 ms; steps of ~87 ms between ticks read 0 J by raw
    differences (4 of h200-ddp's). Interpolated at the boundaries, none does, and the steps still add up
    to the counter's (interpolated) difference from the first step's start to the last one's end."""
    run_dir = corpus_path(f"traceq_h200/{run}")
    steps, base = power_reference.read_steps(run_dir / "rank0.trace.json.gz")
    log = power_reference.read_power_log(run_dir / "rank0.power.jsonl")
    with connect(h200_db, read_only=True) as con:
        rows = step_metrics(con, selection=StepSelection(skip_steps=0, include_last=True), runs=[run])
    for r in rows.iter_rows(named=True):
        if r["power_w"] is not None and r["power_w"] > 100:
            assert r["energy_j"] > 0.1, r["step"]
    # the steps whose energy came from the counter (h200-graph: none, its counter moved once in 14 reads;
    # h200-overlap: all but the last, which ends after the counter's last change) run without a hole
    counter = sorted(r["step"] for r in rows.iter_rows(named=True) if r["energy_source"] == "energy counter")
    if not counter:
        return
    assert counter == list(range(counter[0], counter[-1] + 1))
    (marks,) = log["energy"].values()
    span_end = steps[counter[-1] + 1][0] if counter[-1] + 1 in steps else steps[counter[-1]][1]
    first, last = (power_reference.counter_at(marks, at + base) for at in (steps[counter[0]][0], span_end))
    got = sum(r["energy_j"] for r in rows.iter_rows(named=True) if r["energy_source"] == "energy counter")
    assert got == pytest.approx(float(last - first) / 1000, abs=1e-6)
