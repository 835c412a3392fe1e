"""What traceq knows before it reads a trace: the metrics, the run metadata keys, the event
categories and step markers (the GPU peaks: :mod:`traceq.peaks`).

A leaf module: it imports only the standard library (and traceq.errors), and reads the data files
shipped beside the SQL (``sql/event_categories.csv``), so that ingest, the SQL, the reports and the CLI
all take these lists from one place.
"""

from __future__ import annotations

import csv
import difflib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from urllib.parse import quote

from traceq.errors import ConfigError
from traceq.terminal import CONTROL, visible

# The step marker of PyTorch's profiler: ProfilerStep#N, numbered by N.
DEFAULT_STEP_MARKER = r"^ProfilerStep#(\d+)$"
# Step number of the one window of a rank whose trace has no step marker: its whole timeline (the one
# meaning of step -1; the SQL files write it as -1 too).
WHOLE_TRACE_STEP = -1
# Device of CPU-side activity, in a trace without GPU activity (gloo communication, CPU operators): the one
# meaning of device -1. A negative rank is a file that named none (-1, -2, ... within its run).
NO_DEVICE = -1
ROLES = ("kernel", "memcpy", "memset", "runtime", "operator", "device_annotation")


def data_text(name: str) -> str:
    """The text of a data file shipped in ``traceq.sql``."""
    return files("traceq.sql").joinpath(name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class EventCategories:
    """Kineto event categories by what traceq does with them (``sql/event_categories.csv``).

    kernel / memcpy / memset: device activity (the ``kind`` of gpu_events: 1, 2, 3);
    runtime: the host-side calls whose correlation id links a launch to its device activity, and
    ``launch_patterns`` the names among them that put work on the device (a launch that has no
    device activity in the trace shows the trace was cut), ``sync_patterns`` those that block the
    host until the device is done (cudaStreamSynchronize, cudaDeviceSynchronize, event syncs);
    operator: CPU operators, kept only for traces without device activity (and where they are a
    step marker or carry collective arguments);
    device_annotation: annotations the profiler copies onto the device timeline.
    """

    by_role: dict[str, tuple[str, ...]]
    launch_patterns: dict[str, str]
    sync_patterns: dict[str, str]

    def cats(self, role: str) -> tuple[str, ...]:
        return self.by_role.get(role, ())

    def gpu_kinds(self) -> dict[str, int]:
        """Category -> gpu_events.kind (1 kernel, 2 memcpy, 3 memset)."""
        return {cat: kind for kind, role in enumerate(("kernel", "memcpy", "memset"), start=1) for cat in self.cats(role)}

    def sql_params(self) -> dict[str, object]:
        """The lists as DuckDB parameters: $kernel_cats, $memcpy_cats, $memset_cats, $runtime_cats,
        $op_cats, $device_annotation_cats, $launch_patterns and $sync_patterns (lists of {cat, pattern})."""
        params: dict[str, object] = {
            f"{'op' if role == 'operator' else role}_cats": list(self.cats(role)) for role in ROLES
        }
        params["launch_patterns"] = [{"cat": c, "pattern": p} for c, p in sorted(self.launch_patterns.items())]
        params["sync_patterns"] = [{"cat": c, "pattern": p} for c, p in sorted(self.sync_patterns.items())]
        return params


@cache
def event_categories() -> EventCategories:
    """The shipped ``sql/event_categories.csv``."""
    by_role: dict[str, list[str]] = {}
    patterns: dict[str, str] = {}
    syncs: dict[str, str] = {}
    for line, row in enumerate(csv.DictReader(data_text("event_categories.csv").splitlines()), start=2):
        role = row["role"]
        if role not in ROLES:
            raise ValueError(f"event_categories.csv:{line}: unknown role {role!r}")
        by_role.setdefault(role, []).append(row["cat"])
        if row.get("launch_pattern"):
            patterns[row["cat"]] = row["launch_pattern"]
        if row.get("sync_pattern"):
            syncs[row["cat"]] = row["sync_pattern"]
    return EventCategories({role: tuple(cats) for role, cats in by_role.items()}, patterns, syncs)


@dataclass(frozen=True)
class StepMarker:
    """Which CPU annotations are training steps: a regular expression on event names.

    When the pattern has a group and it captures an integer, that integer numbers the step (spans of
    one number are one step); otherwise a rank's matching spans are its steps 1, 2, ... in time order.
    """

    pattern: str = DEFAULT_STEP_MARKER

    @classmethod
    def parse(cls, pattern: str | None) -> StepMarker:
        """A marker from user text (None: ``ProfilerStep#N``); ConfigError naming the problem."""
        if pattern is None:
            return cls()
        if not pattern.strip():
            raise ConfigError("give a regular expression on step names, e.g. '^step\\[DECODE'", param="step_marker", value=pattern)
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"not a regular expression ({exc})", param="step_marker", value=pattern) from None
        return cls(pattern)

    @property
    def prefix(self) -> str:
        """The literal text every match starts with ('' if none is certain): a cheap first test."""
        m = re.match(r"\^((?:[^\\\[\](){}.*+?^$|]|\\[^A-Za-z0-9])*)", self.pattern)
        if not m or "|" in self.pattern:
            return ""
        text = re.sub(r"\\(.)", r"\1", m.group(1))
        # a quantifier after the literal applies to its last character
        rest = self.pattern[m.end():]
        return text[:-1] if rest[:1] in ("*", "?", "{") else text

    def sql_params(self) -> dict[str, object]:
        """$step_marker and $step_marker_prefix."""
        return {"step_marker": self.pattern, "step_marker_prefix": self.prefix}


