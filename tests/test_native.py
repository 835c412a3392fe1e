"""DuckDB's JSON reader (traceq.ingest.native, the default) writes exactly the rows traceq.ingest.decode writes.

traceq.ingest.decode is the reference: typed msgspec decoding, exact times, tested against json/Decimal
parses in test_corpus.py. Every table of every corpus trace is compared row for row (names resolved,
since name ids are assigned in a different order), and hand-made traces cover what the corpus lacks.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.conftest import CORPUS, skip_or_fail
from tests.tracegen import TraceBuilder
from traceq.ingest import ingest_traces

TABLES = {
    "gpu_events": "select t.path, g.* exclude (trace_id, name_id), n.name from gpu_events g "
    "join names n using (trace_id, name_id) join traces t using (trace_id)",
    "host_events": "select t.path, h.* exclude (trace_id, name_id), n.name from host_events h "
    "join names n using (trace_id, name_id) join traces t using (trace_id)",
    "trace_threads": "select t.path, x.* exclude (trace_id) from trace_threads x join traces t using (trace_id)",
    "steps": "select t.path, s.* exclude (trace_id) from steps s join traces t using (trace_id)",
    "traces": "select path, rank_source, file_rank, world_size, n_events, n_gpu_events, n_host_events, n_dropped "
    "from traces",
}


def _rows(db: Path, query: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return sorted(con.execute(query).fetchall(), key=repr)
    finally:
        con.close()


def _both(paths: list[Path], tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    native, decoded = tmp_path / "native.duckdb", tmp_path / "decode.duckdb"
    summary = ingest_traces(paths, native, threads=2)
    assert summary.ok, [f.message for f in summary.files]
    assert ingest_traces(paths, decoded, native=False).ok
    return native, decoded, {f.path: f.message for f in summary.files}


@pytest.mark.slow
def test_native_rows_equal_decode_rows_on_the_corpus(tmp_path: Path) -> None:
    if not CORPUS.is_dir():
        skip_or_fail(f"corpus not found at {CORPUS} (needs ../shared/corpus beside the repository)")
    native, decoded, messages = _both([CORPUS], tmp_path)
    for table, query in TABLES.items():
        a, b = _rows(native, query), _rows(decoded, query)
        assert len(a) == len(b), table
        assert a == b, table
    # every corpus trace takes the fast path but two: epoch-microsecond times with ns fractions need
    # exact decimals, and a 2021 trace spells "external id" in lower case
    fell_back = {Path(p).name: m for p, m in messages.items() if m}
    assert sorted(fell_back) == ["rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "worker0.pt.trace.json.gz"], messages
    assert "epoch microseconds" in fell_back["rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]
    assert "external id" in fell_back["worker0.pt.trace.json.gz"]


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "job" / "trace.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    return path


def _odd_trace() -> dict:
    b = TraceBuilder(rank=3)
    b.step(1, 0, 100_000)
    b.kernel("ampere_sgemm", 10_000, 30_000, launch_ns=5_000)
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40_000, 60_000, stream=20, launch_ns=35_000,
             **{"Collective name": "allreduce", "Seq": 4, "Process Group Ranks": [0, 1], "Group size": 2})
    b.events += [
        {"ph": "X", "cat": "kernel", "name": "no_args", "pid": 0, "tid": "stream 9", "ts": 70.0, "dur": 1.5},
        {"ph": "X", "cat": "kernel", "name": "string_ts", "pid": 0, "tid": 7, "ts": "12.5", "dur": 1.0},
        {"ph": "X", "cat": "kernel", "name": "bool_dur", "pid": 0, "tid": 7, "ts": 12.5, "dur": True},
        {"ph": "X", "cat": "kernel", "name": "negative_dur", "pid": 0, "tid": 7, "ts": 12.5, "dur": -1},
        {"ph": "X", "cat": "kernel", "name": "huge", "pid": 0, "tid": 7, "ts": 1e300, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "hex_correlation", "pid": 0, "tid": 7, "ts": 80, "dur": 1,
         "args": {"correlation": "0x1f", "device": "1", "stream": "stream 3"}},
        {"ph": "X", "cat": "kernel", "name": "u64_correlation", "pid": 0, "tid": 7, "ts": 81, "dur": 1,
         "args": {"correlation": 2**64 - 1, "External id": 2**63}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": 10, "args": {"External id": 3}},
        {"ph": "X", "cat": "user_annotation", "name": "unicode \u00e9\u4e2d \"quoted\"", "pid": 1, "tid": 1, "ts": 5, "dur": 1},
        {"ph": "X", "name": "no_cat", "pid": 1, "tid": 1, "ts": 6, "dur": 1},
        {"ph": "X", "cat": 5, "name": 12, "pid": "x", "tid": None, "ts": 6, "dur": 1},
        {"ph": 7, "cat": "kernel", "name": "numeric_ph", "ts": 6, "dur": 1},
        {"ph": "i", "cat": "instant", "name": "i", "pid": 1, "tid": 1, "ts": 6},
        {"cat": "kernel", "name": "no_ph", "ts": 6, "dur": 1},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": 1, "args": {"labels": "CPU"}},
    ]
    return b.document()


@pytest.mark.slow
@pytest.mark.parametrize("device_properties", [True, False])
def test_native_rows_equal_decode_rows_on_odd_values(tmp_path: Path, device_properties: bool) -> None:
    doc = _odd_trace()
    if device_properties:
        doc = {"deviceProperties": [{"id": 0}], **doc}
    path = _write(tmp_path, doc)
    native, decoded, messages = _both([path], tmp_path)
    assert messages == {str(path): ""}  # the fast path read it
    for table, query in TABLES.items():
        assert _rows(native, query) == _rows(decoded, query), table


@pytest.mark.slow
@pytest.mark.parametrize(
    ("label", "event"),
    [
        ("epoch microseconds with a fraction", {"ts": 1712195495519689.047}),
        ("args that are not an object", {"args": 5}),
        ("a fractional id", {"args": {"correlation": 7.5}}),
        ("a collective's fractional size", {"args": {"Collective name": "allreduce", "In msg nelems": 2.5}}),
        ("a collective's sequence number as a fraction", {"args": {"Collective name": "allreduce", "Seq": "4.5"}}),
    ],
)
def test_what_duckdb_would_read_differently_goes_to_decode(tmp_path: Path, label: str, event: dict) -> None:
    doc = _odd_trace()
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "odd", "pid": 0, "tid": 7, "ts": 90, "dur": 1, **event})
    path = _write(tmp_path, doc)
    native, decoded, messages = _both([path], tmp_path)
    assert messages[str(path)].startswith("read by traceq.ingest.decode"), label
    for table, query in TABLES.items():
        assert _rows(native, query) == _rows(decoded, query), table


# JSON scalars as DuckDB's reader hands them to the macros: ids read as VARCHAR (a string's text
# without quotes, anything else as JSON text), times read as JSON (the value's JSON text).
SCALARS = [7, -3, 0, 7.0, -0.0, 1e5, 2**63 - 1, 2**63, -(2**63), 12.5, 1e999, True, False, None, "7", " 7", "0x1f",
           "-0x10", "stream 7", "stream x", "abc", "", "12.5", "1e3", [1], {"a": 1}]


def _macro(name: str, texts: list[str | None], json_typed: bool = False) -> list:
    from traceq.store.warehouse import connect

    con = connect(":memory:")
    arg = "t::json" if json_typed else "t"
    try:
        return [row[0] for row in con.execute(f"select {name}({arg}) from unnest($texts) with ordinality as u(t, i) order by i",
                                             {"texts": texts}).fetchall()]
    finally:
        con.close()


def test_json_int_reads_ids_as_traceq_decode_does() -> None:
    from traceq.kineto import to_int

    def as_varchar(v: object) -> str | None:  # what read_json gives a VARCHAR column
        return None if v is None else v if isinstance(v, str) else json.dumps(v).replace("Infinity", "1e999")

    # Not compared: fractions (below), and two strings no Kineto writes, where the cast and Python's
    # int() disagree: "-0x10" (decode -16, the cast null) and "1e3" (decode null, the cast 1000).
    whole = [v for v in SCALARS if not (isinstance(v, float) and not v.is_integer()) and v not in ("12.5", "-0x10", "1e3")]
    assert len(whole) == len(SCALARS) - 5
    assert _macro("json_int", [as_varchar(v) for v in whole]) == [to_int(v) for v in whole]
    # a fraction is rounded (read_events.sql sends a batch with one to traceq.ingest.decode)
    assert _macro("json_int", ["12.5", "7.4"]) == [13, 7]


def test_json_number_is_the_number_a_json_value_holds() -> None:
    texts = [None if v is None else json.dumps(v).replace("Infinity", "1e999") for v in SCALARS]
    expected = [float(json.loads(t)) if t is not None and not t.startswith(('"', "t", "f", "[", "{", "n")) else None
                for t in texts]
    assert _macro("json_number", texts, json_typed=True) == expected
    assert _macro("json_number", ["1e999", "-1e999", "1.5e-3"], json_typed=True) == [float("inf"), float("-inf"), 0.0015]


def test_no_room_for_scratch_files_falls_back_to_decode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch files that cannot be written (a full or missing temp directory) are not an error."""
    import types

    from traceq import scratch

    gone = types.SimpleNamespace(name=str(tmp_path / "gone"), cleanup=lambda: None)
    monkeypatch.setattr(scratch, "scratch_dir", lambda base: gone)
    path = _write(tmp_path, _odd_trace())
    summary = ingest_traces([path], tmp_path / "w.duckdb")
    assert summary.ok
    assert "cannot write scratch files" in summary.files[0].message
    assert _rows(tmp_path / "w.duckdb", TABLES["gpu_events"])  # the rows are there, from traceq.ingest.decode


