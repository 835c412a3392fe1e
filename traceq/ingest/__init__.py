"""Ingest: Kineto trace files (and the collectors' side files) into the warehouse.

The pipeline of a file: :mod:`~traceq.ingest.inputs` (which files, which run) ->
:mod:`~traceq.ingest.reader` (cut the event array into chunks) -> :mod:`~traceq.ingest.native` (DuckDB
parses batches of chunks) or :mod:`~traceq.ingest.decode` (the msgspec reference, its rows the same) ->
:mod:`~traceq.ingest.pipeline` (batches parsed ahead of the writer, across files) ->
:mod:`~traceq.ingest.loader` (each file all or nothing, in one transaction; small files several to one,
:mod:`~traceq.ingest.groups`) -> :mod:`~traceq.ingest.write` (a file's counts, rank and traces row; steps
and step attribution by :mod:`traceq.store.derive`) -> :mod:`~traceq.ingest.sidecar` (run.json, power
logs). :mod:`~traceq.ingest.digests` tells the files the warehouse holds already;
:mod:`~traceq.ingest.results` is what an ingest says.
:mod:`~traceq.ingest.cluster` runs the same per file on a Dask cluster.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from traceq.ingest.inputs import expand_inputs
from traceq.ingest.loader import ingest_traces
from traceq.ingest.results import FileResult, IngestSummary

__all__ = ["FileResult", "IngestSummary", "expand_inputs", "ingest_traces", "temporary_warehouse"]


@contextmanager
def temporary_warehouse(inputs: Sequence[str | Path]) -> Iterator[tuple[Path, IngestSummary]]:
    """A warehouse of ``inputs`` for the block (``traceq summary FILES``), removed after it:
    (its path, what the ingest did)."""
    with tempfile.TemporaryDirectory(prefix="traceq-summary-") as scratch:
        db = Path(scratch) / "summary.duckdb"
        yield db, ingest_traces(list(inputs), db)
