"""Two processes on one warehouse. DuckDB lets one process write, and a read-only open conflicts with
a writer too: a second `traceq ingest`, `report` or `check` waits for the lock (up to
warehouse.connect's wait_s) and then works, or fails with one clear line. No corruption, no lost rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.conftest import corpus_path
from tests.test_bad_input import small_trace, table_counts
from tests.test_interrupt import TRACEQ, wait_until_mid_file
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.store.warehouse import LOCK_WAIT_ENV

pytestmark = pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="needs Linux /proc to see the file offset")

SMALL = "hta/trace_filter/sampled_rank-1.json.gz"


@pytest.fixture
def trace(long_trace: tuple[Path, int]) -> Path:
    return long_trace[0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    db = tmp_path / "w.duckdb"
    assert ingest_traces([small_trace().write(tmp_path / "small" / "rank0.json")], db, threads=1).ok
    return db


def _start(*args: object) -> subprocess.Popen:
    """A traceq command that waits for another's lock as long as this test may take: on a loaded
    machine the first ingest ran past the 10 s a command waits by default (a run beside a CPU hog)."""
    env = {**os.environ, LOCK_WAIT_ENV: "300"}
    return subprocess.Popen([TRACEQ, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _assert_complete(db: Path, n_traces: int) -> None:
    """Every trace's rows are all there (counts stored at ingest = rows present), and nothing else."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "select count(*), count(*) filter (where n_gpu_events = (select count(*) from gpu_events g where g.trace_id = t.trace_id)"
            " and n_host_events = (select count(*) from host_events h where h.trace_id = t.trace_id)) from traces t"
        ).fetchone()
        orphans = con.execute("select count(*) from gpu_events where trace_id not in (select trace_id from traces)").fetchone()
    finally:
        con.close()
    assert rows == (n_traces, n_traces) and orphans == (0,)


@pytest.mark.slow
def test_two_ingests_on_one_warehouse_both_complete(trace: Path, db: Path) -> None:
    first = _start("ingest", trace, "--db", db, "--threads", "1", "-q")
    wait_until_mid_file(first, trace)
    # the second process also brings the first one's file: it must be skipped, not loaded twice
    other = small_trace(rank=1).write(db.parent / "other" / "rank1.json")
    second = _start("ingest", corpus_path(SMALL), other, trace, "--db", db, "--threads", "1", "-q")
    assert first.poll() is None  # the second started while the first held the lock
    out1, err1 = first.communicate(timeout=120)
    out2, err2 = second.communicate(timeout=120)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    assert out1.splitlines()[-1].startswith("1 ingested, 0 skipped, 0 failed")
    assert out2.splitlines()[-1].startswith("2 ingested, 1 skipped, 0 failed")
    _assert_complete(db, 4)


@pytest.mark.slow
def test_report_while_an_ingest_runs_waits_and_sees_the_whole_file(trace: Path, db: Path) -> None:
    ingest = _start("ingest", trace, "--db", db, "--threads", "1", "-q")
    wait_until_mid_file(ingest, trace)
    report = _start("report", "--db", db, "--by", "run,rank", "--whole-trace", "--format", "csv")
    assert ingest.poll() is None
    _, err = ingest.communicate(timeout=120)
    out, report_err = report.communicate(timeout=120)
    assert ingest.returncode == 0, err
    assert report.returncode == 0, report_err
    assert trace.parent.name in out  # the ingested file's run is in the report: it waited for the commit
    _assert_complete(db, 2)


class Locked:
    """Another process holds the warehouse's write lock until :meth:`release`."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.before = table_counts(db)
        self.holder = subprocess.Popen(
            [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
             "print('locked', flush=True); time.sleep(120)", str(db)],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.holder.stdout is not None and self.holder.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.holder.poll() is None:
            self.holder.kill()
        self.holder.wait()
        if self.holder.stdout is not None:
            self.holder.stdout.close()


@pytest.fixture
def locked(db: Path, monkeypatch: pytest.MonkeyPatch):
    """The warehouse locked by another process; traceq waits 0.3 s for the lock instead of 10 s."""
    lock = Locked(db)
    monkeypatch.setenv(LOCK_WAIT_ENV, "0.3")
    yield lock
    lock.release()


@pytest.mark.slow
@pytest.mark.parametrize("command", [["ingest", "TRACE", "--threads", "1"], ["report"], ["check"], ["runs"]])
def test_a_command_that_cannot_get_the_lock_fails_with_one_clear_line(command: list[str], locked: Locked, tmp_path: Path) -> None:
    trace = small_trace(rank=1).write(tmp_path / "rank1.json")
    args = [str(trace) if a == "TRACE" else a for a in command]
    result = CliRunner().invoke(app, [*args, "--db", str(locked.db)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: {locked.db}: another traceq process holds the warehouse lock; wait for it to finish, set "
        "TRACEQ_LOCK_WAIT_S to wait longer, or use --db with another file\n"
    )
    locked.release()
    assert table_counts(locked.db) == locked.before
    _assert_complete(locked.db, 1)


@pytest.mark.parametrize("value", ["ten", "-1", "1e9", "nan"])
def test_a_lock_wait_that_is_no_number_of_seconds_is_one_line(value: str, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_WAIT_ENV, value)
    result = CliRunner().invoke(app, ["report", "--db", str(db)])
    assert result.exit_code == 1
    assert result.stderr == (f"error: {LOCK_WAIT_ENV}={value!r}: give the seconds to wait for another traceq's lock, "
                             "0 to 86400\n")
