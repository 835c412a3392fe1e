"""What the parser fuzz (tests/test_fuzz.py) and the long fuzz run (benchmarks/fuzz_parser.py) share.

No pytest or hypothesis here, so the benchmark can import it on its own.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from traceq.decode import decode_chunk
from traceq.reader import read_trace


def parse(path: Path, chunk_bytes: int) -> int:
    """What ingest does before writing: read the header and decode every chunk. Returns the events."""
    header, chunks = read_trace(path, chunk_bytes)
    n = sum(decode_chunk(c).counts["events"] for c in chunks)
    assert isinstance(header.fields, dict)
    return n


def row_counts(db: Path) -> tuple[int, ...]:
    """(traces, gpu_events, host_events) rows in the warehouse at ``db``; zeros when there is none."""
    if not db.exists():
        return (0, 0, 0)
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "select (select count(*) from traces), (select count(*) from gpu_events), (select count(*) from host_events)"
        ).fetchall()[0]
    finally:
        con.close()
