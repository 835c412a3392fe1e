"""The Perfetto engine (docs/how-to/perfetto.md): traceq's classification, step windows and interval metrics in
PerfettoSQL (sql/perfetto/), run by Perfetto's trace processor on the trace files, against hand-worked
answers and against the DuckDB engine on every corpus GPU trace, per step and over the whole trace.

The two engines share nothing but the rule tables and the step selection: Perfetto imports the JSON
itself and computes the metrics another way (unions and intersections of Perfetto's interval library,
where DuckDB sweeps +1/-1 boundaries), so agreement to the ns checks each against the other. Where
they cannot agree (Perfetto reads times through 64-bit floats) the engine says so, and the test holds
it to the bound it states.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT, corpus_path, skip_or_fail
from tests.test_step_windows import EXPECTED, NCCL, US, lagging_trace
from tests.tracegen import TraceBuilder
from traceq import query
from traceq.cli import app
from traceq.errors import ConfigError, EmptySelection
from traceq.ingest import ingest_traces
from traceq.ingest.census import count_device_events
from traceq.report.metrics import metric_report
from traceq.perfetto.engine import NS_COLUMNS, analyse_trace, perfetto_report, time_error_ns
from traceq.perfetto.processor import (
    ENV_VAR,
    EngineError,
    first_group_only,
    open_trace,
    perfetto_pattern,
    trace_processor_binary,
)
from traceq.report.selection import StepSelection, query_params
from traceq.store.warehouse import opened

BINARY = ROOT.parent / "shared" / "bin" / "trace_processor_shell"
EVERY_STEP = StepSelection(skip_steps=0, include_last=True, drop_incomplete=False)
KEYS = ["rank", "device", "step"]
FLOAT_NOTE = "more digits than a 64-bit float holds"


@pytest.fixture(scope="module")
def binary() -> Path:
    if not BINARY.is_file():
        skip_or_fail(f"{BINARY} is absent: Perfetto's trace processor, built for this machine (../shared/bin)")
    return BINARY


# ---------------------------------------------------------------------------------------------
# finding the binary, passing the rules in


def test_the_binary_comes_from_the_option_then_the_environment_then_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, binary: Path
) -> None:
    other = tmp_path / "tp"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert trace_processor_binary(None) is None  # the perfetto package's own download
    monkeypatch.setenv(ENV_VAR, str(other))
    assert trace_processor_binary(None) == other
    assert trace_processor_binary(binary) == binary  # the option wins over the environment
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(EngineError, match=f"{ENV_VAR} .*missing: not an executable file; pass --trace-processor PATH"):
        trace_processor_binary(None)
    (tmp_path / "plain").write_text("")
    with pytest.raises(EngineError, match="--trace-processor .*plain: not an executable file"):
        trace_processor_binary(tmp_path / "plain")


def test_a_missing_binary_is_one_line_that_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere" / "trace_processor_shell"))
    result = CliRunner().invoke(app, ["sql", "--engine", "perfetto", str(tmp_path / "t.json"), "select 1"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "get.perfetto.dev/trace_processor" in lines[0], result.output


def test_patterns_are_translated_for_perfettos_regular_expressions() -> None:
    assert perfetto_pattern("(?i)gemm|Cijk_", "rule") == ("gemm|cijk_", True)
    assert perfetto_pattern(r"(?i)^\D+Norm", "rule") == (r"^\D+norm", True)  # an escape keeps its case
    assert perfetto_pattern("^ncclDevKernel_Generic", "rule") == ("^ncclDevKernel_Generic", False)
    for bad, words in (("gemm(?i)x", "inline flags"), (r"(?<=Step#)\d+", "look-behind"),
                       (r"(?P<n>\d+)", "named groups"), (r"^ProfilerStep#(\d{,3})$", "lower bound")):
        with pytest.raises(ConfigError, match=words):
            perfetto_pattern(bad, "step marker")
    # the step number is group 1: later groups stop capturing (Perfetto's regexp_extract takes one)
    assert first_group_only(r"^(Profiler)Step#(\d+)$") == r"^(Profiler)Step#(?:\d+)$"
    assert first_group_only(r"^\(x\)[(]a(?:b)(\d+)(c)") == r"^\(x\)[(]a(?:b)(\d+)(?:c)"


@pytest.mark.slow
def test_step_markers_with_case_and_groups_number_steps_as_at_ingest(tmp_path: Path, binary: Path) -> None:
    t = lagging_trace()
    for e in t.events:
        if e["name"].startswith("ProfilerStep#"):
            e["name"] = e["name"].replace("ProfilerStep#", "Train Step ")
    path = t.write(tmp_path / "job" / "rank0.json")
    db = tmp_path / "w.duckdb"
    for marker in (r"(?i)^train step (\d+)$", r"^(Train) Step (\d+)$", r"^Train Step \d+$"):
        mine = perfetto_report([path], "exposed_comm", by="run,rank,step", binary=binary, step_marker=marker,
                               selection=EVERY_STEP)
        assert ingest_traces([path], db, threads=1, step_marker=marker, force=True).ok
        assert mine.table.equals(metric_report(db, "exposed_comm", by="run,rank,step", selection=EVERY_STEP).table), marker
        assert mine.table["exposed_comm_us"].to_list() == [60.0, 0.0, 40.0], marker


# ---------------------------------------------------------------------------------------------
# hand-made traces


@pytest.mark.slow
def test_a_gpu_that_lags_its_cpu_gets_the_hand_computed_windows(tmp_path: Path, binary: Path) -> None:
    path = lagging_trace().write(tmp_path / "job" / "rank0.json")
    result = analyse_trace(path, "job", 0, binary)
    steps = result.windows.filter(pl.col("scope") == "step").sort("step")
    assert steps["step"].to_list() == [1, 2, 3]
    assert [(r["window_start_ns"] // US, r["window_ns"] // US) for r in steps.iter_rows(named=True)] == [(160, 90), (250, 80), (330, 70)]
    for row in steps.iter_rows(named=True):
        got = {name: row[f"{name}_ns"] / US for name in EXPECTED[row["step"]]}
        assert got == EXPECTED[row["step"]], row["step"]
    whole = result.windows.filter(pl.col("scope") == "trace").row(0, named=True)
    # P [5,15) lies before the first window but in the whole trace: compute 10 + 30 + 50 + 30
    assert (whole["compute_ns"] // US, whole["window_start_ns"] // US, whole["window_ns"] // US) == (120, 5, 395)
    assert result.notes == []


@pytest.mark.slow
def test_kernels_that_overlap_on_one_stream_are_all_counted(tmp_path: Path, binary: Path) -> None:
    """Perfetto's JSON importer cannot nest a slice that partly overlaps another on its track; it moves it
    to an overflow track. Compute A [0,50) and B [30,80) on one stream, comm C [60,100) on another:
    compute_kernel 100, |U(compute)| 80, comm 40, overlapped [60,80) 20, exposed 20, window 100."""
    t = TraceBuilder(rank=0)
    t.step(1, 0, 200 * US)
    t.kernel("ampere_sgemm_128x64_nn", 0, 50 * US, launch_ns=1 * US)
    t.kernel("ampere_sgemm_128x64_nn", 30 * US, 80 * US, launch_ns=2 * US)
    t.kernel(NCCL, 60 * US, 100 * US, stream=20, launch_ns=3 * US)
    path = t.write(tmp_path / "job" / "rank0.json")
    result = analyse_trace(path, "job", 0, binary)
    row = result.windows.filter(pl.col("scope") == "step").row(0, named=True)
    got = {k: row[k] // US for k in ("compute_kernel_ns", "compute_ns", "comm_ns", "overlapped_comm_ns", "exposed_comm_ns", "window_ns", "idle_ns")}
    assert got == dict(compute_kernel_ns=100, compute_ns=80, comm_ns=40, overlapped_comm_ns=20, exposed_comm_ns=20,
                       window_ns=100, idle_ns=0)
    assert result.slice_counts == {"kernel": 3}
    assert any("1 slice(s) overlap others on their track" in n and "nothing lost" in n for n in result.notes), result.notes


@pytest.mark.slow
def test_a_step_that_launched_nothing_keeps_its_row_as_on_duckdb(tmp_path: Path, binary: Path) -> None:
    """Steps 1 [0,100), 2 [100,400) (launches nothing), 3 [400,500) us: step_time 100, 300, 100 us, a mean of
    166.667 us; step 2 has no device window, so its interval metrics are empty, not 0."""
    t = TraceBuilder(rank=0)
    for n, (lo, hi) in enumerate(((0, 100), (100, 400), (400, 500)), start=1):
        t.step(n, lo * US, hi * US)
    t.kernel("ampere_sgemm_128x64_nn", 10 * US, 60 * US, launch_ns=5 * US)
    t.kernel("ampere_sgemm_128x64_nn", 410 * US, 460 * US, launch_ns=405 * US)
    path = t.write(tmp_path / "job" / "rank0.json")
    mine = perfetto_report([path], "compute,step_time", by="run,rank,step", binary=binary, selection=EVERY_STEP)
    assert mine.table["step_time_ms"].to_list() == [0.1, 0.3, 0.1]
    assert mine.table["compute_us"].to_list() == [50.0, None, 50.0]
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    for by in ("run,rank,step", "run"):
        assert perfetto_report([path], "compute,step_time", by=by, binary=binary, selection=EVERY_STEP).table.equals(
            metric_report(db, "compute,step_time", by=by, selection=EVERY_STEP).table), by


@pytest.mark.slow
def test_events_perfetto_reads_and_traceq_does_not_are_reported(tmp_path: Path, binary: Path) -> None:
    """Times written as strings: Perfetto reads them, traceq drops the event (DESIGN §8: not guessed at);
    a negative duration: both drop it, and Perfetto counts it in its stats."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 10.0, "dur": 5.0, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": "20.0", "dur": 5.0, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "k3", "pid": 0, "tid": 7, "ts": 40.0, "dur": -1, "args": {"device": 0, "stream": 7}},
    ]
    path = tmp_path / "job" / "rank0.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"traceEvents": events}))
    assert count_device_events(path) == {"kernel": 1}
    result = analyse_trace(path, "job", 0, binary)
    assert result.slice_counts == {"kernel": 2}
    assert any("importer read 2 kernel events where traceq reads 1" in n for n in result.notes), result.notes
    assert any("slice_negative_duration = 1" in n for n in result.notes), result.notes


