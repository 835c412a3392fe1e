"""The findings of ``traceq explain`` (docs/explanation/findings.md): each kind of finding read off the tables
other commands print (:class:`Figures`), never computed anew, so that each of its numbers is one of theirs.

A :class:`Finding` says what (one sentence in the run's words), how much (ms per step, share of the step),
its bound (the time on the critical path it accounts for: what removing the cause could save at most;
without a path, its own time), the figures behind it (:class:`Evidence`: the command that prints each, its
column and row) and the command to look closer. The numbers a finding carries are derived from its
evidence alone, by :func:`amount_ms`, so a reader (or a test) can redo them.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from traceq.kernel_names import short_name

if TYPE_CHECKING:
    import polars as pl

# the metrics of a run the findings read, side by side: one `traceq report --metric ...` prints them all
METRICS = ("step_time_ms", "exposed_comm_us", "exposed_comm_wait_us", "exposed_comm_transfer_us", "exposed_memcpy_us",
           "idle_host_bound_us", "idle_sync_us", "idle_other_us", "idle_unknown_us", "compute_us", "mfu", "power_w",
           "energy_j", "tokens_per_j")
MIN_PCT = 1.0  # a finding of time below this share of the step is left out (a note names it)
PATH_TOP = 100_000  # rows of `critical-path --kernels` and `kernels` the findings read: all of them
IDLE_CAUSES = {  # idle part -> what it is, in a reader's words, and what to do about it where the trace says
    "idle_host_bound": "the GPU waits for the CPU to launch work (host-bound)",
    "idle_sync": "the GPU idles while the host waits in a synchronize",
    "idle_other": "work is launched but not yet started (launch latency, a stream waiting on an event)",
    "idle_unknown": "the GPU idles for a reason the trace cannot show (it has no launch events)",
}


@dataclass(frozen=True)
class Evidence:
    """One figure another command prints: ``command`` (a runnable ``traceq ...`` line), the ``column`` and
    the rows (``where``: column -> value) it is read from, ``agg`` over those rows (``value``: the one row,
    ``sum``, ``mean``, ``count``) and the ``value`` itself. ``role`` says what the finding makes of it:
    ``amount`` / ``amount_minus`` / ``amount_steps`` (its ms per step: amounts less amount_minus, over the
    steps), ``bound`` (ms per step), ``bound_total`` / ``bound_steps`` (a total over the steps; of several
    bounds, the least), ``step_time`` (the step's ms),
    or '' (context for the sentence)."""

    command: str
    column: str
    where: tuple[tuple[str, Any], ...]
    value: float
    agg: str = "value"
    role: str = ""

    def short(self) -> str:
        """'report idle_host_bound_us[rank 3] = 9,800': the command's name, column, row and value."""
        words = shlex.split(self.command)[1:]
        name = " ".join([words[0], *(w for w in words[1:] if w in ("--ranks", "--kernels", "--by-step"))])
        keys = [f"{k} {short_name(v) if k == 'name' else v}" for k, v in self.where
                if k != "run" and v is not None]
        agg = "" if self.agg == "value" else f"{self.agg} "
        rows = "[" + ", ".join(keys) + "]" if keys else ""
        return f"{name} {agg}{self.column}{rows} = {number(self.value)}"


@dataclass(frozen=True)
class Finding:
    """A finding of one run: ``kind``, ``topic`` (a few words: 'exposed AllGather'), ``text`` (what, in one sentence), ``evidence``, ``next`` (a command),
    and the figures derived from the evidence (:func:`amount_ms`): ``ms_per_step``, ``pct_of_step`` and
    ``bound_ms`` (None for a finding that is not time: power, the path per rank, a missing input)."""

    run: str
    kind: str
    topic: str
    text: str
    evidence: tuple[Evidence, ...] = ()
    next: str = ""
    ms_per_step: float | None = field(default=None)
    pct_of_step: float | None = field(default=None)
    bound_ms: float | None = field(default=None)

    @classmethod
    def of(cls, run: str, kind: str, topic: str, text: str, evidence: Sequence[Evidence], next: str = "") -> Finding:
        """A finding whose figures are derived from ``evidence`` (:func:`amount_ms`, :func:`bound_ms`)."""
        evidence = tuple(evidence)
        ms = amount_ms(evidence)
        step = [e.value for e in evidence if e.role == "step_time"]
        pct = ms / step[0] * 100 if ms is not None and step and step[0] else None
        return cls(run, kind, topic, text, evidence, next, ms, pct, bound_ms(evidence))


def to_ms(e: Evidence) -> float:
    """The figure in ms: ``*_us`` columns / 1000, others (``*_ms``) as they are."""
    return e.value / 1000 if e.column.endswith("_us") else e.value


def _per_step(evidence: Sequence[Evidence], plus: str, minus: str, steps: str) -> float | None:
    pos = [to_ms(e) for e in evidence if e.role == plus]
    if not pos:
        return None
    total = sum(pos) - sum(to_ms(e) for e in evidence if e.role == minus)
    for e in evidence:
        if e.role == steps:
            total /= e.value
    return total


def amount_ms(evidence: Sequence[Evidence]) -> float | None:
    """ms per step from the evidence: Σ amount − Σ amount_minus, over amount_steps where given."""
    return _per_step(evidence, "amount", "amount_minus", "amount_steps")


def bound_ms(evidence: Sequence[Evidence]) -> float | None:
    """The bound from the evidence: the least of the ``bound`` figures (per step already) and the
    ``bound_total`` ones (over the steps, ``bound_steps``); without one, the amount (a run without a path)."""
    steps = [e.value for e in evidence if e.role == "bound_steps"]
    bounds = [to_ms(e) for e in evidence if e.role == "bound"]
    bounds += [to_ms(e) / steps[0] for e in evidence if e.role == "bound_total" and steps and steps[0]]
    return min(bounds) if bounds else amount_ms(evidence)


def number(x: float | None) -> str:
    """A figure for a sentence: 3 significant digits below 100, whole numbers above, thousands grouped."""
    if x is None:
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) >= 0.001 or x == 0 else f"{x:.2e}"


