"""Hostile and unlucky input: every case runs the real `traceq` command in a process of its own,
under a time limit, and must end with one line that names the input (`error: ...`, or `failed ...`
for one file of an ingest), never a traceback, a hang or lost data. Real FIFOs, real SIGKILLs, a
real small tmpfs (CI runs as root), a real unprivileged user for permissions.

The session prints the tally (tests/conftest.py): hostile inputs tried, one-line errors, tracebacks,
hangs, losses.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from tests.conftest import skip_or_fail
from tests.test_bad_input import small_trace
from tests.test_warehouse_files import LOOKALIKE, duckdb_file
from traceq.ingest.reader import MAX_SCAN_BYTES
from traceq.store.schema import MAX_USER_RULES

TRACEQ = Path(sys.executable).with_name("traceq")
# tried = one_line (a clear error) + noted (passed over with a note) + kept whole (a kill or a race
# after which the data is whole); traceback, hang and loss must stay 0
TALLY: Counter[str] = Counter()


@dataclass
class Run:
    code: int
    out: str
    err: str
    maxrss_mb: float

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith(("error:", "failed "))]


def traceq(*args: str | Path, timeout: float = 60, unprivileged: bool = False) -> Run:
    """`traceq ARGS` in a new process, with its peak RSS (sampled); a run past ``timeout`` is a hang (killed,
    counted, failed). ``unprivileged``: root without the capabilities that skip permission checks."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        prefix = [*NO_DAC] if unprivileged else []
        proc = subprocess.Popen([*prefix, str(TRACEQ), *map(str, args)], stdout=out, stderr=err, text=True,
                                env={**os.environ, "COLUMNS": "200"})
        deadline = time.monotonic() + timeout
        peak_kb = 0
        while True:
            peak_kb = max(peak_kb, _high_water_kb(proc.pid))
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                TALLY["tried"] += 1
                TALLY["hang"] += 1
                pytest.fail(f"traceq {' '.join(map(str, args))} still ran after {timeout} s")
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Run(proc.returncode, out.read(), err.read(), peak_kb / 1024)