# ---------------------------------------------------------------------------------------------
# every corpus GPU trace against the DuckDB engine


def _gpu_traces(corpus_db: Path) -> list[tuple[int, str, int]]:
    with opened(corpus_db) as con:
        return con.sql(
            "select t.trace_id, t.path, min(s.rank) from traces as t inner join steps as s using (trace_id) "
            "where t.n_gpu_events > 0 group by all order by t.trace_id"
        ).fetchall()


@pytest.fixture(scope="module")
def both_engines(corpus_db: Path, binary: Path) -> list[dict]:
    """Per corpus GPU trace: the Perfetto engine's steps, windows, notes, classification summary and slice
    counts, and the DuckDB engine's from the corpus warehouse."""
    out = []
    with opened(corpus_db) as con:
        params = query_params(EVERY_STEP)
        for trace_id, path, rank in _gpu_traces(corpus_db):
            result = analyse_trace(Path(path), "corpus", rank, binary)
            with open_trace(Path(path), binary, rank) as trace:
                trace.load("step_attribution")
                classes = trace.query(
                    "select d.rank, d.device, d.class, d.category, coalesce(d.collective_type, '-') as ct, "
                    "coalesce(a.step, -99) as step, coalesce(a.step_source, '-') as source, count(*) as n, sum(d.dur_ns) as dur_ns "
                    "from traceq_device_events as d left join traceq_step_attribution as a using (id) group by 1, 2, 3, 4, 5, 6, 7"
                )
            windows = query.run(con, "device_windows", params).filter(f"trace_id = {trace_id} and n_launched <> 0")
            con.register("step_windows", windows.select("trace_id, rank, device, step, start_ns, end_ns").pl().to_arrow())
            out.append(dict(
                path=path, perfetto=result, perfetto_classes=classes,
                step=query.run(con, "interval_breakdown", params, bind={"windows": "step_windows"}).filter(f"trace_id = {trace_id}").pl(),
                trace=query.run(con, "interval_breakdown", params, bind={"windows": "trace_windows"}).filter(f"trace_id = {trace_id}").pl(),
                steps=con.sql(f"select rank, step, start_ns, end_ns, step_time_ns, launches_without_gpu_work, source from steps "
                              f"where trace_id = {trace_id}").pl(),
                classes=query.run(con, "gpu_activity", params).filter(f"trace_id = {trace_id}").aggregate(
                    "rank, device, class, category, coalesce(collective_type, '-') as ct, coalesce(step, -99) as step, "
                    "coalesce(step_source, '-') as source, count(*) as n, sum(dur_ns) as dur_ns").pl(),
                counts=dict(con.sql(f"select kind, count(*) from gpu_events where trace_id = {trace_id} group by kind").fetchall()),
            ))
    if len(out) < 20:
        skip_or_fail(f"only {len(out)} corpus GPU traces in the warehouse")
    return out


