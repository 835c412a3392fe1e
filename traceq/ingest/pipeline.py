"""The parse stage: a file's job (:class:`~traceq.ingest.plan.FileJob`) -> its batches of the rows of
``sql/read_events.sql``, parsed by DuckDB (:func:`parse_batches`: the chunks as files,
:mod:`traceq.ingest.native`) or decoded chunk by chunk (:mod:`traceq.ingest.decode`), behind one
interface (:class:`~traceq.ingest.readahead.ParsedFile`). It knows no writer.

:class:`Parser` reads a job in place; :class:`~traceq.ingest.readahead.ReadAhead` runs one on its own
thread ahead of the writer, within a budget of batches and bytes: the small files of a group parsed in one
statement, a large file batch by batch while the writer takes the one before."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sized
from typing import Any, TypeVar

import duckdb

from traceq.catalog import StepMarker, event_categories
from traceq.errors import TraceFormatError, TraceqError
from traceq.ingest.native import (
    BOUND_PH,
    BatchFiles,
    Executor,
    NeedsOps,
    NotNative,
    batch_files,
    not_native,
)
from traceq.ingest.plan import FileJob
from traceq.ingest.readahead import Batch, ParsedFile, Scratch
from traceq.ingest.reader import read_trace, read_trace_ranges
from traceq.query import params_of, sql_text

Progress = Callable[[str, dict[str, Any]], None]  # progress(event, info): "start", "bytes", "file_read", "done"


def all_ops_of(leading: dict[str, Any], forced: bool | None = None) -> bool:
    """Whether a file's batches are parsed with every CPU operator, from its header (``forced``: as
    given). CPU operators are most of a trace's events, yet on a trace with GPU activity no metric
    reads them (:func:`traceq.ingest.decode.events_to_rows`): a file is parsed without them when its
    header has ``deviceProperties`` (Kineto writes it before the events on CUDA/ROCm machines). One
    without them that shows no GPU activity after all is read again with them (:class:`NeedsOps`); one
    with them that shows GPU activity writes none from its first batch with GPU rows on, and those
    written before go once its events are in (:func:`traceq.ingest.write.drop_plain_ops`)."""
    return not leading.get("deviceProperties") if forced is None else forced


# Chunks the reader cuts a file into (bytes of JSON); several are parsed per statement.
INGEST_CHUNK_BYTES = 8 << 20
MIN_CHUNK_BYTES = 1 << 20
# Bytes of JSON decoded (traceq.ingest.decode) to a batch: a statement of the writer costs ms
# whatever its rows, and decoded rows take less memory than the chunks' Python objects (BENCHMARKS.md)
DECODE_BATCH_BYTES = 16 << 20
# Bytes of JSON decoded at once: its events are Python objects until their rows are made (a chunk of 2 MB
# of `{}` is half a million of them, 45 MB)
DECODE_CHUNK_BYTES = 2 << 20

# Scans of a batch's files side by side (sql/read_events.sql), each a run of its files on one thread: one scan of
# them all took 1.7x the time on two cores (its ordinality numbers rows on one thread), and each scan holds 32 MB
# or more of the ingest's pool beside the rows parsed: at 8 threads, 3 ran 512 small files out of the 128 MB pool
# and 4 the corpus out of 160 MB; 2 ran both
PARSE_SCANS = 2

Counted = TypeVar("Counted", bound=Sized)  # a chunk of either reader (read_trace, read_trace_ranges)


def parser(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A cursor of ``con`` for :func:`parse_batch` (``con`` keeps writing meanwhile)."""
    return prepared(con.cursor())


def prepared(cursor: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """``cursor``, holding the macros the parse uses."""
    cursor.execute(sql_text("macros.sql"))
    return cursor


@functools.lru_cache(maxsize=64)
def read_events(files: int, scans: int) -> str:
    """``sql/read_events.sql`` for ``files`` files read by ``scans`` scans (at most; each of a run of
    them) joined by ``union all``: DuckDB runs them side by side, where one scan of them all would number
    the elements (its ``ordinality``) on one thread."""
    text = sql_text("read_events.sql")
    start = text.index("    select *, list_position($files, filename) as file_no\n")
    end = text.index(") with ordinality", start) + len(") with ordinality")
    scan, runs = text[start:end], [list(r) for r in _runs(range(1, files + 1), scans)]
    each = [scan.replace("$files[1:]", f"$files[{r[0]}:{r[-1]}]") for r in runs]
    return text[:start] + "\n    union all\n".join(each) + text[end:]


def _runs(items: range, n: int) -> list[range]:
    """``items`` in ``n`` runs (fewer where there are fewer items), as even as can be."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    starts = [i * size + min(i, extra) for i in range(n + 1)]
    return [items[a:b] for a, b in zip(starts, starts[1:])]


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
    read = read_events(len(names), PARSE_SCANS)
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
        raise not_native(exc) from None


class Parser:
    """Reads jobs into :class:`ParsedFile`, on ``cursor`` (a cursor of the writer's connection, used by
    this parser's thread alone), through ``executor`` (the fault seam); ``notify`` hears the bytes read."""

    def __init__(
        self, cursor: duckdb.DuckDBPyConnection, executor: Executor, marker: StepMarker, chunk_bytes: int,
        directories: Scratch, notify: Progress,
    ) -> None:
        self.cursor, self.executor, self.marker = prepared(cursor), executor, marker
        self.chunk_bytes, self.threads = chunk_bytes, self.cursor.execute("select current_setting('threads')").fetchall()[0][0]
        self.directories, self.notify = directories, notify

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
