"""Hostile input, round 4 (issue 51): the shapes the probe tried, each run as the real `traceq` command in a
process of its own and counted in the hostile suite's tally (tests/test_hostile.py's ``traceq`` and
``one_line_error``): one error line, no traceback, nothing foreign changed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tests.conftest import require_module, skip_or_fail
from tests.test_bad_input import small_trace
from tests.test_hostile import UNUSABLE_WORDS, no_loss, one_line_error, traceq


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own holding someone's DuckDB database (x.duckdb), and a working directory apart from it."""
    home = tmp_path / "home"
    home.mkdir()
    with duckdb.connect(str(home / "x.duckdb")) as con:
        con.execute("create table measurements (x int); insert into measurements values (42)")
    work = tmp_path / "work"
    work.mkdir()
    small_trace().write(work / "t" / "rank0.json")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return home


# ------------------------------------------------------------------ 1. the path checked is the path opened

TILDE_COMMANDS = {
    "ingest": ["ingest", "t/rank0.json", "-q"],
    "report": ["report"],
    "runs": ["runs"],
    "kernels": ["kernels"],
    "rules --add": ["rules", "--add", "rules.csv"],
    "runs set": ["runs", "set", "t", "--tp", "2"],
    "export --parquet": ["export", "--parquet", "pq"],
    "migrate": ["migrate"],
}


@pytest.mark.parametrize("command", list(TILDE_COMMANDS))
def test_db_under_a_tilde_is_the_file_in_home_and_a_foreign_one_there_is_left_byte_identical(
    command: str, home: Path
) -> None:
    Path("rules.csv").write_text("priority,pattern,class,category,collective\n5,^my_kernel,comm,custom,AllReduce\n")
    before = _digest(home / "x.duckdb")
    run = traceq(*TILDE_COMMANDS[command], "--db", "~/x.duckdb")
    # the message names the file DuckDB would have opened, not ./~/x.duckdb
    line = one_line_error(run, str(home / "x.duckdb"))
    assert "not a traceq warehouse" in line or "no warehouse here" in line, line
    no_loss(_digest(home / "x.duckdb") == before, "the foreign database in HOME changed")
    assert not Path("~").exists() and sorted(p.name for p in home.iterdir()) == ["x.duckdb"]


@pytest.mark.parametrize("value, needle", [
    (":memory:", "in-memory database"),
    (":memory:named", "in-memory database"),
    ("-", "'-'"),
    ("--help", "an option, not a file name"),
    ("-q", "an option, not a file name"),
    ("x.duckdb?access_mode=read_write", "settings"),
    ("~/x.duckdb?access_mode=read_write", "settings"),
])
@pytest.mark.parametrize("command", ["ingest", "report", "import-parquet"])
def test_db_values_that_name_no_file_of_their_own_are_refused_in_one_line(
    value: str, needle: str, command: str, home: Path
) -> None:
    before = _digest(home / "x.duckdb")
    args = {"ingest": ["ingest", "t/rank0.json"], "report": ["report"], "import-parquet": ["import-parquet", "t"]}[command]
    run = traceq(*args, f"--db={value}")
    one_line_error(run, "--db", needle)
    made = sorted(str(p.relative_to(Path.cwd())) for p in Path.cwd().rglob("*"))
    no_loss(made == ["t", "t/rank0.json"], f"{command} --db {value!r} wrote {made}")
    no_loss(_digest(home / "x.duckdb") == before, "the foreign database in HOME changed")


@pytest.mark.parametrize("option, value", [("--html", "-"), ("--html", "--help"), ("--html", ":memory:"),
                                           ("--html", "a.html?x=1")])
def test_output_paths_that_name_no_file_of_their_own_are_refused_in_one_line(option: str, value: str, home: Path) -> None:
    assert traceq("ingest", "t/rank0.json", "--db", "w.duckdb", "-q").code == 0
    run = traceq("report", "--db", "w.duckdb", f"{option}={value}")
    one_line_error(run, option)
    assert sorted(p.name for p in Path.cwd().iterdir()) == ["t", "w.duckdb"]


@pytest.mark.slow
def test_output_paths_under_a_tilde_are_written_in_home(home: Path) -> None:
    assert traceq("ingest", "t/rank0.json", "--db", "~/w.duckdb", "-q").code == 0
    assert (home / "w.duckdb").is_file() and not Path("~").exists()
    assert traceq("report", "--db", "~/w.duckdb", "--html", "~/r.html").code == 0
    assert traceq("export", "--parquet", "~/pq", "--db", "~/w.duckdb").code == 0
    assert traceq("export", "--perfetto", "~/w.pftrace", "--db", "~/w.duckdb").code == 0
    assert (home / "r.html").stat().st_size > 1000 and (home / "pq" / "traces").is_dir()
    assert (home / "w.pftrace").stat().st_size > 0
    assert not Path("~").exists()
    # and what was written there reads back, through the same expansion
    run = traceq("runs", "--db", "~/pq", "--format", "csv")
    assert run.code == 0 and run.out.splitlines()[1].startswith("t,"), run.out + run.err


