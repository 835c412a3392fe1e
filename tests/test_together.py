"""Small files are written several to a transaction, their steps derived in one statement for all of
them (traceq.ingest.loader.write_group): the warehouse must end up exactly as if each file had been
ingested on its own (one file per call is written alone), whatever happens inside a group."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import traceq.ingest.native as native
import traceq.ingest.plan as plan
from traceq.ingest import FileResult
from traceq.ingest.native import Executor
from tests.test_hostile import UNUSABLE_WORDS
from tests.test_native import TABLES, _rows
from tests.tracegen import TraceBuilder
from traceq.ingest import ingest_traces

ALL_TABLES = {
    **TABLES,
    "step_wall_times": "select t.path, w.* exclude (trace_id) from step_wall_times w join traces t using (trace_id)",
    "runs": "select run from runs",
}


def _rank_trace(rank: int | None, shift_ns: int, kernels: int, first_step: int = 10, unnumbered: bool = False) -> TraceBuilder:
    """Three steps; kernels launched inside them, one launched before the first step (no step) and
    one whose launch is missing (a GPU-only event on a rank with launches: no step either).
    ``unnumbered``: the last marker's number is no integer (its steps are numbered 1, 2, 3 instead)."""
    b = TraceBuilder(rank=rank)
    for n in range(3):
        start = shift_ns + n * 1_000_000
        b.step(10**25 if unnumbered and n == 2 else first_step + n, start, start + 900_000)
        for k in range(kernels):
            at = start + k * 3_000
            b.kernel(f"sgemm_{k % 4}", at + 500, at + 2_000, launch_ns=at)
    b.kernel("early", shift_ns - 5_000, shift_ns - 4_000, launch_ns=shift_ns - 9_000)
    b.kernel("orphan", shift_ns + 2_500_000, shift_ns + 2_500_500)
    return b


def _corpus(tmp_path: Path) -> list[Path]:
    """20 rank files in two runs, the same ranks in each, their steps interleaved in time and numbered
    otherwise (rank 0 of run b: 1, 2, 3, its markers not all numbered), then two files that name no
    rank: more than one group, and traces a derivation by rank alone would mix up."""
    paths = []
    for run, shift, first in (("a", 0, 10), ("b", 450_000, 20)):
        for rank in range(10):
            top = {"baseTimeNanoseconds": 1_700_000_000_000_000_000 + rank} if rank % 3 == 0 else {}
            trace = _rank_trace(rank, shift + rank * 10_000, 5 + rank, first, unnumbered=(run, rank) == ("b", 0))
            paths.append(trace.write(tmp_path / run / f"rank{rank}.json", **top))
    for kernels, name in ((4, "worker_x"), (5, "worker_y")):
        paths.append(_rank_trace(None, 50_000, kernels).write(tmp_path / "b" / f"{name}.json"))
    return paths


def _one_by_one(paths: list[Path], db: Path) -> list[FileResult]:
    return [ingest_traces([p], db).files[0] for p in paths]


def _outcome(files: list[FileResult]) -> list[tuple]:
    return [(Path(f.path).name, f.status, f.message, f.run, f.ranks, f.events, f.gpu_events, f.notes) for f in files]


def _same_warehouse(a: Path, b: Path) -> None:
    for table, query in ALL_TABLES.items():
        assert _rows(a, query) == _rows(b, query), table


@pytest.mark.slow
def test_small_files_together_end_as_files_ingested_one_by_one(tmp_path: Path) -> None:
    paths = _corpus(tmp_path / "job")
    together = ingest_traces(paths, tmp_path / "together.duckdb")
    alone = _one_by_one(paths, tmp_path / "alone.duckdb")

    assert all(f.status == "ingested" for f in together.files), [f.message for f in together.files]
    assert _outcome(together.files) == _outcome(alone)
    # no rank, no job: runs of their own, as one by one
    assert [(f.run, f.ranks) for f in together.files[-2:]] == [("b/worker_x", [-1]), ("b/worker_y", [-1])]
    _same_warehouse(tmp_path / "together.duckdb", tmp_path / "alone.duckdb")
    steps = _rows(tmp_path / "together.duckdb", "select t.path, list(s.step order by s.step) from steps s join traces t using (trace_id) group by all")
    assert len(steps) == 22 and all(len(numbers) == 3 for _, numbers in steps)  # none lost, none merged
    assert {tuple(numbers) for _, numbers in steps} == {(10, 11, 12), (20, 21, 22), (1, 2, 3)}
    attributed = _rows(tmp_path / "together.duckdb", "select step_source, count(*) from gpu_events group by all")
    assert dict(attributed) == {"launch": sum(3 * (5 + r) for r in range(10)) * 2 + 3 * 4 + 3 * 5, None: 2 * 22}


