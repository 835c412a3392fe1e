"""One aggregation for a row (DESIGN §5): a rank's row pools its steps, a run's row its rank-steps (a rank
cut short weighs by the steps it has), a group's row its runs; a ratio on a row is the ratio of that row's
own numerator and denominator, and `summary` agrees with `report`. On a hand-made run whose ranks keep
different numbers of steps, worked out by hand, and on every corpus run."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.tracegen import TraceBuilder
from traceq.catalog import RATE_NUMERATORS, RATE_WEIGHTS
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.report.metrics import compute_metric, metric_report
from traceq.report.selection import StepSelection
from traceq.report.summary import summary

US = 1_000
EVERY = StepSelection(skip_steps=0, include_last=True)
# summary's <part>_ms against report's <part>_us, and the figures both give as they are
SHARED_MS = ("compute", "overlapped_comm", "exposed_comm", "exposed_memcpy", "idle")
SHARED_AS_IS = ("step_time_ms", "tokens_per_s", "mfu", "power_w")

# (comm start, comm end) in us after each CPU step's start, per rank: rank 0 keeps 4 steps, rank 1 only 2
CUT = {0: [(30, 60), (40, 80), (20, 40), (50, 60)], 1: [(10, 90), (50, 90)]}


def cut_rank(path: Path, rank: int) -> Path:
    """CPU step n is [100 (n - 1), 100 n) us; each launches a GEMM running [10, 50) us into the step and an
    all-reduce on another stream at CUT[rank][n - 1]."""
    t = TraceBuilder(rank=rank)
    for n, (start, end) in enumerate(CUT[rank], 1):
        s = (n - 1) * 100
        t.step(n, s * US, (s + 100) * US)
        t.kernel("ampere_sgemm_128x64_tn", (s + 10) * US, (s + 50) * US, launch_ns=(s + 5) * US)
        t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", (s + start) * US, (s + end) * US, stream=20,
                 launch_ns=(s + 6) * US)
    return t.write(path)


@pytest.fixture
def cut_db(tmp_path: Path) -> Path:
    db = tmp_path / "w.duckdb"
    files = [cut_rank(tmp_path / "cut" / f"rank{r}.json", r) for r in CUT]
    assert ingest_traces(files, db, threads=1).ok
    return db


def test_a_run_whose_ranks_keep_different_step_counts_pools_its_rank_steps(cut_db: Path) -> None:
    """Each step: compute [10, 50) us; comm, overlapped (comm within compute), exposed (comm outside it):

    rank 0: step 1 comm [30, 60) = 30, overlapped 20, exposed 10; step 2 [40, 80) = 40, 10, 30;
            step 3 [20, 40) = 20, 20, 0; step 4 [50, 60) = 10, 0, 10.
            Σ comm 100, Σ overlapped 50, Σ exposed 50: means 25, 12.5, 12.5; overlap_ratio 50/100 = 0.5.
    rank 1: step 1 comm [10, 90) = 80, 40, 40; step 2 [50, 90) = 40, 0, 40.
            Σ 120, 40, 80: means 60, 20, 40; overlap_ratio 40/120 = 1/3.
    run (6 rank-steps pooled): comm 220/6 = 36.667, overlapped 90/6 = 15, exposed 130/6 = 21.667,
            overlap_ratio 90/220 = 0.40909; 0.40909 × 36.667 = 15 = overlapped.
    The mean of the per-rank means would give comm 42.5, overlapped 16.25, exposed 26.25, and
    0.40909 × 42.5 = 17.39, not 16.25: the row contradicted itself."""
    names = "exposed_comm,comm,overlapped_comm,overlap_ratio"
    ranks = compute_metric(cut_db, names, by="run,rank", selection=EVERY)
    assert ranks.select("rank", "steps", "comm_us", "overlapped_comm_us", "exposed_comm_us").rows() == [
        (0, 4, 25.0, 12.5, 12.5), (1, 2, 60.0, 20.0, 40.0)]
    assert ranks["overlap_ratio"].to_list() == [pytest.approx(0.5), pytest.approx(1 / 3)]

    done = CliRunner().invoke(app, ["report", "--db", str(cut_db), "--metric", names, "--by", "run",
                                    "--skip-steps", "0", "--include-last", "--format", "csv"])
    assert done.exit_code == 0, done.output
    (row,) = list(csv.DictReader(io.StringIO(done.stdout)))
    assert (row["run"], row["ranks"]) == ("cut", "2")
    got = {k: float(row[k]) for k in ("comm_us", "overlapped_comm_us", "exposed_comm_us", "overlap_ratio")}
    assert got == {"comm_us": pytest.approx(220 / 6), "overlapped_comm_us": pytest.approx(15.0),
                   "exposed_comm_us": pytest.approx(130 / 6), "overlap_ratio": pytest.approx(90 / 220)}
    assert got["overlap_ratio"] * got["comm_us"] == pytest.approx(got["overlapped_comm_us"], abs=1e-3)
    # min and max still describe the ranks' rows
    assert (float(row["comm_us_min"]), float(row["comm_us_max"])) == (25.0, 60.0)

    # summary --by run: the same figures
    report = compute_metric(cut_db, "step_time,compute,overlapped_comm,exposed_comm,exposed_memcpy,idle",
                            by="run", selection=EVERY)
    table = summary(cut_db, by="run", selection=EVERY).table
    assert table["steps"].to_list() == [6]
    assert_agree(report, table, ["run"])
    assert table["overlapped_comm_ms"][0] == pytest.approx(0.015)
    assert table["exposed_comm_ms"][0] == pytest.approx(130 / 6 / 1000)


def assert_agree(report: pl.DataFrame, table: pl.DataFrame, keys: list[str]) -> None:
    """Every figure ``summary`` (``table``) and ``report`` share is the same on every row of ``keys``."""
    pairs = [(f"{p}_us", f"{p}_ms", 1000) for p in SHARED_MS] + [(c, c, 1) for c in SHARED_AS_IS]
    pairs = [(mine, theirs, scale) for mine, theirs, scale in pairs if mine in report.columns]
    assert pairs
    summed = table.select(*keys, *(pl.col(theirs).alias(f"summary {theirs}") for _, theirs, _ in pairs))
    both = report.select(*keys, *(mine for mine, _, _ in pairs)).join(summed, on=keys, how="full", nulls_equal=True,
                                                                     coalesce=True)
    assert both.height == report.height == table.height
    for r in both.iter_rows(named=True):
        for mine, theirs, scale in pairs:
            other = r[f"summary {theirs}"]
            assert (other is None) == (r[mine] is None), (mine, r)
            if other is not None:
                assert other * scale == pytest.approx(r[mine], rel=1e-9, abs=1e-9), (mine, r)


# --- every corpus run


@pytest.mark.slow
@pytest.mark.parametrize("selection", [StepSelection(), EVERY], ids=["default", "every-step"])
@pytest.mark.parametrize("by", ["run", "run,rank"])
def test_summary_and_report_agree_on_every_corpus_run(corpus_db: Path, by: str, selection: StepSelection) -> None:
    """With every step kept, fused_traces' rank 0 keeps 3 steps and ranks 1-3 keep 2."""
    names = "step_time,compute,overlapped_comm,exposed_comm,exposed_memcpy,idle,tokens_per_s,mfu,power_w"
    report = compute_metric(corpus_db, names, by=by, selection=selection)
    table = summary(corpus_db, by=by, selection=selection).table
    assert report.height >= 20
    assert_agree(report, table, by.split(","))


