"""Load Kineto trace files into the warehouse (:func:`ingest_traces`): each file all or nothing,
idempotent by content hash. The stages are in :mod:`traceq.ingest`'s docstring; :func:`load` runs them.

What keeps memory flat whatever the trace size (benchmarks/bench_scale.py measures it):
a few batches in flight; DuckDB's buffer pool is capped
(:data:`INGEST_MEMORY_LIMIT`: appended row groups go to the file as they fill); ranks from
``distributedInfo`` are filled in as rows go in, not by an UPDATE afterwards. Nothing process-wide
is changed (no GC thresholds, no glibc settings: measured, neither pays any more, BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from traceq.catalog import StepMarker, check_parallelism, check_rank, check_run_name
from traceq.errors import ConfigError, TraceqError
from traceq.ingest.native import Executor
from traceq.ingest.pipeline import INGEST_CHUNK_BYTES, Parser, Progress
from traceq.ingest.plan import IngestOptions, expand_inputs, plan
from traceq.ingest.readahead import FILE_ERRORS, ParsedFile, ReadAhead, Scratch
from traceq.ingest.write import INGEST_MEMORY_LIMIT, SMALL_FILES_MEMORY_LIMIT, FileResult
from traceq.ingest.writer import Writer
from traceq.interrupts import interruptible, is_interrupt
from traceq.store.warehouse import DEFAULT_DB, connect, environment_error


@dataclass
class IngestSummary:
    """Per-file results of one :func:`ingest_traces` call."""

    files: list[FileResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the inputs: entries of a directory passed over

    def by_status(self, status: str) -> list[FileResult]:
        return [f for f in self.files if f.status == status]

    @property
    def ok(self) -> bool:
        return not self.by_status("failed")


def ingest_traces(
    inputs: Iterable[str | Path],
    db: str | Path = DEFAULT_DB,
    *,
    name: str | None = None,
    rank: int | None = None,
    threads: int | None = None,
    chunk_bytes: int = INGEST_CHUNK_BYTES,
    progress: Progress | None = None,
    native: bool = True,
    step_marker: str | None = None,
    force: bool = False,
    executor: Executor | None = None,
) -> IngestSummary:
    """Ingest trace files into the warehouse at ``db``.

    Args:
        inputs: files, globs or directories.
        db: DuckDB warehouse path (created if missing).
        name: the name of the run every file goes to (default: each file's parent directory name; a file that
            names no rank and no job is a run of its own, <directory>/<file>: traceq.ingest.identity).
        rank: rank for files that name none (no distributedInfo.rank, no per-event rank).
        threads: DuckDB threads (default: one per CPU; 1 to 4 per CPU); two of them parse a batch side by side.
        chunk_bytes: size of the event chunks the file is cut into (bytes of JSON).
        progress: called as ``progress(event, info)`` for "start", "bytes", "file_read" and "done".
        native: parse with DuckDB where it reads a file the same (:mod:`traceq.ingest.native`); False
            decodes every file with :mod:`traceq.ingest.decode` (the reference the tests compare with).
        step_marker: regular expression naming the steps (default ``ProfilerStep#N``), e.g.
            ``^step\\[DECODE`` (see :class:`traceq.catalog.StepMarker`).
        force: ingest files whose content is in the warehouse already: each one's earlier trace is
            removed in the same transaction (to put it under another run, or read it again).
        executor: runs the ingest's statements (:class:`traceq.ingest.native.Executor`): where tests
            inject faults.

    A file that fails leaves nothing behind; the others still ingest (out of memory or a full disk
    fails the files it touched; an error that is no file's stops the ingest, the files before it in). Re-ingesting a file whose
    content is already in the warehouse is a no-op reported as skipped. A file that names no rank
    gets a rank of its own in its run (-1, -2, ...; noted in its result). A file is refused when its
    run already holds a step of one of its ranks (the same trace twice, or two jobs in one run).
    """
    marker = StepMarker.parse(step_marker)
    check_rank(rank)
    check_parallelism(threads, "threads")
    run = name if name is None else check_run_name(name, "name")
    summary = IngestSummary()
    paths = expand_inputs(inputs, summary.notes)
    options = IngestOptions(run, rank, marker, force)
    notify = progress or (lambda event, info: None)
    with interruptible():  # Ctrl-C stops the ingest, whatever it landed in
        con = connect(db)
        try:
            # row order within a table means nothing to traceq; keeping it would make DuckDB parse the
            # JSON on one thread within the memory limit
            con.execute("set preserve_insertion_order = false")
            con.execute(f"set threads = {(os.cpu_count() or 1) if threads is None else threads}")
            try:
                con.execute("select regexp_matches('', ?)", [marker.pattern])
            except duckdb.Error as exc:
                raise ConfigError(f"not a regular expression DuckDB reads (RE2): {str(exc).splitlines()[0]}",
                                  param="step_marker", value=marker.pattern) from None
            # closed here, whatever stops the loop (Ctrl-C between two results, a progress callback that
            # raises): its reading thread is joined now, not when the generator is collected
            with closing(load(con, paths, options, chunk_bytes=chunk_bytes, notify=notify, native=native,
                              executor=executor or Executor(), pool=True)) as results:
                for result in results:
                    summary.files.append(result)
                    notify("done", {"result": result})
        finally:
            con.close()
    return summary


def load(
    con: duckdb.DuckDBPyConnection, paths: list[Path], options: IngestOptions, *, chunk_bytes: int = INGEST_CHUNK_BYTES,
    notify: Progress = lambda event, info: None, native: bool = True, executor: Executor = Executor(), pool: bool = False,
) -> Iterator[FileResult]:
    """Ingest ``paths`` into the warehouse ``con``, yielding each file's result in plan order: the
    plan made here, the groups parsed ahead on one thread (natively; else decoded here), each written
    by :func:`write_group`. Its scratch directories are removed by the time it is closed. ``pool``: set
    DuckDB's buffer pool for the files planned (a cluster task's in-memory warehouse keeps its own)."""
    with ExitStack() as stack:  # undone in reverse order, whatever stops it
        writer = Writer(con, options, executor)
        stack.callback(writer.close)
        groups = plan(paths, writer.held, options, native=native)
        writer.hash_beside([job for group in groups for job in group])
        notify("start", {"files": sum(map(len, groups)), "bytes": sum(job.size for group in groups for job in group)})
        if pool:
            small = all(job.small or job.done for group in groups for job in group)
            con.execute(f"set memory_limit = '{SMALL_FILES_MEMORY_LIMIT if small else INGEST_MEMORY_LIMIT}'")
        directories = Scratch()
        stack.callback(directories.cleanup)
        here: dict[bool, Parser] = {}  # parsers of this thread, made when first needed, on cursors of their own

        def parser_here(counted: bool) -> Parser:
            """Decodes each file (native=False: ``counted``, its bytes heard), or reads one again (not counted twice)."""
            if counted not in here:
                cursor = stack.enter_context(closing(con.cursor()))  # closed here: an open one keeps the database open
                here[counted] = Parser(cursor, executor, options.marker, chunk_bytes, directories,
                                       notify if counted else lambda event, info: None)
            return here[counted]

        ahead = None
        if native:  # its parser is made and used on the reading thread
            cursor = stack.enter_context(closing(con.cursor()))
            make = functools.partial(Parser, cursor, executor, options.marker, chunk_bytes, directories, notify)
            ahead = stack.enter_context(closing(ReadAhead(make, [g for g in groups if g[0].done is None], cursor.interrupt)))
        again: Again = lambda f, failure: parser_here(False).again(f, failure)  # noqa: E731
        for group in groups:
            if group[0].done is not None:
                if group[0].done.status == "skipped":
                    notify("bytes", {"bytes": group[0].size, "path": str(group[0].path)})
                yield group[0].done
                continue
            files = ahead.next_group(group) if ahead else [parser_here(True).decoded(group[0], None, "native=False")]
            yield from write_group(writer, files, again)


Again = Callable[[ParsedFile, Exception], "ParsedFile | Exception"]  # Parser.again


def write_group(writer: Writer, files: list[ParsedFile], again: Again) -> list[FileResult]:
    """Write ``files`` in one transaction: their rows (one statement per table for them all), traces
    rows and steps; their results, in order.

    A group of several that fails is rolled back and written file by file, from the rows parsed
    (a statement costs milliseconds whatever its rows, and a file about ten: BENCHMARKS.md). One file
    that fails is read again where ``again`` says (DuckDB refused its input: decoded; no GPU activity
    without CPU operators: with them), else fails in one line: a machine error (out of memory, a full
    disk), a bad trace or a run that holds its steps already. An error that is no file's (a bug)
    stops the ingest, the files before it in; Ctrl-C rolls back and stops.
    """
    try:
        try:
            return writer.write(files)
        except BaseException as exc:  # rolled back
            if is_interrupt(exc):  # an error of a statement Ctrl-C stopped: the ingest stops
                raise KeyboardInterrupt from None
            if not isinstance(exc, Exception):
                raise
            failure = exc
        if len(files) > 1:
            return [result for f in files for result in write_group(writer, [f], again)]
        if not isinstance(failure, FILE_ERRORS):
            raise failure
        (f,) = files
        retry = again(f, failure)
        if isinstance(retry, Exception):
            return [failed(f.job.path, retry)]
        return write_group(writer, [retry], again)
    finally:
        for f in files:
            f.close()


def failed(path: Path, exc: Exception) -> FileResult:
    """The failed result of the file at ``path``, in one line."""
    if isinstance(exc, TraceqError):
        return FileResult(str(path), "failed", str(exc))
    if isinstance(exc, duckdb.Error):  # out of memory, a full disk, a lock: this file is not in, nothing of it
        return FileResult(str(path), "failed", f"{path}: {environment_error(exc) or str(exc).splitlines()[0]}")
    return FileResult(str(path), "failed", f"{path}: {exc}")
