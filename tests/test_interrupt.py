"""An ingest killed in the middle of a large file (SIGINT, SIGKILL) leaves nothing of that file; the
warehouse opens afterwards and running the same command again completes the file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.conftest import sigint_as_at_a_terminal
from tests.test_bad_input import small_trace, table_counts
from traceq.ingest import ingest_traces
from traceq.ingest.native import scratch_base
from traceq.scratch import STALE_SCRATCH_S, remove_stale_scratch
from traceq.store.warehouse import connect

TRACEQ = Path(sys.executable).with_name("traceq")

pytestmark = pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="needs Linux /proc to see the file offset")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A warehouse holding one small trace already."""
    db = tmp_path / "w.duckdb"
    assert ingest_traces([small_trace().write(tmp_path / "small" / "rank0.json")], db, threads=1).ok
    return db


def _offsets(pid: int, path: Path) -> dict[str, int]:
    """The read offset of each of the process's open descriptors on ``path``."""
    offsets = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                    with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                        offsets[fd] = next(int(line.split()[1]) for line in info if line.startswith("pos:"))
            except (OSError, StopIteration):  # closed meanwhile
                pass
    except OSError:
        pass
    return offsets


def wait_until_mid_file(proc: subprocess.Popen, path: Path, timeout_s: float = 60) -> None:
    """Return once ``proc`` is reading ``path`` slowly between 15% and 85% of it: decoding and inserting.

    The reader's descriptor shows how far it has cut the file (a batch ahead of the writer). Hashing
    the file also reads it, but at disk speed: it is past the end or closed 0.2 s later; ``sendfile``
    copies ranges at explicit offsets, which do not move the descriptor.
    """
    size = path.stat().st_size
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the ingest finished (exit {proc.returncode}) before it could be interrupted")
        first = {fd: pos for fd, pos in _offsets(proc.pid, path).items() if 0.15 * size < pos < 0.6 * size}
        if first:
            time.sleep(0.2)
            second = _offsets(proc.pid, path)
            if any(fd in second and second[fd] < 0.85 * size for fd in first):
                return
        time.sleep(0.01)
    pytest.fail("the ingest never got to the middle of the file")


