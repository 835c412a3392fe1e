"""The critical path across ranks (docs/explanation/across-ranks.md, "The critical path"): hand-made traces worked out
by hand, a brute-force reference written apart from the code (tests/critical_path_reference.py), the tiling identity
on every corpus multi-rank run and on real gloo runs, and on single-rank runs the identity with the interval and idle
breakdowns (computed by other SQL)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.test_cross_rank import ALL_REDUCE, GEMM, US, collective_args, ingest, late_rank_run
from tests.tracegen import TraceBuilder
from traceq import query
from traceq.cli import app
from traceq.errors import ConfigError, EmptySelection
from traceq.ingest import ingest_traces
from traceq.report import path_walk
from traceq.report.critical_path import critical_path
from traceq.report.path_timeline import FAR
from traceq.report.selection import StepSelection, query_params
from traceq.store.warehouse import connect

EVERY_STEP = StepSelection(skip_steps=0, include_last=True, drop_incomplete=False)
BREAKDOWN = {"compute": ("compute",), "exposed_comm": ("comm_transfer",), "exposed_memcpy": ("memcpy", "memset"),
             "idle_host_bound": ("idle_host_bound",), "idle_sync": ("idle_sync",), "idle_other": ("idle_other",),
             "idle_unknown": ("idle_unknown",)}


def path_of(result, step: int) -> list[tuple]:
    """(rank, kind, name, ns) of the step's segments in time order."""
    seg = result.segments.filter(pl.col("step") == step).sort("order")
    return [(r["rank"], r["kind"], r["name"], r["dur_ns"]) for r in seg.iter_rows(named=True)]


def assert_tiles(result) -> None:
    """The segments of every step follow each other without gap or overlap on the last-ending rank's clock,
    never run backwards, and sum to its window, to the ns."""
    assert result.steps.height
    for row in result.steps.iter_rows(named=True):
        seg = result.segments.filter(pl.col("step") == row["step"]).sort("order")
        assert seg.height, row
        assert (seg["dur_ns"] > 0).all() and (seg["end_ns"] > seg["start_ns"]).all()
        starts, durs = seg["path_start_ns"].to_list(), seg["dur_ns"].to_list()
        assert all(starts[i] + durs[i] == starts[i + 1] for i in range(len(starts) - 1)), row["step"]
        assert sum(durs) == round(row["span_ms"] * 1e6), row
        jumps = result.jumps.filter(pl.col("step") == row["step"])
        assert ((jumps["path_ns"] > starts[0]) & (jumps["path_ns"] <= starts[-1] + durs[-1])).all()


# ------------------------------------------------------------------------------------------ by hand


@pytest.mark.slow
def test_a_late_rank_holds_the_path_as_worked_by_hand(tmp_path: Path) -> None:
    """late_rank_run (tests/test_cross_rank.py): three ranks, windows [30, 50) us on one clock, an AllReduce
    ending at 50 us on each. The walk starts on rank 0 (the windows end together: lowest rank): [47, 50) is
    its AllReduce's transfer (its gemm ended at 44); [44, 47) is its wait (kernel [40, 50), transfer 3 us,
    wait 7): it waited for rank 2, whose kernel starts at 47 = the end of rank 0's wait part. On rank 2 at
    47 its gemm [30, 48) runs (compute wins over the transfer beside it): 17 us of compute back to 30.
    Of rank 0's 7 us of waiting, 3 ([44, 47)) are on the path: before 44 its own gemm ran beside it."""
    db = ingest(tmp_path, late_rank_run())
    result = critical_path(db, selection=EVERY_STEP, segments=True)
    assert path_of(result, 1) == [(2, "compute", GEMM, 17 * US), (0, "comm_transfer", ALL_REDUCE, 3 * US)]
    jump = result.jumps.row(0, named=True)
    assert (jump["from_rank"], jump["to_rank"], jump["wait_on_path_ns"], jump["collective_type"]) == (0, 2, 3 * US, "AllReduce")
    assert result.steps.select("step", "last_rank", "ranks_on_path", "jumps", "top_rank").row(0) == (1, 0, 2, 1, 2)
    ranks = result.ranks()
    assert ranks.select("rank", "critical_ms", "wait_caused_ms").rows() == [(2, 0.017, 0.003), (0, 0.003, 0.0)]
    assert result.sentence(1).startswith("step 1 took 0.020 ms on rank 0's clock (the last to end): 0.017 ms is rank 2's compute")
    assert_tiles(result)


