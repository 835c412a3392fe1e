"""Run management: `traceq runs rm`, `traceq runs rename`, `traceq ingest --force`. Each is one
transaction; checked by the rows of every table, counted before and after."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.conftest import corpus_path
from tests.test_bad_input import small_trace
from traceq.cli import app
from traceq.errors import ConfigError, EmptySelection
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric
from traceq.store.manage import remove_run, rename_run
from traceq.store.run_metadata import set_run_metadata

PAIR = "hta/trace_filter"  # two ranks
ONE = "hta/nccl_parser_config/nccl_data.json.gz"


def rows_by_run(db: Path) -> dict[str, dict[str, int]]:
    """{table: {run: rows}} for every table that has a trace_id or a run, counted on its own."""
    with duckdb.connect(str(db), read_only=True) as con:
        columns = con.execute(
            "select table_name, list(column_name) from duckdb_columns() where schema_name = 'main' group by 1"
        ).fetchall()
        out: dict[str, dict[str, int]] = {}
        for table, cols in columns:
            if "run" in cols:
                query = f"select run, count(*) from {table} group by run"
            elif "trace_id" in cols:
                query = f"select t.run, count(*) from {table} as x join traces as t using (trace_id) group by t.run"
            else:
                continue
            out[table] = dict(con.execute(query).fetchall())
    return out


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    db = tmp_path / "w.duckdb"
    assert ingest_traces([corpus_path(PAIR)], db, name="a", threads=1).ok
    assert ingest_traces([corpus_path(ONE)], db, name="b", threads=1).ok
    set_run_metadata(db, "a", {"tokens_per_step": 4096, "tp": 2})
    return db


@pytest.mark.slow
def test_rm_removes_every_row_of_the_run_and_nothing_else(two_runs: Path) -> None:
    before = rows_by_run(two_runs)
    report_b = compute_metric(two_runs, "exposed_comm", runs=["b"])
    removed = remove_run(two_runs, "a")
    after = rows_by_run(two_runs)
    for table, by_run in before.items():
        assert after[table].get("a", 0) == 0, table
        assert after[table].get("b", 0) == by_run.get("b", 0), table
        if "a" in by_run:
            assert removed.get(table) == by_run["a"], table
    assert removed["gpu_events"] > 1000 and removed["traces"] == 2
    assert compute_metric(two_runs, "exposed_comm", runs=["b"]).equals(report_b)


@pytest.mark.slow
def test_rename_moves_every_row_and_the_settings(two_runs: Path) -> None:
    before = rows_by_run(two_runs)
    report = compute_metric(two_runs, "exposed_comm", runs=["a"]).drop("run")
    assert rename_run(two_runs, "a", "recsys") == 2
    after = rows_by_run(two_runs)
    for table, by_run in before.items():
        assert after[table].get("recsys", 0) == by_run.get("a", 0), table
        assert "a" not in after[table], table
    assert compute_metric(two_runs, "exposed_comm", runs=["recsys"]).drop("run").equals(report)
    with duckdb.connect(str(two_runs), read_only=True) as con:
        assert con.execute("select key from run_settings where run = 'recsys' order by key").fetchall() == [
            ("tokens_per_step",), ("tp",)]


@pytest.mark.slow
def test_refused_changes_change_nothing(two_runs: Path) -> None:
    before = rows_by_run(two_runs)
    with pytest.raises(ConfigError, match="'b' exists already"):
        rename_run(two_runs, "a", "b")
    with pytest.raises(ConfigError, match="not empty"):
        rename_run(two_runs, "a", " ")
    with pytest.raises(EmptySelection, match="no run 'c' in the warehouse; it holds: a, b"):
        remove_run(two_runs, "c")
    assert rows_by_run(two_runs) == before
    runner = CliRunner()
    done = runner.invoke(app, ["runs", "rename", "a", "b", "--db", str(two_runs)])
    assert done.exit_code == 1 and done.stderr.startswith("error: a run named 'b' exists already")
    done = runner.invoke(app, ["runs", "rm", "--db", str(two_runs)])
    assert done.exit_code == 2 and "Missing argument 'RUN'" in done.stderr
    # `runs` is a group of commands: a run's name where a command goes is said with the command that shows it
    done = runner.invoke(app, ["runs", "a", "--db", str(two_runs)])
    assert done.exit_code == 1 and done.stderr == ("error: traceq runs has no command 'a' (set, rm, rename); "
                                                   "to show one run: traceq runs --run a\n")
    done = runner.invoke(app, ["runs", "--run", "a", "--db", str(two_runs), "--format", "csv"])
    assert done.exit_code == 0 and [line.split(",")[0] for line in done.stdout.splitlines()[1:]] == ["a"]
    done = runner.invoke(app, ["runs", "--run", "c", "--db", str(two_runs)])
    assert done.exit_code == 1 and "no run 'c' in" in done.stderr and "it holds a, b" in done.stderr
    assert rows_by_run(two_runs) == before


def test_cli_rm_and_rename(two_runs: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["runs", "rename", "a", "recsys", "--db", str(two_runs), "--format", "csv"])
    assert done.exit_code == 0, done.stderr
    assert "renamed run a to recsys (2 trace(s))" in done.stderr
    assert [line.split(",")[0] for line in done.stdout.splitlines()[1:]] == ["b", "recsys"]
    done = runner.invoke(app, ["runs", "rm", "b", "--db", str(two_runs), "--format", "csv"])
    assert done.exit_code == 0 and done.stderr.startswith("removed run b: 1 trace(s)")
    assert [line.split(",")[0] for line in done.stdout.splitlines()[1:]] == ["recsys"]


@pytest.mark.slow
def test_ingest_force_moves_a_trace_to_another_run(two_runs: Path) -> None:
    before = rows_by_run(two_runs)
    assert ingest_traces([corpus_path(PAIR)], two_runs, name="c", threads=1).by_status("skipped")
    summary = ingest_traces([corpus_path(PAIR)], two_runs, name="c", force=True)
    assert [f.status for f in summary.files] == ["ingested", "ingested"]
    assert all("its earlier trace in run a is replaced" in f.notes[0] for f in summary.files)
    assert "run a had no other trace and is removed" in summary.files[-1].notes[0]
    after = rows_by_run(two_runs)
    for table, by_run in before.items():
        if table in ("runs", "run_settings"):
            continue
        assert after[table].get("c", 0) == by_run.get("a", 0), table
        assert after[table].get("a", 0) == 0 and after[table].get("b") == by_run.get("b"), table
    assert "a" not in after["runs"] and "a" not in after["run_settings"]  # no trace left: gone, as runs rm does
    assert rename_run(two_runs, "c", "a") == 2  # and its name is free again


@pytest.mark.slow
def test_ingest_force_into_the_same_run_keeps_its_metadata(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    trace = corpus_path(ONE)
    assert ingest_traces([trace], db, name="b", threads=1).ok
    set_run_metadata(db, "b", {"tokens_per_step": 4096, "warmup_steps": 1})
    before = compute_metric(db, "tokens_per_s", by="run")
    result = ingest_traces([trace], db, name="b", force=True, threads=1).files[0]
    assert result.status == "ingested" and "removed" not in result.notes[0]
    after = compute_metric(db, "tokens_per_s", by="run")
    assert after.equals(before) and after["tokens_per_s"][0] > 0


def test_a_forced_ingest_that_fails_keeps_the_earlier_trace(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    trace = small_trace(rank=0).write(tmp_path / "x" / "rank0.json")
    other = small_trace(rank=0)
    other.kernel("another_kernel", 60_000, 70_000, launch_ns=55_000)
    holder = other.write(tmp_path / "y" / "rank0.json")
    assert ingest_traces([trace], db, name="a", threads=1).ok
    assert ingest_traces([holder], db, name="b", threads=1).ok
    before = rows_by_run(db)
    # moved into run b, the file would give rank 0 of b a second trace of step 1: refused, rolled back
    result = ingest_traces([trace], db, name="b", force=True, threads=1).files[0]
    assert result.status == "failed" and "rank 0" in result.message
    assert rows_by_run(db) == before


@pytest.mark.slow
def test_force_on_a_copy_of_the_warehouse_file_is_atomic_under_kill(two_runs: Path, tmp_path: Path) -> None:
    """SIGKILL in the middle of `ingest --force`: the earlier trace is there or the new one, not neither."""
    import signal
    import subprocess
    import sys
    import time

    traceq = Path(sys.executable).with_name("traceq")
    before = rows_by_run(two_runs)
    for delay in (0.3, 0.5, 0.7, 0.9):
        copy = tmp_path / f"k{delay}.duckdb"
        shutil.copy(two_runs, copy)
        proc = subprocess.Popen([str(traceq), "ingest", str(corpus_path(PAIR)), "--name", "c", "--force", "--db", str(copy)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        subprocess.run([str(traceq), "runs", "--db", str(copy)], capture_output=True, check=True)  # replays the log
        after = rows_by_run(copy)
        for table in ("traces", "gpu_events", "host_events", "steps"):
            kept = after[table].get("a", 0) + after[table].get("c", 0)
            assert kept == before[table]["a"], (delay, table, after[table])
