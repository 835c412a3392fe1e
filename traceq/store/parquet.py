"""The warehouse as a directory of Parquet files, partitioned by run and rank (hive style).

Layout, one folder per warehouse table::

    DIR/gpu_events/run=<run>/rank=<rank>/<name>.parquet     tables with trace_id and rank
    DIR/traces/run=<run>/<name>.parquet                    tables with trace_id or run, no rank
    DIR/kernel_rules/<name>.parquet                        user rules only (builtin ones ship with traceq)

Every file also holds its ``run`` (and ``rank``) column, so any Parquet reader gets the right types
without parsing folder names: ``polars.scan_parquet("DIR/gpu_events/**/*.parquet")`` or DuckDB's
``read_parquet('DIR/gpu_events/**/*.parquet')``. Event tables carry ``run`` in addition to the
warehouse columns. A trace counts once its ``traces`` row is written (it is written last), so a
writer that dies half-way leaves nothing that a report would read.

:func:`open_parquet` serves such a directory as a read-only warehouse (DuckDB views), so every
report runs on it unchanged; :mod:`traceq.store.export` writes it and loads it into a DuckDB warehouse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import duckdb

from traceq.errors import WarehouseError
from traceq.query import sql_text
from traceq.store.export_check import check_export
from traceq.store.schema import builtin_rules, prepare_session

# Written last, read first: a trace's rows count only once its traces row exists.
TRACES = "traces"
# Tables keyed by run alone: one row per key when several writers each wrote the run's row.
ONE_ROW_PER = {"runs": ("run",), "run_settings": ("run", "key")}
_NEWEST_FIRST = {"runs": "created_at", "run_settings": "set_at desc"}
# tables renamed since (new name: old name), read from exports written before
FORMER_NAMES = {"step_wall_times": "step_windows"}
_TRACE_FILE = re.compile(r"^trace(\d+)_")
# Tables of up to this many rows are copied into the in-memory database by open_parquet.
IN_MEMORY_ROWS = 1_000_000


@dataclass(frozen=True)
class _Table:
    name: str
    columns: tuple[str, ...]
    partition: tuple[str, ...]  # () = one unpartitioned folder
    joins_run: bool  # has trace_id but no run column: run comes from traces


def warehouse_tables(con: duckdb.DuckDBPyConnection) -> list[_Table]:
    """The warehouse's own tables (not temp ones) with their partition columns, traces last."""
    rows = con.execute(
        """
        select c.table_name, list(c.column_name order by c.column_index)
        from duckdb_columns() as c
        inner join duckdb_tables() as t
            on t.database_name = c.database_name and t.schema_name = c.schema_name and t.table_name = c.table_name
        where c.database_name = current_database() and c.schema_name = 'main' and not t.temporary
            and c.table_name <> 'warehouse_info'
        group by c.table_name
        order by c.table_name = 'traces', c.table_name
        """
    ).fetchall()
    out = []
    for name, columns in rows:
        cols = set(columns)
        keyed = "trace_id" in cols or "run" in cols
        partition = (("run", "rank") if "rank" in cols else ("run",)) if keyed else ()
        out.append(_Table(name, tuple(columns), partition, "trace_id" in cols and "run" not in cols))
    return out


def _select(table: _Table) -> str:
    if table.name == "kernel_rules":
        return "select * from kernel_rules where source = 'user'"
    if table.joins_run:
        cols = ", ".join(f"x.{c}" for c in table.columns)
        return f"select t.run, {cols} from {table.name} as x inner join traces as t using (trace_id)"
    return f"select * from {table.name}"


def write_partitions(con: duckdb.DuckDBPyConnection, directory: Path, file_prefix: str = "data") -> dict[str, int]:
    """Write every table of ``con`` under ``directory`` in the layout above; rows written per table.

    Files are named ``<file_prefix>_<i>.parquet``; files of other prefixes are left alone, files of
    the same prefix are replaced (so a writer per trace can re-run).
    """
    written: dict[str, int] = {}
    for table in warehouse_tables(con):
        if table.name == "kernel_rules" and file_prefix != "data":
            continue  # per-trace writers have no user rules
        n = con.execute(f"select count(*) from ({_select(table)})").fetchall()[0][0]
        written[table.name] = n
        if n == 0:
            continue
        target = directory / table.name
        target.mkdir(parents=True, exist_ok=True)
        options = f"format parquet, filename_pattern '{file_prefix}_{{i}}', overwrite_or_ignore true"
        if table.partition:
            options += f", partition_by ({', '.join(table.partition)}), write_partition_columns true"
        else:
            target = target / f"{file_prefix}_0.parquet"
        con.execute(f"copy ({_select(table)}) to ? ({options})", [str(target)])
    return written


def is_parquet_dir(path: str | Path) -> bool:
    """True when ``path`` is a directory written by :func:`export_parquet` or a cluster ingest."""
    return Path(path).is_dir() and (Path(path) / TRACES).is_dir()


