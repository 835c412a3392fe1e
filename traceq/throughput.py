"""Throughput, FLOPs and power: the conventions behind them and the notes printed beside the numbers.

The numbers themselves come from ``sql/step_throughput.sql`` and ``sql/step_power.sql`` (see
:func:`traceq.metrics.step_metrics`). This module says what they assume, per run, so a report never
shows an MFU without its FLOPs convention and peak, or a blank power column without saying why.
It also fetches the power time series and step windows that the HTML report plots.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

from traceq.catalog import WHOLE_TRACE_STEP, gpu_peaks
from traceq.warehouse import to_polars

FLOPS_CONVENTION = (
    "FLOPs per token = 6·N + 12·L·H·Q·T (PaLM appendix B; N non-embedding parameters, L layers, H heads, "
    "Q head dim, T sequence length) × tokens_per_step, unless the run sets model_flops_per_token or "
    "flops_per_step (`traceq runs set RUN --model-flops-per-token F` / `--flops-per-step F`)"
)
PEAK_NOTE = "peak = dense BF16 TFLOP/s of one GPU (V100: FP16): {table}; override with `traceq runs set RUN --peak-tflops P`"
NVML_NOTE = (
    "NVML power is a ~1 s moving average on A100/H100 and the sensor samples only part of the time: "
    "steps much shorter than 1 s smear into their neighbours; energy from the NVML energy counter is the better source"
)
TOKENS_METRICS = ("tokens_per_s", "global_tokens_per_s", "tflops", "mfu", "tokens_per_j")
FLOPS_METRICS = ("tflops", "mfu")
POWER_METRICS = ("power_w", "energy_j", "tokens_per_j")


def peak_table_text() -> str:
    """The peak table as one line: 'GB300 2500, ..., H100 SXM 989, ...' (sql/gpu_peaks.csv)."""
    return ", ".join(f"{p.gpu} {p.peak_tflops:g}" for p in gpu_peaks())


def metric_notes(con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, metric: str, window: str = "steps") -> list[str]:
    """Lines to print beside ``metric`` computed from ``rows`` (step rows of one report)."""
    from traceq.metrics import BREAKDOWN_NOTE, BREAKDOWNS

    notes: list[str] = []
    if window == "steps" and rows.height and "step" in rows.columns:
        notes.extend(steps_used(rows))
    if metric in BREAKDOWNS:
        notes.append(BREAKDOWN_NOTE)
    runs = _run_facts(rows)
    if metric in TOKENS_METRICS:
        for run in runs.filter(pl.col("tokens_per_step").is_null())["run"].to_list():
            notes.append(f"run {run}: tokens_per_step unknown, so {metric} is empty; "
                         f"set it: traceq runs set {run} --tokens-per-step N")
    if metric in FLOPS_METRICS:
        notes.append(FLOPS_CONVENTION)
        notes.append(PEAK_NOTE.format(table=peak_table_text()))
        for r in runs.iter_rows(named=True):
            flops = (f"{r['flops_per_step']:.4g} FLOPs/step ({r['flops_source']})" if r["flops_per_step"] is not None
                     else f"model FLOPs unknown (set --model-flops-per-token or the model dimensions: traceq runs set {r['run']} ...)")
            if r["peak_tflops"] is not None:
                named = f", {r['peak_gpu']} for {r['gpu']!r}" if r["peak_source"] == "table" else (f", {r['gpu']}" if r["gpu"] else "")
                peak = f"peak {r['peak_tflops']:g} TFLOP/s ({r['peak_source']}{named})"
            elif r["gpu"]:
                peak = (f"GPU {r['gpu']!r} is not in the peak table, so mfu is empty; set its dense BF16 peak: "
                        f"traceq runs set {r['run']} --peak-tflops P")
            else:
                peak = f"GPU unknown, so mfu is empty: traceq runs set {r['run']} --gpu NAME (or --peak-tflops P)"
            notes.append(f"run {r['run']}: {flops}; {peak}")
    if metric in POWER_METRICS:
        notes.extend(power_notes(con, runs["run"].to_list()))
    return notes


def steps_used(rows: pl.DataFrame) -> list[str]:
    """'steps used: run r: steps a..b, n rank-steps over k rank(s)' for every run in ``rows`` with steps
    (ranks without steps, step -1, are named by :func:`traceq.metrics.step_window_notes`)."""
    steps = rows.select("run", "rank", "step").unique().filter(pl.col("step") != WHOLE_TRACE_STEP)
    out = []
    for r in (
        steps.group_by("run")
        .agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"),
             pl.col("rank").n_unique().alias("ranks"), pl.len().alias("n"))
        .sort("run")
        .iter_rows(named=True)
    ):
        out.append(f"steps used: run {r['run']}: steps {r['lo']}..{r['hi']}, {r['n']} rank-steps over {r['ranks']} rank(s)")
    return out


def power_notes(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> list[str]:
    """Per run: where its power numbers come from, or why there are none ("unavailable")."""
    logs = to_polars(con.sql(
        """
        select t.run, p.source, any_value(p.reason) as reason, count(*) as logs, sum(p.n_samples) as samples,
               sum(p.n_energy) as energy_reads
        from power_logs as p inner join traces as t using (trace_id)
        group by all order by all
        """
    ))
    notes = []
    for run in sorted(set(runs)):
        mine = logs.filter(pl.col("run") == run)
        if mine.height == 0:
            notes.append(f"run {run}: power unavailable: no power log was ingested (record with traceq.collectors)")
            continue
        for r in mine.iter_rows(named=True):
            if r["source"] == "nvml":
                notes.append(f"run {run}: power from NVML ({r['logs']} log(s), {r['samples']} samples, "
                             f"{r['energy_reads']} energy counter reads)")
            else:
                notes.append(f"run {run}: power unavailable ({r['reason'] or 'the log says NVML was absent'}); "
                             "power_w, energy_j and tokens_per_j are empty, not zero")
    if any(logs.filter(pl.col("run").is_in(list(runs)) & (pl.col("source") == "nvml")).rows()):
        notes.append(NVML_NOTE)
    return notes


def _run_facts(rows: pl.DataFrame) -> pl.DataFrame:
    cols = ["run", "tokens_per_step", "flops_per_step", "flops_source", "peak_tflops", "peak_source", "peak_gpu", "gpu"]
    present = [c for c in cols if c in rows.columns]
    facts = rows.select(present).unique(subset=["run"], keep="first").sort("run")
    return facts.with_columns(*[pl.lit(None).alias(c) for c in cols if c not in present])


def power_series(con: duckdb.DuckDBPyConnection, runs: Sequence[str] | None = None) -> pl.DataFrame:
    """NVML power samples: run, rank, gpu, wall_ns, power_w (one row per sample, time order)."""
    frame = to_polars(con.sql(
        """
        select t.run, p.rank, p.gpu, p.wall_ns, p.power_w
        from power_samples as p inner join traces as t using (trace_id)
        where p.kind = 'power' and p.power_w is not null
        order by t.run, p.rank, p.gpu, p.wall_ns
        """
    ))
    return frame.filter(pl.col("run").is_in(list(runs))) if runs else frame


def step_wall_windows(con: duckdb.DuckDBPyConnection, runs: Sequence[str] | None = None) -> pl.DataFrame:
    """Wall-clock step windows: run, rank, step, start_wall_ns, end_wall_ns, offset_source."""
    frame = to_polars(con.sql(
        """
        select t.run, w.rank, w.step, w.start_wall_ns, w.end_wall_ns, w.offset_source
        from step_windows as w inner join traces as t using (trace_id)
        order by t.run, w.rank, w.step
        """
    ))
    return frame.filter(pl.col("run").is_in(list(runs))) if runs else frame


def power_status(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per run: power source (nvml | unavailable | none) and the reason when unavailable."""
    return to_polars(con.sql(
        """
        select r.run, coalesce(any_value(p.source), 'none') as source, any_value(p.reason) as reason
        from runs as r
        left join traces as t on t.run = r.run
        left join power_logs as p on p.trace_id = t.trace_id
        group by r.run order by r.run
        """
    ))