def test_a_clock_offset_between_ranks_changes_nothing_but_the_times(tmp_path: Path) -> None:
    """The jump lands at the late rank's kernel start, mapped from the end of the waiting rank's wait part
    (the duration rule), so with ranks 0 and 1 on a clock 250 ms ahead of rank 2's the path is the same:
    rank 0 still ends last (on a trace without a wall-clock base, a trace's clock is taken as the wall
    clock), rank 2's segment is on its own clock."""
    db = ingest(tmp_path, late_rank_run({0: 250_000 * US, 1: 250_000 * US}))
    result = critical_path(db, selection=EVERY_STEP, segments=True)
    assert path_of(result, 1) == [(2, "compute", GEMM, 17 * US), (0, "comm_transfer", ALL_REDUCE, 3 * US)]
    first = result.segments.sort("order").row(0, named=True)
    assert (first["start_ns"], first["end_ns"]) == (30 * US, 47 * US)  # rank 2's own clock
    assert first["path_start_ns"] == 250_030 * US  # rank 0's


def test_idle_is_split_host_bound_sync_and_other_on_the_path(tmp_path: Path) -> None:
    """One rank, step 1 [0, 100) us then step 2: gemm [0, 20), gap [20, 60) whose next kernel (a gemm
    [60, 100)) was launched at 45 us, a cudaStreamSynchronize [10, 30) on the host. Gap: [20, 30) sync
    (the island), [30, 45) host-bound (before the launch), [45, 60) other."""
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100 * US)
    t.step(2, 100 * US, 200 * US)
    t.kernel(GEMM, 0, 20 * US, launch_ns=0)
    t.kernel(GEMM, 60 * US, 100 * US, launch_ns=45 * US)
    t.kernel(GEMM, 100 * US, 150 * US, launch_ns=100 * US)
    sync = t._span("cuda_runtime", "cudaStreamSynchronize", 10 * US, 30 * US, None)
    t.events.append(sync)
    db = tmp_path / "one.duckdb"
    assert ingest_traces([t.write(tmp_path / "one" / "rank0.json")], db, threads=1).ok
    result = critical_path(db, selection=StepSelection(skip_steps=0, step_min=1, step_max=1), segments=True)
    assert path_of(result, 1) == [
        (0, "compute", GEMM, 20 * US), (0, "idle_sync", None, 10 * US), (0, "idle_host_bound", None, 15 * US),
        (0, "idle_other", None, 15 * US), (0, "compute", GEMM, 40 * US),
    ]


def test_idle_without_a_launch_is_unknown_on_the_path(tmp_path: Path) -> None:
    """As above, but the gemm ending the gap [20, 60) has no launch event (the other two do): the gap is
    [20, 30) sync (the host's synchronize is evidence) and [30, 60) unknown, never host-bound or other;
    the step's sentence says so. Worked by hand."""
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100 * US)
    t.step(2, 100 * US, 200 * US)
    t.kernel(GEMM, 0, 20 * US, launch_ns=0)
    t.kernel(GEMM, 60 * US, 100 * US)
    t.kernel(GEMM, 100 * US, 150 * US, launch_ns=100 * US)
    t.events.append(t._span("cuda_runtime", "cudaStreamSynchronize", 10 * US, 30 * US, None))
    db = tmp_path / "one.duckdb"
    assert ingest_traces([t.write(tmp_path / "one" / "rank0.json")], db, threads=1).ok
    result = critical_path(db, selection=StepSelection(skip_steps=0, step_min=1, step_max=1), segments=True)
    assert path_of(result, 1) == [
        (0, "compute", GEMM, 20 * US), (0, "idle_sync", None, 10 * US), (0, "idle_unknown", None, 30 * US),
        (0, "compute", GEMM, 40 * US),
    ]
    sentence = result.sentence(1)
    assert "rank 0's idle unknown" in sentence and "idle other" not in sentence and "host bound" not in sentence


