"""DuckDB files that are not this traceq's warehouse: read commands never write, a DuckDB database of other
tables is refused untouched ("not a traceq warehouse"), one made by a newer traceq is refused ("made by a
newer traceq"), and only a writing command migrates an older one (tests/test_trace_identity.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.test_metrics_given_expect import one_step_trace
from traceq.cli import app
from traceq.ingest import ingest_traces

runner = CliRunner()

READ_COMMANDS = [
    ["report", "--metric", "exposed_comm"], ["summary"], ["kernels"], ["collectives"], ["stragglers"],
    ["critical-path"], ["runs"], ["runs", "--traces"], ["check"], ["scaling"], ["diff", "a", "b"],
    ["sql", "select 1"], ["rules"],
]


def fingerprint(path: Path) -> tuple[str, list[str]]:
    """The file's bytes (digest) and what lies beside it (a WAL, a spill folder)."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(p.name for p in path.parent.iterdir())


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    """A DuckDB database of the user's own, with nothing of traceq's."""
    path = tmp_path / "mine.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("create table measurements (run varchar, seconds double)")
        con.execute("insert into measurements values ('a', 1.5), ('b', 2.5)")
    return path


@pytest.fixture
def newer(tmp_path: Path) -> Path:
    """A warehouse stamped by a traceq of a later schema."""
    path = tmp_path / "newer.duckdb"
    assert ingest_traces([one_step_trace().write(tmp_path / "job" / "rank0.json")], path, workers=0).ok
    with duckdb.connect(str(path)) as con:
        con.execute("update warehouse_info set value = '99' where key = 'schema_version'")
    return path


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_read_commands_refuse_a_foreign_duckdb_file_and_leave_it_byte_identical(foreign: Path, command: list[str]) -> None:
    before = fingerprint(foreign)
    out = runner.invoke(app, [*command, "--db", str(foreign)])
    assert out.exit_code == 1, out.output
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.output
    assert f"{foreign}: not a traceq warehouse (a DuckDB database of other tables: measurements)" in out.stderr
    assert fingerprint(foreign) == before
    with duckdb.connect(str(foreign), read_only=True) as con:
        assert con.execute("select count(*) from measurements").fetchone() == (2,)


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_read_commands_refuse_a_newer_warehouse_and_leave_it_byte_identical(newer: Path, command: list[str]) -> None:
    before = fingerprint(newer)
    out = runner.invoke(app, [*command, "--db", str(newer)])
    assert out.exit_code == 1, out.output
    assert "made by a newer traceq (schema 99; this traceq knows schema 2)" in out.stderr
    assert out.stderr.count("\n") == 1
    assert fingerprint(newer) == before


@pytest.mark.parametrize("which", ["foreign", "newer"])
def test_writing_commands_refuse_them_too(tmp_path: Path, which: str, request: pytest.FixtureRequest) -> None:
    db = request.getfixturevalue(which)
    trace = one_step_trace().write(tmp_path / "other" / "rank0.json")
    rules = tmp_path / "rules.csv"
    rules.write_text("priority,pattern,class,category,collective\n5,^mykernel,compute,gemm,\n")
    before = fingerprint(db)
    for command in (["ingest", str(trace)], ["rules", "--add", str(rules)], ["runs", "set", "job", "--tp", "2"],
                    ["runs", "rm", "job"], ["migrate"]):
        out = runner.invoke(app, [*command, "--db", str(db)])
        assert out.exit_code == 1, (command, out.output)
        assert ("not a traceq warehouse" if which == "foreign" else "made by a newer traceq") in out.stderr, command
        assert fingerprint(db) == before, command


def test_an_empty_duckdb_file_is_no_warehouse_yet_for_reports_and_becomes_one_on_ingest(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    duckdb.connect(str(db)).close()
    before = fingerprint(db)
    out = runner.invoke(app, ["report", "--metric", "idle", "--db", str(db)])
    assert out.exit_code == 1 and "no warehouse here yet (an empty DuckDB database); ingest traces into it first" in out.stderr
    assert fingerprint(db) == before
    trace = one_step_trace().write(tmp_path / "job" / "rank0.json")
    assert runner.invoke(app, ["ingest", str(trace), "--db", str(db)]).exit_code == 0
    assert runner.invoke(app, ["report", "--metric", "idle", "--db", str(db)]).exit_code == 0


def test_a_damaged_schema_version_is_one_line(tmp_path: Path, newer: Path) -> None:
    with duckdb.connect(str(newer)) as con:
        con.execute("update warehouse_info set value = 'two' where key = 'schema_version'")
    out = runner.invoke(app, ["runs", "--db", str(newer)])
    assert out.exit_code == 1 and "damaged warehouse (its schema_version is 'two', not a number)" in out.stderr
    assert "Traceback" not in out.output
