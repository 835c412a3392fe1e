"""The critical path of a step across ranks (README: The critical path): which rank, and which of its work,
made the step as long as it was. :func:`critical_path` selects the steps, runs the walk of
:mod:`traceq.report.path_walk` over them a batch of steps at a time, and reports the paths
(:class:`CriticalPath`: per step, the segments, the jumps, blame by rank and kind, the kernels on them);
:func:`write_critical_path_html` draws one step across the ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb

from traceq import query
from traceq.errors import ConfigError, EmptySelection
from traceq.report import crossrank
from traceq.report.path_walk import Step, Walker
from traceq.report.result import Report
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import polars as pl

VIEWS = ("steps", "segments", "ranks", "kernels")  # what CriticalPath.report shows
# activity rows read per batch of steps (the walk holds one batch at a time)
BATCH_ROWS = 4_000_000


# --------------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class CriticalPath:
    """The critical paths of a run's selected steps (:func:`critical_path`).

    Attributes:
        steps: one row per step: its span on the last-ending rank (``last_rank``), how many ranks the path
            crosses and how often it jumps, its time by kind (ms), the rank and the kernel most on it.
        segments: the paths, one row per segment in time order (``order`` 0 first): rank, device, start_ns
            and end_ns on that rank's clock, path_start_ns on the last-ending rank's, dur_ns, kind, the
            kernel (name, category) or the collective (collective_type, process_group, instance_id).
        jumps: one row per jump: the step, the rank that waited (from_rank) and the one it waited for
            (to_rank, the last to arrive), the collective, and the waiting rank's wait up to the jump
            (wait_on_path_ns: what the late rank's lateness cost the step there).
        notes: how the collectives were matched, what the selection left out.
        selection: the steps selected, in words.
    """

    steps: pl.DataFrame
    segments: pl.DataFrame
    jumps: pl.DataFrame
    notes: list[str]
    selection: str = ""

    def report(self, view: str = "steps", top: int | None = 20) -> Report:
        """One of :data:`VIEWS` as a :class:`~traceq.report.result.Report`: ``steps`` (one row per step, and
        the first 20 steps' sentences after the notes), ``segments`` (the paths), ``ranks``
        (:meth:`ranks`) or ``kernels`` (:meth:`kernels`, ``top`` rows)."""
        if view not in VIEWS:
            raise ConfigError(f"one of {', '.join(VIEWS)}", param="view", value=view)
        notes = list(self.notes)
        if view == "steps":
            table = self.steps
            notes += [self.sentence(s) for s in self.steps["step"].to_list()[:20]]
        elif view == "segments":
            table = self.segments.drop("instance_id", "trace_id")
        else:
            table = self.ranks() if view == "ranks" else self.kernels(top)
        run = self.steps["run"][0] if self.steps.height else ""
        shown = "" if view == "steps" else f", {view}"
        return Report(table, notes, f"critical path of run {run}{shown} ({self.selection})",
                      narrow=("path_start_ns", "category", "process_group", "top_kernel_ms", "copy_ms", "wait_ms",
                              "compute_ms", "waited_for", "steps"))

    def blame(self, by: Sequence[str] = ("rank", "kind")) -> pl.DataFrame:
        """Time on the path per step and ``by`` (columns of :attr:`segments`), in ms, largest first."""
        import polars as pl

        keys = ["run", "step", *by]
        return (self.segments.group_by(keys).agg(_ms(pl.col("dur_ns").sum()).alias("critical_ms"))
                .sort(["run", "step", "critical_ms"], descending=[False, False, True]))

    def ranks(self) -> pl.DataFrame:
        """Per rank over the steps: its time on the path (ms) and share of the paths' time, the steps it is
        on, its compute on the path, and the waiting its lateness cost (``wait_caused_ms``: the waits the
        path jumped through to it)."""
        import polars as pl

        total = self.segments.group_by("run").agg(pl.col("dur_ns").sum().alias("total"))
        per = self.segments.group_by("run", "rank").agg(
            _ms(pl.col("dur_ns").sum()).alias("critical_ms"),
            _ms(pl.col("dur_ns").filter(pl.col("kind") == "compute").sum()).alias("compute_ms"),
            pl.col("step").n_unique().alias("steps_on_path"),
        )
        caused = self.jumps.group_by("run", pl.col("to_rank").alias("rank")).agg(
            _ms(pl.col("wait_on_path_ns").sum()).alias("wait_caused_ms"), pl.len().alias("waited_for"))
        steps = self.steps.group_by("run").agg(pl.len().alias("steps"))
        return (
            per.join(total, on="run").join(steps, on="run").join(caused, on=["run", "rank"], how="left")
            .with_columns((pl.col("critical_ms") * 1e6 / pl.col("total")).alias("share"),
                          pl.col("wait_caused_ms").fill_null(0.0), pl.col("waited_for").fill_null(0))
            .select("run", "rank", "critical_ms", "share", "steps_on_path", "steps", "compute_ms", "waited_for",
                    "wait_caused_ms")
            .sort(["run", "critical_ms", "rank"], descending=[False, True, False])
        )

    def kernels(self, top: int | None = 20) -> pl.DataFrame:
        """The kernels and collectives most on the paths: per (kind, name) their time on the path (ms), its
        share, the steps they are on and the ranks they ran on; idle is left out (``steps`` and
        :meth:`blame` hold it)."""
        import polars as pl

        work = self.segments.filter(~pl.col("kind").str.starts_with("idle"))
        total = max(int(self.segments["dur_ns"].sum()), 1)
        table = (
            work.group_by("run", "kind", "name").agg(
                _ms(pl.col("dur_ns").sum()).alias("critical_ms"),
                pl.col("step").n_unique().alias("steps_on_path"),
                pl.col("rank").unique().sort().alias("ranks"),
                pl.col("category").drop_nulls().first().alias("category"),
                pl.col("collective_type").drop_nulls().first().alias("collective_type"),
            )
            .with_columns((pl.col("critical_ms") * 1e6 / total).alias("share"),
                          pl.col("ranks").list.eval(pl.element().cast(pl.String)).list.join(",").alias("ranks"))
            .sort(["run", "critical_ms", "name"], descending=[False, True, False])
            .select("run", "kind", "critical_ms", "share", "steps_on_path", "ranks", "category", "collective_type",
                    "name")
        )
        return table.head(top) if top else table

    def sentence(self, step: int) -> str:
        """The step's path in one sentence: 'step 12 took 93.0 ms on rank 3's clock: 61.0 ms is rank 3's
        compute (mostly nvjet_... 40.1 ms), ...'."""
        import polars as pl

        row = self.steps.filter(pl.col("step") == step).row(0, named=True)
        parts = self.blame(("rank", "kind")).filter(pl.col("step") == step)
        words = []
        for r in parts.head(3).iter_rows(named=True):
            text = f"{_ms_text(r['critical_ms'])} ms is rank {r['rank']}'s {r['kind'].replace('_', ' ')}"
            if r["kind"] in ("compute", "comm_transfer", "memcpy", "memset"):
                top = (self.segments.filter((pl.col("step") == step) & (pl.col("rank") == r["rank"])
                                            & (pl.col("kind") == r["kind"]))
                       .group_by("name").agg(pl.col("dur_ns").sum()).sort(["dur_ns", "name"], descending=[True, False]))
                if top.height:
                    text += f" (mostly {_short(top['name'][0])}, {_ms_text(top['dur_ns'][0] / 1e6)} ms)"
            words.append(text)
        jumps = self.jumps.filter(pl.col("step") == step)
        tail = ""
        if jumps.height:
            waited = jumps.group_by("to_rank").agg(pl.col("wait_on_path_ns").sum(), pl.len()).sort(
                "wait_on_path_ns", descending=True).row(0, named=True)
            tail = (f"; the path jumps {jumps.height} time(s) at collectives, most to rank {waited['to_rank']} "
                    f"({waited['len']} time(s), {_ms_text(waited['wait_on_path_ns'] / 1e6)} ms of waiting on the path)")
        return (f"step {step} took {_ms_text(row['span_ms'])} ms on rank {row['last_rank']}'s clock (the last to end): "
                + "; ".join(words) + tail)


def _ms_text(ms: float) -> str:
    """ms for a sentence: one decimal from 1 ms, three below (a 3 us segment is not '0.0 ms')."""
    return f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"


def _ms(ns: pl.Expr) -> pl.Expr:
    """ns as ms, rounded to the ns (no float noise in CSV and JSON)."""
    return (ns / 1e6).round(6)


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def critical_path(
    db: Warehouse = DEFAULT_DB,
    *,
    run: str | None = None,
    selection: StepSelection = StepSelection(),
    steps: Sequence[int] | None = None,
) -> CriticalPath:
    """The critical path of every selected step of ``run`` (README: The critical path).

    Args:
        db: the warehouse.
        run: the run (may be left out when the warehouse holds one).
        selection: which steps (the open last step is left out by default, as everywhere).
        steps: only these step numbers, within the selection.
    """
    import polars as pl

    from traceq.report.metrics import nothing_selected, require_runs
    from traceq.report.notes import selection_notes

    with opened(db) as con:
        require_runs(con, [run] if run else None)
        held = [r for (r,) in con.execute("select distinct run from traces order by run").fetchall()]
        if run is None:
            if len(held) > 1:
                raise ConfigError(f"the warehouse holds {len(held)} runs: name one with --run ({', '.join(held[:8])}"
                                  f"{', ...' if len(held) > 8 else ''})", param="run")
            run = held[0]
        windows = _windows(con, run, selection)
        if steps is not None:
            wanted = sorted(set(steps))
            missing = [s for s in wanted if s not in set(windows["step"].to_list())]
            if missing:
                have = windows["step"].unique().sort().to_list()
                raise EmptySelection(
                    f"run {run}: no step {', '.join(map(str, missing))} in the selection ({selection.describe()}); "
                    f"it has {_ranges(have) if have else 'none'}")
            windows = windows.filter(pl.col("step").is_in(wanted))
        if windows.height == 0:
            raise EmptySelection(nothing_selected(con, selection, [run]))
        with crossrank.matched(con, [run]) as table:
            walker = Walker(con, run, table)
            for batch in _batches(con, run, windows):
                walker.batch(_bounds(batch))
                for step in _step_starts(run, batch):
                    walker.walk(step)
            notes = [*crossrank.matching_notes(con, [run]), *selection_notes(con, selection, [run])]
    return _report(run, windows, walker, notes, selection.describe())


def _windows(con: duckdb.DuckDBPyConnection, run: str, selection: StepSelection) -> pl.DataFrame:
    """The run's selected device windows with their wall-clock offsets (windows of length 0 left out)."""
    windows = query.run(con, "selected_windows", query_params(selection, [run]))
    offsets = query.run(con, "wall_offsets")  # one row per trace; the join keeps the run's
    rows = (windows.join(offsets, "trace_id")
            .filter("end_ns > start_ns")
            .select("trace_id, rank, device, step, start_ns, end_ns, offset_ns")
            .order("step, rank, device"))
    return to_polars(rows)


def _batches(con: duckdb.DuckDBPyConnection, run: str, windows: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """The windows in batches of consecutive steps whose activity is about :data:`BATCH_ROWS` rows."""
    import polars as pl

    events = con.execute(
        "select coalesce(sum(n_gpu_events + n_host_events), 0) from traces where run = ?", [run]).fetchall()[0][0]
    all_steps = con.execute(
        "select count(distinct step) from steps inner join traces using (trace_id) where run = ?", [run]).fetchall()[0][0]
    per_step = max(events / max(all_steps, 1), 1)
    size = max(1, int(BATCH_ROWS // per_step))
    steps = windows["step"].unique().sort().to_list()
    for i in range(0, len(steps), size):
        yield windows.filter(pl.col("step").is_in(steps[i:i + size]))


def _bounds(batch: pl.DataFrame) -> dict[int, tuple[int, int]]:
    """Per trace, the time range to read for a batch of windows: theirs, widened by the longest of them on
    each side (the walk may go before a jumped-to rank's window; beyond that it reads the whole trace)."""
    import polars as pl

    spans = batch.group_by("trace_id").agg(
        pl.col("start_ns").min(), pl.col("end_ns").max(), (pl.col("end_ns") - pl.col("start_ns")).max().alias("w"))
    return {int(r["trace_id"]): (int(r["start_ns"] - r["w"]), int(r["end_ns"] + r["w"])) for r in spans.iter_rows(named=True)}


def _step_starts(run: str, batch: pl.DataFrame) -> Iterator[Step]:
    """Per step of the batch, the window that ends last on the wall clock (ties: lowest rank, device)."""
    import polars as pl

    last = (batch.with_columns((pl.col("end_ns") + pl.col("offset_ns")).alias("wall_end"))
            .sort(["step", "wall_end", "rank", "device"], descending=[False, True, False, False])
            .group_by("step", maintain_order=True).first())
    for r in last.iter_rows(named=True):
        yield Step(run, int(r["step"]), (int(r["trace_id"]), int(r["rank"]), int(r["device"])),
                   int(r["start_ns"]), int(r["end_ns"]))


def _ranges(values: list[int]) -> str:
    """Step numbers as text: '3..9' where they run on, else '1, 5, 9' (the first eight)."""
    if len(values) > 1 and values[-1] - values[0] == len(values) - 1:
        return f"{values[0]}..{values[-1]}"
    return ", ".join(map(str, values[:8])) + (f" and {len(values) - 8} more" if len(values) > 8 else "")


SEGMENT_SCHEMA = {
    "run": "String", "step": "Int64", "order": "Int64", "rank": "Int64", "device": "Int64", "trace_id": "Int64",
    "start_ns": "Int64", "end_ns": "Int64", "path_start_ns": "Int64", "kind": "String", "name": "String",
    "category": "String", "collective_type": "String", "process_group": "String", "instance_id": "UInt64",
}
JUMP_SCHEMA = {
    "run": "String", "step": "Int64", "from_rank": "Int64", "to_rank": "Int64", "path_ns": "Int64",
    "collective_type": "String", "process_group": "String", "instance_id": "UInt64", "name": "String",
    "wait_on_path_ns": "Int64",
}


def _frame(rows: list[dict[str, Any]], schema: dict[str, str]) -> pl.DataFrame:
    import polars as pl

    types = {c: getattr(pl, t) for c, t in schema.items()}
    return pl.DataFrame([{c: r.get(c) for c in schema} for r in rows], schema=types, orient="row") if rows \
        else pl.DataFrame(schema=types)


def _report(run: str, windows: pl.DataFrame, walker: Walker, notes: list[str], selection: str) -> CriticalPath:
    import polars as pl

    segments = _frame(walker.segments, SEGMENT_SCHEMA).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    jumps = _frame(walker.jumps, JUMP_SCHEMA)
    last = {(s.step): s for s in _step_starts(run, windows)}
    by_kind = segments.group_by("step").agg(
        *[_ms(pl.col("dur_ns").filter(pl.col("kind").is_in(kinds)).sum()).alias(f"{label}_ms")
          for label, kinds in (("compute", ["compute"]), ("transfer", ["comm_transfer"]), ("wait", ["comm_wait"]),
                               ("copy", ["memcpy", "memset"]),
                               ("idle", ["idle_host_bound", "idle_sync", "idle_other"]))],
        pl.col("rank").n_unique().alias("ranks_on_path"),
    )
    top_rank = (segments.group_by("step", "rank").agg(pl.col("dur_ns").sum())
                .sort(["step", "dur_ns", "rank"], descending=[False, True, False]).group_by("step", maintain_order=True)
                .first().select("step", pl.col("rank").alias("top_rank"), _ms(pl.col("dur_ns")).alias("top_rank_ms")))
    top_kernel = (segments.filter(~pl.col("kind").str.starts_with("idle")).group_by("step", "name").agg(pl.col("dur_ns").sum())
                  .sort(["step", "dur_ns", "name"], descending=[False, True, False]).group_by("step", maintain_order=True)
                  .first().select("step", pl.col("name").alias("top_kernel"), _ms(pl.col("dur_ns")).alias("top_kernel_ms")))
    n_jumps = jumps.group_by("step").agg(pl.len().alias("jumps"))
    steps = pl.DataFrame(
        [{"run": run, "step": s.step, "last_rank": s.key[1], "span_ms": round((s.end_ns - s.start_ns) / 1e6, 6)}
         for s in last.values()],
        schema={"run": pl.String, "step": pl.Int64, "last_rank": pl.Int64, "span_ms": pl.Float64},
    )
    steps = (steps.join(by_kind, on="step", how="left").join(n_jumps, on="step", how="left")
             .join(top_rank, on="step", how="left").join(top_kernel, on="step", how="left")
             .with_columns(pl.col("jumps").fill_null(0)).sort("step")
             .select("run", "step", "span_ms", "last_rank", "ranks_on_path", "jumps", "compute_ms", "transfer_ms",
                     "wait_ms", "copy_ms", "idle_ms", "top_rank", "top_rank_ms", "top_kernel_ms", "top_kernel"))
    order = ["run", "step", "order", "rank", "device", "trace_id", "start_ns", "end_ns", "dur_ns", "path_start_ns", "kind",
             "name", "category", "collective_type", "process_group", "instance_id"]
    return CriticalPath(steps, segments.select(order), jumps, notes, selection)


def write_critical_path_html(path: str, result: CriticalPath, step: int | None = None) -> int:
    """The critical path as one self-contained page: the step's path across ranks (``step``; default: the
    longest step), the sentence per step, the steps, the ranks and the kernels on the paths. Returns the
    step drawn."""
    import polars as pl

    from traceq.report import plots
    from traceq.report.html import _figure, _section, write_page
    from traceq.report.result import html_notes, html_table

    steps = result.steps
    if step is None:
        step = int(steps.sort(["span_ms", "step"], descending=[True, False])["step"][0])
    start = result.segments.filter((pl.col("step") == step) & (pl.col("order") == 0))["path_start_ns"][0]
    run = steps["run"][0]
    sections = [
        _section(f"Step {step}", _figure(plots.critical_path_figure(result.segments, result.jumps, step, start), "path")
                 + html_notes([result.sentence(step), KIND_NOTE])),
        _section("Every step", html_table(steps) + html_notes([result.sentence(s) for s in steps["step"].to_list()[:50]])),
        _section("Ranks on the path", html_table(result.ranks())),
        _section("Kernels and collectives on the path", html_table(result.kernels(30)) + html_notes(result.notes)),
    ]
    write_page(path, f"traceq critical path: {run}", "traceq critical path", f"run {run} · {steps.height} step(s)",
               sections)
    return step


KIND_NOTE = (
    "the path walks back from the end of the step on the rank whose window ends last: its time goes to what the "
    "device was doing (compute over comm transfer over comm wait over memcpy/memset; idle split host-bound / "
    "sync / other), and where a rank waited at a matched collective it jumps to the rank that arrived last, at "
    "the moment that rank's kernel started; device-level: it does not see CPU-side dependencies inside a rank "
    "beyond the idle split"
)
