"""Ingest at scale: many files in parallel with one writer, the chunked and whole-file paths agree,
memory does not pile up in the writer, and a report over many ranks x steps answers quickly.

The big-file figures (100 MB - 1.5 GB, 64 ranks, 2048 ranks) are in benchmarks/bench_scale.py.
"""

from __future__ import annotations

import gzip
import os
import importlib.util
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from tests.conftest import ROOT, corpus_files, corpus_path
from tests.tracegen import TraceBuilder
from traceq.catalog import MAX_PER_CORE
from traceq.ingest import ingest_traces
from traceq.ingest.plan import json_size
from traceq.ingest.decode import decode_chunk
from traceq.ingest.native import BatchFiles, Part, write_parts
from traceq.report.metrics import compute_metric
from traceq.store.warehouse import connect

SMALL = "hta/trace_filter/sampled_rank-0.json.gz"  # 120 KB gz, ~1.5 MB of JSON with NCCL kernels


def _load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Eight rank files: one corpus trace under ranks 0..7 (distributedInfo.rank and file name)."""
    make_ranks = _load_benchmark("make_ranks")
    out = tmp_path_factory.mktemp("ranks") / "job8"
    make_ranks.build([corpus_path(SMALL)], out, 8, plain=False)
    return sorted(out.glob("*.json.gz"))


def _content(db: Path) -> dict[str, list[tuple]]:
    """Every table's rows with names resolved and trace ids replaced by ranks (ids may differ)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for table in ("gpu_events", "host_events", "trace_threads", "steps"):
            cols = [c for (c,) in con.execute(
                "select column_name from duckdb_columns() where table_name = ? and column_name not in ('trace_id', 'name_id')",
                [table]).fetchall()]
            named = ", n.name" if table in ("gpu_events", "host_events") else ""
            join = "inner join names as n using (trace_id, name_id)" if named else ""
            rows = con.execute(
                f"select t.file_rank, {', '.join('x.' + c for c in cols)}{named} from {table} as x "
                f"inner join traces as t using (trace_id) {join}"
            ).fetchall()
            out[table] = sorted(rows, key=repr)
        return out
    finally:
        con.close()


@pytest.mark.slow
def test_many_files_ingest_in_parallel_with_no_lost_rows(rank_files: list[Path], tmp_path: Path) -> None:
    serial, parallel = tmp_path / "serial.duckdb", tmp_path / "parallel.duckdb"
    assert ingest_traces(rank_files, serial, threads=1).ok
    summary = ingest_traces(rank_files, parallel, threads=2)
    assert [f.status for f in summary.files] == ["ingested"] * 8
    assert [f.ranks for f in summary.files] == [[r] for r in range(8)]  # input order, ranks renumbered
    assert _content(serial) == _content(parallel)
    one = tmp_path / "one.duckdb"
    assert ingest_traces(rank_files[:1], one, threads=1).ok
    with duckdb.connect(str(parallel), read_only=True) as con, duckdb.connect(str(one), read_only=True) as ref:
        for table in ("gpu_events", "host_events", "steps"):
            n = ref.execute(f"select count(*) from {table}").fetchall()[0][0]
            assert con.execute(f"select count(*) from {table}").fetchall()[0][0] == 8 * n > 0


