"""`traceq summary`: the step breakdown at a glance, on a hand-made trace worked out by hand, on
trace files without a warehouse, and on every corpus trace (the shares of the window add up)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.errors import ConfigError
from traceq.ingest import ingest_traces
from traceq.report.selection import StepSelection
from traceq.report.summary import summary

US = 1_000


def two_steps(path: Path) -> Path:
    """Step 1 (CPU 0-100 us) launches a GEMM at 10-40 us and an all-reduce at 30-60 us; step 2
    (CPU 100-200 us) a GEMM at 110-150 us.

    Windows: step 1 [10, 110) = 100 us, step 2 [110, 150) = 40 us.
    Step 1: compute 30, overlapped 10 (30-40), exposed comm 20 (40-60), idle 100 - 50 = 50.
    Step 2: compute 40, nothing else.
    """
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100 * US)
    t.step(2, 100 * US, 200 * US)
    t.kernel("ampere_sgemm_128x64_tn", 10 * US, 40 * US, launch_ns=5 * US)
    t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30 * US, 60 * US, stream=20, launch_ns=6 * US)
    t.kernel("ampere_sgemm_128x64_tn", 110 * US, 150 * US, launch_ns=105 * US)
    return t.write(path)


def test_summary_by_hand(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    assert ingest_traces([two_steps(tmp_path / "job" / "rank0.json")], db, threads=1).ok
    table = summary(db, selection=StepSelection(skip_steps=0, include_last=True)).table
    row = table.row(0, named=True)
    window = 140  # us, over both steps
    expected = {
        "run": "job", "rank": 0, "steps": 2, "step_range": "1..2", "step_time_ms": 0.1,
        "compute_ms": 0.035, "compute_pct": 70 / window * 100,
        "overlapped_comm_ms": 0.005, "overlapped_comm_pct": 10 / window * 100,
        "exposed_comm_ms": 0.010, "exposed_comm_pct": 20 / window * 100,
        "exposed_memcpy_ms": 0.0, "exposed_memcpy_pct": 0.0,
        "idle_ms": 0.025, "idle_pct": 50 / window * 100,
        "tokens_per_s": None, "mfu": None, "power_w": None,
    }
    assert row.keys() == expected.keys()
    for key, value in expected.items():
        assert row[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_summary_step_by_step_by_hand(tmp_path: Path) -> None:
    """Each step its own row, its shares of its own window: step 1 (window 100 us) compute 30, overlapped
    10, exposed comm 20, idle 50; step 2 (window 40 us) compute 40. By step alone: the same rows (one rank)."""
    db = tmp_path / "w.duckdb"
    assert ingest_traces([two_steps(tmp_path / "job" / "rank0.json")], db, threads=1).ok
    selection = StepSelection(skip_steps=0, include_last=True)
    table = summary(db, by="run,rank,step", selection=selection).table
    got = table.select("step", "steps", "compute_ms", "compute_pct", "overlapped_comm_pct", "exposed_comm_pct",
                       "idle_ms", "idle_pct").rows()
    assert got == [(1, 1, 0.03, 30.0, 10.0, 20.0, 0.05, 50.0), (2, 1, 0.04, 100.0, 0.0, 0.0, 0.0, 0.0)]
    by_step = summary(db, by="step", selection=selection).table
    assert by_step.select("step", "compute_pct", "idle_pct").rows() == [(1, 30.0, 50.0), (2, 100.0, 0.0)]


def test_summary_straight_from_trace_files(tmp_path: Path) -> None:
    trace = two_steps(tmp_path / "job" / "rank0.json")
    db = tmp_path / "w.duckdb"
    assert ingest_traces([trace], db, threads=1).ok
    runner = CliRunner()
    from_db = runner.invoke(app, ["summary", "--db", str(db), "--skip-steps", "0", "--include-last", "--format", "csv"])
    from_files = runner.invoke(app, ["summary", str(trace), "--skip-steps", "0", "--include-last", "--format", "csv",
                                     "--db", str(tmp_path / "not-made.duckdb")])
    assert from_db.exit_code == 0 and from_files.exit_code == 0, from_files.stderr
    assert from_files.stdout == from_db.stdout
    assert not (tmp_path / "not-made.duckdb").exists()


def test_summary_says_what_it_cannot_group_by(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    assert ingest_traces([two_steps(tmp_path / "job" / "rank0.json")], db, threads=1).ok
    with pytest.raises(ConfigError, match=r"did you mean rank\?"):
        summary(db, by="run,rnak")


@pytest.mark.slow
def test_shares_of_the_window_add_up_on_every_corpus_trace(corpus_db: Path) -> None:
    report = summary(corpus_db, by="run,rank,device", selection=StepSelection(skip_steps=0, include_last=True))
    table, notes = report.table, report.notes
    measured = table.filter(pl.col("device").is_not_null())
    assert measured.height > 20
    total = measured["compute_pct"] + measured["exposed_comm_pct"] + measured["exposed_memcpy_pct"] + measured["idle_pct"]
    assert ((total - 100).abs() < 1e-9).all(), measured.filter((total - 100).abs() >= 1e-9)
    assert (measured["overlapped_comm_pct"] <= measured["compute_pct"] + 1e-9).all()
    # the steps used are a column, not a note per run
    assert not any(n.startswith("steps used") for n in notes)
    ddp = table.filter(pl.col("run") == "h200-ddp")
    assert ddp["step_range"].to_list() == ["1..20"] and ddp["steps"].to_list() == [20]


@pytest.mark.slow
def test_several_metrics_side_by_side(tmp_path: Path) -> None:
    from traceq.report.metrics import compute_metric

    db = tmp_path / "w.duckdb"
    assert ingest_traces([two_steps(tmp_path / "job" / "rank0.json")], db, threads=1).ok
    both = compute_metric(db, "compute,idle", by="run,rank,step", selection=StepSelection(skip_steps=0, include_last=True))
    assert both.select("step", "compute_us", "idle_us").rows() == [(1, 30.0, 50.0), (2, 40.0, 0.0)]  # by hand
    by_run = compute_metric(db, ["exposed_comm", "idle_us", "step_time"], by="run", selection=StepSelection(skip_steps=0, include_last=True))
    for name in ("exposed_comm_us", "idle_us", "step_time_ms"):
        alone = compute_metric(db, name, by="run", selection=StepSelection(skip_steps=0, include_last=True))
        own = [c for c in alone.columns if c.startswith(name)]
        assert by_run.select("run", *own).equals(alone.select("run", *own)), name
    with pytest.raises(ConfigError, match="reported alone"):
        compute_metric(db, "exposed_comm,exposed_comm_by_collective")
    with pytest.raises(ConfigError, match="did you mean idle_us"):
        compute_metric(db, "exposed_comm,idl")


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120, 200])
@pytest.mark.parametrize("command", [["summary"], ["report", "--metric", "exposed_comm,idle"], ["kernels"]])
def test_tables_fit_the_terminal(command: list[str], width: int, corpus_db: Path) -> None:
    runner = CliRunner()
    narrow = runner.invoke(app, [*command, "--db", str(corpus_db)], env={"COLUMNS": str(width)})
    assert narrow.exit_code == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= width, max(lines, key=len)
    full = runner.invoke(app, [*command, "--db", str(corpus_db), "--format", "csv"])
    header = full.stdout.splitlines()[0].split(",")
    shown = lines[0].replace("┃", " ").split()
    left_out = [c for c in header if c not in shown]
    if left_out:  # named on stderr, and CSV has them
        assert any(all(c in line for c in left_out) and "left out" in line for line in narrow.stderr.splitlines())
    assert shown[0] == header[0] and set(shown) <= set(header)
    if command == ["summary"]:  # what matters stays: step time and the shares of compute and exposed comm
        assert {"step_time_ms", "compute_pct", "exposed_comm_pct"} <= set(shown)
    if command == ["kernels"]:  # a kernel's name (cut short), its total and its share
        assert {"name", "total_ms", "share_pct"} <= set(shown)


def _column_text(stdout: str, column: str) -> str:
    """What ``column`` of a table as printed holds, line after line, spaces dropped (a wrapped cell
    goes on in the next lines of the same column; a line may break at a space)."""
    lines = stdout.splitlines()
    at = [c.strip() for c in lines[0].split("┃")].index(column)
    return "".join(line.split("│")[at].replace(" ", "") for line in lines[2:])


@pytest.mark.slow
@pytest.mark.parametrize(("command", "column"), [
    (["kernels", "--top", "8"], "name"),
    (["runs", "--traces"], "path"),
    (["check"], "detail"),
    (["rules"], "pattern"),
])
@pytest.mark.parametrize("width", [80, 120, 200])
def test_narrow_tables_keep_the_column_that_names_a_row_whole(
    command: list[str], column: str, width: int, corpus_db: Path
) -> None:
    """At 100 columns the kernel's name, the trace's path, the finding, the pattern were cut to 24
    characters (`void at::native::vector…` three times) or left out (`runs --traces` without its path);
    now they wrap, and figures are left out first. A kernel's name is its short name (kernel_names)."""
    runner = CliRunner()
    narrow = runner.invoke(app, [*command, "--db", str(corpus_db)], env={"COLUMNS": str(width)})
    full = runner.invoke(app, [*command, "--db", str(corpus_db), "--format", "csv"])
    assert narrow.stdout and max(len(line) for line in narrow.stdout.splitlines()) <= width
    values = pl.read_csv(io.StringIO(full.stdout), infer_schema=False)[column].fill_null("").to_list()
    if command[0] == "kernels":  # a kernel's name is shown short (DESIGN §2), and whole
        from traceq.kernel_names import short_names

        values = short_names(values)
    if command[0] == "rules":  # a table shows the first screen of rules (CSV every one)
        from traceq.cli.warehouse import RULES_SCREEN

        values = values[:RULES_SCREEN]
    want = [value.replace(" ", "") for value in values]
    shown, at = _column_text(narrow.stdout, column), 0
    for value in want:  # every value whole, in order
        found = shown.find(value, at)
        assert found >= 0, (value, shown[at:at + 200])
        at = found + len(value)
    assert any(len(value) > 40 for value in want)  # long enough to have been cut before


