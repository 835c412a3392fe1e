"""Content digests (traceq.ingest.digests.file_digest): BLAKE3 of the file as stored, and warehouses and
Parquet exports made before BLAKE3 (bare SHA-256 hex in ``content_sha256``) still know their files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import blake3
import duckdb
import pytest

from tests.tracegen import TraceBuilder
from traceq.ingest import ingest_traces
from traceq.ingest.cluster import ingest_file_to_parquet
from traceq.ingest.digests import digest_in, file_digest
from traceq.store.export import export_parquet
from traceq.store.parquet import known_digests
from traceq.store.warehouse import connect


def _trace(tmp_path: Path, name: str, rank: int) -> Path:
    t = TraceBuilder(rank=rank)
    t.step(1, 0, 90_000)
    t.kernel("void gemm_kernel<float>()", 10_000, 40_000, stream=7, launch_ns=1_000)
    return t.write(tmp_path / "job" / name)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_file_digest_is_the_digest_of_the_bytes_as_stored(tmp_path: Path) -> None:
    for path in (_trace(tmp_path, "rank0.json", 0), _trace(tmp_path, "rank1.json.gz", 1)):
        data = path.read_bytes()
        assert file_digest(path) == "blake3:" + blake3.blake3(data).hexdigest()
        assert file_digest(path, "sha256") == "sha256:" + hashlib.sha256(data).hexdigest()
        legacy = "sha256:" + hashlib.sha256(data).hexdigest()
        assert digest_in(path, {legacy, "blake3:00"}) == legacy
        assert digest_in(path, {"sha256:00", "md5:00"}) is None


def _to_old_layout(db: Path, paths: list[Path]) -> None:
    """What traceq wrote before BLAKE3: the SHA-256 hex in a content_sha256 column."""
    con = duckdb.connect(str(db))
    try:
        con.execute("alter table traces rename column content_digest to content_sha256")
        for path in paths:
            con.execute("update traces set content_sha256 = ? where path = ?", [_sha256(path), str(path.resolve())])
    finally:
        con.close()


@pytest.mark.slow
def test_a_warehouse_from_before_blake3_is_migrated_and_still_knows_its_files(tmp_path: Path) -> None:
    a, b = _trace(tmp_path, "rank0.json", 0), _trace(tmp_path, "rank1.json", 1)
    db = tmp_path / "w.duckdb"
    assert ingest_traces([a], db).ok
    _to_old_layout(db, [a])
    summary = ingest_traces([a, b], db)
    assert [f.status for f in summary.files] == ["skipped", "ingested"], [f.message for f in summary.files]
    assert "already ingested" in summary.files[0].message
    con = connect(db, read_only=True)
    try:
        rows = dict(con.execute("select path, content_digest from traces").fetchall())
        columns = {c for (c,) in con.execute("select column_name from duckdb_columns() where table_name = 'traces'").fetchall()}
    finally:
        con.close()
    assert rows == {str(a.resolve()): "sha256:" + _sha256(a), str(b.resolve()): file_digest(b)}
    assert "content_sha256" not in columns


def test_parquet_written_before_blake3_still_knows_its_files(tmp_path: Path) -> None:
    a = _trace(tmp_path, "rank0.json", 0)
    db = tmp_path / "w.duckdb"
    assert ingest_traces([a], db).ok
    out = tmp_path / "pq"
    export_parquet(db, out)
    # what an export before BLAKE3 wrote: the traces files with the SHA-256 hex in content_sha256
    con = duckdb.connect()
    for part in (out / "traces").rglob("*.parquet"):
        con.execute(f"copy (select * exclude (content_digest), ? as content_sha256 from read_parquet('{part}')) "
                    f"to '{part}' (format parquet)", [_sha256(a)])
    old = con.execute(f"select content_sha256 from read_parquet('{out}/traces/**/*.parquet')").fetchall()
    con.close()
    assert old == [(_sha256(a),)]
    assert known_digests(out) == {a.stat().st_size: {"sha256:" + _sha256(a)}}
    result, digest = ingest_file_to_parquet(str(a), 99, str(out), skip_digests=frozenset(known_digests(out)[a.stat().st_size]))
    assert result.status == "skipped" and digest == "sha256:" + _sha256(a)
    with connect(out, read_only=True) as pq:  # a report's view of the directory
        assert pq.execute("select content_digest from traces").fetchall() == [("sha256:" + _sha256(a),)]


def test_the_plan_is_made_from_plain_data_of_what_the_warehouse_holds(tmp_path: Path) -> None:
    """``plan`` reads no warehouse: it is given the files held, by size and digest (a BLAKE3 digest, or
    the SHA-256 of a warehouse from before BLAKE3), and skips a file whose content is there, in its place,
    naming the file it was read as and its run; a file of a size held but other content is hashed then
    (its digest in its job, not taken again) and read."""
    from traceq.ingest.plan import IngestOptions, plan

    held_file, legacy_file, new_file = (_trace(tmp_path, f"rank{r}.json", r) for r in range(3))
    size = held_file.stat().st_size
    assert legacy_file.stat().st_size == new_file.stat().st_size == size  # one size: the digest tells them apart
    blake = {p: "blake3:" + blake3.blake3(p.read_bytes()).hexdigest() for p in (held_file, new_file)}
    held = {size: {blake[held_file]: ("/old/r0.json", "a"), "sha256:" + _sha256(legacy_file): ("/old/r1.json", "b")},
            size + 1: {"blake3:00": ("/old/x.json", "c")}}
    jobs = [job for group in plan([held_file, legacy_file, new_file], held, IngestOptions(run="z"), native=True)
            for job in group]
    assert [job.path for job in jobs] == [held_file, legacy_file, new_file]
    assert [(job.done.status, job.done.message) for job in jobs[:2] if job.done] == [
        ("skipped", f"{held_file}: already ingested (as /old/r0.json, run a); --force reads it again into run z"),
        ("skipped", f"{legacy_file}: already ingested (as /old/r1.json, run b); --force reads it again into run z"),
    ]
    assert (jobs[2].done, jobs[2].digest, jobs[2].run, jobs[2].small) == (None, blake[new_file], "z", True)
    [forced] = [job for group in plan([held_file], held, IngestOptions(force=True), native=True) for job in group]
    assert (forced.done, forced.digest, forced.run) == (None, blake[held_file], "job")
