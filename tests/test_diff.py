"""`traceq diff`: two runs, two step ranges, two ranks, on hand-made traces worked out by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_html_report import chromium, needs_chromium, pixel_variance, script_errors
from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.errors import ConfigError, EmptySelection
from traceq.ingest import ingest_traces
from traceq.report.diff import diff

US = 1_000


def steps(path: Path, scale: int) -> Path:
    """tests/test_summary.py's two steps, every time multiplied by ``scale``: per step compute 30 and
    40 us, exposed comm 20 and 0 us (an all-reduce beside the first GEMM), times ``scale``."""
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100 * US * scale)
    t.step(2, 100 * US * scale, 200 * US * scale)
    t.kernel("ampere_sgemm_128x64_tn", 10 * US * scale, 40 * US * scale, launch_ns=5 * US * scale)
    t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30 * US * scale, 60 * US * scale, stream=20,
             launch_ns=6 * US * scale, **{"Collective name": "allreduce"})
    t.kernel("ampere_sgemm_128x64_tn", 110 * US * scale, 150 * US * scale, launch_ns=105 * US * scale)
    return t.write(path)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "w.duckdb"
    files = [steps(tmp_path / "a" / "rank0.json", 1), steps(tmp_path / "b" / "rank0.json", 2)]
    assert ingest_traces(files, path, threads=1).ok
    return path


def row(table, section: str, name: str) -> dict:
    found = table.filter((table["section"] == section) & (table["name"] == name))
    assert found.height == 1, (section, name)
    return found.row(0, named=True)


@pytest.mark.slow
def test_two_runs(db: Path) -> None:
    table = diff(db, "a", "b", skip_steps=0, include_last=True).table
    compute = row(table, "metric", "compute_us")
    # A: 30, 40 (mean 35, p10 31, p90 39); B: 60, 80 (mean 70, p10 62, p90 78); the spread is 16 at most
    assert (compute["a"], compute["b"], compute["delta"], compute["delta_pct"]) == (35.0, 70.0, 35.0, 100.0)
    assert (compute["a_p10"], compute["a_p90"], compute["b_p10"], compute["b_p90"]) == pytest.approx((31, 39, 62, 78))
    assert compute["beyond_spread"]
    exposed = row(table, "metric", "exposed_comm_us")
    # A: 20, 0 (spread 16); B: 40, 0 (spread 32): a delta of 10 the steps' own variation explains
    assert (exposed["a"], exposed["b"], exposed["delta"], exposed["beyond_spread"]) == (10.0, 20.0, 10.0, False)
    step = row(table, "metric", "step_time_ms")
    assert (step["a"], step["b"], step["beyond_spread"]) == (0.1, 0.2, True)
    assert row(table, "collective", "AllReduce")["b"] == 20.0
    gemm, nccl = row(table, "category", "gemm"), row(table, "category", "nccl")
    assert (gemm["a"], gemm["b"], nccl["a"], nccl["b"]) == (35.0, 70.0, 15.0, 30.0)  # per step: 30+40, 30+0
    assert row(table, "metric", "mfu")["a"] is None


@pytest.mark.slow
def test_two_step_ranges_and_two_ranks(db: Path) -> None:
    table = diff(db, "a,steps=1:1", "a,steps=2:2", include_last=True).table
    compute, exposed = row(table, "metric", "compute_us"), row(table, "metric", "exposed_comm_us")
    assert (compute["a"], compute["b"], compute["beyond_spread"]) == (30.0, 40.0, True)
    assert (exposed["a"], exposed["b"], exposed["delta_pct"]) == (20.0, 0.0, -100.0)
    same = diff(db, "a,rank=0", "a,rank=0", skip_steps=0, include_last=True).table
    assert (same["delta"].drop_nulls() == 0).all() and not same["beyond_spread"].any()


@pytest.mark.slow
def test_what_one_side_lacks_is_zero_there(db: Path, tmp_path: Path) -> None:
    t = TraceBuilder(rank=0)  # run c: one step with a GEMM only, no collective
    t.step(1, 0, 100 * US)
    t.kernel("ampere_sgemm_128x64_tn", 10 * US, 40 * US, launch_ns=5 * US)
    assert ingest_traces([t.write(tmp_path / "c" / "rank0.json")], db, threads=1).ok
    table = diff(db, "a", "c", skip_steps=0, include_last=True).table
    allreduce, nccl = row(table, "collective", "AllReduce"), row(table, "category", "nccl")
    assert (allreduce["a"], allreduce["b"], allreduce["delta"]) == (10.0, 0.0, -10.0)
    assert (nccl["a"], nccl["b"], nccl["delta_pct"]) == (15.0, 0.0, -100.0)


def test_sides_that_do_not_exist(db: Path) -> None:
    with pytest.raises(EmptySelection, match="no run 'c'"):
        diff(db, "a", "c")
    with pytest.raises(EmptySelection, match="a,rank=3: no steps of rank 3"):
        diff(db, "a,rank=3", "b")
    with pytest.raises(ConfigError, match="unknown part 'node=1'"):
        diff(db, "a,node=1", "b")
    done = CliRunner().invoke(app, ["diff", "a", "b,rank=x", "--db", str(db)])
    assert done.exit_code == 1 and done.stderr.startswith("error: side 'b,rank=x': rank=N takes a number")


@pytest.mark.slow
def test_cli_formats_and_html(db: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    csv = runner.invoke(app, ["diff", "a", "b", "--db", str(db), "--skip-steps", "0", "--include-last", "--format", "csv",
                              "--html", str(tmp_path / "d.html")])
    assert csv.exit_code == 0, csv.stderr
    assert csv.stdout.splitlines()[0] == "section,name,a,b,delta,delta_pct,beyond_spread,a_p10,a_p90,b_p10,b_p90"
    page = (tmp_path / "d.html").read_text()
    assert "traceq diff" in page and "compute_us" in page and "Changes beyond the step-to-step spread" in page


@pytest.mark.slow
@needs_chromium
def test_html_diff_renders_offline_in_headless_chromium(db: Path, tmp_path: Path) -> None:
    page = tmp_path / "diff.html"
    done = CliRunner().invoke(app, ["diff", "a", "b", "--db", str(db), "--skip-steps", "0", "--include-last", "--html", str(page)])
    assert done.exit_code == 0, done.stderr
    assert not re.findall(r"<script[^>]*\bsrc=|<link[^>]*\bhref=", page.read_text())
    dom, log, shot = chromium(page, tmp_path)
    assert not script_errors(log), script_errors(log)
    assert dom.count('class="plot-container plotly"') == 1 and 'id="diff"' in dom
    assert "compute_us" in dom and "step_time_ms" in dom  # bar labels: quantities beyond the spread
    assert pixel_variance(shot) > 100.0