def _float_bound(case: dict) -> int | None:
    """The bound a trace's float note states, in ns per time (None: no note, the engines must agree exactly)."""
    note = next((n for n in case["perfetto"].notes if FLOAT_NOTE in n), None)
    return None if note is None else int(note.split("off by up to ")[1].split(" ns")[0])


@pytest.mark.slow
def test_interval_metrics_equal_the_duckdb_engine_to_the_ns_per_step_and_whole_trace(both_engines: list[dict]) -> None:
    cols = [*KEYS, *NS_COLUMNS, "window_start_ns"]
    exact = 0
    for case in both_engines:
        bound = _float_bound(case)
        for scope in ("step", "trace"):
            mine = case["perfetto"].windows.filter(pl.col("scope") == scope).select(cols).sort(KEYS)
            theirs = case[scope].select(cols).sort(KEYS).cast({c: pl.Int64 for c in cols})
            assert mine.select(KEYS).equals(theirs.select(KEYS)), (case["path"], scope)
            diff = (mine.drop(KEYS) - theirs.drop(KEYS)).select(pl.all().abs().max()).row(0, named=True)
            if bound is None:
                assert not any(diff.values()), (case["path"], scope, diff)
            else:  # a window moves by at most the error of each of its two edges
                assert all(d <= 2 * bound for d in diff.values()), (case["path"], scope, diff, bound)
        exact += bound is None
    assert exact >= 18  # every trace but those whose times carry more digits than a double


