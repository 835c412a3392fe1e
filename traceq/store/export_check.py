"""Check a Parquet export before it is read: as a report (``--db DIR``) and ``import-parquet`` alike.

An export whose files were removed, cut short, copied or linked reads without an error: a removed
``gpu_events/`` as a run without kernels, a copied ``traces/run=a`` folder as a second run holding a's
steps. :func:`check_export` finds each in one line before anything is read: every ``.parquet`` a whole
file of its own (no symbolic link, Parquet's magic at both ends), each trace in one partition of every
table, and its GPU and host event rows as many as its ``traces`` row counts.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from traceq.errors import WarehouseError

_TRACES = "traces"  # (traceq.store.parquet.TRACES: that module calls this one)
_MAGIC = b"PAR1"  # the first and last four bytes of every Parquet file
# tables whose rows belong to one trace (trace_id), each in the folder of its run (and rank)
_TRACE_TABLES = ("traces", "gpu_events", "host_events", "names", "steps", "trace_threads", "run_files",
                 "step_wall_times", "step_windows", "power_logs", "power_samples")
# the tables whose rows per trace the traces row counts
_COUNTED = {"gpu_events": "n_gpu_events", "host_events": "n_host_events"}
_COUNTED_AS = {"gpu_events": "GPU events", "host_events": "host events"}


class _Damage(Exception):
    """What is wrong with the export, said by :func:`check_export` in one line."""


def _file(shown: Path | str, what: str) -> _Damage:
    return _Damage(f"a Parquet file of it cannot be read ({shown} {what})")


def check_export(directory: str | Path, *, doing: str = "read") -> None:
    """WarehouseError naming the first damage of the Parquet export at ``directory`` (one line), else None.

    Args:
        directory: a folder `traceq export --parquet` (or a cluster ingest) wrote; it has ``traces/``.
        doing: what the caller was to do with it ("read", "imported"), for the message.
    """
    root = Path(directory)
    try:
        files = _parquet_files(root)
        con = duckdb.connect(":memory:")
        try:
            _check_partitions(con, root, files)
            _check_counts(con, root, files)
        except duckdb.Error as exc:
            raise _Damage(f"a Parquet file of it cannot be read ({str(exc).splitlines()[0]})") from None
        finally:
            con.close()
    except _Damage as damage:
        raise WarehouseError(f"{root}: {damage}; nothing was {doing}. Export the warehouse again "
                             "(traceq export --parquet DIR --overwrite)") from None


def _parquet_files(root: Path) -> dict[str, list[str]]:
    """The .parquet files of each table folder of ``root`` (absolute paths, sorted); WarehouseError for one
    that is a symbolic link, not a file, or not a whole Parquet file."""
    found: dict[str, list[str]] = {}
    for table in sorted(os.listdir(root)):
        folder = root / table
        if folder.is_symlink():
            raise _Damage(f"damaged export: {table} is a symbolic link (an export holds its own files)")
        if not folder.is_dir():
            continue
        for here, dirs, names in os.walk(folder):
            dirs.sort()
            linked = next((d for d in dirs if (Path(here) / d).is_symlink()), None)
            if linked is not None:
                raise _Damage(f"damaged export: {(Path(here) / linked).relative_to(root)} is a symbolic link "
                              "(an export holds its own files)")
            for name in sorted(names):
                if not name.endswith(".parquet"):
                    continue
                path = Path(here) / name
                _whole(root, path)
                found.setdefault(table, []).append(str(path))
    return found


def _whole(root: Path, path: Path) -> None:
    shown = path.relative_to(root)
    if path.is_symlink():
        raise _file(shown, "is a symbolic link (an export holds its own files)")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
            if size >= 12:
                f.seek(size - 4)
            tail = f.read(4)
    except OSError as exc:
        raise _file(shown, f"cannot be opened: {exc.strerror}") from None
    if size < 12 or head != _MAGIC or tail != _MAGIC:
        raise _file(shown, "is empty" if size == 0 else f"is not a whole Parquet file ({size:,} bytes)")


def _check_partitions(con: duckdb.DuckDBPyConnection, root: Path, files: dict[str, list[str]]) -> None:
    """Each trace's rows of a table in one folder (its run's, its rank's): a copied partition folder puts them in two."""
    for table in _TRACE_TABLES:
        if table not in files:
            continue
        row = con.execute(
            """
            with files as (
                select distinct trace_id, filename
                from read_parquet(?, filename = true, hive_partitioning = false, union_by_name = true)
            ),
            folders as (select distinct trace_id, parse_dirpath(filename) as folder from files)
            select trace_id, list(folder order by folder)[:2]
            from folders
            group by trace_id
            having count(*) > 1
            order by trace_id
            limit 1
            """,
            [files[table]],
        ).fetchall()
        if row:
            trace_id, folders = row[0]
            where = " and ".join(str(Path(f).relative_to(root)) for f in folders)
            raise _Damage(f"damaged export: trace {trace_id} has rows of {table} in two partitions ({where})")
    if _TRACES in files:
        row = con.execute(
            "select trace_id, count(*) from read_parquet(?, hive_partitioning = false, union_by_name = true) "
            "group by trace_id having count(*) > 1 order by trace_id limit 1",
            [files[_TRACES]],
        ).fetchall()
        if row:
            raise _Damage(f"damaged export: trace {row[0][0]} has {row[0][1]} rows in traces/ (a file or folder copied)")


def _check_counts(con: duckdb.DuckDBPyConnection, root: Path, files: dict[str, list[str]]) -> None:
    """Every trace's GPU and host event rows as many as its traces row says (a folder or file removed,
    copied or cut: rows missing or doubled)."""
    if _TRACES not in files:
        return
    for table, column in _COUNTED.items():
        counted = ("select trace_id, count(*) as n "
                   "from read_parquet($events, hive_partitioning = false, union_by_name = true) group by trace_id"
                   if table in files else "select null::integer as trace_id, 0::bigint as n where false")
        params = {"traces": files[_TRACES], **({"events": files[table]} if table in files else {})}
        row = con.execute(
            f"""
            with counted as ({counted})
            select t.path, t.{column}, coalesce(c.n, 0), count(*) over ()
            from read_parquet($traces, hive_partitioning = false, union_by_name = true) as t
            left join counted as c using (trace_id)
            where t.{column} <> coalesce(c.n, 0)
            order by t.path
            limit 1
            """,
            params,
        ).fetchall()
        if row:
            path, want, got, short = row[0]
            more = f", and {short - 1} more trace(s) fall short" if short > 1 else ""
            gone = "" if table in files else f" (the {table}/ folder is missing)"
            raise _Damage(f"damaged export: trace {path} reads {got:,} of its {want:,} {_COUNTED_AS[table]} "
                          f"({table}/){more}{gone}")