# ------------------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    """One metric: its name (as in the CLI, SQL and docs), unit, definition, and what computes it.

    ``source``: ``interval`` (sql/interval_breakdown.sql, which both engines run), ``idle`` (idle split
    by cause, sql/idle_breakdown.sql), ``cross_rank`` (collectives matched across ranks,
    sql/split_activity.sql and sql/stragglers.sql), ``step`` (over a step's CPU span, sql/step_throughput.sql:
    no whole-trace value) or ``breakdown`` (one row per collective type or process group).
    ``weight``: a ratio or rate's denominator, a column of the step rows; it aggregates as a ratio of
    sums, Σ(value × weight) / Σ weight (docs/explanation/metrics.md), or Σ ``numerator`` / Σ weight where the
    numerator is a column of its own. ``split``: a breakdown's dimension in
    sql/exposed_comm_by_collective.sql and the key column it adds.
    """

    name: str
    unit: str
    definition: str
    source: str = "interval"
    weight: str | None = None
    numerator: str | None = None
    split: tuple[str, str] | None = None

    @property
    def ns_column(self) -> str | None:
        """The step rows' integer-ns column a time in us is read from (None: not a time from ns)."""
        computed = self.source in ("interval", "idle", "cross_rank")
        return self.name.removesuffix("_us") + "_ns" if self.unit == "us" and computed else None


