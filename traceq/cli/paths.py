"""``traceq critical-path``: which rank, and which of its work, made each step as long as it was; the
steps walked a batch at a time (:mod:`traceq.report.path_batches`), the segments streamed as CSV or JSON."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from traceq.cli.base import (
    DbOption,
    Format,
    FormatOption,
    FullNamesOption,
    RunOption,
    app,
    echo,
    emit,
    resolved,
    emit_stream,
    selecting_steps,
    show,
    show_notes, shown)
from traceq.errors import ConfigError
from traceq.store.warehouse import DEFAULT_DB


@app.command("critical-path")
@selecting_steps
def critical_path(
    db: DbOption = Path(DEFAULT_DB),
    run: RunOption = None,
    segments: Annotated[bool, typer.Option("--segments", help="The path itself: one row per segment (rank, start, end, kind, kernel, collective). With --format csv or json every segment, written as it is walked; as a table the first screen.")] = False,
    ranks: Annotated[bool, typer.Option("--ranks", help="Per rank over the steps: time on the path, share, steps on it, the waiting its lateness cost.")] = False,
    kernels: Annotated[bool, typer.Option("--kernels", help="The kernels and collectives most on the paths.")] = False,
    top: Annotated[int, typer.Option(help="Rows of --kernels.", min=1, max=10_000_000)] = 20,
    html: Annotated[Optional[Path], typer.Option(callback=resolved, help="Also write the path of one run as a self-contained HTML page: ranks as lanes, the path across them in the longest selected step (--steps 12:12 draws step 12).")] = None,
    fmt: FormatOption = Format.table,
    full_names: FullNamesOption = False,
    selection: Any = None,
) -> None:
    """Which rank, and which of its work, made each step as long as it was: the critical path across ranks.

    Per step, the walk starts at the end of the step on the rank whose device window ends last and goes
    back to the step's start. On a rank, time goes to what its device was doing: compute (with the
    kernel), the transfer part of a collective, memcpy/memset, or idle (host-bound, sync, other). Where
    the rank was waiting at a matched collective, the path jumps to the rank that arrived last, at the
    moment its kernel started, and goes on there. The segments add up to the step's span.

    Per step (default): span, the last rank to end, ranks crossed, jumps, time by kind (ms), the rank and
    the kernel most on the path, and a sentence saying it. Steps are walked a batch at a time: memory
    stays flat however many steps and ranks are selected.

    Examples:

      traceq critical-path --run job1

      traceq critical-path --run job1 --steps 12 --segments

      traceq critical-path --run job1 --segments --format csv > path.csv

      traceq critical-path --run job1 --ranks

      traceq critical-path --run job1 --html cp.html
    """
    from traceq.report.critical_path import critical_path as compute
    from traceq.report.critical_path import write_critical_path_html

    if sum((segments, ranks, kernels)) > 1:
        raise ConfigError("give one of --segments, --ranks and --kernels")
    with steps_walked() as progress:
        if segments and html is None:
            _stream_segments(db, run, selection, fmt, progress, full_names)
            return
        result = compute(db, runs=run, selection=selection, segments=segments, progress=progress)
    drawn = write_critical_path_html(str(html), result) if html is not None else None
    show(result.report("segments" if segments else "ranks" if ranks else "kernels" if kernels else "steps", top), fmt,
         full_names)
    if drawn is not None:
        echo(f"wrote {shown(html)} (step {drawn})", err=True)


SCREEN_ROWS = 40  # segments a table shows (the rest: --format csv or json)


@contextmanager
def steps_walked() -> Iterator[Callable[[int, int], None]]:
    """A progress bar of the steps walked, on stderr where it is a terminal (else nothing), gone when the
    block ends."""
    import sys

    if not sys.stderr.isatty():
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("critical path"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("walk", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _stream_segments(db: Path, run: list[str] | None, selection: Any, fmt: Format,
                     progress: Callable[[int, int], None], full_names: bool = False) -> None:
    """``critical-path --segments``: every segment as CSV or JSON, batch by batch as the walk makes them;
    as a table the first screen, and how many there are."""
    import polars as pl

    from traceq.report.critical_path import NAMES, NARROW, path_title
    from traceq.report.path_batches import walking

    with walking(db, runs=run, selection=selection, progress=progress) as (notes, batches):
        frames = (b.segments.drop("instance_id", "trace_id") for b in batches)
        if fmt is not Format.table:
            show_notes(notes, fmt)
            emit_stream(frames, fmt)
            return
        first: list[pl.DataFrame] = []
        total, runs = 0, []
        for frame in frames:
            if sum(f.height for f in first) < SCREEN_ROWS:
                first.append(frame.head(SCREEN_ROWS))
            total += frame.height
            runs += [r for r in frame["run"].unique(maintain_order=True).to_list() if r not in runs]
    screen = pl.concat(first).head(SCREEN_ROWS)
    if total > screen.height:
        notes.append(f"{total:,} segments: the first {screen.height} are shown; --format csv (or json) writes "
                     "all of them, as the walk makes them")
    echo(path_title(runs, "segments", selection.describe()), err=True)
    show_notes(notes, fmt)
    emit(screen, fmt, NARROW, () if full_names else NAMES)
