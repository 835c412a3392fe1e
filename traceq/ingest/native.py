"""Parse event chunks with DuckDB's JSON reader, straight into the warehouse (the fast path).

The reader (:mod:`traceq.ingest.reader`) cuts a trace's event array into chunks of whole events; here a
batch of chunks becomes JSON array files that DuckDB parses on every core (``sql/read_events.sql``)
into rows held in memory, then written as rows (``sql/batch_*.sql``) while the next batch is
parsed: no Python touches an event. A range of an uncompressed trace reaches DuckDB through a named
pipe, filled by ``splice`` from the page cache while DuckDB reads it (no copy of the trace is
made); decompressed bytes are written as scratch files (in memory where ``/dev/shm`` exists).
Whatever that path would read differently from :mod:`traceq.ingest.decode` (an element that is not an
object, args that are not an object, epoch microseconds with a fraction, ...) raises
:class:`NotNative`, and ingest decodes the file with :mod:`traceq.ingest.decode` instead, which handles
every case.
"""

from __future__ import annotations

import mmap
import os
import queue
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb

from traceq import scratch
from traceq.catalog import StepMarker, event_categories
from traceq.ingest.reader import FileRange
from traceq.query import params_of, sql_text
from traceq.store.schema import execute_over

# Bytes of JSON parsed per statement: several files, so that DuckDB parses them on all its threads.
# Every batch costs CPU of its own, each costs memory. Measured on three 500 MB traces (2 cores):
# 96 MB batches 1.60 / 2.08 / 2.21 s, 192 MB 1.51 / 2.06 / 2.04 s, peak RSS ~290-370 vs ~350-460 MiB
# (BENCHMARKS.md). A batch of scratch files (a compressed trace) holds half as much: its files take
# memory too until it is written (in /dev/shm), where pipes take none.
BATCH_BYTES = 192 << 20
SCRATCH_BATCH_BYTES = BATCH_BYTES // 2
# Traces of 2021 spell it "external id" on some events; one struct type cannot hold both spellings: a
# batch file with events whose args lack "External id" is searched for the other (count_batch).
_LOWERCASE_EXTERNAL_ID = b'"external id"'


class NotNative(Exception):
    """This file needs :mod:`traceq.ingest.decode` (the message says why)."""


@dataclass
class BatchCounts:
    """What one batch held (``sql/batch_counts.sql``)."""

    events: int
    gpu: int
    host: int
    dropped: int
    skipped_ops: int
    rows_without_rank: int
    rows_with_rank: int
    unsure_files: list[str]  # files with events whose args lack "External id"
    odd: bool


# the tables one parsed batch writes besides names, and the SELECT of their rows (columns by name)
_BATCH_ROWS = (
    ("gpu_events", "batch_gpu_events.sql"),
    ("host_events", "batch_host_events.sql"),
    ("trace_threads", "batch_threads.sql"),
)


def _run(con: Any, statement: str, params: dict[str, Any], events: Any = None) -> list[tuple]:
    """Execute ``statement`` with the named parameters it uses, reading the parsed batch ``events``
    (:func:`parse_batch`) as ``_rows``."""
    try:
        return execute_over(con, statement, params_of(statement, params), events)
    except duckdb.Error as exc:
        raise NotNative(str(exc).splitlines()[0]) from None


def scratch_base() -> str:
    """Where batch files go: in memory (``/dev/shm``) where the machine has one with room for a few
    batches (containers often give it 64 MB), else the temp directory."""
    return scratch.scratch_base(4 * SCRATCH_BATCH_BYTES)


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """A private directory for batch files in :func:`scratch_base` (:class:`traceq.scratch.ScratchDir`)."""
    return scratch.scratch_dir(scratch_base())


