"""Write the warehouse as Parquet (``traceq export``) and load such a directory back
(``traceq import-parquet``); the layout is :mod:`traceq.store.parquet`'s."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from traceq.errors import ConfigError, WarehouseError
from traceq.identity import Claim, overlaps
from traceq.query import sql_text
from traceq.store.parquet import (
    FORMER_NAMES,
    ONE_ROW_PER,
    TRACES,
    is_parquet_dir,
    parquet_queries,
    warehouse_tables,
    write_partitions,
)
from traceq.store.schema import rollback
from traceq.store.warehouse import connect
from traceq.store.export_check import check_export  # (kept last: the directory check is a module of its own)


def export_parquet(db: str | Path, directory: str | Path, *, overwrite: bool = False) -> dict[str, int]:
    """Write the warehouse at ``db`` as Parquet under ``directory``, partitioned by run and rank.

    Args:
        db: warehouse path.
        directory: output folder (created); it must not hold an export already unless ``overwrite``.
        overwrite: replace the table folders of an earlier export in ``directory``.

    Returns rows written per table. The export is written into a staging folder inside
    ``directory`` and moved into place when complete, ``traces/`` last: a reader (or a kill) never
    leaves a directory that looks like an export and holds half of one. One export writes a
    directory at a time: another one started meanwhile fails (WarehouseError).
    """
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: is a file; pass a directory for the Parquet export")
    con = connect(db, read_only=True)
    try:
        try:
            out.mkdir(parents=True)
            made = True
        except FileExistsError:
            made = False
        except OSError as exc:
            raise WarehouseError(f"{out}: cannot make the export directory ({exc.strerror})") from None
        with _writing(out):
            try:
                return _write(con, out, overwrite)
            except BaseException:
                if made:  # under the lock, a directory this call made holds nothing but a failed export
                    shutil.rmtree(out, ignore_errors=True)
                raise
    finally:
        con.close()


def _write(con: duckdb.DuckDBPyConnection, out: Path, overwrite: bool) -> dict[str, int]:
    tables = warehouse_tables(con)
    existing = [t.name for t in tables if (out / t.name).exists()]
    if existing and not overwrite:
        raise ConfigError(f"{out}: holds an export already ({', '.join(existing)}); overwrite it, or export to a new directory")
    names = {t.name for t in tables} | set(FORMER_NAMES.values())  # an earlier traceq's export too
    others = sorted(p.name for p in out.iterdir() if p.name not in names and not p.name.startswith((_STAGING, _REPLACED)))
    if others:
        shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        raise ConfigError(f"{out}: holds files of its own ({shown}); the export's folders would go among them: "
                          "export into a new or empty directory")
    staging = out / f"{_STAGING}{os.getpid()}"
    try:
        written = write_partitions(con, staging)
        _move_into_place(out, staging, [t.name for t in tables])
    except (OSError, duckdb.IOException) as exc:
        raise WarehouseError(f"{out}: cannot write the export ({_reason(exc)}); nothing of it was kept") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


_STAGING = ".staging-"  # a folder of the export being written, inside the export directory
_REPLACED = ".replaced-"  # the folders of the export being replaced, until the new one is in place


@contextmanager
def _writing(out: Path) -> Iterator[None]:
    """Hold ``out``'s export lock (flock on the directory; released by the kernel if the process
    dies) and clear what a killed export left there."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): one writer at a time is then the user's to keep
        fcntl = None  # type: ignore[assignment]
    fd = os.open(out, os.O_RDONLY)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise WarehouseError(
                    f"{out}: another traceq export is writing this directory; wait for it to finish, or export elsewhere"
                ) from None
        for left in out.iterdir():  # under the lock, any of these is a killed export's
            if left.name.startswith((_STAGING, _REPLACED)):
                shutil.rmtree(left, ignore_errors=True)
        yield
    finally:
        os.close(fd)


def _move_into_place(out: Path, staging: Path, tables: list[str]) -> None:
    """Swap the staged tables in: the old ``traces/`` goes out first and the new one comes in last."""
    replaced = out / f"{_REPLACED}{os.getpid()}"
    replaced.mkdir()
    moved_out: list[Path] = []
    moved_in: list[Path] = []
    try:
        for folder in sorted((out / name for name in tables if (out / name).exists()), key=lambda p: p.name != TRACES):
            folder.rename(replaced / folder.name)
            moved_out.append(folder)
        for folder in sorted(staging.iterdir(), key=lambda p: p.name == TRACES):
            folder.rename(out / folder.name)
            moved_in.append(out / folder.name)
    except OSError:  # put the earlier export back as it was
        for folder in reversed(moved_in):
            shutil.rmtree(folder, ignore_errors=True)
        for folder in reversed(moved_out):
            (replaced / folder.name).rename(folder)
        raise
    shutil.rmtree(replaced, ignore_errors=True)


