"""Ingest on a Dask cluster (a local one with two worker processes): each task writes one file's
Parquet partitions; reports on the directory equal a local ingest's; re-runs skip; failures leave
nothing behind."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import require_module

require_module("distributed", 'Dask is optional: pip install "traceq[dask]" to run the cluster tests')

from distributed import Client, LocalCluster  # noqa: E402

from tests.conftest import corpus_path  # noqa: E402
from tests.test_parquet import rank_trace  # noqa: E402
from traceq.cli import app  # noqa: E402
from traceq.ingest import ingest_traces  # noqa: E402
from traceq.ingest.cluster import ingest_with_dask  # noqa: E402
from traceq.report.metrics import compute_metric  # noqa: E402
from traceq.store.export import import_parquet  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("dask")
    files = [rank_trace(r).write(root / "job" / f"rank{r}.json.gz") for r in range(4)]
    return [*files, corpus_path("hta/trace_filter/sampled_rank-0.json.gz")]


@pytest.mark.slow
def test_cluster_ingest_reports_equal_a_local_ingest(client: Client, traces: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "pq"
    summary = ingest_with_dask(traces, out, client=client)
    assert [f.status for f in summary.files] == ["ingested"] * 5
    assert sorted(f.trace_id for f in summary.files) == [1, 2, 3, 4, 5]
    assert [f.ranks for f in summary.files[:4]] == [[0], [1], [2], [3]]
    assert not list(out.glob(".staging-*"))
    db = tmp_path / "local.duckdb"
    assert ingest_traces(traces, db, threads=1).ok
    for by in (("run",), ("run", "rank"), ("run", "rank", "step")):
        assert compute_metric(out, "exposed_comm", by=by).equals(compute_metric(db, "exposed_comm", by=by))


@pytest.mark.slow
def test_cluster_ingest_again_skips_and_adds_new_files(client: Client, traces: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "pq"
    assert ingest_with_dask(traces[:3], out, client=client).ok
    files_before = sorted(out.rglob("*.parquet"))
    again = ingest_with_dask(traces, out, client=client)
    assert [f.status for f in again.files] == ["skipped"] * 3 + ["ingested"] * 2
    assert min(f.trace_id for f in again.files[3:]) > 3  # new ids never reuse one in the directory
    assert set(files_before) <= set(out.rglob("*.parquet"))
    assert compute_metric(out, "exposed_comm", by=("run",))["ranks"].to_list() == [4, 1]


@pytest.mark.slow
def test_cluster_ingest_of_the_same_content_twice_keeps_one(client: Client, traces: list[Path], tmp_path: Path) -> None:
    copy = tmp_path / "other" / "rank0.json.gz"
    copy.parent.mkdir()
    copy.write_bytes(traces[0].read_bytes())
    out = tmp_path / "pq"
    summary = ingest_with_dask([traces[0], copy], out, client=client)
    assert [f.status for f in summary.files] == ["ingested", "skipped"]
    assert not list(out.rglob("trace2_*.parquet"))


@pytest.mark.slow
def test_failed_file_leaves_no_partition(client: Client, traces: list[Path], tmp_path: Path) -> None:
    bad = tmp_path / "job" / "rank7.json.gz"
    bad.parent.mkdir()
    bad.write_bytes(gzip.compress(gzip.decompress(traces[1].read_bytes())[:-300]))
    out = tmp_path / "pq"
    summary = ingest_with_dask([traces[0], bad], out, client=client)
    assert [f.status for f in summary.files] == ["ingested", "failed"]
    assert str(bad) in summary.files[1].message
    assert not list(out.rglob("trace2_*.parquet"))


def test_a_file_name_that_is_not_utf8_fails_alone_in_its_place(client: Client, traces: list[Path], tmp_path: Path) -> None:
    """Before, such a name stopped the whole cluster ingest with a traceback (DuckDB cannot take it)."""
    import os

    folder = tmp_path / "job"
    folder.mkdir()
    bad = os.path.join(os.fsencode(folder), b"rank1\xff.json.gz")
    with open(bad, "wb") as f:
        f.write(traces[1].read_bytes())
    good = folder / "rank0.json.gz"
    good.write_bytes(traces[0].read_bytes())
    summary = ingest_with_dask([os.fsdecode(bad), good], tmp_path / "pq", client=client)
    assert [f.status for f in summary.files] == ["failed", "ingested"]
    assert summary.files[0].message == f"{folder}/rank1\\xff.json.gz: the file's name is not UTF-8 text; rename it"
    assert summary.files[1].path == str(good)


@pytest.mark.slow
def test_the_warehouse_loads_what_the_cluster_wrote(client: Client, traces: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "pq"
    assert ingest_with_dask(traces, out, client=client).ok
    db = tmp_path / "w.duckdb"
    assert import_parquet(out, db) == 5
    assert compute_metric(db, "exposed_comm", by=("run", "rank")).equals(compute_metric(out, "exposed_comm", by=("run", "rank")))


@pytest.mark.slow
def test_cli_ingest_cluster_with_a_scheduler_address(cluster: LocalCluster, traces: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "pq"
    result = CliRunner().invoke(app, ["ingest-cluster", *map(str, traces[:2]), "--parquet", str(out), "--scheduler", cluster.scheduler_address])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith(f"2 ingested, 0 skipped, 0 failed -> {out}")


@pytest.mark.slow
def test_without_a_client_or_scheduler_a_local_cluster_ingests(traces: list[Path], tmp_path: Path) -> None:
    """The library builds the local cluster (the CLI only passes --processes): one worker process here."""
    summary = ingest_with_dask(traces[:2], tmp_path / "pq", processes=1)
    assert [f.status for f in summary.files] == ["ingested", "ingested"]
    assert compute_metric(tmp_path / "pq", "comm", by="run,rank")["rank"].to_list() == [0, 1]


@pytest.mark.slow
def test_the_local_clusters_own_warnings_are_not_the_commands_output(traces: list[Path], tmp_path: Path) -> None:
    """Dask's workers log warnings of their own (memory, a worker slow to close, GC time) on the
    command's stderr; a busy machine makes some of them, and a spill threshold near zero makes one
    certain ("Unmanaged memory use is high"): `traceq ingest-cluster` prints its one line only."""
    env = {"DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "0.0001", "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "0.0001",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = tmp_path / "pq"
    script = tmp_path / "traceq_cli.py"  # as the console script runs it (Dask's workers import __main__ again)
    script.write_text("import sys\nfrom traceq.console import main\nif __name__ == '__main__':\n    sys.exit(main())\n")
    done = subprocess.run([sys.executable, str(script), "ingest-cluster", *map(str, traces[:2]),
                           "--parquet", str(out), "--processes", "2"], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).splitlines() == ["2 ingested, 0 skipped, 0 failed -> pq"]


@pytest.mark.slow
def test_cluster_ingest_gives_rankless_files_ranks_of_their_own_and_refuses_a_rank_held(
    client: Client, tmp_path: Path
) -> None:
    """As a local ingest: two files that name no rank and no job are runs of their own, each rank -1 of its
    run (the tasks cannot see each other: the client numbers them per run before they run), and a second
    file of rank 0 with the same steps fails alone, in ingest's words."""
    run = tmp_path / "job"
    a, b = rank_trace(0), rank_trace(0)
    a.rank = b.rank = None
    b.events = b.events[:-1]  # other content
    paths = [a.write(run / "a.json"), b.write(run / "b.json"), rank_trace(0).write(run / "rank0.json"),
             rank_trace(0).write(run / "rank0_again.json", traceName="again")]
    summary = ingest_with_dask(paths, tmp_path / "pq", client=client)
    assert [f.status for f in summary.files] == ["ingested", "ingested", "ingested", "failed"]
    assert [f.ranks for f in summary.files[:3]] == [[-1], [-1], [0]]
    assert summary.files[3].message == (
        f"{paths[3].resolve()}: run job already holds steps 1..2 of rank 0 from {paths[2].resolve()}; the same "
        "trace twice, or traces of two jobs in one run? Give it another run (--name NAME)")  # its distributedInfo.rank
    assert not list((tmp_path / "pq").rglob(f"trace{summary.files[3].trace_id}_*"))
    frame = compute_metric(tmp_path / "pq", "comm", by=("run", "rank"))
    assert frame.select("run", "rank", "steps").rows() == [("job", 0, 1), ("job/a", -1, 1), ("job/b", -1, 1)]  # 2 steps less the open last


