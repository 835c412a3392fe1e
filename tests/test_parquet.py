"""Parquet export: partitioned by run and rank, readable without traceq, reports on it equal the
warehouse's, and it loads back into a warehouse."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import corpus_path
from tests.tracegen import TraceBuilder
from traceq.store import parquet as export
from traceq.cli import app
from traceq.errors import ConfigError, WarehouseError
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric, step_metrics
from traceq.report.selection import StepSelection
from traceq.store.export import export_parquet, import_parquet
from traceq.store.warehouse import connect

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
KEYS = ["run", "trace_id", "rank", "device", "step"]


def rank_trace(rank: int) -> TraceBuilder:
    """Two steps; comm [35, 60] us overlaps compute [10, 40 + rank] us; higher ranks step slower."""
    t = TraceBuilder(rank=rank)
    for step, base in ((1, 0), (2, 100_000)):
        t.step(step, base, base + 90_000 + rank * 1_000)
        t.kernel("void gemm_kernel<float>()", base + 10_000, base + 40_000 + rank * 1_000, stream=7, launch_ns=base + 1_000)
        t.kernel(NCCL, base + 35_000, base + 60_000, stream=20, launch_ns=base + 2_000)
        t.kernel("Memcpy DtoD (Device -> Device)", base + 60_000, base + 70_000, stream=7, launch_ns=base + 3_000, cat="gpu_memcpy")
    return t


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs ("job a" with ranks 0-2, "job-b" with rank 0) plus a real corpus trace."""
    root = tmp_path_factory.mktemp("parquet")
    files = [rank_trace(r).write(root / "job a" / f"rank{r}.json") for r in range(3)]
    files.append(rank_trace(0).write(root / "job-b" / "rank0.json.gz", traceName="b"))
    files.append(corpus_path("hta/trace_filter/sampled_rank-1.json.gz"))
    db = root / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    return db


