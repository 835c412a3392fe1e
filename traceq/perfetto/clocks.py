"""Each rank's place on its run's clock (docs/how-to/perfetto.md): the offset the
clock-skew estimate of ``traceq check`` gives a rank's wall-clock times, or why there is none, and the
notes that say so."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from traceq.perfetto.ranks import rank_ranges

_ONE_RANK = "the run holds one rank"


@dataclass(frozen=True)
class ClockOffset:
    """How one rank was placed on its run's clock.

    Args:
        run, rank: the rank.
        offset_ns: added to the rank's wall-clock times (= -skew_ns; 0 without an estimate).
        status: reference | estimated | no estimate.
        reason: why there is no estimate (empty otherwise).
        ref_rank: the run's reference rank (None: none).
        skew_ns: the rank's clock minus the reference's (+: ahead), None without an estimate.
        n_matched: collectives behind the estimate.
    """

    run: str
    rank: int
    offset_ns: int
    status: str
    reason: str = ""
    ref_rank: int | None = None
    skew_ns: int | None = None
    n_matched: int = 0

    def label(self) -> str:
        """One line for the process's labels, e.g. "clock: offset -700.000 us onto rank 0's clock (skew
        +700.000 us over 2 collectives)"."""
        if self.status == "reference":
            return "clock: reference (offset 0)"
        if self.status == "estimated":
            return (f"clock: offset {self.offset_ns / 1000:+,.3f} us onto rank {self.ref_rank}'s clock "
                    f"(skew {self.skew_ns / 1000:+,.3f} us over {self.n_matched} collectives)")
        return f"clock: no estimate ({self.reason}); on its own wall clock"


def clock_offset(run: str, rank: int, r: dict[str, Any]) -> ClockOffset:
    ref, skew, n = r["ref_rank"], r["skew_ns"], r["n_matched"] or 0
    if rank == ref:
        return ClockOffset(run, rank, 0, "reference", ref_rank=ref)
    if skew is not None:
        return ClockOffset(run, rank, -skew, "estimated", ref_rank=ref, skew_ns=skew, n_matched=n)
    if r["run_ranks"] <= 1:
        why = _ONE_RANK
    elif rank < 0:
        why = "the trace names no rank"
    elif ref is None:
        why = "no collective of the run matched across ranks"
    else:
        why = f"no collective matched with rank {ref}"
    return ClockOffset(run, rank, 0, "no estimate", why, ref_rank=ref)


def clock_notes(clocks: list[ClockOffset]) -> list[str]:
    """Per run: how many ranks the clock-skew estimate moved, and which ranks have none and why; the runs
    of one rank in one line."""
    notes = []
    alone = [c.run for c in clocks if c.reason == _ONE_RANK]
    if alone:
        notes.append(f"{len(alone)} run(s) of one rank, with no other clock to align to: {', '.join(alone)}")
    for run, group in itertools.groupby((c for c in clocks if c.reason != _ONE_RANK), lambda c: c.run):
        group = list(group)
        moved = [c for c in group if c.status == "estimated"]
        missing = [c for c in group if c.status == "no estimate"]
        ref = next((c.ref_rank for c in group if c.ref_rank is not None), None)
        parts = []
        if moved:
            far = max(moved, key=lambda c: abs(c.offset_ns))
            parts.append(f"{len(moved)} rank(s) placed on rank {ref}'s clock by the clock-skew estimate of traceq "
                         f"check (largest offset: rank {far.rank}, {far.offset_ns / 1000:+,.3f} us)")
        for reason, same in itertools.groupby(sorted(missing, key=lambda c: c.reason), lambda c: c.reason):
            parts.append(f"no clock estimate for rank {rank_ranges([c.rank for c in same])} ({reason}): on its own wall clock")
        if parts:
            notes.append(f"run {run}: " + "; ".join(parts))
    return notes
