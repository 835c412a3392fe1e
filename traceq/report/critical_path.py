"""The critical path of a step across ranks (docs/explanation/across-ranks.md: the critical path): which rank, and which of its work,
made the step as long as it was.

:func:`critical_path` walks the selected steps a batch at a time (:func:`traceq.report.path_batches.walking`)
and keeps of each batch only what its views need (:class:`CriticalPath`: per step, blame by rank and kind,
the kernels on the paths; the segments themselves only when asked for), so its memory does not grow with
the steps or ranks selected. :func:`write_critical_path_html` draws one step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from traceq.errors import ConfigError
from traceq.kernel_names import short_name
from traceq.report.path_batches import PathBatch, walking
from traceq.report.path_timeline import KINDS
from traceq.report.result import Report
from traceq.report.selection import StepSelection
from traceq.store.warehouse import DEFAULT_DB, Warehouse

if TYPE_CHECKING:
    import polars as pl

VIEWS = ("steps", "segments", "ranks", "kernels")  # what CriticalPath.report shows
_WORK = ("compute", "comm_transfer", "memcpy", "memset")  # kinds a sentence names the kernel of


# --------------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class CriticalPath:
    """The critical paths of the selected steps (:func:`critical_path`).

    Attributes:
        steps: one row per (run, step): its span on the last-ending rank (``last_rank``), how many ranks
            the path crosses and how often it jumps, its time by kind (ms), the rank and the kernel most on it.
        jumps: one row per jump: the step, the rank that waited (from_rank) and the one it waited for
            (to_rank, the last to arrive), the collective, and the waiting rank's wait up to the jump
            (wait_on_path_ns: what the late rank's lateness cost the step there).
        blame_table: time on the path per (run, step, rank, kind), ms.
        notes: how the collectives were matched, what the selection left out.
        selection: the steps selected, in words.
        segments: the paths, one row per segment in time order (``order`` 0 first): rank, device, start_ns
            and end_ns on that rank's clock, path_start_ns on the last-ending rank's, dur_ns, kind, the
            kernel (name, category) or the collective (collective_type, process_group, instance_id). Kept
            only when asked for (``critical_path(..., segments=True)``); :func:`walking` streams them.
        longest: the segments of each run's longest step (what the page draws).
    """

    steps: pl.DataFrame
    jumps: pl.DataFrame
    blame_table: pl.DataFrame
    notes: list[str]
    selection: str
    longest: pl.DataFrame
    kept: pl.DataFrame | None = None
    rank_parts: pl.DataFrame | None = field(default=None, repr=False)
    kernel_parts: pl.DataFrame | None = field(default=None, repr=False)
    sentences: dict[tuple[str, int], str] = field(default_factory=dict, repr=False)

    @property
    def segments(self) -> pl.DataFrame:
        if self.kept is None:
            raise ConfigError("the segments were not kept: ask critical_path(..., segments=True), or stream them "
                              "with traceq.report.critical_path.walking(...)", param="segments", value=False)
        return self.kept

    def report(self, view: str = "steps", top: int | None = 20) -> Report:
        """One of :data:`VIEWS` as a :class:`~traceq.report.result.Report`: ``steps`` (one row per step, and
        the first 20 steps' sentences after the notes), ``segments`` (the paths), ``ranks``
        (:meth:`ranks`) or ``kernels`` (:meth:`kernels`, ``top`` rows)."""
        if view not in VIEWS:
            raise ConfigError(f"one of {', '.join(VIEWS)}", param="view", value=view)
        notes = list(self.notes)
        if view == "steps":
            table = self.steps
            notes += [self.sentence(s, r) for r, s in self.steps.select("run", "step").rows()[:20]]
        elif view == "segments":
            table = self.segments.drop("instance_id", "trace_id")
        else:
            table = self.ranks() if view == "ranks" else self.kernels(top)
        return Report(table, notes, path_title(self.steps["run"].unique(maintain_order=True).to_list(), view,
                                               self.selection), narrow=NARROW, names=NAMES)

    def blame(self, by: Sequence[str] = ("rank", "kind")) -> pl.DataFrame:
        """Time on the path per step and ``by`` (``rank``, ``kind`` or both), in ms, largest first."""
        import polars as pl

        keys = ["run", "step", *by]
        return (self.blame_table.group_by(keys).agg(pl.col("critical_ms").sum())
                .sort(["run", "step", "critical_ms", *by], descending=[False, False, True, *[False] * len(by)]))

    def ranks(self) -> pl.DataFrame:
        """Per rank over the steps: its time on the path (ms) and share of the paths' time, the steps it is
        on, its compute on the path, and the waiting its lateness cost (``wait_caused_ms``: the waits the
        path jumped through to it)."""
        import polars as pl

        per = self.rank_parts.group_by("run", "rank").agg(pl.col("critical_ns", "compute_ns", "steps_on_path").sum())
        total = per.group_by("run").agg(pl.col("critical_ns").sum().alias("total"))
        caused = self.jumps.group_by("run", pl.col("to_rank").alias("rank")).agg(
            _ms(pl.col("wait_on_path_ns").sum()).alias("wait_caused_ms"), pl.len().alias("waited_for"))
        steps = self.steps.group_by("run").agg(pl.len().alias("steps"))
        return (
            per.join(total, on="run").join(steps, on="run").join(caused, on=["run", "rank"], how="left")
            .with_columns(_ms(pl.col("critical_ns")).alias("critical_ms"), _ms(pl.col("compute_ns")).alias("compute_ms"),
                          (pl.col("critical_ns") / pl.col("total")).alias("share"),
                          pl.col("wait_caused_ms").fill_null(0.0), pl.col("waited_for").fill_null(0))
            .select("run", "rank", "critical_ms", "share", "steps_on_path", "steps", "compute_ms", "waited_for",
                    "wait_caused_ms")
            .sort(["run", "critical_ms", "rank"], descending=[False, True, False])
        )

    def kernels(self, top: int | None = 20) -> pl.DataFrame:
        """The kernels and collectives most on the paths: per (kind, name, collective type) their time on the path (ms), its
        share, the steps they are on and the ranks they ran on; idle is left out (``steps`` and
        :meth:`blame` hold it)."""
        import polars as pl

        totals = self.rank_parts.group_by("run").agg(pl.col("critical_ns").sum().alias("total"))
        table = (
            self.kernel_parts.group_by("run", "kind", "name", "collective_type").agg(
                pl.col("dur_ns").sum(), pl.col("steps_on_path").sum(),
                pl.col("ranks").list.explode(keep_nulls=False, empty_as_null=False).unique().sort().alias("ranks"),
                pl.col("category").drop_nulls().first())
            .join(totals, on="run")
            .with_columns(_ms(pl.col("dur_ns")).alias("critical_ms"), (pl.col("dur_ns") / pl.col("total")).alias("share"),
                          pl.col("ranks").list.eval(pl.element().cast(pl.String)).list.join(",").alias("ranks"))
            .sort(["run", "critical_ms", "name", "collective_type"], descending=[False, True, False, False], nulls_last=True)
            .select("run", "kind", "critical_ms", "share", "steps_on_path", "ranks", "category", "collective_type",
                    "name")
        )
        return table.head(top) if top else table

    def sentence(self, step: int, run: str | None = None) -> str:
        """The step's path in one sentence: 'step 12 took 93.0 ms on rank 3's clock: 61.0 ms is rank 3's
        compute (mostly nvjet_... 40.1 ms), ...'. ``run``: needed where the steps are of several runs."""
        run = run if run is not None else self.steps["run"][0]
        return self.sentences[(run, step)]


NAMES = ("name", "top_kernel")  # the columns of kernel names, shown short in tables (traceq.kernel_names)
NARROW = ("path_start_ns", "category", "process_group", "top_kernel_ms", "copy_ms", "wait_ms", "compute_ms",
          "waited_for", "steps")


def path_title(runs: Sequence[str], view: str, selection: str) -> str:
    """The title of a view of the paths of ``runs``."""
    which = f"run {runs[0]}" if len(runs) == 1 else f"runs {', '.join(runs)}"
    return f"critical path of {which}{'' if view == 'steps' else f', {view}'} ({selection})"


def _ms(ns: pl.Expr) -> pl.Expr:
    """ns as ms, rounded to the ns (no float noise in CSV and JSON)."""
    return (ns / 1e6).round(6)


def _ms_text(ms: float) -> str:
    """ms for a sentence: one decimal from 1 ms, three below (a 3 us segment is not '0.0 ms')."""
    return f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"


def critical_path(
    db: Warehouse = DEFAULT_DB,
    *,
    runs: Sequence[str] | None = None,
    selection: StepSelection = StepSelection(),
    segments: bool = False,
    progress: Callable[[int, int], None] | None = None,
    **sizes: int,
) -> CriticalPath:
    """The critical path of every selected step of ``runs`` (None: every run; docs/explanation/across-ranks.md: the critical path).

    Args:
        db: the warehouse.
        runs: the runs to walk.
        selection: which steps (the open last step is left out by default, as everywhere).
        segments: keep every segment (:attr:`CriticalPath.segments`): memory then grows with the steps
            selected; without it only what the views need is kept.
        progress: called after each batch of steps with (steps walked, steps selected).
        sizes: ``batch_rows`` and ``held_rows`` of :func:`walking`.
    """
    import polars as pl

    parts: dict[str, list[pl.DataFrame]] = {k: [] for k in ("steps", "jumps", "blame", "ranks", "kernels", "kept")}
    sentences: dict[tuple[str, int], str] = {}
    longest: dict[str, tuple[float, pl.DataFrame]] = {}
    with walking(db, runs=runs, selection=selection, progress=progress, **sizes) as (notes, batches):
        for b in batches:
            summary = _summarise(b)
            for key in ("steps", "blame", "ranks", "kernels"):
                parts[key].append(summary[key])
            parts["jumps"].append(b.jumps)
            sentences.update(_sentences(b, summary["blame"]))
            if segments:
                parts["kept"].append(b.segments)
            span, step = b.steps.sort(["span_ms", "step"], descending=[True, False]).select("span_ms", "step").row(0)
            if b.run not in longest or span > longest[b.run][0]:
                longest[b.run] = (span, b.segments.filter(pl.col("step") == step))
    return CriticalPath(
        steps=pl.concat(parts["steps"]).sort("run", "step"), jumps=pl.concat(parts["jumps"]),
        blame_table=pl.concat(parts["blame"]), notes=notes, selection=selection.describe(),
        longest=pl.concat([f for _, f in longest.values()]), kept=pl.concat(parts["kept"]) if segments else None,
        rank_parts=pl.concat(parts["ranks"]), kernel_parts=pl.concat(parts["kernels"]), sentences=sentences,
    )


def _summarise(b: PathBatch) -> dict[str, pl.DataFrame]:
    """What the views need of a batch: its step rows, blame by (step, rank, kind), and the parts of the
    rank and kernel tables (sums over the batch, summed again over batches)."""
    import polars as pl

    seg = b.segments
    kinds = {"compute": ["compute"], "transfer": ["comm_transfer"], "wait": ["comm_wait"], "copy": ["memcpy", "memset"],
             "idle": [k for k in KINDS if k.startswith("idle")]}
    by_kind = seg.group_by("step").agg(
        *[_ms(pl.col("dur_ns").filter(pl.col("kind").is_in(ks)).sum()).alias(f"{label}_ms") for label, ks in kinds.items()],
        pl.col("rank").n_unique().alias("ranks_on_path"))
    top_rank = (seg.group_by("step", "rank").agg(pl.col("dur_ns").sum())
                .sort(["step", "dur_ns", "rank"], descending=[False, True, False]).group_by("step", maintain_order=True)
                .first().select("step", pl.col("rank").alias("top_rank"), _ms(pl.col("dur_ns")).alias("top_rank_ms")))
    work = seg.filter(~pl.col("kind").str.starts_with("idle"))
    top_kernel = (work.group_by("step", "name").agg(pl.col("dur_ns").sum())
                  .sort(["step", "dur_ns", "name"], descending=[False, True, False]).group_by("step", maintain_order=True)
                  .first().select("step", pl.col("name").alias("top_kernel"), _ms(pl.col("dur_ns")).alias("top_kernel_ms")))
    n_jumps = b.jumps.group_by("step").agg(pl.len().alias("jumps"))
    steps = (b.steps.join(by_kind, on="step", how="left").join(n_jumps, on="step", how="left")
             .join(top_rank, on="step", how="left").join(top_kernel, on="step", how="left")
             .with_columns(pl.col("jumps").fill_null(0).cast(pl.UInt32))
             .select("run", "step", "span_ms", "last_rank", "ranks_on_path", "jumps", "compute_ms", "transfer_ms",
                     "wait_ms", "copy_ms", "idle_ms", "top_rank", "top_rank_ms", "top_kernel_ms", "top_kernel"))
    blame = seg.group_by("run", "step", "rank", "kind").agg(_ms(pl.col("dur_ns").sum()).alias("critical_ms"))
    ranks = seg.group_by("run", "rank").agg(
        pl.col("dur_ns").sum().alias("critical_ns"),
        pl.col("dur_ns").filter(pl.col("kind") == "compute").sum().alias("compute_ns"),
        pl.col("step").n_unique().alias("steps_on_path"))
    # a collective's kernel name need not say its type (RCCL and NCCL 2.19+: ncclDevKernel_Generic for all)
    kernels = work.group_by("run", "kind", "name", "collective_type").agg(
        pl.col("dur_ns").sum(), pl.col("step").n_unique().alias("steps_on_path"),
        pl.col("rank").unique().alias("ranks"), pl.col("category").drop_nulls().first())
    return {"steps": steps, "blame": blame, "ranks": ranks, "kernels": kernels}


def _sentences(b: PathBatch, blame: pl.DataFrame) -> dict[tuple[str, int], str]:
    """Each step of the batch in one sentence (:meth:`CriticalPath.sentence`)."""
    import polars as pl

    top_names = (b.segments.filter(pl.col("kind").is_in(_WORK)).group_by("step", "rank", "kind", "name")
                 .agg(pl.col("dur_ns").sum()).sort(["dur_ns", "name"], descending=[True, False])
                 .group_by("step", "rank", "kind", maintain_order=True).first())
    named = {(s, r, k): (n, d) for s, r, k, n, d in top_names.select("step", "rank", "kind", "name", "dur_ns").rows()}
    parts = blame.sort(["step", "critical_ms", "rank", "kind"], descending=[False, True, False, False])
    by_step: dict[int, list[tuple[int, str, float]]] = {}
    for step, rank, kind, ms in parts.select("step", "rank", "kind", "critical_ms").rows():
        by_step.setdefault(step, []).append((rank, kind, ms))
    jumps: dict[int, list[tuple[int, int]]] = {}
    for step, to, wait in b.jumps.select("step", "to_rank", "wait_on_path_ns").rows():
        jumps.setdefault(step, []).append((to, wait))
    out = {}
    for run, step, last_rank, span in b.steps.select("run", "step", "last_rank", "span_ms").rows():
        words = []
        for rank, kind, ms in by_step.get(step, [])[:3]:
            text = f"{_ms_text(ms)} ms is rank {rank}'s {kind.replace('_', ' ')}"
            if (step, rank, kind) in named:
                name, ns = named[(step, rank, kind)]
                text += f" (mostly {short_name(name or '')}, {_ms_text(ns / 1e6)} ms)"
            words.append(text)
        tail = ""
        if step in jumps:
            waited: dict[int, list[int]] = {}
            for to, wait in jumps[step]:
                waited.setdefault(to, []).append(wait)
            to, waits = max(waited.items(), key=lambda kv: (sum(kv[1]), -kv[0]))
            tail = (f"; the path jumps {len(jumps[step])} time(s) at collectives, most to rank {to} "
                    f"({len(waits)} time(s), {_ms_text(sum(waits) / 1e6)} ms of waiting on the path)")
        out[(run, step)] = (f"step {step} took {_ms_text(span)} ms on rank {last_rank}'s clock (the last to end): "
                            + "; ".join(words) + tail)
    return out


def write_critical_path_html(path: str, result: CriticalPath) -> int:
    """The critical path of one run as one self-contained page: its longest selected step's path across
    ranks, the sentence per step, the steps, the ranks and the kernels on the paths. Returns the step drawn."""
    from traceq.report import plots
    from traceq.report.html import page_figure, page_section, write_page
    from traceq.report.result import html_notes, html_table

    steps = result.steps
    runs = steps["run"].unique().to_list()
    if len(runs) != 1:
        raise ConfigError(f"the page draws one run; name one with --run ({', '.join(sorted(runs)[:8])})", param="html")
    run = runs[0]
    drawn = result.longest.sort("order")
    step = int(drawn["step"][0])
    start = int(drawn["path_start_ns"][0])
    sections = [
        page_section(f"Step {step}", page_figure(plots.critical_path_figure(drawn, result.jumps, step, start), "path")
                 + html_notes([result.sentence(step), KIND_NOTE])),
        page_section("Every step", html_table(steps, NAMES) + html_notes([result.sentence(s) for s in steps["step"].to_list()[:50]])),
        page_section("Ranks on the path", html_table(result.ranks())),
        page_section("Kernels and collectives on the path", html_table(result.kernels(30), NAMES) + html_notes(result.notes)),
    ]
    write_page(path, f"traceq critical path: {run}", "traceq critical path", f"run {run} · {steps.height} step(s)",
               sections)
    return step


KIND_NOTE = (
    "the path walks back from the end of the step on the rank whose window ends last: its time goes to what the "
    "device was doing (compute over comm transfer over comm wait over memcpy/memset; idle split host-bound / "
    "sync / other / unknown, unknown where the work ending the idle has no launch event in the trace), and where "
    "a rank waited at a matched collective it jumps to the rank that arrived last, at the moment that rank's "
    "kernel started; device-level: it does not see CPU-side dependencies inside a rank beyond the idle split"
)
