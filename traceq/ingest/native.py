"""Parse event chunks with DuckDB's JSON reader, straight into the warehouse (the fast path).

The reader (:mod:`traceq.ingest.reader`) cuts a trace's event array into chunks of whole events; here a
batch of chunks becomes JSON array files that DuckDB parses on every core (``sql/read_events.sql``)
into rows held in memory, then written as rows (``sql/batch_*.sql``) while the next batch is
parsed: no Python touches an event. A statement costs milliseconds whatever its rows: the batches of
several small files are parsed in one statement (:func:`parse_batches`) and written in one per table
(:func:`write_parts`), each row carrying its batch's number (``part``).

Every chunk reaches DuckDB as a scratch file (in memory where ``/dev/shm`` has room): a range of an
uncompressed trace is copied by ``sendfile`` (the bytes stay in the kernel), decompressed bytes are
written. (Named pipes filled by ``splice`` saved the copy, for threads, pipes and a second transport:
5 % of the CPU, BENCHMARKS.md.)
A file goes to :mod:`traceq.ingest.decode` (which handles every case) on explicit signals only, each
raising :class:`NotNative`: DuckDB's JSON reader refused its JSON (malformed, or a value its types
cannot hold), ``sql/batch_counts.sql`` found values the reader would read differently (epoch
microseconds with a fraction, args in both spellings of "External id"), or its scratch files could
not be written (the decoder needs none). Any other error is the file's failure, never a second reading.
"""

from __future__ import annotations

import functools
import itertools
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from traceq import scratch
from traceq.catalog import StepMarker, event_categories
from traceq.ingest.chunks import Chunk, Pieces
from traceq.interrupts import is_interrupt
from traceq.query import params_of, sql_text
from traceq.store.schema import execute_over

# Bytes of JSON parsed per statement: several files, so that DuckDB parses them on all its threads.
# Every batch costs CPU of its own, each costs memory (its scratch files too, until it is written).
# 96 MB: 208-300 MiB peak RSS on three 500 MB traces (with ingest's 160 MB buffer pool) where 192 MB
# batches through named pipes took 456; 64 MB saves 25 MiB at 1.5 GB for 3.5-6 % more time
# (BENCHMARKS.md, issue 23).
BATCH_BYTES = 96 << 20
# Traces of 2021 spell it "external id" on some events; one struct type cannot hold both spellings: a
# batch file with events whose args lack "External id" is searched for the other (count_batches).
_LOWERCASE_EXTERNAL_ID = b'"external id"'
# The phase of the element written first and last in each batch file: the count of its elements is the
# difference of their ordinalities (sql/batch_counts.sql), the dropped ones having no row (sql/read_events.sql).
BOUND_PH = "traceq:bound"
_BOUND = b'{"ph": "%s"}' % BOUND_PH.encode()


class NotNative(Exception):
    """This file needs :mod:`traceq.ingest.decode` (the message says why)."""


@dataclass
class BatchCounts:
    """What one batch held (``sql/batch_counts.sql``)."""

    events: int
    gpu: int
    host: int
    host_plain_ops: int  # of host, CPU operators kept only because all_ops
    dropped: int
    dropped_plain_ops: int  # of dropped, CPU operators kept only because all_ops
    skipped_ops: int
    rows_without_rank: int
    rows_with_rank: int
    unsure_files: list[str]  # files with events whose args lack "External id"
    odd: bool

    @classmethod
    def empty(cls) -> BatchCounts:
        """A batch without rows (its files hold an empty array)."""
        return cls(0, 0, 0, 0, 0, 0, 0, 0, 0, [], False)


# the tables one parsed batch writes besides names, and the SELECT of their rows (columns by name)
_BATCH_ROWS = (
    ("gpu_events", "batch_gpu_events.sql"),
    ("host_events", "batch_host_events.sql"),
    ("trace_threads", "batch_threads.sql"),
)