# ------------------------------------------------------------------ 2. a Parquet directory is checked when read


@pytest.fixture(scope="module")
def clean_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of two traces (run a, ranks 0 and 1) with two GPU and three host events each."""
    d = tmp_path_factory.mktemp("export")
    small_trace(0).write(d / "a" / "rank0.json")
    small_trace(1).write(d / "a" / "rank1.json")
    assert traceq("ingest", d / "a", "--db", d / "w.duckdb", "-q").code == 0
    assert traceq("export", "--parquet", d / "pq", "--db", d / "w.duckdb").code == 0
    return d / "pq"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _link_elsewhere(path: Path) -> None:
    moved = path.parent.parent.parent.parent.parent / f"moved-{path.parent.name}.parquet"
    path.rename(moved)
    path.symlink_to(moved)


def _link_folder(path: Path) -> None:
    moved = path.parent / f"{path.name}-moved"
    path.rename(moved)
    path.symlink_to(moved)


GPU0 = Path("gpu_events/run=a/rank=0/data_0.parquet")
EXPORT_DAMAGE = {
    # name: (damage the copy, what the one line says)
    "gpu_events/ removed": (lambda pq: shutil.rmtree(pq / "gpu_events"), "0 of its 2 GPU events (gpu_events/), and 1 more trace(s) fall short (the gpu_events/ folder is missing)"),
    "host_events of rank 1 removed": (lambda pq: shutil.rmtree(pq / "host_events/run=a/rank=1"), "0 of its 3 host events (host_events/)"),
    "traces/run=a copied as run=z": (lambda pq: shutil.copytree(pq / "traces/run=a", pq / "traces/run=z"),
                                     "traces/run=a and traces/run=z"),
    "a gpu_events partition copied to rank 7": (
        lambda pq: shutil.copytree(pq / "gpu_events/run=a/rank=0", pq / "gpu_events/run=a/rank=7"),
        "gpu_events/run=a/rank=0 and gpu_events/run=a/rank=7"),
    "a gpu_events file copied beside itself": (lambda pq: shutil.copy(pq / GPU0, pq / GPU0.with_name("data_1.parquet")),
                                               "4 of its 2 GPU events (gpu_events/)"),
    "a truncated .parquet": (lambda pq: _truncate(pq / GPU0), "cannot be read (gpu_events/run=a/rank=0/data_0.parquet is not a whole Parquet file (100 bytes))"),
    "an empty .parquet": (lambda pq: (pq / GPU0).write_bytes(b""), "data_0.parquet is empty"),
    "a symlinked .parquet": (lambda pq: _link_elsewhere(pq / GPU0), "data_0.parquet is a symbolic link"),
    "a symlinked rank folder": (lambda pq: _link_folder(pq / "gpu_events/run=a/rank=1"), "gpu_events/run=a/rank=1 is a symbolic link"),
    "a symlinked table folder": (lambda pq: _link_folder(pq / "steps"), "steps is a symbolic link"),
    "a dangling symlinked .parquet": (lambda pq: (pq / GPU0.with_name("x.parquet")).symlink_to("/nonexistent/x.parquet"),
                                      "x.parquet is a symbolic link"),
}


@pytest.mark.parametrize("command", ["report", "kernels", "runs", "import-parquet"])
@pytest.mark.parametrize("damage", list(EXPORT_DAMAGE))
def test_a_damaged_export_is_refused_in_one_line_by_every_reader(
    damage: str, command: str, clean_export: Path, tmp_path: Path
) -> None:
    pq = tmp_path / "pq"
    shutil.copytree(clean_export, pq, symlinks=True)
    make, needle = EXPORT_DAMAGE[damage]
    make(pq)
    new = tmp_path / "new.duckdb"
    run = traceq(*(["import-parquet", pq, "--db", new] if command == "import-parquet" else [command, "--db", pq]))
    one_line_error(run, f"{pq}: ", needle, "nothing was imported" if command == "import-parquet" else "nothing was read")
    no_loss(not new.exists(), f"a refused import left {new}")


def test_the_export_undamaged_reads_as_its_warehouse(clean_export: Path) -> None:
    """The check passes what export wrote: the report on the directory equals the report on the warehouse."""
    warehouse = clean_export.parent / "w.duckdb"
    for command in (["report", "--format", "csv"], ["kernels", "--format", "csv"]):
        on_dir, on_db = traceq(*command, "--db", clean_export), traceq(*command, "--db", warehouse)
        assert on_dir.code == 0 and on_dir.out == on_db.out and on_dir.out.count("\n") >= 3, on_dir.err


# ------------------------------------------------------------------ 5. bounded: sql results and user rules


@pytest.fixture(scope="module")
def small_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("small")
    small_trace().write(d / "t" / "rank0.json")
    assert traceq("ingest", d / "t", "--db", d / "w.duckdb", "-q").code == 0
    return d / "w.duckdb"


def test_sql_with_one_value_past_the_byte_bound_fails_in_one_line_in_bounded_memory(small_warehouse: Path) -> None:
    # 200 MB in one value: before, the whole of it went to the table (300 MB took 212 s and 5.4 GB)
    run = traceq("sql", "select repeat('x', 200000000) as s", "--db", small_warehouse, timeout=60)
    one_line_error(run, "first row alone passes 64 MB", "--max-mb")
    # DuckDB makes the value (2x its size, measured alone); traceq holds one batch of it, not its text too
    assert run.maxrss_mb < 1200, f"{run.maxrss_mb:.0f} MB"


def test_sql_rows_past_the_byte_bound_are_cut_with_a_note(small_warehouse: Path) -> None:
    run = traceq("sql", "select i, repeat('x', 1000) as s from range(20000) as t(i)", "--db", small_warehouse,
                 "--max-mb", "2", "--format", "csv")
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    shown = len(lines) - 1
    # each row holds an int64 (8 bytes) and 1,000 bytes of text with its 4-byte offset: 1,012 bytes in Arrow;
    # the rows kept fit 2 MB, and fall short of it by less than one batch (2,048 rows)
    assert shown * 1012 <= 2_000_000 < (shown + 2048) * 1012, shown
    assert lines[1:] == [f"{i},{'x' * 1000}" for i in range(shown)]
    assert f"the query's rows pass 2 MB: the first {shown:,} are shown (--max-mb)" in run.err


@pytest.mark.slow
def test_rules_add_past_the_stated_number_is_refused_at_once(small_warehouse: Path, tmp_path: Path) -> None:
    from traceq.store.schema import MAX_USER_RULES

    db = tmp_path / "w.duckdb"
    shutil.copy(small_warehouse, db)
    many = tmp_path / "many.csv"
    many.write_text("priority,pattern,class,category,collective\n"
                    + "".join(f"5,^k{i}_,comm,custom,AllReduce\n" for i in range(1_200_000)))
    run = traceq("rules", "--add", many, "--db", db, timeout=30)
    one_line_error(run, str(many), f"more than the {MAX_USER_RULES:,} user rules")
    assert run.maxrss_mb < 600, f"{run.maxrss_mb:.0f} MB"
    # up to the bound they are taken; one more, with those held, is not
    full = tmp_path / "full.csv"
    full.write_text("priority,pattern,class,category,collective\n"
                    + "".join(f"5,^k{i}_,comm,custom,AllReduce\n" for i in range(MAX_USER_RULES)))
    assert traceq("rules", "--add", full, "--db", db).code == 0
    one_more = tmp_path / "one.csv"
    one_more.write_text("priority,pattern,class,category,collective\n5,^z_,comm,custom,AllReduce\n")
    one_line_error(traceq("rules", "--add", one_more, "--db", db), f"holds {MAX_USER_RULES:,} user rules already")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from kernel_rules where source = 'user'").fetchone()[0] == MAX_USER_RULES
    # the listing: a count and the first screen as a table; every rule as CSV
    listed = traceq("rules", "--db", db)
    with duckdb.connect(str(db), read_only=True) as con:
        total = con.execute("select count(*) from kernel_rules").fetchone()[0]
    assert listed.code == 0 and f"{total:,} rules ({total - MAX_USER_RULES:,} builtin, {MAX_USER_RULES:,} yours)" in listed.err
    assert "the first 40" in listed.err and listed.out.count("\n") < 60
    every = traceq("rules", "--db", db, "--format", "csv")
    assert every.code == 0 and len(every.out.splitlines()) == total + 1
    help_text = traceq("rules", "--help").out
    assert f"at most {MAX_USER_RULES:,} rules of your own" in " ".join(help_text.split())


# ------------------------------------------------------------------ 6. nothing left behind


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("writer", ["export --perfetto", "report --html"])
def test_a_killed_writers_temporary_file_is_removed_by_the_next_command_writing_there(
    writer: str, small_warehouse: Path, tmp_path: Path
) -> None:
    # what atomic_file leaves when its process is killed mid-write: .<name>.<pid>.<8 hex>.tmp
    dead = tmp_path / f".killed.pftrace.{_dead_pid()}.0123abcd.tmp"
    alive = tmp_path / f".writing.html.{os.getpid()}.89abcdef.tmp"  # a live writer's: kept
    mine = tmp_path / ".notes.123.tmp"  # not a name traceq makes: kept
    for f in (dead, alive, mine):
        f.write_bytes(b"x" * 1000)
    out = tmp_path / ("t.pftrace" if writer == "export --perfetto" else "t.html")
    args = (["export", "--perfetto", out, "--db", small_warehouse] if writer == "export --perfetto"
            else ["report", "--db", small_warehouse, "--html", out])
    run = traceq(*args)
    assert run.code == 0, run.err
    assert out.is_file() and not dead.exists() and alive.exists() and mine.exists()


def test_a_refused_first_ingest_leaves_no_warehouse_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    good = small_trace().write(tmp_path / "t" / "rank0.json")
    new = tmp_path / "new.duckdb"
    one_line_error(traceq("ingest", bad, "--db", new), str(bad), "not a Kineto trace")
    no_loss(not new.exists() and not new.with_name("new.duckdb.wal").exists(), "a refused first ingest left its file")
    one_line_error(traceq("import-parquet", tmp_path / "t", "--db", new), "not a traceq Parquet directory")
    assert not new.exists()
    # a file that took one trace stays, and so does a warehouse that was there before the refusal
    assert traceq("ingest", bad, good, "--db", new).code == 1 and new.is_file()
    assert traceq("runs", "--db", new, "--format", "csv").out.splitlines()[1].startswith("t,")
    assert traceq("ingest", bad, "--db", new).code == 1 and new.is_file()
    assert traceq("runs", "--db", new, "--format", "csv").out.splitlines()[1].startswith("t,")


# ------------------------------------------------------------------ 7. smaller


def test_sql_csv_gives_list_struct_and_map_columns_as_json_text(small_warehouse: Path) -> None:
    import csv
    import io
    import json

    run = traceq("sql", "select [1, 2] as l, {'a': 1, 'b': 'x,y'} as s, map([7], ['q']) as m, null::int[] as n, "
                 "[[1], [2, 3]] as ll, 'plain' as t", "--db", small_warehouse, "--format", "csv")
    assert run.code == 0 and "Traceback" not in run.err, run.err
    header, row = list(csv.reader(io.StringIO(run.out)))
    assert header == ["l", "s", "m", "n", "ll", "t"]
    assert [json.loads(v) for v in row[:3]] == [[1, 2], {"a": 1, "b": "x,y"}, {"7": "q"}]
    assert row[3:] == ["", "[[1], [2, 3]]", "plain"]


def test_with_no_trace_processor_the_first_line_says_where_to_get_one(
    small_warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("perfetto", reason="the Perfetto engine needs the perfetto package (traceq[perfetto])")
    monkeypatch.delenv("TRACEQ_TRACE_PROCESSOR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no trace processor the package downloaded before
    for proxy in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")  # its download fails at once, with or without a network
    trace = small_trace().write(tmp_path / "rank0.json")
    run = traceq("sql", "--engine", "perfetto", trace, "select 1 as x")
    line = one_line_error(run, "TRACEQ_TRACE_PROCESSOR", "--trace-processor", "could not download")
    assert run.err.splitlines()[0] == line and run.out == "", (run.out, run.err)


@pytest.fixture
def noexec_tmpdir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "noexec"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,noexec", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        skip_or_fail(f"cannot mount a noexec tmpfs here ({done.stderr.decode().strip()}); CI runs as root")
    yield path
    subprocess.run(["umount", str(path)], check=True)


@pytest.mark.slow
def test_a_noexec_tmpdir_is_named_with_what_to_do(noexec_tmpdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_perfetto_engine import BINARY

    pytest.importorskip("perfetto", reason="the Perfetto engine needs the perfetto package (traceq[perfetto])")
    if not BINARY.is_file():
        skip_or_fail(f"{BINARY} is absent")
    trace = small_trace().write(tmp_path / "rank0.json")
    monkeypatch.setenv("TMPDIR", str(noexec_tmpdir))
    run = traceq("sql", "--engine", "perfetto", "--trace-processor", BINARY, trace, "select 1 as x")
    one_line_error(run, f"TMPDIR {noexec_tmpdir}", "noexec", "set TMPDIR")
    # and with a TMPDIR that may hold programs, the same command answers
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    run = traceq("sql", "--engine", "perfetto", "--trace-processor", BINARY, trace, "select 1 as x", "--format", "csv")
    assert run.code == 0 and run.out.splitlines() == ["x", "1"], run.err


def test_the_perfetto_load_timeout_follows_the_traces_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceq.perfetto import processor

    sizes = {"empty.json": 0, "ten.json": 10_000_000, "two.json.gz": 2_000_000, "big.json": 1_000_000_000}
    for name, size in sizes.items():
        with open(tmp_path / name, "wb") as f:
            f.truncate(size)  # sparse: the size is what counts
    # 60 s to start, 1 s a MB of JSON, a gzip file at 15x its size
    assert {n: processor.load_timeout_s(tmp_path / n) for n in sizes} == {
        "empty.json": 60, "ten.json": 70, "two.json.gz": 90, "big.json": 1060}
    perfetto = pytest.importorskip("perfetto.trace_processor", reason="the perfetto package (traceq[perfetto])")
    given = {}

    class Stop(Exception):
        pass

    def config(**kwargs: object) -> None:
        given.update(kwargs)
        raise Stop

    monkeypatch.setattr(perfetto, "TraceProcessorConfig", config)
    with pytest.raises(Stop), processor.open_trace(tmp_path / "big.json", Path("/bin/true"), 0):
        pass
    assert given["load_timeout"] == 1060


SIDE_RECORDS = [
    {"kind": "header", "traceq_power_log": 1, "source": "nvml", "interval_ms": 100, "gpus": [{"gpu": 0}]},
    {"kind": "power", "wall_ns": 1000, "step": 1, "gpu": 0, "power_w": 300.5},  # good
    {"kind": "power", "wall_ns": 2000, "step": 1, "gpu": 0, "power_w": "hot"},  # power_w not a number
    {"kind": "power", "step": 1, "gpu": 0, "power_w": 310},  # no wall_ns: not stored
    {"kind": "power", "wall_ns": 4000, "step": 1, "gpu": "zero", "power_w": 310},  # no gpu: not stored
    {"kind": "energy", "wall_ns": 5000, "step": 1, "gpu": 0, "energy_mj": "lots"},  # energy not a number
    {"kind": "energy", "wall_ns": 6000, "step": 2, "gpu": 0, "energy_mj": 100},  # good
]


def _side_files_with_bad_values(folder: Path) -> Path:
    """small_trace with a run.json of 3 bad values (world_size, tokens_per_step, tp) and a power log of 4 bad
    records (SIDE_RECORDS) beside it; returns the trace."""
    import json

    trace = small_trace().write(folder / "rank0.json")
    (folder / "rank0.run.json").write_text(json.dumps({
        "run": "side", "rank": 0, "world_size": "eight", "tokens_per_step": 4096.5, "tp": True,
        "peak_tflops": 989.5, "seq_len": 2048, "model": "m"}))  # 3 bad: world_size, tokens_per_step, tp
    (folder / "rank0.power.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SIDE_RECORDS))
    return trace


@pytest.mark.slow
def test_side_file_values_left_out_are_named_by_check(tmp_path: Path) -> None:
    """A collector's run.json and power log with values traceq cannot use: each file named, with its fields and
    the records left out, counted by hand below."""
    import csv
    import io
    import json

    folder = tmp_path / "side"
    _side_files_with_bad_values(folder)
    records = SIDE_RECORDS
    db = tmp_path / "w.duckdb"
    assert traceq("ingest", folder, "--db", db, "-q").code == 0
    run = traceq("check", "--db", db, "--format", "csv")
    assert run.code == 1, run.err  # warnings
    found = {Path(r["path"]).name: r for r in csv.DictReader(io.StringIO(run.out)) if r["check"] == "side_values"}
    assert set(found) == {"rank0.run.json", "rank0.power.jsonl"}
    meta, power = found["rank0.run.json"], found["rank0.power.jsonl"]
    assert (meta["severity"], meta["count"], meta["rank"]) == ("warning", "3", "0")
    assert ('tokens_per_step=4096.5 is not an integer, tp=true is not an integer, world_size="eight" is not an '
            'integer, left out') in meta["detail"]
    assert power["count"] == "4"
    assert ("2 records without a gpu or wall_ns (not stored), 1 whose power_w is not a number, "
            "1 whose energy_mj is not an integer") in power["detail"]
    # a clean pair of side files gives no such finding
    (folder / "rank0.run.json").write_text(json.dumps({"run": "side", "rank": 0, "world_size": 1}))
    (folder / "rank0.power.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    clean = tmp_path / "clean.duckdb"
    assert traceq("ingest", folder, "--db", clean, "-q").code == 0
    assert "side_values" not in traceq("check", "--db", clean, "--format", "csv").out


def test_ingest_says_which_side_file_values_it_left_out_one_note_per_file(tmp_path: Path) -> None:
    """The values `traceq check` finds (above) are named at ingest time: one note per side file, each field with
    its value and why, the power log's records counted by hand (SIDE_RECORDS); a clean pair gives no note."""
    import json

    folder = tmp_path / "side"
    trace = _side_files_with_bad_values(folder)
    run = traceq("ingest", trace, "--db", tmp_path / "w.duckdb", "-q")
    assert run.code == 0, run.err
    notes = [line for line in run.err.splitlines() if line.startswith("note: ")]
    meta = [n for n in notes if "rank0.run.json" in n]
    power = [n for n in notes if "rank0.power.jsonl" in n]
    assert len(meta) == 1 and len(power) == 1, notes
    assert meta[0].startswith(f"note: {folder / 'rank0.run.json'}: ")
    assert ('tokens_per_step=4096.5 is not an integer, tp=true is not an integer, world_size="eight" is not an '
            "integer, left out") in meta[0]
    assert "peak_tflops" not in meta[0] and "seq_len" not in meta[0]  # a float where a float goes; an integer
    assert power[0].startswith(f"note: {folder / 'rank0.power.jsonl'}: ")
    assert ("2 records without a gpu or wall_ns (not stored), 1 whose power_w is not a number, 1 whose energy_mj "
            "is not an integer, left out of the power figures") in power[0]

    (folder / "rank0.run.json").write_text(json.dumps({"run": "side", "rank": 0, "world_size": 1, "peak_tflops": 989}))
    (folder / "rank0.power.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SIDE_RECORDS[:2]))
    clean = traceq("ingest", trace, "--db", tmp_path / "clean.duckdb", "-q")
    assert clean.code == 0 and "note:" not in clean.err, clean.err


def test_a_cluster_task_notes_the_side_file_values_it_left_out(tmp_path: Path) -> None:
    """The task ingest-cluster runs on a worker, run here in-process: its result carries the same notes."""
    from traceq.ingest.cluster import ingest_file_to_parquet

    folder = tmp_path / "side"
    trace = _side_files_with_bad_values(folder)
    result, digest = ingest_file_to_parquet(str(trace), 7, str(tmp_path / "pq"))
    assert result.status == "ingested" and digest is not None, result.message
    side = [n for n in result.notes if "rank0.run.json" in n or "rank0.power.jsonl" in n]
    assert [n.split(": ", 1)[0] for n in side] == [str(folder / "rank0.power.jsonl"), str(folder / "rank0.run.json")]
    assert 'world_size="eight" is not an integer' in side[1] and "1 whose power_w is not a number" in side[0]


# ------------------------------------------------------------------ ingest-cluster against a scheduler no worker joins


@pytest.fixture(scope="module")
def lone_scheduler() -> Iterator[str]:
    """A real Dask scheduler on loopback that no worker ever joins."""
    require_module("distributed", 'Dask is optional: pip install "traceq[dask]" to run the cluster tests')
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=None) as cluster:
        yield cluster.scheduler_address