METRICS: tuple[Metric, ...] = (
    Metric("comm_kernel_us", "us", "sum of communication kernel durations in the window (the study's communication load)"),
    Metric("compute_kernel_us", "us", "sum of compute kernel durations in the window (the study's computational load)"),
    Metric("comm_us", "us", "|U(comm)|: time at least one communication kernel runs, streams merged"),
    Metric("compute_us", "us", "|U(compute)|: time at least one compute kernel runs, streams merged"),
    Metric("overlapped_comm_us", "us", "|U(comm) ∩ U(compute)|: communication hidden behind compute"),
    Metric("exposed_comm_us", "us", "|U(comm) − U(compute)|: communication with no compute beside it"),
    Metric("exposed_memcpy_us", "us", "|U(memcpy ∪ memset) − U(compute) − U(comm)|"),
    Metric("idle_us", "us", "window_us − |U(all device activity in the window)|; 0 <= idle_us <= window_us"),
    Metric("idle_sync_us", "us", "idle_us while a synchronisation call (cudaStreamSynchronize, cudaDeviceSynchronize, an event "
           "sync) was in flight on the rank's host", source="idle"),
    Metric("idle_host_bound_us", "us", "idle_us not in a sync and before the launch of the work that ends the idle gap: "
           "nothing was queued, the CPU launched late", source="idle"),
    Metric("idle_other_us", "us", "idle_us not in a sync and from the launch of the work that ends the idle gap on: it was "
           "launched but had not started (launch latency, a stream waiting on an event)", source="idle"),
    Metric("idle_unknown_us", "us", "idle_us not in a sync in a gap whose ending work has no launch event (a trace of device "
           "events only, e.g. NCCL kernels alone): no cause is guessed; idle_sync_us + idle_host_bound_us + idle_other_us "
           "+ idle_unknown_us = idle_us", source="idle"),
    Metric("comm_wait_us", "us", "the part of comm_us where every running communication kernel is still waiting for its "
           "last peer (each matched kernel's first duration − transfer; docs/explanation/across-ranks.md)", source="cross_rank"),
    Metric("comm_transfer_us", "us", "the rest of comm_us: some kernel moves data (an instance's transfer = its shortest "
           "duration over ranks; an unmatched kernel counts whole); comm_wait_us + comm_transfer_us = comm_us", source="cross_rank"),
    Metric("exposed_comm_wait_us", "us", "exposed_comm_us spent waiting for a late peer", source="cross_rank"),
    Metric("exposed_comm_transfer_us", "us", "exposed_comm_us moving data; exposed_comm_wait_us + exposed_comm_transfer_us "
           "= exposed_comm_us", source="cross_rank"),
    Metric("arrived_last_count", "count", "matched collectives (starting in the window) at which this rank arrived last: "
           "its kernel was the shortest of the instance", source="cross_rank"),
    Metric("arrived_last_share", "ratio", "arrived_last_count / the matched collectives this rank took part in", source="cross_rank", weight="matched_count"),
    Metric("wait_caused_us", "us", "the waiting that the other ranks did at the collectives this rank arrived last at", source="cross_rank"),
    Metric("window_us", "us", "the step's device window: from the first device activity it launched to the first the next step "
           "launched (the last step: to the end of the activity the steps launched); windows tile the timeline. The "
           "last step's window is open (it ends with the GPU's drain): reports leave it out unless --include-last"),
    Metric("overlap_ratio", "ratio", "overlapped_comm_us / comm_us (HTA's comp_comm_overlap_pctg / 100); over steps and "
           "ranks Σ overlapped / Σ comm, as every ratio and rate aggregates: a ratio of sums", weight="comm_ns"),
    Metric("step_time_ms", "ms", "duration of the step's CPU span, ProfilerStep#N or --step-marker (the clock for throughput)", source="step"),
    Metric("tokens_per_s", "tokens/s", "tokens_per_step / world_size / step time: tokens per second per GPU (the study's "
           "WPS); over steps Σ tokens / Σ step time", source="step", weight="step_time_ns"),
    Metric("global_tokens_per_s", "tokens/s", "tokens_per_step / step time: tokens per second of the whole run", source="step", weight="step_time_ns"),
    Metric("tflops", "TFLOP/s", "model FLOPs per step / world_size / step time; FLOPs per token 6·N + 12·L·H·Q·T unless "
           "set, or FLOPs per step alone (no tokens needed)", source="step", weight="step_time_ns"),
    Metric("mfu", "ratio", "tflops / the GPU's peak dense BF16 TFLOP/s (table or user-set)", source="step", weight="step_time_ns"),
    Metric("power_w", "W", "NVML power of the rank's GPU(s), time-weighted over the step's wall-clock window", source="step", weight="step_time_ns"),
    Metric("energy_j", "J", "NVML energy counter interpolated linearly to the step's boundaries (else power_w × step window)", source="step"),
    Metric("tokens_per_j", "tokens/J", "tokens of the rank's GPU(s) in the step / energy_j", source="step", weight="energy_j", numerator="power_tokens"),
    Metric("exposed_comm_by_collective_us", "us",
           "|U(comm of collective type t) − U(compute)| per type; types may overlap, so these can sum to more than exposed_comm_us", source="breakdown", split=("collective", "collective_type")),
    Metric("exposed_comm_by_pg_us", "us",
           "|U(comm of process group g) − U(compute)| per process group; groups may overlap, so these can sum to more than exposed_comm_us", source="breakdown", split=("process_group", "process_group")),
)
METRIC_NAMES = tuple(m.name for m in METRICS)