@dataclass
class Figures:
    """The tables the findings read, each as a command prints it (None: the command had nothing to say,
    with the reason in ``missing``): ``metrics`` (``report --by run``), ``ranks`` (``report --by run,rank``),
    ``steps`` (``report --by run,rank,step`` for step_time_ms), ``by_type`` and ``by_type_ranks`` (``report --metric
    exposed_comm_by_collective_us --by run``, ``--by run,rank``), ``stragglers``, ``collectives`` (``--by run,collective_type``),
    ``categories`` and ``kernels`` (``kernels``), ``summary`` (``summary --by run``), and of the critical path
    ``path_steps``, ``path_ranks``, ``path_kernels``. ``flags``: the step selection as command-line options; ``notes``: what the reports say of each run (its steps,
    FLOPs and power, how its collectives were matched)."""

    metrics: pl.DataFrame
    ranks: pl.DataFrame
    steps: pl.DataFrame
    summary: pl.DataFrame
    flags: str = ""
    by_type: pl.DataFrame | None = None
    by_type_ranks: pl.DataFrame | None = None
    stragglers: pl.DataFrame | None = None
    collectives: pl.DataFrame | None = None
    categories: pl.DataFrame | None = None
    kernels: pl.DataFrame | None = None
    path_steps: pl.DataFrame | None = None
    path_ranks: pl.DataFrame | None = None
    path_kernels: pl.DataFrame | None = None
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def command(self, run: str, sub: str, *args: str) -> str:
        """``traceq SUB --run RUN ARGS`` with the step selection's options."""
        return " ".join(["traceq", sub, "--run", shlex.quote(run), *args, *([self.flags] if self.flags else [])])

    def rows(self, frame: pl.DataFrame | None, run: str, **where: Any) -> pl.DataFrame | None:
        """The rows of ``frame`` of ``run`` (and ``where``), None where there are none."""
        import polars as pl

        if frame is None:
            return None
        cond = pl.col("run") == run
        for k, v in where.items():
            cond &= pl.col(k).is_null() if v is None else pl.col(k) == v
        part = frame.filter(cond)
        return part if part.height else None

    def metric(self, run: str, column: str, role: str = "", by: str = "run", rank: int | None = None) -> Evidence | None:
        """``COLUMN`` of ``report --metric METRICS --by run`` (or ``run,rank`` with ``rank``: there with the
        steps' median, p10 and p90) of ``run``, None where empty."""
        frame = self.metrics if rank is None else self.ranks
        part = self.rows(frame, run) if rank is None else self.rows(frame, run, rank=rank)
        if part is None or column not in part.columns or part[column][0] is None:
            return None
        where = (("run", run),) if rank is None else (("run", run), ("rank", rank))
        return Evidence(self.command(run, "report", "--metric", ",".join(METRICS), "--by", "run" if rank is None else "run,rank"),
                        column, where, float(part[column][0]), role=role)

    def path_count(self, run: str, role: str) -> Evidence | None:
        """The steps the critical path walked (rows of ``critical-path``), None without a path."""
        part = self.rows(self.path_steps, run)
        return None if part is None else Evidence(self.command(run, "critical-path"), "step", (("run", run),),
                                                  float(part.height), "count", role)

    def path_mean(self, run: str, column: str, role: str = "bound") -> Evidence | None:
        """The mean of a column of ``critical-path`` (its steps view) over the run's steps."""
        part = self.rows(self.path_steps, run)
        return None if part is None else Evidence(self.command(run, "critical-path"), column, (("run", run),),
                                                  float(part[column].mean()), "mean", role)

    def path_sum(self, run: str, role: str = "bound_total", **where: Any) -> Evidence | None:
        """Σ critical_ms of ``critical-path --kernels`` rows of ``where`` (kind, collective_type, category);
        0 where the path has none of them (but has a path)."""
        if self.rows(self.path_steps, run) is None:
            return None
        part = self.rows(self.path_kernels, run, **where)
        total = 0.0 if part is None else float(part["critical_ms"].sum())
        return Evidence(self.command(run, "critical-path", "--kernels", "--top", str(PATH_TOP)), "critical_ms",
                        (("run", run), *where.items()), total, "sum", role)


def kept(*evidence: Evidence | None) -> list[Evidence]:
    """The evidence that exists."""
    return [e for e in evidence if e is not None]


def ms_text(ms: float) -> str:
    return f"{number(ms)} ms"


def pct_text(part: float, whole: float | None) -> str:
    return f" ({part / whole * 100:.1f} % of the {number(whole)} ms step)" if whole else ""


def short(name: str) -> str:
    """A kernel's short name (:mod:`traceq.kernel_names`)."""
    return short_name(name)
