"""The warehouse's tables and what every connection needs: the schema (``sql/schema.sql``) and its
migrations, the kernel classification rules, the session settings, and small helpers for statements
that read rows handed over from Python."""

from __future__ import annotations

import csv
import json
import re
from functools import cache
from pathlib import Path

import duckdb

from traceq.catalog import StepMarker, event_categories
from traceq.errors import ConfigError, WarehouseError
from traceq.query import sql_text
from traceq.store.derive import device_properties, gpu_model_of, write_steps

# 2: step markers and device windows (steps.source, traces.step_marker/devices/gpu_model, warehouse_info,
# step_windows renamed step_wall_times)
SCHEMA_VERSION = 2
# the tables of sql/schema.sql (a database holding none of them is not a traceq warehouse)
TRACEQ_TABLES = frozenset(re.findall(r"create table if not exists (\w+)", sql_text("schema.sql")))
_ADDED_COLUMNS = (
    ("traces", "step_marker", "varchar"),
    ("traces", "devices", "json"),
    ("traces", "gpu_model", "varchar"),
    ("steps", "source", "varchar"),
)
RULE_COLUMNS = ("priority", "pattern", "class", "category", "collective")
# comm, compute; memcpy: device copies that are not cat gpu_memcpy (MTIA dma); sync: a stream waiting on
# another's event, not work (left out of every interval)
RULE_CLASSES = ("comm", "compute", "memcpy", "sync")


# columns a migration renames: (table, column) -> its former name
FORMER_COLUMNS = {("traces", "content_digest"): "content_sha256"}


@cache
def schema_columns() -> dict[str, tuple[str, ...]]:
    """Each table of ``sql/schema.sql`` and its columns, as this traceq makes them."""
    with duckdb.connect(":memory:") as con:
        con.execute(sql_text("schema.sql"))
        rows = con.execute("select table_name, column_name from duckdb_columns() where schema_name = 'main' "
                           "order by table_name, column_index").fetchall()
    columns: dict[str, list[str]] = {}
    for table, column in rows:
        columns.setdefault(table, []).append(column)
    return {t: tuple(c) for t, c in columns.items()}


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables (``sql/schema.sql``), bring an older warehouse up to date and load the builtin
    kernel rules, in one transaction (one WAL write: 25 ms less than one each)."""
    con.begin()
    try:
        con.execute(sql_text("schema.sql"))
        _migrate(con)
        _load_builtin_rules(con)
        con.commit()
    except BaseException:
        rollback(con)
        raise


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back after an error. A transaction DuckDB has ended already (a full disk, an I/O error)
    is left as it is, so that the error that ended it is the one the caller sees, not
    "cannot rollback - no transaction is active"."""
    try:
        con.rollback()
    except duckdb.Error:
        pass


def prepare_session(con: duckdb.DuckDBPyConnection) -> None:
    """What every traceq connection needs: the macros (``sql/macros.sql``), and ASOF joins as ASOF joins.

    DuckDB plans an ASOF join whose right side it estimates below ``asof_loop_join_threshold`` rows (64)
    as a nested loop and an aggregate; its estimates of traceq's composed queries are far too low (131
    rows for 385,000 segments against 153 step windows), and the loop took 0.72 of 0.89 s on the 500 MB
    trace where the ASOF join takes 0.01.
    """
    con.execute(sql_text("macros.sql"))
    con.execute("set asof_loop_join_threshold = 0")


def schema_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The warehouse's schema version; None for one made before versions were recorded (or empty)."""
    try:
        row = fetch_one(con, "select value from warehouse_info where key = 'schema_version'")
    except duckdb.CatalogException:
        return None
    return int(row[0]) if row else None


