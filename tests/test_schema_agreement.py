"""The event rows are described in places that must agree: the schema (sql/schema.sql), the rows the one
writer stores (sql/batch_*.sql, by name), and the parsed rows it reads, whichever parser made them (DuckDB's
sql/read_events.sql, or the Arrow rows of the reference decoder, traceq.ingest.decode). A column added to one
and not the others fails here, not in a user's ingest."""

from __future__ import annotations

import duckdb
import pytest

from pathlib import Path

from traceq.ingest.decode import decode_chunk
from traceq.ingest.native import batch_files
from traceq.ingest.pipeline import parse_batch, parser
from traceq.query import sql_text
from traceq.store.schema import execute_over
from traceq.store.warehouse import connect

# table -> its batch SELECT
TABLES = {"gpu_events": "batch_gpu_events.sql", "host_events": "batch_host_events.sql", "trace_threads": "batch_threads.sql"}
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
def test_the_batch_rows_and_the_schema_have_the_same_columns(con: duckdb.DuckDBPyConnection, table: str) -> None:
    batch = TABLES[table]
    expected = _table_columns(con, table) - DERIVED.get(table, set())
    text = sql_text(batch)
    select = text[text.index("\nselect") + 7:text.index("from _rows")]  # one column a line: `expr as name,` or `e.name,`
    aliases = {line.strip().rstrip(",").split(" as ")[-1].split(".")[-1] for line in select.splitlines() if line.strip()}
    assert aliases == expected, f"sql/{batch}"


def test_the_decoders_rows_have_the_columns_and_types_of_duckdbs(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    """Column for column, type for type, and on a few events value for value: but for the two columns
    that send a batch to the decoder (``odd``, ``unsure_file``). The dropped (no phase, a kernel's negative
    duration) are no row in either: the bounds count them."""
    events = b", ".join([
        b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2, "args": {"stream": 7}}',
        b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1, "dur": 3, "args": {"External id": 9}}',
        b'{"ph": "X", "cat": "kernel", "name": "nccl", "ts": 4, "dur": -1, "args": {"Collective name": "allreduce", '
        b'"Group size": 2, "Process Group Ranks": "[0, 1]", "rank": 1}}',
        b'{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "python"}}',
        b'{"ph": "M", "name": "thread_name", "pid": 1, "tid": 3}',
        b'{"ph": "M", "name": "process_sort_index", "pid": 1, "args": {"sort_index": 2}}',
        b'{"cat": "kernel", "name": "no phase", "ts": 6, "dur": 1}',
        b'{"ph": "i", "name": "instant", "ts": 6}',
    ])
    [files] = batch_files(iter([events]), str(tmp_path))  # as ingest writes it: between its two bounds
    parsed = parse_batch(parser(con), files, all_ops=True)
    decoded = con.from_arrow(decode_chunk(events, part=files.part))
    assert list(zip(decoded.columns, map(str, decoded.types))) == list(zip(parsed.columns, map(str, parsed.types)))
    rows = "select * exclude (odd, unsure_file) from _rows order by all"
    assert execute_over(con, rows, None, decoded) == execute_over(con, rows, None, parsed)
