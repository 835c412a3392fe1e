"""Two files never merge silently: a file without a rank gets one of its own, two files that claim the
same steps of one rank in one run are refused, and every report row traces back to its file. Also the
devices beyond CUDA/HIP (MTIA), the GPU model from deviceProperties, and warehouses of the schema before."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests import step_reference as reference
from tests.conftest import corpus_path
from tests.test_step_windows import METRICS, lagging_trace
from tests.tracegen import TraceBuilder
from traceq.peaks import peak_for
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric, metric_report, step_metrics
from traceq.report.selection import StepSelection, relation
from traceq.store.schema import SCHEMA_VERSION, schema_version
from traceq.store.warehouse import connect

US = 1000


def _anonymous(tag: str) -> TraceBuilder:
    t = lagging_trace()
    t.rank = None
    t.events.append({"ph": "X", "cat": "user_annotation", "name": tag, "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0})
    return t


def test_files_without_a_rank_or_a_job_are_runs_of_their_own_with_a_note(tmp_path: Path) -> None:
    """DESIGN §1: two unrelated traces in one folder are never averaged as two ranks of one job."""
    paths = [_anonymous(tag).write(tmp_path / "resnet50" / f"worker{i}.pt.trace.json") for i, tag in enumerate("ab")]
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(app, ["ingest", *map(str, paths), "--db", str(db), "-q"])
    assert result.exit_code == 0, result.output
    assert [line.split(": run ")[1].split(",")[:2] for line in result.stdout.splitlines()[:2]] == [
        ["resnet50/worker0", " rank -1"], ["resnet50/worker1", " rank -1"]]
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 2 and notes[1].endswith(
        "worker1.pt.trace.json names no rank (no distributedInfo, event args or rank<N> in its name): a run of its own, "
        "resnet50/worker1, as rank -1; join it to others with --name NAME, name its rank with --rank N")
    frame = compute_metric(db, "comm", by=("run", "rank"))
    assert frame.select("run", "rank", "steps").rows() == [
        ("resnet50/worker0", -1, 2), ("resnet50/worker1", -1, 2)]  # apart, each its own 3 steps less the open last one
    # said to be one job with --run: ranks of their own in it, -1 and -2
    joined = tmp_path / "j.duckdb"
    assert ingest_traces(paths, joined, name="resnet50", threads=1).ok
    assert compute_metric(joined, "comm", by=("run", "rank")).select("run", "rank").rows() == [
        ("resnet50", -2), ("resnet50", -1)]


def test_a_distributed_rank_out_of_range_is_no_rank_in_the_rows_as_in_the_notes(tmp_path: Path) -> None:
    t = lagging_trace()
    t.rank = -5  # distributedInfo.rank -5: a job (distributedInfo), no rank
    path = t.write(tmp_path / "job" / "trace.json")
    db = tmp_path / "w.duckdb"
    summary = ingest_traces([path], db, threads=1)
    assert summary.ok
    notes = summary.files[0].notes
    assert any("distributedInfo.rank -5 is not a rank" in n for n in notes)
    assert any("stored as rank -1 of run job" in n for n in notes)
    with connect(db, read_only=True) as con:
        held = {t: ranks for t, ranks in con.sql(
            "select 'gpu', list(distinct rank) from gpu_events union all select 'host', list(distinct rank) from host_events").fetchall()}
    assert held == {"gpu": [-1], "host": [-1]}


def test_the_same_rank_given_to_two_files_is_refused_in_one_line(tmp_path: Path) -> None:
    paths = [_anonymous(tag).write(tmp_path / "job" / f"t{i}.json") for i, tag in enumerate("ab")]
    result = CliRunner().invoke(app, ["ingest", *map(str, paths), "--rank", "0", "--db", str(tmp_path / "w.duckdb"), "-q"])
    assert result.exit_code == 1
    failed = [line for line in result.stderr.splitlines() if line.startswith("failed")]
    assert len(failed) == 1 and f"failed {paths[1]}: run job already holds steps 1..3 of rank 0 from" in failed[0]
    assert "--name NAME" in failed[0] and "--rank N" in failed[0]
    # under another run it is welcome
    again = CliRunner().invoke(app, ["ingest", str(paths[1]), "--rank", "0", "--name", "job-b",
                                     "--db", str(tmp_path / "w.duckdb"), "-q"])
    assert again.exit_code == 0, again.output


def test_files_of_one_rank_with_other_steps_are_one_rank(tmp_path: Path) -> None:
    """The collectors' profiling cycles: rank0 and rank0.cycle1 hold other steps of one rank."""
    later = lagging_trace()
    for e in later.events:
        if e["name"].startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + 10}"
    paths = [lagging_trace().write(tmp_path / "job" / "rank0.json"), later.write(tmp_path / "job" / "rank0.cycle1.json")]
    db = tmp_path / "w.duckdb"
    assert ingest_traces(paths, db, threads=1).ok
    # one rank with 6 steps; each cycle's last step (3, 13) has an open window, left out by default
    assert compute_metric(db, "comm", by=("run", "rank")).select("rank", "steps").rows() == [(0, 4)]
    every = StepSelection(include_last=True)
    assert compute_metric(db, "comm", by=("run", "rank"), selection=every).select("rank", "steps").rows() == [(0, 6)]


