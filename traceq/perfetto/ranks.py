"""The ranks an export writes: a rank list from the command line ("0-7", "0,2,5"), the step rows of
those ranks, and a list of ranks written back as ranges ("0-2, 5")."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from traceq.errors import ConfigError, EmptySelection

if TYPE_CHECKING:
    import polars as pl

MAX_RANKS = 1 << 20  # more than any run's (2048 in the study), far fewer than a list can hold
_RANKS = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")


def parse_ranks(ranks: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """Ranks from CLI text ("0-7", "0,2,5", "0-3,8") or a sequence; None: every rank."""
    if ranks is None:
        return None
    if not isinstance(ranks, str):
        return tuple(sorted({int(r) for r in ranks}))
    out: set[int] = set()
    for part in ranks.split(","):
        m = _RANKS.match(part)
        if not m:
            raise ConfigError("expected rank numbers and ranges, e.g. 0-7 or 0,2,5", param="ranks", value=ranks)
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ConfigError(f"the range {part.strip()} ends before it starts", param="ranks", value=ranks)
        if hi - lo >= MAX_RANKS:
            raise ConfigError(f"the range {part.strip()} holds over {MAX_RANKS:,} ranks; no run has that many",
                              param="ranks", value=ranks)
        out.update(range(lo, hi + 1))
        if len(out) > MAX_RANKS:
            raise ConfigError(f"over {MAX_RANKS:,} ranks; no run has that many", param="ranks", value=ranks)
    return tuple(sorted(out))


def only_ranks(rows: pl.DataFrame, wanted: tuple[int, ...] | None, given: object) -> tuple[pl.DataFrame, list[str]]:
    """``rows`` of the ranks asked for; EmptySelection (naming the ranks held) when none is there."""
    import polars as pl

    if wanted is None:
        return rows, []
    held = rows.select("run", "rank").unique().sort("run", "rank")
    kept = rows.filter(pl.col("rank").is_in(list(wanted)))
    if kept.height == 0:
        listing = "; ".join(f"run {run}: {rank_ranges(g['rank'].to_list())}" for (run,), g in held.group_by("run", maintain_order=True))
        raise EmptySelection(f"no selected step on these ranks; the selected steps are on {listing}",
                             param="ranks", value=given)
    notes = []
    for (run,), g in held.group_by("run", maintain_order=True):
        missing = sorted(set(wanted) - set(g["rank"].to_list()))
        if missing and len(missing) < len(wanted):
            notes.append(f"run {run}: no selected step on rank {rank_ranges(missing)}")
    return kept, notes


def rank_ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts = []
    for _, group in itertools.groupby(enumerate(sorted(ranks)), lambda x: x[1] - x[0]):
        g = [r for _, r in group]
        parts.extend([f"{g[0]}-{g[-1]}"] if len(g) > 1 and g[0] >= 0 else map(str, g))
    return ", ".join(parts)