@dataclass
class BatchFiles:
    """One batch of chunks as the JSON array files DuckDB parses (``names``).

    A range of an uncompressed trace (:class:`FileRange`) is a named pipe, made and filled for each
    parse while DuckDB reads it (:meth:`feeding`): the bytes go from the page cache into the pipe
    (``splice``) without a scratch copy. Other chunks (decompressed bytes, the end of a file), and
    every chunk where named pipes cannot be made, are scratch files, deleted by :meth:`remove`.
    """

    names: list[str] = field(default_factory=list)
    largest: int = 0  # bytes of the largest file: no event is larger
    ranges: dict[str, FileRange] = field(default_factory=dict)  # pipe name -> what it carries

    def add(self, name: str, size: int, piece: FileRange | None = None) -> None:
        self.names.append(name)
        self.largest = max(self.largest, size)
        if piece is not None:
            self.ranges[name] = piece

    def holds(self, name: str, text: bytes) -> bool:
        """Whether the JSON of file ``name`` holds ``text``: looked for in place (mapped, not read
        into memory: a batch of fresh 8 MB buffers costs more in page faults than the search)."""
        piece = self.ranges.get(name)
        path, start = (name, 0) if piece is None else (piece.path, piece.offset)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            end = len(data) if piece is None else piece.offset + piece.length
            return data.find(text, start, end) >= 0

    @contextmanager
    def feeding(self) -> Iterator[None]:
        """Make the pipes and fill each in a thread of its own, while the block parses them (a
        pipe is read once: a batch parsed again gets new ones); then stop the threads and remove
        the pipes, however far the parse read."""
        if not self.ranges:
            yield
            return
        feeders: list[tuple[str, threading.Thread]] = []
        source = None
        try:
            source = os.open(next(iter(self.ranges.values())).path, os.O_RDONLY)
            for name, piece in self.ranges.items():
                os.mkfifo(name, 0o600)
                thread = threading.Thread(target=_feed, args=(name, source, piece), name="traceq-pipe", daemon=True)
                feeders.append((name, thread))
                thread.start()
        except BaseException as exc:
            _stop_feeders(feeders, source)
            if isinstance(exc, OSError):
                where = os.path.dirname(self.names[0])
                raise NotNative(f"cannot make named pipes in {where} ({exc.strerror or exc})") from None
            raise
        try:
            yield
        finally:
            _stop_feeders(feeders, source)

    def remove(self) -> None:
        """Delete the scratch files (the pipes are gone once each parse is)."""
        for name in self.names:
            if name not in self.ranges:
                os.unlink(name)


def batch_files(
    chunks: Iterator[bytes | FileRange],
    directory: str,
    batch_bytes: int = BATCH_BYTES,
    small: Callable[[], bool] = lambda: False,
) -> Iterator[BatchFiles]:
    """The chunks (bytes, or ranges of the trace file) as the JSON array files of batches of about
    ``batch_bytes``, half that in scratch files (the consumer deletes them, :meth:`BatchFiles.remove`).

    While ``small()`` holds (asked as each batch starts), batches start at one chunk and double:
    ingest keeps the CPU operators of a file until it shows GPU activity, and what is read before
    that is written in vain (and a batch parsed ahead, parsed again).
    """
    pipes = _pipes_work(directory)
    limit = 0 if small() else batch_bytes
    batch, size = BatchFiles(), 0
    for n, chunk in enumerate(chunks):
        name = os.path.join(directory, f"{n}.json")
        if pipes and isinstance(chunk, FileRange):
            batch.add(name, len(chunk) + 2, chunk)
            size += len(chunk)
        else:
            _write_array(name, chunk, directory)
            batch.add(name, len(chunk) + 2)
            size += 2 * len(chunk)
        if size >= limit:
            yield batch
            limit = min(batch_bytes, 2 * size) if small() else batch_bytes
            batch, size = BatchFiles(), 0
    if batch.names:
        yield batch


def _write_array(name: str, chunk: bytes | FileRange, directory: str) -> None:
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
    except OSError as exc:  # e.g. a full temp directory: traceq.ingest.decode needs no scratch files
        raise NotNative(f"cannot write scratch files in {directory} ({exc.strerror or exc})") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _pipes_work(directory: str) -> bool:
    """Whether named pipes can be made in ``directory`` (not on Windows, nor on some network or FUSE
    file systems)."""
    if not hasattr(os, "mkfifo"):
        return False
    probe = os.path.join(directory, "probe.pipe")
    try:
        os.mkfifo(probe, 0o600)
        os.unlink(probe)
    except OSError:
        return False
    return True


# Bytes a pipe holds (the default, 64 KiB, wakes DuckDB's reading thread 16 times as often); where the
# system allows less, the pipe keeps its size.
_PIPE_BYTES = 1 << 20


