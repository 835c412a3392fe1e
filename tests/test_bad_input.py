"""Bad trace files: each gets one line saying which file, what is wrong and what to do; good files
still ingest; nothing of a failed file stays in the warehouse (row counts of every table).

Behaviour chosen per input:
- unreadable as a trace (truncated gzip or JSON, not JSON, JSON that is not a trace, empty file,
  an empty or non-object event array, NaN tokens, garbage after the trace): the file fails;
- events that cannot be used (not an object, no "ph", ts/dur missing, a string, a negative
  duration, out of range): dropped and counted in traces.n_dropped, the file ingests;
- values beyond int64 in ids (uint64 correlation, stream): stored as null, the event is kept;
- exact duplicate events: kept and reported by `traceq check` (duplicate_events);
- the same bytes under two names: the second is skipped as already ingested.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.conftest import corpus_path
from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.store.warehouse import connect
from traceq.ingest.decode import decode_chunk
from traceq.ingest.native import BatchFiles, count_batches

GOOD = "hta/trace_filter/sampled_rank-0.json.gz"
GOOD_2 = "hta/trace_filter/sampled_rank-1.json.gz"


def table_counts(db: Path) -> dict[str, int]:
    """Rows of every table of the warehouse (kernel_rules left out: it is reloaded on connect)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = [t for (t,) in con.execute("select table_name from duckdb_tables()").fetchall()]
        return {t: con.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables if t != "kernel_rules"}
    finally:
        con.close()


