"""Write the warehouse as Parquet (``traceq export``) and load such a directory back
(``traceq import-parquet``); the layout is :mod:`traceq.store.parquet`'s."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb

from traceq.errors import ConfigError, WarehouseError
from traceq.store.parquet import (
    _ONE_ROW_PER,
    TRACES,
    is_parquet_dir,
    parquet_queries,
    warehouse_tables,
    write_partitions,
)
from traceq.store.warehouse import connect


def export_parquet(db: str | Path, directory: str | Path, *, overwrite: bool = False) -> dict[str, int]:
    """Write the warehouse at ``db`` as Parquet under ``directory``, partitioned by run and rank.

    Args:
        db: warehouse path.
        directory: output folder (created); it must not hold an export already unless ``overwrite``.
        overwrite: replace the table folders of an earlier export in ``directory``.

    Returns rows written per table.
    """
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: is a file; pass a directory for the Parquet export")
    con = connect(db, read_only=True)
    try:
        tables = warehouse_tables(con)
        existing = [t.name for t in tables if (out / t.name).exists()]
        if existing and not overwrite:
            raise ConfigError(f"{out}: holds an export already ({', '.join(existing)}); overwrite it, or export to a new directory")
        for name in existing:
            shutil.rmtree(out / name)
        out.mkdir(parents=True, exist_ok=True)
        return write_partitions(con, out)
    finally:
        con.close()


def import_parquet(directory: str | Path, db: str | Path) -> int:
    """Load the traces of a Parquet directory into the warehouse at ``db``; returns traces added.

    Traces whose content is already in the warehouse are skipped (idempotent); the others get new
    trace ids. One transaction: either every new trace is added or none.
    """
    root = Path(directory)
    if not is_parquet_dir(root):
        raise WarehouseError(f"{root}: not a traceq Parquet directory (no {TRACES}/ folder)")
    con = connect(db)
    try:
        queries = parquet_queries(con, root)
        con.begin()
        try:
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
                elif table.name in _ONE_ROW_PER:
                    con.execute(f"insert into {table.name} ({cols}) select {cols} from ({queries[table.name]}) on conflict do nothing")
            _refuse_rank_collisions(con, root)
            con.execute("drop table _id_map")
            con.commit()
        except BaseException:
            con.rollback()
            raise
        return added
    finally:
        con.close()


def _refuse_rank_collisions(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """ConfigError (the import is rolled back) when an imported trace holds a (run, rank, step) that another
    trace of the warehouse holds: as ingest refuses such a file, so that no step is counted twice."""
    clash = con.execute(
        """
        select t.run, s.rank, string_agg(distinct t.path, ', ' order by t.path)
        from steps as s
        inner join traces as t using (trace_id)
        group by t.run, s.rank, s.step
        having count(distinct s.trace_id) > 1 and bool_or(s.trace_id in (select new_id from _id_map))
        order by all
        limit 1
        """
    ).fetchall()
    if clash:
        run, rank, paths = clash[0]
        raise ConfigError(
            f"{root}: importing it would give run {run} two traces of the same steps of rank {rank} ({paths}); "
            "nothing was imported. Import it into another warehouse (--db), or remove one of them from it"
        )
