"""DuckDB's fast path, no Python touching an event: a trace's chunks of whole events as the JSON array
files DuckDB parses on every core (:func:`batch_files`; in memory where ``/dev/shm`` has room: a range of
an uncompressed trace copied by ``sendfile``, decompressed bytes written; the parse is
:func:`traceq.ingest.pipeline.parse_batches`), and the statements over the parsed rows
(``sql/batch_*.sql``): a group's files round by round (:func:`write_rows`), the batches of several small
files in one statement per table (:func:`write_parts`), each row carrying its batch's number (``part``).
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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from traceq import scratch
from traceq.catalog import event_categories
from traceq.errors import TraceFormatError
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


class NeedsOps(Exception):
    """A file parsed without CPU operators turned out to have no GPU activity: read it again."""


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


# A file is refused once it has read this many events and more than MAX_UNUSABLE_SHARE of them are none traceq
# stores or leaves out by its policy (CPU operators of a GPU trace): checked after every batch, wherever the
# unusable events sit (the corpus's largest share is 0.89, of a 75-event trace; 0.57 over 250 events or more)
UNUSABLE_EVENTS = 1_000_000
MAX_UNUSABLE_SHARE = 0.99


@dataclass
class Counts:
    """A file's running totals over its batches."""

    events: int = 0
    gpu: int = 0
    host: int = 0
    dropped: int = 0
    dropped_plain_ops: int = 0  # of dropped, CPU operators kept only because all_ops
    rows_with_rank: int = 0  # events carrying their own args.rank
    rows_without_rank: int = 0
    skipped_ops: int = 0  # CPU operators left out while decoding (all_ops=False)
    left_out: int = 0  # events left out by policy: skipped_ops, and CPU operators written after GPU activity
    kept_ops: bool = False  # some batch was written with all_ops=True

    def add_batch(self, b: BatchCounts, all_ops: bool) -> None:
        """Count a batch written with its CPU operators (``all_ops``) or without."""
        self.events += b.events
        self.gpu += b.gpu
        self.host += b.host - (0 if all_ops else b.host_plain_ops)
        self.dropped += b.dropped - (0 if all_ops else b.dropped_plain_ops)
        self.dropped_plain_ops += b.dropped_plain_ops if all_ops else 0
        self.skipped_ops += b.skipped_ops
        self.left_out += b.skipped_ops + (0 if all_ops else b.host_plain_ops + b.dropped_plain_ops)
        self.kept_ops = self.kept_ops or all_ops
        self.rows_without_rank += b.rows_without_rank
        self.rows_with_rank += b.rows_with_rank

    def require_usable(self, path: Path) -> None:
        """TraceFormatError once :data:`UNUSABLE_EVENTS` events are read and more than :data:`MAX_UNUSABLE_SHARE`
        of them are not stored (a gzip of ``{}`` by the hundred million, one kernel first or every 2M, a
        few MB): the file is not read to its end, nor kept."""
        unusable = self.events - self.gpu - self.host - self.left_out
        if self.events >= UNUSABLE_EVENTS and unusable > MAX_UNUSABLE_SHARE * self.events:
            raise TraceFormatError(
                f"{path}: {unusable:,} of its first {self.events:,} events are none that traceq stores (it stores "
                'complete events, "ph": "X", with a valid time and duration; not elements without a phase, nor '
                f"metadata, flow, instant or counter events): with over {MAX_UNUSABLE_SHARE:.0%} unusable it is no profiler trace; "
                "nothing was stored. Check that it is the file the profiler wrote")

    def require_complete(self, path: Path) -> None:
        """Once all of a file's batches are in: TraceFormatError for a file without events, or whose
        events are mostly unusable (:meth:`require_usable`); :class:`NeedsOps` for one parsed without
        its CPU operators that showed no GPU activity."""
        if self.events == 0:
            raise TraceFormatError(f"{path}: the trace holds no events; was the profiler started (schedule active > 0)?")
        self.require_usable(path)
        if self.skipped_ops and not self.gpu:
            raise NeedsOps


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
        raise not_native(exc) from None


def not_native(exc: duckdb.Error) -> BaseException:
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


@dataclass(frozen=True)
class Rows:
    """One file's parsed ``batches`` (a list: held, to be written again; else each batch's files go once
    written), to be written as trace ``trace_id``; ``fill_rank``: the rank of its events that name none
    (None: filled later); ``all_ops``: its batches hold every CPU operator."""

    path: Path
    trace_id: int
    fill_rank: int | None
    all_ops: bool
    batches: Iterable[Any]  # traceq.ingest.readahead.Batch


def write_rows(con: Any, files: list[Rows], executor: Executor = Executor()) -> list[Counts]:
    """The batches of ``files``, round by round: each round the next batch of every file that has one,
    in one statement per table (:func:`write_batches`; a small file has one batch, a large file is
    written alone); each file's counts, once it is complete (:meth:`Counts.require_complete`).
    CPU operators parsed with a file (its header has no deviceProperties) are written until it shows GPU
    activity (those before go at its end: :func:`traceq.ingest.write.drop_plain_ops`)."""
    counts = [Counts() for _ in files]
    names = [0] * len(files)  # each trace's next name id
    live, stale = [(i, iter(f.batches)) for i, f in enumerate(files)], False
    while live:
        taken = [(i, it, b) for i, it in live if (b := next(it, None)) is not None]
        live = [(i, it) for i, it, _ in taken]
        if not taken:
            break
        if stale:  # the name ids of a trace: from its names written in the rounds before
            named = dict(con.execute("select trace_id, count(*) from names where trace_id in (select unnest(?)) "
                                     "group by trace_id", [[files[i].trace_id for i, _, _ in taken]]).fetchall())
            for i, _, _ in taken:
                names[i] = named.get(files[i].trace_id, 0)
        parts = [Part(b.files, files[i].trace_id, names[i], files[i].fill_rank, files[i].all_ops and not counts[i].gpu)
                 for i, _, b in taken]
        batch_counts, added = write_batches(con, [(b.rows, p) for (_, _, b), p in zip(taken, parts)], executor)
        stale = len(taken) > 1
        for (i, _, b), p, c in zip(taken, parts, batch_counts):
            counts[i].add_batch(c, p.keep_plain_ops)
            names[i] += added
            if not isinstance(files[i].batches, list):
                b.files.remove()  # written, and never again
            counts[i].require_usable(files[i].path)
        del taken, b, parts  # the batch's rows go before the next batch is waited for
    for f, c in zip(files, counts):
        c.require_complete(f.path)
    return counts