def _migrate(con: duckdb.DuckDBPyConnection) -> None:
    """Bring a warehouse made by an older traceq up to ``schema.sql`` (inside ``connect``'s transaction)."""
    columns = {name for (name,) in con.execute(
        "select column_name from duckdb_columns() where database_name = current_database() "
        "and schema_name = 'main' and table_name = 'traces'"
    ).fetchall()}
    if "content_sha256" in columns:  # until BLAKE3: the bare SHA-256 hex (traceq.ingest.digests.file_digest)
        con.execute("alter table traces rename column content_sha256 to content_digest")
        con.execute("update traces set content_digest = 'sha256:' || content_digest")
    version = schema_version(con)
    if version == SCHEMA_VERSION:
        return
    for table, column, kind in _ADDED_COLUMNS:
        con.execute(f"alter table {table} add column if not exists {column} {kind}")
    if _has_table(con, "step_windows"):  # schema 1's name for step_wall_times ("window" meant three things)
        con.execute("insert into step_wall_times select * from step_windows")
        con.execute("drop table step_windows")
    if version is None and fetch_one(con, "select count(*) from traces")[0]:
        _derive_again(con)
    con.execute(
        "insert or replace into warehouse_info (key, value) values ('schema_version', ?)", [str(SCHEMA_VERSION)]
    )


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute(
        "select count(*) from duckdb_tables() where database_name = current_database() and schema_name = 'main' "
        "and table_name = ?", [name]).fetchall()[0][0])


def _derive_again(con: duckdb.DuckDBPyConnection) -> None:
    """Version 1 -> 2: steps, step attribution and GPU model of every trace as this traceq derives them
    (device windows, docs/explanation/metrics.md: ranks without steps get one over the whole trace; time containment only
    where a rank has neither launches nor device-side step annotations)."""
    params = {**event_categories().sql_params(), **StepMarker().sql_params()}
    con.execute("update steps set source = 'marker' where source is null")
    traces = con.execute("select trace_id, header from traces order by trace_id").fetchall()
    for trace_id, header in traces:
        con.execute("delete from steps where trace_id = ?", [trace_id])
        con.execute("update gpu_events set step = null, step_source = null where trace_id = ?", [trace_id])
        write_steps(con, [trace_id], params)
        devices = device_properties((json.loads(header) if header else {}).get("deviceProperties"))
        con.execute(
            "update traces set step_marker = ?, devices = ?, gpu_model = ? where trace_id = ?",
            [StepMarker().pattern, json.dumps(devices) if devices else None, gpu_model_of(con, trace_id, devices), trace_id],
        )


SIDE_TABLES = ("run_files", "run_settings", "step_wall_times", "power_logs", "power_samples")