@pytest.mark.slow
def test_steps_that_clash_inside_a_group_fail_the_later_file_alone(tmp_path: Path) -> None:
    """A second file of rank 3 in the same run, in the same group as the first: the group is rolled
    back and its files are ingested one by one, so the later file fails with the message it gets
    alone and every other file is in."""
    job = tmp_path / "job" / "a"
    paths = [_rank_trace(r, r * 10_000, 4).write(job / f"rank{r}.json") for r in range(6)]
    paths.insert(4, _rank_trace(3, 77_000, 6).write(job / "rank3_again.json"))
    (job / "rank3_again.run.json").write_text("[1, 2]")  # no run.json: the clash is found first, as alone
    read: list[int] = []
    together = ingest_traces(
        paths, tmp_path / "together.duckdb",
        progress=lambda event, info: read.append(info["bytes"]) if event == "file_read" else None,
    )
    alone = _one_by_one(paths, tmp_path / "alone.duckdb")
    assert sum(read) == sum(p.stat().st_size for p in paths)  # read twice, counted once

    assert _outcome(together.files) == _outcome(alone)
    failed = [f for f in together.files if f.status == "failed"]
    assert [Path(f.path).name for f in failed] == ["rank3_again.json"]
    assert "run a already holds steps 10..12 of rank 3 from" in failed[0].message
    assert str(job / "rank3.json") in failed[0].message
    _same_warehouse(tmp_path / "together.duckdb", tmp_path / "alone.duckdb")


def test_an_interrupt_inside_a_group_leaves_none_of_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the third file's traces row is written: the rows of the group's five files and
    the traces rows of the two before it were written in the same transaction and reported to no
    one; none of them stays, and no scratch directory either."""
    job = tmp_path / "job" / "a"
    paths = [_rank_trace(r, r * 10_000, 4).write(job / f"rank{r}.json") for r in range(5)]
    calls = []

    class Interrupted(Executor):
        def step(self, name: str, paths: list[Path]) -> None:
            if name == "traces row":
                calls.append(paths)
                if len(calls) == 3:
                    raise KeyboardInterrupt

    base = native.scratch_base()
    before = {n for n in os.listdir(base) if n.startswith(f"traceq-{os.getpid()}-")}  # other tests' business
    seen: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        ingest_traces(paths, tmp_path / "w.duckdb", progress=lambda event, info: seen.append(event),
                      executor=Interrupted())
    assert "done" not in seen  # no file was reported done
    assert _rows(tmp_path / "w.duckdb", "select count(*) from traces") == [(0,)]
    for table in ("gpu_events", "host_events", "steps", "names", "runs"):
        assert _rows(tmp_path / "w.duckdb", f"select count(*) from {table}") == [(0,)], table
    left = {n: sorted(os.listdir(os.path.join(base, n)))
            for n in os.listdir(base) if n.startswith(f"traceq-{os.getpid()}-") and n not in before}
    assert left == {}, (base, left)

    assert ingest_traces(paths, tmp_path / "w.duckdb").ok  # the same files again, whole
    assert _rows(tmp_path / "w.duckdb", "select count(*) from traces") == [(5,)]


@pytest.mark.slow
def test_a_file_that_fails_after_its_events_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock offset that puts the steps beyond 64-bit nanoseconds is found when the group's
    wall-clock windows are written: that file fails, with its name, and the others are in."""
    job = tmp_path / "job" / "a"
    paths = [_rank_trace(r, r * 10_000, 4).write(job / f"rank{r}.json") for r in range(4)]
    paths[2] = _rank_trace(2, 20_000, 4).write(job / "rank2.json", baseTimeNanoseconds=2**63 - 1)
    together = ingest_traces(paths, tmp_path / "together.duckdb")
    alone = _one_by_one(paths, tmp_path / "alone.duckdb")
    assert _outcome(together.files) == _outcome(alone)
    assert [f.status for f in together.files] == ["ingested", "ingested", "failed", "ingested"]
    assert together.files[2].message.startswith(f"{paths[2]}: its clock offset (baseTimeNanoseconds")
    _same_warehouse(tmp_path / "together.duckdb", tmp_path / "alone.duckdb")

    # an error that is not about a file (here: raised for the third file's traces row) stops the
    # ingest, and the files before it are in, as when each is committed on its own
    class Failing(Executor):
        def step(self, name: str, paths: list[Path]) -> None:
            if name == "traces row" and paths[0].name == "rank2.json":
                raise RuntimeError("disk on fire")

    paths[2] = _rank_trace(2, 20_000, 4).write(job / "rank2.json")
    with pytest.raises(RuntimeError, match="disk on fire"):
        ingest_traces(paths, tmp_path / "stopped.duckdb", executor=Failing())
    assert _rows(tmp_path / "stopped.duckdb", "select path from traces order by path") == [
        (str(paths[0]),), (str(paths[1]),)]


