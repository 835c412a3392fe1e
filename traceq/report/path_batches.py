"""The critical paths of the selected steps, a batch of steps at a time (docs/explanation/across-ranks.md: the critical path):
:func:`walking` selects the steps of each run, sizes the batches, and walks them
(:class:`~traceq.report.path_walk.Walker`) as its iterator reaches them, yielding each batch's segments
and jumps (:class:`PathBatch`) while the connection is open. What streams the segments (``traceq
critical-path --segments --format csv``, the Perfetto track), and what :func:`traceq.report.critical_path.
critical_path` sums up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

from traceq import query
from traceq.errors import EmptySelection
from traceq.report import crossrank
from traceq.report.path_walk import HELD_ROWS, Step, Walker
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

# a batch holds 1/BATCH_PARTS of the rows the walk may hold (held_rows): a rank the walk reaches is read
# over the batch once, and that many ranks' batches fit before the least recently walked is dropped. 48:
# about 10 real steps a batch, where memory stops growing with the steps (16: 30 steps, +40 MB, no faster)
BATCH_PARTS = 48


@dataclass(frozen=True)
class PathBatch:
    """The paths of a batch of consecutive steps of one run: ``steps`` (run, step, last_rank, span_ms),
    ``segments`` and ``jumps`` (as :class:`CriticalPath` describes them)."""

    run: str
    steps: pl.DataFrame
    segments: pl.DataFrame
    jumps: pl.DataFrame


@contextmanager
def walking(
    db: Warehouse = DEFAULT_DB, *, runs: Sequence[str] | None = None, selection: StepSelection = StepSelection(),
    batch_rows: int | None = None, held_rows: int | None = None, progress: Callable[[int, int], None] | None = None,
) -> Iterator[tuple[list[str], Iterator[PathBatch]]]:
    """The critical paths of the selected steps of ``runs`` (None: every run), for the block: (notes,
    batches). The batches come in run and step order; each is walked when the iterator reaches it.
    EmptySelection when no run keeps a step.

    ``held_rows``: the activity rows the walk holds at most (default: :func:`held_rows`; the least
    recently walked ranks are dropped beyond it, and read again if the walk comes back); ``batch_rows``:
    a batch holds as many consecutive steps as make about this many activity rows on a rank (at least
    one step; default: held_rows / :data:`BATCH_PARTS`): a rank the walk reaches is read over the batch
    in one statement. Neither changes the paths, only the memory and the number of reads. ``progress``:
    called after each batch with (steps walked, steps selected)."""
    from traceq.report.metrics import nothing_selected, require_runs
    from traceq.report.notes import selection_notes

    held_rows = held_rows or default_held_rows()
    batch_rows = batch_rows or max(held_rows // BATCH_PARTS, 1)
    with opened(db) as con:
        require_runs(con, runs)
        held = [r for (r,) in con.execute("select distinct run from traces order by run").fetchall()]
        chosen = list(dict.fromkeys(runs)) if runs else held
        windows = _windows(con, chosen, selection)
        if windows.height == 0:
            raise EmptySelection(nothing_selected(con, selection, chosen))
        walked = [r for r in chosen if r in set(windows["run"].to_list())]
        with crossrank.matched(con, walked) as table:
            notes = [*crossrank.matching_notes(con, walked), *selection_notes(con, selection, chosen)]
            yield notes, _batches(con, walked, windows, table, batch_rows, held_rows, progress)


def default_held_rows() -> int:
    """The activity rows the walk holds at most: :data:`~traceq.report.path_walk.HELD_ROWS`, fewer under a
    lower TRACEQ_MEMORY_LIMIT (a held row costs about 330 bytes; the walk takes an eighth of the limit,
    DuckDB and the rest of the process the remainder)."""
    from traceq.store.warehouse import report_memory_limit

    return max(min(HELD_ROWS, _bytes(report_memory_limit()) // 8 // 330), 10_000)


def _bytes(size: str) -> int:
    """'2GB', '512MB', '1.5GiB' as bytes."""
    import re

    number, unit = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", size).groups()
    scale = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
             "gib": 2**30, "tib": 2**40}.get(unit.lower(), 10**9)
    return int(float(number) * scale)


def _batches(con: duckdb.DuckDBPyConnection, runs: list[str], windows: pl.DataFrame, instances: str,
             batch_rows: int, held_rows: int, progress: Callable[[int, int], None] | None) -> Iterator[PathBatch]:
    import polars as pl

    total, done = windows.select("run", "step").n_unique(), 0

    for run in runs:
        mine = windows.filter(pl.col("run") == run)
        walker = Walker(con, run, instances, _islands(con, run), held_rows)
        for batch in _in_batches(con, run, mine, batch_rows):
            starts = list(_step_starts(run, batch))
            segments, jumps = walker.walk(_bounds(batch), starts)
            steps = pl.DataFrame(
                [{"run": run, "step": s.step, "last_rank": s.key[1], "span_ms": round((s.end_ns - s.start_ns) / 1e6, 6)}
                 for s in starts],
                schema={"run": pl.String, "step": pl.Int64, "last_rank": pl.Int64, "span_ms": pl.Float64})
            done += steps.height
            if progress is not None:
                progress(done, total)
            yield PathBatch(run, steps, segments, walker.jump_names(jumps))


def _windows(con: duckdb.DuckDBPyConnection, runs: list[str], selection: StepSelection) -> pl.DataFrame:
    """The runs' selected device windows with their wall-clock offsets (windows of length 0 left out)."""
    windows = query.run(con, "selected_windows", query_params(selection, runs))
    offsets = query.run(con, "wall_offsets")  # one row per trace; the join keeps the runs'
    rows = (windows.join(offsets, "trace_id").join(con.table("traces").select("trace_id, run"), "trace_id")
            .filter("end_ns > start_ns")
            .select("run, trace_id, rank, device, step, start_ns, end_ns, offset_ns")
            .order("run, step, rank, device"))
    return to_polars(rows)