@pytest.mark.slow
def test_ingest_cluster_with_no_worker_gives_up_after_the_bound_naming_the_scheduler(
    lone_scheduler: str, tmp_path: Path
) -> None:
    import time

    small_trace().write(tmp_path / "t" / "rank0.json")
    started = time.monotonic()
    run = traceq("ingest-cluster", tmp_path / "t", "--parquet", tmp_path / "pq", "--scheduler", lone_scheduler,
                 "--worker-wait", "2", timeout=45)
    took = time.monotonic() - started
    one_line_error(run, f"no worker joined scheduler {lone_scheduler} in 2 s",
                   f"start dask workers (dask worker {lone_scheduler}) or use traceq ingest")
    assert 2 <= took < 40, took  # the bound, plus starting Python and reaching the scheduler
    assert not (tmp_path / "pq").exists()  # given up before any output was made


@pytest.mark.slow
def test_ingest_cluster_worker_wait_from_the_environment_and_refused_when_not_seconds(
    lone_scheduler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_trace().write(tmp_path / "t" / "rank0.json")
    monkeypatch.setenv("TRACEQ_WORKER_WAIT_S", "1.5")
    run = traceq("ingest-cluster", tmp_path / "t", "--parquet", tmp_path / "pq", "--scheduler", lone_scheduler,
                 timeout=45)
    one_line_error(run, f"no worker joined scheduler {lone_scheduler} in 1.5 s")
    monkeypatch.setenv("TRACEQ_WORKER_WAIT_S", "soon")
    one_line_error(traceq("ingest-cluster", tmp_path / "t", "--parquet", tmp_path / "pq", "--scheduler", lone_scheduler),
                   "TRACEQ_WORKER_WAIT_S='soon'", "seconds")
    help_text = traceq("ingest-cluster", "--help").out
    assert "--worker-wait" in help_text and "60" in help_text


# ------------------------------------------------------------------ a lone surrogate escape in a kernel name


def _with_lone_surrogate(folder: Path) -> Path:
    """small_trace with its first kernel named ``gemm_kernel\\ud800`` (a lone high surrogate escape, as JSON text)."""
    path = small_trace().write(folder / "rank0.json")
    text = path.read_text()
    assert text.count('"gemm_kernel"') >= 1
    path.write_text(text.replace('"gemm_kernel"', '"gemm_kernel\\ud800"', 1))
    return path


def test_lone_surrogate_escapes_are_replaced_in_place_by_ufffd() -> None:
    """Every parser of the ingest refuses a lone surrogate escape (msgspec, DuckDB's JSON reader); the replaced
    bytes keep their length and read as U+FFFD in both, a pair and an escaped backslash left as they were."""
    import msgspec

    from traceq.ingest.jsonfault import replace_lone_surrogates

    data = rb'[{"name": "k\ud800", "a": "\\ud800", "p": "\ud83d\ude00", "l": "\udc00x", "q": "\uDBFF\u0041"}]'
    for value in (data, rb'["k\ud800"]'):
        with pytest.raises(msgspec.DecodeError):
            msgspec.json.decode(value)
        with pytest.raises(duckdb.InvalidInputException, match="surrogate"):
            duckdb.sql("select json(?)", params=[value.decode()]).fetchall()
    fixed, count = replace_lone_surrogates(data)
    assert count == 3 and len(fixed) == len(data)
    assert msgspec.json.decode(fixed) == [
        {"name": "k\ufffd", "a": "\\ud800", "p": "\U0001f600", "l": "\ufffdx", "q": "\ufffdA"}]
    assert duckdb.sql("select json_extract_string(json(?), '$[0].name')", params=[fixed.decode()]).fetchall() == [
        ("k\ufffd",)]
    clean = rb'[{"name": "gemm", "p": "\ud83d\ude00", "a": "\\udc00"}]'
    assert replace_lone_surrogates(clean) == (clean, 0)
    # a buffer read from a stream may end inside a pair: its high half is left for the next read to tell
    for cut in (b'"k\\ud83d', b'"k\\ud83d\\', b'"k\\ud83d\\ude', b'"k\\ud83d\\ude0'):
        assert replace_lone_surrogates(cut) == (cut, 0)
    for lone in (rb'"k\ud83d\u00', rb'"k\ud83dx', rb'"k\udc00', rb'"k\ud83d\\'):  # no low half can follow
        fixed, count = replace_lone_surrogates(lone)
        assert count == 1 and fixed == lone.replace(lone[2:8], rb"\ufffd"), fixed


def _replaced_by_pairing_every_escape(data: bytes) -> tuple[bytes, int]:
    """A reference apart from jsonfault's: every escape of ``data`` paired from the left by one regex (a pair,
    a lone surrogate, any other escape), a lone one replaced unless it is a high one that only the end of the
    data (with at most the beginning of a low one) follows."""
    import re

    escapes = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
                         rb"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|\\.", re.DOTALL)
    low_begun = re.compile(rb"(?:\\(?:u(?:[dD](?:[c-fC-F][0-9a-fA-F]{0,2})?)?)?)?\Z")
    count = 0

    def one(match: re.Match[bytes]) -> bytes:
        nonlocal count
        lone = match.group(1)
        if lone is None or (lone[3:4] in b"89abAB" and low_begun.match(data, match.end())):
            return match.group(0)
        count += 1
        return rb"\ufffd"

    return escapes.sub(one, data), count


