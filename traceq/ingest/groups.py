"""The one failure rule of an ingest, in one function (:func:`write_group`): every file is written as
part of a group (a large file is a group of one), all or nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb

from traceq.errors import TraceqError
from traceq.ingest.pipeline import FILE_ERRORS, ParsedFile
from traceq.ingest.results import FileResult
from traceq.ingest.writer import Writer
from traceq.interrupts import is_interrupt
from traceq.store.warehouse import environment_error

Again = Callable[[ParsedFile, Exception], "ParsedFile | Exception"]  # traceq.ingest.pipeline.Parser.again


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
            writer.begin()
            results = writer.write(files)
            writer.commit()
            return results
        except BaseException as exc:
            writer.roll_back()
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