def test_every_report_row_traces_back_to_its_file(tmp_path: Path) -> None:
    paths = [_anonymous(tag).write(tmp_path / "job" / f"worker{i}.json") for i, tag in enumerate("ab")]
    db = tmp_path / "w.duckdb"
    assert ingest_traces(paths, db, name="job", threads=1).ok
    result = CliRunner().invoke(app, ["runs", "--traces", "--db", str(db), "--format", "json"])
    assert result.exit_code == 0, result.output
    listed = {row["ranks"]: row for row in json.loads(result.stdout)}
    assert {k: (v["path"], v["rank_source"], v["steps"]) for k, v in listed.items()} == {
        "-1": (str(paths[0].resolve()), "unknown", 3), "-2": (str(paths[1].resolve()), "unknown", 3)}


# --------------------------------------------------------------- devices beyond CUDA/HIP: data


def test_mtia_device_activity_is_counted_and_waits_are_not_work(tmp_path: Path) -> None:
    path = corpus_path("hta/mtia_inference_trace/mtia_inference_rank_0.json.gz")
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1, step_marker="^Stage::PyTorchMRSGIFTask::run$").ok
    with connect(db, read_only=True) as con:
        classes = dict(relation(con, "gpu_activity").aggregate("class, count(*)").fetchall())
        steps = step_metrics(con, selection=StepSelection(include_last=True))
    # 1313 mtia_ccp_events: dma_request copies, event_record / event_wait stream syncs, the rest work
    assert classes == {"memcpy": 877, "sync": 339, "compute": 97}
    assert steps.height == 38 and steps["exposed_memcpy_ns"].sum() > 0
    # the brute-force reference with the same step marker, step by step
    marker = "^Stage::PyTorchMRSGIFTask::run$"
    launched = {w["step"]: w["launched"] for w in reference.step_windows(path, marker=marker)}
    expected = {r["step"]: r for r in reference.step_metrics(path, marker=marker)}
    for row in steps.iter_rows(named=True):
        if launched[row["step"]]:
            assert {m: row[m] for m in METRICS} == {m: expected[row["step"]][m] for m in METRICS}, row["step"]
        else:  # launched nothing on the device: no window, no figures (the reference's window is empty)
            assert row["device"] is None and expected[row["step"]]["window_ns"] == 0


def test_hccl_collectives_of_other_accelerators_are_communication(tmp_path: Path) -> None:
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100 * US)
    t.kernel("pe_exe", 10 * US, 40 * US, cat="mtia_ccp_events", launch_ns=1 * US)
    t.kernel("hccl:all_reduce", 30 * US, 60 * US, cat="mtia_ccp_events", launch_ns=2 * US)
    t.kernel("event_wait", 0, 90 * US, cat="mtia_ccp_events", launch_ns=3 * US)  # not work: no busy time
    db = tmp_path / "w.duckdb"
    assert ingest_traces([t.write(tmp_path / "mtia" / "rank0.json")], db, threads=1).ok
    row = step_metrics(db_con := connect(db, read_only=True)).row(0, named=True)
    with db_con:
        assert relation(db_con, "gpu_activity").filter("class = 'comm'").aggregate("collective_type").fetchall() == [
            ("AllReduce",)]
    assert (row["comm_ns"], row["exposed_comm_ns"], row["window_ns"], row["idle_ns"]) == (30 * US, 20 * US, 50 * US, 0)


