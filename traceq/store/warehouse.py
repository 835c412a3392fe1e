"""Open the DuckDB warehouse (a file, or a Parquet directory written by ``traceq export``)."""

from __future__ import annotations

import itertools
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from traceq import scratch
from traceq.errors import ConfigError, WarehouseError
from traceq.store.parquet import open_parquet
from traceq.store.schema import (
    SCHEMA_VERSION,
    create_schema,
    prepare_session,
    schema_version,
)

DEFAULT_DB = "traceq.duckdb"
# A report holds DuckDB to this much memory and spills the rest of its sorts, windows and joins to disk:
# matching ten million collective kernels across 2048 ranks took 6.3 GB without a limit, 2.1 GB with
# it (BENCHMARKS.md). The TRACEQ_MEMORY_LIMIT environment variable sets another (e.g. 8GB).
REPORT_MEMORY_LIMIT = "2GB"
_SIZE = re.compile(r"\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_spill_ids = itertools.count()
Warehouse = str | Path | duckdb.DuckDBPyConnection  # a path to open, or a connection already open


def connect(db: str | Path = DEFAULT_DB, *, read_only: bool = False, wait_s: float = 10.0) -> duckdb.DuckDBPyConnection:
    """Open (and on first use create) the warehouse at ``db``.

    Args:
        db: path of the DuckDB file, or ":memory:".
        read_only: open without taking the write lock (reports).
        wait_s: how long to wait for another process that holds the write lock.
    """
    path = str(db)
    if path != ":memory:" and Path(path).is_dir():  # Parquet written by `traceq export` or a cluster ingest
        con = open_parquet(path, read_only=read_only)
        limit_memory(con, _spill_dir())
        return con
    if path != ":memory:":
        _refuse_other_files(Path(path))
    if read_only and path != ":memory:" and not Path(path).exists():
        raise WarehouseError(f"{path}: no warehouse here; ingest traces into it first")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            con = duckdb.connect(path, read_only=read_only)
            break
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise WarehouseError(f"{path}: cannot open the warehouse ({exc})") from None
            if time.monotonic() >= deadline:
                raise WarehouseError(
                    f"{path}: another traceq process holds the warehouse lock; wait for it to finish "
                    "(or use --db with another file)"
                ) from None
            time.sleep(0.2)
        except duckdb.Error as exc:
            raise WarehouseError(f"{path}: not a traceq warehouse ({exc}); give the warehouse another file name") from None
    if not read_only:
        create_schema(con)
    elif path != ":memory:" and schema_version(con) != SCHEMA_VERSION:
        con.close()
        _upgrade(path, wait_s)
        return connect(db, read_only=True, wait_s=wait_s)
    prepare_session(con)
    if read_only:
        limit_memory(con, None if path != ":memory:" else _spill_dir())
    return con


def report_memory_limit() -> str:
    """DuckDB's memory limit for reports: TRACEQ_MEMORY_LIMIT, else :data:`REPORT_MEMORY_LIMIT`."""
    value = os.environ.get("TRACEQ_MEMORY_LIMIT", REPORT_MEMORY_LIMIT).strip()
    if not _SIZE.fullmatch(value):
        raise ConfigError(f"TRACEQ_MEMORY_LIMIT={value!r}: give a size such as 2GB or 512MB")
    return value


def limit_memory(con: duckdb.DuckDBPyConnection, spill_dir: str | None) -> None:
    """Hold a report's connection to :func:`report_memory_limit`; what does not fit spills to
    ``spill_dir`` (None: DuckDB's own, ``<warehouse>.tmp``, which it removes when the connection closes)."""
    con.execute(f"set memory_limit = '{report_memory_limit()}'")
    if spill_dir is not None:
        con.execute("set temp_directory = '" + spill_dir.replace("'", "''") + "'")


_SPILL: list[str] = []  # this process's spill root, once made
_SPILL_LOCK = threading.Lock()


def _spill_root() -> str:
    """This process's scratch directory for what in-memory connections spill, made when first asked
    for and removed when the process ends (:func:`traceq.scratch.remove_at_exit`; a killed one's by
    the next traceq command)."""
    with _SPILL_LOCK:
        if not _SPILL:
            _SPILL.append(scratch.remove_at_exit(scratch.scratch_dir(tempfile.gettempdir())).name)
        return _SPILL[0]


def _spill_dir() -> str:
    """A spill directory of its own for one in-memory connection (DuckDB makes it when it first spills)."""
    return os.path.join(_spill_root(), f"duckdb-{next(_spill_ids)}")


_DUCKDB_MAGIC = b"DUCK"  # bytes 8-11 of every DuckDB database file
_LOOKS_LIKE = ((b"\x1f\x8b", "a gzip file"), (b"PAR1", "a Parquet file"), (b"{", "JSON"), (b"[", "JSON"))


def _refuse_other_files(path: Path) -> None:
    """WarehouseError when ``path`` exists and is not a DuckDB database. DuckDB would open a JSON,
    CSV or Parquet file as an in-memory database with a view over it: every write would be lost."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise WarehouseError(f"{path}: cannot open the warehouse ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise WarehouseError(f"{path}: not a file; give the warehouse a file name (a new one is created)")
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError as exc:
        raise WarehouseError(f"{path}: cannot read the warehouse ({exc.strerror})") from None
    if head[8:12] == _DUCKDB_MAGIC:
        return
    kind = next((name for magic, name in _LOOKS_LIKE if head.lstrip().startswith(magic)), "not a DuckDB database")
    what = "empty" if not head else kind
    raise WarehouseError(
        f"{path}: this file exists and is not a traceq warehouse ({what}); give the warehouse another file name "
        "(a new one is created), or remove the file if it is a leftover"
    )


def _upgrade(path: str, wait_s: float) -> None:
    """Migrate a warehouse made by an older traceq that a report opened read-only (once)."""
    try:
        connect(path, wait_s=wait_s).close()
    except WarehouseError as exc:
        raise WarehouseError(
            f"{path}: made by an older traceq and cannot be upgraded here ({exc}); open it once with write access, "
            "e.g. traceq check on a writable copy"
        ) from None


@contextmanager
def opened(db: Warehouse, *, read_only: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
    """``db`` as a connection: opened here (and closed after the block), or the caller's, left open."""
    if isinstance(db, duckdb.DuckDBPyConnection):
        yield db
        return
    con = connect(db, read_only=read_only)
    try:
        yield con
    finally:
        con.close()