def _many_kernels(n: int) -> TraceBuilder:
    b = TraceBuilder(rank=0)
    b.step(1, 0, 10_000 * n)
    for i in range(n):
        b.kernel(f"kernel_{i % 50}", 10_000 * i, 10_000 * i + 5_000, launch_ns=10_000 * i)
    return b


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["object", "bare array", "byte order mark", "gzip", "gzip, bare array"])
def test_file_ranges_hold_the_events_of_the_file(tmp_path: Path, layout: str) -> None:
    """Uncompressed files are cut by reading only around each cut, compressed ones into pieces of
    what is inflated, not copied into one (traceq.ingest.reader.read_trace_ranges): the chunks, parsed,
    are the file's events in order, its header too, with cuts next to strings holding "}, {" and an
    event larger than the window a cut is looked for in."""
    import gzip
    import os

    from traceq.ingest.chunks import FileRange, Pieces
    from traceq.ingest.reader import read_trace_ranges

    b = _many_kernels(20_000 if layout.startswith("gzip") else 6000)  # gzip: its first read takes 1.25 MB
    for i in range(0, len(b.events), 700):
        b.events[i]["args"]["note"] = '"}, {"ph": "X"}, {'
    b.events.insert(len(b.events) * 4 // 5, {"ph": "X", "cat": "kernel", "name": "k" * 100_000, "ts": 1, "dur": 1})
    b.events.insert(len(b.events) * 9 // 10, {"ph": "X", "cat": "kernel", "name": "k" * 300_000, "ts": 1, "dur": 1})
    doc = b.document(distributedInfo={"rank": 0}, traceName="t")
    bare = layout.endswith("bare array")
    text = json.dumps(doc["traceEvents"]) if bare else json.dumps(doc, indent=1)
    data = (b"\xef\xbb\xbf" if layout == "byte order mark" else b"") + text.encode()
    path = tmp_path / ("trace.json.gz" if layout.startswith("gzip") else "trace.json")
    path.write_bytes(gzip.compress(data) if layout.startswith("gzip") else data)

    header, pieces = read_trace_ranges(path, chunk_bytes=200_000)
    events, uncopied = [], 0
    with open(path, "rb") as f:
        for piece in pieces:
            if isinstance(piece, FileRange):
                uncopied += 1
                piece = os.pread(f.fileno(), piece.length, piece.offset)
            elif isinstance(piece, Pieces):
                uncopied += 1
                piece = b"".join(piece.parts)
            events += json.loads(b"[" + piece + b"]")
    assert uncopied > 5  # most of the file went by range or in pieces, not copied into one bytes object
    assert events == doc["traceEvents"]
    expected = {} if bare else {k: v for k, v in doc.items() if k != "traceEvents"}
    assert header.fields == expected


@pytest.mark.slow
def test_external_id_in_both_spellings_goes_to_decode(tmp_path: Path) -> None:
    """2021 traces spell it "External id" on CPU ops and "external id" on kernels; one struct type
    cannot hold both, so such a file is read by traceq.ingest.decode (here the lower case comes last)."""
    b = _many_kernels(20_000)
    for ev in b.events[-50:]:
        if "External id" in ev.get("args", {}):
            ev["args"]["external id"] = ev["args"].pop("External id")
    path = b.write(tmp_path / "job" / "trace.json")
    native, decoded, messages = _both([path], tmp_path)
    assert "external id" in messages[str(path)]
    for table, query in TABLES.items():
        assert _rows(native, query) == _rows(decoded, query), table


@pytest.mark.slow
def test_a_file_without_device_properties_drops_its_cpu_operators_from_its_first_gpu_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without deviceProperties a file is parsed with every CPU operator; the writer keeps them while
    no batch has shown GPU activity, leaves them out from then on and deletes those kept at the end:
    the rows equal the reference decoder's, each batch parsed once. Small chunks and one chunk per
    batch make several batches of a small file (which is otherwise parsed in one batch)."""
    from traceq.ingest import native, plan
    from traceq.ingest.native import Executor

    b = TraceBuilder(rank=0)
    for i in range(3000):  # CPU operators first: the first batches have no GPU activity
        b.events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 100, "tid": 1,
                         "ts": i, "dur": 0.5, "args": {"External id": i}})
    for n in range(4):
        b.step(n, 4_000_000 + n * 1_000_000, 4_900_000 + n * 1_000_000)
        for k in range(300):
            start = 4_000_000 + n * 1_000_000 + k * 2_000
            b.kernel(f"sgemm_{k % 5}", start + 500, start + 1_500, launch_ns=start)
            if k % 20 == 0:  # negative durations: an operator's drop is the trace's only while it is kept
                for cat in ("cpu_op", "user_annotation"):
                    b.events.append({"ph": "X", "cat": cat, "name": "bad", "pid": 100, "tid": 1, "ts": start,
                                     "dur": -1, "args": {"External id": 10**6 + k}})
    path = b.write(tmp_path / "job" / "trace.json")
    parsed: list[tuple[str, ...]] = []  # the batch files of each parse

    class Recording(Executor):
        def parse(self, cursor, statement, params):
            parsed.append(tuple(params["files"]))
            return super().parse(cursor, statement, params)

    monkeypatch.setattr(plan, "WHOLE_FILE_BATCH_BYTES", 0)
    monkeypatch.setattr(native, "BATCH_BYTES", 1)
    native_db, decoded_db = tmp_path / "native.duckdb", tmp_path / "decode.duckdb"
    summary = ingest_traces([path], native_db, chunk_bytes=64 << 10, executor=Recording())
    assert summary.ok and summary.files[0].message == ""
    assert ingest_traces([path], decoded_db, native=False).ok
    assert _rows(native_db, "select n_dropped from traces") == [(60,)]  # the annotations: 4 steps x 15
    assert len(parsed) == len(set(parsed)) > 1, parsed  # several batches, none parsed twice
    for table, query in TABLES.items():
        assert _rows(native_db, query) == _rows(decoded_db, query), table


@pytest.mark.slow
def test_a_file_read_in_one_batch_or_in_growing_batches_gives_the_decoders_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small file is read in one batch, even without deviceProperties; a large one batch by batch:
    either way the rows are the reference decoder's (the same file is read as both by moving the line
    between them)."""
    from traceq.ingest import plan

    b = _many_kernels(20_000)
    for i in range(3000):
        b.events.insert(0, {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 100, "tid": 1,
                            "ts": i, "dur": 0.5, "args": {"External id": i}})
    path = b.write(tmp_path / "job" / "trace.json")
    assert b"deviceProperties" not in path.read_bytes()
    chunk = path.stat().st_size // 8
    native_db, decoded_db = tmp_path / "native.duckdb", tmp_path / "decode.duckdb"
    assert ingest_traces([path], native_db, chunk_bytes=chunk).ok
    monkeypatch.setattr(plan, "WHOLE_FILE_BATCH_BYTES", path.stat().st_size - 1)
    assert ingest_traces([path], tmp_path / "large.duckdb", chunk_bytes=chunk).ok
    assert ingest_traces([path], decoded_db, native=False).ok
    # decoded in chunks, several to a batch
    assert ingest_traces([path], tmp_path / "chunks.duckdb", chunk_bytes=chunk, native=False).ok
    for table, query in TABLES.items():
        assert _rows(native_db, query) == _rows(decoded_db, query), table
        assert _rows(tmp_path / "large.duckdb", query) == _rows(decoded_db, query), table
        assert _rows(tmp_path / "chunks.duckdb", query) == _rows(decoded_db, query), table


@pytest.mark.slow
@pytest.mark.parametrize("odd", [False, True])
def test_the_fast_path_imports_neither_numpy_nor_pyarrow(tmp_path: Path, odd: bool) -> None:
    import subprocess
    import sys

    doc = _odd_trace()
    if odd:  # read by traceq.ingest.decode, which needs both
        doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 90, "dur": 1,
                                   "args": {"correlation": 7.5}})
    path = _write(tmp_path, doc)
    code = (
        "import json, sys\nfrom traceq.ingest import ingest_traces\n"
        f"summary = ingest_traces([{str(path)!r}], {str(tmp_path / 'w.duckdb')!r})\n"
        "print(json.dumps([summary.ok, summary.files[0].message, [m for m in ('numpy', 'pyarrow') if m in sys.modules]]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    ok, message, heavy = json.loads(run.stdout)
    assert ok
    assert message.startswith("read by traceq.ingest.decode") == odd, message
    assert heavy == (["numpy", "pyarrow"] if odd else [])
    assert "leaked" not in run.stderr, run.stderr[:500]


@pytest.mark.slow
@pytest.mark.parametrize("leading_devices", [False, True], ids=["devices_after", "devices_first"])
def test_a_cpu_operator_without_a_name_is_left_out_as_the_decoder_leaves_it_out(tmp_path: Path, leading_devices: bool) -> None:
    """A ``cpu_op`` with no name on a trace with GPU activity is an operator no metric reads: not
    stored, not counted, on both paths (review finding: the native path kept it)."""
    b = TraceBuilder(rank=0)
    b.step(1, 0, 100_000)
    b.kernel("sgemm", 10_000, 20_000, launch_ns=5_000)
    b.events.append({"ph": "X", "cat": "cpu_op", "pid": 100, "tid": 1, "ts": 30, "dur": 5, "args": {}})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 1, "ts": 40, "dur": 5})
    doc = b.document()
    devices = {"deviceProperties": [{"id": 0, "name": "NVIDIA H100"}]}
    path = tmp_path / "job" / "rank0.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**devices, **doc} if leading_devices else {**doc, **devices}))
    native, decoded, _ = _both([path], tmp_path)
    for table, query in TABLES.items():
        assert _rows(native, query) == _rows(decoded, query), table
    # the step marker and the launch: the two operators are left out (n_host_events)
    assert _rows(native, "select n_host_events from traces") == [(2,)]