def _of(source: str) -> tuple[str, ...]:
    return tuple(m.name for m in METRICS if m.source == source)


# what a report computes only when it asks for one of them: idle by cause, the split across ranks
IDLE_PARTS = _of("idle")
CROSS_RANK = _of("cross_rank")
# metrics over a step's CPU span (throughput, power): they have no whole-trace value
PER_STEP_METRICS = _of("step")
# metric (us) -> its integer-ns column in the step rows
NS_COLUMN_OF = {m.name: m.ns_column for m in METRICS if m.ns_column}
# Ratios and rates aggregate as a ratio of sums (docs/explanation/metrics.md): metric -> its denominator column, so
# that the aggregate over rows is Σ(value × weight) / Σ weight = Σ numerator / Σ denominator
# (overlap_ratio = Σ overlapped / Σ comm; tokens_per_s = Σ tokens / Σ step time). Every report (report,
# summary, scaling, diff, the HTML) aggregates through traceq.report.aggregation.mean_of.
RATE_WEIGHTS = {m.name: m.weight for m in METRICS if m.weight}
# Rates whose numerator is a column of its own rather than value × weight: a step whose energy counter did
# not tick (0 J, tokens_per_j null) still adds its tokens to the run's Σ tokens / Σ energy.
RATE_NUMERATORS = {m.name: m.numerator for m in METRICS if m.numerator}
# metric -> (dimension in exposed_comm_by_collective.sql, the key column it adds)
BREAKDOWNS = {m.name: m.split for m in METRICS if m.split}
# `--metric exposed_comm` and `--metric exposed_comm_us` both work.
_ALIASES = {m.name.removesuffix("_us").removesuffix("_ms"): m.name for m in METRICS}
# Run metadata columns that can group a report (see sql/run_metadata.sql).
META_COLUMNS = ("world_size", "nodes", "gpus_per_node", "tp", "pp", "cp", "dp", "model", "seq_len", "gpu_model",
                "tokens_per_step")
GROUP_COLUMNS = ("run", "rank", "device", "step", *META_COLUMNS)
BREAKDOWN_NOTE = (
    "exposed comm by collective type / process group: |U(comm of that key) − U(compute)|; where collectives "
    "of different keys overlap each other that time counts once for each, so these can sum to more than "
    "exposed_comm_us"
)


