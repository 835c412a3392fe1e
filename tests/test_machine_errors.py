"""What the machine gets wrong while a file is written (out of memory, a full disk), or any error of
DuckDB's but its JSON reader refusing the file's JSON, fails that file, in one line that names it and
what to do, and leaves nothing of it: an out-of-memory error on a write was stored by the slower
decoder instead and reported "ingested"."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tests.tracegen import TraceBuilder
from traceq.ingest import ingest_traces, plan
from traceq.ingest.native import Executor

ERRORS = {
    "out of memory": (duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate data of size 16.0 MiB"),
                      "out of memory (Out of Memory Error: failed to allocate data of size 16.0 MiB); free memory or "
                      "use a smaller input"),
    "full disk": (duckdb.IOException("IO Error: Could not write file: No space left on device"),
                  "IO Error: Could not write file: No space left on device; the file system said no: free space, or "
                  "use a writable place for --db and outputs"),
    # not the JSON reader refusing the file's JSON: never a reason to read it a second way (the decoder)
    "a write that failed": (duckdb.ConversionException("Conversion Error: Could not convert string 'x' to INT64"),
                            "Conversion Error: Could not convert string 'x' to INT64"),
}


def _traces(folder: Path, n: int) -> list[Path]:
    paths = []
    for rank in range(n):
        t = TraceBuilder(rank=rank)
        t.step(1, 0, 100_000)
        t.kernel("sgemm", 10_000, 20_000, launch_ns=1_000)
        paths.append(t.write(folder / f"rank{rank}.json"))
    return paths


def _counts(db: Path) -> tuple[int, int, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("select (select count(*) from traces), (select count(*) from gpu_events), "
                           "(select count(*) from steps)").fetchone()


@pytest.mark.slow
@pytest.mark.parametrize("parser", ["native", "decode"])
@pytest.mark.parametrize("files", [1, 3], ids=["one file", "a group of three"])
@pytest.mark.parametrize("kind", list(ERRORS))
def test_the_machines_error_fails_each_file_in_one_line_and_stores_nothing(
    tmp_path: Path, kind: str, files: int, parser: str
) -> None:
    """Whichever parser read the rows: one writer writes them."""
    error, words = ERRORS[kind]

    class Failing(Executor):
        def run(self, con, statement, params, rows):
            if "insert into gpu_events" in statement:
                raise error
            return super().run(con, statement, params, rows)

    paths = _traces(tmp_path / "job", files)
    done = ingest_traces(paths, tmp_path / "w.duckdb", native=parser == "native", executor=Failing())
    assert [(f.status, f.message) for f in done.files] == [("failed", f"{p}: {words}") for p in paths]
    assert _counts(tmp_path / "w.duckdb") == (0, 0, 0)


@pytest.mark.parametrize("parser", ["native", "decode"])
def test_duckdb_refusing_the_decoders_rows_fails_the_file_and_reads_it_no_third_way(
    tmp_path: Path, parser: str
) -> None:
    """DuckDB refusing input (the signal that sends a file to the decoder) on the decoder's own rows
    is a fault of traceq's: the file fails in one line. Natively, a file (a group of one) is written as
    DuckDB parsed it, then by the decoder: two writes; then no more."""
    writes = []

    class Refusing(Executor):
        def run(self, con, statement, params, rows):
            if "insert into gpu_events" in statement:
                writes.append(statement)
                if len(writes) > 4:  # read again and again: end it with another error, which fails the test
                    raise duckdb.ConversionException("read a third time")
                raise duckdb.InvalidInputException("Invalid Input Error: refused")
            return super().run(con, statement, params, rows)

    (path,) = _traces(tmp_path / "job", 1)
    done = ingest_traces([path], tmp_path / "w.duckdb", native=parser == "native", executor=Refusing())
    assert [(f.status, f.message) for f in done.files] == [(
        "failed", f"{path}: DuckDB refused the rows traceq.ingest.decode read (Invalid Input Error: refused); "
        "nothing was stored. Please report it, with the file")]
    assert len(writes) == (2 if parser == "native" else 1)
    assert _counts(tmp_path / "w.duckdb") == (0, 0, 0)


@pytest.mark.slow
def test_a_group_that_ran_out_of_memory_is_written_file_by_file(tmp_path: Path) -> None:
    """The group's one write ran out of memory; each file alone fits: all are in, as an ingest without
    the error stores them, none by the decoder and none parsed again (written from the group's rows)."""
    calls, parses = [], []

    class Once(Executor):
        def parse(self, cursor, statement, params):
            parses.append(params["files"])
            return super().parse(cursor, statement, params)

        def run(self, con, statement, params, rows):
            if "insert into gpu_events" in statement:
                calls.append(len(params["trace_ids"]))
                if len(calls) == 1:
                    raise ERRORS["out of memory"][0]
            return super().run(con, statement, params, rows)

    paths = _traces(tmp_path / "job", 3)
    expected = ingest_traces(paths, tmp_path / "plain.duckdb")
    done = ingest_traces(paths, tmp_path / "w.duckdb", executor=Once())
    assert [f.status for f in done.files] == ["ingested"] * 3 and not any(f.message for f in done.files)
    assert calls == [3, 1, 1, 1]  # the group, then each file
    assert len(parses) == 1  # the three in one statement, once
    assert _counts(tmp_path / "w.duckdb") == _counts(tmp_path / "plain.duckdb") == (3, 3, 3)
    assert expected.ok


@pytest.mark.slow
@pytest.mark.parametrize("files", [1, 3], ids=["one file", "three files"])
@pytest.mark.parametrize("large", [False, True], ids=["small files, parsed together", "read batch by batch"])
def test_the_machines_error_while_parsing_fails_each_file_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, large: bool
) -> None:
    """Out of memory in the read-ahead's parse (its own thread): each file fails in one line, as on a
    write, and the ingest goes on to the next; nothing is stored. (It escaped the reading thread: a
    traceback for one small file, "read-ahead ended before ..." for the second of three.)"""
    error, words = ERRORS["out of memory"]

    class Failing(Executor):
        def parse(self, cursor, statement, params):
            raise error

    if large:  # every file read batch by batch, as a file over 16 MB is
        monkeypatch.setattr(plan, "WHOLE_FILE_BATCH_BYTES", 0)
    paths = _traces(tmp_path / "job", files)
    done = ingest_traces(paths, tmp_path / "w.duckdb", executor=Failing())
    assert [(f.status, f.message) for f in done.files] == [("failed", f"{p}: {words}") for p in paths]
    assert _counts(tmp_path / "w.duckdb") == (0, 0, 0)


def test_duckdbs_error_after_ctrl_c_stops_the_ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A statement Ctrl-C stopped ends in an error of DuckDB's: that is the ingest stopping, not the
    file failing (the files after it were ingested and committed, and KeyboardInterrupt came last)."""
    from traceq import interrupts

    calls = []

    class Stopped(Executor):
        def step(self, name, paths):  # the first file's steps: Ctrl-C; the others' would go in
            if name == "steps":
                calls.append(1)
                if len(calls) == 1:
                    interrupts.INTERRUPTED.set()  # as the SIGINT handler of noting_interrupts does
                    raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    monkeypatch.setattr(plan, "WHOLE_FILE_BATCH_BYTES", 0)  # each file in a transaction of its own
    paths = _traces(tmp_path / "job", 3)
    try:
        with pytest.raises(KeyboardInterrupt):
            ingest_traces(paths, tmp_path / "w.duckdb", executor=Stopped())
    finally:
        interrupts.INTERRUPTED.clear()
    assert _counts(tmp_path / "w.duckdb") == (0, 0, 0) and calls == [1]