@pytest.mark.slow
def test_the_float_note_appears_exactly_where_the_engines_times_differ(both_engines: list[dict]) -> None:
    noted = {Path(c["path"]).name for c in both_engines if _float_bound(c) is not None}
    assert {"nccl_data.json.gz", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"} <= noted
    for case in both_engines:
        differs = not case["perfetto"].windows.filter(pl.col("scope") == "trace").select(*KEYS, "window_start_ns").sort(KEYS).equals(
            case["trace"].select(*KEYS, "window_start_ns").sort(KEYS).cast({c: pl.Int64 for c in (*KEYS, "window_start_ns")}))
        assert not differs or _float_bound(case) is not None, case["path"]
    assert time_error_ns(1_712_195_495_705_059_117) == 254  # 1.7e18 ns: half ULPs 125 + 128, + 1
    assert time_error_ns(4_458_676_423_385_774) == 2


@pytest.mark.slow
def test_steps_equal_the_duckdb_engine(both_engines: list[dict]) -> None:
    for case in both_engines:
        mine = case["perfetto"].steps.sort("rank", "step")
        theirs = case["steps"].sort("rank", "step").cast({c: pl.Int64 for c in mine.columns if c != "source"})
        assert mine.select("rank", "step", "source", "launches_without_gpu_work").equals(
            theirs.select("rank", "step", "source", "launches_without_gpu_work")), case["path"]
        bound = _float_bound(case) or 0
        for col in ("start_ns", "end_ns"):
            assert (mine[col] - theirs[col]).abs().max() <= bound, (case["path"], col)


@pytest.mark.slow
def test_classification_collective_types_and_step_attribution_equal_the_duckdb_engine(both_engines: list[dict]) -> None:
    for case in both_engines:
        theirs = case["classes"]
        mine = case["perfetto_classes"].cast({c: theirs.schema[c] for c in theirs.columns})
        keys = [c for c in theirs.columns if c not in ("n", "dur_ns")]
        assert mine.sort(keys).equals(theirs.sort(keys)), case["path"]


@pytest.mark.slow
def test_perfetto_slice_counts_equal_the_traces_event_counts(both_engines: list[dict]) -> None:
    kinds = {"kernel": 1, "memcpy": 2, "memset": 3}
    for case in both_engines:
        sliced = case["perfetto"].slice_counts
        assert {kinds[r]: n for r, n in sliced.items()} == case["counts"], case["path"]
        assert not any("importer read" in n for n in case["perfetto"].notes), case["path"]


# ---------------------------------------------------------------------------------------------
# the report and the sql command


@pytest.mark.slow
def test_the_report_equals_the_duckdb_engines_report(tmp_path: Path, binary: Path) -> None:
    files = [corpus_path("amd_hpctraining/fused_traces/merged_all_events.json.gz"),
             corpus_path("tracelens/mi300/resnet_act_checkpoint.json.gz")]
    db = tmp_path / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    metrics = "exposed_comm,overlapped_comm,idle,compute_kernel,exposed_memcpy,overlap_ratio,step_time"
    for by in ("run,rank,step", "run,rank", "run", "rank", "step", "run,step"):
        duck = metric_report(db, metrics, by=by)
        # several metrics side by side: as many rows as one metric alone (no rank paired with another's)
        assert duck.table.height == metric_report(db, "idle", by=by).table.height, by
        mine = perfetto_report(files, metrics, by=by, binary=binary, selection=StepSelection())
        assert mine.table.equals(duck.table.select(mine.table.columns)), by
        if by == "rank":  # one row per (run, rank): two runs' rank 0 are not joined to each other
            assert duck.table.height == duck.rows.select("run", "rank").n_unique() == 5
    whole = perfetto_report(files, "comm", by="run,rank", whole_trace=True, binary=binary)
    assert whole.table.equals(metric_report(db, "comm", by="run,rank", whole_trace=True).table)


@pytest.mark.slow
def test_a_step_marker_names_the_steps_as_at_ingest(tmp_path: Path, binary: Path) -> None:
    t = lagging_trace()
    for e in t.events:
        if e["name"].startswith("ProfilerStep#"):
            e["name"] = "train_step"  # no number: steps 1, 2, 3 in time order
    path = t.write(tmp_path / "job" / "rank0.json")
    mine = perfetto_report([path], "exposed_comm", by="run,rank,step", binary=binary, step_marker="^train_step",
                           selection=EVERY_STEP)
    assert mine.table["step"].to_list() == [1, 2, 3]
    assert mine.table["exposed_comm_us"].to_list() == [EXPECTED[s]["exposed_comm"] for s in (1, 2, 3)]
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1, step_marker="^train_step").ok
    assert mine.table.equals(metric_report(db, "exposed_comm", by="run,rank,step", selection=EVERY_STEP).table)