@pytest.mark.slow
def test_choices_and_errors(tmp_path: Path) -> None:
    db = ingest(tmp_path, late_rank_run())
    with pytest.raises(EmptySelection, match=r"no step is selected \(steps 7..7, .*run job: steps 1..1"):
        critical_path(db, selection=StepSelection(skip_steps=0, step_min=7, step_max=7, include_last=True))
    with pytest.raises(EmptySelection, match="no run 'nope'"):
        critical_path(db, runs=["nope"])
    with pytest.raises(ConfigError, match="segments were not kept"):
        critical_path(db, selection=EVERY_STEP).segments
    ingest(tmp_path, late_rank_run({1: 5 * US}), name="other")  # other content: not a duplicate
    two = tmp_path / "two.duckdb"
    assert ingest_traces(sorted((tmp_path / "job").glob("*.json")) + sorted((tmp_path / "other").glob("*.json")),
                         two, threads=1).ok
    both = critical_path(two, selection=EVERY_STEP, segments=True)  # every run, each walked on its own
    assert both.steps.select("run", "step").rows() == [("job", 1), ("other", 1)]
    assert both.sentence(1, "other").startswith("step 1 took")
    assert critical_path(two, runs=["other"], selection=EVERY_STEP).steps["run"].to_list() == ["other"]


@pytest.mark.slow
def test_cli_prints_the_steps_the_segments_and_writes_the_page(tmp_path: Path) -> None:
    db = ingest(tmp_path, late_rank_run())
    runner = CliRunner()
    out = runner.invoke(app, ["critical-path", "--db", str(db), "--include-last", "--format", "csv"])
    assert out.exit_code == 0, out.output
    steps = pl.read_csv(out.stdout.encode())
    assert steps.select("step", "span_ms", "last_rank", "jumps", "top_rank").row(0) == (1, 0.02, 0, 1, 2)
    out = runner.invoke(app, ["critical-path", "--db", str(db), "--include-last", "--segments", "--format", "csv"])
    seg = pl.read_csv(out.stdout.encode())
    assert seg.select("rank", "kind", "dur_ns").rows() == [(2, "compute", 17 * US), (0, "comm_transfer", 3 * US)]
    page = tmp_path / "cp.html"
    out = runner.invoke(app, ["critical-path", "--db", str(db), "--include-last", "--html", str(page)])
    assert out.exit_code == 0, out.output
    assert "step 1 took 0.020 ms on rank 0's clock (the last to end): 0.017 ms is rank 2's compute" in out.stderr
    assert f"wrote {page} (step 1)" in out.stderr
    text = page.read_text()
    assert "rank 2" in text and "comm transfer" in text and "step 1 took" in text
    assert not list(tmp_path.glob(".cp.html.*"))  # written whole, no temporary left
    out = runner.invoke(app, ["critical-path", "--db", str(db), "--segments", "--ranks"])
    assert out.exit_code == 1 and "give one of --segments, --ranks and --kernels" in out.stderr


# ------------------------------------------------------------------------------------------ real runs


def _multi_rank_runs(db: Path) -> list[str]:
    with connect(db, read_only=True) as con:
        return [r for (r,) in con.sql(
            "select run from traces inner join steps using (trace_id) group by run having count(distinct rank) > 1 "
            "order by run").fetchall()]


@pytest.mark.slow
def test_the_path_tiles_every_step_of_every_corpus_multi_rank_run(corpus_db: Path) -> None:
    runs = _multi_rank_runs(corpus_db)
    assert "fused_traces" in runs, runs  # the merged 4-rank RCCL file
    for run in runs:
        result = critical_path(corpus_db, runs=[run], selection=EVERY_STEP, segments=True)
        assert_tiles(result)