def _ingest(trace: Path, db: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [TRACEQ, "ingest", trace, "--db", db, "-q", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_as_at_a_terminal,
    )


def _assert_rerun_completes(trace: Path, n_events: int, db: Path, before: dict[str, int]) -> None:
    proc = _ingest(trace, db)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1].startswith("1 ingested, 0 skipped, 0 failed")
    con = duckdb.connect(str(db), read_only=True)
    try:
        n, n_gpu, n_host, gpu_rows, host_rows = con.execute(
            "select n_events, n_gpu_events, n_host_events,"
            " (select count(*) from gpu_events g where g.trace_id = t.trace_id),"
            " (select count(*) from host_events h where h.trace_id = t.trace_id)"
            " from traces t where path = ?", [str(trace)]).fetchone()
    finally:
        con.close()
    assert n == n_events and (gpu_rows, host_rows) == (n_gpu, n_host) and gpu_rows > 0
    after = table_counts(db)
    assert after["traces"] == before["traces"] + 1
    assert after["gpu_events"] == before["gpu_events"] + gpu_rows


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_interrupted_ingest_leaves_nothing_and_rerun_completes(
    sig: signal.Signals, long_trace: tuple[Path, int], db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace, n_events = long_trace
    # scratch of this test's own: in the machine-wide /dev/shm, any traceq command run beside the suite
    # removes the killed ingest's directory before the test looks for it
    (tmp_path / "scratch").mkdir()
    monkeypatch.setenv("TRACEQ_SCRATCH", str(tmp_path / "scratch"))
    before = table_counts(db)
    proc = _ingest(trace, db, "--threads", "1")
    wait_until_mid_file(proc, trace)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (-9 if sig == signal.SIGKILL else 130), err
    assert "Traceback" not in err

    connect(db).close()  # opens for writing (replaying its log after SIGKILL)
    assert table_counts(db) == before
    # SIGINT cleans up its scratch files; SIGKILL cannot, and the next traceq command, whatever it is,
    # removes them: the kernel dropped the killed process's owner lock
    left = _scratch_of(proc.pid)
    assert len(left) == (1 if sig == signal.SIGKILL else 0) and all(p.parent == tmp_path / "scratch" for p in left), left
    subprocess.run([str(TRACEQ), "metrics", "--format", "csv"], check=True, capture_output=True, timeout=60)
    assert _scratch_of(proc.pid) == []
    _assert_rerun_completes(trace, n_events, db, before)


def _scratch_of(pid: int) -> list[Path]:
    return sorted(Path(scratch_base()).glob(f"traceq-{pid}-*"))


def test_only_stale_scratch_of_dead_processes_is_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    old = time.time() - STALE_SCRATCH_S - 1
    dirs = {
        "dead, stale": (tmp_path / f"traceq-{dead.pid}-a1", old),
        "dead, recent": (tmp_path / f"traceq-{dead.pid}-b2", time.time()),
        "alive, stale": (tmp_path / f"traceq-{os.getpid()}-c3", old),
        "not traceq's": (tmp_path / f"other-{dead.pid}-d4", old),
    }
    for d, mtime in dirs.values():
        d.mkdir()
        (d / "0.json").write_text("[]")
        os.utime(d, (mtime, mtime))
    remove_stale_scratch(str(tmp_path))
    assert {label: d.exists() for label, (d, _) in dirs.items()} == {
        "dead, stale": False, "dead, recent": True, "alive, stale": True, "not traceq's": True,
    }


def test_scratch_goes_as_soon_as_its_owner_dies_whatever_its_age(tmp_path: Path) -> None:
    """The owner lock, not the process id or the age, tells (a PID may be reused, or live in another
    PID namespace): a locked directory stays however old, an unlocked one goes however recent."""
    code = ("import sys, time; from traceq.scratch import ScratchDir; "
            "d = ScratchDir(prefix='traceq-1-', dir=sys.argv[1]); print(d.name, flush=True); time.sleep(120)")
    owner = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        held = Path(owner.stdout.readline().strip())
        old = time.time() - STALE_SCRATCH_S - 1
        os.utime(held, (old, old))
        remove_stale_scratch(str(tmp_path))
        assert held.exists()  # pid 1 is alive here anyway; the lock is what keeps it
        owner.kill()
        owner.wait()
        os.utime(held, None)  # recent
        remove_stale_scratch(str(tmp_path))
        assert not held.exists()
    finally:
        owner.kill()
        owner.wait()


@pytest.mark.slow
def test_a_scratch_directory_being_made_is_never_taken_for_a_dead_ones(tmp_path: Path) -> None:
    """Other traceq commands clear stale scratch as they start, while this one makes its own: its
    owner lock is locked before it has its name, so no remover sees it unlocked (found by review:
    84 of 10,746 directories vanished when the lock file was made, then locked)."""
    from traceq.scratch import ScratchDir

    code = ("import sys, time; from traceq.scratch import remove_stale_scratch\n"
            "end = time.monotonic() + float(sys.argv[2])\n"
            "while time.monotonic() < end:\n    remove_stale_scratch(sys.argv[1])")
    removers = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), "4"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        lost = 0
        for _ in range(1500):
            made = ScratchDir(prefix=f"traceq-{os.getpid()}-", dir=str(tmp_path))
            lost += not Path(made.name).is_dir()
            made.cleanup()
    finally:
        for p in removers:
            p.wait(timeout=30)
    assert lost == 0