def _feed(name: str, source: int, piece: FileRange) -> None:
    """Write ``[``, the range of the trace open as ``source``, ``]`` into the pipe ``name`` (the
    body of a feeder thread). Opening the pipe waits for its reader. A reader that stops early (DuckDB
    at an error elsewhere) ends the thread; a trace that ends before the range leaves the array
    unclosed, which DuckDB reports as malformed JSON (and the file goes to traceq.ingest.decode, which names
    the truncation)."""
    import fcntl  # not on Windows, which has no named pipes to feed (_pipes_work)

    try:
        fd = os.open(name, os.O_WRONLY)
    except OSError:
        return
    try:
        if hasattr(fcntl, "F_SETPIPE_SZ"):
            try:
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
            except OSError:
                pass
        os.write(fd, b"[")
        offset, left = piece.offset, piece.length
        while left:
            sent = _splice(source, fd, left, offset)
            if sent == 0:
                return
            offset += sent
            left -= sent
        os.write(fd, b"]")
    except OSError:  # BrokenPipeError: the reader closed its end
        pass
    finally:
        os.close(fd)


def _splice(source: int, fd: int, count: int, offset: int) -> int:
    if hasattr(os, "splice"):  # Linux: the pages go into the pipe without a copy through user space
        return os.splice(source, fd, count, offset_src=offset)
    data = os.pread(source, min(count, _PIPE_BYTES), offset)
    _write_all(fd, data)
    return len(data)


def _stop_feeders(feeders: list[tuple[str, threading.Thread]], source: int | None) -> None:
    """Wait for the feeder threads, reading out what the parse left in their pipes (a feeder whose
    pipe DuckDB never opened, or stopped reading, is blocked until then), and remove the pipes."""
    for name, thread in feeders:
        if thread.is_alive():
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)  # lets a feeder waiting to open the pipe go on
            try:
                while thread.is_alive():
                    try:
                        while os.read(fd, _PIPE_BYTES):
                            pass
                    except BlockingIOError:
                        pass
                    thread.join(0.005)
            finally:
                os.close(fd)
        os.unlink(name)
    if source is not None:
        os.close(source)


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


def parse_batch(con: Any, files: BatchFiles, all_ops: bool, marker: StepMarker = StepMarker()) -> Any:
    """Parse ``files`` (``sql/read_events.sql``) into a materialized relation, one row per event,
    that statements on ``con``'s connection read as ``_rows``. (Per 500 MB: 0.14 CPU s less than an
    Arrow table, which was 0.5 s less than a DuckDB temp table, and no pyarrow import.) ``all_ops``:
    keep every CPU operator, not only the step markers (``marker``) and those with collective args.

    Raises :class:`NotNative` when DuckDB cannot parse them.
    """
    read = sql_text("read_events.sql")
    params = {
        "files": files.names, "all_ops": all_ops, "max_object_bytes": files.largest + 1,
        **event_categories().sql_params(), **marker.sql_params(),
    }
    try:
        with files.feeding():
            return con.sql(read, params=params_of(read, params)).materialize()
    except duckdb.Error as exc:
        raise NotNative(str(exc).splitlines()[0]) from None


def count_batch(con: Any, events: Any, files: BatchFiles) -> BatchCounts:
    """What the parsed ``events`` (of ``files``) hold.

    Raises :class:`NotNative` when a row needs :mod:`traceq.ingest.decode`.
    """
    counts = BatchCounts(*_run(con, sql_text("batch_counts.sql"), {}, events)[0])
    for name in counts.unsure_files:
        if files.holds(name, _LOWERCASE_EXTERNAL_ID):
            raise NotNative('args with "external id" (2021 traces), which the JSON reader does not read')
    if counts.odd:
        raise NotNative("values that DuckDB's JSON reader would read differently (e.g. epoch microseconds with a fraction)")
    return counts


def write_batch(con: Any, events: Any, trace_id: int, next_name_id: int, fill_rank: int | None) -> int:
    """Write the parsed ``events`` as rows of ``trace_id``; returns how many new names it added."""
    params = {
        "trace_id": trace_id, "next_name_id": next_name_id, "fill_rank": fill_rank,
        **event_categories().sql_params(),
    }
    added = _run(con, f"insert into names by name {sql_text('batch_names.sql')}", params, events)[0][0]
    for table, rows in _BATCH_ROWS:
        _run(con, f"insert into {table} by name {sql_text(rows)}", params, events)
    return added