class Executor:
    """How the ingest runs DuckDB: the one seam where a test injects a fault (a subclass given to
    :func:`traceq.ingest.ingest_traces` as ``executor``), never a name patched in an importing module.

    :meth:`parse` runs a batch's ``sql/read_events.sql`` (on the reading thread's cursor), :meth:`run`
    a statement over parsed rows (counts, writes), and :meth:`step` is called before each of the
    writer's other steps: ``"traces row"`` (one file's, ``paths`` of one) and ``"steps"`` (the steps,
    step attribution and side files of the files of a transaction)."""

    def parse(self, cursor: duckdb.DuckDBPyConnection, statement: str, params: dict[str, Any]) -> Any:
        """The rows of ``statement`` (a parse), as a materialized relation of ``cursor``."""
        return cursor.sql(statement, params=params).materialize()

    def run(self, con: duckdb.DuckDBPyConnection, statement: str, params: dict[str, Any], rows: Any) -> list[tuple]:
        """The result rows of ``statement``, which reads ``rows`` as ``_rows`` (:func:`execute_over`)."""
        return execute_over(con, statement, params, rows)

    def step(self, name: str, paths: list[Path]) -> None:
        """Called before the writer's step ``name`` for the files ``paths``."""


def _run(executor: Executor, con: Any, statement: str, params: dict[str, Any], events: Any = None) -> list[tuple]:
    """Execute ``statement`` with the named parameters it uses, reading the parsed batch ``events``
    (:func:`parse_batch`) as ``_rows``."""
    try:
        return executor.run(con, statement, params_of(statement, params), events)
    except duckdb.Error as exc:
        raise _not_native(exc) from None


def _not_native(exc: duckdb.Error) -> BaseException:
    """What to raise for DuckDB's error. :class:`NotNative` (decode the file another way) only where
    DuckDB refused the file's input (``InvalidInputException``: its JSON reader's malformed JSON or a
    value its types cannot hold, or such a value in the statements over the parsed rows); an
    interrupted statement is an interruption (Ctrl-C must stop the ingest, never change its path);
    every other error (out of memory, a full disk, a lock held, a statement of traceq's that failed)
    is raised as it is: the file fails, and is never read a second way."""
    if is_interrupt(exc):
        return KeyboardInterrupt()
    if isinstance(exc, duckdb.InvalidInputException):
        return NotNative(str(exc).splitlines()[0])
    return exc


def scratch_base() -> str:
    """Where batch files go: in memory (``/dev/shm``) where the machine has one with room for a few
    batches (containers often give it 64 MB), else the temp directory."""
    return scratch.scratch_base(4 * BATCH_BYTES)


def scratch_dir() -> scratch.ScratchDir:
    """A private directory for batch files in :func:`scratch_base` (:class:`traceq.scratch.ScratchDir`)."""
    return scratch.scratch_dir(scratch_base())


# batch numbers: each batch's rows carry its own (read_events.sql's `part`)
_BATCH_NUMBERS = itertools.count()


@dataclass
class BatchFiles:
    """One batch of chunks as the JSON array files DuckDB parses (``names``), deleted by :meth:`remove`."""

    names: list[str] = field(default_factory=list)
    largest: int = 0  # bytes of the largest file: no event is larger
    bytes: int = 0  # of all its files
    part: int = field(default_factory=lambda: next(_BATCH_NUMBERS))  # its number, unique in the process

    def add(self, name: str, size: int) -> None:
        self.names.append(name)
        self.largest = max(self.largest, size)
        self.bytes += size

    def holds(self, name: str, text: bytes) -> bool:
        """Whether the JSON of file ``name`` holds ``text``: looked for in place (mapped, not read
        into memory: a batch of fresh 8 MB buffers costs more in page faults than the search)."""
        with open(name, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(text) >= 0

    def remove(self) -> None:
        """Delete the scratch files (those that exist: a batch cut short wrote fewer)."""
        for name in self.names:
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass


def batch_files(chunks: Iterator[Chunk], directory: str, batch_bytes: int | None = None) -> Iterator[BatchFiles]:
    """The chunks (bytes, or ranges of the trace file) as the JSON array files of batches of about
    ``batch_bytes`` (default :data:`BATCH_BYTES`; the consumer deletes them, :meth:`BatchFiles.remove`)."""
    batch_bytes = BATCH_BYTES if batch_bytes is None else batch_bytes
    batch, size = BatchFiles(), 0
    for n, chunk in enumerate(chunks):
        name = os.path.join(directory, f"{n}.json")
        batch.add(name, len(chunk) + 2 * len(_BOUND) + 4)
        _write_array(name, chunk, directory)
        size += len(chunk)
        if size >= batch_bytes:
            yield batch
            batch, size = BatchFiles(), 0
    if batch.names:
        yield batch


def _write_array(name: str, chunk: Chunk, directory: str) -> None:
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"[" + _BOUND + b",")
            (Pieces((chunk,)) if isinstance(chunk, bytes) else chunk).copy_to(fd)
            os.write(fd, b"," + _BOUND + b"]")
        finally:
            os.close(fd)
    except OSError as exc:  # e.g. a full temp directory: traceq.ingest.decode needs no scratch files
        raise NotNative(f"cannot write scratch files in {directory} ({exc.strerror or exc})") from None