def test_the_per_step_chart_gives_each_run_an_axis_of_its_own() -> None:
    """Runs of 13 s and of 0.1 s steps on one axis left the short run flat at the bottom: one panel per run."""
    from traceq.report.plots import STACK, step_breakdown_figure

    def steps(run: str, window_us: float) -> pl.DataFrame:
        return pl.DataFrame({"run": run, "rank": 0, "device": 0, "step": [1, 2], "compute_us": window_us * 0.6,
                             "overlapped_comm_us": window_us * 0.1, "exposed_comm_us": window_us * 0.2,
                             "exposed_memcpy_us": 0.0, "idle_us": window_us * 0.2, "step_time_ms": window_us / 1e3})

    fig = step_breakdown_figure(pl.concat([steps("long", 13e6), steps("short", 100.0)]))
    axes = {}
    for trace in fig.data:
        axes.setdefault(trace.yaxis, set()).update(trace.y)
    assert len(fig.data) == 2 * len(STACK)
    assert axes == {"y": {13e6 * 0.5, 13e6 * 0.1, 13e6 * 0.2, 0.0}, "y2": {50.0, 10.0, 20.0, 0.0}}
    assert [a.text for a in fig.layout.annotations] == ["run long", "run short"]
    assert sum(t.showlegend for t in fig.data) == len(STACK)  # one legend entry per part