def test_lone_surrogate_replacement_agrees_with_pairing_every_escape_from_the_left() -> None:
    """Random runs of escapes, backslashes and surrogate halves (cut anywhere): jsonfault looks only at the
    surrogate escapes, the reference pairs every escape from the left; they agree on each."""
    import random

    from traceq.ingest.jsonfault import replace_lone_surrogates

    tokens = [rb"\ud800", rb"\uDBFF", rb"\udc00", rb"\uDfFf", rb"\ud83d\ude00", "\\", "\\\\", rb"\"", "u", "d800",
              "x", '"', rb"\u00e9", rb"\ud8"]
    rng = random.Random(51)
    replaced = 0
    for _ in range(4000):
        data = b"".join(t if isinstance(t, bytes) else t.encode() for t in rng.choices(tokens, k=rng.randint(0, 12)))
        data = data[:rng.randint(0, len(data))]
        got = replace_lone_surrogates(data)
        assert got == _replaced_by_pairing_every_escape(data), data
        assert len(got[0]) == len(data)
        replaced += got[1]
    assert replaced > 1000  # the cases held lone escapes, not only pairs and text


def test_a_lone_surrogate_escape_in_a_kernel_name_is_ingested_as_ufffd_with_a_note(tmp_path: Path) -> None:
    path = _with_lone_surrogate(tmp_path / "t")
    db = tmp_path / "w.duckdb"
    run = traceq("ingest", path, "--db", db, "-q")
    assert run.code == 0, run.err
    assert f"{path}: 1 lone surrogate escape (such as \\ud800) in its strings replaced by U+FFFD" in run.err
    with duckdb.connect(str(db), read_only=True) as con:
        names = {n for (n,) in con.execute("select name from names").fetchall()}
    assert "gemm_kernel\ufffd" in names and "gemm_kernel" not in names