def numerator(metric: str) -> pl.Expr:
    """A rate's numerator per step row: its own column, else value × denominator (0 where the
    denominator is 0: a ratio over nothing has nothing above it)."""
    weight = pl.col(RATE_WEIGHTS[metric]).cast(pl.Float64)
    if metric in RATE_NUMERATORS:
        return pl.col(RATE_NUMERATORS[metric]).cast(pl.Float64)
    return pl.when(weight == 0).then(0.0).otherwise(pl.col(metric) * weight)


def row_means(rows: pl.DataFrame, columns: list[str], by: list[str]) -> pl.DataFrame:
    """The plain mean of ``columns`` on each row of ``by``, written apart from traceq: over a rank's steps,
    over a run's rank-steps, or over a group's runs (the mean of each run's mean)."""
    if "rank" in by:
        return rows.group_by(list(dict.fromkeys(["run", *by]))).agg(pl.col(columns).mean())
    if "run" in by:
        return rows.group_by(by).agg(pl.col(columns).mean())
    runs = rows.group_by(["run", *by]).agg(pl.col(columns).mean())
    return runs.group_by(by).agg(pl.col(columns).mean())


@pytest.mark.slow
@pytest.mark.parametrize("by", ["run,rank", "run", "world_size", "gpu_model"])
@pytest.mark.parametrize("metric", sorted(RATE_WEIGHTS))
def test_every_rate_times_its_denominator_is_its_numerator_on_every_corpus_row(
    corpus_db: Path, metric: str, by: str
) -> None:
    grain = by.split(",")
    report = metric_report(corpus_db, metric, by=by, selection=EVERY)
    weight = RATE_WEIGHTS[metric]
    # where a step's rate or numerator is unknown, so is the part of its denominator the rate stands for
    parts = report.rows.with_columns(numerator(metric).alias("_num"), pl.col(weight).cast(pl.Float64).alias("_den"))
    parts = parts.with_columns(pl.when(pl.col("_num").is_not_null()).then(pl.col("_den")).alias("_den"),
                               pl.when(pl.col("_den").is_not_null()).then(pl.col("_num")).alias("_num"))
    means = row_means(parts, ["_num", "_den"], grain)
    keys = [c for c in dict.fromkeys(["run", *grain]) if c in report.table.columns and c in means.columns]
    rows = report.table.join(means, on=keys, how="left", nulls_equal=True)
    assert rows.height == report.table.height
    valued = rows.filter(pl.col(metric).is_not_null())
    assert valued.height >= 1
    for r in valued.iter_rows(named=True):
        assert r[metric] * r["_den"] == pytest.approx(r["_num"], rel=1e-9, abs=1e-9), r
    if metric == "overlap_ratio":  # the same with the figures on the row itself
        shown = compute_metric(corpus_db, "overlap_ratio,comm,overlapped_comm", by=by, selection=EVERY)
        shown = shown.filter(pl.col("comm_us") > 0)
        assert shown.height >= 3
        for r in shown.iter_rows(named=True):
            assert r["overlap_ratio"] * r["comm_us"] == pytest.approx(r["overlapped_comm_us"], rel=1e-6, abs=1e-3), r