def require_side_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Raise WarehouseError when the warehouse predates the run metadata and power tables."""
    # views too: a Parquet directory is opened as views (traceq.store.export); duckdb_tables() and
    # duckdb_views() answer in 1 ms where information_schema.tables takes 6-8
    have = {name for (name,) in con.execute(
        "select table_name from duckdb_tables() where database_name = current_database() and schema_name = 'main' "
        "union all select view_name from duckdb_views() where database_name = current_database() and schema_name = 'main'"
    ).fetchall()}
    missing = [t for t in SIDE_TABLES if t not in have]
    if missing:
        raise WarehouseError(
            f"this warehouse was made by an older traceq (no {', '.join(missing)} table); run `traceq ingest` "
            "on it once (files already in it are skipped) to add them, then re-ingest for power data"
        )


def execute_over(con: duckdb.DuckDBPyConnection, statement: str, params: object, rows: object) -> list[tuple]:
    """Execute ``statement``, which reads ``rows`` (an Arrow table or a materialized relation, even one
    of another cursor) as ``_rows``; its result rows.

    DuckDB's replacement scan finds ``_rows`` among this frame's variables. A table registered with
    ``con.register`` inside a transaction stays referenced until the transaction ends, so an ingest
    that registered each batch or chunk would hold the whole file in memory.
    """
    _rows = rows
    try:
        return con.execute(statement, params).fetchall()
    finally:
        del _rows


def fetch_one(con: duckdb.DuckDBPyConnection, query: str, params: object = None) -> tuple:
    """The first row of ``query`` (or None), with the result fully consumed."""
    rows = con.execute(query, params).fetchall()
    return rows[0] if rows else None  # type: ignore[return-value]


def builtin_rules() -> list[tuple]:
    """The kernel classification rules shipped in ``sql/kernel_rules.csv``."""
    return read_rules(sql_text("kernel_rules.csv"), "kernel_rules.csv")


def read_rules(text: str, source_name: str) -> list[tuple]:
    """Parse a rules CSV (columns priority,pattern,class,category,collective) into rows; ConfigError
    naming the line of the first bad row (the whole file is read before anything is stored)."""
    rows = []
    reader = csv.reader(text.splitlines())
    header = next(reader, None) or []
    missing = [c for c in RULE_COLUMNS if c not in header]
    extra = [c for c in header if c not in RULE_COLUMNS]
    if missing or extra or len(header) != len(RULE_COLUMNS):
        what = f"missing columns {missing}" if missing else f"unknown or repeated columns {extra or header}"
        raise ConfigError(f"{source_name}: {what}; the header must be {','.join(RULE_COLUMNS)}")
    for values in reader:
        line = reader.line_num
        if not any(v.strip() for v in values):
            continue  # a blank line
        if len(values) != len(header):
            raise ConfigError(f"{source_name}:{line}: {len(values)} fields, the header has {len(header)}")
        row = dict(zip(header, values))
        if row["class"] not in RULE_CLASSES:
            raise ConfigError(f"{source_name}:{line}: class must be one of {', '.join(RULE_CLASSES)}, not {row['class']!r}")
        try:
            priority = int(row["priority"])
        except ValueError:
            raise ConfigError(f"{source_name}:{line}: priority must be an integer, not {row['priority']!r}") from None
        if not -(2**31) <= priority < 2**31:
            raise ConfigError(f"{source_name}:{line}: priority {priority} is out of range (a 32-bit integer)")
        if not row["pattern"] or not row["category"]:
            raise ConfigError(f"{source_name}:{line}: pattern and category must not be empty")
        rows.append((priority, row["pattern"], row["class"], row["category"], row["collective"] or None))
    return rows


def _load_builtin_rules(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("delete from kernel_rules where source = 'builtin'")
    columns = [list(column) for column in zip(*builtin_rules())]  # one insert, not one per rule
    con.execute(
        "insert into kernel_rules select unnest($1), unnest($2), unnest($3), unnest($4), unnest($5), 'builtin'",
        columns,
    )


# User rules a warehouse holds at most: every kernel name is matched against each rule, so a report's cost
# grows with them (and a listing of a million rules took gigabytes)
MAX_USER_RULES = 10_000


def add_rules(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """Add user classification rules from a CSV file; they win over builtin rules of equal priority.

    The whole file is checked first (every row, every pattern), then stored in one transaction with
    one insert: a bad row or a kill leaves the rules as they were. Rules reclassify data already
    ingested, so half a file would change every reported figure.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the rules file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save the rules file as UTF-8") from None
    if text.count("\n") > MAX_USER_RULES + 1:  # before parsing: a file of a million rules is refused at once
        raise ConfigError(f"{path}: {text.count(chr(10)):,} lines, more than the {MAX_USER_RULES:,} user rules a "
                          "warehouse holds; merge rules into fewer patterns (a|b)")
    rows = read_rules(text, str(path))
    if not rows:
        raise ConfigError(f"{path}: holds no rule, only a header")
    held = con.execute("select count(*) from kernel_rules where source = 'user'").fetchall()[0][0]
    if held + len(rows) > MAX_USER_RULES:
        raise ConfigError(f"{path}: {len(rows):,} rules, and the warehouse holds {held:,} user rules already: more than "
                          f"the {MAX_USER_RULES:,} it holds; merge rules into fewer patterns (a|b)")
    patterns = [r[1] for r in rows]
    try:  # every pattern in one query; on an error, find the row it came from
        con.execute("select count(regexp_matches('', p)) from unnest(?) as t(p)", [patterns])
    except duckdb.Error:
        for priority, pattern, *_ in rows:
            try:
                con.execute("select regexp_matches('', ?)", [pattern])
            except duckdb.Error as exc:
                raise ConfigError(
                    f"{path}: bad pattern {pattern!r} (priority {priority}): {str(exc).splitlines()[0]}"
                ) from None
        raise
    columns = [list(column) for column in zip(*rows)]
    con.begin()
    try:
        con.execute(
            "insert into kernel_rules select unnest($1), unnest($2), unnest($3), unnest($4), unnest($5), 'user'",
            columns,
        )
        con.commit()
    except BaseException:
        rollback(con)
        raise
    return len(rows)


def list_rules(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyRelation:
    """The kernel rules in force, the one that wins first (``traceq rules``)."""
    return con.sql("select * from kernel_rules order by priority, source desc")
