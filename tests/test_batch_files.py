"""Chunks reach DuckDB as scratch files (traceq.ingest.native.BatchFiles): ranges of an uncompressed
trace copied by sendfile, decompressed bytes written. The rows are those of traceq.ingest.decode; a
parse that stops early (a malformed event, a trace shorter than its range) leaves no scratch file; a
batch's files stay until it is removed (read again, searched for text)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest

import traceq.ingest.native as native
import traceq.ingest.pipeline as pipeline
from tests.test_native import TABLES, _many_kernels, _rows
from traceq.ingest import ingest_traces
from traceq.ingest.chunks import FileRange

CHUNK = 32 << 10  # small chunks: a trace of a few MB is many ranges, several files per batch


def _scratch_left() -> list[str]:
    return [n for n in os.listdir(native.scratch_base()) if n.startswith(f"traceq-{os.getpid()}-")]


def _trace(tmp_path: Path, kernels: int = 6000) -> Path:
    b = _many_kernels(kernels)
    for i in range(0, kernels, 10):  # host events too, and names that need escaping
        b.events.append({"ph": "X", "cat": "cuda_runtime", "name": 'cudaLaunchKernel "x"\n', "pid": 100, "tid": 1,
                         "ts": i * 10 + 0.5, "dur": 1.25, "args": {"correlation": 10**6 + i, "External id": i}})
    return b.write(tmp_path / "job" / "trace.json")


@pytest.mark.slow
def test_ranges_and_decompressed_chunks_give_the_rows_of_decode(tmp_path: Path) -> None:
    import gzip

    path = _trace(tmp_path)
    packed = tmp_path / "packed" / "trace.json.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(path.read_bytes()))
    for n, source in enumerate((path, packed)):  # rows name their file: each against its own decode
        native_db, decoded = tmp_path / f"native{n}.duckdb", tmp_path / f"decoded{n}.duckdb"
        summary = ingest_traces([source], native_db, chunk_bytes=CHUNK)
        assert summary.ok and summary.files[0].message == ""
        assert ingest_traces([source], decoded, native=False).ok
        for table, query in TABLES.items():
            assert _rows(native_db, query) == _rows(decoded, query), table
    assert _scratch_left() == []


def test_a_malformed_event_stops_the_parse_and_leaves_no_scratch(tmp_path: Path) -> None:
    """DuckDB stops at the bad event; the file goes to traceq.ingest.decode, which names the error."""
    path = _trace(tmp_path)
    text = path.read_text()
    cut = text.index('{"ph"', len(text) // 3)
    path.write_text(text[:cut] + '{"ph": "X", "name": nope}, ' + text[cut:])
    summary = ingest_traces([path], tmp_path / "w.duckdb", chunk_bytes=CHUNK)
    result = summary.files[0]
    assert result.status == "failed" and "malformed" in result.message and str(path) in result.message
    assert _scratch_left() == []


def _ranges(path: Path, lengths: list[int]) -> list[FileRange]:
    fd = os.open(path, os.O_RDONLY)
    return [FileRange(fd, 0, n, path) for n in lengths]


def test_a_range_past_the_end_of_the_trace_is_not_native(tmp_path: Path) -> None:
    """A trace cut short after the reader found its cuts: the copy stops where the file does and the
    file goes to traceq.ingest.decode (which names the truncation)."""
    path = tmp_path / "t.json"
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": i, "dur": 1} for i in range(1000)]
    body = json.dumps(events)[1:-1].encode()
    path.write_bytes(body)
    directory = tmp_path / "scratch"
    directory.mkdir()
    with pytest.raises(native.NotNative, match="ended 100 bytes before the range did"):
        list(native.batch_files(iter(_ranges(path, [len(body), len(body) + 100])), str(directory)))
    assert sorted(os.listdir(directory)) == ["0.json", "1.json"]  # the directory's owner removes them
    whole = tmp_path / "whole"
    whole.mkdir()
    (batch,) = native.batch_files(iter(_ranges(path, [len(body)])), str(whole))
    rows = pipeline.parse_batch(pipeline.parser(duckdb.connect()), batch, all_ops=True)
    assert rows.filter("bound is null").aggregate("count(*)").fetchall() == [(1000,)]  # and the file's two bounds
    batch.remove()
    assert os.listdir(whole) == []


def test_a_batch_keeps_its_files_until_removed_and_its_text_is_searched(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": i, "dur": 1, "args": {"external id": i}}
              for i in range(500)]
    path.write_bytes(json.dumps(events)[1:-1].encode())
    directory = tmp_path / "scratch"
    directory.mkdir()
    (batch,) = native.batch_files(iter(_ranges(path, [path.stat().st_size])), str(directory))
    con = duckdb.connect()
    cursor = pipeline.parser(con)
    first = pipeline.parse_batch(cursor, batch, all_ops=True)
    again = pipeline.parse_batch(cursor, batch, all_ops=False)
    for rows in (first, again):
        assert rows.filter("bound is null").aggregate("count(*), count(distinct name)").fetchall() == [(500, 500)]
    # the lower-case "external id" is looked for in the batch's text
    assert batch.holds(batch.names[0], b'"external id"') and not batch.holds(batch.names[0], b'"External id"')
    with pytest.raises(native.NotNative, match="external id"):
        native.count_batches(con, first, [batch])
    batch.remove()
    assert os.listdir(directory) == []


def _chunks_of(path: Path) -> int:
    """How many chunks the reader cuts ``path`` into at CHUNK bytes."""
    from traceq.ingest.reader import read_trace_ranges

    _, chunks = read_trace_ranges(path, CHUNK)
    return sum(1 for _ in chunks)


@pytest.mark.slow
def test_a_file_without_device_properties_is_parsed_with_every_cpu_operator_each_chunk_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels from the first chunk on, but no deviceProperties before the events: the file is parsed
    with every CPU operator (its header decides; nothing switches mid-file), in full batches, each chunk
    once; the writer leaves its CPU operators out from the first batch with GPU activity on and deletes
    those written before: the rows are the reference decoder's."""
    from traceq.ingest import plan
    from traceq.ingest.native import Executor

    b = _many_kernels(6000)
    for i in range(6000):
        b.events.insert(2 * i, {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 100, "tid": 1,
                                "ts": i * 10, "dur": 0.5, "args": {"External id": i}})
    path = b.write(tmp_path / "job" / "trace.json")
    assert b"deviceProperties" not in path.read_bytes()
    parses: list[tuple[int, bool]] = []  # chunks, all_ops of each parse

    class Recording(Executor):
        def parse(self, cursor, statement, params):
            parses.append((len(params["files"]), all(params["file_all_ops"])))
            return super().parse(cursor, statement, params)

    monkeypatch.setattr(plan, "WHOLE_FILE_BATCH_BYTES", 0)  # a small file, read as a large one is
    monkeypatch.setattr(native, "BATCH_BYTES", 4 * CHUNK)  # several batches
    db, decoded = tmp_path / "w.duckdb", tmp_path / "decoded.duckdb"
    summary = ingest_traces([path], db, chunk_bytes=CHUNK, executor=Recording())
    assert summary.ok and summary.files[0].message == ""
    assert len(parses) > 1 and all(all_ops for _, all_ops in parses), parses
    assert sum(n for n, _ in parses) == _chunks_of(path), parses  # each chunk parsed once
    assert ingest_traces([path], decoded, native=False).ok
    for table, query in TABLES.items():
        assert _rows(db, query) == _rows(decoded, query), table