def test_a_progress_callback_that_raises_stops_the_reading_thread_at_once(tmp_path: Path) -> None:
    """Whatever stops the loop over the results (a callback that raises; Ctrl-C between two
    results), the reading thread is joined before ingest returns and its scratch is gone: it read
    ahead of the first group, and nothing may go on reading or making directories after the
    loader removed its scratch. The first group stays committed; the rest ingest next time."""
    import threading

    job = tmp_path / "job" / "a"
    paths = [_rank_trace(r, r * 10_000, 4).write(job / f"rank{r}.json") for r in range(24)]
    base = native.scratch_base()
    before = {n for n in os.listdir(base) if n.startswith(f"traceq-{os.getpid()}-")}

    def broken(event: str, info: dict) -> None:
        if event == "done":
            raise RuntimeError("the progress bar broke")

    with pytest.raises(RuntimeError, match="the progress bar broke"):
        ingest_traces(paths, tmp_path / "w.duckdb", progress=broken)
    assert [t.name for t in threading.enumerate() if t.name.startswith("traceq-")] == []
    assert {n for n in os.listdir(base) if n.startswith(f"traceq-{os.getpid()}-")} - before == set()
    # the first group is in; the rest ingest on the next call
    assert _rows(tmp_path / "w.duckdb", "select count(*) from traces") == [(plan.GROUP_FILES,)]
    assert ingest_traces(paths, tmp_path / "w.duckdb").ok
    assert _rows(tmp_path / "w.duckdb", "select count(*) from traces") == [(24,)]


def _with_ops(rank: int, device_properties: bool, gpu: bool) -> dict:
    """A trace with two CPU operators; with ``device_properties``, Kineto's header before the events
    (the file is read without CPU operators from its start); ``gpu``: kernels too."""
    b = _rank_trace(rank, rank * 10_000, 4) if gpu else TraceBuilder(rank=rank)
    if not gpu:
        b.step(1, 0, 100_000)
    for n in range(2):
        b.events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{n}", "pid": 100, "tid": 1,
                         "ts": 10 + n * 40, "dur": 30, "args": {"External id": 90 + n}})
    return {"deviceProperties": [{"id": 0, "name": "H100"}], **b.document()} if device_properties else b.document()


@pytest.mark.slow
def test_small_files_parsed_in_one_statement_keep_their_own_cpu_operators(tmp_path: Path) -> None:
    """Files with and without deviceProperties, with and without kernels, parsed in one statement:
    each keeps the CPU operators it keeps alone (a CPU-only file all of them, a GPU file none that
    no metric reads, whether it started without them or switched), and nothing else changes."""
    job = tmp_path / "job" / "a"
    job.mkdir(parents=True)
    shapes = [(True, True), (False, True), (False, False), (True, True), (False, True)]
    paths = []
    for rank, (props, gpu) in enumerate(shapes):
        paths.append(job / f"rank{rank}.json")
        paths[-1].write_text(json.dumps(_with_ops(rank, props, gpu)))
    together = ingest_traces(paths, tmp_path / "together.duckdb")
    alone = _one_by_one(paths, tmp_path / "alone.duckdb")
    assert _outcome(together.files) == _outcome(alone)
    assert all(f.status == "ingested" for f in together.files)
    _same_warehouse(tmp_path / "together.duckdb", tmp_path / "alone.duckdb")
    ops = _rows(tmp_path / "together.duckdb", "select t.file_rank, count(*) from host_events h join traces t "
                "using (trace_id) join names n using (trace_id, name_id) where n.name like 'aten::op%' group by all")
    assert ops == [(2, 2)]  # the CPU-only file's, and only its


