"""Ingest: Kineto trace files (and the collectors' side files) into the warehouse.

The pipeline of a file: :mod:`~traceq.ingest.plan` (which files the inputs name, what the user asked,
and a :class:`~traceq.ingest.plan.FileJob` each, made once: its size, run, whether it is in already) ->
:mod:`~traceq.ingest.pipeline` (the parse stage: :mod:`~traceq.ingest.reader` cuts the event array into
chunks, DuckDB parses batches of them as :mod:`~traceq.ingest.native`'s scratch files, or
:mod:`~traceq.ingest.decode`, the msgspec reference, gives the same rows), run on one thread ahead of the
writer by :mod:`~traceq.ingest.readahead` (the hand-off: a :class:`~traceq.ingest.readahead.ParsedFile`
each) -> :func:`~traceq.ingest.loader.write_group` (each group of files all or nothing, one failure rule)
-> the one :class:`~traceq.ingest.writer.Writer`, in one pass: the rows (:mod:`~traceq.ingest.native`'s
statements and counts), each file's rank and run (:mod:`~traceq.ingest.identity`), its traces row and
result, then the steps, step attribution and side files (:mod:`~traceq.ingest.write`,
:mod:`~traceq.ingest.sidecar`). :mod:`~traceq.ingest.loader` is the entry (:func:`ingest_traces`);
:mod:`~traceq.ingest.digests` tells a file's content; :mod:`~traceq.ingest.cluster` runs the same per
file on a Dask cluster. ``benchmarks/walk.py`` follows one small file through it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from traceq.ingest.plan import expand_inputs
from traceq.ingest.loader import IngestSummary, ingest_traces
from traceq.ingest.write import FileResult

__all__ = ["FileResult", "IngestSummary", "expand_inputs", "ingest_traces", "temporary_warehouse"]


@contextmanager
def temporary_warehouse(inputs: Sequence[str | Path]) -> Iterator[tuple[Path, IngestSummary]]:
    """A warehouse of ``inputs`` for the block (``traceq summary FILES``), removed after it:
    (its path, what the ingest did)."""
    with tempfile.TemporaryDirectory(prefix="traceq-summary-") as scratch:
        db = Path(scratch) / "summary.duckdb"
        yield db, ingest_traces(list(inputs), db)