@pytest.mark.parametrize("native", [True, False], ids=["DuckDB's reader first", "the decoder"])
def test_lone_surrogate_escapes_in_every_chunk_of_a_file_are_each_replaced_and_counted(
    tmp_path: Path, native: bool
) -> None:
    """A file cut into many chunks, every 7th kernel's name ending in a lone escape (high or low, upper or
    lower case) and one in a pair: each lone one is stored as U+FFFD, the note counts the escapes written
    (not the chunks, nor a second pass), the pair is the character it encodes."""
    from tests.tracegen import TraceBuilder
    from traceq.ingest import ingest_traces

    b = TraceBuilder(rank=0)
    b.step(1, 0, 10_000_000)
    escapes = [rb"\ud800", rb"\uDBFF", rb"\udc00", rb"\uDFFF"]
    lone = {i: escapes[i % 4] for i in range(0, 3000, 7)}
    for i in range(3000):
        b.kernel(f"kernel{i}" + ("LONE" if i in lone else "PAIR" if i == 1500 else ""), 1000 * i, 1000 * i + 500,
                 launch_ns=1000 * i)
    path = b.write(tmp_path / "t" / "rank0.json")
    data = path.read_bytes()
    for i, escape in lone.items():
        data = data.replace(f'"kernel{i}LONE"'.encode(), b'"kernel%d%s"' % (i, escape))
    path.write_bytes(data.replace(b"PAIR", rb"\ud83d\ude00"))
    assert len(data) > 10 * 32 << 10  # ten chunks or more
    summary = ingest_traces([path], tmp_path / "w.duckdb", chunk_bytes=32 << 10, native=native, threads=1)
    [result] = summary.files
    assert result.status == "ingested", result.message
    assert result.notes == [f"{path}: {len(lone):,} lone surrogate escapes (such as \\ud800) in its strings "
                            "replaced by U+FFFD"]
    with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as con:
        names = {n for (n,) in con.execute("select name from names").fetchall()}
    kernels = {n for n in names if n.startswith("kernel")}
    assert kernels == {f"kernel{i}" + ("\ufffd" if i in lone else "\U0001f600" if i == 1500 else "")
                       for i in range(3000)}


