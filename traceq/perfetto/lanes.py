"""Lane packing: the slices of one stream (or step track) spread over as few tracks as keep any two
slices of a track from overlapping (Perfetto's importer drops slices that overlap on one track), and
the counts of what was written."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceq.perfetto.pftrace import TraceWriter
    from traceq.perfetto.plan import Process


@dataclass
class Counts:
    """What was written: device slices, extra tracks for overlapping slices, counter values, and per
    (run, rank) the slices on extra tracks (for the note)."""

    slices: int = 0
    overlap_tracks: int = 0
    counter_values: int = 0
    overlaps: dict[tuple[str, int], int] = field(default_factory=dict)  # (run, rank) -> slices on extra tracks

    def notes(self) -> list[str]:
        """The note naming the ranks whose slices went on extra tracks (none when no slice did)."""
        if not self.overlaps:
            return []
        where = ", ".join(f"run {run} rank {rank}: {n}" for (run, rank), n in sorted(self.overlaps.items())[:8])
        more = f" and {len(self.overlaps) - 8} more ranks" if len(self.overlaps) > 8 else ""
        return [f"slices that overlap an earlier one on their stream (or step track) are on extra tracks named "
                f"'... (overlap N)', where Perfetto keeps them: {where}{more}"]


class Lanes:
    """The tracks of one stream (or step track): each slice goes on the first lane whose last slice has
    ended when it starts (slices in start order), so that no two slices of a track overlap; a lane
    after the first is a track of its own, '<name> (overlap N)', made when first needed."""

    def __init__(self, writer: TraceWriter, p: Process, parent: int, name: str, order: Iterator[int],
                 description: str | None, counts: Counts) -> None:
        self._writer, self._p, self._parent, self._name = writer, p, parent, name
        self._order, self._description, self._counts = order, description, counts
        self._ends: list[int] = []
        self._tracks: list[int] = []

    def slice(self, ts: int, dur: int, name: str, category: str, args: Sequence[tuple[str, Any]], **flows: int | None) -> None:
        lane = next((i for i, end in enumerate(self._ends) if end <= ts), len(self._ends))
        if lane == len(self._ends):
            self._ends.append(ts + dur)
            self._tracks.append(self._writer.track(
                self._parent, self._name if lane == 0 else f"{self._name} (overlap {lane})", next(self._order),
                self._description if lane == 0 else f"slices of {self._name} that overlap an earlier one still open there"))
            self._counts.overlap_tracks += lane > 0
        self._ends[lane] = ts + dur
        if lane:
            key = (self._p.run, self._p.rank)
            self._counts.overlaps[key] = self._counts.overlaps.get(key, 0) + 1
        self._writer.slice(self._tracks[lane], ts, dur, name, category, args, **flows)