@pytest.mark.slow
def test_cross_rank_reports_on_a_cluster_ingest_equal_a_local_ingest(client: Client, tmp_path: Path) -> None:
    from tests.test_cross_rank import EVERY_STEP, late_rank_run, write_run
    from traceq.report.collectives import collectives_report, instances_report, stragglers_report

    files = write_run(tmp_path / "job", late_rank_run())
    out = tmp_path / "pq"
    assert ingest_with_dask(files, out, client=client).ok
    db = tmp_path / "local.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    assert instances_report(out).table.equals(instances_report(db).table)
    assert instances_report(out).table["wait_us"].sort().to_list() == [0, 4, 7]
    for report in (collectives_report, stragglers_report):
        assert report(out, selection=EVERY_STEP).table.equals(report(db, selection=EVERY_STEP).table)
    split = ["exposed_comm_wait_us", "exposed_comm_transfer_us"]
    assert compute_metric(out, split, by="run,rank,step").equals(compute_metric(db, split, by="run,rank,step"))


@pytest.mark.slow
def test_a_real_scheduler_and_two_workers_with_one_killed_mid_run_equal_a_local_ingest(tmp_path: Path) -> None:
    """The distributed path as users run it: `dask scheduler` and two `dask worker` processes on loopback, 64
    rank files, one worker killed (SIGKILL) once the first files are written: Dask gives its tasks to the
    other, and the directory's reports equal a one-machine ingest's."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        pytest.skip("the dask command is not installed beside this Python")
    files = [rank_trace(r).write(tmp_path / "job" / f"rank{r}.json") for r in range(64)]
    info = tmp_path / "scheduler.json"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    started = [subprocess.Popen([str(dask), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                 "--scheduler-file", str(info)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env)]
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # written whole
        address = json.loads(info.read_text())["address"]
        for _ in range(2):
            started.append(subprocess.Popen(
                [str(dask), "worker", address, "--nthreads", "1", "--nworkers", "1", "--no-dashboard",
                 "--no-nanny"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        out = tmp_path / "pq"
        ingest = subprocess.Popen([str(Path(sys.executable).with_name("traceq")), "ingest-cluster", *map(str, files),
                                   "--parquet", str(out), "--scheduler", address],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while len(list(out.glob("traces/**/*.parquet"))) < 4 and ingest.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        killed_mid_run = ingest.poll() is None
        started[1].send_signal(signal.SIGKILL)
        stdout, stderr = ingest.communicate(timeout=300)
        assert ingest.returncode == 0, stderr[-2000:]
        assert stdout.strip().endswith(f"64 ingested, 0 skipped, 0 failed -> {out}"), stdout[-500:]
        assert killed_mid_run, "the ingest ended before the worker was killed: nothing was tested"
    finally:
        for proc in reversed(started):
            proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    db = tmp_path / "local.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    for by in (("run",), ("run", "rank"), ("run", "rank", "step")):
        assert compute_metric(out, "exposed_comm", by=by).equals(compute_metric(db, "exposed_comm", by=by))


CORPUS_IDENTITIES = (  # ranks from distributedInfo, a file name, none (own runs, a job without rank), re-read files
    "hta/trace_filter/sampled_rank-0.json.gz",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",  # CPU-only with deviceProperties: read twice
    "hta/distributed_info_unavailable/distributed_info_not_found.json.gz",  # no rank, no job: read twice
    "hta/mixed_files/rank_not_found.json.gz",  # distributedInfo without a rank: a job, no rank
    "hta/trace_filter/sampled_rank-1.json.gz",
    "tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "kineto_docs/after_fix_trace.json",
)


def _identities_in(where: Path) -> list[tuple[str, str, list[int], list[int]]]:
    """(path, run, its ranks, its steps) per trace of a warehouse or a Parquet directory, by traceq's own reader."""
    from traceq.store.warehouse import opened

    with opened(where) as con:
        return con.sql(
            "select t.path, t.run, list(distinct s.rank order by s.rank), list(distinct s.step order by s.step) "
            "from traces as t inner join steps as s using (trace_id) group by all order by t.path"
        ).fetchall()


@pytest.mark.slow
@pytest.mark.parametrize("name", [None, "all"])
def test_the_first_pass_over_corpus_files_with_and_without_ranks_equals_a_local_ingest(
    client: Client, tmp_path: Path, name: str | None
) -> None:
    """Issue 51: every file ingested on the first pass, with the runs and ranks a local ingest gives (rank-less
    files -1 in runs of their own, or -1, -2, -3 in input order in one named run), files read twice included."""
    files = [corpus_path(f) for f in CORPUS_IDENTITIES]
    out = tmp_path / "pq"
    summary = ingest_with_dask(files, out, client=client, name=name)
    assert [f.status for f in summary.files] == ["ingested"] * len(files), [f.message for f in summary.files]
    assert sorted(f.trace_id for f in summary.files) == list(range(1, len(files) + 1))
    db = tmp_path / "local.duckdb"
    local = ingest_traces(files, db, threads=1, name=name)
    assert [f.ranks for f in summary.files] == [f.ranks for f in local.files]
    assert _identities_in(out) == _identities_in(db)
    rankless = [f.ranks for f in local.files if f.ranks and f.ranks[0] < 0]
    assert rankless == ([[-1]] * 4 if name is None else [[-1], [-2], [-3], [-4]])
