"""The parse stage: a file's job (:class:`~traceq.ingest.plan.FileJob`) -> its batches of the rows of
``sql/read_events.sql``, parsed by DuckDB (:mod:`traceq.ingest.native`) or decoded chunk by chunk
(:mod:`traceq.ingest.decode`), behind one interface (:class:`ParsedFile`). It knows no writer.

:class:`Parser` reads a job in place; :class:`ReadAhead` runs it on one thread ahead of the writer,
within a budget of batches and bytes: the small files of a group parsed in one statement, a large
file batch by batch while the writer takes the one before."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass
from typing import Any, TypeVar

import duckdb

from traceq import scratch
from traceq.catalog import StepMarker
from traceq.errors import TraceFormatError, TraceqError
from traceq.ingest.native import (
    BatchFiles,
    Executor,
    NotNative,
    batch_files,
    parse_batch,
    parse_batches,
    parser,
    scratch_dir,
)
from traceq.ingest.plan import FileJob
from traceq.ingest.reader import TraceHeader, read_trace, read_trace_ranges
from traceq.ingest.results import Progress


class NeedsOps(Exception):
    """A file parsed without CPU operators turned out to have no GPU activity: read it again."""


def all_ops_of(leading: dict[str, Any], forced: bool | None = None) -> bool:
    """Whether a file's batches are parsed with every CPU operator, from its header (``forced``: as
    given). CPU operators are most of a trace's events, yet on a trace with GPU activity no metric
    reads them (:func:`traceq.ingest.decode.events_to_rows`): a file is parsed without them when its
    header has ``deviceProperties`` (Kineto writes it before the events on CUDA/ROCm machines). One
    without them that shows no GPU activity after all is read again with them (:class:`NeedsOps`); one
    with them that shows GPU activity writes none from its first batch with GPU rows on, and those
    written before go once its events are in (:func:`traceq.ingest.write.drop_plain_ops`)."""
    return not leading.get("deviceProperties") if forced is None else forced


# What a file's parse or write may end in that is the file's alone (the writer decodes it, reads it
# again with every CPU operator, or fails it: duckdb.Error is the machine's, out of memory or a full
# disk); an interrupt is none of them
FILE_ERRORS = (NotNative, NeedsOps, TraceqError, duckdb.Error)

# Chunks the reader cuts a file into (bytes of JSON); traceq.ingest.native parses several per statement.
INGEST_CHUNK_BYTES = 8 << 20
MIN_CHUNK_BYTES = 1 << 20
# Bytes of JSON decoded (traceq.ingest.decode) to a batch: a statement of the writer costs ms
# whatever its rows, and decoded rows take less memory than the chunks' Python objects (BENCHMARKS.md)
DECODE_BATCH_BYTES = 16 << 20
# Bytes of JSON decoded at once: its events are Python objects until their rows are made (a chunk of 2 MB
# of `{}` is half a million of them, 45 MB)
DECODE_CHUNK_BYTES = 2 << 20

Counted = TypeVar("Counted", bound=Sized)  # a chunk of either reader (read_trace, read_trace_ranges)


@dataclass(frozen=True)
class Batch:
    """Parsed rows: by DuckDB, a relation on the parse cursor (with other files' batches where a group
    was parsed in one statement) and its scratch ``files``; decoded, an Arrow table of the same columns
    and no files. ``part`` (``files.part``) tells its rows."""

    files: BatchFiles
    rows: Any


def _nothing() -> None:
    pass


@dataclass
class ParsedFile:
    """A job read: its header (``fields`` complete once its batches are taken), whether its batches
    hold every CPU operator (``all_ops``), the batches (a list where the file is held whole, to be
    written again alone; else an iterator, each batch once) or the ``error`` that stopped its reading.
    ``decoded``: why :mod:`traceq.ingest.decode` read it (None: DuckDB did). :meth:`close` stops the
    reading and removes its scratch files."""

    job: FileJob
    all_ops: bool = True
    header: TraceHeader | None = None
    batches: Iterable[Batch] = ()
    error: Exception | None = None
    decoded: str | None = None
    stop: Callable[[], None] = _nothing

    @property
    def held(self) -> bool:
        return isinstance(self.batches, list)

    def close(self) -> None:
        stop, self.stop = self.stop, _nothing
        try:
            if not self.held and hasattr(self.batches, "close"):
                self.batches.close()  # a generator: its reading stops (the file it reads is closed)
        finally:
            stop()


class Scratch:
    """The scratch directories of an ingest's batch files (both threads make them): each is removed
    as soon as its file is done, and by :meth:`cleanup` whatever happened in between."""

    def __init__(self) -> None:
        self._made: list[scratch.ScratchDir] = []
        self._lock = threading.Lock()

    def make(self) -> scratch.ScratchDir:
        directory = scratch_dir()
        with self._lock:
            self._made.append(directory)
        return directory

    def cleanup(self) -> None:
        with self._lock:
            made, self._made = self._made, []
        for directory in made:
            directory.cleanup()


class Parser:
    """Reads jobs into :class:`ParsedFile`, on a cursor of its own of the writer's connection ``con``
    (used by one thread), through ``executor`` (the fault seam); ``notify`` hears the bytes read."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, executor: Executor, marker: StepMarker, chunk_bytes: int,
        directories: Scratch, notify: Progress,
    ) -> None:
        self.cursor, self.executor, self.marker = parser(con), executor, marker
        self.chunk_bytes, self.threads = chunk_bytes, self.cursor.execute("select current_setting('threads')").fetchall()[0][0]
        self.directories, self.notify = directories, notify

    def close(self) -> None:
        """Close the cursor (the database stays open while any cursor of it is: at exit, DuckDB's
        threads would be stopped mid-task)."""
        self.cursor.close()

    def interrupt(self) -> None:
        """Stop the statement running on the cursor (from another thread)."""
        self.cursor.interrupt()

    def chunk_bytes_for(self, json_bytes: int) -> int:
        """A small file is cut finer, so that DuckDB still parses it on every thread."""
        return min(self.chunk_bytes, max(MIN_CHUNK_BYTES, json_bytes // (2 * self.threads)))

    def group(self, jobs: list[FileJob]) -> list[ParsedFile]:
        """The small files ``jobs``, each cut into one batch, parsed in one statement. Where DuckDB
        refuses their input, each is parsed alone (the refusal is the file's); any other error of
        DuckDB's (out of memory) is every file's."""
        files = [self._cut(job) for job in jobs]
        cut = [f for f in files if f.error is None]
        rows = None
        try:
            rows = parse_batches(self.cursor, [(b.files, f.all_ops) for f in cut for b in f.batches],
                                 self.marker, self.executor) if len(cut) > 1 else None
        except NotNative:
            pass  # each alone, below
        except duckdb.Error as exc:  # the machine's: each file fails in one line
            for f in cut:
                f.error = exc
            return files
        for f in cut:
            try:
                f.batches = [Batch(b.files, rows if rows is not None else parse_batch(
                    self.cursor, b.files, f.all_ops, self.marker, self.executor)) for b in f.batches]
            except (NotNative, duckdb.Error) as exc:
                f.error = exc
        return files

    def _cut(self, job: FileJob) -> ParsedFile:
        directory = None
        try:
            header, chunks = read_trace_ranges(job.path, self.chunk_bytes_for(job.json_bytes))
            f = ParsedFile(job, all_ops_of(header.leading), header)
            directory = self.directories.make()
            f.stop = directory.cleanup
            f.batches = [Batch(files, None) for files in batch_files(self._counting(chunks, job), directory.name)]
        except (NotNative, TraceqError) as exc:
            if directory is not None:
                directory.cleanup()
            return ParsedFile(job, error=exc)
        return f

    def alone(self, job: FileJob, all_ops: bool | None = None) -> ParsedFile:
        """``job`` parsed batch by batch as its batches are taken (``all_ops``: as given, else as its
        header says)."""
        try:
            header, chunks = read_trace_ranges(job.path, self.chunk_bytes_for(job.json_bytes))
        except TraceqError as exc:
            return ParsedFile(job, error=exc)
        ops = all_ops_of(header.leading, all_ops)
        directory = self.directories.make()

        def batches() -> Iterator[Batch]:
            for files in batch_files(self._counting(chunks, job), directory.name):
                yield Batch(files, parse_batch(self.cursor, files, ops, self.marker, self.executor))

        return ParsedFile(job, ops, header, batches(), stop=directory.cleanup)

    def decoded(self, job: FileJob, all_ops: bool | None, why: str) -> ParsedFile:
        """``job`` decoded by :mod:`traceq.ingest.decode` in this thread, chunk by chunk as its
        batches are taken (``why``: what sent it there)."""
        try:
            header, chunks = read_trace(job.path, min(self.chunk_bytes, DECODE_CHUNK_BYTES))
        except TraceqError as exc:
            return ParsedFile(job, error=exc, decoded=why)
        ops = all_ops_of(header.leading, all_ops)
        return ParsedFile(job, ops, header, decoded_batches(self._counting(chunks, job), ops, self.marker), decoded=why)

    def again(self, f: ParsedFile, failure: Exception) -> ParsedFile | Exception:
        """What ``f``'s ``failure`` calls for: ``f`` read another way (decoded where DuckDB refused its
        input; with every CPU operator where it showed no GPU activity), or the error it fails with
        (any other: out of memory, a full disk, a bad trace are never a reason to read again)."""
        f.close()
        if isinstance(failure, NeedsOps):
            return self.decoded(f.job, True, f.decoded) if f.decoded else self.alone(f.job, True)
        if not isinstance(failure, NotNative):
            return failure
        if f.decoded is None:
            return self.decoded(f.job, f.all_ops, str(failure))
        return TraceFormatError(f"{f.job.path}: DuckDB refused the rows traceq.ingest.decode read ({failure}); "
                                "nothing was stored. Please report it, with the file")

    def _counting(self, chunks: Iterator[Counted], job: FileJob) -> Iterator[Counted]:
        """Pass chunks through; once they are all read, say the file's bytes (the progress bar's unit)."""
        yield from chunks
        self.notify("file_read", {"bytes": job.size, "path": str(job.path)})


def decoded_batches(
    chunks: Iterator[bytes], all_ops: bool, marker: StepMarker, batch_bytes: int = DECODE_BATCH_BYTES,
) -> Iterator[Batch]:
    """``chunks`` decoded by :mod:`traceq.ingest.decode`: the rows DuckDB's parse gives
    (``sql/read_events.sql``), as Arrow, for the one writer; batches of no files. Each chunk's rows
    are made as it is decoded (its Python objects go with it); several chunks' rows, up to
    ``batch_bytes`` of JSON, are written together."""
    import pyarrow as pa

    from traceq.ingest.decode import decode_chunk

    files, tables, size = BatchFiles(), [], 0
    for chunk in chunks:
        tables.append(decode_chunk(chunk, all_ops, marker, files.part, len(tables) + 1))
        size += len(chunk)
        if size >= batch_bytes:
            yield Batch(files, pa.concat_tables(tables))
            files, tables, size = BatchFiles(), [], 0
    if tables:
        yield Batch(files, pa.concat_tables(tables))