@pytest.mark.slow
def test_two_files_holding_one_step_of_a_rank_are_refused_as_at_ingest(tmp_path: Path, binary: Path) -> None:
    for name in ("a.json", "b.json"):
        lagging_trace().write(tmp_path / "job" / name)  # both say distributedInfo.rank 0, steps 1..3
    with pytest.raises(ConfigError, match="b.json: run job already holds steps 1..3 of rank 0 from .*a.json"):
        perfetto_report([tmp_path / "job"], "exposed_comm", binary=binary)
    # profiling cycles: one rank, other steps in each file
    later = lagging_trace()
    for e in later.events:
        if e["name"].startswith("ProfilerStep#"):
            e["name"] = "ProfilerStep#1" + e["name"][-1]
    later.write(tmp_path / "job" / "b.json")
    mine = perfetto_report([tmp_path / "job"], "exposed_comm", by="run,rank,step", binary=binary, selection=EVERY_STEP)
    assert mine.table["step"].to_list() == [1, 2, 3, 11, 12, 13]
    db = tmp_path / "w.duckdb"
    assert ingest_traces([tmp_path / "job"], db, threads=1).ok
    assert mine.table.equals(metric_report(db, "exposed_comm", by="run,rank,step", selection=EVERY_STEP).table)


@pytest.mark.slow
def test_notes_say_what_a_trace_lacks_and_what_exists(tmp_path: Path, binary: Path) -> None:
    t = lagging_trace()
    t.rank = None  # no distributedInfo, no rank in the file name
    t.events = [e for e in t.events if not e["name"].startswith("ProfilerStep#")]
    path = t.write(tmp_path / "job" / "trace.json")
    notes = perfetto_report([path], "exposed_comm", binary=binary).notes
    assert any("trace.json names no rank" in n and "a run of its own, job/trace, as rank -1" in n for n in notes), notes
    assert any("rank -1 has no step marker: reported over its whole trace" in n for n in notes), notes
    with pytest.raises(EmptySelection, match=r"run job2: steps 1\.\.3 \(3 per rank\)"):
        perfetto_report([lagging_trace().write(tmp_path / "job2" / "rank0.json")], "exposed_comm",
                        selection=StepSelection(step_min=50, step_max=60), binary=binary)


