"""Queries of the user's own over traceq's classification, windows and metrics (``traceq sql``) on the
warehouse; PerfettoSQL over a trace is :func:`traceq.perfetto.engine.trace_sql` (docs/how-to/perfetto.md)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from traceq.errors import ConfigError
from traceq.report.result import Report
from traceq.report.selection import StepSelection, relation
from traceq.store.schema import prepare_session
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

# the relations of sql/ a query may name besides the warehouse's tables (with the report's default
# step selection); those it names are computed once, as temporary tables
RELATIONS = (
    "gpu_classified", "gpu_activity", "device_activity", "device_windows", "selected_steps",
    "selected_windows", "trace_windows", "interval_breakdown", "comm_instances",
)
BINDINGS = {"interval_breakdown": {"windows": "selected_windows"}}  # the selected steps' windows


def warehouse_sql(
    sql: str, db: Warehouse = DEFAULT_DB, selection: StepSelection = StepSelection(include_last=True),
    max_rows: int | None = None, max_bytes: int | None = None,
) -> Report:
    """The rows of ``sql`` (DuckDB) on the warehouse, as a report's table, where the names of :data:`RELATIONS` are traceq's
    relations (by default over every step, the open last one included, as the Perfetto engine's tables
    hold them: reports leave it out); ConfigError with DuckDB's message when the query fails.

    The query reads the warehouse and nothing else: where ``db`` is a path, the connection is closed to
    files (DuckDB's external access off: no COPY TO, no read_csv of other files, no ATTACH), to extensions
    (none installed or loaded) and to configuration changes. ``max_rows``: give at most this many rows
    and a note that there were more; None: all. ``max_bytes``: give the first rows within this many bytes
    (read a batch at a time: a value of gigabytes is never held whole) and a note, or ConfigError where
    the first row alone passes it; None: no bound."""
    from traceq.store.frames import to_polars, to_polars_bounded

    with opened(db) as given, _own_cursor(given, db) as con:
        for name in RELATIONS:
            if re.search(rf"\b{name}\b", sql, re.IGNORECASE):
                _rows = relation(con, name, selection, BINDINGS.get(name))  # noqa: F841 (read below)
                con.execute(f'create or replace temp table "{name}" as select * from _rows')
        if not isinstance(db, duckdb.DuckDBPyConnection):  # a caller's own connection stays as it was
            _sandbox(con, Path(db))
        try:
            result = con.sql(sql)
            if result is None:  # a statement without rows (the warehouse is opened read-only)
                raise ConfigError(f"not a query (it returns no rows): {sql[:80]!r}; give a SELECT")
            twice = sorted({c for c in result.columns if result.columns.count(c) > 1})
            if twice:
                raise ConfigError(f"the query gives two columns named {', '.join(twice)}; name them apart (AS)")
            if max_rows is not None:
                result = result.limit(max_rows + 1)
            if max_bytes is None:
                return Report.of_query(to_polars(result), (), max_rows)
            rows, complete = to_polars_bounded(result, max_bytes)
            if complete:
                return Report.of_query(rows, (), max_rows)
            if not rows.height:
                raise ConfigError(f"the query's first row alone passes {_mb(max_bytes)}, the most a result may hold "
                                  "(--max-mb): select less of it (substr, fewer columns), or raise --max-mb")
            note = f"the query's rows pass {_mb(max_bytes)}: the first {rows.height:,} are shown (--max-mb)"
            return Report.of_query(rows, [note], max_rows)
        except duckdb.Error as exc:
            raise ConfigError(f"DuckDB refused the query: {str(exc).strip().splitlines()[0]}") from None


@contextmanager
def _own_cursor(con: duckdb.DuckDBPyConnection, db: Warehouse) -> Iterator[duckdb.DuckDBPyConnection]:
    """``con``, or where it is the caller's own connection a cursor of it (its own connection to the same
    database, closed after the block): the temporary tables of the query go there, and the caller's
    connection stays as it was."""
    if not isinstance(db, duckdb.DuckDBPyConnection):
        yield con
        return
    cursor = con.cursor()
    try:
        prepare_session(cursor)  # the macros of the SQL files (temporary: each connection has its own)
        yield cursor
    finally:
        cursor.close()


def _mb(size: int) -> str:
    return f"{size / 1e6:,.0f} MB" if size >= 1e6 else f"{size:,} bytes"


def _sandbox(con: duckdb.DuckDBPyConnection, db: Path) -> None:
    """Close ``con`` to everything but the warehouse: files (a Parquet warehouse's own directory stays
    readable), extensions, and further configuration."""
    if db.is_dir():
        folder = str(db.resolve()).replace("'", "''") + "/"
        con.execute(f"set allowed_directories = ['{folder}']")
    con.execute("set autoinstall_known_extensions = false")
    con.execute("set autoload_known_extensions = false")
    con.execute("set enable_external_access = false")
    con.execute("set lock_configuration = true")
