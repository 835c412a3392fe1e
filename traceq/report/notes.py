"""Throughput, FLOPs and power: the conventions behind them and the notes printed beside the numbers.

The numbers themselves come from ``sql/step_throughput.sql`` and ``sql/step_power.sql`` (see
:func:`traceq.report.metrics.step_metrics`). This module says what they assume, per run, so a report never
shows an MFU without its FLOPs convention and peak, or a blank power column without saying why.
It also fetches the power time series and step windows that the HTML report plots.
"""

from __future__ import annotations

from collections.abc import Sequence

from typing import TYPE_CHECKING

import duckdb

from traceq import query
from traceq.catalog import BREAKDOWN_NOTE, BREAKDOWNS, WHOLE_TRACE_STEP
from traceq.peaks import gpu_peaks
from traceq.report.result import RunNote
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars

if TYPE_CHECKING:  # imported where used: a report's polars loads in the background (traceq.store.frames)
    import polars as pl

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
NO_MARKER_KIND = ("no step marker: reported over the whole trace as one window (step -1), whose span is not a step "
                  "time (no slowest rank is named from it); name the steps with `traceq ingest --step-marker REGEX`")
NO_LAUNCH_KIND = ("no launch event in the trace to tell why the device waited: all of its idle is idle_unknown, "
                  "never host-bound or other (`traceq report --metric idle_unknown`)")
FLOPS_PEAK_KIND = "model FLOPs per step and GPU peak behind tflops and mfu (a run that lacks one has them empty)"
TOKENS_METRICS = ("tokens_per_s", "global_tokens_per_s", "tflops", "mfu", "tokens_per_j")
FLOPS_METRICS = ("tflops", "mfu")
POWER_METRICS = ("power_w", "energy_j", "tokens_per_j")


def peak_table_text() -> str:
    """The peak table as one line: 'GB300 2500, ..., H100 SXM 989, ...' (sql/gpu_peaks.csv)."""
    return ", ".join(f"{p.gpu} {p.peak_tflops:g}" for p in gpu_peaks())


def metric_notes(con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, metric: str, whole_trace: bool = False) -> list[str]:
    """Lines to print beside ``metric`` computed from ``rows`` (step rows of one report)."""
    import polars as pl

    notes: list[str] = []
    if not whole_trace and rows.height and "step" in rows.columns:
        notes.extend(steps_used(rows))
    if metric in BREAKDOWNS:
        notes.append(BREAKDOWN_NOTE)
    runs = _run_facts(rows)
    if metric in TOKENS_METRICS and metric not in FLOPS_METRICS:
        for run in runs.filter(pl.col("tokens_per_step").is_null())["run"].to_list():
            notes.append(RunNote(f"tokens_per_step unknown, so {metric} is empty; set it: traceq runs set RUN "
                                 "--tokens-per-step N", f"run {run}",
                                 f"run {run}: tokens_per_step unknown, so {metric} is empty; "
                                 f"set it: traceq runs set {run} --tokens-per-step N"))
    if metric in FLOPS_METRICS:
        notes.append(f"{FLOPS_CONVENTION}; {PEAK_NOTE.format(table=peak_table_text())}")  # the conventions, one line
        for r in runs.iter_rows(named=True):
            notes.append(RunNote(FLOPS_PEAK_KIND, f"run {r['run']}: {flops_text(r)}; {peak_text(r)}",
                                 f"run {r['run']}: {flops_text(r)}; {peak_text(r)}"))
    if metric in POWER_METRICS:
        notes.extend(power_notes(con, runs["run"].to_list()))
        notes.extend(energy_notes(rows))
    return notes


