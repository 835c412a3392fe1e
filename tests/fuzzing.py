"""What the parser fuzz (tests/test_fuzz.py) and the long fuzz run (benchmarks/fuzz_parser.py) share.

No pytest or hypothesis here, so the benchmark can import it on its own.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable
from pathlib import Path

import duckdb

from traceq.ingest.decode import decode_chunk
from traceq.ingest.reader import read_trace

# What gets spliced into a seed trace: JSON tokens anywhere, and valid JSON values of the wrong type
# or range in place of a value (VALUE_SPOT) or as an extra array element (after ELEMENT_SPOT's '}').
TOKENS = (b"{", b"}", b"[", b"]", b",", b'"', b":", b"\\", b"NaN", b"-", b"null", b'"ts": ', b"\xff\xfe",
          b"\x00", b"}, {", b'"traceEvents": [', b'"ph": "X"')
VALUES = (b'"12.5"', b'"NaN"', b"1e999", b"-1e999", b"-1", b"18446744073709551616", b"-9223372036854775809",
          b"null", b"true", b"{}", b"[]", b"[1.5]", b'{"a": [1, {}]}', b'"\\ud800"', b"0.0000001", b"1e300")
VALUE_SPOT = re.compile(rb'(?<=: )(-?\d[\d.eE+-]*|"(?:[^"\\]|\\.)*"|null|true|false)')
ELEMENT_SPOT = re.compile(rb"\}\s*,\s*\{")


def read_seeds(corpus: Path, names: Iterable[str]) -> list[bytes]:
    """The JSON of the corpus traces ``names`` that are present (decompressed)."""
    seeds = []
    for name in names:
        path = corpus / name
        if path.exists():
            data = path.read_bytes()
            seeds.append(gzip.decompress(data) if name.endswith(".gz") else data)
    return seeds


def parse(path: Path, chunk_bytes: int) -> int:
    """What ingest does before writing: read the header and decode every chunk. Returns the events."""
    header, chunks = read_trace(path, chunk_bytes)
    n = 0
    for c in chunks:  # the elements between each chunk's two bounds (dropped ones have no row)
        bounds = decode_chunk(c).column("bound").drop_null().to_pylist()
        n += max(bounds) - min(bounds) - 1
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
