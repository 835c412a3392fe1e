"""Reliability, round 3: DuckDB files that are not this traceq's warehouse (read commands never write, a DuckDB
database of other tables is refused untouched, one made by a newer traceq too, and only a writing command
migrates an older one: tests/test_trace_identity.py), the SQL console that reads the warehouse and nothing
else, control characters shown and never obeyed, bounded work, damaged Parquet exports, and inputs that
gave tracebacks."""

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
# the device events of one_step_trace(), counted from the trace itself
DEVICE_EVENTS = sum(e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset") for e in one_step_trace().events)

READ_COMMANDS = [
    ["report", "--metric", "exposed_comm"], ["summary"], ["kernels"], ["collectives"], ["stragglers"],
    ["critical-path"], ["explain"], ["runs"], ["runs", "--traces"], ["check"], ["scaling"], ["diff", "a", "b"],
    ["sql", "select 1"], ["rules"],
]


def duckdb_file(path: Path, *statements: str) -> Path:
    """A DuckDB database at ``path`` made by ``statements`` (someone else's file, or one that imitates traceq's)."""
    with duckdb.connect(str(path)) as con:
        for statement in statements:
            con.execute(statement)
    return path


LOOKALIKE = ("create table traces (x int)", "create table warehouse_info (key varchar, value varchar)",
             "insert into warehouse_info values ('schema_version', '2')")


def fingerprint(path: Path) -> tuple[str, list[str]]:
    """The file's bytes (digest) and what lies beside it (a WAL, a spill folder)."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(p.name for p in path.parent.iterdir())


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    """A DuckDB database of the user's own, with nothing of traceq's."""
    return duckdb_file(tmp_path / "mine.duckdb", "create table measurements (run varchar, seconds double)",
                       "insert into measurements values ('a', 1.5), ('b', 2.5)")


@pytest.fixture
def newer(tmp_path: Path) -> Path:
    """A warehouse stamped by a traceq of a later schema."""
    path = tmp_path / "newer.duckdb"
    assert ingest_traces([one_step_trace().write(tmp_path / "job" / "rank0.json")], path, threads=1).ok
    with duckdb.connect(str(path)) as con:
        con.execute("update warehouse_info set value = '99' where key = 'schema_version'")
    return path


@pytest.mark.slow
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


@pytest.mark.slow
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
    assert out.exit_code == 1 and "damaged warehouse or not traceq's (its schema_version is 'two', not a number)" in out.stderr
    assert "Traceback" not in out.output


# ------------------------------------------------------------------------------------- the SQL console


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    db = tmp_path / "w.duckdb"
    assert ingest_traces([one_step_trace().write(tmp_path / "job" / "rank0.json")], db, threads=1).ok
    return db


@pytest.mark.slow
@pytest.mark.parametrize("query", [
    "copy (select * from traces) to '{out}/leak.csv'",
    "select * from read_csv('/etc/passwd')",
    "select * from read_text('/etc/hostname')",
    "attach '{out}/other.duckdb' as o",
    "install httpfs",
    "set memory_limit = '100GB'",
    "set enable_external_access = true",
], ids=["copy to", "read_csv", "read_text", "attach", "install", "set", "re-enable"])
def test_the_sql_console_reads_the_warehouse_and_nothing_else(warehouse: Path, tmp_path: Path, query: str) -> None:
    out_dir = tmp_path / "outside"
    out_dir.mkdir()
    before = fingerprint(warehouse)
    done = runner.invoke(app, ["sql", query.format(out=out_dir), "--db", str(warehouse)])
    assert done.exit_code == 1, done.output
    assert done.stderr.startswith("error: DuckDB refused the query:") and done.stderr.count("\n") == 1
    assert list(out_dir.iterdir()) == [] and fingerprint(warehouse) == before
    # what the console is for still works, on a Parquet export too
    assert runner.invoke(app, ["sql", "select count(*) as n from gpu_activity", "--db", str(warehouse),
                               "--format", "csv"]).stdout == f"n\n{DEVICE_EVENTS}\n"


def test_the_sql_console_on_a_parquet_warehouse_reads_its_folder_only(warehouse: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pq"
    assert runner.invoke(app, ["export", "--parquet", str(folder), "--db", str(warehouse)]).exit_code == 0
    done = runner.invoke(app, ["sql", "select count(*) as n from gpu_events", "--db", str(folder), "--format", "csv"])
    assert done.exit_code == 0 and done.stdout == f"n\n{DEVICE_EVENTS}\n", done.output
    done = runner.invoke(app, ["sql", "select * from read_csv('/etc/passwd')", "--db", str(folder)])
    assert done.exit_code == 1 and "Permission Error" in done.stderr


def test_the_sql_console_caps_its_rows_and_says_so(warehouse: Path) -> None:
    done = runner.invoke(app, ["sql", "select * from range(250000) as t(i)", "--db", str(warehouse), "--format", "csv"])
    assert done.exit_code == 0
    lines = done.stdout.splitlines()
    assert len(lines) == 100_001 and lines[-1] == "99999"
    assert "more than 100,000 rows: the first 100,000 are shown (--max-rows)" in done.stderr
    done = runner.invoke(app, ["sql", "select * from range(7) as t(i)", "--db", str(warehouse), "--max-rows", "5",
                               "--format", "csv"])
    assert done.stdout.splitlines()[1:] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("db", ["md:foo", "motherduck:bar", "s3://bucket/w.duckdb", "https://example.com/w.duckdb"])
def test_remote_warehouses_are_refused_before_anything_is_opened(db: str) -> None:
    for command in (["runs"], ["sql", "select 1"], ["report", "--metric", "idle"]):
        done = runner.invoke(app, [*command, "--db", db])
        # (a path option collapses "//": the message shows s3:/bucket/...)
        assert done.exit_code == 1 and ": a warehouse is a local DuckDB file or Parquet directory" in done.stderr
        assert db.split("//")[-1] in done.stderr


# ------------------------------------------------------------------------------------- control characters

HOSTILE = "\x1b]0;PWNED\x07\x1b[2J\x9b31m"  # retitle the terminal, clear it, a C1 CSI


def test_control_characters_in_names_are_shown_not_obeyed(tmp_path: Path) -> None:
    """A kernel named with ESC sequences comes out written out (\\x1b...) in every format, and nothing of
    what the CLI prints holds a control character but its own line ends."""
    from tests.tracegen import TraceBuilder

    t = TraceBuilder(rank=0)
    t.step(1, 0, 100_000)
    t.step(2, 100_000, 200_000)
    t.kernel(f"gemm{HOSTILE}\nerror: forged line", 0, 50_000, launch_ns=0)
    t.kernel("gemm_plain", 100_000, 150_000, launch_ns=100_000)
    db = tmp_path / "w.duckdb"
    assert ingest_traces([t.write(tmp_path / "job" / "rank0.json")], db, threads=1).ok
    shown = "gemm\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m\\nerror: forged line"
    for fmt in ("table", "csv", "json"):
        done = runner.invoke(app, ["kernels", "--db", str(db), "--format", fmt, "--include-last"])
        assert done.exit_code == 0, done.output
        printed = done.stdout + done.stderr
        assert not [c for c in printed if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F], fmt
        assert "\nerror: forged line" not in printed, fmt
        expected = {"table": shown.replace("\\n", " "),  # a table's short name folds the line end into a space
                    "csv": shown, "json": "gemm\\u001b]0;PWNED\\u0007\\u001b[2J\\u009b31m\\nerror: forged line"}[fmt]
        assert expected in printed, fmt


@pytest.mark.parametrize("name", [f"job{HOSTILE}", "job\nerror: forged", "job\x00"])
def test_run_names_with_control_characters_are_refused(tmp_path: Path, name: str) -> None:
    trace = one_step_trace().write(tmp_path / "job" / "rank0.json")
    db = tmp_path / "w.duckdb"
    done = runner.invoke(app, ["ingest", str(trace), "--db", str(db), "--name", name])
    assert done.exit_code == 1
    assert "a run name cannot hold control characters" in done.stderr and done.stderr.count("\n") == 1
    assert "\x1b" not in done.stderr and "\nerror: forged" not in done.stderr
    assert runner.invoke(app, ["ingest", str(trace), "--db", str(db), "--name", "job"]).exit_code == 0
    done = runner.invoke(app, ["runs", "rename", "job", name, "--db", str(db)])
    assert done.exit_code == 1 and "control characters" in done.stderr


# ------------------------------------------------------------------------------------- bounded work


@pytest.mark.parametrize(("command", "option", "count"), [
    ("ingest", "--threads", "100000"), ("ingest", "--threads", "0"), ("ingest-cluster", "--processes", "0"),
    ("ingest-cluster", "--processes", "500"),
])
def test_threads_or_processes_beyond_a_few_per_core_are_refused_before_any_work(tmp_path: Path, command: str,
                                                                                option: str, count: str) -> None:
    import os

    trace = one_step_trace().write(tmp_path / "job" / "rank0.json")
    out = tmp_path / ("w.duckdb" if command == "ingest" else "pq")
    args = [command, str(trace), option, count] + (["--db", str(out)] if command == "ingest" else ["--parquet", str(out)])
    done = runner.invoke(app, args)
    most = 4 * (os.cpu_count() or 1)
    assert done.exit_code == 1 and f"{option} {count}: give 1 to {most}" in done.stderr
    assert not out.exists()


# ------------------------------------------------------------------------------------- damaged Parquet exports


@pytest.fixture
def export(tmp_path: Path) -> Path:
    """A Parquet export of a 3-rank run (three traces)."""
    from tests.test_cross_rank import late_rank_run, write_run

    db = tmp_path / "src.duckdb"
    files = write_run(tmp_path / "job", late_rank_run())
    assert ingest_traces(files, db, threads=1).ok
    folder = tmp_path / "pq"
    assert runner.invoke(app, ["export", "--parquet", str(folder), "--db", str(db)]).exit_code == 0
    return folder


def _import(folder: Path, db: Path):
    return runner.invoke(app, ["import-parquet", str(folder), "--db", str(db)])


@pytest.mark.slow
def test_an_export_without_its_gpu_events_is_refused_and_nothing_imported(export: Path, tmp_path: Path) -> None:
    import shutil

    shutil.rmtree(export / "gpu_events")
    db = tmp_path / "w.duckdb"
    done = _import(export, db)
    assert done.exit_code == 1, done.output
    assert "damaged export: trace" in done.stderr and "reads 0 of its 2 GPU events (gpu_events/)" in done.stderr
    assert "2 more trace(s) fall short" in done.stderr and "nothing was imported" in done.stderr
    assert not db.exists()  # refused before a warehouse was made


def test_an_export_file_of_another_schema_is_refused(export: Path, tmp_path: Path) -> None:
    """One more file in gpu_events/ whose columns are not traceq's: its rows do not read as the trace's."""
    part = next((export / "gpu_events").rglob("*.parquet"))
    with duckdb.connect() as con:
        con.execute(f"copy (select 1 as something, 'x' as other) to '{part.parent / 'stray.parquet'}' (format parquet)")
        original = con.execute(f"select count(*) from read_parquet('{part}')").fetchone()[0]
    part.unlink()  # the trace's own rows gone, a stray file in their place
    done = _import(export, tmp_path / "w.duckdb")
    assert done.exit_code == 1 and f"reads 0 of its {original} GPU events" in done.stderr, done.output


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_truncated_or_empty_parquet_file_is_one_line(export: Path, tmp_path: Path, damage: str) -> None:
    part = next((export / "gpu_events").rglob("*.parquet"))
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
    done = _import(export, tmp_path / "w.duckdb")
    assert done.exit_code == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.output, done.output
    assert f"{export}: a Parquet file of it cannot be read" in done.stderr and "nothing was imported" in done.stderr


def test_a_whole_export_imports(export: Path, tmp_path: Path) -> None:
    done = _import(export, tmp_path / "w.duckdb")
    assert done.exit_code == 0 and "imported 3 trace(s)" in done.stdout, done.output


# ------------------------------------------------------------------------------------- one line, not a traceback


def test_tables_of_traceqs_names_with_other_columns_are_refused_untouched(tmp_path: Path) -> None:
    db = duckdb_file(tmp_path / "lookalike.duckdb", *LOOKALIKE)
    trace = one_step_trace().write(tmp_path / "job" / "rank0.json")
    before = fingerprint(db)
    for command in (["runs"], ["report", "--metric", "idle"], ["ingest", str(trace)]):
        done = runner.invoke(app, [*command, "--db", str(db)])
        assert done.exit_code == 1 and "Traceback" not in done.output, (command, done.output)
        assert "damaged warehouse or not traceq's (its schema is 2, but traces lacks trace_id, run, path" in done.stderr
    assert fingerprint(db) == before


def test_numbers_too_large_for_their_column_are_one_line_or_left_out(tmp_path: Path) -> None:
    """kernels --top 99999999999999999999 is refused by the option; a run.json rank of 1e30 and a power log
    wall_ns of 1e400 (infinity) are not integers a column holds: the trace still goes in."""
    from tests.tracegen import TraceBuilder

    db = tmp_path / "w.duckdb"
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100_000)
    t.kernel("gemm", 0, 50_000, launch_ns=0)
    folder = tmp_path / "job"
    t.write(folder / "rank0.trace.json")
    (folder / "rank0.run.json").write_text('{"traceq_run_metadata": 1, "run": "job", "rank": 1e30, "world_size": 1}')
    (folder / "rank0.power.jsonl").write_text(
        '{"kind": "header", "source": "nvml", "interval_ms": 100, "gpus": [0]}\n'
        '{"kind": "power", "wall_ns": 1e400, "gpu": 0, "power_w": 300.0}\n')
    done = runner.invoke(app, ["ingest", str(folder), "--db", str(db)])
    assert done.exit_code == 0 and "1 ingested" in done.stdout, done.output
    done = runner.invoke(app, ["kernels", "--db", str(db), "--top", "99999999999999999999"])
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert done.stderr == "error: --top 99999999999999999999: must be at most 10,000,000 (rows per group)\n"


def test_a_scheduler_address_that_is_none_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    trace = one_step_trace().write(tmp_path / "job" / "rank0.json")
    done = runner.invoke(app, ["ingest-cluster", str(trace), "--parquet", str(tmp_path / "pq"), "--scheduler", "not a url"])
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert done.stderr.startswith("error: --scheduler 'not a url': no Dask scheduler reached at this address")


# ------------------------------------------------------------------------------------- files that change while read


@pytest.mark.parametrize("files", [1, 3], ids=["one file", "a group of small files"])
def test_a_file_rewritten_while_it_is_read_fails_alone_and_nothing_of_it_is_stored(tmp_path: Path, files: int) -> None:
    """The file is rewritten (other content, same name) while the ingest reads it: it fails in one line,
    nothing of it is stored; the files beside it go in."""
    from tests.test_cross_rank import late_rank_run, write_run

    paths = write_run(tmp_path / "job", late_rank_run())[:files]
    target = paths[-1]
    rewritten = []

    def progress(event: str, info: dict) -> None:
        if event == "file_read" and info.get("path") == str(target) and not rewritten:  # read, not committed
            target.write_text(target.read_text().replace('"rank": ', '"rank":  ') + "\n")
            rewritten.append(True)

    db = tmp_path / "w.duckdb"
    summary = ingest_traces(paths, db, threads=1, progress=progress)
    assert rewritten, "the progress callback never saw the file being read"
    assert [f.status for f in summary.files] == ["ingested"] * (files - 1) + ["failed"]
    assert summary.files[-1].message == (f"{target}: the file changed while traceq read it (written, replaced or "
                                         "removed): nothing of it was stored; ingest it again once it is complete")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from traces").fetchone() == (files - 1,)
        assert con.execute("select count(*) from traces where path like ?", [f"%{target.name}"]).fetchone() == (0,)
    again = ingest_traces([target], db, threads=1)  # complete now: it goes in
    assert [f.status for f in again.files] == ["ingested"]


def test_force_replaces_the_earlier_trace_of_a_file_whose_content_changed(tmp_path: Path) -> None:
    """The README's promise: `ingest FILE --force` replaces the earlier trace of that file, also when the file
    was written again with other content (found by its path, not only by its content)."""
    from tests.test_cross_rank import late_rank_run, write_run

    [path] = write_run(tmp_path / "job", {0: late_rank_run()[0]}, world_size=3)
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    path.write_text(path.read_text().replace('"rank": ', '"rank":  '))  # other bytes, the same steps of rank 0
    done = runner.invoke(app, ["ingest", str(path), "--db", str(db), "--force"])
    assert done.exit_code == 0 and "1 ingested" in done.stdout, done.output
    assert f"{path}: ingested again; its earlier trace in run job is replaced" in done.stderr + done.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from traces").fetchone() == (1,)


def test_a_file_name_that_is_not_utf8_fails_alone_in_one_line(tmp_path: Path) -> None:
    import os

    folder = tmp_path / "job"
    good = one_step_trace().write(folder / "rank0.json")
    bad = os.path.join(os.fsencode(folder), b"rank1\xff.json")
    with open(bad, "wb") as f:
        f.write(good.read_bytes().replace(b'"rank": 0', b'"rank": 1'))
    done = runner.invoke(app, ["ingest", str(folder), "--db", str(tmp_path / "w.duckdb")])
    assert done.exit_code == 1 and "Traceback" not in done.output, done.output
    assert "rank1\\xff.json: the file's name is not UTF-8 text; rename it" in done.stderr
    assert "1 ingested, 0 skipped, 1 failed" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("native", [True, False], ids=["DuckDB's reader", "the decoder"])
def test_a_file_of_empty_events_is_not_read_to_its_end(tmp_path: Path, native: bool) -> None:
    """1.5 million `{}` events (6 KB of gzip): no event holds anything, the file fails in one line once a
    million are read, and nothing is stored (before: "ingested", with 0 events on the device)."""
    import gzip

    path = tmp_path / "empty.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"traceEvents": [' + b", ".join([b"{}"] * 1_500_000) + b"]}")
    db = tmp_path / "w.duckdb"
    summary = ingest_traces([path], db, threads=1, native=native)
    [result] = summary.files
    assert result.status == "failed", result
    assert "events are none that traceq stores (it stores complete events, " in result.message
    assert "with over 99% unusable it is no profiler trace; nothing was stored" in result.message
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from traces").fetchone() == (0,)


def test_export_into_a_directory_of_other_files_is_refused_and_touches_none(warehouse: Path, tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    done = runner.invoke(app, ["export", "--parquet", str(folder), "--db", str(warehouse)])
    assert done.exit_code == 1 and f"{folder}: holds files of its own (notes.txt)" in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


# ------------------------------------------------------------------------------------- found in review


def test_a_foreign_database_with_a_table_named_traces_is_not_migrated(tmp_path: Path) -> None:
    db = duckdb_file(tmp_path / "mine.duckdb", "create table traces (id int, span varchar)",
                     "insert into traces values (1, 'a')", "create table users (x int)")
    before = fingerprint(db)
    for command in (["migrate"], ["runs"]):
        done = runner.invoke(app, [*command, "--db", str(db)])
        assert done.exit_code == 1 and "not a traceq warehouse (a DuckDB database of other tables: traces, users)" in done.stderr
    assert fingerprint(db) == before


def test_a_second_writing_connection_in_one_process_still_opens(tmp_path: Path) -> None:
    """DuckDB refuses a read-only connection beside a writing one of the same process: the look at the file
    is then taken on the writing connection."""
    from traceq.store.warehouse import connect

    db = tmp_path / "w.duckdb"
    trace = one_step_trace().write(tmp_path / "job" / "rank0.json")
    with connect(db):
        assert ingest_traces([trace], db, threads=1).ok


def test_table_cells_show_rich_markup_as_typed(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    trace = one_step_trace().write(tmp_path / "job" / "rank0.json")
    assert runner.invoke(app, ["ingest", str(trace), "--db", str(db), "--name", "exp[lr=1e-3]"]).exit_code == 0
    done = runner.invoke(app, ["runs", "--db", str(db)])
    assert done.exit_code == 0 and "exp[lr=1e-3]" in done.stdout, done.output
    done = runner.invoke(app, ["sql", "select 'x[/]y' as a, '[bold]B' as b", "--db", str(db)])
    assert done.exit_code == 0 and "x[/]y" in done.stdout and "[bold]B" in done.stdout, done.output


def test_bidi_overrides_are_written_out() -> None:
    from traceq.terminal import visible

    assert visible("run\u202egnp.exe\u2066x\u2028") == "run\\u202egnp.exe\\u2066x\\u2028"


def test_export_overwrite_replaces_an_export_of_an_earlier_traceq(warehouse: Path, tmp_path: Path) -> None:
    """An export written before step_windows was renamed step_wall_times is an earlier export, not files of
    the user's own."""
    out = tmp_path / "pq"
    assert runner.invoke(app, ["export", "--parquet", str(out), "--db", str(warehouse)]).exit_code == 0
    (out / "step_wall_times").rename(out / "step_windows")
    done = runner.invoke(app, ["export", "--parquet", str(out), "--db", str(warehouse), "--overwrite"])
    assert done.exit_code == 0, done.output


def test_a_warehouse_whose_write_ahead_log_cannot_be_made_is_refused_for_writing_and_still_read(warehouse: Path) -> None:
    """DuckDB keeps its write-ahead log beside the file and finds out it cannot make it only when a
    transaction commits ("TransactionContext Error: Failed to commit": a traceback). Here a directory
    stands where the log goes (which also keeps DuckDB from reading it: one line); the next test takes
    the directory's permission away."""
    wal = warehouse.with_name(warehouse.name + ".wal")
    wal.mkdir()
    trace = one_step_trace().write(warehouse.parent / "more" / "rank1.json")
    before = fingerprint(warehouse)
    result = CliRunner().invoke(app, ["ingest", str(trace), "--db", str(warehouse)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: {warehouse}: cannot write its write-ahead log ({wal} is a directory; DuckDB keeps it beside the "
        "file); use a --db in a writable directory, or copy the warehouse to one"]
    assert fingerprint(warehouse) == before
    report = CliRunner().invoke(app, ["report", "--db", str(warehouse)])  # DuckDB replays the log to read
    assert report.exit_code == 1
    assert report.output.startswith(f"error: {warehouse}: cannot open the warehouse (")
    assert len(report.output.strip().splitlines()) == 1

def test_a_warehouse_in_a_directory_the_user_cannot_write_is_refused_for_writing_and_still_read() -> None:
    """The file is writable, its directory is not: no write-ahead log can be made. As root (whom
    permissions do not stop) the commands run as root without the capabilities that pass over them
    (setpriv drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH): still the owner of the checkout and its
    venv, so a clone under a folder only root may enter (/root, a mktemp -d) runs as well; as another
    user (nobody) the venv there could not even be read (Python exited 2)."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, needs setpriv (util-linux) to drop the capabilities that pass over permissions")
        as_user = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
                   "--inh-caps", "-dac_override,-dac_read_search"]
        tried = subprocess.run([*as_user, sys.executable, "-c", "import traceq"], capture_output=True, text=True)
        if tried.returncode != 0:  # e.g. a container without CAP_SETPCAP
            pytest.skip(f"as root, cannot run traceq without the capabilities that pass over permissions here: "
                        f"{(tried.stderr.strip().splitlines() or ['exit ' + str(tried.returncode)])[-1]}")
    with tempfile.TemporaryDirectory(prefix="traceq-nowal-") as name:
        top = Path(name)
        top.chmod(0o755)
        folder = top / "warehouse"
        warehouse = folder / "w.duckdb"
        folder.mkdir()
        assert ingest_traces([one_step_trace().write(top / "job" / "rank0.json")], warehouse, threads=1).ok
        trace = one_step_trace().write(top / "more" / "rank1.json")
        for path in (top / "job", top / "more", folder):
            path.chmod(0o755)
        warehouse.chmod(0o666)
        folder.chmod(0o555)
        traceq = str(Path(sys.executable).with_name("traceq"))
        env = {**os.environ, "HOME": str(top)}
        try:
            before = fingerprint(warehouse)
            ingest = subprocess.run([*as_user, traceq, "ingest", str(trace), "--db", str(warehouse)],
                                    capture_output=True, text=True, env=env, timeout=120)
            report = subprocess.run([*as_user, traceq, "report", "--db", str(warehouse), "--format", "csv"],
                                    capture_output=True, text=True, env=env, timeout=120)
            assert (ingest.returncode, ingest.stdout) == (1, "")
            assert ingest.stderr.splitlines() == [
                f"error: {warehouse}: cannot write its write-ahead log ({folder}: Permission denied; DuckDB keeps "
                "it beside the file); use a --db in a writable directory, or copy the warehouse to one"]
            assert fingerprint(warehouse) == before
            assert report.returncode == 0, report.stderr
            assert sorted(os.listdir(folder)) == [warehouse.name]
        finally:
            folder.chmod(0o755)
