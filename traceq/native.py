"""Parse event chunks with DuckDB's JSON reader, straight into the warehouse (the fast path).

The reader (:mod:`traceq.reader`) cuts a trace's event array into chunks of whole events; here a
batch of chunks is written as JSON array files to a scratch directory (in memory where ``/dev/shm``
exists; chunks of an uncompressed file are copied by ``sendfile`` without passing through Python)
and parsed by DuckDB on every core (``sql/read_events.sql``) into rows held in memory, then written as
rows (``sql/load_events.sql``) while the next batch is parsed: no Python touches an event.
Whatever that path would read differently from :mod:`traceq.decode` (an element that is not an
object, args that are not an object, epoch microseconds with a fraction, ...) raises
:class:`NotNative`, and ingest decodes the file with :mod:`traceq.decode` instead, which handles
every case.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import duckdb

from traceq.kineto import OP_CATS
from traceq.reader import FileRange
from traceq.warehouse import execute_over, named_params, sql_text

# Bytes of JSON parsed per statement: several files, so that DuckDB parses them on all its threads.
# Measured on a 508 MB trace (2 cores): 48 MB batches 3.15 s, 96 MB 2.95 s, 192 MB 2.85 s in-process,
# with peak RSS 320, 390 and 505 MiB; every batch costs CPU of its own, each costs memory.
BATCH_BYTES = 96 << 20
# Traces of 2021 spell it "external id" on some events; one struct type cannot hold both spellings: a
# batch file with events whose args lack "External id" is searched for the other (count_batch).
_LOWERCASE_EXTERNAL_ID = b'"external id"'


class NotNative(Exception):
    """This file needs :mod:`traceq.decode` (the message says why)."""


@dataclass
class BatchCounts:
    """What one batch held (``sql/load_events.sql``, statement 1)."""

    events: int
    gpu: int
    host: int
    dropped: int
    skipped_ops: int
    rows_without_rank: int
    rows_with_rank: int
    unsure_files: list[str]  # files with events whose args lack "External id"
    odd: bool


@cache
def _statements(name: str) -> list[str]:
    statements = []
    for text in sql_text(name).split(";"):
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--")).strip()
        if code:
            statements.append(code)
    return statements


def _run(con: Any, statement: str, params: dict[str, Any], events: Any = None) -> list[tuple]:
    """Execute ``statement`` with the named parameters it uses, reading the parsed batch ``events``
    (:func:`parse_batch`) as ``_rows``."""
    try:
        return execute_over(con, statement, named_params(statement, params), events)
    except duckdb.Error as exc:
        raise NotNative(str(exc).splitlines()[0]) from None


def scratch_base() -> str:
    """Where batch files go: in memory (``/dev/shm``) where the machine has one with room for a few
    batches (containers often give it 64 MB), else the temp directory."""
    try:
        st = os.statvfs("/dev/shm")
        if os.access("/dev/shm", os.W_OK) and st.f_bavail * st.f_frsize >= 4 * BATCH_BYTES:
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """A private directory for batch files in :func:`scratch_base`. Its name holds this process's
    id, so that a later ingest can remove it if this one is killed (:func:`remove_stale_scratch`)."""
    base = scratch_base()
    _remove_stale_scratch_once(base)
    return tempfile.TemporaryDirectory(prefix=f"traceq-{os.getpid()}-", dir=base)


@cache
def _remove_stale_scratch_once(base: str) -> None:
    """:func:`remove_stale_scratch`, once per process (not once per file: ``base`` may be a large /tmp)."""
    remove_stale_scratch(base)


_SCRATCH_NAME = re.compile(r"traceq-(\d+)-\w+")
# A live ingest adds and removes batch files every few seconds, which touches its directory.
STALE_SCRATCH_S = 600


def remove_stale_scratch(base: str) -> None:
    """Remove the scratch directories in ``base`` left by ingests that were killed (SIGKILL, the OOM
    killer): up to a few batches of JSON each, in memory under ``/dev/shm``. A directory goes when
    its process is gone and it has not changed for :data:`STALE_SCRATCH_S` (the age guards against a
    live ingest in another PID namespace that shares the directory)."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        m = _SCRATCH_NAME.fullmatch(entry.name)
        if m is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or now - st.st_mtime < STALE_SCRATCH_S:
            continue
        if not _process_alive(int(m.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


def batch_files(
    chunks: Iterator[bytes | FileRange], directory: str, batch_bytes: int = BATCH_BYTES
) -> Iterator[list[str]]:
    """Write chunks (bytes, or ranges of the trace file) as JSON array files, yielding the files of
    each batch of about ``batch_bytes`` (the consumer deletes them, :func:`remove`)."""
    files: list[str] = []
    size = 0
    for n, chunk in enumerate(chunks):
        name = os.path.join(directory, f"{n}.json")
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, b"[")
                if isinstance(chunk, FileRange):
                    chunk.copy_to(fd)
                else:
                    _write_all(fd, chunk)
                os.write(fd, b"]")
            finally:
                os.close(fd)
        except OSError as exc:  # e.g. a full temp directory: traceq.decode needs no scratch files
            raise NotNative(f"cannot write scratch files in {directory} ({exc.strerror or exc})") from None
        files.append(name)
        size += len(chunk)
        if size >= batch_bytes:
            yield files
            files, size = [], 0
    if files:
        yield files


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def remove(files: list[str]) -> None:
    for name in files:
        os.unlink(name)


def prefetch(items: Iterator[Any], ahead: int = 1) -> Iterator[Any]:
    """``items``, produced ``ahead`` items ahead in a thread (reading and cutting overlap DuckDB's
    parsing); 0: no bound (the producer bounds itself)."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            q.put(("error", exc))

    thread = threading.Thread(target=produce, name="traceq-reader", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        while thread.is_alive():  # let the producer see `stop` (it may be blocked on a full queue)
            try:
                q.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)


def parser(con: Any) -> Any:
    """A cursor of ``con`` for :func:`parse_batch` in another thread (it holds the macros the parse
    uses; ``con`` keeps writing meanwhile)."""
    cursor = con.cursor()
    cursor.execute(sql_text("macros.sql"))
    return cursor


def parse_batch(con: Any, files: list[str], all_ops: bool) -> Any:
    """Parse ``files`` (``sql/read_events.sql``) into a materialized relation, one row per event,
    that statements on ``con``'s connection read as ``_rows``. (Per 500 MB: 0.14 CPU s less than an
    Arrow table, which was 0.5 s less than a DuckDB temp table, and no pyarrow import.)

    Raises :class:`NotNative` when DuckDB cannot parse them.
    """
    (read,) = _statements("read_events.sql")
    largest = max(os.path.getsize(f) for f in files)  # no event is larger than its file
    params = {"files": files, "all_ops": all_ops, "op_cats": sorted(OP_CATS), "max_object_bytes": largest + 1}
    try:
        return con.sql(read, params=named_params(read, params)).materialize()
    except duckdb.Error as exc:
        raise NotNative(str(exc).splitlines()[0]) from None


def count_batch(con: Any, events: Any) -> BatchCounts:
    """What the parsed ``events`` hold.

    Raises :class:`NotNative` when a row needs :mod:`traceq.decode`.
    """
    counts = BatchCounts(*_run(con, _statements("load_events.sql")[0], {}, events)[0])
    for name in counts.unsure_files:
        with open(name, "rb") as f:
            if _LOWERCASE_EXTERNAL_ID in f.read():
                raise NotNative('args with "external id" (2021 traces), which the JSON reader does not read')
    if counts.odd:
        raise NotNative("values that DuckDB's JSON reader would read differently (e.g. epoch microseconds with a fraction)")
    return counts


def write_batch(con: Any, events: Any, trace_id: int, next_name_id: int, fill_rank: int | None) -> int:
    """Write the parsed ``events`` as rows of ``trace_id``; returns how many new names it added."""
    params = {"trace_id": trace_id, "next_name_id": next_name_id, "fill_rank": fill_rank}
    names, *rows = _statements("load_events.sql")[1:]
    added = _run(con, names, params, events)[0][0]
    for statement in rows:
        _run(con, statement, params, events)
    return added