# ------------------------------------------------------------------------ GPU model and its peak


@pytest.mark.slow
def test_gpu_model_comes_from_device_properties_and_maps_to_the_peak(corpus_db: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        gpus = dict(con.sql("select split_part(path, '/', -1), gpu_model from traces").fetchall())
        meta = {r["run"]: r for r in relation(con, "run_metadata").pl().iter_rows(named=True)}
    assert gpus["Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"] == "NVIDIA H100 80GB HBM3"
    assert gpus["resnet_act_checkpoint.json.gz"] == "AMD Instinct MI300X"
    assert gpus["mtia_inference_rank_0.json.gz"] == "ARTEMIS"  # deviceProperties written as a Python repr
    qwen = meta["h100/Qwen_Qwen1.5-0.5B-Chat__1016005"]  # a file without rank or job: a run of its own
    assert (qwen["gpu_model"], qwen["peak_tflops"], qwen["peak_gpu"]) == (
        "NVIDIA H100 80GB HBM3", 989.0, "H100 SXM")
    assert (meta["mi300"]["peak_tflops"], meta["b200"]["peak_tflops"], meta["deepseek_profile_data"]["peak_gpu"]) == (
        1307.4, 2250.0, "H800 SXM")
    assert meta["mtia_inference_trace"]["peak_tflops"] is None


def test_an_unknown_gpu_leaves_mfu_empty_and_says_how_to_set_the_peak(tmp_path: Path) -> None:
    t = lagging_trace()
    path = t.write(tmp_path / "job" / "rank0.json", deviceProperties=[{"id": 0, "name": "Mystery Accelerator 9000"}])
    (tmp_path / "job" / "rank0.run.json").write_text(json.dumps({"world_size": 1, "tokens_per_step": 1000,
                                                                 "model_flops_per_token": 6e9}))
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    report = metric_report(db, "mfu")
    frame, notes = report.table, report.notes
    assert frame["mfu"].to_list() == [None]
    assert any("GPU 'Mystery Accelerator 9000' is not in the peak table" in n and "--peak-tflops P" in n for n in notes)


@pytest.mark.parametrize(("name", "gpu", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989), ("NVIDIA H100 PCIe", "H100 PCIe", 756),
    ("NVIDIA H100 NVL", "H100 NVL", 835), ("NVIDIA H200", "H200", 989), ("NVIDIA H200 NVL", "H200 NVL", 835),
    ("NVIDIA H20", "H20", 148), ("NVIDIA H800", "H800 SXM", 989), ("NVIDIA A100-SXM4-80GB", "A100", 312),
    ("NVIDIA A100 80GB PCIe", "A100", 312), ("NVIDIA A100-PG509-200", "A100", 312), ("NVIDIA L40S", "L40S", 362),
    ("NVIDIA B200", "B200", 2250), ("NVIDIA GB200", "GB200", 2500), ("NVIDIA B300 SXM6 AC", "B300", 2250),
    ("NVIDIA GB300", "GB300", 2500), ("Tesla V100-SXM2-32GB", "V100 SXM2", 125), ("Tesla V100-PCIE-16GB", "V100 PCIe", 112),
    ("AMD Instinct MI250X/MI250", "MI250X (one die)", 191.5), ("NVIDIA H800 80GB HBM3", "H800 SXM", 989),
    ("NVIDIA H20-3e", "H20", 148), ("AMD Instinct MI300X VF", "MI300X", 1307.4),
    ("AMD Instinct MI300X", "MI300X", 1307.4), ("AMD Instinct MI325X", "MI325X", 1307.4),
    ("AMD Instinct MI350X", "MI350X", 2300), ("AMD Instinct MI355X", "MI355X", 2500),
])
def test_peak_table_maps_device_names(name: str, gpu: str, tflops: float) -> None:
    peak = peak_for(name)
    assert peak is not None and (peak.gpu, peak.peak_tflops) == (gpu, tflops) and peak.source


