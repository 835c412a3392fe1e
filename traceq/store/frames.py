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