@pytest.mark.slow
def test_a_file_duckdb_cannot_parse_among_small_files_is_parsed_alone(tmp_path: Path) -> None:
    """An element that is no object makes DuckDB's reader fail the statement that parses the run of
    small files it is in: the run's files are parsed one by one then, the files before the odd one
    are committed as a group, the odd one is read by traceq.ingest.decode, the files after it make
    a group, and the warehouse is as if each file had been ingested alone."""
    job = tmp_path / "job" / "a"
    job.mkdir(parents=True)
    paths = []
    for rank in range(5):
        doc = _rank_trace(rank, rank * 10_000, 4).document()
        if rank == 2:
            doc["traceEvents"].insert(3, 5)
        paths.append(job / f"rank{rank}.json")
        paths[-1].write_text(json.dumps(doc))
    together = ingest_traces(paths, tmp_path / "together.duckdb")
    alone = _one_by_one(paths, tmp_path / "alone.duckdb")
    assert [f.status for f in together.files] == ["ingested"] * 5
    assert together.files[2].message.startswith("read by traceq.ingest.decode: Invalid Input Error: JSON transform error")
    scratch = re.compile(r"traceq-\d+-[^/]+/")  # DuckDB's message names the batch file it read
    assert [scratch.sub("", str(o)) for o in _outcome(together.files)] == [scratch.sub("", str(o)) for o in _outcome(alone)]
    _same_warehouse(tmp_path / "together.duckdb", tmp_path / "alone.duckdb")


@pytest.mark.slow
def test_a_group_of_files_parsed_in_two_statements_is_written_as_one(tmp_path: Path) -> None:
    """A file without events ends a group (it fails alone), so the next group takes the rest of the
    first run of small files and the start of the second: its rows come from two parse statements,
    copied into one relation with the rows of its files only."""
    job = tmp_path / "job" / "a"
    paths = [_rank_trace(r, r * 10_000, 2 + r % 5).write(job / f"rank{r}.json") for r in range(24)]
    paths[3].write_text(json.dumps({"traceEvents": []}))
    together = ingest_traces(paths, tmp_path / "together.duckdb")
    assert [f.status for f in together.files] == ["ingested"] * 3 + ["failed"] + ["ingested"] * 20
    assert _outcome(together.files) == _outcome(_one_by_one(paths, tmp_path / "alone.duckdb"))
    _same_warehouse(tmp_path / "together.duckdb", tmp_path / "alone.duckdb")


@pytest.mark.slow
@pytest.mark.parametrize("size_stored", [True, False], ids=["digests-before-reading", "digests-beside"])
def test_a_copy_inside_a_group_is_skipped_as_alone(tmp_path: Path, size_stored: bool) -> None:
    """Two copies of a file in one group: the second is skipped as a copy of the first, as alone,
    without rolling the group back. Their digests are taken before they are read where a file of
    their size is in the warehouse (``size_stored``: the copy is found only once the first is in),
    else beside the parse."""
    text = json.dumps(_rank_trace(0, 0, 4).document())
    other = text.replace("sgemm_0", "sgemm_9")  # the same size, other content
    assert len(other) == len(text) and other != text
    (tmp_path / "stored" / "rank0.json").parent.mkdir(parents=True)
    (tmp_path / "stored" / "rank0.json").write_text(other if size_stored else other + " ")
    for run in ("a", "b"):
        (tmp_path / "job" / run).mkdir(parents=True)
        (tmp_path / "job" / run / "rank0.json").write_text(text)
    (tmp_path / "job" / "b" / "rank1.json").write_text(json.dumps(_rank_trace(1, 0, 3).document()))
    paths = [tmp_path / "job" / "a" / "rank0.json", tmp_path / "job" / "b" / "rank0.json", tmp_path / "job" / "b" / "rank1.json"]
    for db in ("together.duckdb", "alone.duckdb"):
        assert ingest_traces([tmp_path / "stored" / "rank0.json"], tmp_path / db).ok
    together = ingest_traces(paths, tmp_path / "together.duckdb")
    assert [f.status for f in together.files] == ["ingested", "skipped", "ingested"], [f.message for f in together.files]
    assert together.files[1].message == f"{paths[1]}: already ingested (as {paths[0]}, run a); --force reads it again"
    assert _outcome(together.files) == _outcome(_one_by_one(paths, tmp_path / "alone.duckdb"))
    _same_warehouse(tmp_path / "together.duckdb", tmp_path / "alone.duckdb")


