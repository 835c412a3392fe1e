"""Open the DuckDB warehouse (a file, or a Parquet directory written by ``traceq export``)."""

from __future__ import annotations

import errno
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
from traceq.store.location import warehouse_path
from traceq.store.parquet import is_parquet_dir, open_parquet
from traceq.store.schema import (
    FORMER_COLUMNS,
    SCHEMA_VERSION,
    TRACEQ_TABLES,
    create_schema,
    prepare_session,
    schema_columns,
)

DEFAULT_DB = "traceq.duckdb"
# A report holds DuckDB to this much memory and spills the rest of its sorts, windows and joins to disk:
# matching ten million collective kernels across 2048 ranks took 6.3 GB without a limit, 2.1 GB with
# it (BENCHMARKS.md). The TRACEQ_MEMORY_LIMIT environment variable sets another (e.g. 8GB).
REPORT_MEMORY_LIMIT = "2GB"
_SIZE = re.compile(r"\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_spill_ids = itertools.count()
Warehouse = str | Path | duckdb.DuckDBPyConnection  # a path to open, or a connection already open


def _check_writable_beside(path: Path) -> None:
    """WarehouseError unless a writing connection can make its write-ahead log (``<db>.wal``, beside
    the file): DuckDB finds out only when it commits, as "TransactionContext Error: Failed to commit"."""
    wal = path.with_name(path.name + ".wal")
    folder = path.parent
    if wal.exists() and not wal.is_dir() and os.access(wal, os.W_OK):
        return
    if not wal.exists() and (not folder.exists() or os.access(folder, os.W_OK | os.X_OK)):
        return  # (a missing folder: DuckDB says so when it opens the file)
    if wal.is_dir():
        why = f"{wal} is a directory"
    else:
        where = wal if wal.exists() else folder
        read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
        why = f"{where}: {os.strerror(errno.EROFS if read_only else errno.EACCES)}"
    raise WarehouseError(f"{path}: cannot write its write-ahead log ({why}; DuckDB keeps it beside the file); "
                         "use a --db in a writable directory, or copy the warehouse to one")


LOCK_WAIT_ENV = "TRACEQ_LOCK_WAIT_S"  # seconds a command waits for another's write lock (default 10)


def lock_wait_s() -> float:
    """How long to wait for another process's write lock: $TRACEQ_LOCK_WAIT_S, else 10 s."""
    given = os.environ.get(LOCK_WAIT_ENV, "").strip()
    if not given:
        return 10.0
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86_400:
        raise ConfigError(f"{LOCK_WAIT_ENV}={given!r}: give the seconds to wait for another traceq's lock, 0 to 86400")
    return seconds


def connect(db: str | Path = DEFAULT_DB, *, read_only: bool = False, wait_s: float | None = None) -> duckdb.DuckDBPyConnection:
    """Open (and on first use create) the warehouse at ``db``.

    A file that exists is looked at read-only first, and refused untouched unless it is a traceq warehouse:
    a DuckDB file of other tables, one made by a newer traceq, or (``read_only``) one made by an older
    traceq, which only a writing command migrates (:func:`migrations` says which it did). Read-only
    connections never write to the file.

    Args:
        db: path of the DuckDB file (``~`` expanded: :func:`~traceq.store.location.user_path`), or ":memory:".
        read_only: open without taking the write lock (reports).
        wait_s: how long to wait for another process that holds the write lock (default
            :func:`lock_wait_s`).
    """
    path = warehouse_path(db)  # the one path checked below and opened (DuckDB's own reading of `~` never comes in)
    if path != ":memory:" and Path(path).is_dir():  # Parquet written by `traceq export` or a cluster ingest
        if not is_parquet_dir(path):
            raise WarehouseError(f"{path}: a directory, and not a traceq Parquet export (no traces/ folder); give --db "
                                 "a DuckDB file (created if missing), or a directory `traceq export --parquet` wrote")
        con = open_parquet(path, read_only=read_only)
        limit_memory(con, _spill_dir())
        return con
    if path != ":memory:":
        _refuse_other_files(Path(path))
        if not read_only:
            _check_writable_beside(Path(path))
    if read_only and path != ":memory:" and not Path(path).exists():
        raise WarehouseError(f"{path}: no warehouse here; ingest traces into it first")
    deadline = time.monotonic() + (lock_wait_s() if wait_s is None else wait_s)
    older = None
    if path != ":memory:" and Path(path).exists():
        writing = False
        try:
            con = _open(path, True, deadline)
        except _OpenHere:
            writing = True
            if read_only:
                raise WarehouseError(f"{path}: this process has it open for writing; read it on that connection "
                                     "(traceq's functions take a connection for db)") from None
            con = _open(path, False, deadline)  # looked at on the writing connection, before anything is written
        try:
            older = _looked_at(con, path, read_only)
        except BaseException:
            con.close()
            raise
        if read_only:
            prepare_session(con)
            limit_memory(con, None)
            return con
        if not writing:
            con.close()
            con = _open(path, False, deadline)
    else:
        con = _open(path, read_only, deadline)
    if not read_only:
        create_schema(con)
        if older is not None:
            _MIGRATIONS.append(f"{path}: migrated from schema {older} (made by an older traceq) to schema {SCHEMA_VERSION}")
    prepare_session(con)
    if read_only:
        limit_memory(con, _spill_dir())
    return con


def _looked_at(con: duckdb.DuckDBPyConnection, path: str, read_only: bool) -> int | str | None:
    """Refuse what ``con`` holds unless it is a warehouse this traceq may open (:func:`_refuse`); the
    schema it is to be migrated from where it is an older one, else None."""
    state, version = inspect_warehouse(con)
    _refuse(path, state, version, read_only)
    return (version or 1) if state == "older" else None


_MIGRATIONS: list[str] = []  # what connect() migrated in this process, for the CLI to say


def migrations() -> list[str]:
    """The warehouses this process migrated from an older schema (one line each), once: the list empties."""
    done = list(_MIGRATIONS)
    _MIGRATIONS.clear()
    return done


class _OpenHere(Exception):
    """The file is open in this process with another configuration (a writing connection)."""


def _open(path: str, read_only: bool, deadline: float) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect``, waiting until ``deadline`` for another process's write lock."""
    while True:
        try:
            return duckdb.connect(path, read_only=read_only)
        except duckdb.ConnectionException:
            raise _OpenHere from None
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise WarehouseError(f"{path}: cannot open the warehouse ({exc})") from None
            if time.monotonic() >= deadline:
                raise WarehouseError(
                    f"{path}: another traceq process holds the warehouse lock; wait for it to finish, set "
                    f"{LOCK_WAIT_ENV} to wait longer, or use --db with another file"
                ) from None
            time.sleep(0.2)
        except duckdb.Error as exc:
            raise WarehouseError(f"{path}: not a traceq warehouse ({exc}); give the warehouse another file name") from None


def inspect_warehouse(con: duckdb.DuckDBPyConnection) -> tuple[str, int | str | None]:
    """What a DuckDB database holds, read only: (state, schema version). State: ``current`` (this traceq's
    schema), ``older`` (traceq's tables, an older or unrecorded version), ``newer``, ``damaged`` (a
    schema_version that is not a number), ``foreign`` (tables, none of them traceq's; the version is then
    their names, comma-separated) or ``empty`` (no table)."""
    tables = [name for (name,) in con.execute(
        "select table_name from duckdb_tables() where database_name = current_database() and schema_name = 'main' "
        "order by table_name").fetchall()]
    ours = [t for t in tables if t in TRACEQ_TABLES]
    if not tables:
        return "empty", None
    if not ours:
        return "foreign", ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
    row = None if "warehouse_info" not in tables else con.execute(
        "select value from warehouse_info where key = 'schema_version'").fetchone()
    if row is None:
        # before versions were recorded: traceq's first tables, with their columns (else someone else's
        # tables that share a name with one of traceq's)
        held = _columns(con)
        if not all(c in held.get(t, ()) for t, cs in FIRST_SCHEMA.items() for c in cs):
            return "foreign", ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
        return "older", None
    try:
        version = int(row[0])
    except (TypeError, ValueError):
        return "damaged", str(row[0])
    if version > SCHEMA_VERSION:
        return "newer", version
    if version < SCHEMA_VERSION:
        return "older", version
    lacking, renamed = _lacking_columns(con)
    if lacking:
        return "damaged", f"{version}, but {lacking}"
    return ("older", f"{version} with columns of an earlier name") if renamed else ("current", version)


# what every traceq warehouse has held since the first: its core tables and their key columns
FIRST_SCHEMA = {"traces": ("trace_id", "run", "path"), "gpu_events": ("trace_id", "start_ns", "dur_ns"),
                "host_events": ("trace_id", "start_ns", "dur_ns"), "names": ("trace_id", "name_id", "name")}


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    held: dict[str, set[str]] = {}
    for table, column in con.execute(
        "select table_name, column_name from duckdb_columns() where database_name = current_database() "
        "and schema_name = 'main'"
    ).fetchall():
        held.setdefault(table, set()).add(column)
    return held


def _lacking_columns(con: duckdb.DuckDBPyConnection) -> tuple[str, bool]:
    """(the columns of this schema that the database's traceq tables lack, 'traces lacks size_bytes, ...',
    '' when none: tables of traceq's names with other columns are not its tables; whether some are there
    under a former name, which a migration renames)."""
    held = _columns(con)
    renamed = False
    for table, columns in schema_columns().items():
        have = held.get(table, set(columns))
        former = [c for c in columns if c not in have and FORMER_COLUMNS.get((table, c)) in have]
        missing = [c for c in columns if c not in have and c not in former]
        renamed = renamed or bool(former)
        if missing:
            return f"{table} lacks {', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}", renamed
    return "", renamed


def _refuse(path: str, state: str, version: int | str | None, read_only: bool) -> None:
    """WarehouseError for a database this traceq must not open (``read_only``: to read without writing)."""
    if state == "foreign":
        raise WarehouseError(f"{path}: not a traceq warehouse (a DuckDB database of other tables: {version}); it is "
                             "left untouched: give --db a traceq warehouse, or a new file name")
    if state == "newer":
        raise WarehouseError(f"{path}: made by a newer traceq (schema {version}; this traceq knows schema "
                             f"{SCHEMA_VERSION}); it is left untouched: use that traceq, or upgrade this one")
    if state == "damaged":
        why = (f"its schema is {version}" if isinstance(version, str) and ", but " in version
               else f"its schema_version is {version!r}, not a number")
        raise WarehouseError(f"{path}: damaged warehouse or not traceq's ({why}); it is left untouched")
    if read_only and state == "empty":
        raise WarehouseError(f"{path}: no warehouse here yet (an empty DuckDB database); ingest traces into it first")
    if read_only and state == "older":
        raise WarehouseError(f"{path}: made by an older traceq (schema {version or 1}); reports never write, so "
                             f"migrate it first: traceq migrate --db {path}")


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


# what an OS error says inside DuckDB's (it keeps no errno)
_OS_PHRASES = ("no space left on device", "read-only file system", "disk quota exceeded", "file too large")


def environment_error(exc: BaseException) -> str | None:
    """One line for what the machine, not traceq, got wrong (a full disk, a read-only file system,
    no memory, a damaged warehouse file); None for anything else."""
    import duckdb

    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    if isinstance(exc, MemoryError | duckdb.OutOfMemoryException):
        return f"out of memory ({str(exc).splitlines()[0] if str(exc) else 'MemoryError'}); free memory or use a smaller input"
    if not isinstance(exc, duckdb.Error):
        return None
    first = str(exc).splitlines()[0]
    lower = first.lower()
    if any(phrase in lower for phrase in _OS_PHRASES):
        return f"{first}; the file system said no: free space, or use a writable place for --db and outputs"
    if isinstance(exc, duckdb.IOException | duckdb.SerializationException) or "corrupt" in lower:
        damaged = any(w in first.lower() for w in ("could not read enough bytes", "corrupt", "checksum", "serializ"))
        hint = ("; the warehouse file is damaged or cut short: copy it again, or ingest the traces into a new one"
                if damaged else "")
        return f"{first}{hint}"
    return None