def _islands(con: duckdb.DuckDBPyConnection, run: str) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """The run's sync islands (sql/sync_islands.sql) per (trace_id, rank), read once for the walk."""
    import numpy as np

    islands = to_polars(query.run(con, "sync_islands", query_params(runs=[run]))).sort("start_ns")
    return {(int(t), int(r)): (part["start_ns"].to_numpy().astype(np.int64), part["end_ns"].to_numpy().astype(np.int64))
            for (t, r), part in islands.partition_by("trace_id", "rank", as_dict=True).items()}


def _in_batches(con: duckdb.DuckDBPyConnection, run: str, windows: pl.DataFrame, rows_per_batch: int,
                ) -> Iterator[pl.DataFrame]:
    """The windows in batches of consecutive steps of about ``rows_per_batch`` activity rows a rank."""
    import polars as pl

    rows, steps = con.execute(
        "select max(greatest(n_gpu_events, case when n_gpu_events = 0 then n_host_events else 0 end)), "
        "max(n) from traces inner join (select trace_id, count(distinct step) as n from steps group by all) "
        "using (trace_id) where run = ?", [run]).fetchall()[0]
    size = max(1, int(rows_per_batch // max((rows or 0) / max(steps or 1, 1), 1)))
    numbers = windows["step"].unique().sort().to_list()
    for i in range(0, len(numbers), size):
        yield windows.filter(pl.col("step").is_in(numbers[i:i + size]))


def _bounds(batch: pl.DataFrame) -> dict[int, tuple[int, int]]:
    """Per trace, the time range to stage for a batch of windows: theirs, widened by twice the longest of
    them on each side (the walk may go before a jumped-to rank's window; beyond that it reads the
    warehouse)."""
    import polars as pl

    spans = batch.group_by("trace_id").agg(
        pl.col("start_ns").min(), pl.col("end_ns").max(), (pl.col("end_ns") - pl.col("start_ns")).max().alias("w"))
    return {int(r["trace_id"]): (int(r["start_ns"] - 2 * r["w"]), int(r["end_ns"] + 2 * r["w"]))
            for r in spans.iter_rows(named=True)}


def _step_starts(run: str, batch: pl.DataFrame) -> Iterator[Step]:
    """Per step of the batch, the window that ends last on the wall clock (ties: lowest rank, device)."""
    import polars as pl

    last = (batch.with_columns((pl.col("end_ns") + pl.col("offset_ns")).alias("wall_end"))
            .sort(["step", "wall_end", "rank", "device"], descending=[False, True, False, False])
            .group_by("step", maintain_order=True).first())
    for r in last.iter_rows(named=True):
        yield Step(run, int(r["step"]), (int(r["trace_id"]), int(r["rank"]), int(r["device"])),
                   int(r["start_ns"]), int(r["end_ns"]))