# ------------------------------------------------------------------ the bomb guard's words


@pytest.mark.parametrize("shape", ["metadata", "flow", "instant", "empty"])
def test_the_bomb_guard_says_what_is_not_stored_and_nothing_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """Metadata, flow and instant events have a phase, a name, a time or a category: the guard's line says
    none of them is a complete event traceq stores (it said "no phase, name, time or category")."""
    from traceq.ingest import ingest_traces, native

    monkeypatch.setattr(native, "UNUSABLE_EVENTS", 1000)  # the guard's bound, so that a small file meets it
    event = {
        "metadata": b'{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}}',
        "flow": b'{"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 1, "cat": "ac2g", "name": "flow"}',
        "instant": b'{"ph": "i", "s": "t", "pid": 1, "tid": 1, "ts": 1, "cat": "cpu_op", "name": "mark"}',
        "empty": b"{}",
    }[shape]
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [' + b", ".join([event] * 1500) + b"]}")
    [result] = ingest_traces([path], tmp_path / "w.duckdb", threads=1).files
    assert result.status == "failed"
    assert result.message == f"{path}: 1,500 of its first 1,500 {UNUSABLE_WORDS}"


def test_a_lone_surrogate_escape_before_the_event_array_is_read_as_ufffd_with_a_note(tmp_path: Path) -> None:
    """Top-level fields before the events (traceName, deviceProperties) with lone escapes: read as U+FFFD, one
    note counting them with those of the events (before: "no traceEvents array", the file failed)."""
    path = tmp_path / "rank0.json"
    path.write_bytes(
        b'{"schemaVersion": 1, "traceName": "run\\ud800x", "deviceProperties": [{"id": 0, "name": "H\\uDC00"}], '
        b'"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\\ud83d", "pid": 0, "tid": 7, "ts": 1, "dur": 1, '
        b'"args": {"device": 0, "stream": 7, "correlation": 1}}]}')
    db = tmp_path / "w.duckdb"
    run = traceq("ingest", path, "--db", db, "-q")
    assert run.code == 0, run.err
    assert f"{path}: 3 lone surrogate escapes (such as \\ud800) in its strings replaced by U+FFFD" in run.err
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select trace_name, devices->0->>'name' from traces").fetchall() == [("run\ufffdx", "H\ufffd")]
        assert con.execute("select name from names").fetchall() == [("k\ufffd",)]


def test_a_gpu_trace_whose_first_million_events_are_cpu_operators_is_no_bomb(tmp_path: Path) -> None:
    """deviceProperties, then 1.2M plain CPU operators (left out of a GPU trace, not dropped), then kernels:
    ingested with every count right (the guard refused it: nothing stored among its first 1M events)."""
    from traceq.ingest import ingest_traces

    ops, kernels = 1_200_000, 1000
    path = tmp_path / "rank0.json"
    with open(path, "wb") as f:
        f.write(b'{"deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": [')
        for start in range(0, ops, 100_000):
            f.write(b"".join(b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": %d, '
                             b'"dur": 1}, ' % i for i in range(start, start + 100_000)))
        f.write(b", ".join(b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": %d, "dur": 1, '
                           b'"args": {"device": 0, "stream": 7, "correlation": %d}}' % (ops + i, i) for i in range(kernels)))
        f.write(b"]}")
    [result] = ingest_traces([path], tmp_path / "w.duckdb").files
    assert result.status == "ingested", result.message
    with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as con:
        assert con.execute("select n_events, n_gpu_events, n_host_events, n_dropped from traces").fetchall() == [
            (ops + kernels, kernels, 0, 0)]
        assert con.execute("select count(*) from gpu_events").fetchall() == [(kernels,)]
