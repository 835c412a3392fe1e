"""`traceq check`: every finding on a trace built to have it; a clean run gives no finding at all."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.query import sql_text
from traceq.report.check import CHECKS, COLUMNS, check_warehouse

US = 1000  # ns
COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def clean_rank(rank: int | None = 0, *, shift_ns: int = 0, steps: int = 2, seq: bool = True) -> TraceBuilder:
    """A rank of a 2-rank job: per 100 us step one GEMM and one all-reduce, each with its launch."""
    b = TraceBuilder(rank=rank)
    for i in range(steps):
        t = shift_ns + i * 100 * US
        b.step(i + 1, t, t + 100 * US)
        b.kernel("ampere_sgemm_128x64_nn", t + 10 * US, t + 30 * US, launch_ns=t + 5 * US)
        comm_args = {"Collective name": "allreduce", "Process Group Name": "0", "Group size": 2}
        if seq:
            comm_args["Seq"] = i + 1
        b.kernel(COMM, t + 40 * US, t + 60 * US, stream=20, launch_ns=t + 35 * US, **comm_args)
    return b


def write_run(run: Path, traces: dict[str, TraceBuilder], *, run_json: bool = True) -> None:
    """Write the traces (and the collectors' run.json) into one run directory."""
    for name, builder in traces.items():
        builder.write(run / name, traceName=run.name)  # the same trace in two runs must differ in bytes
    if run_json:
        (run / "rank0.run.json").write_text(json.dumps({"world_size": 2, "model": "toy", "tokens_per_step": 4096}))


def findings_for(tmp_path: Path, traces: dict[str, TraceBuilder], *, run_json: bool = True) -> pl.DataFrame:
    """Ingest one run into its own warehouse (tmp_path/w.duckdb) and check it."""
    write_run(tmp_path / "job", traces, run_json=run_json)
    summary = ingest_traces([tmp_path / "job"], tmp_path / "w.duckdb", threads=1)
    assert summary.ok, [f.message for f in summary.files]
    return check_warehouse(tmp_path / "w.duckdb").table


def _with_kernel(b: TraceBuilder, *args, **kw) -> TraceBuilder:
    b.kernel(*args, **kw)
    return b


def _with_events(b: TraceBuilder, *events: dict) -> TraceBuilder:
    b.events.extend(events)
    return b


def _without_steps(b: TraceBuilder) -> TraceBuilder:
    b.events = [e for e in b.events if not e["name"].startswith("ProfilerStep#")]
    return b


def _without_first_collective(b: TraceBuilder) -> TraceBuilder:
    b.events = [e for e in b.events if not (e["name"] == COMM and e["args"].get("Seq") == 1)]
    return b


def _no_distributed_info(b: TraceBuilder) -> TraceBuilder:
    b.rank = None  # rank 0 still comes from the file name
    return b


# run name -> the traces of that run; each run but "clean" is built to have one finding.
SCENARIOS: dict[str, dict[str, TraceBuilder]] = {
    "clean": {"rank0.json": clean_rank(0), "rank1.json": clean_rank(1)},
    # a second GEMM on stream 7 inside the first one's 10-30 us
    "overlap": {"rank0.json": _with_kernel(clean_rank(0), "ampere_sgemm_128x64_nn", 20 * US, 35 * US, launch_ns=8 * US),
                "rank1.json": clean_rank(1)},
    # no launch event, on a rank with launches: launched by no step, inside step 1's window
    "no_launch": {"rank0.json": _with_kernel(clean_rank(0), "vectorized_elementwise_kernel", 70 * US, 80 * US),
                  "rank1.json": clean_rank(1)},
    # launched after step 2 ended, running after step 2's window
    "outside_steps": {"rank0.json": _with_kernel(clean_rank(0), "vectorized_elementwise_kernel", 260 * US, 270 * US,
                                                 launch_ns=250 * US),
                      "rank1.json": clean_rank(1)},
    "no_steps": {"rank0.json": _without_steps(clean_rank(0)), "rank1.json": _without_steps(clean_rank(1))},
    # no distributedInfo, no rank in args or in the file name
    "unknown_rank_alone": {"trace_a.json": clean_rank(None)},
    "unknown_rank": {"trace_a.json": clean_rank(None), "rank1.json": clean_rank(1)},
    "incomplete": {"rank0.json": _with_events(clean_rank(0), {  # a launch at 180 us whose kernel never ran
        "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1, "ts": 180.0,
        "dur": 1.0, "args": {"correlation": 99_999}}), "rank1.json": clean_rank(1)},
    "step_counts": {"rank0.json": clean_rank(0), "rank1.json": clean_rank(1, steps=3)},
    "skew_by_seq": {"rank0.json": clean_rank(0), "rank1.json": clean_rank(1, shift_ns=-700 * US)},
    "skew_by_order": {"rank0.json": clean_rank(0, seq=False), "rank1.json": clean_rank(1, seq=False, shift_ns=-700 * US)},
    # rank 1's trace starts one collective later: matching by Seq, not by position, finds no skew
    "late_start": {"rank0.json": clean_rank(0, steps=3), "rank1.json": _without_first_collective(clean_rank(1, steps=3))},
    "small_skew": {"rank0.json": clean_rank(0), "rank1.json": clean_rank(1, shift_ns=20 * US)},
    "dropped": {"rank0.json": _with_events(clean_rank(0), {"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1.0}),
                "rank1.json": clean_rank(1)},
    "duplicates": {"rank0.json": _with_events(clean_rank(0), dict(clean_rank(0).events[1])),  # the first GEMM, again
                   "rank1.json": clean_rank(1)},
}
NO_RUN_METADATA = {"unknown_rank_alone", "no_metadata"}
# only comm kernels: every bit of comm reports as exposed
SCENARIOS["comm_only"] = {"rank0.json": clean_rank(0), "rank1.json": clean_rank(1)}
SCENARIOS["comm_only"]["rank1.json"].events = [
    e for e in SCENARIOS["comm_only"]["rank1.json"].events if "sgemm" not in e["name"]]
# step 2's first kernel (stream 20) runs before step 1's first one: its window start is moved up
SCENARIOS["clamped"] = {"rank0.json": _with_kernel(clean_rank(0), COMM, 8 * US, 9 * US, stream=21,
                                                   launch_ns=101 * US), "rank1.json": clean_rank(1)}
SCENARIOS["no_metadata"] = {"rank0.json": _no_distributed_info(clean_rank(0))}


@pytest.fixture(scope="module")
def scenarios_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scenarios")
    for run, traces in SCENARIOS.items():
        write_run(root / run, traces, run_json=run not in NO_RUN_METADATA)
    summary = ingest_traces([root / run for run in SCENARIOS], root / "w.duckdb", threads=1)
    assert summary.ok, [f.message for f in summary.by_status("failed")]
    return root / "w.duckdb"


@pytest.fixture(scope="module")
def findings(scenarios_db: Path) -> pl.DataFrame:
    return check_warehouse(scenarios_db).table


def only(findings: pl.DataFrame, run: str, check: str) -> pl.DataFrame:
    """The run's findings of ``check``, asserting the run has no other finding."""
    mine = findings.filter(run=run)
    rest = mine.filter(pl.col("check") != check)
    assert rest.is_empty(), rest.to_dicts()
    return mine.filter(check=check)


@pytest.mark.slow
def test_clean_run_has_no_finding(findings: pl.DataFrame) -> None:
    assert findings.filter(run="clean").is_empty()
    assert findings.schema == pl.Schema(COLUMNS)


def test_overlapping_kernels_on_one_stream(findings: pl.DataFrame) -> None:
    found = only(findings, "overlap", "overlapping_kernels")
    assert found.select("rank", "severity", "count").rows() == [(0, "warning", 1)]
    assert "overlap up to 10.0 us" in found["detail"][0]


def test_kernels_without_launch_event(findings: pl.DataFrame) -> None:
    mine = findings.filter(run="no_launch")
    assert sorted(mine["check"]) == ["kernels_without_launch", "unattributed_kernels"]
    found = mine.filter(check="kernels_without_launch")
    assert found.select("rank", "severity", "count").rows() == [(0, "info", 1)]
    assert found["detail"][0].startswith("1 of 5 kernels (20.0%)")
    # the rank has launches, so time does not decide: no step launched it (it lies in step 1's window)
    assert mine.filter(check="unattributed_kernels").select("rank", "severity", "count").rows() == [(0, "info", 1)]


def test_kernels_outside_every_step(findings: pl.DataFrame) -> None:
    mine = findings.filter(run="outside_steps")
    assert sorted(mine["check"]) == ["outside_steps", "unattributed_kernels"]
    assert mine.filter(check="unattributed_kernels").select("rank", "severity", "count").rows() == [(0, "info", 1)]
    found = mine.filter(check="outside_steps")
    # step 2's window ends with its all-reduce at 160 us; the kernel runs 260-270 us
    assert found.select("rank", "severity", "count").rows() == [(0, "info", 1)]
    assert "0 events (0.0 ms of activity) before the first step's window and 1 (0.01 ms) after" in found["detail"][0]


def test_trace_without_steps_is_reported_as_one_window(findings: pl.DataFrame) -> None:
    found = only(findings, "no_steps", "no_steps")
    assert found.select("rank", "severity", "count").rows() == [(0, "info", 1), (1, "info", 1)]
    assert "--step-marker" in found["detail"][0]


@pytest.mark.parametrize("run", ["unknown_rank_alone", "unknown_rank"])
def test_missing_rank(run: str, findings: pl.DataFrame) -> None:
    # trace_a.json names no rank and no job: a run of its own, beside the job's files or alone
    found = findings.filter(run=f"{run}/trace_a", check="missing_rank")
    assert found.select("rank", "severity", "count").rows() == [(-1, "info", 10)]  # 2 steps, 4 kernels, 4 launches
    assert "--rank N" in found["detail"][0] and "a rank of its own" in found["detail"][0]


def test_comm_without_compute(findings: pl.DataFrame) -> None:
    found = only(findings, "comm_only", "comm_without_compute")
    assert found.select("rank", "severity", "count").rows() == [(1, "warning", 2)]


def test_clamped_windows(findings: pl.DataFrame) -> None:
    mine = findings.filter(run="clamped")
    assert sorted(mine["check"]) == ["clamped_windows", "outside_steps"]
    found = mine.filter(check="clamped_windows")
    assert found.select("rank", "severity", "count").rows() == [(0, "info", 1)]
    assert "step 2 started before the previous one" in found["detail"][0]
    # windows never go back: step 2's window starts where step 1's would (10 us), so its kernel at 8 us
    # lies before the first window
    assert "1 events (0.001 ms of activity) before the first step's window" in mine.filter(check="outside_steps")["detail"][0]


@pytest.mark.slow
def test_ingest_refuses_a_second_trace_of_the_same_rank_and_steps(tmp_path: Path) -> None:
    write_run(tmp_path / "job", {"rank0.json": clean_rank(0), "rank0_again.json": clean_rank(0, seq=False)})
    summary = ingest_traces([tmp_path / "job"], tmp_path / "w.duckdb", threads=1)
    assert [f.status for f in summary.files] == ["ingested", "failed"]
    assert "run job already holds steps 1..2 of rank 0 from" in summary.files[1].message
    assert "--name NAME" in summary.files[1].message
    assert check_warehouse(tmp_path / "w.duckdb").table.filter(check="duplicate_rank").is_empty()


def test_check_finds_two_traces_of_one_rank_in_an_older_warehouse(tmp_path: Path) -> None:
    """Ingest refuses them now; a warehouse written before may hold them (simulated: two runs merged)."""
    write_run(tmp_path / "a", {"rank0.json": clean_rank(0)})
    write_run(tmp_path / "b", {"rank0.json": clean_rank(0, seq=False)})
    db = tmp_path / "w.duckdb"
    assert ingest_traces([tmp_path / "a", tmp_path / "b"], db, threads=1).ok
    import duckdb

    with duckdb.connect(str(db)) as con:
        con.execute("update traces set run = 'a'")
    found = check_warehouse(db).table.filter(check="duplicate_rank")
    assert found.select("run", "path", "rank", "severity", "count").rows() == [("a", None, 0, "warning", 2)]


def test_missing_metadata(findings: pl.DataFrame) -> None:
    found = only(findings, "no_metadata", "missing_metadata")
    assert found["severity"].to_list() == ["info", "info"]
    assert found["path"].null_count() == 1  # one row for the trace, one for the run
    assert any("distributedInfo" in d for d in found["detail"]) and any("run metadata" in d for d in found["detail"])


def test_incomplete_last_step(findings: pl.DataFrame) -> None:
    found = only(findings, "incomplete", "incomplete_steps")
    assert found.select("rank", "severity", "count").rows() == [(0, "info", 1)]
    assert "step 2 (1 launches without device work)" in found["detail"][0]


def test_ranks_with_different_step_counts(findings: pl.DataFrame) -> None:
    found = only(findings, "step_counts", "step_count_mismatch")
    assert found.select("path", "rank", "severity", "count").rows() == [(None, None, "warning", 1)]
    assert "3 step(s) on rank 1; 2 step(s) on rank 0" in found["detail"][0]


@pytest.mark.parametrize("run", ["skew_by_seq", "skew_by_order"])
def test_clock_skew_from_collective_end_times(run: str, findings: pl.DataFrame) -> None:
    found = only(findings, run, "clock_skew")
    assert found.select("rank", "severity", "count").rows() == [(1, "warning", 2)]
    assert "the clock of rank 1 is 700.0 us behind rank 0" in found["detail"][0]


def test_clock_skew_matches_the_same_seq_not_the_same_position(findings: pl.DataFrame) -> None:
    assert findings.filter(run="late_start").is_empty()


def test_small_skew_is_below_the_threshold(findings: pl.DataFrame, scenarios_db: Path) -> None:
    assert findings.filter(run="small_skew").is_empty()
    found = check_warehouse(scenarios_db, skew_threshold_us=10).table.filter(run="small_skew")
    assert found.select("check", "rank").rows() == [("clock_skew", 1)]
    assert "20.0 us ahead of rank 0" in found["detail"][0]


def test_events_dropped_by_ingest(findings: pl.DataFrame) -> None:
    found = only(findings, "dropped", "dropped_events")
    assert found.select("rank", "severity", "count").rows() == [(0, "warning", 1)]


def test_duplicate_events(findings: pl.DataFrame) -> None:
    found = only(findings, "duplicates", "duplicate_events")
    assert found.select("rank", "severity", "count").rows() == [(0, "warning", 1)]


def test_every_check_has_a_documented_sql_file() -> None:
    for name in CHECKS:
        header = next(line for line in sql_text(f"check_{name}.sql").splitlines() if not line.startswith("-- inputs:"))
        assert header.startswith(f"-- check_{name}: one row per"), header


def _cli(*args: str):
    return CliRunner().invoke(app, ["check", *args])


def test_cli_exit_code_is_0_when_only_info_findings(tmp_path: Path) -> None:
    write_run(tmp_path / "clean", SCENARIOS["clean"])
    write_run(tmp_path / "no_launch", SCENARIOS["no_launch"])
    db = tmp_path / "w.duckdb"
    assert ingest_traces([tmp_path / "clean", tmp_path / "no_launch"], db, threads=1).ok
    result = _cli("--db", str(db))
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("0 warning(s), 2 info finding(s)")  # kernels without launch, launched by no step
    assert "kernels_without_launch" in result.stdout and "clean" not in result.stdout


def test_cli_exit_code_is_1_when_a_finding_needs_attention(scenarios_db: Path, findings: pl.DataFrame) -> None:
    result = _cli("--db", str(scenarios_db), "--format", "json")
    assert result.exit_code == 1
    rows = json.loads(result.stdout)
    assert rows == findings.to_dicts() and list(rows[0]) == list(COLUMNS)
    assert rows[0]["severity"] == "warning"  # warnings first


def test_cli_without_a_warehouse_says_what_to_do(tmp_path: Path) -> None:
    result = _cli("--db", str(tmp_path / "none.duckdb"))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "no warehouse here; ingest traces into it first" in result.stderr


def test_cli_help_documents_the_exit_code() -> None:
    text = CliRunner().invoke(app, ["check", "--help"]).stdout
    assert "Exit code" in text and "traceq check --db runs.duckdb" in text


@pytest.mark.slow
def test_device_side_copies_and_waits_are_not_kernels_without_launch(corpus_db: Path) -> None:
    """MTIA issues dma_request, event_record and event_wait on the device: no runtime call launches
    them, and the check explained 298 of them as kernels launched before the profiler started. The
    count here is made apart, by name, over the trace's raw tables."""
    import duckdb

    with duckdb.connect(str(corpus_db), read_only=True) as con:
        counts = con.execute("""
            with launches as (
                select distinct trace_id, rank, correlation from host_events
                where cat in ('cuda_runtime', 'cuda_driver', 'mtia_runtime') and correlation is not null)
            select n.name in ('dma_request', 'event_record', 'event_wait') as device_side, count(*)
            from gpu_events g inner join names n using (trace_id, name_id) inner join traces t using (trace_id)
            anti join launches l on l.trace_id = g.trace_id and l.rank = g.rank and l.correlation = g.correlation
            where t.run = 'mtia_inference_trace' and g.kind = 1
            group by all""").fetchall()
        kernels = con.execute("""
            select count(*) from gpu_events g inner join names n using (trace_id, name_id) inner join traces t using (trace_id)
            where t.run = 'mtia_inference_trace' and g.kind = 1
              and n.name not in ('dma_request', 'event_record', 'event_wait')""").fetchall()[0][0]
    orphans, device_side = dict(counts)[False], dict(counts)[True]
    assert device_side > 200 and 0 < orphans < 50
    row = check_warehouse(corpus_db).table.filter(
        (pl.col("run") == "mtia_inference_trace") & (pl.col("check") == "kernels_without_launch"))
    assert row["count"].to_list() == [orphans]
    assert row["detail"][0].startswith(f"{orphans} of {kernels} kernels (")
    assert row["detail"][0].endswith(f"({device_side} device-side copies and waits, which no launch starts, are not counted)")
