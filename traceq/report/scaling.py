"""Scaling across runs: global tokens/s against world size, the ideal linear line, efficiency,
marginal tokens/s per added GPU, MFU and tokens per joule (docs/explanation/metrics.md).

Per run, over its selected steps: step_time_ms is the mean step time over its rank-steps, and every rate
(global_tokens_per_s, tokens_per_s, tflops, mfu, power_w, tokens_per_j) the ratio of sums over them: total
tokens over total time, not a mean of rates, by the same formula as every other report.
Within each group of runs (``by``: metadata columns such as model or tp; default: all runs), the
smallest run is the base of the ideal line: ideal = base global tokens/s × world_size / base world_size.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from traceq.catalog import META_COLUMNS, columns
from traceq.report.aggregation import mean_of
from traceq.report.metrics import selected_step_rows
from traceq.report.notes import flops_text, peak_text, power_notes, selection_notes
from traceq.report.result import Report
from traceq.report.selection import StepSelection
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

SCALING_NOTES = (
    "ideal_tokens_per_s: the smallest run of the group scaled linearly (its global tokens/s × world_size / its world_size); "
    "efficiency = global_tokens_per_s / ideal_tokens_per_s",
    "marginal_tokens_per_s_per_gpu: (global tokens/s − that of the next smaller world size) / GPUs added",
    "scaling: weak = same tokens per GPU per step as the base run, strong = same global tokens_per_step, mixed = neither",
)


def per_run(rows: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """One row per run from :func:`traceq.report.metrics.step_metrics` rows: run-level throughput, MFU,
    power, each the ratio of sums over the run's rank-steps (:func:`traceq.report.aggregation.mean_of`, the
    formula every report uses); power_w per GPU of the power log."""
    steps = rows.unique(subset=["run", "rank", "step"], keep="first")  # one row per rank-step, not per device
    steps = steps.with_columns((pl.col("power_w") / pl.col("power_gpu_count")).alias("power_w_per_gpu"))
    rates = ("global_tokens_per_s", "tokens_per_s", "tflops", "mfu", "tokens_per_j")
    comm = rows.group_by("run").agg(pl.col("exposed_comm_us").mean().alias("exposed_comm_us"))
    return (
        steps.group_by("run")
        .agg(
            *[pl.col(c).first() for c in ("world_size", "tokens_per_step", "flops_per_step", "peak_tflops",
                                          *[m for m in by if m not in ("world_size", "tokens_per_step")])],
            pl.col("step").n_unique().alias("steps"),
            pl.col("rank").n_unique().alias("ranks"),
            pl.col("step_time_ms").mean(),
            *[mean_of(c).alias(c) for c in rates],
            mean_of("power_w", value="power_w_per_gpu").alias("power_w"),
        )
        .join(comm, on="run", how="left")
    )


def scaling_from_runs(runs: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """Add the ideal line, efficiency, marginal tokens/s per added GPU and the scaling kind per group."""
    group = list(by)
    out = []
    parts = runs.partition_by(group, maintain_order=True) if group else [runs]
    for part in parts:
        part = part.sort("world_size", "run", nulls_last=True)
        known = part.filter(pl.col("world_size").is_not_null() & pl.col("global_tokens_per_s").is_not_null())
        if known.height == 0:
            out.append(part.with_columns(
                pl.lit(None, pl.Float64).alias(c) for c in ("ideal_tokens_per_s", "efficiency", "marginal_tokens_per_s_per_gpu")
            ).with_columns(pl.lit(None, pl.Utf8).alias("scaling")))
            continue
        base_ws = known["world_size"].min()
        base = known.filter(pl.col("world_size") == base_ws)
        base_tps = base["global_tokens_per_s"].mean()
        base_tokens = base["tokens_per_step"][0]
        by_ws = known.group_by("world_size").agg(pl.col("global_tokens_per_s").mean().alias("ws_tps")).sort("world_size")
        prev = by_ws.with_columns(
            pl.col("world_size").shift(1).alias("prev_ws"), pl.col("ws_tps").shift(1).alias("prev_tps")
        ).select("world_size", "prev_ws", "prev_tps")
        part = part.join(prev, on="world_size", how="left").with_columns(
            (pl.lit(base_tps) * pl.col("world_size") / base_ws).alias("ideal_tokens_per_s"),
        ).with_columns(
            (pl.col("global_tokens_per_s") / pl.col("ideal_tokens_per_s")).alias("efficiency"),
            ((pl.col("global_tokens_per_s") - pl.col("prev_tps")) / (pl.col("world_size") - pl.col("prev_ws")))
            .alias("marginal_tokens_per_s_per_gpu"),
            pl.when(pl.col("world_size") == base_ws).then(pl.lit("base"))
            .when(pl.col("tokens_per_step") * base_ws == pl.lit(base_tokens) * pl.col("world_size")).then(pl.lit("weak"))
            .when(pl.col("tokens_per_step") == pl.lit(base_tokens)).then(pl.lit("strong"))
            .otherwise(pl.lit("mixed")).alias("scaling"),
        ).drop("prev_ws", "prev_tps")
        unknown = pl.col("global_tokens_per_s").is_null()  # no tokens_per_step: no place on the curve
        part = part.with_columns(
            *[pl.when(unknown).then(None).otherwise(pl.col(c)).alias(c)
              for c in ("ideal_tokens_per_s", "efficiency", "marginal_tokens_per_s_per_gpu", "scaling")]
        )
        out.append(part)
    columns = [*group, "run", "world_size", "ranks", "steps", "tokens_per_step", "step_time_ms", "global_tokens_per_s",
               "ideal_tokens_per_s", "efficiency", "marginal_tokens_per_s_per_gpu", "tokens_per_s", "tflops", "mfu",
               "power_w", "tokens_per_j", "exposed_comm_us", "scaling"]
    return pl.concat(out, how="diagonal_relaxed").select(columns).sort([*group, "world_size", "run"], nulls_last=True)


def scaling_report(
    db: Warehouse = DEFAULT_DB,
    *,
    by: str | Sequence[str] = (),
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
) -> Report:
    """The scaling table across runs, the notes that explain it, and (``rows``) the step rows it comes from.

    Args:
        db: warehouse path or an open connection.
        by: metadata columns that split runs into separate scaling series (e.g. model, tp).
        selection: which steps of each run.
        runs: only these runs.
    """
    by = columns(by, [c for c in META_COLUMNS if c != "world_size"])
    with opened(db) as con:
        rows = selected_step_rows(con, selection, runs)
        power = power_notes(con, sorted(rows["run"].unique().to_list()))
        left_out = selection_notes(con, selection, runs)
    table = scaling_from_runs(per_run(rows, by), by)
    notes = list(SCALING_NOTES)
    missing = table.filter(pl.col("tokens_per_step").is_null())["run"].to_list()
    if missing:
        notes.append(f"no tokens_per_step for {', '.join(missing)}: set it with `traceq runs set RUN --tokens-per-step N`")
    facts = rows.unique(subset=["run"], keep="first")
    for r in facts.filter(pl.col("run").is_in(table.filter(pl.col("mfu").is_null())["run"].to_list())).sort("run").iter_rows(named=True):
        missing = [flops_text(r)] if r["flops_per_step"] is None or r["world_size"] is None else []
        missing += [peak_text(r)] if r["peak_tflops"] is None else []
        notes.append(f"run {r['run']}: " + "; ".join(missing or ["no step with a step time"]))
    title = f"scaling across {table.height} run(s) ({selection.describe()})"
    return Report(table, [*left_out, *notes, *power], title, rows)