@pytest.mark.parametrize("own_handler", [False, True])
def test_ctrl_c_in_a_statement_of_a_group_write_stops_the_ingest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_sigint: None, own_handler: bool
) -> None:
    """DuckDB ends a statement that SIGINT reaches with a plain RuntimeError: the handler ran inside the
    statement (DuckDB polls for signals) and DuckDB put its own error in the place of what it raised.
    Inside a group's writes it is an interrupt, not an error of the group's files to read again one by
    one; also under a program's own SIGINT handler, where it raises."""
    import signal

    class Stop(Exception):
        pass

    if own_handler:
        def stop(signum: int, frame: object) -> None:
            raise Stop
        signal.signal(signal.SIGINT, stop)
    job = tmp_path / "job" / "a"
    paths = [_rank_trace(r, r * 10_000, 4).write(job / f"rank{r}.json") for r in range(4)]

    calls = []

    class Interrupted(Executor):
        def run(self, con, statement, params, rows):
            if statement.startswith("insert into names"):  # the first of a write's statements
                calls.append(statement)
                if len(calls) == 1:  # the group's: read one by one, each file's would succeed
                    try:
                        signal.raise_signal(signal.SIGINT)
                    except (KeyboardInterrupt, Stop):
                        raise RuntimeError("Query interrupted") from None
                    pytest.fail("SIGINT raised nothing")
            return super().run(con, statement, params, rows)

    base = native.scratch_base()
    before = {n for n in os.listdir(base) if n.startswith(f"traceq-{os.getpid()}-")}
    with pytest.raises(KeyboardInterrupt):
        ingest_traces(paths, tmp_path / "w.duckdb", executor=Interrupted())
    assert len(calls) == 1
    assert _rows(tmp_path / "w.duckdb", "select count(*) from traces") == [(0,)]
    assert {n for n in os.listdir(base) if n.startswith(f"traceq-{os.getpid()}-")} - before == set()


@pytest.mark.slow
def test_a_file_of_empty_events_among_small_files_fails_as_alone(tmp_path: Path) -> None:
    """A file of a million ``{}`` (4 MB of JSON: a small file, written with a group) holds nothing a trace
    event holds: refused, as it is alone, and the files beside it are in. (Written with a group, it was
    stored as a trace without rows.)"""
    import gzip

    job = tmp_path / "job"
    _rank_trace(0, 0, 4).write(job / "rank0.json")
    with gzip.open(job / "rank1.json.gz", "wb") as f:
        f.write(b'{"traceEvents": [' + b", ".join([b"{}"] * native.UNUSABLE_EVENTS) + b"]}")
    _rank_trace(2, 0, 4).write(job / "rank2.json")
    paths = sorted(job.iterdir())
    done = ingest_traces(paths, tmp_path / "w.duckdb")
    alone = [ingest_traces([p], tmp_path / "alone.duckdb").files[0] for p in paths]
    assert [f.status for f in done.files] == [f.status for f in alone] == ["ingested", "failed", "ingested"]
    assert done.files[1].message == alone[1].message == (
        f"{paths[1]}: 1,000,000 of its first 1,000,000 {UNUSABLE_WORDS}")
    for table, query in ALL_TABLES.items():
        assert _rows(tmp_path / "w.duckdb", query) == _rows(tmp_path / "alone.duckdb", query), table
