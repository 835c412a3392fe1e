"""``traceq explain`` (DESIGN §11): findings on hand-made runs whose answer is worked out by hand (a late rank, a
host-bound rank, a run bound by exposed transfer, a compute-bound run), and on every corpus run: each figure of
evidence equals what the command it names prints (run through the CLI, ``--format json``), the figures a finding
carries follow from its evidence, no finding contradicts another, and the order follows the bounds."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_cross_rank import ALL_REDUCE, GEMM, US, collective_args, ingest
from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.report.explain import explain
from traceq.report.metrics import compute_metric
from traceq.report.selection import StepSelection

EVERY_STEP = StepSelection(skip_steps=0, include_last=True)  # the one step of each hand-made run


def _rank(r: int, gemms: list[tuple[int, int, int]], comm: tuple[int, int, int] | None = None,
          ranks: tuple[int, ...] = (0, 1, 2)) -> TraceBuilder:
    """One rank's step 1, [0, 100) us: gemms (start, end, launch) us, and an AllReduce (start, end, launch) us."""
    t = TraceBuilder(rank=r)
    t.step(1, 0, 100 * US)
    for start, end, launch in gemms:
        t.kernel(GEMM, start * US, end * US, launch_ns=launch * US)
    if comm:
        start, end, launch = comm
        t.kernel(ALL_REDUCE, start * US, end * US, stream=20, launch_ns=launch * US, **collective_args(ranks=ranks))
    return t


def late_rank() -> dict[int, TraceBuilder]:
    """Ranks 0 and 1: gemm [10, 30), AllReduce [30, 80). Rank 2: gemm [10, 30), then its next gemm launched late at
    58, run [60, 75) (host-bound idle [30, 58), 28 us), AllReduce [75, 80). Transfer = 5 us; ranks 0 and 1 wait
    45 us, exposed; rank 2 arrives last. Exposed wait per rank-step: (45 + 45 + 0) / 3 = 30 us of a 100 us step."""
    return {0: _rank(0, [(10, 30, 5)], (30, 80, 8)), 1: _rank(1, [(10, 30, 5)], (30, 80, 8)),
            2: _rank(2, [(10, 30, 5), (60, 75, 58)], (75, 80, 59))}


def host_bound_rank() -> dict[int, TraceBuilder]:
    """No communication. Rank 0: gemm [0, 40). Rank 1: gemm [0, 10), the next launched at 48, run [50, 60):
    host-bound [10, 48) = 38 us, other [48, 50) = 2 us; rank 1 ends last, so the path is rank 1's."""
    return {0: _rank(0, [(0, 40, 0)]), 1: _rank(1, [(0, 10, 0), (50, 60, 48)])}


def transfer_bound() -> dict[int, TraceBuilder]:
    """Two ranks arrive together: gemm [0, 20), AllReduce [20, 80) on both: 60 us of transfer, no wait, all of it
    exposed and on the path."""
    return {r: _rank(r, [(0, 20, 0)], (20, 80, 1), ranks=(0, 1)) for r in (0, 1)}


def compute_bound() -> dict[int, TraceBuilder]:
    """Two ranks: gemm [0, 90), an AllReduce [40, 45) beside it (hidden): nothing exposed to say about."""
    return {r: _rank(r, [(0, 90, 0)], (40, 45, 1), ranks=(0, 1)) for r in (0, 1)}


# ---------------------------------------------------------------------------------------------------------------
# what the commands print


def _printed(db: Path, command: str, cache: dict, all_runs: bool) -> list[dict]:
    """The rows ``command`` prints as JSON (over every run where ``all_runs``: one call serves them all)."""
    words = shlex.split(command)[1:]
    if all_runs:
        i = words.index("--run")
        words = words[:i] + words[i + 2:]
    key = tuple(words)
    if key not in cache:
        result = CliRunner().invoke(app, [*words, "--db", str(db), "--format", "json"])
        assert result.exit_code == 0, (command, result.output[-2000:])
        cache[key] = json.loads(result.stdout)
    return cache[key]


