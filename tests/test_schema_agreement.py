"""The event tables' columns are written in three places that must agree: the schema (sql/schema.sql), the
rows the DuckDB fast path writes (sql/batch_*.sql, by name) and the Arrow tables of the reference decoder
(traceq.ingest.decode). A column added to one and not the others fails here, not in a user's ingest."""

from __future__ import annotations

import duckdb
import pytest

from traceq.ingest import decode
from traceq.query import sql_text
from traceq.store.warehouse import connect

# table -> (its batch SELECT, the decoder's Arrow schema of it)
TABLES = {
    "gpu_events": ("batch_gpu_events.sql", decode.GPU_SCHEMA),
    "host_events": ("batch_host_events.sql", decode.HOST_SCHEMA),
    "trace_threads": ("batch_threads.sql", decode.META_SCHEMA),
}
# written after the events are in, not by either reader: the step that launched a device event
DERIVED = {"gpu_events": {"step", "step_source"}}


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    with connect(":memory:") as con:
        yield con


def _table_columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    return {c for (c,) in con.execute(
        "select column_name from duckdb_columns() where table_name = ? and schema_name = 'main'", [table]).fetchall()}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_the_batch_rows_the_decoder_and_the_schema_have_the_same_columns(con: duckdb.DuckDBPyConnection, table: str) -> None:
    batch, arrow = TABLES[table]
    expected = _table_columns(con, table) - DERIVED.get(table, set())
    assert {f.name for f in arrow} | {"trace_id"} == expected, "traceq.ingest.decode"
    text = sql_text(batch)
    select = text[text.index("\nselect") + 7:text.index("from _rows")]  # one column a line: `expr as name,` or `e.name,`
    aliases = {line.strip().rstrip(",").split(" as ")[-1].split(".")[-1] for line in select.splitlines() if line.strip()}
    assert aliases == expected, f"sql/{batch}"
