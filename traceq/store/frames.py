"""Results of DuckDB as polars frames, and polars loaded while DuckDB works."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    import polars as pl


@contextmanager
def import_in_background(module: str) -> Iterator[None]:
    """Import ``module`` in a thread while the block runs (DuckDB releases the GIL while it executes a
    query); the block's own ``import`` of it waits for that thread, and so does leaving the block."""
    thread = threading.Thread(target=_import_quietly, args=(module,), name=f"traceq-import-{module}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _import_quietly(module: str) -> None:
    try:
        importlib.import_module(module)
    except BaseException:  # the import in the main thread raises it again, where it is handled
        pass


def to_polars(relation: duckdb.DuckDBPyRelation) -> pl.DataFrame:
    """The rows of ``relation`` as a polars DataFrame, through the Arrow PyCapsule stream.

    ``relation.pl()`` goes through a pyarrow Table, and importing pyarrow (with numpy) was 0.1 s of
    a 0.7 s ``traceq report``; polars reads the stream itself.
    """
    import polars as pl

    return pl.DataFrame(_ArrowStream(relation))


class _ArrowStream:
    """Only the Arrow stream of a relation, for polars (handed the relation itself, polars looks at
    more of it, and DuckDB 2.0's binding then reports leaked objects when the interpreter exits)."""

    __slots__ = ("relation",)

    def __init__(self, relation: duckdb.DuckDBPyRelation) -> None:
        self.relation = relation

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.relation.__arrow_c_stream__(requested_schema)


def to_polars_bounded(relation: duckdb.DuckDBPyRelation, max_bytes: int, batch_rows: int = 2048) -> tuple[pl.DataFrame, bool]:
    """The first rows of ``relation`` that fit ``max_bytes`` of Arrow memory, as a polars DataFrame, and
    whether they are all of its rows. Rows come a batch at a time and reading stops at the first batch
    past the bound, so a result of gigabytes (one value of ``repeat('x', 1e9)``) is never held whole
    beyond the batch that passes it.

    Args:
        relation: the query.
        max_bytes: the most bytes of the rows kept (Arrow's size of them: text, lists and numbers).
        batch_rows: rows read at a time.
    """
    import polars as pl
    import pyarrow as pa

    reader = relation.to_arrow_reader(batch_rows)
    kept: list[pa.RecordBatch] = []
    held = 0
    complete = True
    for batch in reader:
        if held + batch.nbytes > max_bytes:
            complete = False
            rows = _rows_within(batch, max_bytes - held)
            if rows:
                kept.append(batch.slice(0, rows))
            break
        kept.append(batch)
        held += batch.nbytes
    table = pa.Table.from_batches(kept, schema=reader.schema)
    return pl.from_arrow(table), complete


def _rows_within(batch: object, room: int) -> int:
    """How many of ``batch``'s first rows fit ``room`` bytes (halving from all of them)."""
    rows = batch.num_rows  # type: ignore[attr-defined]
    while rows and batch.slice(0, rows).nbytes > room:  # type: ignore[attr-defined]
        rows //= 2
    return rows
