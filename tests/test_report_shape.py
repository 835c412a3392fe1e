"""One shape for every report (traceq.Report): each report function of the Python API returns one, the
command line shows any of them the same way (title and notes on stderr, the table on stdout), and its
renderings escape what a trace holds."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

import traceq
from tests.test_cross_rank import EVERY_STEP, ingest, late_rank_run
from traceq.cli import app


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingest(tmp_path_factory.mktemp("shape"), late_rank_run())


@pytest.mark.slow
def test_every_report_of_the_api_is_a_report(db: Path) -> None:
    reports = {
        "metric_report": traceq.metric_report(db, "exposed_comm", selection=EVERY_STEP),
        "summary": traceq.summary(db, selection=EVERY_STEP),
        "kernel_report": traceq.kernel_report(db, selection=EVERY_STEP),
        "collectives_report": traceq.collectives_report(db, selection=EVERY_STEP),
        "instances_report": traceq.instances_report(db),
        "stragglers_report": traceq.stragglers_report(db, selection=EVERY_STEP),
        "scaling_report": traceq.scaling_report(db, selection=EVERY_STEP),
        "diff": traceq.diff(db, "job,rank=0", "job,rank=2", skip_steps=0, include_last=True),
        "check_warehouse": traceq.check_warehouse(db),
        "critical_path": traceq.critical_path(db, selection=EVERY_STEP).report("ranks"),
        "warehouse_sql": traceq.warehouse_sql("select 1 as x", db),
    }
    for name, report in reports.items():
        assert isinstance(report, traceq.Report), name
        assert isinstance(report.table, pl.DataFrame) and isinstance(report.notes, tuple), name
    # the figures are the reports' own: rank 2 arrived last and made the others wait 7 + 4 us
    stragglers = reports["stragglers_report"].table.row(0, named=True)
    assert (stragglers["rank"], stragglers["wait_caused_us"]) == (2, pytest.approx(11.0))
    assert reports["metric_report"].rows is not None and reports["metric_report"].title.startswith("exposed_comm_us by run,rank")


@pytest.mark.slow
def test_the_command_line_shows_a_report_as_the_api_gives_it(db: Path) -> None:
    report = traceq.stragglers_report(db, selection=EVERY_STEP)
    done = CliRunner().invoke(app, ["stragglers", "--db", str(db), "--steps", "1:", "--skip-steps", "0",
                                    "--include-last", "--format", "json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == json.loads(json.dumps(report.table.to_dicts()))
    assert [line.removeprefix("note: ") for line in done.stderr.splitlines()] == list(report.notes)
    table = CliRunner().invoke(app, ["stragglers", "--db", str(db), "--skip-steps", "0", "--include-last"])
    assert table.stderr.splitlines()[0] == traceq.stragglers_report(
        db, selection=traceq.StepSelection(skip_steps=0, include_last=True)).title


def test_a_report_renders_as_text_and_html_with_what_it_holds_escaped() -> None:
    report = traceq.Report(pl.DataFrame({"name": ["<script>x</script>"], "us": [1.5]}), ["a < b"], "t & u")
    assert str(report).splitlines()[0] == "t & u" and str(report).splitlines()[-1] == "note: a < b"
    html = report._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "<b>t &amp; u</b>" in html and "<li>a &lt; b</li>" in html
    wide = str(traceq.Report(pl.DataFrame({f"column_{i}": [f"kernel_{i}_" * 8] * 40 for i in range(30)})))
    assert "column_29" in wide and "kernel_29_" * 8 in wide and "…" not in wide  # every column, row and name whole
    cut = traceq.Report.of_query(pl.DataFrame({"i": range(5)}), ["n"], max_rows=3)
    assert cut.table["i"].to_list() == [0, 1, 2]
    assert cut.notes == ("n", "the query gives more than 3 rows: the first 3 are shown (--max-rows)")
    assert traceq.Report.of_query(pl.DataFrame({"i": range(3)}), (), max_rows=3).notes == ()
