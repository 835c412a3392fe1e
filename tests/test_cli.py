"""The CLI: exit codes, one-line errors naming the file, formats, --help that teaches."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.test_metrics_given_expect import one_step_trace
from traceq.cli import app
from traceq.store.warehouse import connect

runner = CliRunner()
TABLES = ("traces", "names", "gpu_events", "host_events", "steps", "trace_threads")


def row_counts(db: Path) -> dict[str, int]:
    with connect(db, read_only=True) as con:
        return {t: con.sql(f"select count(*) from {t}").fetchall()[0][0] for t in TABLES}


@pytest.fixture
def good_trace(tmp_path: Path) -> Path:
    return one_step_trace().write(tmp_path / "job" / "rank0.trace.json.gz")


def test_ingest_then_report_in_every_format(tmp_path: Path, good_trace: Path) -> None:
    db = tmp_path / "w.duckdb"
    result = runner.invoke(app, ["ingest", str(good_trace), "--db", str(db), "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "1 ingested, 0 skipped, 0 failed" in result.output

    table = runner.invoke(app, ["report", "--metric", "exposed_comm", "--db", str(db)])
    assert table.exit_code == 0, table.output
    assert "exposed_comm_us" in table.output and "30.000" in table.output

    as_csv = runner.invoke(app, ["report", "--metric", "exposed_comm", "--by", "run,rank,step", "--format", "csv", "--db", str(db)])
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert rows == [{"run": "job", "rank": "0", "step": "1", "exposed_comm_us": "30.0", "step_time_ms": "0.1"}]

    as_json = runner.invoke(app, ["report", "--metric", "overlap_ratio", "--whole-trace", "--format", "json", "--db", str(db)])
    data = json.loads(as_json.stdout)
    assert data[0]["overlap_ratio"] == pytest.approx(5 / 35)


def test_reingesting_the_same_content_is_a_reported_no_op(tmp_path: Path, good_trace: Path) -> None:
    db = tmp_path / "w.duckdb"
    runner.invoke(app, ["ingest", str(good_trace), "--db", str(db), "--threads", "1"])
    before = row_counts(db)
    copy = tmp_path / "elsewhere" / "copy.json.gz"
    copy.parent.mkdir()
    copy.write_bytes(good_trace.read_bytes())
    again = runner.invoke(app, ["ingest", str(good_trace), str(copy), "--db", str(db), "--threads", "1"])
    assert again.exit_code == 0
    assert "0 ingested, 2 skipped, 0 failed" in again.output
    assert "already ingested" in again.output
    assert row_counts(db) == before


def bad_files(tmp_path: Path, good_trace: Path) -> dict[str, tuple[Path, str]]:
    d = tmp_path / "bad"
    d.mkdir()
    not_json = d / "notes.json"
    not_json.write_text("hello, world")
    not_trace = d / "config.json"
    not_trace.write_text(json.dumps({"lr": 0.1, "layers": [1, 2]}))
    truncated = d / "cut.json.gz"
    truncated.write_bytes(good_trace.read_bytes()[:-40])
    return {
        "missing": (d / "absent.json", "no such file"),
        "not json": (not_json, "not a Kineto trace"),
        "not a trace": (not_trace, 'no "traceEvents" array'),
        "truncated gzip": (truncated, "truncated or corrupt"),
    }


def test_bad_files_fail_alone_with_one_line_naming_file_and_reason(tmp_path: Path, good_trace: Path) -> None:
    db = tmp_path / "w.duckdb"
    bad = bad_files(tmp_path, good_trace)
    args = ["ingest", *(str(p) for p, _ in bad.values()), str(good_trace), "--db", str(db), "--threads", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "1 ingested, 0 skipped, 4 failed" in result.stdout
    failures = [line for line in result.stderr.splitlines() if line.startswith("failed ")]
    assert len(failures) == 4
    for path, reason in bad.values():
        assert any(str(path) in line and reason in line for line in failures), (path, reason, failures)
    counts = row_counts(db)
    assert counts["traces"] == 1
    with connect(db, read_only=True) as con:
        # nothing of the failed files: every row belongs to the one good trace
        for t in TABLES:
            assert con.sql(f"select count(distinct trace_id) from {t}").fetchall()[0][0] <= 1


def test_report_errors_are_one_line_with_the_fix(tmp_path: Path, good_trace: Path) -> None:
    missing = runner.invoke(app, ["report", "--db", str(tmp_path / "none.duckdb")])
    assert missing.exit_code == 1
    assert "no warehouse here; ingest traces into it first" in missing.stderr
    db = tmp_path / "w.duckdb"
    runner.invoke(app, ["ingest", str(good_trace), "--db", str(db), "--threads", "1"])
    for args, text in [
        (["--metric", "bogus"], "--metric bogus: unknown metric; every metric: comm_kernel_us"),
        (["--metric", "exposed_com"], "--metric exposed_com: unknown metric; did you mean exposed_comm_us?"),
        (["--by", "run,rnak"], "--by run,rnak: unknown column(s) ['rnak']; did you mean rank?"),
        (["--steps", "9:3"], "end is before the start"),
        (["--steps", "x"], "expected a:b"),
        (["--by", "run,color"], "unknown column"),
    ]:
        result = runner.invoke(app, ["report", "--db", str(db), *args])
        assert result.exit_code == 1, args
        assert result.stderr.startswith("error: ") and text in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1


def test_metrics_lists_every_metric_with_unit(tmp_path: Path) -> None:
    from traceq.catalog import METRICS

    result = runner.invoke(app, ["metrics", "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["name"] for r in rows] == [m.name for m in METRICS]
    assert all(r["unit"] and r["definition"] for r in rows)


def test_every_command_help_shows_an_example() -> None:
    import typer

    group = typer.main.get_command(app)
    commands = [[name] for name in group.commands]
    commands += [[name, sub] for name, command in group.commands.items() for sub in getattr(command, "commands", ())]
    assert {"ingest", "report", "metrics", "runs", "rules"} <= {c[0] for c in commands}
    assert {("runs", "set"), ("runs", "rm"), ("runs", "rename")} <= {tuple(c) for c in commands}
    for words in commands:
        result = runner.invoke(app, [*words, "--help"])
        assert result.exit_code == 0
        assert "Example" in result.stdout and f"traceq {' '.join(words)}" in result.stdout, words


def test_user_rules_from_the_cli(tmp_path: Path, good_trace: Path) -> None:
    db = tmp_path / "w.duckdb"
    runner.invoke(app, ["ingest", str(good_trace), "--db", str(db), "--threads", "1"])
    bad = tmp_path / "bad_rules.csv"
    bad.write_text("priority,pattern,class\n1,x,comm\n")
    result = runner.invoke(app, ["rules", "--add", str(bad), "--db", str(db)])
    assert result.exit_code == 1 and "missing columns" in result.stderr
    good = tmp_path / "rules.csv"
    good.write_text("priority,pattern,class,category,collective\n1,^Memcpy,comm,copy_engine,Other\n")
    added = runner.invoke(app, ["rules", "--add", str(good), "--db", str(db)])
    builtin = len(Path(__file__).resolve().parents[1].joinpath("sql", "kernel_rules.csv").read_text().splitlines()) - 1
    # the count, not the whole table (200,000 rules printed took minutes)
    assert added.exit_code == 0 and added.stdout == f"added 1 rule(s) from {good}: {builtin + 1} rule(s) now (traceq rules lists them)\n"
    report = runner.invoke(app, ["report", "--metric", "comm_kernel", "--format", "csv", "--db", str(db)])
    # a memcpy is not a kernel: rules classify kernels only, so comm stays 25 + 10 us
    assert list(csv.DictReader(io.StringIO(report.stdout)))[0]["comm_kernel_us"] == "35.0"


def _console(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    """``traceq ARGS`` as the console script runs it (:func:`traceq.cli.main`), in a fresh process."""
    code = "import sys; from traceq.cli import main; sys.argv = ['traceq', *sys.argv[1:]]; main()"
    # os.environ, passed on: the process's C environment can hold a COLUMNS that os.environ does not
    # (a library's setenv under pytest), and tables fit the terminal when COLUMNS is set
    return subprocess.run([sys.executable, "-c", code, *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ))


@pytest.mark.slow
def test_console_script_exit_codes_and_output(tmp_path: Path, good_trace: Path) -> None:
    # main() ends the process with sys.exit after removing its scratch: what was printed must arrive, with the exit code
    db = tmp_path / "w.duckdb"
    ok = _console("ingest", str(good_trace), "--db", str(db), "--threads", "1")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.rstrip().endswith(f"1 ingested, 0 skipped, 0 failed -> {db}")
    report = _console("report", "--metric", "exposed_comm", "--by", "run,rank,step", "--format", "csv", "--db", str(db))
    assert report.returncode == 0, report.stderr
    assert list(csv.DictReader(io.StringIO(report.stdout))) == [
        {"run": "job", "rank": "0", "step": "1", "exposed_comm_us": "30.0", "step_time_ms": "0.1"}
    ]
    bad = _console("report", "--metric", "nope", "--db", str(db))
    assert bad.returncode == 1 and bad.stderr.startswith("error: --metric nope: unknown metric")
    usage = _console("report", "--no-such-option")
    assert usage.returncode == 2 and "No such option" in usage.stderr


def test_console_script_survives_a_closed_pipe() -> None:
    # `traceq metrics | head -0`: the reader is gone before anything is written
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        writer = _console("metrics", stdout=write_end)
    finally:
        os.close(write_end)
    assert writer.returncode == 1  # click's answer to EPIPE
    assert writer.stderr == ""


def test_run_selects_and_name_names_in_every_command(tmp_path: Path, good_trace: Path) -> None:
    """One name per thing: --run selects runs of the warehouse, ingest --name names the run traces go to;
    --threads (ingest) and --processes (ingest-cluster) count what they say. The former names are refused
    in one line that gives the new one, and nothing is ingested."""
    db = tmp_path / "w.duckdb"
    for args, said in [
        (["--run", "job1"], "error: --run job1: selects runs in the reports; name the run these traces go to with "
                            "--name job1\n"),
        (["--workers", "2"], "error: --workers 2: renamed: --threads 2\n"),
    ]:
        done = runner.invoke(app, ["ingest", str(good_trace), "--db", str(db), *args])
        assert (done.exit_code, done.stderr) == (1, said), args
        assert not db.exists()
    done = runner.invoke(app, ["ingest-cluster", str(good_trace), "--parquet", str(tmp_path / "pq"), "--workers", "2"])
    assert (done.exit_code, done.stderr) == (1, "error: --workers 2: renamed: --processes 2\n")
    done = runner.invoke(app, ["ingest", str(good_trace), "--db", str(db), "--name", "job1", "--threads", "1"])
    assert done.exit_code == 0, done.output
    listed = runner.invoke(app, ["runs", "--run", "job1", "--db", str(db), "--format", "json"])
    assert [r["run"] for r in json.loads(listed.stdout)] == ["job1"]
    again = runner.invoke(app, ["ingest", str(good_trace), "--db", str(db), "--name", "other", "--threads", "1"])
    assert f"skipped {good_trace}: already ingested (as {good_trace.resolve()}, run job1); --force reads it again " \
           "into run other" in again.stdout  # the name given did not go unsaid
    done = runner.invoke(app, ["report", "--name", "job1", "--db", str(db)])
    assert done.exit_code == 1 and "--name job1: names the run of trace files read with --engine perfetto" in done.stderr
    done = runner.invoke(app, ["report", "--engine", "perfetto", "--run", "job1", str(good_trace)])
    assert done.exit_code == 1 and "--name RUN names their run" in done.stderr