def resolve_metric(name: str) -> str:
    """Canonical metric name for ``name`` (accepts the name without its unit suffix)."""
    if name in METRIC_NAMES:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    raise ConfigError(f"unknown metric{did_you_mean(name, METRIC_NAMES)}; every metric: {', '.join(METRIC_NAMES)}",
                      param="metric", value=name)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """'; did you mean x?' for the closest of ``choices`` to ``word``, or ''."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def columns(by: str | Sequence[str], allowed: Sequence[str], param: str = "by") -> list[str]:
    """``by`` (a comma-separated string or a sequence of names) as a list of column names, each one of
    ``allowed``; ConfigError naming the unknown ones (with a did-you-mean)."""
    names = [c.strip() for c in (by.split(",") if isinstance(by, str) else by) if c.strip()]
    bad = [c for c in names if c not in allowed]
    if bad:
        hint = did_you_mean(bad[0], allowed)
        raise ConfigError(f"unknown column(s) {bad}{hint}; use any of {', '.join(allowed)}",
                          param=param, value=",".join(names))
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------------- run metadata keys


# Values that differ between the rank files of one run: kept per rank in run_files, not in runs.metadata.
PER_RANK_KEYS = frozenset({
    "rank", "local_rank", "rank_source", "host", "pid", "clock", "trace_file", "trace_files", "power_file",
    "errors", "complete", "steps_seen", "traceq_run_metadata",
})


@dataclass(frozen=True)
class RunKey:
    """A run metadata value users may set: its key in runs.metadata, type and meaning."""

    key: str
    kind: type
    help: str


# Keys as the collector writes them (run.json), so that `runs set` corrects the same fields.
RUN_KEYS: tuple[RunKey, ...] = (
    RunKey("world_size", int, "ranks (GPUs) in the run"),
    RunKey("nodes", int, "nodes"),
    RunKey("gpus_per_node", int, "GPUs per node"),
    RunKey("tp", int, "tensor-parallel degree"),
    RunKey("pp", int, "pipeline-parallel degree"),
    RunKey("cp", int, "context-parallel degree"),
    RunKey("dp", int, "data-parallel degree"),
    RunKey("tokens_per_step", int, "global tokens per optimizer step (all ranks together)"),
    RunKey("global_batch_size", int, "sequences per optimizer step, all ranks"),
    RunKey("micro_batch_size", int, "sequences per rank and micro-step"),
    RunKey("model", str, "model name"),
    RunKey("seq_len", int, "sequence length T (tokens)"),
    RunKey("n_params_non_embedding", int, "N: non-embedding parameters (FLOPs convention 6N + 12LHQT)"),
    RunKey("n_layers", int, "L: layers"),
    RunKey("n_heads", int, "H: attention heads"),
    RunKey("head_dim", int, "Q: head dimension"),
    RunKey("model_flops_per_token", float, "model FLOPs per token (replaces 6N + 12LHQT)"),
    RunKey("flops_per_step", float, "global model FLOPs per optimizer step (replaces the per-token convention)"),
    RunKey("gpu_model", str, "GPU model, e.g. 'NVIDIA H100 80GB HBM3' (its peak comes from traceq's table)"),
    RunKey("peak_tflops", float, "peak dense BF16 TFLOP/s of one GPU (overrides the table)"),
    RunKey("warmup_steps", int, "recorded steps that reports skip"),
)
RUN_KEY_NAMES = tuple(k.key for k in RUN_KEYS)


# ------------------------------------------------------------------------------------------ runs

# A run is a folder of a Parquet export, run=<name> with the name percent-encoded (at most 3 bytes
# for each byte of UTF-8): the folder's name must fit a file system's 255 bytes.
_MAX_RUN_FOLDER = 255


# threads (ingest --threads) or processes (ingest-cluster --processes) beyond a few per core only cost
# memory (ingest-cluster with 500 processes reached 10 GB)
MAX_PER_CORE = 4


MAX_RANK = 2**31 - 1  # ranks are int32 in torch.distributed


def check_rank(rank: int | None) -> None:
    """ConfigError unless ``rank`` is None or a rank torch.distributed could give (0 to 2^31-1)."""
    if rank is not None and not 0 <= rank <= MAX_RANK:
        raise ConfigError(f"a rank is from 0 to {MAX_RANK}", param="rank", value=rank)


def check_parallelism(count: int | None, param: str) -> None:
    """ConfigError unless ``count`` (of threads, or of processes: ``param`` names which) is None (the
    default: one per core) or from 1 to :data:`MAX_PER_CORE` per core of this machine."""
    if count is None:
        return
    cores = os.cpu_count() or 1
    most = MAX_PER_CORE * cores
    if not 1 <= count <= most:
        raise ConfigError(f"give 1 to {most} ({MAX_PER_CORE} per core of this machine's {cores}); "
                          "without it, one per core", param=param, value=count)


def check_run_name(run: str, param: str = "run") -> str:
    """``run`` when it can name a run (non-empty, and its export folder fits in 255 bytes); else ConfigError."""
    if not run.strip():
        raise ConfigError("a run needs a name that is not empty", param=param, value=run)
    if CONTROL.search(run):
        raise ConfigError("a run name cannot hold control characters (ESC, newline, ...): they would act on the "
                          "terminal of whoever lists it; give a name of printable characters", param=param,
                          value=visible(run))
    folder = len("run=") + len(quote(run, safe=""))
    if folder > _MAX_RUN_FOLDER:
        raise ConfigError(
            f"too long: its Parquet folder would be {folder} bytes, over {_MAX_RUN_FOLDER} "
            f"({len(run.encode())} bytes of UTF-8, percent-encoded); give a shorter name",
            param=param, value=run if len(run) <= 40 else run[:40] + "...",
        )
    return run