def ingest_cli(*args: str) -> tuple[int, list[str], list[str]]:
    """Run `traceq ingest ARGS -q` in process; (exit code, stdout lines, stderr lines)."""
    result = CliRunner().invoke(app, ["ingest", *args, "-q"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout.splitlines(), result.stderr.splitlines()


def small_trace(rank: int = 0) -> TraceBuilder:
    b = TraceBuilder(rank=rank)
    b.step(1, 0, 100_000)
    b.kernel("gemm_kernel", 10_000, 30_000, launch_ns=5_000)
    b.kernel("elementwise_kernel", 40_000, 50_000, launch_ns=35_000)
    return b


@pytest.fixture(scope="module")
def base_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse that already holds one good trace, so "nothing changed" is not vacuous."""
    db = tmp_path_factory.mktemp("base") / "base.duckdb"
    trace = small_trace().write(tmp_path_factory.mktemp("good") / "rank0.json")
    code, _, err = ingest_cli(str(trace), "--db", str(db), "--threads", "1")
    assert code == 0, err
    return db


@pytest.fixture
def db(base_db: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "w.duckdb"
    shutil.copy(base_db, copy)
    return copy


def _corpus_json() -> bytes:
    return gzip.decompress(corpus_path(GOOD).read_bytes())


def _doc(events: list, **top) -> bytes:
    return json.dumps({"schemaVersion": 1, **top, "traceEvents": events}).encode()


# name -> (file bytes, fragment of "what is wrong", fragment of "what to do")
BAD_FILES: dict[str, tuple[Callable[[], bytes], str, str]] = {
    "truncated.json.gz": (lambda: corpus_path(GOOD).read_bytes()[:50_000], "gzip stream is truncated", "re-copy"),
    "truncated.json": (lambda: _corpus_json()[: len(_corpus_json()) // 2], "truncated trace", "copy it again"),
    "cut_after_array.json": (lambda: _corpus_json().rstrip()[:-1], "truncated trace", "re-export"),
    "not_json.json": (lambda: b"step,loss\n1,0.5\n", "not a Kineto trace", "expected a JSON object"),
    "binary.json": (lambda: bytes(range(256)) * 4, "not a Kineto trace", "expected a JSON object"),
    "not_a_trace.json": (lambda: b'{"model": "llama", "loss": [1.5, 1.2]}', 'no "traceEvents" array', "expected"),
    "numbers.json": (lambda: b"[1, 2, 3]", "not an event object", "expected"),
    "events_not_objects.json": (lambda: b'{"traceEvents": ["a", "b"]}', "not an event object", "expected"),
    "empty.json": (lambda: b"", "the file is empty", "copy it again"),
    "blank.json.gz": (lambda: gzip.compress(b"  \n"), "the file is empty", "copy it again"),
    "no_events.json": (lambda: _doc([], distributedInfo={"rank": 0}), "holds no events", "profiler"),
    "nan_token.json": (
        lambda: _doc(small_trace().events).replace(b'"ts": 10.0', b'"ts": NaN'),
        "NaN and Infinity are not JSON",
        "regenerate",
    ),
    "garbage_after.json": (lambda: _doc(small_trace().events) + b"\x00\x00garbage", "malformed", "expected"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_fails_with_one_line_and_leaves_nothing(name: str, db: Path, tmp_path: Path) -> None:
    make, what, todo = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(make())
    before = table_counts(db)
    code, out, err = ingest_cli(str(path), "--db", str(db), "--threads", "1")
    assert code == 1
    assert len(err) == 1, err
    assert err[0].startswith(f"failed {path}: ")
    assert what in err[0] and todo in err[0], err[0]
    assert "Traceback" not in err[0]
    assert out[-1].startswith("0 ingested, 0 skipped, 1 failed")
    assert table_counts(db) == before


def test_file_failing_after_many_chunks_leaves_no_rows(db: Path, tmp_path: Path) -> None:
    """Truncated at 90%: dozens of chunks were decoded and inserted before the reader saw the end."""
    data = gzip.decompress(corpus_path("hta/nccl_parser_config/nccl_data.json.gz").read_bytes())
    path = tmp_path / "rank0.json"
    path.write_bytes(data[: int(len(data) * 0.9)])
    before = table_counts(db)
    summary = ingest_traces([path], db, threads=1, chunk_bytes=128 << 10)
    assert [f.status for f in summary.files] == ["failed"]
    assert "truncated trace" in summary.files[0].message
    assert table_counts(db) == before


@pytest.mark.slow
def test_bad_files_among_good_ones_fail_alone_and_leave_no_scratch(db: Path, tmp_path: Path) -> None:
    """A bad file fails alone with its own message, the good ones around it ingest (plain files:
    read by range, cut by cut), and every scratch directory is removed."""
    import tempfile

    def scratch() -> set[str]:
        # this process's only: another traceq (a second test run, CI beside it) may be ingesting meanwhile
        return {str(p) for d in ("/dev/shm", tempfile.gettempdir()) if Path(d).is_dir()
                for p in Path(d).glob(f"traceq-{os.getpid()}-*")}

    data = _corpus_json()
    files = {"a.json": data, "truncated.json": data[: len(data) // 2], "b.json": data + b"\n",
             "garbage_after.json": data + b"\x00garbage"}
    paths = []
    for name, content in files.items():  # a run each: a and b hold the same steps of rank 0
        (tmp_path / name.split(".")[0]).mkdir()
        paths.append(tmp_path / name.split(".")[0] / name)
        paths[-1].write_bytes(content)
    before = scratch()
    summary = ingest_traces(paths, db, chunk_bytes=256 << 10)
    assert [f.status for f in summary.files] == ["ingested", "failed", "ingested", "failed"]
    assert "truncated trace" in summary.files[1].message and str(paths[1]) in summary.files[1].message
    assert "malformed" in summary.files[3].message and str(paths[3]) in summary.files[3].message
    assert scratch() == before


def test_syntax_error_early_in_a_large_file_fails_at_once(db: Path, tmp_path: Path) -> None:
    """A bad byte in the first event must not make the reader buffer the rest of the file."""
    data = gzip.decompress(corpus_path("hta/nccl_parser_config/nccl_data.json.gz").read_bytes())
    start = data.index(b'"traceEvents"')
    first_ts = data.index(b'"ts":', start) + 5
    path = tmp_path / "rank0.json"
    path.write_bytes(data[:first_ts] + b" NaN, " + data[first_ts:])
    summary = ingest_traces([path], db, threads=1, chunk_bytes=64 << 10)
    result = summary.files[0]
    assert result.status == "failed"
    assert f"near byte {first_ts + 1:,}" in result.message
    assert "NaN and Infinity are not JSON" in result.message


# Events that cannot be used: each is dropped and counted, never fails the file.
UNUSABLE_EVENTS = {
    "missing ts": {"ph": "X", "cat": "kernel", "name": "k", "dur": 1.0},
    "missing dur": {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0},
    "missing ph": {"cat": "kernel", "name": "k", "ts": 1.0, "dur": 1.0},
    "string ts": {"ph": "X", "cat": "kernel", "name": "k", "ts": "12.5", "dur": 1.0},
    "string dur": {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1.0, "dur": "abc"},
    "NaN as a string": {"ph": "X", "cat": "kernel", "name": "k", "ts": "NaN", "dur": 1.0},
    "negative dur": {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": -5.0},
    "boolean ts": {"ph": "X", "cat": "kernel", "name": "k", "ts": True, "dur": 1.0},
    "list ts": {"ph": "X", "cat": "kernel", "name": "k", "ts": [1.0], "dur": 1.0},
    "uint64 ts": {"ph": "X", "cat": "kernel", "name": "k", "ts": 2**64, "dur": 1.0},
    "ts beyond float64": {"ph": "X", "cat": "kernel", "name": "k", "ts": "__1e400__", "dur": 1.0},
    "huge dur": {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 1e300},
    "not an object": 42,
    "null": None,
}


def _encode(events: list) -> bytes:
    return json.dumps(events)[1:-1].replace('"__1e400__"', "1e400").encode()


@pytest.mark.slow
@pytest.mark.parametrize("label", sorted(UNUSABLE_EVENTS))
def test_unusable_event_is_dropped_and_counted(label: str) -> None:
    good = {"ph": "X", "cat": "kernel", "name": "ok", "ts": 1.0, "dur": 2.0, "args": {"stream": 7}}
    rows = decode_chunk(_encode([good, UNUSABLE_EVENTS[label], good]))
    with duckdb.connect() as con:  # counted as ingest counts a batch (sql/batch_counts.sql)
        (counts,) = count_batches(con, rows, [BatchFiles(part=0)])
    assert (counts.events, counts.dropped, counts.gpu + counts.host) == (3, 1, 2)


def test_trace_with_unusable_events_ingests_the_rest_and_counts_them(db: Path, tmp_path: Path) -> None:
    b = small_trace()
    events = [*b.events, *UNUSABLE_EVENTS.values()]
    path = tmp_path / "rank0.json"
    path.write_bytes(b'{"traceEvents": [' + _encode(events) + b"]}")
    code, out, err = ingest_cli(str(path), "--db", str(db), "--threads", "1")
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    n_events, n_dropped, n_gpu = con.execute(
        "select n_events, n_dropped, (select count(*) from gpu_events g where g.trace_id = t.trace_id) "
        "from traces t where path = ?", [str(path.resolve())]
    ).fetchone()
    con.close()
    # the CPU operator ("string dur") of a trace with GPU activity is left out like every plain
    # operator, usable or not: not counted as dropped, wherever it is in the file
    assert (n_events, n_dropped, n_gpu) == (len(events), len(UNUSABLE_EVENTS) - 1, 2)


def test_odd_values_that_are_kept(db: Path, tmp_path: Path) -> None:
    """uint64 ids become null, a negative ts is a time on a relative clock, args not an object is ignored,
    invalid UTF-8 in a name is replaced, a numeric cat or name is kept as host activity."""
    b = small_trace()
    b.events += [
        {"ph": "X", "cat": "kernel", "name": "u64", "pid": 0, "tid": 7, "ts": 60.0, "dur": 1.0,
         "args": {"correlation": 2**64 - 1, "stream": 2**63, "External id": 2**64}},
        {"ph": "X", "cat": "kernel", "name": "negative_ts", "pid": 0, "tid": 7, "ts": -5.0, "dur": 1.0},
        {"ph": "X", "cat": "kernel", "name": "args_is_a_number", "pid": 0, "tid": 7, "ts": 70.0, "dur": 1.0, "args": 5},
        {"ph": "X", "cat": {"odd": 1}, "name": 12, "pid": "x", "tid": None, "ts": 80.0, "dur": 1.0},
        {"ph": "X", "cat": "kernel", "name": "BAD_UTF8", "pid": 0, "tid": 7, "ts": 90.0, "dur": 1.0},
    ]
    path = tmp_path / "rank0.json"
    path.write_bytes(_doc(b.events, distributedInfo={"rank": 0}).replace(b"BAD_UTF8", b"bad\xff\xfename"))
    code, _, err = ingest_cli(str(path), "--db", str(db), "--threads", "1")
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    rows = dict(con.execute(
        "select n.name, g.correlation from gpu_events g join names n using (trace_id, name_id) "
        "join traces t using (trace_id) where t.path = ?", [str(path.resolve())]
    ).fetchall())
    n_dropped = con.execute("select n_dropped from traces where path = ?", [str(path.resolve())]).fetchone()[0]
    con.close()
    assert rows["u64"] is None
    assert {"negative_ts", "args_is_a_number", "bad\ufffd\ufffdname"} <= set(rows)
    assert n_dropped == 0


def test_bytes_not_utf8_in_the_top_level_object_are_replaced(db: Path, tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in a field before the event array and in one after it read as U+FFFD,
    as in an event's name (msgspec refuses them with UnicodeDecodeError before 0.23, DecodeError from
    0.23): the file is ingested whole, and the Perfetto engine's census counts its events."""
    from traceq.ingest.census import count_device_events

    doc = _doc(small_trace().events, distributedInfo={"rank": 0, "backend": "BACKEND"}).rstrip(b"}")
    path = tmp_path / "rank0.json"
    path.write_bytes(doc.replace(b"BACKEND", b"nc\xffcl") + b', "note": "\xfe"}')
    code, _, err = ingest_cli(str(path), "--db", str(db), "--threads", "1")
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    row = con.execute("select file_rank, backend, header ->> 'note', n_dropped from traces where path = ?", [str(path.resolve())]).fetchone()
    con.close()
    assert row == (0, "nc\ufffdcl", "\ufffd", 0)
    assert count_device_events(path) == {"kernel": sum(e.get("cat") == "kernel" for e in small_trace().events)}


def test_header_values_out_of_range_are_unknown(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(_doc(small_trace().events).replace(
        b'{"schemaVersion": 1,', b'{"schemaVersion": 1e400, "baseTimeNanoseconds": 1e999, '
        b'"distributedInfo": {"rank": "zero", "world_size": -1e999},'))
    code, out, err = ingest_cli(str(path), "--db", str(db), "--threads", "1")
    assert code == 0, err
    assert "rank -1," in out[0]
    assert any("names no rank" in e and "stored as rank -1" in e for e in err)
    con = duckdb.connect(str(db), read_only=True)
    row = con.execute("select schema_version, base_time_ns, world_size, rank_source from traces where path = ?",
                      [str(path.resolve())]).fetchone()
    con.close()
    assert row == (None, None, None, "unknown")


def test_uint64_corpus_trace_ingests(db: Path) -> None:
    path = corpus_path("hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz")
    code, out, err = ingest_cli(str(path), "--db", str(db), "--threads", "1")
    assert code == 0, err
    assert out[0].startswith(f"ingested {path}: run large_integer_trace, rank 70")


@pytest.mark.slow
def test_duplicate_events_are_kept_and_reported_by_check(db: Path, tmp_path: Path) -> None:
    b = small_trace()
    path = tmp_path / "rank0.json"
    path.write_bytes(_doc(b.events + b.events, distributedInfo={"rank": 0}))
    code, _, err = ingest_cli(str(path), "--db", str(db), "--threads", "1")
    assert code == 0, err
    from traceq.report.check import check_warehouse

    findings = check_warehouse(db).table.filter(check="duplicate_events", path=str(path.resolve()))
    assert findings["count"].to_list() == [2]


@pytest.mark.slow
def test_same_file_under_two_names_is_ingested_once(db: Path, tmp_path: Path) -> None:
    source = corpus_path(GOOD)
    a, b = tmp_path / "a" / "rank0.json.gz", tmp_path / "b" / "copy.json.gz"
    for p in (a, b):
        p.parent.mkdir()
        shutil.copy(source, p)
    before = table_counts(db)
    code, out, err = ingest_cli(str(a), str(b), "--db", str(db))
    assert code == 0, err
    assert out[0].startswith(f"ingested {a}")
    assert out[1] == f"skipped {b}: already ingested (as {a.resolve()}, run a); --force reads it again"
    after = table_counts(db)
    assert after["traces"] == before["traces"] + 1
    # again, under a third name: nothing changes
    c = tmp_path / "c.json.gz"
    shutil.copy(source, c)
    code, out, _ = ingest_cli(str(c), "--db", str(db), "--threads", "1")
    assert code == 0 and out[0].startswith(f"skipped {c}: already ingested")
    assert table_counts(db) == after


@pytest.mark.slow
def test_same_trace_stored_twice_with_other_bytes_is_refused_in_one_line(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "job"
    run.mkdir()
    (run / "rank0.json").write_bytes(_corpus_json())
    shutil.copy(corpus_path(GOOD), run / "rank0_copy.json.gz")
    before = table_counts(db)
    code, out, err = ingest_cli(str(run), "--db", str(db), "--threads", "1")
    assert code == 1
    assert out[0].startswith(f"ingested {run / 'rank0.json'}")
    (line,) = [e for e in err if e.startswith("failed")]
    assert str(run / "rank0_copy.json.gz") in line and "run job already holds steps 551..552 of rank 0 from" in line
    assert "--name NAME" in line
    assert table_counts(db)["traces"] == before["traces"] + 1
    from traceq.report.check import check_warehouse

    assert check_warehouse(db).table.filter(check="duplicate_rank", run="job").is_empty()


@pytest.mark.slow
def test_directory_mixing_good_and_bad_files(db: Path, tmp_path: Path) -> None:
    """Good files ingest (whole-file decoding in workers too), every bad one gets its own line."""
    run = tmp_path / "mixed"
    run.mkdir()
    shutil.copy(corpus_path(GOOD), run / "rank0.json.gz")
    shutil.copy(corpus_path(GOOD_2), run / "rank1.json.gz")
    bad = ["truncated.json.gz", "not_json.json", "empty.json", "no_events.json", "nan_token.json"]
    for name in bad:
        (run / name).write_bytes(BAD_FILES[name][0]())
    (run / "notes.txt").write_text("not a trace name: not picked up")

    reference = tmp_path / "reference.duckdb"
    shutil.copy(db, reference)
    code, _, _ = ingest_cli(str(run / "rank0.json.gz"), str(run / "rank1.json.gz"), "--db", str(reference))
    assert code == 0

    code, out, err = ingest_cli(str(run), "--db", str(db), "--threads", "2")
    assert code == 1
    assert sorted(line.split(":")[0] for line in out if line.startswith("ingested")) == [
        f"ingested {run / 'rank0.json.gz'}", f"ingested {run / 'rank1.json.gz'}"]
    assert len(err) == len(bad)  # one line per bad file, each naming its file
    for name in bad:
        assert sum(line.startswith(f"failed {run / name}: ") for line in err) == 1
    assert out[-1].startswith("2 ingested, 0 skipped, 5 failed")
    assert table_counts(db) == table_counts(reference)


@pytest.mark.slow
def test_a_step_marker_that_matches_nothing_names_the_file_and_its_markers(tmp_path: Path) -> None:
    from tests.conftest import corpus_path

    trace = corpus_path("hta/trace_filter/sampled_rank-0.json.gz")
    summary = ingest_traces([trace], tmp_path / "w.duckdb", step_marker="^nomatch", threads=1)
    (failed,) = summary.by_status("failed")
    assert failed.message.startswith(f"{trace}: no event matches the step marker '^nomatch'; its annotations include")
    assert "'ProfilerStep#N'" in failed.message and "'Optimizer.step#Shampoo.step'" in failed.message
    with connect(tmp_path / "w.duckdb", read_only=True) as con:  # nothing half-written
        assert con.sql("select count(*) from traces").fetchall() == [(0,)]
    done = CliRunner().invoke(app, ["ingest", str(trace), "--db", str(tmp_path / "c.duckdb"), "--step-marker", "^nomatch"])
    assert done.exit_code == 1 and "no event matches the step marker" in done.output


@pytest.mark.slow
def test_a_step_marker_inside_the_step_gets_a_note(tmp_path: Path) -> None:
    """resnet50 (2021): Optimizer.step#SGD.step spans 20-37 ms of each ~150 ms step (6 spans, 150.6 ms
    of 794.3 ms from the first start to the last end: 19 %)."""
    from tests.conftest import corpus_path

    trace = corpus_path("kineto_tb_plugin/2021-01_profiler_api/resnet50_profiler_api_num_workers_0/worker0.pt.trace.json.gz")
    summary = ingest_traces([trace], tmp_path / "w.duckdb", step_marker="Optimizer.step#", threads=1)
    assert summary.ok
    notes = [n for f in summary.files for n in f.notes if "step marker" in n]
    assert notes == [f"{trace}: the step marker's 6 spans (25.096 ms each on average) cover 19 % of the time from "
                     "the first to the last: a marker inside the step? step_time_ms, the clock of throughput, is the "
                     "marker's span"]