def energy_notes(rows: pl.DataFrame) -> list[str]:
    """Per run with energy figures: how many steps' energy_j came from the NVML energy counter and how
    many from power × time, and how often the counter moved (it ticks coarsely: a short step may see none)."""
    import polars as pl

    if "energy_source" not in rows.columns:
        return []
    steps = rows.filter(pl.col("energy_source").is_not_null()).unique(subset=["run", "rank", "step"])
    notes = []
    for (run,), part in steps.sort("run").group_by("run", maintain_order=True):
        counter = part.filter(pl.col("energy_source") == "energy counter")
        moved = counter.filter(pl.col("energy_j") > 0).height
        line = f"run {run}: energy_j from the NVML energy counter on {counter.height} of {part.height} steps"
        if part.height > counter.height:
            line += f", from power_w × the step's time on {part.height - counter.height}"
        if moved < counter.height:
            line += (f"; the counter moved on {moved} of them: it ticks coarsely (about every 100 ms on H100/H200), "
                     "so one step's energy means little alone; a run's tokens_per_j is Σ tokens / Σ energy")
        notes.append(RunNote("where energy_j comes from", line, line))
    return notes


def steps_used(rows: pl.DataFrame) -> list[str]:
    """'steps used: run r: steps a..b, n rank-steps over k rank(s)' for every run in ``rows`` with steps
    (ranks without steps, step -1, are named by :func:`traceq.report.notes.step_window_notes`)."""
    import polars as pl

    steps = rows.select("run", "rank", "step").unique().filter(pl.col("step") != WHOLE_TRACE_STEP)
    out = []
    for r in (
        steps.group_by("run")
        .agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"),
             pl.col("rank").n_unique().alias("ranks"), pl.len().alias("n"))
        .sort("run")
        .iter_rows(named=True)
    ):
        out.append(RunNote("steps used", f"run {r['run']}: steps {r['lo']}..{r['hi']}, {r['n']} rank-steps over "
                                          f"{r['ranks']} rank(s)",
                           f"steps used: run {r['run']}: steps {r['lo']}..{r['hi']}, {r['n']} rank-steps over {r['ranks']} rank(s)"))
    return out