@pytest.mark.slow
def test_the_merged_rccl_file_path_is_rank_3_the_rank_the_others_wait_for(corpus_db: Path) -> None:
    """merged_all_events: four ranks on one host's clock. Rank 3 arrives last at the collectives (the
    stragglers table says so), so the others' waits lead to it and nearly all of the path is rank 3's."""
    from traceq.report.collectives import stragglers_report

    result = critical_path(corpus_db, runs=["fused_traces"], selection=EVERY_STEP, segments=True)
    ranks = result.ranks()
    assert ranks["rank"][0] == 3 and ranks["share"][0] > 0.9
    table = stragglers_report(corpus_db, runs=["fused_traces"], selection=EVERY_STEP).table
    assert table.sort("wait_caused_us", descending=True)["rank"][0] == 3
    assert set(result.jumps["to_rank"].to_list()) <= {3}
    # RCCL names every collective's kernel ncclDevKernel_Generic: the kernels view keeps AllReduce and
    # Broadcast apart, each the sum of its segments (it had put both under one row, labelled by either)
    comm = result.segments.filter(pl.col("kind").str.starts_with("comm"))
    by_type = {t: d / 1e6 for t, d in comm.group_by("collective_type").agg(pl.col("dur_ns").sum()).rows()}
    assert set(by_type) == {"AllReduce", "Broadcast"}, by_type
    rows = result.kernels(top=None).filter(pl.col("kind").str.starts_with("comm"))
    assert {t: ms for t, ms in rows.select("collective_type", "critical_ms").rows()} == pytest.approx(by_type)


@pytest.mark.slow
def test_a_single_rank_path_is_the_interval_and_idle_breakdown(corpus_db: Path) -> None:
    """On one rank the path never jumps (nothing is matched), so over a step its compute is |U(compute)|,
    its comm transfer the exposed comm, its copies the exposed memcpy and its idle the idle breakdown, as
    sql/interval_breakdown.sql and sql/idle_breakdown.sql compute them (a sweep in SQL, not the walk)."""
    with connect(corpus_db, read_only=True) as con:
        singles = [r for (r,) in con.sql(
            "select run from traces inner join steps using (trace_id) where n_gpu_events > 0 group by run "
            "having count(distinct rank) = 1 order by run").fetchall()]
        params = query_params(EVERY_STEP)
        bind = {"windows": "selected_windows"}
        intervals, idle = (query.statement(con, name, bind) for name in ("interval_breakdown", "idle_breakdown"))
        breakdown = con.sql(
            "select b.trace_id, b.rank, b.device, b.step, b.compute_ns, b.exposed_comm_ns, b.exposed_memcpy_ns, "
            "i.idle_host_bound_ns, i.idle_sync_ns, i.idle_other_ns, i.idle_unknown_ns "
            f"from ({intervals}) as b inner join ({idle}) as i using (trace_id, rank, device, step)",
            params=query.params_of(intervals + idle, params),
        ).pl()
    assert len(singles) >= 10, singles
    checked = 0
    for run in singles:
        result = critical_path(corpus_db, runs=[run], selection=EVERY_STEP, segments=True)
        assert_tiles(result)
        assert result.jumps.height == 0
        for row in result.steps.iter_rows(named=True):
            seg = result.segments.filter(pl.col("step") == row["step"])
            first = seg.sort("order").row(0, named=True)
            expect = breakdown.filter((pl.col("trace_id") == first["trace_id"]) & (pl.col("rank") == first["rank"])
                                      & (pl.col("device") == first["device"]) & (pl.col("step") == row["step"]))
            assert expect.height == 1, (run, row["step"])
            for metric, kinds in BREAKDOWN.items():
                got = int(seg.filter(pl.col("kind").is_in(kinds))["dur_ns"].sum())
                assert got == expect[f"{metric}_ns"][0], (run, row["step"], metric)
            checked += 1
    assert checked >= 50