def _high_water_kb(pid: int) -> int:
    """The peak RSS of ``pid`` since its exec (VmHWM: wait4's ru_maxrss would count the pytest
    process it was forked from)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def one_line_error(run: Run, *needles: str) -> str:
    """Assert (and count) that ``run`` failed with one error line holding each of ``needles``."""
    TALLY["tried"] += 1
    if "Traceback" in run.err:
        TALLY["traceback"] += 1
        pytest.fail(f"a traceback instead of one line:\n{run.err[-3000:]}")
    lines = run.error_lines
    assert run.code != 0, (run.out, run.err)
    assert len(lines) == 1, run.err
    missing = [n for n in needles if n not in lines[0]]
    assert not missing, f"{missing} not in {lines[0]!r}"
    TALLY["one_line"] += 1
    return lines[0]


def no_loss(condition: bool, what: str) -> None:
    """Count a loss (and fail) when ``condition`` does not hold."""
    if not condition:
        TALLY["loss"] += 1
    assert condition, what


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_trace().write(tmp_path_factory.mktemp("trace") / "rank0.json")


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory, trace: Path) -> Path:
    db = tmp_path_factory.mktemp("wh") / "w.duckdb"
    assert traceq("ingest", trace, "--db", db, "--name", "trace", "-q").code == 0
    return db


@pytest.fixture
def db(warehouse: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "w.duckdb"
    shutil.copy(warehouse, copy)
    return copy


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory, warehouse: Path) -> Path:
    out = tmp_path_factory.mktemp("pq") / "export"
    assert traceq("export", "--parquet", out, "--db", warehouse).code == 0
    return out


def user_rules(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("select count(*) from kernel_rules where source = 'user'").fetchone()[0]


def rows(db: Path, table: str) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(f"select count(*) from {table}").fetchone()[0]


RULES_HEADER = "priority,pattern,class,category,collective\n"


# ------------------------------------------------------------------ 1. --db that is not a warehouse


def _not_a_warehouse(path: Path) -> None:
    if path.suffix == ".parquet":
        duckdb.sql(f"copy (select 1 as a) to '{path}' (format parquet)")
    elif path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(b'{"a": 1}'))
    elif path.suffix == ".csv":
        path.write_text("a,b\n1,2\n")
    else:
        path.write_text('{"a": 1}')


@pytest.mark.parametrize("name", ["b.json", "b.json.gz", "b.csv", "b.parquet"])
@pytest.mark.parametrize("command", ["ingest", "import-parquet", "rules --add"])
def test_db_naming_a_file_that_is_not_a_warehouse_is_refused(
    name: str, command: str, tmp_path: Path, trace: Path, export: Path
) -> None:
    target = tmp_path / name
    _not_a_warehouse(target)
    before = target.read_bytes()
    given = {"ingest": [trace], "import-parquet": [export], "rules --add": []}[command]
    if command == "rules --add":
        rules = tmp_path / "r.csv"
        rules.write_text(RULES_HEADER + "5,^my_kernel,comm,custom,AllReduce\n")
        given = [rules]
    run = traceq(*command.split(), *given, "--db", target)
    one_line_error(run, str(target), "not a traceq warehouse")
    no_loss(target.read_bytes() == before, f"{target} changed")


# ------------------------------------------------------------------ 2. two exports, one directory


@pytest.mark.slow
def test_two_exports_to_one_directory_never_mix(tmp_path: Path, trace: Path) -> None:
    dbs = []
    for run in ("first", "second"):
        db = tmp_path / f"{run}.duckdb"
        assert traceq("ingest", trace, "--db", db, "--name", run, "-q").code == 0
        dbs.append(db)
    out = tmp_path / "out"
    for attempt in range(10):
        procs = [subprocess.Popen([str(TRACEQ), "export", "--parquet", str(out), "--db", str(db), "--overwrite"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for db in dbs]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
        for code, err in results:
            TALLY["tried"] += 1
            assert "Traceback" not in err, err
            if code != 0:
                assert err.count("\n") == 1 and "another traceq export is writing" in err, err
                TALLY["one_line"] += 1
            else:
                TALLY["kept whole"] += 1
        assert any(code == 0 for code, _ in results), results
        with duckdb.connect() as con:
            traced = {r for (r,) in con.sql(f"select distinct run from read_parquet('{out}/traces/**/*.parquet', hive_partitioning = true)").fetchall()}
            kernels = {r for (r,) in con.sql(f"select distinct run from read_parquet('{out}/gpu_events/**/*.parquet', hive_partitioning = true)").fetchall()}
        no_loss(len(traced) == 1 and traced == kernels, f"attempt {attempt}: traces of {traced}, kernels of {kernels}")
        assert not [p for p in out.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------ 3. rules --add: whole or nothing


def test_rules_file_with_a_bad_row_adds_nothing(db: Path, tmp_path: Path) -> None:
    rules = tmp_path / "r.csv"
    rules.write_text(RULES_HEADER + "5,^my_kernel,comm,custom,AllReduce\n6,^short\n")
    one_line_error(traceq("rules", "--add", rules, "--db", db), f"{rules}:3", "2 fields")
    no_loss(user_rules(db) == 0, "a rule of a refused file was stored")


@pytest.mark.slow
@pytest.mark.parametrize("text, needle", [
    (RULES_HEADER + f"{2**63},^a,comm,custom,\n", "out of range"),
    (RULES_HEADER.encode() + b"5,^\xff\xfe,comm,custom,\n", "not UTF-8"),
    ("priority,pattern,class,category,collective,colour\n5,^a,comm,custom,,red\n", "unknown or repeated columns"),
    (RULES_HEADER + "5,(,comm,custom,\n", "bad pattern"),
    (RULES_HEADER, "no rule"),
], ids=["priority 2^63", "not UTF-8", "extra column", "bad pattern", "header only"])
def test_bad_rules_files(text: str | bytes, needle: str, db: Path, tmp_path: Path) -> None:
    rules = tmp_path / "r.csv"
    rules.write_bytes(text if isinstance(text, bytes) else text.encode())
    one_line_error(traceq("rules", "--add", rules, "--db", db), str(rules), needle)
    no_loss(user_rules(db) == 0, "a rule of a refused file was stored")


@pytest.mark.slow
def test_rules_add_killed_leaves_all_rules_or_none(db: Path, tmp_path: Path) -> None:
    n = MAX_USER_RULES  # as many as a warehouse holds: a kill lands while they are checked or stored
    rules = tmp_path / "many.csv"
    rules.write_text(RULES_HEADER + "".join(f"{i % 50},^my_kernel_{i}_,comm,custom,AllReduce\n" for i in range(n)))
    seen = set()
    for delay in (0.05, 0.15, 0.25, 0.35, 0.5, 0.8):
        copy = tmp_path / f"k{delay}.duckdb"
        shutil.copy(db, copy)
        proc = subprocess.Popen([str(TRACEQ), "rules", "--add", str(rules), "--db", str(copy), "--format", "csv"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        TALLY["tried"] += 1
        TALLY["kept whole"] += 1
        stored = user_rules(copy)
        seen.add(stored)
        no_loss(stored in (0, n), f"killed after {delay} s: {stored} of {n} rules stored")
    assert traceq("rules", "--add", rules, "--db", db, "--format", "csv").code == 0
    assert user_rules(db) == n


# ------------------------------------------------------------------ 4. bombs


def _whitespace_gzip(path: Path, head: bytes, tail: bytes, megabytes: int, filler: bytes = b" ") -> Path:
    block = filler * (1 << 20)
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(z.compress(head))
        for _ in range(megabytes):
            f.write(z.compress(block))
        f.write(z.compress(tail) + z.flush())
    return path


EVENT = b'{"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 1, "pid": 1, "tid": 1}'


@pytest.mark.slow
@pytest.mark.parametrize("head, tail, needle", [
    (b'{"traceEvents": [', b"]}", "whitespace"),
    (b'{"traceEvents": [' + EVENT + b",", EVENT + b"]}", "no event boundary"),
    (b"", b'{"traceEvents": []}', 'no "traceEvents" array'),
], ids=["after the array opens", "between two events", "before the object"])
def test_gzip_of_whitespace_is_bounded(head: bytes, tail: bytes, needle: str, tmp_path: Path) -> None:
    """1 GB of spaces in a ~1 MB gzip: stops after MAX_SCAN_BYTES, in bounded memory."""
    bomb = _whitespace_gzip(tmp_path / "bomb.json.gz", head, tail, 1024)
    assert bomb.stat().st_size < 2 << 20
    run = traceq("ingest", bomb, "--db", tmp_path / "w.duckdb", timeout=60)
    one_line_error(run, str(bomb), needle)
    assert run.maxrss_mb < 4 * (MAX_SCAN_BYTES >> 20) + 300, run.maxrss_mb


@pytest.mark.slow
def test_one_endless_string_read_in_small_chunks_is_bounded(tmp_path: Path) -> None:
    """Found by the fuzz run: a 500 MB string (from a 0.5 MB gzip) read in 64-byte chunks used to read
    on 64 bytes at a time, copying its buffer each time (hours). Reads double now: linear."""
    bomb = _whitespace_gzip(tmp_path / "bomb.json.gz", b'{"traceEvents": [{"ph": "X", "name": "', b'"}]}', 500, b"e")
    code = ("import sys; from pathlib import Path; from tests.fuzzing import parse; from traceq.errors import TraceqError\n"
            "try:\n    parse(Path(sys.argv[1]), 64)\nexcept TraceqError as exc:\n    print(exc)")
    TALLY["tried"] += 1
    try:
        done = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=60,
                              cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        TALLY["hang"] += 1
        raise
    assert done.returncode == 0 and "no event boundary" in done.stdout, done.stdout + done.stderr
    TALLY["one_line"] += 1


@pytest.mark.slow
def test_json_nested_a_thousand_deep(tmp_path: Path) -> None:
    nested = "1"
    for _ in range(1000):
        nested = '{"a": ' + nested + "}"
    event = '{"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 1, "pid": 1, "tid": 1, "args": %s}'
    cases = {
        "args.json": '{"traceEvents": [%s]}' % (event % nested),
        "header.json": '{"traceEvents": [%s], "deep": %s}' % (event % "{}", nested),
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        for threads in ("2", "1"):
            one_line_error(traceq("ingest", path, "--db", tmp_path / "w.duckdb", "--threads", threads),
                           str(path), "nested too deeply")


@pytest.mark.slow
def test_a_40_mb_header_ingests_in_bounded_memory(tmp_path: Path) -> None:
    """A deviceProperties name of 40 MB (before the events, and after them): read, not a DuckDB
    out-of-memory traceback."""
    event = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": 0, "tid": 7,
             "args": {"stream": 7, "correlation": 1, "device": 0}}
    devices = [{"id": 0, "name": "x" * (40 << 20)}]
    for where, doc in (("before", {"deviceProperties": devices, "traceEvents": [event]}),
                       ("after", {"traceEvents": [event], "deviceProperties": devices})):
        path = tmp_path / f"rank0_{where}.json"
        path.write_text(json.dumps(doc))
        run = traceq("ingest", path, "--db", tmp_path / f"{where}.duckdb")
        TALLY["tried"] += 1
        assert run.code == 0 and "Traceback" not in run.err, run.err
        assert run.maxrss_mb < 1500, run.maxrss_mb
        TALLY["kept whole"] += 1
        assert traceq("report", "--db", tmp_path / f"{where}.duckdb", "--format", "csv").code == 0


# what ingest says of a file most of whose events it cannot store, after "PATH: N of its first M "
UNUSABLE_WORDS = (
    'events are none that traceq stores (it stores complete events, "ph": "X", with a valid time and duration; '
    "not elements without a phase, nor metadata, flow, instant or counter events): with over 99% unusable it is no "
    "profiler trace; nothing was stored. Check that it is the file the profiler wrote")
KERNEL = (b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": %d, "dur": 1, '
          b'"args": {"device": 0, "stream": 7, "correlation": %d}}')
BOMB_EVENTS = 8_000_000  # 32 MB of JSON, ~35 KB of gzip: before issue 51, 625 MB peak, and exit 0 but "first"
EVERY = 2_000_000


def _empty_object_bomb(path: Path, placement: str, n: int = BOMB_EVENTS) -> tuple[Path, int]:
    """A gzip of ``n`` ``{}`` (streamed: the test holds a MB at a time) with kernels where ``placement``
    says; returns it and the number of kernels."""
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = b"{}, " * (1 << 18)
    kernels = 0
    with open(path, "wb") as f:
        f.write(z.compress(b'{"traceEvents": ['))
        if placement == "after one valid event":
            f.write(z.compress(KERNEL % (0, 0) + b", "))
            kernels += 1
        left = n
        while left:
            run = min(left, EVERY if placement == "one valid event every 2M" else left)
            for _ in range(run // (1 << 18)):
                f.write(z.compress(block))
            f.write(z.compress(b"{}, " * (run % (1 << 18))))
            left -= run
            if placement == "one valid event every 2M":
                f.write(z.compress(KERNEL % (kernels * 10, kernels) + b", "))
                kernels += 1
        f.write(z.compress(b"{}]}") + z.flush())
    return path, kernels


@pytest.mark.parametrize("placement", ["first", "after one valid event", "one valid event every 2M"])
def test_a_gzip_of_empty_objects_fails_in_one_line_in_flat_memory(placement: str, tmp_path: Path) -> None:
    """Dropped events are counted, not kept (issue 51): wherever the kernels sit, the file fails in one
    line once more than 99 % of a million events or more are unusable, under 300 MB and in seconds, and
    leaves no warehouse. (Before: the guard read the first 1M events only, and each dropped event was a
    row: 625 MB for these 8M, 3.0 GB and exit 0 for 500M after one kernel.)"""
    bomb, kernels = _empty_object_bomb(tmp_path / "bomb.json.gz", placement)
    assert bomb.stat().st_size < 200 << 10
    db = tmp_path / "w.duckdb"
    started = time.monotonic()
    run = traceq("ingest", bomb, "--db", db, timeout=120)
    seconds = time.monotonic() - started
    line = one_line_error(run, str(bomb), UNUSABLE_WORDS)
    unusable, read = (int(n.replace(",", "")) for n in line.split(": ", 1)[1].split(" events")[0].split(" of its first "))
    # the kernels among the first `read` elements, counted from where they were written
    among = {"first": 0, "after one valid event": 1, "one valid event every 2M": read // (EVERY + 1)}[placement]
    assert 1_000_000 <= read <= BOMB_EVENTS + kernels + 1 and read - unusable == among, line
    assert run.maxrss_mb < 300, run.maxrss_mb  # a bound, not a benchmark: ~145 MB here
    assert seconds < 60, seconds  # likewise: ~3 s
    no_loss(not db.exists(), "a refused first ingest left a warehouse")


def test_the_decoder_counts_dropped_events_without_keeping_them(tmp_path: Path) -> None:
    """The same bomb read by traceq.ingest.decode (DuckDB's reader refusing a file sends it there): one
    line, under 300 MB (before: 380 MB for 8M, its 8 MB chunks held as half a million Python objects)."""
    bomb, _ = _empty_object_bomb(tmp_path / "bomb.json.gz", "after one valid event")
    code = ("import sys; from pathlib import Path; from traceq.ingest import ingest_traces\n"
            "[f] = ingest_traces([Path(sys.argv[1])], Path(sys.argv[2]), native=False).files\n"
            "print(f.status, f.message)")
    TALLY["tried"] += 1
    proc = subprocess.Popen([sys.executable, "-c", code, str(bomb), str(tmp_path / "w.duckdb")], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    peak_kb, deadline = 0, time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        peak_kb = max(peak_kb, _high_water_kb(proc.pid))
        time.sleep(0.02)
    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    assert out.startswith(f"failed {bomb}: ") and UNUSABLE_WORDS in out, out + err
    assert peak_kb < 300 << 10, peak_kb
    TALLY["one_line"] += 1


# ------------------------------------------------------------------ 5. inputs that are not files


def test_inputs_that_are_not_regular_files_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    zero = tmp_path / "z.json"
    zero.symlink_to("/dev/zero")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop.name)
    for path, needle in ((fifo, "named pipe"), (zero, "device"), (loop, "symlink loop")):
        one_line_error(traceq("ingest", path, "--db", tmp_path / "w.duckdb", timeout=30), str(path), needle)
    no_loss(not (tmp_path / "w.duckdb").exists(), "a refused ingest made a warehouse")


@pytest.mark.slow
def test_odd_entries_of_a_directory_are_passed_over_with_a_note(tmp_path: Path, trace: Path) -> None:
    folder = tmp_path / "run1"
    folder.mkdir()
    shutil.copy(trace, folder / "rank0.json")
    os.mkfifo(folder / "f.json")
    (folder / "z.json").symlink_to("/dev/zero")
    (folder / "loop.json").symlink_to("loop.json")
    (folder / "up").symlink_to("..")  # a directory link: not followed, so no loop
    run = traceq("ingest", folder, "--db", tmp_path / "w.duckdb", timeout=30)
    TALLY["tried"] += 1
    assert run.code == 0 and "Traceback" not in run.err, run.err
    notes = [line for line in run.err.splitlines() if line.startswith("note:")]
    for name, kind in (("f.json", "named pipe"), ("z.json", "device"), ("loop.json", "symlink loop")):
        assert any(str(folder / name) in n and kind in n for n in notes), (name, notes)
    assert "1 ingested" in run.out
    TALLY["noted"] += 1


# ------------------------------------------------------------------ permissions

# root (as CI runs) reads everything: drop the capabilities that let it, and give the files to another user
NO_DAC = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-dac_override,-dac_read_search")
NOBODY = 65534


@pytest.fixture
def closed_to_root(tmp_path: Path) -> Path:
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        skip_or_fail("needs root and setpriv (util-linux) to run traceq without permission to read (CI runs as root)")
    return tmp_path


def _give_away(path: Path, mode: int) -> None:
    os.chown(path, NOBODY, NOBODY)
    path.chmod(mode)


@pytest.mark.slow
def test_unreadable_inputs_say_so(closed_to_root: Path, trace: Path) -> None:
    closed = closed_to_root / "closed"  # another user's, no permission to list or enter
    closed.mkdir()
    shutil.copy(trace, closed / "rank0.json")
    _give_away(closed / "rank0.json", 0o600)
    _give_away(closed, 0o700)
    db = closed_to_root / "w.duckdb"
    one_line_error(traceq("ingest", closed, "--db", db, unprivileged=True), str(closed), "permission denied")
    one_line_error(traceq("ingest", closed / "rank0.json", "--db", db, unprivileged=True),
                   str(closed / "rank0.json"), "Permission denied")
    outer = closed_to_root / "outer"
    (outer / "ok").mkdir(parents=True)
    shutil.copy(trace, outer / "ok" / "rank0.json")
    shutil.move(closed, outer / "closed")
    run = traceq("ingest", outer, "--db", db, unprivileged=True)
    TALLY["tried"] += 1
    assert run.code == 0 and "1 ingested" in run.out, run.err
    assert any(str(outer / "closed") in line and "cannot be read" in line for line in run.err.splitlines()), run.err
    TALLY["noted"] += 1
    unreadable = closed_to_root / "theirs.json"
    shutil.copy(trace, unreadable)
    _give_away(unreadable, 0o600)
    one_line_error(traceq("ingest", unreadable, "--db", db, unprivileged=True), str(unreadable), "Permission denied")


# ------------------------------------------------------------------ a damaged warehouse


@pytest.mark.slow
@pytest.mark.parametrize("command", ["report", "check", "runs", "export --parquet OUT", "ingest TRACE"])
def test_warehouse_cut_in_half(command: str, warehouse: Path, trace: Path, tmp_path: Path) -> None:
    half = tmp_path / "half.duckdb"
    data = warehouse.read_bytes()
    half.write_bytes(data[: len(data) // 2])
    args = command.replace("OUT", str(tmp_path / "out")).replace("TRACE", str(trace)).split()
    one_line_error(traceq(*args, "--db", half), str(half), "damaged or cut short")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ a full or read-only file system


@pytest.fixture
def small_fs() -> Iterator[Path]:
    """A 1 MB tmpfs (root only; CI runs as root)."""
    path = Path(tempfile.mkdtemp(prefix="traceq-tmpfs-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        path.rmdir()
        skip_or_fail(f"cannot mount a small tmpfs here ({done.stderr.decode().strip()}); CI runs as root")
    yield path
    subprocess.run(["umount", str(path)], check=True)
    path.rmdir()


@pytest.mark.slow
def test_full_disk(small_fs: Path, tmp_path: Path) -> None:
    big = _corpus_trace()
    db = small_fs / "w.duckdb"
    one_line_error(traceq("ingest", big, "--db", db), "No space left on device")
    assert traceq("report", "--db", db).code != 0  # nothing of the trace, and no traceback
    no_loss(not db.exists(), "a refused first ingest left its warehouse file")
    warehouse = tmp_path / "w.duckdb"
    assert traceq("ingest", big, "--db", warehouse, "-q").code == 0
    free = os.statvfs(small_fs)
    (small_fs / "filler").write_bytes(b"x" * (free.f_bavail * free.f_frsize - 16 * 1024))  # 16 kB left
    out = small_fs / "out"
    one_line_error(traceq("export", "--parquet", out, "--db", warehouse), str(out), "No space left on device")
    no_loss(not out.exists(), "a failed export left its directory")


@pytest.mark.slow
def test_read_only_file_system(small_fs: Path, warehouse: Path, trace: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    one_line_error(traceq("ingest", trace, "--db", small_fs / "w.duckdb"), "Read-only file system")
    one_line_error(traceq("export", "--parquet", small_fs / "out", "--db", warehouse), "Read-only file system")


def _corpus_trace() -> Path:
    from tests.conftest import corpus_path

    return corpus_path("hta/trace_diff/control/control.json.gz")


@pytest.mark.slow
def test_export_paths_that_cannot_be(tmp_path: Path, warehouse: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    one_line_error(traceq("export", "--parquet", a_file / "sub", "--db", warehouse), str(a_file / "sub"))
    long_name = tmp_path / ("x" * 300)
    one_line_error(traceq("export", "--parquet", long_name, "--db", warehouse), "File name too long")


def test_export_of_a_run_whose_name_no_folder_can_hold(db: Path, tmp_path: Path) -> None:
    """A warehouse of an older traceq may hold such a run: the export fails in one line and leaves nothing."""
    with duckdb.connect(str(db)) as con:
        for table in ("traces", "runs"):
            con.execute(f"update {table} set run = ?", ["r" * 300])
    out = tmp_path / "out"
    one_line_error(traceq("export", "--parquet", out, "--db", db), str(out), "File name too long")
    no_loss(not out.exists(), "a failed export left its directory")


@pytest.mark.slow
def test_a_run_name_that_no_export_could_hold(tmp_path: Path, trace: Path) -> None:
    db = tmp_path / "w.duckdb"
    one_line_error(traceq("ingest", trace, "--db", db, "--name", "r" * 300), "--name", "too long")
    one_line_error(traceq("ingest", trace, "--db", db, "--name", ""), "--name ''", "not empty")
    folder = tmp_path / ("a b" * 60)  # 180 bytes, 300 percent-encoded
    folder.mkdir()
    shutil.copy(trace, folder / "rank0.json")
    one_line_error(traceq("ingest", folder, "--db", db), str(folder / "rank0.json"), "give the run a name")
    assert traceq("ingest", folder, "--db", db, "--name", "short").code == 0


# ------------------------------------------------------------------ smaller


@pytest.mark.slow
@pytest.mark.parametrize("option, value, needle", [
    ("--tp", "99999999999999999999", "too large"),
    ("--flops-per-step", "nan", "finite"),
    ("--flops-per-step", "inf", "finite"),
    ("--warmup-steps", "-1", "0 or more"),
    ("--model", "", "must not be empty"),
])
def test_runs_set_refuses_what_it_would_store_as_null(option: str, value: str, needle: str, db: Path) -> None:
    before = json.loads(traceq("runs", "--db", db, "--format", "json").out)
    one_line_error(traceq("runs", "set", "trace", option, value, "--db", db), option, needle)
    no_loss(json.loads(traceq("runs", "--db", db, "--format", "json").out) == before, "runs set changed a value")


@pytest.mark.slow
def test_warmup_steps_can_be_reset_to_zero(db: Path) -> None:
    assert traceq("runs", "set", "trace", "--warmup-steps", "3", "--db", db).code == 0
    assert traceq("runs", "set", "trace", "--warmup-steps", "0", "--db", db).code == 0
    assert json.loads(traceq("runs", "--db", db, "--format", "json").out)[0]["warmup_steps"] == 0


@pytest.mark.slow
def test_rank_out_of_range(tmp_path: Path, trace: Path) -> None:
    one_line_error(traceq("ingest", trace, "--db", tmp_path / "w.duckdb", "--rank", "99999999999999999999"),
                   "--rank", "from 0 to")
    doc = json.loads(trace.read_text())
    doc["distributedInfo"] = {"rank": 1e20, "world_size": 8}
    named = tmp_path / "rank3.json"
    named.write_text(json.dumps(doc))
    run = traceq("ingest", named, "--db", tmp_path / "w.duckdb")
    assert run.code == 0, run.err
    assert "rank 3," in run.out
    assert any("distributedInfo.rank 1e+20 is not a rank" in line and "file name" in line for line in run.err.splitlines())


# ------------------------------------------------------------------ 9. kill-safety


def _kill_after(args: list[str], delay: float) -> None:
    proc = subprocess.Popen([str(TRACEQ), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    TALLY["tried"] += 1
    TALLY["kept whole"] += 1


@pytest.mark.slow
def test_export_killed_leaves_no_half_export(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    assert traceq("ingest", _corpus_trace(), "--db", db, "-q").code == 0
    expected = traceq("report", "--db", db, "--format", "csv").out
    for delay in (0.3, 0.5, 0.7, 0.9, 1.2):
        out = tmp_path / f"out{delay}"
        _kill_after(["export", "--parquet", str(out), "--db", str(db)], delay)
        if (out / "traces").is_dir():  # it looks like an export: then it is a whole one
            no_loss(traceq("report", "--db", out, "--format", "csv").out == expected, f"half an export at {delay} s")
        # the next export takes the directory over, whatever was left
        assert traceq("export", "--parquet", out, "--db", db, "--overwrite").code == 0
        assert not [p for p in out.iterdir() if p.name.startswith(".")]
        assert traceq("report", "--db", out, "--format", "csv").out == expected


@pytest.mark.slow
def test_import_parquet_killed_imports_all_or_nothing(tmp_path: Path) -> None:
    source = tmp_path / "src.duckdb"
    assert traceq("ingest", _corpus_trace(), "--db", source, "-q").code == 0
    out = tmp_path / "pq"
    assert traceq("export", "--parquet", out, "--db", source).code == 0
    n = rows(source, "gpu_events")
    for delay in (0.3, 0.5, 0.7, 1.0):
        db = tmp_path / f"k{delay}.duckdb"
        _kill_after(["import-parquet", str(out), "--db", str(db)], delay)
        if db.exists():
            assert traceq("runs", "--db", db).code in (0, 1)  # opens (its log replayed)
            with duckdb.connect(str(db)) as con:
                # killed before its first table: an empty database, which traceq takes for a new warehouse
                made = con.execute("select count(*) from duckdb_tables() where table_name = 'gpu_events'").fetchone()[0]
                kept = con.execute("select count(*) from gpu_events").fetchone()[0] if made else 0
                traces = con.execute("select count(*) from traces").fetchone()[0] if made else 0
            no_loss((kept, traces) in ((0, 0), (n, 1)), f"killed after {delay} s: {kept} of {n} rows, {traces} traces")


@pytest.mark.slow
def test_runs_set_killed_keeps_the_old_value_or_the_new(db: Path, tmp_path: Path) -> None:
    assert traceq("runs", "set", "trace", "--tp", "2", "--db", db).code == 0
    for delay in (0.1, 0.2, 0.3, 0.4, 0.5):
        copy = tmp_path / f"k{delay}.duckdb"
        shutil.copy(db, copy)
        _kill_after(["runs", "set", "trace", "--tp", "4", "--db", str(copy)], delay)
        run = traceq("runs", "--db", copy, "--format", "json")
        no_loss(run.code == 0 and json.loads(run.out)[0]["tp"] in (2, 4), f"killed after {delay} s: {run.out}{run.err}")


# ------------------------------------------------------------------ 6. round 3: files, consoles, names
# Each case makes its inputs in a folder of its own and runs one real command under the time limit; beyond
# one error line naming the input (no traceback, no hang), the folder must hold exactly what it held before
# (nothing written outside the named outputs: a refused command names none), no traceq child may outlive
# the command, and its peak RSS stays under ROUND3_RSS_MB.

ROUND3_RSS_MB = 1024


def _foreign(d: Path) -> Path:
    return duckdb_file(d / "mine.duckdb", "create table measurements (x int)")


def _newer(d: Path) -> Path:
    db = d / "newer.duckdb"
    assert traceq("ingest", small_trace().write(d / "t" / "rank0.json"), "--db", db, "-q").code == 0
    with duckdb.connect(str(db)) as con:
        con.execute("update warehouse_info set value = '99' where key = 'schema_version'")
    return db


def _lookalike(d: Path) -> Path:
    return duckdb_file(d / "lookalike.duckdb", *LOOKALIKE)


def _warehouse(d: Path) -> Path:
    db = d / "w.duckdb"
    assert traceq("ingest", small_trace().write(d / "t" / "rank0.json"), "--db", db, "-q").code == 0
    return db


def _damaged_export(d: Path) -> Path:
    db = _warehouse(d)
    out = d / "pq"
    assert traceq("export", "--parquet", out, "--db", db).code == 0
    shutil.rmtree(out / "gpu_events")
    return out


def _empty_events(d: Path) -> Path:
    path = d / "empty.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"traceEvents": [' + b", ".join([b"{}"] * 1_200_000) + b"]}")
    return path


ROUND3 = {
    # name: (make the input, the command's arguments given it, what the line says)
    "report on a foreign DuckDB file": (_foreign, lambda p: ["report", "--db", p], "not a traceq warehouse"),
    "runs on a foreign DuckDB file": (_foreign, lambda p: ["runs", "--db", p], "not a traceq warehouse"),
    "ingest into a foreign DuckDB file": (_foreign, lambda p: ["ingest", p.parent / "t", "--db", p], "not a traceq warehouse"),
    "report on a newer warehouse": (_newer, lambda p: ["report", "--db", p], "made by a newer traceq"),
    "ingest into a newer warehouse": (_newer, lambda p: ["ingest", p.parent / "t", "--db", p, "--force"],
                                      "made by a newer traceq"),
    "tables of traceq's names, other columns": (_lookalike, lambda p: ["runs", "--db", p], "not traceq's"),
    "sql: COPY TO a file": (_warehouse, lambda p: ["sql", f"copy (select 1) to '{p.parent}/x.csv'", "--db", p],
                            "Permission Error"),
    "sql: read_csv of another file": (_warehouse, lambda p: ["sql", "select * from read_csv('/etc/passwd')", "--db", p],
                                      "Permission Error"),
    "sql: INSTALL an extension": (_warehouse, lambda p: ["sql", "install httpfs", "--db", p], "Permission Error"),
    "--db md:": (_warehouse, lambda p: ["report", "--db", "md:mine"], "md:mine: a warehouse is a local"),
    "a run name with ESC": (_warehouse, lambda p: ["ingest", p.parent / "t", "--db", p, "--force", "--name", "x\x1b[2J"],
                            "control characters"),
    "an export without gpu_events/": (_damaged_export,
                                      lambda p: ["import-parquet", p, "--db", p.parent / "new.duckdb"], "damaged export"),
    "--threads 100000": (_warehouse, lambda p: ["ingest", p.parent / "t", "--db", p, "--threads", "100000"],
                         "--threads 100000"),
    "1.2 million empty events": (_empty_events, lambda p: ["ingest", p, "--db", p.parent / "e.duckdb"],
                                 "events are none that traceq stores (it stores complete events"),
    "kernels --top 10^20": (_warehouse, lambda p: ["kernels", "--db", p, "--top", "99999999999999999999"],
                            "--top 99999999999999999999"),
}
# a refused import or ingest may make its (new) warehouse file, empty of traces: named outputs
ROUND3_OUTPUTS = {"new.duckdb", "e.duckdb", "new.duckdb.wal", "e.duckdb.wal"}


def _children_of_traceq(folder: Path) -> list[int]:
    """Processes whose command line names ``folder`` (a trace processor, a worker left behind)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if str(folder).encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize("case", list(ROUND3))
def test_round3_cases_end_in_one_line_and_leave_everything_as_it_was(tmp_path: Path, case: str) -> None:
    make, command, needle = ROUND3[case]
    given = make(tmp_path)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    run = traceq(*command(given), timeout=60)
    one_line_error(run, needle)
    assert run.maxrss_mb < ROUND3_RSS_MB, f"{run.maxrss_mb:.0f} MB"
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    made = {p for p in after if p not in before and p.name not in ROUND3_OUTPUTS}
    changed = {p for p in before if after.get(p) != before[p]}
    no_loss(not made and not changed, f"written: {sorted(map(str, made))}, changed: {sorted(map(str, changed))}")
    assert not _children_of_traceq(tmp_path), "a process of the command outlived it"