def test_a_cpu_only_trace_is_said_to_be_outside_the_perfetto_engine(binary: Path) -> None:
    trace = corpus_path("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    with pytest.raises(EmptySelection, match="no trace has device activity"):
        perfetto_report([trace], "exposed_comm", binary=binary)


@pytest.mark.slow
def test_report_engine_perfetto_on_the_command_line(binary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(binary))
    trace = str(corpus_path("tracelens/mi300/resnet_act_checkpoint.json.gz"))
    runner = CliRunner()
    result = runner.invoke(app, ["report", "--engine", "perfetto", "--metric", "exposed_comm", "--by", "run,rank,step",
                                 "--include-last", "--format", "csv", trace])
    assert result.exit_code == 0, result.output
    rows = [line.split(",") for line in result.stdout.strip().splitlines()]
    assert rows[0][:4] == ["run", "rank", "step", "exposed_comm_us"] and [r[2] for r in rows[1:]] == ["15", "16", "17"]
    for args, message in (
        (["report", trace], "trace files are read by --engine perfetto"),
        (["report", "--engine", "perfetto"], "give the trace files to read"),
        (["report", "--engine", "perfetto", "--html", "x.html", trace], "the HTML report reads the warehouse"),
        (["report", "--engine", "perfetto", "--metric", "tokens_per_s", trace], "for the others use --engine duckdb"),
        (["report", "--engine", "perfetto", "--by", "world_size", trace], "world_size"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and message in result.output, (args, result.output)


@pytest.mark.slow
def test_sql_runs_your_own_query_on_either_engine(tmp_path: Path, binary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(binary))
    path = lagging_trace().write(tmp_path / "job" / "rank0.json")
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    runner = CliRunner()
    mine = runner.invoke(app, ["sql", "--engine", "perfetto", str(path), "--format", "csv",
                               "select step, exposed_comm_ns from traceq_interval_breakdown where scope = 'step' order by step"])
    duck = runner.invoke(app, ["sql", "--db", str(db), "--format", "csv",
                               "select step, exposed_comm_ns from interval_breakdown order by step"])
    assert mine.exit_code == 0 and duck.exit_code == 0, (mine.output, duck.output)
    assert mine.stdout == duck.stdout == "step,exposed_comm_ns\n1,60000\n2,0\n3,40000\n"
    # Perfetto's own tables sit beside traceq's
    own = runner.invoke(app, ["sql", "--engine", "perfetto", str(path), "--format", "csv",
                              "select count(*) as n from slice where category = 'kernel'"])
    assert own.stdout == "n\n6\n", own.output  # A, C1, B, D, C3, P (M is a memcpy)
    for args, message in (
        (["sql", "--db", str(db), "selec 1"], "DuckDB refused the query"),
        (["sql", "--db", str(db), str(path), "select 1"], "to query a trace file use --engine perfetto"),
        (["sql", "--engine", "perfetto", "select 1"], "give one trace file, then the query"),
        (["sql", "--engine", "perfetto", str(path), "selec 1"], "refused a query: syntax error near 'selec'"),
        (["sql", "--engine", "perfetto", str(path), "select * from nonexistent"], "refused a query: no such table: nonexistent"),
        (["sql", "--engine", "perfetto", str(path), "select 1 as x, 2 as x"], "two columns named x"),
        (["sql", "--engine", "perfetto", str(path), "create perfetto table t as select 1 as a"], "not a query"),
        (["sql", "--engine", "perfetto", str(tmp_path), "select 1"], "not a trace file"),
        (["sql", "--db", str(db), "select * from steps as s join traces as t on t.trace_id = s.trace_id"],
         "two columns named trace_id"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and message in result.output, (args, result.output)


@pytest.mark.slow
def test_a_killed_command_leaves_no_trace_processor_behind() -> None:
    """The trace processor serves the trace on a localhost port: `kill -9` of traceq while it runs must
    not leave it running (reparented, the trace open to any local user). It runs under a watchdog that
    ends it when traceq ends."""
    import signal
    import subprocess
    import sys
    import time

    binary = str(BINARY.resolve()) if BINARY.is_file() else None
    if binary is None:
        skip_or_fail(f"{BINARY} is absent")
    trace = corpus_path("amd_hpctraining/fused_traces/merged_all_events.json.gz")

    def processors() -> set[int]:
        found = set()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmd = (proc / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if cmd and cmd[0].decode(errors="replace") == binary and b"--http-port" in cmd:
                    found.add(int(proc.name))
        return found

    before = processors()
    for _ in range(2):
        command = subprocess.Popen(
            [sys.executable, "-m", "traceq.cli", "report", "--engine", "perfetto", "--trace-processor", binary,
             "--metric", "exposed_comm", "--by", "run,rank,step", str(trace)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        started: set[int] = set()
        while not started and command.poll() is None and time.monotonic() < deadline:
            # this command's: another traceq on the machine (a suite run beside this one) has its own
            started = {pid for pid in processors() - before if descends_from(pid, command.pid)}
            time.sleep(0.02)
        assert started, "the trace processor never started"
        command.send_signal(signal.SIGKILL)
        command.wait()
        deadline = time.monotonic() + 5
        while processors() & started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processors() & started, "a trace processor outlived the traceq that started it"


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or one of its descendants (False once it is gone)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent: after the name, the state
    return False


def test_the_perfetto_packages_own_trace_processor_runs_under_the_watchdog_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, binary: Path
) -> None:
    """Without --trace-processor the package's download runs it; it was started bare, and a killed
    traceq left it serving the trace. The download itself cannot happen here (no network): the
    package's look-up is made to answer with the binary it would have cached."""
    from perfetto.trace_processor.api import PLATFORM_DELEGATE

    def cached(self: object, bin_path: str | None, fetch_latest: bool = False) -> str:
        return bin_path if bin_path is not None else str(binary)

    monkeypatch.setattr(PLATFORM_DELEGATE, "get_shell_path", cached)
    trace = TraceBuilder(rank=0)
    trace.step(1, 0, 100_000)
    trace.kernel("sgemm", 10_000, 20_000, launch_ns=1_000)
    path = trace.write(tmp_path / "job" / "rank0.json")

    def launched() -> list[list[str]]:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if (proc.name.isdigit() and len(cmd) > 1 and "/traceq-tp-" in cmd[1] and "--http-port" in cmd
                    and descends_from(int(proc.name), os.getpid())):  # not another process's
                found.append(cmd)
        return found

    with open_trace(path, None, 0) as opened_trace:
        opened_trace.execute("select 1")
        running = launched()
    assert len(running) == 1 and running[0][1].endswith("/trace_processor_shell"), running