@pytest.mark.slow
def test_the_path_tiles_the_steps_of_real_gloo_runs(gloo_run, tmp_path: Path) -> None:
    """A real 2-rank gloo job (DDP: all_reduce, FSDP: all_gather / reduce_scatter) on CPU: the path walks
    the CPU spans (device -1) and, where the rank it is on waited at a gloo collective, jumps to the other.
    Whether it ever waits on the path depends on the run's timing (the rank that ends last may also arrive
    last everywhere): the jumps on CPU spans are pinned by the hand-made gloo run above."""
    parallel, run_dir = gloo_run
    db = tmp_path / "gloo.duckdb"
    assert ingest_traces([run_dir], db, threads=1).ok
    result = critical_path(db, selection=EVERY_STEP, segments=True)
    assert_tiles(result)
    assert set(result.segments["device"].to_list()) == {-1}
    assert set(result.segments["rank"].to_list()) <= {0, 1}
    assert all(f != t and {f, t} == {0, 1} for f, t in result.jumps.select("from_rank", "to_rank").rows()), parallel


@pytest.mark.slow
def test_batches_and_dropped_timelines_change_nothing_at_real_density(corpus_db: Path) -> None:
    """A real H200 step holds ~1,250 kernels (h200-ddp) and the merged RCCL file jumps between four ranks:
    one step a batch and one timeline held at a time (every return to a rank reads it again) give the
    paths, jumps and every view that the defaults give."""
    from polars.testing import assert_frame_equal

    for run in ("h200-ddp", "fused_traces"):
        full = critical_path(corpus_db, runs=[run], selection=EVERY_STEP, segments=True)
        small = critical_path(corpus_db, runs=[run], selection=EVERY_STEP, segments=True, batch_rows=1, held_rows=1)
        assert full.steps.height >= 3, run
        assert_frame_equal(full.segments, small.segments)
        for a, b in ((full.steps, small.steps), (full.jumps, small.jumps), (full.ranks(), small.ranks()),
                     (full.kernels(None), small.kernels(None))):
            assert_frame_equal(a, b)
        assert [full.sentence(s) for s in full.steps["step"]] == [small.sentence(s) for s in small.steps["step"]]