def parser(con: Any) -> Any:
    """A cursor of ``con`` for :func:`parse_batch` in another thread (it holds the macros the parse
    uses; ``con`` keeps writing meanwhile)."""
    cursor = con.cursor()
    cursor.execute(sql_text("macros.sql"))
    return cursor


def parse_batch(
    con: Any, files: BatchFiles, all_ops: bool, marker: StepMarker = StepMarker(), executor: Executor = Executor(),
) -> Any:
    """Parse ``files`` (``sql/read_events.sql``) into a materialized relation, one row per event,
    that statements on ``con``'s connection read as ``_rows``. (Per 500 MB: 0.14 CPU s less than an
    Arrow table, which was 0.5 s less than a DuckDB temp table, and no pyarrow import.) ``all_ops``:
    keep every CPU operator, not only the step markers (``marker``) and those with collective args.

    Raises :class:`NotNative` when DuckDB cannot parse them.
    """
    return parse_batches(con, [(files, all_ops)], marker, executor)


def parse_batches(
    con: Any, batches: list[tuple[BatchFiles, bool]], marker: StepMarker = StepMarker(), executor: Executor = Executor(),
) -> Any:
    """Parse several batches (their files, and ``all_ops`` for each) in one statement, as
    :func:`parse_batch`: each row's ``part`` tells its batch. A statement costs milliseconds
    whatever its rows (13 ms to parse 50 events, 22 a 1.3 MB file): the batches of small files are
    parsed several at a time (BENCHMARKS.md)."""
    names = [name for files, _ in batches for name in files.names]
    read = sql_text("read_events.sql")
    params = {
        "files": names,
        "file_parts": [files.part for files, _ in batches for _ in files.names],
        "file_all_ops": [all_ops for files, all_ops in batches for _ in files.names],
        "max_object_bytes": max(files.largest for files, _ in batches) + 1,
        "bound_ph": BOUND_PH,
        **event_categories().sql_params(), **marker.sql_params(),
    }
    try:
        return executor.parse(con, read, params_of(read, params))
    except duckdb.Error as exc:
        raise _not_native(exc) from None


@dataclass
class Part:
    """How to write the rows of one parsed batch (:func:`write_parts`): as rows of trace ``trace_id``;
    ``next_name_id``, the trace's next name id (the names of its earlier batches are in); ``fill_rank``,
    the rank of events that name none (None: filled later); ``keep_plain_ops``: False leaves out the
    CPU operators parsed with ``all_ops`` (the trace showed device activity since; their names are
    still written, as when they are deleted later)."""

    files: BatchFiles
    trace_id: int
    next_name_id: int = 0
    fill_rank: int | None = None
    keep_plain_ops: bool = True