def test_peak_table_knows_no_consumer_or_unnamed_gpu() -> None:
    assert peak_for("NVIDIA GeForce RTX 4090") is None and peak_for("AMD Radeon Graphics") is None
    assert peak_for("") is None and peak_for(None) is None


# ------------------------------------------------------- warehouses written by the schema before


@pytest.mark.slow
def test_a_warehouse_of_the_schema_before_is_refused_by_reports_and_migrated_by_a_writing_command(tmp_path: Path) -> None:
    """Made by 0.1 (simulated: the new columns, the whole-trace steps and the version row removed, kernels
    attributed by time as 0.1 did): a report stops untouched and names `traceq migrate`; that migrates it,
    says so, and the report then answers as a fresh ingest does."""
    import hashlib

    from typer.testing import CliRunner

    from traceq.cli import app
    from traceq.errors import WarehouseError

    nosteps = lagging_trace()
    nosteps.events = [e for e in nosteps.events if not e["name"].startswith("ProfilerStep#")]
    paths = [lagging_trace().write(tmp_path / "job" / "rank0.json"), nosteps.write(tmp_path / "other" / "rank0.json")]
    fresh, old = tmp_path / "fresh.duckdb", tmp_path / "old.duckdb"
    assert ingest_traces(paths, fresh, threads=1).ok
    assert ingest_traces(paths, old, threads=1).ok
    with duckdb.connect(str(old)) as con:
        con.execute("drop table warehouse_info")
        con.execute("delete from steps where source = 'whole_trace'")
        for table, column in (("steps", "source"), ("traces", "step_marker"), ("traces", "devices"), ("traces", "gpu_model")):
            con.execute(f"alter table {table} drop column {column}")
        con.execute("update gpu_events set step = 1, step_source = 'time' where step is null")
    before = hashlib.sha256(old.read_bytes()).hexdigest()
    with pytest.raises(WarehouseError, match=r"made by an older traceq \(schema 1\); reports never write, so migrate it"):
        compute_metric(old, "exposed_comm", by="run")
    out = CliRunner().invoke(app, ["report", "--metric", "exposed_comm", "--db", str(old)])
    assert out.exit_code == 1 and f"traceq migrate --db {old}" in out.stderr
    assert hashlib.sha256(old.read_bytes()).hexdigest() == before
    out = CliRunner().invoke(app, ["migrate", "--db", str(old)])
    assert out.exit_code == 0 and f"{old}: migrated from schema 1 (made by an older traceq) to schema {SCHEMA_VERSION}" in out.stdout
    for by in (("run", "rank", "step"), ("run", "rank")):
        assert compute_metric(old, "exposed_comm", by=by).equals(compute_metric(fresh, "exposed_comm", by=by))
    with connect(old, read_only=True) as con:
        assert schema_version(con) == SCHEMA_VERSION
    out = CliRunner().invoke(app, ["migrate", "--db", str(old)])
    assert out.exit_code == 0 and "already at schema" in out.stdout


def test_no_kernel_name_of_the_corpus_matches_two_rules_of_its_lowest_priority(corpus_db: Path) -> None:
    """Ties would make the class or collective type depend on the order DuckDB reads the rules."""
    with connect(corpus_db, read_only=True) as con:
        ties = con.sql(
            """
            with kernel_names as (select distinct n.name from names n semi join gpu_events g using (trace_id, name_id)),
            matched as (
                select k.name, r.priority, r.class, r.collective, min(r.priority) over (partition by k.name) as best
                from kernel_names k join kernel_rules r on regexp_matches(k.name, r.pattern)
            )
            select name from matched where priority = best group by name
            having count(distinct (class, coalesce(collective, ''))) > 1
            """
        ).fetchall()
    assert ties == []
