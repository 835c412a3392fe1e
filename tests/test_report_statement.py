"""A report's step rows are one statement over the runs it selects, and leave DuckDB once (issue 48; STYLE:
DuckDB's relational API): a run's rows are the same whether the warehouse holds other runs or not, and the
breakdown metrics read no other run's steps."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from tests.test_aggregates import lagging_gpu
from tests.test_cross_rank import late_rank_run, write_run
from traceq import query
from traceq.ingest import ingest_traces
from traceq.report import metrics
from traceq.report.metrics import breakdown_metrics, metric_report, step_metrics
from traceq.report.selection import StepSelection
from traceq.store.warehouse import connect

EVERY = StepSelection(skip_steps=0, include_last=True)
BREAKDOWNS = ("exposed_comm_by_collective_us", "exposed_comm_by_pg_us")


@pytest.fixture(scope="module")
def warehouses(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a warehouse holding run `other` then run `job`, one holding `job` alone). `job`: three ranks with a
    matched AllReduce (tests/test_cross_rank.py); `other`: one rank, three steps of GEMMs. `other` goes in
    first, so `job`'s trace ids differ between the two."""
    root = tmp_path_factory.mktemp("two_runs")
    job = write_run(root / "job", late_rank_run())
    other = [lagging_gpu(root / "other" / "rank0.json")]
    both, alone = root / "both.duckdb", root / "alone.duckdb"
    assert ingest_traces(other, both, threads=1).ok and ingest_traces(job, both, threads=1).ok
    assert ingest_traces(job, alone, threads=1).ok
    return both, alone


def _same(got: pl.DataFrame, expected: pl.DataFrame) -> None:
    assert got.height > 0
    assert got.columns == expected.columns
    assert got.drop("trace_id").equals(expected.drop("trace_id"))


@pytest.mark.slow
@pytest.mark.parametrize("whole_trace", [False, True], ids=["steps", "whole trace"])
@pytest.mark.parametrize("parts", [(False, False), (True, True)], ids=["plain", "idle split and cross-rank"])
def test_a_runs_step_rows_do_not_depend_on_the_other_runs_of_the_warehouse(
    warehouses: tuple[Path, Path], whole_trace: bool, parts: tuple[bool, bool]
) -> None:
    both, alone = warehouses
    idle_parts, cross_rank = parts
    kw = dict(whole_trace=whole_trace, selection=EVERY, idle_parts=idle_parts, cross_rank=cross_rank)
    with connect(both, read_only=True) as con:
        got = step_metrics(con, runs=["job"], **kw)
        everything = step_metrics(con, **kw)
    with connect(alone, read_only=True) as con:
        expected = step_metrics(con, **kw)
    _same(got, expected)
    assert set(everything["run"]) == {"job", "other"}
    _same(everything.filter(pl.col("run") == "job"), expected)


@pytest.mark.slow
@pytest.mark.parametrize("metric", BREAKDOWNS)
@pytest.mark.parametrize("whole_trace", [False, True], ids=["steps", "whole trace"])
def test_a_runs_breakdown_rows_do_not_depend_on_the_other_runs_of_the_warehouse(
    warehouses: tuple[Path, Path], metric: str, whole_trace: bool
) -> None:
    both, alone = warehouses
    with connect(both, read_only=True) as con:
        got = breakdown_metrics(con, metric, whole_trace=whole_trace, selection=EVERY, runs=["job"])
    with connect(alone, read_only=True) as con:
        expected = breakdown_metrics(con, metric, whole_trace=whole_trace, selection=EVERY)
    _same(got, expected)
    if not whole_trace:  # the step's CPU span came along: 100 us
        assert got["step_time_ms"].to_list() == [0.1] * got.height


class Sent:
    """The statements a function sends through traceq.query.run, and the results that leave DuckDB."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[tuple[str, dict]] = []
        self.fetches = 0
        run, to_polars = query.run, metrics.to_polars

        def counted_run(con, name, params=None, bind=None):
            self.statements.append((query.statement(con, name, bind, (params or {}).get("runs")), dict(params or {})))
            return run(con, name, params, bind)

        def counted_fetch(relation):
            self.fetches += 1
            return to_polars(relation)

        monkeypatch.setattr(query, "run", counted_run)
        monkeypatch.setattr(metrics, "to_polars", counted_fetch)


@pytest.mark.slow
@pytest.mark.parametrize("whole_trace", [False, True], ids=["steps", "whole trace"])
@pytest.mark.parametrize("parts", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["plain", "idle split", "cross-rank", "both"])
def test_the_step_rows_are_one_statement_that_leaves_duckdb_once(
    warehouses: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, whole_trace: bool, parts: tuple[bool, bool]
) -> None:
    both, _ = warehouses
    sent = Sent(monkeypatch)
    with connect(both, read_only=True) as con:
        step_metrics(con, whole_trace=whole_trace, selection=EVERY, runs=["job"], idle_parts=parts[0], cross_rank=parts[1])
    assert len(sent.statements) == 1 and sent.fetches == 1


@pytest.mark.parametrize("metric", BREAKDOWNS)
def test_the_breakdown_rows_are_one_statement_that_reads_the_selected_runs_alone(
    warehouses: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, metric: str
) -> None:
    both, _ = warehouses
    sent = Sent(monkeypatch)
    with connect(both, read_only=True) as con:
        breakdown_metrics(con, metric, runs=["job"])
    assert len(sent.statements) == 1 and sent.fetches == 1
    (text, params), = sent.statements
    assert params["runs"] == ["job"]
    # every read of a warehouse table goes through a common table expression of the same name that keeps
    # the selected runs' rows (traceq.query.selecting_runs): the steps (step_time_ns) and traces (run) too
    for table in ("steps", "traces"):
        assert re.search(rf"\b{table} as not materialized \(select \* from main\.{table} where ", text), table
    unfiltered = re.findall(r"\bmain\.(\w+)", text)
    assert unfiltered and all(t in ("traces", "steps", "gpu_events", "host_events", "names", "runs", "trace_threads")
                              for t in unfiltered)
    assert text.count("main.steps") == 1  # the filtered one alone


@pytest.mark.slow
def test_a_report_on_one_run_equals_that_run_alone(warehouses: tuple[Path, Path]) -> None:
    """The table and rows of `report --run job` do not change when the warehouse holds another run."""
    both, alone = warehouses
    for metric in ("exposed_comm,idle_sync,exposed_comm_wait", "exposed_comm_by_collective"):
        got = metric_report(both, metric, by="run,rank", selection=EVERY, runs=["job"])
        expected = metric_report(alone, metric, by="run,rank", selection=EVERY)
        assert got.table.equals(expected.table)
        _same(got.rows, expected.rows)