def _reason(exc: BaseException) -> str:
    """The first line of an OS or DuckDB I/O error, without DuckDB's prefix."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc).splitlines()[0].removeprefix("IO Error: ")


def import_parquet(directory: str | Path, db: str | Path) -> int:
    """Load the traces of a Parquet directory into the warehouse at ``db``; returns traces added.

    Traces whose content is already in the warehouse are skipped (idempotent); the others get new
    trace ids. One transaction: either every new trace is added or none.
    """
    root = Path(directory)
    if not is_parquet_dir(root):
        raise WarehouseError(f"{root}: not a traceq Parquet directory (no {TRACES}/ folder)")
    check_export(root, doing="imported")  # as a report reading it does: damage in one line, before the warehouse is opened
    con = connect(db)
    try:
        con.begin()
        try:
            queries = parquet_queries(con, root)
            con.execute(
                f"""
                create or replace temp table _id_map as
                select s.trace_id as old_id, nextval('trace_ids') as new_id
                from ({queries[TRACES]}) as s
                where s.content_digest not in (select content_digest from traces)
                """
            )
            added = con.execute("select count(*) from _id_map").fetchall()[0][0]
            for table in warehouse_tables(con):
                if table.name not in queries or table.name == "kernel_rules":
                    continue
                cols = ", ".join(table.columns)
                if "trace_id" in table.columns:
                    picked = ", ".join("m.new_id" if c == "trace_id" else f"s.{c}" for c in table.columns)
                    con.execute(
                        f"insert into {table.name} ({cols}) select {picked} from ({queries[table.name]}) as s "
                        "inner join _id_map as m on m.old_id = s.trace_id"
                    )
                elif table.name in ONE_ROW_PER:
                    con.execute(f"insert into {table.name} ({cols}) select {cols} from ({queries[table.name]}) on conflict do nothing")
            _refuse_missing_rows(con, root)
            _refuse_rank_collisions(con, root)
            con.execute("drop table _id_map")
            con.commit()
        except (duckdb.IOException, duckdb.InvalidInputException) as exc:
            rollback(con)
            raise ConfigError(f"{root}: a Parquet file of it cannot be read ({_reason(exc)}); nothing was imported. "
                              "Export the warehouse again") from None
        except BaseException:
            rollback(con)
            raise
        return added
    finally:
        con.close()


def _refuse_missing_rows(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """ConfigError (the import is rolled back) when an imported trace did not bring every GPU and host event
    its traces row counts: a table's folder removed, files lost, or files of another schema whose rows do
    not read as the trace's. A later import would skip those traces as known, so the rows could never
    come in."""
    short = con.execute(
        """
        with new as (select new_id as trace_id from _id_map),
        gpu as (select trace_id, count(*) as n from gpu_events semi join new using (trace_id) group by all),
        host as (select trace_id, count(*) as n from host_events semi join new using (trace_id) group by all)
        select t.path, t.n_gpu_events, coalesce(g.n, 0), t.n_host_events, coalesce(h.n, 0), count(*) over ()
        from traces as t
        semi join new using (trace_id)
        left join gpu as g using (trace_id)
        left join host as h using (trace_id)
        where t.n_gpu_events <> coalesce(g.n, 0) or t.n_host_events <> coalesce(h.n, 0)
        order by t.path
        limit 1
        """
    ).fetchall()
    if short:
        path, gpu_want, gpu_got, host_want, host_got, traces = short[0]
        what = (f"{gpu_got:,} of its {gpu_want:,} GPU events (gpu_events/)" if gpu_got != gpu_want
                else f"{host_got:,} of its {host_want:,} host events (host_events/)")
        raise ConfigError(
            f"{root}: damaged export: trace {path} reads {what}"
            + (f", and {traces - 1} more trace(s) fall short" if traces > 1 else "")
            + "; nothing was imported. Export the warehouse again"
        )


def _refuse_rank_collisions(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """ConfigError (the import is rolled back) when an imported trace holds a (run, rank, step) that another
    trace of the warehouse holds, or an imported trace before it: as ingest refuses such a file
    (:func:`traceq.identity.overlaps` decides and words it), so that no step is counted twice."""
    # the new trace ids are one range: the trace_ids sequence's values of one statement
    first, last = con.execute("select min(new_id), max(new_id) from _id_map").fetchone()
    rows = [] if first is None else con.execute(sql_text("step_claims.sql"), {"first": first, "last": last}).fetchall()
    claims = [(imported, Claim(trace_id, path, run, rank, step)) for trace_id, path, run, rank, step, imported in rows]
    refused = overlaps([c for imported, c in claims if not imported], [c for imported, c in claims if imported])
    if refused:
        raise ConfigError(refused[0].import_message(str(root)))