@pytest.mark.slow
def test_segments_stream_as_csv_and_json_and_a_table_shows_the_first_screen(corpus_db: Path) -> None:
    """`--segments --format csv/json` writes every segment, batch by batch, the same rows as the API's; as a
    table the first screen, and a note that says how many there are and how to get them all."""
    import json

    expected = critical_path(corpus_db, runs=["h200-ddp"], segments=True).segments.drop("instance_id", "trace_id")
    assert expected.height > 10_000  # ~3,200 a step: a table of them all would be no answer
    runner = CliRunner()
    base = ["critical-path", "--db", str(corpus_db), "--run", "h200-ddp", "--segments"]
    out = runner.invoke(app, [*base, "--format", "csv"])
    assert out.exit_code == 0, out.output
    got = pl.read_csv(out.stdout.encode(), schema=expected.schema)
    assert got.equals(expected)
    out = runner.invoke(app, [*base, "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == json.loads(json.dumps(expected.to_dicts()))
    out = runner.invoke(app, base)
    assert out.exit_code == 0, out.output
    assert f"note: {expected.height:,} segments: the first 40 are shown; --format csv (or json) writes all" in out.stderr
    assert out.stdout.count("h200-ddp") == 40


def test_one_steps_option_selects_as_on_every_command(tmp_path: Path) -> None:
    """--steps is the selection every report takes (--step is gone); a step it does not hold is an error
    that says which steps exist."""
    db = ingest(tmp_path, late_rank_run())
    runner = CliRunner()
    out = runner.invoke(app, ["critical-path", "--db", str(db), "--include-last", "--steps", "1", "--format", "csv"])
    assert out.exit_code == 0, out.output
    assert pl.read_csv(out.stdout.encode())["step"].to_list() == [1]
    out = runner.invoke(app, ["critical-path", "--db", str(db), "--include-last", "--steps", "7:9"])
    assert out.exit_code == 1 and "no step is selected (steps 7..9" in out.stderr and "steps 1..1" in out.stderr
    out = runner.invoke(app, ["critical-path", "--db", str(db), "--step", "1"])
    assert out.exit_code == 2 and "No such option" in out.output


def test_a_rank_whose_activity_is_all_zero_length_walks_as_idle(tmp_path: Path) -> None:
    """Three steps whose kernels all last 0 ns: every window is idle, and its idle segments tile each step
    (a timeline with no piece but edges of zero-length kernels; found by a review: it raised IndexError)."""
    b = TraceBuilder(rank=0)
    for n in range(1, 4):
        h = 100_000 * (n - 1)
        b.step(n, h, h + 100_000)
        b.kernel("ampere_sgemm_128x64_nn", h + 10_000, h + 10_000, launch_ns=h + 1_000)
        b.kernel("vectorized_elementwise_kernel", h + 50_000, h + 50_000, launch_ns=h + 2_000)
    db = tmp_path / "zero.duckdb"
    assert ingest_traces([b.write(tmp_path / "zero" / "rank0.json")], db, threads=1).ok
    result = critical_path(db, selection=EVERY_STEP, segments=True)
    assert result.segments["kind"].str.starts_with("idle").all()
    for step, span_ms in result.steps.select("step", "span_ms").rows():
        seg = result.segments.filter(result.segments["step"] == step)
        assert seg["dur_ns"].sum() == round(span_ms * 1e6)


def test_the_open_last_step_reads_no_more_than_its_batch(tmp_path: Path, monkeypatch) -> None:
    """--include-last: the walk starts at the end of the last activity, after the last start any read holds;
    a piece holds the instant before it, so the read about it tells enough (found by a review: it widened six
    times, then read every step of the rank, whatever held_rows says)."""
    b = TraceBuilder(rank=0)
    for n in range(1, 41):
        h = 100_000 * (n - 1)
        b.step(n, h, h + 100_000)
        for k in range(5):
            b.kernel("ampere_sgemm_128x64_nn", h + 10_000 + 10_000 * k, h + 15_000 + 10_000 * k, launch_ns=h + k)
    db = tmp_path / "long.duckdb"
    assert ingest_traces([b.write(tmp_path / "long" / "rank0.json")], db, threads=1).ok
    reads: list[tuple[int, int, int]] = []
    query = path_walk.Walker._query

    def logged(self, trace_id, lo, hi):
        rows = query(self, trace_id, lo, hi)
        reads.append((lo, hi, rows.height))
        return rows

    monkeypatch.setattr(path_walk.Walker, "_query", logged)
    critical_path(db, selection=StepSelection(skip_steps=0, step_min=40, step_max=40, include_last=True))
    assert not [r for r in reads if r[0] <= -FAR and r[1] >= FAR], reads
    assert len(reads) <= 2, reads


# ------------------------------------------------------------------------------------------ against the reference


def _jumps_of(result, step: int) -> list[tuple]:
    """(from, to, path_ns, name, wait_on_path_ns) of the step's jumps in the order the walk made them (the
    frame holds them in time order: the walk's, reversed)."""
    rows = result.jumps.filter(pl.col("step") == step)
    return [(r["from_rank"], r["to_rank"], r["path_ns"], r["name"], r["wait_on_path_ns"])
            for r in reversed(rows.rows(named=True))]


def _agrees_with_reference(db: Path, files: list[Path], run: str | None = None) -> int:
    """traceq's paths of every step equal the reference's (tests/critical_path_reference.py, written from the
    contract alone): segments (rank, kind, kernel, ns) and jumps; returns the steps compared."""
    from tests import critical_path_reference as reference

    expected = reference.critical_paths(files)
    result = critical_path(db, runs=[run] if run else None, selection=EVERY_STEP, segments=True)
    assert_tiles(result)
    steps = sorted({s["step"] for s in expected["steps"]})
    assert result.steps["step"].to_list() == steps
    for step in steps:
        want = reference.path_tuples(expected, step)
        assert path_of(result, step) == want, step
        ref_jumps = [(f, t, p, n, w) for f, t, p, n, _, w in reference.jump_tuples(expected, step)]
        assert _jumps_of(result, step) == ref_jumps, step
        a = next(s for s in expected["steps"] if s["step"] == step)
        assert result.steps.filter(pl.col("step") == step)["last_rank"][0] == a["rank"]
    return len(steps)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["late_rank", "late_rank_changes", "host_bound", "two_groups", "unmatched_rank",
                                      "cycle", "gloo_cpu_only"])
def test_hand_made_runs_agree_with_the_hand_worked_paths_and_the_reference(tmp_path: Path, scenario: str) -> None:
    """The reference's hand-made runs (a late rank, a late rank that changes from step to step, a host-bound
    rank, collectives on two process groups, a rank whose collectives cannot be matched, waits that point at
    each other, a CPU-only gloo run), each with paths worked out by hand in tests/critical_path_reference.py."""
    from tests import critical_path_reference as reference

    files = reference.scenarios(tmp_path / "traces")[scenario]
    db = tmp_path / "run.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    assert _agrees_with_reference(db, files) == len(reference.STEPS[scenario])
    result = critical_path(db, selection=EVERY_STEP, segments=True)
    for step, path in {**reference.EXPECTED[scenario], **reference.EXPECTED_LAST.get(scenario, {})}.items():
        assert path_of(result, step) == path, (scenario, step)
    for step, jumps in reference.EXPECTED_JUMPS.get(scenario, {}).items():
        assert _jumps_of(result, step) == [(f, t, p, n, w) for f, t, p, n, _, w in jumps], (scenario, step)
    # the default selection leaves each rank's open last step out, and keeps the closed ones
    default = critical_path(db, selection=StepSelection(skip_steps=0))
    assert default.steps["step"].to_list() == reference.STEPS[scenario][:-1] or scenario == "gloo_cpu_only"


@pytest.mark.slow
@pytest.mark.parametrize("files", [["amd_hpctraining/fused_traces/merged_all_events.json.gz"],
                                   ["hta/trace_filter/sampled_rank-0.json.gz", "hta/trace_filter/sampled_rank-1.json.gz"]],
                         ids=["merged 4-rank RCCL", "trace_filter 2 ranks"])
def test_corpus_multi_rank_runs_agree_with_the_reference(tmp_path: Path, files: list[str]) -> None:
    from tests.conftest import corpus_path

    paths = [corpus_path(f) for f in files]
    db = tmp_path / "run.duckdb"
    assert ingest_traces(paths, db, threads=1).ok
    assert _agrees_with_reference(db, paths) >= 2


@pytest.mark.slow
def test_the_perfetto_export_draws_the_path_and_its_jump(tmp_path: Path) -> None:
    """`export --perfetto --critical-path`: a 'critical path' track on each rank the path crosses (rank 2's
    gemm, 17 us, then rank 0's AllReduce transfer, 3 us: the hand-worked path above) and one arrow (a
    flow) from rank 2's segment to rank 0's, as Perfetto's own importer reads the file."""
    pytest.importorskip("perfetto")
    from tests.test_perfetto_export import TRACE_PROCESSOR, perfetto_import

    db = ingest(tmp_path, late_rank_run())
    trace = tmp_path / "run.pftrace"
    out = CliRunner().invoke(app, ["export", "--perfetto", str(trace), "--db", str(db), "--include-last", "--critical-path"])
    assert out.exit_code == 0, out.output
    assert "the critical path of 1 step(s) is on a 'critical path' track" in out.stderr
    imported = perfetto_import(trace)
    assert not imported["problems"]
    path = {proc: [(end - ts, name) for ts, end, name in s] for (proc, track), s in imported["slices"].items()
            if track == "critical path"}
    assert path == {"job rank 2": [(17 * US, GEMM)], "job rank 0": [(3 * US, ALL_REDUCE)]}
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    tp = TraceProcessor(trace=str(trace), config=TraceProcessorConfig(bin_path=str(TRACE_PROCESSOR)))
    try:
        flows = [(r.a, r.b) for r in tp.query("select s1.name as a, s2.name as b from flow as f "
                                               "join slice as s1 on s1.id = f.slice_out join slice as s2 on s2.id = f.slice_in")]
    finally:
        tp.close()
    assert flows == [(GEMM, ALL_REDUCE)]


@pytest.mark.slow
def test_the_html_page_renders_the_path_offline_in_headless_chromium(tmp_path: Path) -> None:
    from tests.test_html_report import CHROMIUM, chromium, pixel_variance, script_errors

    if CHROMIUM is None:
        from tests.conftest import skip_or_fail

        skip_or_fail("headless Chromium is not installed (apt-get install -y chromium; CI installs it)")
    db = ingest(tmp_path, late_rank_run())
    page = tmp_path / "cp.html"
    done = CliRunner().invoke(app, ["critical-path", "--db", str(db), "--include-last", "--html", str(page)])
    assert done.exit_code == 0, done.output
    import re

    assert not re.findall(r"<script[^>]*\bsrc=|<link[^>]*\bhref=", page.read_text())
    dom, log, shot = chromium(page, tmp_path)
    assert not script_errors(log), script_errors(log)
    assert dom.count('class="plot-container plotly"') == 1 and 'id="path"' in dom
    assert "rank 2" in dom and "rank 0" in dom and "compute" in dom and "comm transfer" in dom
    assert pixel_variance(shot) > 100.0


def test_a_rooted_collective_on_one_clock_jumps_at_the_same_instant(tmp_path: Path) -> None:
    """One merged file (one clock), two ranks. Rank 0: gemm [1, 10), Broadcast [10, 12), gemm [30, 60);
    rank 1: gemm [1, 20), Broadcast [20, 25). The Broadcast is placed by start times: rank 1 started last
    (20), so rank 0's whole kernel [10, 12) is waiting. Windows [1, 60) and [1, 25): the walk starts on rank
    0 at 60: gemm 30 us, idle [12, 30) 18 us (its launch at 2 us came long before: other), then the wait at
    12: the jump keeps the instant (one clock; the end of the wait part, 12, is not where rank 1's kernel
    began, 20), and rank 1's gemm runs there back to 1: 11 us. Before the fix the cursor went forward to 20
    and credited rank 1's [9, 20) instead."""
    from tests import critical_path_reference as reference

    bcast = "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    t = TraceBuilder(rank=None)
    for r in (0, 1):
        t.step(1, 0, 100 * US, rank=r)
    t.kernel(GEMM, 1 * US, 10 * US, device=0, rank=0, launch_ns=0)
    t.kernel(bcast, 10 * US, 12 * US, stream=20, device=0, rank=0, launch_ns=1 * US, **collective_args("broadcast", (0, 1)))
    t.kernel(GEMM, 30 * US, 60 * US, device=0, rank=0, launch_ns=2 * US)
    t.kernel(GEMM, 1 * US, 20 * US, device=1, rank=1, launch_ns=0)
    t.kernel(bcast, 20 * US, 25 * US, stream=20, device=1, rank=1, launch_ns=1 * US, **collective_args("broadcast", (0, 1)))
    path = t.write(tmp_path / "job" / "merged.json", distributedInfo={"backend": "nccl", "world_size": 2})
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    result = critical_path(db, selection=EVERY_STEP, segments=True)
    assert path_of(result, 1) == [(1, "compute", GEMM, 11 * US), (0, "idle_other", None, 18 * US),
                                  (0, "compute", GEMM, 30 * US)]
    first = result.segments.sort("order").row(0, named=True)
    assert (first["start_ns"], first["end_ns"], first["path_start_ns"]) == (1 * US, 12 * US, 1 * US)
    assert _jumps_of(result, 1) == [(0, 1, 12 * US, bcast, 2 * US)]
    expected = reference.critical_paths([path])
    assert reference.path_tuples(expected, 1) == path_of(result, 1)
    assert [(f, to, p, n, w) for f, to, p, n, _, w in reference.jump_tuples(expected, 1)] == _jumps_of(result, 1)