def _figure(rows: list[dict], column: str, where: dict, agg: str) -> float:
    picked = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    values = [r[column] for r in picked]
    if agg == "count":
        return len(values)
    if agg == "sum":  # of no row: 0 (the path has no such segment)
        return sum(values)
    assert values, (column, where)
    if agg == "mean":
        return sum(values) / len(values)
    assert len(set(values)) == 1, (column, where, values)  # one row (or one per device of the rank)
    return values[0]


def _ms(row: dict) -> float:
    return row["value"] / 1000 if row["column"].endswith("_us") else row["value"]


def check(db: Path, report, all_runs: bool = False, cache: dict | None = None,
          selection: StepSelection = EVERY_STEP) -> None:
    """Each figure of evidence equals the command's; each finding's figures follow from its evidence (worked
    here apart from the code); no two findings give one figure two values; no part says more than its whole
    (exposed communication of a type or waiting at most the exposed communication, idle of a cause at most the
    idle, `traceq report`'s); the order follows the bounds."""
    cache = {} if cache is None else cache
    evidence = report.rows.to_dicts()
    seen: dict[tuple, float] = {}
    for e in evidence:
        where = json.loads(e["where"])
        printed = _figure(_printed(db, e["command"], cache, all_runs), e["column"], where, e["agg"])
        assert e["value"] == pytest.approx(printed, rel=1e-9, abs=1e-9), e
        key = (e["command"], e["column"], e["where"], e["agg"])
        assert seen.setdefault(key, e["value"]) == e["value"], e  # one figure, one value, in every finding
    table = report.table.to_dicts()
    for i, f in enumerate(table):
        mine = [e for e in evidence if e["finding"] == i]
        amounts = [_ms(e) for e in mine if e["role"] == "amount"]
        if not amounts:
            assert f["ms_per_step"] is None and f["bound_ms"] is None
            continue
        ms = sum(amounts) - sum(_ms(e) for e in mine if e["role"] == "amount_minus")
        for e in mine:
            if e["role"] == "amount_steps":
                ms /= e["value"]
        assert f["ms_per_step"] == pytest.approx(ms, rel=1e-9), f
        assert f["ms_per_step"] >= 0, f
        step = [e["value"] for e in mine if e["role"] == "step_time"]
        if step:
            assert f["pct_of_step"] == pytest.approx(ms / step[0] * 100, rel=1e-9)
            if not any(e["kind"] == "compute" for e in mine):  # kernel time sums streams; the rest is within the step
                assert f["pct_of_step"] <= 100 + 1e-6, f
        if f["bound_ms"] is not None:
            steps = [e["value"] for e in mine if e["role"] == "bound_steps"]
            bounds = [_ms(e) for e in mine if e["role"] == "bound"]
            bounds += [_ms(e) / steps[0] for e in mine if e["role"] == "bound_total"]
            assert f["bound_ms"] == pytest.approx(min(bounds) if bounds else ms, rel=1e-9, abs=1e-12), f
            assert f["bound_ms"] >= 0
    for run in {f["run"] for f in table}:
        mine = [(i, f) for i, f in enumerate(table) if f["run"] == run]
        bounds = [f["bound_ms"] for _, f in mine]
        timed = [b for b in bounds if b is not None]
        assert timed == sorted(timed, reverse=True) and bounds[:len(timed)] == timed, (run, bounds)
        power = [f for _, f in mine if f["finding"].startswith(("Power:", "Power and energy per token"))]
        assert len(power) <= 1, power  # power is known, or what would enable it is said: never both
    wholes = compute_metric(db, "exposed_comm_us,idle_us", by="run", selection=selection).to_dicts()
    wholes = {w["run"]: w for w in wholes}
    idle_parts: dict[str, float] = {}
    for i, f in enumerate(table):
        kinds = {e["kind"] for e in evidence if e["finding"] == i}
        if kinds & {"exposed_comm", "comm_wait"}:
            assert f["ms_per_step"] <= wholes[f["run"]]["exposed_comm_us"] / 1000 * (1 + 1e-9), f
        if any(k.startswith("idle_") for k in kinds):
            idle_parts[f["run"]] = idle_parts.get(f["run"], 0) + f["ms_per_step"]
    for run, ms in idle_parts.items():
        assert ms <= wholes[run]["idle_us"] / 1000 * (1 + 1e-9), run