def power_notes(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> list[str]:
    """Per run: where its power numbers come from, or why there are none ("unavailable")."""
    import polars as pl

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
            notes.append(RunNote("power unavailable: no power log was ingested (record with traceq.collectors)",
                                 f"run {run}"))
            continue
        for r in mine.iter_rows(named=True):
            if r["source"] == "nvml":
                detail = (f"run {run} ({r['logs']} log(s), {r['samples']} samples, {r['energy_reads']} energy "
                          "counter reads)")
                notes.append(RunNote("power from NVML", detail, f"run {run}: power from NVML {detail[len(run) + 5:]}"))
            else:
                why = r["reason"] or "the log says NVML was absent"
                notes.append(RunNote("power unavailable: power_w, energy_j and tokens_per_j are empty, not zero",
                                     f"run {run} ({why})", f"run {run}: power unavailable ({why}); "
                                     "power_w, energy_j and tokens_per_j are empty, not zero"))
    if any(logs.filter(pl.col("run").is_in(list(runs)) & (pl.col("source") == "nvml")).rows()):
        notes.append(NVML_NOTE)
    return notes


def flops_text(r: dict) -> str:
    """A run's FLOPs per step and where they come from, or the input that is missing (``r``: a row with
    flops_per_step, flops_source, tokens_per_step, world_size and run)."""
    run = r["run"]
    if r["flops_per_step"] is None:
        return (f"model FLOPs unknown, so tflops and mfu are empty: traceq runs set {run} --flops-per-step F "
                "(or --model-flops-per-token F or the model dimensions, with --tokens-per-step N)")
    text = f"{r['flops_per_step']:.4g} FLOPs/step ({r['flops_source']})"
    if r.get("world_size") is None:
        text += f", world size unknown, so tflops and mfu are empty: traceq runs set {run} --world-size N"
    return text


def peak_text(r: dict) -> str:
    """A run's peak and where it comes from, or the input that is missing."""
    if r["peak_tflops"] is not None:
        named = (f", {r['peak_gpu']} for {r['gpu_model']!r}" if r["peak_tflops_source"] == "table"
                 else (f", {r['gpu_model']}" if r["gpu_model"] else ""))
        return f"peak {r['peak_tflops']:g} TFLOP/s ({r['peak_tflops_source']}{named})"
    if r["gpu_model"]:
        return (f"GPU {r['gpu_model']!r} is not in the peak table, so mfu is empty; set its dense BF16 peak: "
                f"traceq runs set {r['run']} --peak-tflops P")
    return f"GPU unknown, so mfu is empty: traceq runs set {r['run']} --gpu-model NAME (or --peak-tflops P)"


def _run_facts(rows: pl.DataFrame) -> pl.DataFrame:
    import polars as pl

    cols = ["run", "world_size", "tokens_per_step", "flops_per_step", "flops_source", "peak_tflops", "peak_tflops_source", "peak_gpu", "gpu_model"]
    present = [c for c in cols if c in rows.columns]
    facts = rows.select(present).unique(subset=["run"], keep="first").sort("run")
    return facts.with_columns(*[pl.lit(None).alias(c) for c in cols if c not in present])


def step_window_notes(con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, selection: StepSelection) -> list[str]:
    """Notes on the step windows behind ``rows`` (step rows of a report): ranks reported over their whole
    trace, device activity outside every step window, ranks whose trace has no launch event (their idle is
    all unknown), devices with communication and no compute."""
    import polars as pl

    notes = []
    runs = rows["run"].unique().to_list()
    whole = rows.filter(pl.col("step") == WHOLE_TRACE_STEP).group_by("run").agg(pl.col("rank").unique().sort())
    for run, ranks in whole.sort("run").iter_rows():
        notes.append(RunNote(NO_MARKER_KIND, f"run {run} rank {', '.join(map(str, ranks))}",
                             f"run {run}: rank {', '.join(map(str, ranks))} has no step marker: reported over its "
                             "whole trace as one window (step -1), whose span is not a step time, so no slowest rank "
                             "is named from it; name its steps with `traceq ingest --step-marker REGEX`"))
    outside = (query.run(con, "outside_steps", query_params(selection, runs))
               .join(con.table("traces").select("trace_id, run"), "trace_id")
               .filter("n_before + n_after > 0").order("run, rank, device"))
    for r in to_polars(outside).iter_rows(named=True):
        where = "CPU" if r["device"] < 0 else f"device {r['device']}"
        parts = [f"{r[f'{p}_ns'] / 1e6:,.3f} ms ({r[f'n_{p}']} events) {p} the {'first' if p == 'before' else 'last'} "
                 f"step's window" for p in ("before", "after") if r[f"n_{p}"]]
        detail = f"run {r['run']} rank {r['rank']} {where}: {' and '.join(parts)}"
        notes.append(RunNote("activity outside every step, which no step counts (--whole-trace does)", detail,
                             f"run {r['run']} rank {r['rank']} {where}: activity outside every step: "
                             f"{' and '.join(parts)}; no step counts it (--whole-trace does)"))
    # a device trace without one launch (runtime) event: none of its idle has a cause the trace can show
    bare = con.sql("select t.run, list(distinct s.rank order by s.rank) from traces as t inner join steps as s "
                   "using (trace_id) where t.n_gpu_events > 0 and list_contains($runs, t.run) "
                   "and not exists (select 1 from host_events as h where h.trace_id = t.trace_id "
                   "and list_contains($runtime_cats, h.cat)) group by all order by all",
                   params={"runs": runs, "runtime_cats": query_params()["runtime_cats"]}).fetchall()
    for run, ranks in bare:
        detail = f"run {run} rank {', '.join(map(str, ranks))}"
        notes.append(RunNote(NO_LAUNCH_KIND, detail, f"{detail}: {NO_LAUNCH_KIND}"))
    if "compute_kernel_us" in rows.columns:
        lone = (
            rows.filter(pl.col("device") >= 0)
            .group_by("run", "rank", "device")
            .agg(pl.col("comm_kernel_us").sum().alias("comm"), pl.col("compute_kernel_us").sum().alias("compute"))
            .filter((pl.col("comm") > 0) & (pl.col("compute") == 0))
            .sort("run", "rank", "device")
        )
        for r in lone.iter_rows(named=True):
            notes.append(RunNote("communication but no compute kernel in the selected steps, so all of it is exposed "
                                 "(did the trace keep only NCCL kernels?)",
                                 f"run {r['run']} rank {r['rank']} device {r['device']}",
                                 f"run {r['run']} rank {r['rank']} device {r['device']}: communication but no compute "
                                 "kernel in the selected steps, so all of it is exposed (did the trace keep only NCCL "
                                 "kernels?)"))
    return notes


def selection_notes(
    con: duckdb.DuckDBPyConnection, selection: StepSelection, runs: Sequence[str] | None = None
) -> list[str]:
    """What the step selection left out, per run of ``runs`` (None: every run): a run it left with no
    step at all (never dropped silently), the open last step left out by default, and a rank whose only
    step is the last, kept with its open window (docs/explanation/metrics.md). A CPU-only trace's
    windows are its steps' CPU spans: its last step is closed and kept."""
    selected = query.run(con, "selected_steps", query_params(selection, runs)).set_alias("sel")
    rel = con.sql(
        """
        select t.run, s.rank, bool_or(t.n_gpu_events > 0) as open_last,
               count(*) filter (where s.source <> 'whole_trace') as n_steps,
               min(s.step) as first_step, max(s.step) as last_step,
               count(sel.step) as n_selected, bool_or(sel.step is not null and s.step = s.last) as last_selected
        from (select *, max(step) over (partition by trace_id, rank) as last from steps) as s
        inner join traces as t using (trace_id)
        left join selected as sel on sel.trace_id = s.trace_id and sel.rank = s.rank and sel.step = s.step
        where $runs is null or list_contains($runs, t.run)
        group by all
        order by t.run, s.rank
        """,
        params={"runs": list(runs) if runs else None},
    )
    names = rel.columns
    notes: list[str] = []
    by_run: dict[str, list[dict]] = {}
    for row in rel.fetchall():
        r = dict(zip(names, row))
        by_run.setdefault(r["run"], []).append(r)
    for run, ranks in by_run.items():
        if not any(r["n_selected"] for r in ranks):
            steps = [r for r in ranks if r["n_steps"]]
            held = (f"it has steps {min(r['first_step'] for r in steps)}..{max(r['last_step'] for r in steps)}" if steps
                    else "it has no step marker (one whole-trace window per rank)")
            notes.append(RunNote(f"no step left by the selection ({selection.describe()}): not in this report",
                                 f"run {run} ({held})", f"run {run}: no step left by the selection "
                                 f"({selection.describe()}); {held}: it is not in this report"))
            continue
        if selection.include_last or selection.drop_last:
            continue
        left_out = [r for r in ranks if r["n_steps"] > 1 and r["n_selected"] and not r["last_selected"]
                    and (selection.step_max is None or r["last_step"] <= selection.step_max)]
        if left_out:
            lasts = sorted({r["last_step"] for r in left_out})
            which = f"step {lasts[0]}" if len(lasts) == 1 else f"steps {lasts[0]}..{lasts[-1]}"
            notes.append(RunNote("the last step of each rank is left out: its device window is open (it ends with the "
                                 "GPU's drain); --include-last keeps it", f"run {run} ({which})",
                                 f"run {run}: the last step of each rank ({which}) is left out: its device window is "
                                 "open (it ends with the GPU's drain); --include-last keeps it"))
        alone = [r for r in ranks if r["n_steps"] == 1 and r["last_selected"] and r["open_last"]]
        if alone:
            ranks_text = ", ".join(str(r["rank"]) for r in alone)
            notes.append(RunNote("a rank whose one step is also its last keeps it: its device window is open (it ends "
                                 "with the GPU's drain, so it may hold work launched before it, or lack its trailing "
                                 "idle)", f"run {run} rank {ranks_text}",
                                 f"run {run}: rank {ranks_text} has one step, also its last, kept: its device window "
                                 "is open (it ends with the GPU's drain, so it may hold work launched before it, or "
                                 "lack its trailing idle)"))
    return notes
