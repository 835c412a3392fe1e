"""Ingest: Kineto trace files (and the collectors' side files) into the warehouse.

The pipeline of a file: :mod:`~traceq.ingest.plan` (which files the inputs name, and a
:class:`~traceq.ingest.plan.FileJob` each, made once: its size, run, whether it is in already) ->
:mod:`~traceq.ingest.pipeline` (the parse stage: :mod:`~traceq.ingest.reader` cuts the event array into
chunks, :mod:`~traceq.ingest.native` has DuckDB parse batches of them, or :mod:`~traceq.ingest.decode`,
the msgspec reference, gives the same rows), run ahead on one thread by :mod:`~traceq.ingest.readahead`
-> :func:`~traceq.ingest.loader.write_group` (each group of files all or nothing, one failure rule) by
the one :class:`~traceq.ingest.writer.Writer` (its rows through :mod:`~traceq.ingest.native`'s
statements, its counts, rank and traces row) -> :mod:`~traceq.ingest.write` (steps, step attribution,
side files: :mod:`~traceq.ingest.sidecar`). :mod:`~traceq.ingest.identity` decides a file's rank and
run; :mod:`~traceq.ingest.loader` is the entry (:func:`ingest_traces`); :mod:`~traceq.ingest.digests`
tells a file's content; :mod:`~traceq.ingest.results` is what an ingest says.
:mod:`~traceq.ingest.cluster` runs the same per file on a Dask cluster.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from traceq.ingest.plan import expand_inputs
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