@pytest.fixture(scope="module")
def exported(warehouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "pq"
    written = export_parquet(warehouse, out)
    assert written["gpu_events"] > 0 and written["traces"] == 5
    return out


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort([c for c in KEYS if c in frame.columns], nulls_last=True)


@pytest.mark.slow
@pytest.mark.parametrize("whole_trace", [False, True], ids=["steps", "trace"])
def test_step_metrics_from_parquet_equal_the_warehouse(warehouse: Path, exported: Path, whole_trace: bool) -> None:
    with connect(warehouse, read_only=True) as db, connect(exported, read_only=True) as pq:
        expected = _sorted(step_metrics(db, whole_trace=whole_trace))
        got = _sorted(step_metrics(pq, whole_trace=whole_trace))
    assert expected.height > 0
    assert got.equals(expected)


@pytest.mark.slow
@pytest.mark.parametrize("by", [("run",), ("run", "rank"), ("run", "rank", "step")])
def test_reports_from_parquet_equal_the_warehouse(warehouse: Path, exported: Path, by: tuple[str, ...]) -> None:
    for metric in ("exposed_comm", "overlap_ratio", "idle"):
        expected = compute_metric(warehouse, metric, by=by, selection=StepSelection(skip_steps=0))
        assert compute_metric(exported, metric, by=by, selection=StepSelection(skip_steps=0)).equals(expected)


@pytest.mark.slow
def test_large_tables_are_read_as_views_with_the_same_result(warehouse: Path, exported: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "IN_MEMORY_ROWS", 200)  # events become views over the files; steps stay tables
    with connect(exported, read_only=True) as pq:
        views = {v for (v,) in pq.execute("select view_name from duckdb_views() where not internal").fetchall()}
        assert {"gpu_events", "host_events"} <= views
        got = _sorted(step_metrics(pq))
    with connect(warehouse, read_only=True) as db:
        assert got.equals(_sorted(step_metrics(db)))


def test_layout_is_hive_partitioned_by_run_and_rank(exported: Path) -> None:
    folders = {p.relative_to(exported).as_posix() for p in (exported / "gpu_events").glob("*/*") if p.is_dir()}
    assert {"gpu_events/run=job%20a/rank=0", "gpu_events/run=job%20a/rank=2", "gpu_events/run=job-b/rank=0"} <= folders
    assert (exported / "traces" / "run=job-b").is_dir()


def test_polars_reads_the_export_without_traceq(warehouse: Path, exported: Path) -> None:
    kernels = pl.scan_parquet(exported / "gpu_events" / "**" / "*.parquet").collect()
    assert kernels.schema["run"] == pl.String and kernels.schema["rank"] == pl.Int64
    assert kernels.schema["start_ns"] == pl.Int64
    hive = pl.scan_parquet(exported / "gpu_events", hive_partitioning=True).filter(pl.col("run") == "job a").collect()
    with duckdb.connect(str(warehouse), read_only=True) as con:
        n_all = con.execute("select count(*) from gpu_events").fetchall()[0][0]
        n_a = con.execute("select count(*) from gpu_events join traces using (trace_id) where run = 'job a'").fetchall()[0][0]
    assert kernels.height == n_all
    assert hive.height == n_a and sorted(hive["rank"].unique().to_list()) == [0, 1, 2]


def test_duckdb_reads_the_export_without_traceq(exported: Path) -> None:
    con = duckdb.connect()
    rows = con.execute(
        "select run, count(distinct rank), count(*) from read_parquet(?, hive_partitioning = true) group by run order by run",
        [str(exported / "steps" / "**" / "*.parquet")],
    ).fetchall()
    assert rows[:2] == [("job a", 3, 6), ("job-b", 1, 2)]


def test_export_refuses_a_directory_holding_an_export(warehouse: Path, exported: Path) -> None:
    with pytest.raises(ConfigError, match="holds an export already .*; overwrite it, or export to a new directory"):
        export_parquet(warehouse, exported)


def test_export_overwrite_replaces_the_earlier_export(warehouse: Path, tmp_path: Path) -> None:
    out = tmp_path / "pq"
    first = export_parquet(warehouse, out)
    files = sorted(p.relative_to(out) for p in out.rglob("*.parquet"))
    assert export_parquet(warehouse, out, overwrite=True) == first
    assert sorted(p.relative_to(out) for p in out.rglob("*.parquet")) == files


def test_parquet_directory_is_read_only_and_must_be_an_export(exported: Path, tmp_path: Path) -> None:
    with pytest.raises(WarehouseError, match="read-only"):
        connect(exported)
    with pytest.raises(WarehouseError, match="a directory, and not a traceq Parquet export"):
        connect(tmp_path, read_only=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WarehouseError, match="a directory, and not a traceq Parquet export .* give --db a DuckDB file"):
        connect(empty)  # a writing command: not "a Parquet directory is read-only"


def test_import_parquet_round_trips_and_skips_what_is_there(warehouse: Path, exported: Path, tmp_path: Path) -> None:
    db = tmp_path / "back.duckdb"
    assert import_parquet(exported, db) == 5
    assert import_parquet(exported, db) == 0
    for by in (("run", "rank"), ("run", "rank", "step")):
        assert compute_metric(db, "exposed_comm", by=by).equals(compute_metric(warehouse, "exposed_comm", by=by))


@pytest.mark.slow
def test_cli_export_then_report_on_the_directory(warehouse: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "pq"
    result = runner.invoke(app, ["export", "--parquet", str(out), "--db", str(warehouse)])
    assert result.exit_code == 0, result.output
    assert "exported" in result.output
    args = ["report", "--metric", "exposed_comm", "--by", "run,rank", "--format", "csv"]
    from_db = runner.invoke(app, [*args, "--db", str(warehouse)])
    from_pq = runner.invoke(app, [*args, "--db", str(out)])
    assert from_db.exit_code == from_pq.exit_code == 0
    assert from_pq.stdout == from_db.stdout
    again = runner.invoke(app, ["export", "--parquet", str(out), "--db", str(warehouse)])
    assert again.exit_code == 1 and "overwrite it, or export to a new directory" in again.output


def test_import_refuses_a_trace_of_steps_the_warehouse_holds(tmp_path: Path) -> None:
    """The same rank's steps from another file: the whole import is refused in one line, nothing added."""
    first, second = tmp_path / "first.duckdb", tmp_path / "second.duckdb"
    assert ingest_traces([rank_trace(0).write(tmp_path / "job" / "rank0.json")], first, threads=1).ok
    assert ingest_traces([rank_trace(0).write(tmp_path / "other" / "job" / "rank0.json", traceName="x")], second,
                         threads=1).ok
    export_parquet(second, tmp_path / "pq")
    with connect(first, read_only=True) as con:
        before = con.sql("select count(*) from traces").fetchall()
    with pytest.raises(ConfigError) as refused:
        import_parquet(tmp_path / "pq", first)
    assert refused.value.message == (
        f"{tmp_path / 'other' / 'job' / 'rank0.json'}: run job already holds steps 1..2 of rank 0 from "
        f"{tmp_path / 'job' / 'rank0.json'}; the same trace twice, or traces of two jobs in one run? "
        f"Nothing of {tmp_path / 'pq'} was imported; import it into another warehouse (--db)")
    with connect(first, read_only=True) as con:
        assert con.sql("select count(*) from traces").fetchall() == before
