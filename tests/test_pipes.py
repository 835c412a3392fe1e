"""Ranges of an uncompressed trace reach DuckDB through named pipes (traceq.ingest.native.BatchFiles): the
rows are those of scratch files and of traceq.ingest.decode, a parse that stops early (a malformed event, a
trace shorter than its range) leaves no thread and no pipe behind, and a batch parsed again gets new
pipes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import duckdb
import pytest

import traceq.ingest.native as native
from tests.test_native import TABLES, _many_kernels, _rows
from traceq.catalog import StepMarker
from traceq.ingest import ingest_traces
from traceq.ingest.reader import FileRange

CHUNK = 32 << 10  # small chunks: a trace of a few MB is many ranges, several pipes per batch


def _feeders() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "traceq-pipe"]


def _scratch_left() -> list[str]:
    return [n for n in os.listdir(native.scratch_base()) if n.startswith(f"traceq-{os.getpid()}-")]


@pytest.fixture
def counted_feeds(monkeypatch: pytest.MonkeyPatch) -> list[FileRange]:
    """The ranges fed into pipes."""
    fed: list[FileRange] = []
    feed = native._feed

    def counting(name: str, source: int, piece: FileRange) -> None:
        fed.append(piece)
        feed(name, source, piece)

    monkeypatch.setattr(native, "_feed", counting)
    return fed


def _trace(tmp_path: Path, kernels: int = 6000) -> Path:
    b = _many_kernels(kernels)
    for i in range(0, kernels, 10):  # host events too, and names that need escaping
        b.events.append({"ph": "X", "cat": "cuda_runtime", "name": 'cudaLaunchKernel "x"\n', "pid": 100, "tid": 1,
                         "ts": i * 10 + 0.5, "dur": 1.25, "args": {"correlation": 10**6 + i, "External id": i}})
    return b.write(tmp_path / "job" / "trace.json")


def test_pipes_give_the_rows_of_scratch_files_and_of_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted_feeds: list[FileRange]
) -> None:
    path = _trace(tmp_path)
    piped, files, decoded = tmp_path / "piped.duckdb", tmp_path / "files.duckdb", tmp_path / "decoded.duckdb"
    summary = ingest_traces([path], piped, chunk_bytes=CHUNK)
    assert summary.ok and summary.files[0].message == ""
    fed = sum(p.length for p in counted_feeds)
    assert len(counted_feeds) > 20 and fed > 0.9 * path.stat().st_size  # nearly all of it went by pipe

    counted_feeds.clear()
    monkeypatch.setattr(native, "_pipes_work", lambda directory: False)  # e.g. Windows, or a file system without them
    assert ingest_traces([path], files, chunk_bytes=CHUNK).ok
    assert counted_feeds == []
    assert ingest_traces([path], decoded, native=False).ok
    for table, query in TABLES.items():
        assert _rows(piped, query) == _rows(files, query) == _rows(decoded, query), table
    assert _feeders() == [] and _scratch_left() == []


def test_a_malformed_event_stops_the_parse_and_every_pipe_is_closed(
    tmp_path: Path, counted_feeds: list[FileRange]
) -> None:
    """DuckDB stops at the bad event and reads no further pipe: the feeders still waiting to be read
    are drained; the file goes to traceq.ingest.decode, which names the error."""
    path = _trace(tmp_path)
    text = path.read_text()
    cut = text.index('{"ph"', len(text) // 3)
    path.write_text(text[:cut] + '{"ph": "X", "name": nope}, ' + text[cut:])
    summary = ingest_traces([path], tmp_path / "w.duckdb", chunk_bytes=CHUNK)
    result = summary.files[0]
    assert result.status == "failed" and "malformed" in result.message and str(path) in result.message
    assert len(counted_feeds) > 20
    assert _feeders() == [] and _scratch_left() == []


def test_a_range_past_the_end_of_the_trace_is_malformed_json(tmp_path: Path) -> None:
    """A trace cut short after the reader found its cuts: the pipe ends where the file does, DuckDB
    reads an array that is not closed, and no thread waits on."""
    path = tmp_path / "t.json"
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": i, "dur": 1} for i in range(1000)]
    body = json.dumps(events)[1:-1].encode()
    path.write_bytes(body)
    directory = tmp_path / "scratch"
    directory.mkdir()
    batch = native.BatchFiles()
    batch.add(str(directory / "0.json"), len(body) + 2, FileRange(-1, 0, len(body), path))
    batch.add(str(directory / "1.json"), len(body) + 2, FileRange(-1, 0, len(body) + 100, path))
    batch.add(str(directory / "2.json"), len(body) + 2, FileRange(-1, 0, len(body), path))
    con = duckdb.connect()
    with pytest.raises(native.NotNative, match="JSON"):
        native.parse_batch(native.parser(con), batch, all_ops=True)
    assert _feeders() == [] and os.listdir(directory) == []
    rows = native.parse_batch(native.parser(con), _whole(path, directory), all_ops=True)  # the same file, whole
    assert rows.aggregate("count(*)").fetchall() == [(1000,)]
    assert _feeders() == [] and os.listdir(directory) == []


def _whole(path: Path, directory: Path) -> native.BatchFiles:
    batch = native.BatchFiles()
    size = path.stat().st_size
    batch.add(str(directory / "0.json"), size + 2, FileRange(-1, 0, size, path))
    return batch


def test_a_batch_parsed_twice_gets_new_pipes_and_its_text_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": i, "dur": 1, "args": {"external id": i}}
              for i in range(500)]
    path.write_bytes(json.dumps(events)[1:-1].encode())
    directory = tmp_path / "scratch"
    directory.mkdir()
    batch = _whole(path, directory)
    con = duckdb.connect()
    cursor = native.parser(con)
    first = native.parse_batch(cursor, batch, all_ops=True)
    again = native.parse_batch(cursor, batch, all_ops=False)
    for rows in (first, again):
        assert rows.aggregate("count(*), count(distinct name)").fetchall() == [(500, 500)]
    # the lower-case "external id" is looked for in the batch's text, in the trace
    assert batch.holds(batch.names[0], b'"external id"') and not batch.holds(batch.names[0], b'"External id"')
    part = native.BatchFiles()  # a range that ends before the first "external id"
    part.add(str(directory / "1.json"), 100, FileRange(-1, 0, path.read_bytes().index(b'"external id"'), path))
    assert not part.holds(part.names[0], b'"external id"')
    with pytest.raises(native.NotNative, match="external id"):
        native.count_batch(con, first, batch)
    assert _feeders() == [] and os.listdir(directory) == []


def test_a_gzip_trace_is_written_as_scratch_files(tmp_path: Path, counted_feeds: list[FileRange]) -> None:
    import gzip

    path = _trace(tmp_path, 2000)
    packed = path.with_suffix(".json.gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    summary = ingest_traces([packed], tmp_path / "w.duckdb", chunk_bytes=CHUNK)
    assert summary.ok and summary.files[0].message == ""
    assert counted_feeds == []
    assert _rows(tmp_path / "w.duckdb", TABLES["gpu_events"])


def _batch_sizes(tmp_path: Path, flags: list[bool]) -> list[int]:
    """Chunks per batch of 40 ranges of 100 bytes, batches of 1000 bytes, with small() answering
    ``flags`` in turn (then False)."""
    answers = iter(flags)
    ranges = (FileRange(-1, 100 * i, 100, tmp_path / "t.json") for i in range(40))
    batches = native.batch_files(ranges, str(tmp_path), 1000, small=lambda: next(answers, False))
    return [len(b.names) for b in batches]


def test_batches_start_at_one_chunk_and_double_while_the_file_may_drop_its_cpu_operators(tmp_path: Path) -> None:
    assert _batch_sizes(tmp_path, []) == [10, 10, 10, 10]  # decided from the start (deviceProperties)
    assert _batch_sizes(tmp_path, [True, True, True]) == [1, 2, 4, 10, 10, 10, 3]  # GPU activity seen late
    assert _batch_sizes(tmp_path, [True] * 99) == [1, 2, 4, 8, 10, 10, 5]  # CPU only: up to full batches


def test_a_file_without_device_properties_reads_little_with_every_cpu_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels from the first chunk on, but no deviceProperties before the events: the file starts
    with every CPU operator and switches once the first batch, of one chunk, is counted. By then the
    reader may have parsed the next two batches (one waits for the writer, one is being parsed), of
    two chunks and about four: those are parsed again, the rest is parsed once, in full batches."""
    import traceq.ingest.loader as ingest

    b = _many_kernels(6000)
    for i in range(6000):
        b.events.insert(2 * i, {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 100, "tid": 1,
                                "ts": i * 10, "dur": 0.5, "args": {"External id": i}})
    path = b.write(tmp_path / "job" / "trace.json")
    assert b"deviceProperties" not in path.read_bytes()
    parses: list[tuple[int, bool]] = []  # chunks, all_ops of each parse

    def recording_parse(con: object, files: native.BatchFiles, all_ops: bool, marker: StepMarker) -> object:
        parses.append((len(files.names), all_ops))
        return native.parse_batch(con, files, all_ops, marker)

    monkeypatch.setattr(ingest, "parse_batch", recording_parse)
    db, decoded = tmp_path / "w.duckdb", tmp_path / "decoded.duckdb"
    summary = ingest_traces([path], db, chunk_bytes=CHUNK)
    assert summary.ok and summary.files[0].message == ""
    assert parses[0] == (1, True)
    assert sum(n for n, all_ops in parses if all_ops) <= 1 + 2 + 5, parses
    assert len(parses) <= 3 + 2 + 3 and sum(n for n, _ in parses) > 50, parses  # the rest in full batches, once
    assert ingest_traces([path], decoded, native=False).ok
    for table, query in TABLES.items():
        assert _rows(db, query) == _rows(decoded, query), table
