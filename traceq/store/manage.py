"""Runs as units: remove one (``traceq runs rm``), rename one (``traceq runs rename``), remove one
trace (what ``traceq ingest --force`` does before it reads a file again); and the kernel rules
(``traceq rules``). Each change is one transaction: a failure or a kill leaves the warehouse as it was."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from traceq.catalog import check_run_name
from traceq.errors import ConfigError, EmptySelection
from traceq.store.frames import to_polars
from traceq.store.schema import add_rules, list_rules, rollback
from traceq.store.warehouse import Warehouse, opened

if TYPE_CHECKING:
    import polars as pl

_TRACES = "traces"


def remove_run(db: Warehouse, run: str) -> dict[str, int]:
    """Remove ``run`` and everything of it (its traces' events, steps, power logs, its metadata and
    settings). Returns the rows removed per table."""
    with opened(db, read_only=False) as con, _transaction(con):
        _require_run(con, run)
        ids = [t for (t,) in con.execute("select trace_id from traces where run = ?", [run]).fetchall()]
        removed = remove_traces(con, ids)
        for table, n in forget_run(con, run).items():
            removed[table] = removed.get(table, 0) + n
        return removed


def forget_run(con: duckdb.DuckDBPyConnection, run: str) -> dict[str, int]:
    """Delete the run-level rows of ``run`` (its metadata, settings, run files) from every table with a
    run column but ``traces``, on ``con`` in the caller's transaction; rows removed per table."""
    return {table: _delete(con, table, "run = ?", [run]) for table in _tables_with(con, "run") if table != _TRACES}


def rename_run(db: Warehouse, old: str, new: str) -> int:
    """Give ``old`` the name ``new`` everywhere (traces, metadata, settings); returns its traces. A
    name taken by another run is refused: merging two runs could put two traces on one rank's steps."""
    try:
        check_run_name(new)
    except ConfigError as exc:
        raise ConfigError(f"the new name {new!r}: {exc.message}") from None
    with opened(db, read_only=False) as con, _transaction(con):
        _require_run(con, old)
        taken = "select 1 from runs where run = $1 union all select 1 from run_settings where run = $1"
        if new != old and con.execute(taken, [new]).fetchone():
            raise ConfigError(f"a run named {new!r} exists already; remove that run first, or choose another name")
        for table in _tables_with(con, "run"):
            con.execute(f'update "{table}" set run = ? where run = ?', [new, old])
        return con.execute("select count(*) from traces where run = ?", [new]).fetchone()[0]


def remove_traces(con: duckdb.DuckDBPyConnection, trace_ids: list[int]) -> dict[str, int]:
    """Delete the rows of ``trace_ids`` from every table that has a trace_id, ``traces`` last, on
    ``con`` in the caller's transaction. Returns the rows removed per table."""
    removed: dict[str, int] = {}
    if not trace_ids:
        return removed
    tables = sorted(_tables_with(con, "trace_id"), key=lambda t: t == _TRACES)
    for table in tables:
        removed[table] = _delete(con, table, "trace_id in (select unnest(?))", [trace_ids])
    return removed


def _delete(con: duckdb.DuckDBPyConnection, table: str, where: str, params: list) -> int:
    return con.execute(f'delete from "{table}" where {where}', params).fetchone()[0]


def _tables_with(con: duckdb.DuckDBPyConnection, column: str) -> list[str]:
    """The warehouse's own tables (not temporary ones) that have ``column``."""
    return [t for (t,) in con.execute(
        "select table_name from duckdb_columns() where database_name = current_database() and schema_name = 'main' "
        "and not internal and column_name = ? order by table_name", [column],
    ).fetchall()]


def _require_run(con: duckdb.DuckDBPyConnection, run: str) -> None:
    if con.execute("select 1 from runs where run = ?", [run]).fetchone() is None:
        names = [r for (r,) in con.execute("select run from runs order by run").fetchall()]
        raise EmptySelection(f"no run {run!r} in the warehouse; it holds: {', '.join(names) or 'none'}")


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    con.begin()
    try:
        yield
        con.commit()
    except BaseException:
        rollback(con)
        raise


def add_rule_file(db: Warehouse, path: Path) -> tuple[int, int]:
    """``traceq rules --add``: the rules of the CSV ``path`` added to the warehouse at ``db``
    (:func:`traceq.store.schema.add_rules`, all or nothing); (rules added, rules now)."""
    with opened(db, read_only=False) as con:
        added = add_rules(con, path)
        return added, con.execute("select count(*) from kernel_rules").fetchall()[0][0]


def rules(db: Warehouse) -> pl.DataFrame:
    """The kernel classification rules in force, the one that wins first (``traceq rules``)."""
    with opened(db) as con:
        return to_polars(list_rules(con))


def remove_if_empty(db: str | Path) -> bool:
    """Remove the warehouse file ``db`` (and its write-ahead log) where it holds nothing anyone put in it:
    traceq's schema and builtin rules alone (what a refused first ingest made). Taken with the write lock
    held, so no other writer is in it; a file that is not such a warehouse, or one in use, stays. Returns
    whether it was removed."""
    from traceq.store.warehouse import inspect_warehouse

    path = Path(db)
    try:
        con = duckdb.connect(str(path))
    except duckdb.Error:
        return False  # locked by another writer, or not a DuckDB file: not ours to remove
    try:
        state, _ = inspect_warehouse(con)
        if state not in ("current", "empty"):
            return False
        if state == "current":
            held = con.execute(
                "select (select count(*) from traces) + (select count(*) from runs) + (select count(*) from run_settings)"
                " + (select count(*) from kernel_rules where source = 'user')").fetchall()[0][0]
            if held:
                return False
        # unlinked while the lock is held: a writer that waits for it opens a new file
        path.with_name(path.name + ".wal").unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        return True
    except (duckdb.Error, OSError):
        return False
    finally:
        con.close()