def _findings(report, kind_prefix: str = "") -> list[dict]:
    return [f for f in report.table.to_dicts() if f["finding"].startswith(kind_prefix)]


# ---------------------------------------------------------------------------------------------------------------
# hand-made runs


@pytest.mark.slow
def test_a_late_rank_is_named_as_the_straggler_the_others_wait_for(tmp_path: Path) -> None:
    db = ingest(tmp_path, late_rank())
    report = explain(db, runs=["job"], selection=EVERY_STEP)
    check(db, report)
    (wait,) = _findings(report, "Waiting for the last rank")
    assert wait["ms_per_step"] == pytest.approx(0.030)  # (45 + 45 + 0) us / 3 rank-steps
    assert wait["pct_of_step"] == pytest.approx(30.0)
    assert "rank 2 arrives last at 100 % of them (1 of 1)" in wait["finding"]
    assert "rank 2's host-bound idle is 0.028 ms a step, the others' at most 0 ms" in wait["finding"]
    (host,) = _findings(report, "Host-bound idle")
    assert "most on rank 2 (0.028 ms)" in host["finding"]
    assert host["ms_per_step"] == pytest.approx(28 / 3 / 1000)


@pytest.mark.slow
def test_a_host_bound_rank_comes_first_with_its_idle_as_bound(tmp_path: Path) -> None:
    db = ingest(tmp_path, host_bound_rank())
    report = explain(db, runs=["job"], selection=EVERY_STEP)
    check(db, report)
    first = report.table.row(0, named=True)
    assert first["finding"].startswith("Host-bound idle") and "most on rank 1 (0.038 ms)" in first["finding"]
    assert first["ms_per_step"] == pytest.approx(0.019)  # (0 + 38) us / 2 rank-steps
    assert first["bound_ms"] == pytest.approx(0.038)  # rank 1's, all of it on the path (rank 1's alone)
    assert not _findings(report, "Exposed") and not _findings(report, "Waiting")


@pytest.mark.slow
def test_a_run_bound_by_exposed_transfer_says_so_first(tmp_path: Path) -> None:
    db = ingest(tmp_path, transfer_bound())
    report = explain(db, runs=["job"], selection=EVERY_STEP)
    check(db, report)
    first = report.table.row(0, named=True)
    assert first["finding"].startswith("Exposed AllReduce costs 0.06 ms a step (60.0 % of the 0.1 ms step)")
    # ncclDevKernel_AllReduce_Sum_f32_RING_LL names no algorithm of its own (NCCL launches it for Ring, NVLS, ...)
    assert "each instance moved data for 60 us" in first["finding"] and "busbw 0.05 GB/s" in first["finding"]
    assert first["bound_ms"] == pytest.approx(0.060)  # the transfer, all of it on the path
    assert not _findings(report, "Waiting")  # they arrive together: nobody waits


@pytest.mark.slow
def test_a_compute_bound_run_has_nothing_to_say_about_communication(tmp_path: Path) -> None:
    db = ingest(tmp_path, compute_bound())
    report = explain(db, runs=["job"], selection=EVERY_STEP)
    check(db, report)
    first = report.table.row(0, named=True)
    assert first["finding"].startswith("gemm kernels run 0.09 ms a step (90.0 % of the 0.1 ms step)")
    assert not _findings(report, "Exposed") and not _findings(report, "Waiting")
    assert not any("AllReduce" in f for f in report.table["finding"].to_list())
    assert any(f.startswith("Power and energy per token: no power figures") for f in report.table["finding"].to_list())