@pytest.mark.slow
@pytest.mark.parametrize("order", ["kernel first", "bad ts first"])
def test_an_epoch_time_with_a_fraction_is_exact_beside_a_time_that_is_no_number(tmp_path: Path, order: str) -> None:
    """float64 cannot hold epoch microseconds to the ns: such a chunk is decoded again with exact
    decimals, also where another span's ts is a string (it rounded to ...500 when the host and device
    spans were decoded as one list, review finding); both parsers store the exact ns."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "__epoch__", "dur": 1.5,
              "args": {"stream": 7}}
    bad = {"ph": "X", "cat": "user_annotation", "name": "bad", "pid": 1, "tid": 1, "ts": "x", "dur": 1}
    events = [kernel, bad] if order == "kernel first" else [bad, kernel]
    path = tmp_path / "job" / "trace.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"traceEvents": events}).replace('"__epoch__"', "1712345678901234.567"))
    native, decoded, _ = _both([path], tmp_path)
    for db in (native, decoded):
        assert _rows(db, "select start_ns, dur_ns from gpu_events") == [(1712345678901234567, 1500)]
        assert _rows(db, "select n_events, n_dropped from traces") == [(2, 1)]


def test_decoded_chunks_are_batched_up_to_the_batch_size_with_the_policy_of_the_header() -> None:
    """The decoder's chunks are written several to a batch, up to its bytes; with every CPU operator
    (no deviceProperties) each batch keeps them, GPU activity or not (the writer decides what it writes)."""
    from traceq.catalog import StepMarker
    from traceq.ingest.pipeline import decoded_batches

    def chunk(cat: str, n: int) -> bytes:
        return ", ".join(json.dumps({"ph": "X", "cat": cat, "name": f"{cat}{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1})
                         for i in range(n)).encode()

    chunks = [chunk("cpu_op", 3), chunk("kernel", 2), chunk("cpu_op", 4), chunk("cpu_op", 5)]
    seen = []
    for batch in decoded_batches(iter(chunks), True, StepMarker(), batch_bytes=len(chunks[0]) + len(chunks[1])):
        spans, ops, kernels = _counted(batch.rows)
        seen.append((batch.rows.num_rows, spans, ops, kernels))
    assert seen == [(5 + 2 * 2, 5, 3, 2), (9 + 2 * 2, 9, 9, 0)]  # and each chunk's two bounds
    (without,) = decoded_batches(iter(chunks), False, StepMarker())
    assert _counted(without.rows) == (2, 0, 2)


def _counted(rows: object) -> tuple[int, int, int]:
    """(spans, CPU operators kept as spans, kernels) of decoded rows."""
    return duckdb.sql("select count(*) filter (where span), count(*) filter (where plain_op and span), "
                      "count(*) filter (where kind = 1) from rows").fetchall()[0]