@pytest.mark.slow
def test_many_rank_run_reports_every_rank(rank_files: list[Path], tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    assert ingest_traces(rank_files, db, threads=2).ok
    frame = compute_metric(db, "exposed_comm", by=("run",))
    assert frame["ranks"].to_list() == [8]
    by_rank = compute_metric(db, "exposed_comm", by=("run", "rank"))
    assert by_rank["rank"].to_list() == list(range(8))
    assert by_rank["exposed_comm_us"].n_unique() == 1  # the same trace under every rank


@pytest.mark.slow
def test_whole_file_and_chunked_paths_store_the_same_rows(rank_files: list[Path], tmp_path: Path) -> None:
    whole, chunked = tmp_path / "whole.duckdb", tmp_path / "chunked.duckdb"
    assert ingest_traces(rank_files[:3], whole, threads=2).ok  # several files: one worker per file
    for f in rank_files[:3]:  # one file at a time, cut into many 64 KB chunks
        assert ingest_traces([f], chunked, threads=2, chunk_bytes=64 << 10).ok
    assert _content(whole) == _content(chunked)


def test_reingesting_many_files_skips_them_all(rank_files: list[Path], tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    assert ingest_traces(rank_files, db, threads=2).ok
    before = _content(db)
    again = ingest_traces(rank_files, db, threads=2)
    assert [f.status for f in again.files] == ["skipped"] * 8
    assert _content(db) == before


def test_same_content_twice_in_one_parallel_call_is_ingested_once(rank_files: list[Path], tmp_path: Path) -> None:
    copy = tmp_path / "copy" / "rank0_again.trace.json.gz"
    copy.parent.mkdir()
    copy.write_bytes(rank_files[0].read_bytes())
    summary = ingest_traces([rank_files[0], rank_files[1], copy], tmp_path / "w.duckdb", threads=2)
    assert [f.status for f in summary.files] == ["ingested", "ingested", "skipped"]


def test_bad_file_among_many_fails_alone_and_leaves_nothing(rank_files: list[Path], tmp_path: Path) -> None:
    bad = tmp_path / "job" / "rank9.trace.json.gz"
    bad.parent.mkdir()
    bad.write_bytes(gzip.compress(gzip.decompress(rank_files[0].read_bytes())[:-5000]))  # JSON cut short
    db = tmp_path / "w.duckdb"
    summary = ingest_traces([rank_files[0], bad, rank_files[1]], db, threads=2)
    assert [f.status for f in summary.files] == ["ingested", "failed", "ingested"]
    assert str(bad) in summary.files[1].message
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from traces").fetchall()[0][0] == 2
        assert con.execute("select count(distinct trace_id) from host_events").fetchall()[0][0] == 2


def test_distributed_info_rank_fills_events_without_one_in_both_paths(tmp_path: Path) -> None:
    t = TraceBuilder(rank=5)
    t.step(1, 0, 100_000)
    t.kernel("void gemm_kernel()", 10_000, 20_000, launch_ns=1_000)
    t.kernel("void gemm_kernel()", 30_000, 40_000, launch_ns=2_000, rank=3)  # its own rank wins
    path = t.write(tmp_path / "job" / "trace.json")
    for chunk_bytes in (64, 4 << 20):
        db = tmp_path / f"w{chunk_bytes}.duckdb"
        summary = ingest_traces([path], db, threads=2, chunk_bytes=chunk_bytes)
        assert summary.files[0].ranks == [3, 5]
        with duckdb.connect(str(db), read_only=True) as con:
            assert con.execute("select rank_source, file_rank from traces").fetchall() == [("distributedInfo", 5)]


@pytest.mark.slow
def test_writing_decoded_rows_keeps_no_reference_to_them_until_commit() -> None:
    """A pa.Table registered with DuckDB stays alive until the transaction ends: the writer's memory
    would then grow with the file. The writer must hand DuckDB the decoder's rows without pinning them."""
    con = connect(":memory:")
    events = b", ".join(
        b'{"ph": "X", "cat": "cpu_op", "name": "op%d", "pid": 1, "tid": 1, "ts": %d, "dur": 1}' % (i % 100, i)
        for i in range(200_000)
    )
    base = pa.total_allocated_bytes()
    con.begin()
    for trace_id in range(1, 6):
        rows = decode_chunk(events, part=trace_id)
        assert rows.nbytes > 8 << 20  # five of them held would show
        write_parts(con, rows, [Part(BatchFiles(part=trace_id), trace_id)])
        del rows
    assert pa.total_allocated_bytes() - base < 8 << 20
    con.commit()
    assert con.execute("select count(*), count(distinct trace_id) from host_events").fetchall() == [(1_000_000, 5)]


def test_decoded_elements_that_are_dropped_are_counted_not_kept() -> None:
    """``{}`` is dropped: no row, whatever their number (a row each, even of shared zeros, made a gzip of
    500 million of them peak at 3 GB, issue 51): the chunk's two bounds count them (sql/batch_counts.sql).
    Held: Arrow's allocations and Python's, the same for 200,000 of them as for 2,000."""
    import tracemalloc

    from traceq.ingest.decode import _decode_lenient, events_to_rows
    from traceq.ingest.native import BatchFiles, count_batches

    def held(n: int) -> tuple[int, int, tuple[int, int]]:
        events, _, _ = _decode_lenient(b"[" + b", ".join([b"{}"] * n) + b', {"ph": "i", "name": "x", "ts": 1}]')
        arrow = pa.total_allocated_bytes()
        tracemalloc.start()
        try:
            rows, _ = events_to_rows(events)
            taken = pa.total_allocated_bytes() - arrow + tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        with duckdb.connect() as con:
            (counts,) = count_batches(con, rows, [BatchFiles(part=0)])
        return rows.num_rows, taken, (counts.events, counts.dropped)

    held(10)  # what its first call imports is not the rows'
    small, large = held(2_000), held(200_000)
    assert (small[0], small[2]) == (3, (2_001, 2_000))  # the instant and the two bounds
    assert (large[0], large[2]) == (3, (200_001, 200_000))
    assert large[1] < small[1] + (4 << 10), (small, large)


def test_json_size_reads_the_gzip_trailer(tmp_path: Path) -> None:
    data = b'{"traceEvents": []}' * 1000
    plain, packed = tmp_path / "a.json", tmp_path / "a.json.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    assert json_size(plain) == json_size(packed) == len(data)


@pytest.mark.slow
def test_report_over_many_ranks_and_steps(tmp_path: Path) -> None:
    """256 ranks x 50 steps made in SQL with a known answer: compute covers 0-60 us of every step,
    comm 40-100 us, so exposed comm is 40 us and overlapped 20 us for every rank and step. (How fast:
    ``benchmarks/bench_scale.py --only report2048``, 2048 ranks x 50 steps.)"""
    bench = _load_benchmark("bench_scale")
    db = tmp_path / "synthetic.duckdb"
    bench.synthesize_run(db, ranks=256, steps=50, run="big")
    frame = compute_metric(db, "exposed_comm", by=("run",))
    row = frame.row(0, named=True)
    assert (row["ranks"], row["exposed_comm_us"], row["exposed_comm_us_min"], row["exposed_comm_us_max"]) == (256, 40.0, 40.0, 40.0)
    overlapped = compute_metric(db, "overlapped_comm", by=("run", "rank"))
    assert overlapped["steps"].unique().to_list() == [49]  # 50 steps less the open last one
    assert overlapped["overlapped_comm_us"].unique().to_list() == [20.0]


def test_large_trace_ingests_chunk_by_chunk_in_bounded_steps(tmp_path: Path) -> None:
    """A file far larger than a chunk goes through many chunks on the workers, all rows kept."""
    raw = gzip.decompress(corpus_path(SMALL).read_bytes())
    path = tmp_path / "job" / "rank0.json"
    path.parent.mkdir()
    path.write_bytes(raw)
    db = tmp_path / "w.duckdb"
    ref = tmp_path / "ref.duckdb"
    assert ingest_traces([path], ref, threads=1, chunk_bytes=64 << 20).ok
    summary = ingest_traces([path], db, threads=2, chunk_bytes=32 << 10)  # ~50 chunks
    assert summary.ok
    assert _content(db) == _content(ref)


@pytest.mark.slow
def test_the_corpus_ingests_alike_in_another_order_at_the_most_threads(corpus_db: Path, tmp_path: Path) -> None:
    """Small files are parsed together in groups by DuckDB threads that share the ingest's fixed memory limit,
    and which files share a group follows their order. The corpus in sorted order, at the most threads traceq
    allows (MAX_PER_CORE a core), ingests whole, each trace with the counts of the session's corpus warehouse
    (another order, one thread a core). A build of traceq once failed 27 of these 33 files out of memory here
    (two of them as "Current transaction is aborted"), while the session's order passed."""
    files = sorted(corpus_files(), key=str)
    db = tmp_path / "sorted.duckdb"
    summary = ingest_traces(files, db, threads=MAX_PER_CORE * (os.cpu_count() or 1))
    assert summary.ok, [f.message for f in summary.by_status("failed")]
    counts = "select path, n_events, n_gpu_events, n_host_events, n_dropped from traces order by path"
    with connect(db, read_only=True) as con, connect(corpus_db, read_only=True) as reference:
        assert con.sql(counts).fetchall() == reference.sql(counts).fetchall()