@pytest.mark.slow
def test_summary_html_renders_offline_in_headless_chromium(tmp_path: Path) -> None:
    from tests.test_html_report import CHROMIUM, chromium, pixel_variance, script_errors

    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium; CI installs it)")
    db = tmp_path / "w.duckdb"
    assert ingest_traces([two_steps(tmp_path / "job" / "rank0.json")], db, threads=1).ok
    page = tmp_path / "summary.html"
    result = CliRunner().invoke(app, ["summary", "--db", str(db), "--by", "run,rank,step", "--skip-steps", "0",
                                      "--include-last", "--html", str(page)])
    assert result.exit_code == 0, result.stderr
    assert f"wrote {page}" in result.stderr
    dom, log, shot = chromium(page, tmp_path)
    assert not script_errors(log), script_errors(log)
    assert dom.count('class="plot-container plotly"') == 1
    legend = set(re.findall(r'class="legendtext"[^>]*>([^<]+)<', dom))
    assert legend == {"compute", "overlapped comm", "exposed comm", "exposed memcpy", "idle"}
    assert re.findall(r'class="xtick"><text[^>]*>([^<]+)</text>', dom) == ["step 1", "step 2"]  # what varies names a bar
    # the table: step 1 is 30 % compute and 50 % idle of its own window, step 2 all compute
    cells = re.findall(r"<tr>(.*?)</tr>", dom.split("<tbody>")[1])
    rows = [re.findall(r"<td>([^<]*)</td>", c) for c in cells]
    header = re.findall(r"<th>([^<]*)</th>", dom)
    at = {name: header.index(name) for name in ("step", "compute_pct", "idle_pct")}
    assert [(r[at["step"]], r[at["compute_pct"]], r[at["idle_pct"]]) for r in rows] == [("1", "30", "50"), ("2", "100", "0")]
    assert pixel_variance(shot) > 100.0
