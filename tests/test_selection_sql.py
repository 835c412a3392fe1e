"""A statement over selected runs (``$runs``) reads only their rows (traceq.query.selecting_runs): every
report statement gives, for a selection of runs, exactly its rows over every run kept to those runs;
and a report's time and memory follow its selection, not what else the warehouse holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceq import query
from traceq.report.selection import StepSelection, query_params
from traceq.store.warehouse import connect

WINDOWS = {"windows": "selected_windows"}
STATEMENTS = {  # name -> its bindings
    "clock_skew": {}, "comm_instances": {}, "cpu_activity": {}, "device_activity": {}, "device_windows": {},
    "gpu_activity": {}, "gpu_classified": {}, "kernel_times": {}, "outside_steps": {}, "run_metadata": {},
    "selected_steps": {}, "selected_windows": {}, "split_activity": {}, "step_power": {}, "step_throughput": {},
    "sync_islands": {}, "timeline_clock": {}, "timeline_steps": {}, "trace_windows": {}, "wall_offsets": {},
    "interval_breakdown": WINDOWS, "idle_breakdown": WINDOWS, "exposed_comm_by_collective": WINDOWS,
    "collectives": WINDOWS, "stragglers": WINDOWS, "shared_windows": WINDOWS,
}
SELECTIONS = (  # one rank of 4 of one file, a CPU-only run, a real H200 run with power, two runs at once
    ["fused_traces"], ["cpu_only"], ["h200-ddp"], ["h200-seq2048", "mi300"],
)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_a_statement_over_selected_runs_is_its_rows_over_every_run_kept_to_them(corpus_db: Path, name: str) -> None:
    with connect(corpus_db, read_only=True) as con:
        every = query.run(con, name, {**query_params(), "shared_steps": True}, STATEMENTS[name])
        key = "run" if "run" in every.columns else "trace_id"
        every = every.set_alias("e")
        runs_of = dict(con.sql("select trace_id, run from traces").fetchall())
        columns = every.columns
        all_rows = every.fetchall()
        for runs in SELECTIONS:
            assert set(runs) <= set(runs_of.values()), runs
            got = query.run(con, name, {**query_params(runs=runs), "shared_steps": True}, STATEMENTS[name])
            assert got.columns == columns
            at = columns.index(key)
            expect = [r for r in all_rows if (r[at] if key == "run" else runs_of[r[at]]) in runs]
            assert sorted(map(repr, got.fetchall())) == sorted(map(repr, expect)), (name, runs)


def test_the_statement_of_selected_runs_reads_the_tables_through_the_selection() -> None:
    text = query.selecting_runs(query.compose("interval_breakdown", WINDOWS))
    assert text.startswith("with runs as not materialized (select * from main.runs where list_contains($runs, run)),")
    assert ("gpu_events as not materialized (select * from main.gpu_events where trace_id in "
            "(select trace_id from main.traces where list_contains($runs, run)))") in text
    # a table the statement does not read is not put in front of it
    assert "power_samples as" not in text and "power_samples as" in query.selecting_runs(query.compose("step_power"))


@pytest.mark.slow
@pytest.mark.parametrize("steps", [None, "100:200"], ids=["its steps", "no step of it"])
def test_a_run_without_communication_is_said_to_have_none_not_to_have_no_step(corpus_db: Path, steps: str | None) -> None:
    """The H200 overlap run (one GPU) has steps 1..10 and no communication kernel: a per-collective
    report of it said "no step is selected" although 9 were."""
    from traceq.errors import EmptySelection
    from traceq.report.collectives import collectives_report
    from traceq.report.metrics import metric_report

    selection = StepSelection.parse(steps)
    no_step = "no step is selected (steps 100..200, "
    with pytest.raises(EmptySelection) as report:
        metric_report(corpus_db, "exposed_comm_by_collective_us", selection=selection, runs=["h200-overlap"])
    with pytest.raises(EmptySelection) as table:
        collectives_report(corpus_db, selection=selection, runs=["h200-overlap"])
    if steps is None:
        assert str(report.value) == ("no communication kernel in the selected steps of run h200-overlap: "
                                     "exposed_comm_by_collective_us has nothing to split")
        assert str(table.value) == "no communication kernel in the selected steps"
    else:
        assert str(report.value).startswith(no_step) and str(table.value).startswith(no_step)
        assert str(report.value).endswith("run h200-overlap: steps 1..10 (10 per rank)")