@pytest.mark.slow
def test_step_time_variation_names_the_outlier_step(tmp_path: Path) -> None:
    """One rank, steps of 100, 100, 200 and 100 us: median 100, mean 125, p90 170 (linear); step 3 is an
    outlier (> 1.2 x the median), and the finding's time is the mean's excess over the median, 25 us."""
    t = TraceBuilder(rank=0)
    for n, (lo, hi) in enumerate([(0, 100), (100, 200), (200, 400), (400, 500)], 1):
        t.step(n, lo * US, hi * US)
        t.kernel(GEMM, (lo + 5) * US, (hi - 5) * US, launch_ns=(lo + 1) * US)
    db = ingest(tmp_path, {0: t})
    report = explain(db, runs=["job"], selection=EVERY_STEP)
    check(db, report)
    (varies,) = _findings(report, "Step time varies")
    assert varies["ms_per_step"] == pytest.approx(0.025) and varies["bound_ms"] == pytest.approx(0.025)
    assert "median of 0.1 ms" in varies["finding"] and "p90 0.17 ms" in varies["finding"]
    assert "outliers: step 3 0.2 ms" in varies["finding"]
    assert "--steps 3:3" in varies["next"]


@pytest.mark.slow
def test_cli_lists_the_findings_and_writes_the_page(tmp_path: Path) -> None:
    db = ingest(tmp_path, late_rank())
    page = tmp_path / "why.html"
    result = CliRunner().invoke(app, ["explain", "--run", "job", "--db", str(db), "--skip-steps", "0",
                                      "--include-last", "--html", str(page)])
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())  # the lines are wrapped to the terminal
    assert out.startswith("1. Waiting for the last rank") and "rank 2 arrives last" in out and "next: traceq " in out
    text = page.read_text()
    assert "Why the step is slow" in text and "rank 2 arrives last" in text
    as_json = CliRunner().invoke(app, ["explain", "--run", "job", "--db", str(db), "--skip-steps", "0",
                                       "--include-last", "--format", "json"])
    rows = json.loads(as_json.stdout)
    assert [r["finding"] for r in rows] == explain(db, runs=["job"], selection=EVERY_STEP).table["finding"].to_list()
    bad = CliRunner().invoke(app, ["explain", "--run", "nope", "--db", str(db)])
    assert bad.exit_code == 1 and "no run 'nope'" in bad.output


def test_the_api_is_lazy_and_takes_runs_and_selection(tmp_path: Path) -> None:
    import traceq

    db = ingest(tmp_path, transfer_bound())
    report = traceq.explain(db, runs=["job"], selection=EVERY_STEP)
    assert isinstance(report, traceq.Report) and report.table.columns == [
        "run", "finding", "ms_per_step", "pct_of_step", "bound_ms", "evidence", "next"]


# ---------------------------------------------------------------------------------------------------------------
# the corpus


@pytest.mark.slow
def test_every_corpus_finding_equals_the_figures_other_commands_print(corpus_db: Path) -> None:
    report = explain(corpus_db)
    assert report.table.height > 0 and report.table["run"].n_unique() > 10
    check(corpus_db, report, all_runs=True, selection=StepSelection())


@pytest.mark.slow
def test_the_demo_runs_findings_follow_from_their_evidence(demo_run: Path, tmp_path: Path) -> None:
    """The tutorial's real two-rank training run (gloo, the ranks taking turns at arriving last): its
    findings follow from their evidence as the corpus's do."""
    db = tmp_path / "demo.duckdb"
    assert ingest_traces([demo_run / "examples" / "out" / "demo-ddp"], db).ok
    check(db, explain(db), selection=StepSelection())