def open_parquet(directory: str | Path, *, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB whose warehouse tables are views over the Parquet files in ``directory``.

    The usual SQL (``gpu_activity``, metrics, reports) runs on it unchanged. Builtin kernel rules
    come from this traceq; user rules from the directory.
    """
    root = Path(directory)
    if not read_only:
        raise WarehouseError(f"{root}: a Parquet directory is read-only; ingest into a .duckdb file instead")
    if not is_parquet_dir(root):
        raise WarehouseError(
            f"{root}: not a traceq Parquet directory (no {TRACES}/ folder); write one with `traceq export --parquet {root}`"
        )
    check_export(root)  # damage said in one line, before a view over it reads wrong
    con = duckdb.connect(":memory:")
    con.execute(sql_text("schema.sql"))
    con.executemany("insert into kernel_rules values (?, ?, ?, ?, ?, 'builtin')", builtin_rules())
    for name, query in parquet_queries(con, root).items():
        if name == "kernel_rules":
            con.execute(f"insert into kernel_rules {query} where source = 'user'")
            continue
        rows = con.execute(
            f"select coalesce(sum(num_rows), 0) from parquet_file_metadata({_literal(str(root / name / '**' / '*.parquet'))})"
        ).fetchall()[0][0]
        con.execute(f"drop table {name}")
        # Small tables are read into memory once (reports join them repeatedly); the rest stay views.
        kind = "table" if rows <= IN_MEMORY_ROWS else "view"
        con.execute(f"create {kind} {name} as {query}")
    prepare_session(con)
    return con


def parquet_queries(con: duckdb.DuckDBPyConnection, root: Path) -> dict[str, str]:
    """For each table of ``con``'s schema with files under ``root``: a query reading them, cast to
    the schema's types (one row per run where several writers wrote it; complete traces only)."""
    queries = {}
    for table in warehouse_tables(con):
        files = root / table.name
        if table.name in FORMER_NAMES and not files.is_dir():
            files = root / FORMER_NAMES[table.name]  # an export written before the table's rename
        if not any(files.rglob("*.parquet")):
            continue  # nothing written: the table stays empty
        types = dict(
            con.execute(
                "select column_name, data_type from duckdb_columns() where database_name = current_database() "
                "and schema_name = 'main' and table_name = ?",
                [table.name],
            ).fetchall()
        )
        source = f"read_parquet({_literal(str(files / '**' / '*.parquet'))}, union_by_name = true)"
        present = {row[0] for row in con.execute(f"describe select * from {source}").fetchall()}
        # columns added since the files were written (e.g. steps.source) read as null
        exprs = {c: c if c in present else "null" for c in table.columns}
        if table.name == TRACES:
            exprs["content_digest"] = _digest_expression(con, source)
        cols = ", ".join(f"cast({exprs[c]} as {types[c]}) as {c}" for c in table.columns)
        query = f"select {cols} from {source}"
        if table.name in ONE_ROW_PER:
            keys = ", ".join(ONE_ROW_PER[table.name])
            query = f"select distinct on ({keys}) * from ({query}) order by {keys}, {_NEWEST_FIRST[table.name]}"
        elif "trace_id" in table.columns and table.name != TRACES:
            query += f" where trace_id in (select trace_id from {_traces_source(root)})"
        queries[table.name] = query
    return queries


def _digest_expression(con: duckdb.DuckDBPyConnection, source: str) -> str:
    """The content digest of the traces files read by ``source``: those written before BLAKE3 have
    ``content_sha256``, the bare SHA-256 hex (see ``traceq.store.warehouse._migrate``)."""
    names = {row[0] for row in con.execute(f"describe select * from {source}").fetchall()}
    legacy = "'sha256:' || content_sha256"
    if "content_sha256" not in names:
        return "content_digest"
    return f"coalesce(content_digest, {legacy})" if "content_digest" in names else legacy


def _traces_source(root: Path) -> str:
    return f"read_parquet({_literal(str(root / TRACES / '**' / '*.parquet'))}, union_by_name = true)"


def _literal(text: str) -> str:
    """A SQL string literal (table functions in a view cannot take parameters)."""
    return "'" + text.replace("'", "''") + "'"


def next_trace_id(directory: str | Path) -> int:
    """A trace id above every id used in ``directory`` (complete traces and files of unfinished ones)."""
    root = Path(directory)
    top = 0
    if root.is_dir():
        for f in root.rglob("trace*_*.parquet"):
            m = _TRACE_FILE.match(f.name)
            if m:
                top = max(top, int(m.group(1)))
        if any((root / TRACES).rglob("*.parquet")):
            con = duckdb.connect(":memory:")
            try:
                pattern = str(root / TRACES / "**" / "*.parquet")
                found = con.execute("select max(trace_id) from read_parquet(?)", [pattern]).fetchall()[0][0]
            finally:
                con.close()
            top = max(top, found or 0)
    return top + 1


def known_digests(directory: str | Path) -> dict[int, set[str]]:
    """Content digests of the traces in ``directory``, by file size."""
    root = Path(directory)
    out: dict[int, set[str]] = {}
    if not any((root / TRACES).rglob("*.parquet")):
        return out
    con = duckdb.connect(":memory:")
    try:
        source = _traces_source(root)
        for size, digest in con.execute(f"select size_bytes, {_digest_expression(con, source)} from {source}").fetchall():
            out.setdefault(size, set()).add(digest)
    finally:
        con.close()
    return out


def steps_by_trace(directory: str | Path) -> dict[int, tuple[str, str, list[tuple[int, int]]]]:
    """trace id -> (its run, its file's path, its (rank, step) pairs), for the complete traces in ``directory``."""
    root = Path(directory)
    if not any((root / TRACES).rglob("*.parquet")) or not any((root / "steps").rglob("*.parquet")):
        return {}
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(
            f"""
            select t.trace_id, any_value(t.run), any_value(t.path), list((s.rank, s.step))
            from {_traces_source(root)} as t
            inner join read_parquet({_literal(str(root / 'steps' / '**' / '*.parquet'))}) as s using (trace_id)
            group by t.trace_id
            """
        ).fetchall()
    finally:
        con.close()
    return {trace_id: (run, path, [tuple(pair.values()) if isinstance(pair, dict) else tuple(pair) for pair in pairs])
            for trace_id, run, path, pairs in rows}
