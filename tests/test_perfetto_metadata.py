"""The Perfetto engine reads the collector's run.json beside a trace as ingest does: the run it names and its
warmup_steps, so that both engines report the same steps of the same directory by default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import corpus_path
from tests.test_perfetto_engine import FLOAT_NOTE, binary  # noqa: F401 (a fixture)
from tests.test_step_windows import lagging_trace
from traceq.cli import app
from traceq.errors import TraceFormatError
from traceq.ingest import ingest_traces
from traceq.perfetto.engine import perfetto_report
from traceq.perfetto.processor import ENV_VAR
from traceq.report.metrics import metric_report
from traceq.report.selection import StepSelection

METRICS = "exposed_comm,idle"


@pytest.mark.slow
def test_both_engines_use_the_same_steps_of_a_collector_run(tmp_path: Path, binary: Path) -> None:
    """h200-compile: 15 profiled steps, run.json warmup_steps 5 (the engines read steps 6..14 by default)."""
    folder = corpus_path("traceq_h200/h200-compile")
    db = tmp_path / "w.duckdb"
    assert ingest_traces([folder], db, threads=1).ok
    duck = metric_report(db, METRICS, by="run,rank,step")
    mine = perfetto_report([folder], METRICS, by="run,rank,step", binary=binary)
    keys = ["run", "rank", "step"]
    assert mine.table.select(keys).sort(keys).rows() == duck.table.select(keys).sort(keys).rows()
    assert mine.table["step"].to_list() == list(range(6, 15)) and set(mine.table["run"]) == {"h200-compile"}
    # the values agree within the bound the float note states (2 ns per edge: a window moves by at most 2 of them)
    note = next(n for n in mine.notes if FLOAT_NOTE in n)
    bound_us = 2 * int(note.split("off by up to ")[1].split(" ns")[0]) / 1000
    joined = mine.table.join(duck.table, on=keys, suffix="_duck")
    for metric in ("exposed_comm_us", "idle_us"):
        assert (joined[metric] - joined[f"{metric}_duck"]).abs().max() <= bound_us + 1e-9, metric
    assert "run h200-compile: 5 warm-up step(s) skipped (the warmup_steps of its run.json; --skip-steps overrides)" in mine.notes
    assert "the run's warmup_steps" in mine.title
    # --skip-steps overrides it on both
    every = StepSelection(skip_steps=0)
    assert perfetto_report([folder], "idle", by="run,rank,step", binary=binary, selection=every).table["step"].to_list() == \
        metric_report(db, "idle", by="run,rank,step", selection=every).table["step"].to_list() == list(range(1, 15))


@pytest.mark.slow
def test_the_run_json_names_the_run_and_its_warm_up_on_a_tiny_trace(tmp_path: Path, binary: Path) -> None:
    folder = tmp_path / "y"
    lagging_trace().write(folder / "rank0.trace.json")
    (folder / "rank0.run.json").write_text(json.dumps({"run": "x", "rank": 0, "world_size": 1, "warmup_steps": 1}))
    db = tmp_path / "w.duckdb"
    assert ingest_traces([folder], db, threads=1).ok
    duck = metric_report(db, METRICS, by="run,rank,step")
    mine = perfetto_report([folder], METRICS, by="run,rank,step", binary=binary)
    assert mine.table.equals(duck.table.select(mine.table.columns))
    assert mine.table.select("run", "step").rows() == [("x", 2)]  # steps 1..3: the warm-up 1 and the open last out
    assert perfetto_report([folder], "idle", binary=binary, name="z").table["run"].to_list() == ["z"]


@pytest.mark.slow
def test_a_run_without_run_json_skips_no_warm_up_and_says_so(tmp_path: Path, binary: Path) -> None:
    with_meta, bare = tmp_path / "a", tmp_path / "b"
    lagging_trace().write(with_meta / "rank0.json")
    (with_meta / "rank0.run.json").write_text(json.dumps({"rank": 0, "warmup_steps": 1}))
    lagging_trace().write(bare / "rank0.json")
    report = perfetto_report([with_meta, bare], "idle", by="run,step", binary=binary)
    assert report.table.select("run", "step").rows() == [("a", 2), ("b", 1), ("b", 2)]
    assert "run b: no run.json beside the trace files, so no warm-up step is skipped unless --skip-steps" in report.notes
    alone = perfetto_report([bare], "idle", by="run,step", binary=binary)
    assert "trace files carry no run metadata: no warm-up step is skipped unless --skip-steps" in alone.notes


def test_a_run_json_that_is_none_is_refused_naming_it(tmp_path: Path, binary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "job"
    lagging_trace().write(folder / "rank0.json")
    (folder / "rank0.run.json").write_text("[1, 2]")
    with pytest.raises(TraceFormatError, match=r"rank0\.run\.json: run\.json must hold one JSON object"):
        perfetto_report([folder], "idle", binary=binary)
    monkeypatch.setenv(ENV_VAR, str(binary))
    result = CliRunner().invoke(app, ["report", "--engine", "perfetto", "--metric", "idle", str(folder)])
    assert result.exit_code == 1 and "rank0.run.json: run.json must hold one JSON object" in result.stderr, result.output