def rows_of(con: Any, batches: list[tuple[Any, int]]) -> Any:
    """The parsed rows of ``batches`` (each its relation from :func:`parse_batch` or
    :func:`parse_batches`, and its ``part``) as one relation that statements on ``con`` read: the
    relation itself where they were all parsed together, else the rows of their parts copied into
    one (16 relations read in one statement took 85 ms to count where their copy took 34 and its
    count 6)."""
    relations = {id(events): events for events, _ in batches}  # batches parsed together share one
    if len(relations) == 1:
        return batches[0][0]
    _rows = functools.reduce(lambda a, b: a.union(b), (_on(con, events) for events in relations.values()))
    parts = [part for _, part in batches]  # not the other parts of those relations (other groups')
    return con.sql("select * from _rows where list_contains($parts, part)", params={"parts": parts}).materialize()


def _on(con: Any, rows: Any) -> Any:
    """A relation of ``con`` over ``rows`` (a relation of the parse cursor, which may be parsing the
    next batch meanwhile: a step on the relation itself would wait for it, and refuses)."""
    _rows = rows  # read by DuckDB's replacement scan
    return con.sql("select * from _rows")


def count_batches(con: Any, rows: Any, batches: list[BatchFiles], executor: Executor = Executor()) -> list[BatchCounts]:
    """What each batch (``batches``, parsed into ``rows``: :func:`rows_of`) holds, in one statement
    for them all (``sql/batch_counts.sql``).

    Raises :class:`NotNative` when a row needs :mod:`traceq.ingest.decode`.
    """
    by_part = {row[0]: BatchCounts(*row[1:]) for row in _run(executor, con, sql_text("batch_counts.sql"), {}, rows)}
    if None in by_part:  # a row of no batch: DuckDB named a file otherwise than it was given
        raise NotNative("rows DuckDB's JSON reader gave no batch file's name")
    counts = [by_part.get(files.part) or BatchCounts.empty() for files in batches]
    for files, c in zip(batches, counts):
        for name in c.unsure_files:
            if files.holds(name, _LOWERCASE_EXTERNAL_ID):
                raise NotNative('args with "external id" (2021 traces), which the JSON reader does not read')
        if c.odd:
            raise NotNative("values that DuckDB's JSON reader would read differently (e.g. epoch microseconds with a fraction)")
    return counts


def write_batches(con: Any, batches: list[tuple[Any, Part]], executor: Executor = Executor()) -> tuple[list[BatchCounts], int]:
    """Count (:func:`count_batches`) and write (:func:`write_parts`) parsed batches, each its relation and
    how to write it, one batch per trace; returns each one's counts and how many new names they added. A
    batch that shows GPU activity writes none of the CPU operators parsed with it (its part's
    ``keep_plain_ops`` is cleared)."""
    rows = rows_of(con, [(events, p.files.part) for events, p in batches])
    counts = count_batches(con, rows, [p.files for _, p in batches], executor)
    for (_, p), c in zip(batches, counts):
        p.keep_plain_ops = p.keep_plain_ops and not c.gpu
    return counts, write_parts(con, rows, [p for _, p in batches], executor)


def write_parts(con: Any, rows: Any, parts: list[Part], executor: Executor = Executor()) -> int:
    """Write the parsed ``rows`` (:func:`rows_of`) of the batches ``parts``, one statement per table for
    them all; returns how many new names they added. One batch per trace: the name ids of a
    trace's batch depend on the names written before it."""
    if len({p.trace_id for p in parts}) != len(parts):
        raise ValueError("write_parts: two batches of one trace (write them one after the other)")
    params = {
        "parts": [p.files.part for p in parts],
        "trace_ids": [p.trace_id for p in parts],
        "next_name_ids": [p.next_name_id for p in parts],
        "fill_ranks": [p.fill_rank for p in parts],
        "keep_plain_ops": [p.keep_plain_ops for p in parts],
        "first_trace": min(p.trace_id for p in parts), "last_trace": max(p.trace_id for p in parts),
        **event_categories().sql_params(),
    }
    added = _run(executor, con, f"insert into names by name {sql_text('batch_names.sql')}", params, rows)[0][0]
    for table, statement in _BATCH_ROWS:
        _run(executor, con, f"insert into {table} by name {sql_text(statement)}", params, rows)
    return added