@pytest.mark.slow
def test_an_interrupted_parse_stops_the_ingest_and_never_changes_its_path(long_trace: tuple[Path, int], tmp_path: Path) -> None:
    """DuckDB's InterruptException is a duckdb.Error, which elsewhere means "decode this file another
    way" (NotNative): an interrupted parse must stay an interruption, or Ctrl-C would restart the
    ingest on the slower path."""
    import threading

    from traceq.ingest.native import BatchFiles
    from traceq.ingest.pipeline import parse_batch, parser

    trace, _ = long_trace
    array = tmp_path / "events.json"  # the trace's event array alone: seconds of parsing
    data = trace.read_bytes()
    array.write_bytes(data[data.index(b"[") : data.rindex(b"]") + 1])
    del data
    con = parser(duckdb.connect())
    files = BatchFiles()
    files.add(str(array), 1 << 20)
    done = threading.Event()

    def interrupt() -> None:  # again and again: one sent before the query starts is lost
        while not done.wait(0.05):
            con.interrupt()

    thread = threading.Thread(target=interrupt)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            parse_batch(con, files, all_ops=True)
    finally:
        done.set()
        thread.join()
        con.close()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_ctrl_c_in_a_query_ends_the_command_quietly_with_130(db: Path) -> None:
    """SIGINT while DuckDB runs a statement ends it with DuckDB's RuntimeError("Query interrupted"),
    not KeyboardInterrupt: in `sql`, `report`, `kernels` it came out as a 40-line traceback, exit 1.
    Now as any Ctrl-C: exit 130, nothing on stderr."""
    query = "select sum(a) from range(3000000000000) as t(a) where a % 7 = 3"  # hours
    proc = subprocess.Popen([str(TRACEQ), "sql", query, "--db", str(db)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_at_a_terminal)
    try:  # a query of hours: never left running, whatever fails
        deadline = time.monotonic() + 60
        while proc.poll() is None and _cpu_s(proc.pid) < 2.5 and time.monotonic() < deadline:
            time.sleep(0.05)  # past its imports (about 1 CPU s): in its queries
        if proc.poll() is not None:
            pytest.fail(f"the command ended (exit {proc.returncode}) before it could be interrupted")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, err, out) == (130, "", "")


def _catches_sigint(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def test_ctrl_c_while_traceq_loads_ends_it_without_a_traceback(db: Path) -> None:
    """SIGINT while the command line's modules load (most of a second) ended with a traceback of
    whichever import it landed in; now as the signal ends a process. The signal is sent once the
    interpreter has started (it catches SIGINT) and traceq's script has let go of it for the loading."""
    proc = subprocess.Popen([str(TRACEQ), "report", "--db", str(db)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_at_a_terminal)
    seen_caught = False
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        caught = _catches_sigint(proc.pid)
        if seen_caught and not caught:
            break
        seen_caught = seen_caught or caught
        time.sleep(0.001)
    else:
        pytest.fail("traceq never let go of SIGINT while it loaded")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert proc.returncode in (-signal.SIGINT, 130)  # 130: the loading had just ended, the command ran


def test_traceq_scratch_chooses_where_batches_go_and_a_bad_one_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$TRACEQ_SCRATCH (a small or noexec /dev/shm, a private place for each of two jobs) takes the batch
    files; a stale directory a killed ingest left there goes with the next command; a path that is no
    writable directory is one line naming the variable, and the ingest stores nothing."""
    chosen = tmp_path / "scratch"
    chosen.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = chosen / f"traceq-{dead.pid}-x1"
    stale.mkdir()
    old = time.time() - STALE_SCRATCH_S - 1
    os.utime(stale, (old, old))
    monkeypatch.setenv("TRACEQ_SCRATCH", str(chosen))
    assert scratch_base() == str(chosen)
    subprocess.run([str(TRACEQ), "--help"], check=True, capture_output=True, timeout=60)
    assert not stale.exists()

    monkeypatch.setenv("TRACEQ_SCRATCH", str(tmp_path / "absent"))
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, '
                     '"dur": 1, "args": {"device": 0, "stream": 7, "correlation": 1}}]}')
    proc = subprocess.run([str(TRACEQ), "ingest", trace, "--db", tmp_path / "w.duckdb"], capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert any(f"TRACEQ_SCRATCH={tmp_path / 'absent'}: no directory traceq can write" in line for line in lines), proc.stderr
