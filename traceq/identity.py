"""Trace identity over rows, decided once for every path that stores or reports traces: the local ingest
(:mod:`traceq.ingest.write`), the Parquet import (:mod:`traceq.store.export`), the Dask path
(:mod:`traceq.ingest.cluster`) and the Perfetto engine (:mod:`traceq.perfetto.engine`). Each gathers its rows
as it can (SQL over the warehouse, a Parquet directory, Perfetto's steps); the decision and its wording are here.

- A (run, rank, step) comes from one file, so that no step is counted twice (the same trace as .json and
  .json.gz, or two jobs in one run): :func:`overlaps` refuses a file whose steps of a rank its own run already
  holds from another file. Files of one rank with other steps (the collectors' profiling cycles) are fine.
- A file that names no rank gets a rank of its own in its run: -1, -2, ... below the lowest its run holds
  (:func:`rankless_ranks`), per run, whatever other runs hold.

Which rank and run a file names is read from the file (:mod:`traceq.ingest.identity`); pure functions here,
no I/O, so that every engine can import them (a leaf).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from traceq.catalog import WHOLE_TRACE_STEP
from traceq.errors import ConfigError

# where a file's rank came from when the user can give it another (rank sources of traceq.ingest.identity)
GIVEN_RANKS = ("option", "file name")


@dataclass(frozen=True)
class Claim:
    """One (run, rank, step) a file holds: a row of its steps. ``trace`` tells files apart (a trace id, or
    the file's place in a call), ``path`` names it."""

    trace: Hashable
    path: str
    run: str
    rank: int
    step: int


@dataclass(frozen=True)
class Overlap:
    """A file refused: ``steps`` of ``rank`` in ``run`` are held already by ``other``."""

    trace: Hashable
    path: str
    other: str
    run: str
    rank: int
    steps: tuple[int, ...]  # sorted; those ``other`` holds
    rank_given: bool = False  # the file's rank came from --rank or its file name: another may be given

    def statement(self) -> str:
        """What is wrong, the same words on every path: the file, the run, the steps, the file holding them."""
        return (f"{self.path}: run {self.run} already holds {held_steps(self.steps)} of rank {self.rank} from "
                f"{self.other}; the same trace twice, or traces of two jobs in one run?")

    def message(self) -> str:
        """The refusal of a file given on the command line (ingest, ingest-cluster, the Perfetto engine)."""
        fix = "Give it another run (--name NAME)"
        return f"{self.statement()} {fix}{' or another rank (--rank N)' if self.rank_given else ''}"

    def import_message(self, export: str) -> str:
        """The refusal of a Parquet import that would add the file (the whole import is refused)."""
        return f"{self.statement()} Nothing of {export} was imported; import it into another warehouse (--db)"

    def error(self) -> ConfigError:
        return ConfigError(self.message())


def held_steps(steps: Sequence[int]) -> str:
    """Sorted steps of one rank in words: the whole timeline, one step, a range, or a count in a range."""
    lo, hi, n = steps[0], steps[-1], len(steps)
    if n == 1:
        return "the whole timeline (no steps)" if lo == WHOLE_TRACE_STEP else f"step {lo}"
    return f"steps {lo}..{hi}" if hi - lo + 1 == n else f"{n} steps in {lo}..{hi}"


def overlaps(held: Iterable[Claim], new: Iterable[Claim], rank_given: Iterable[Hashable] = ()) -> list[Overlap]:
    """The files of ``new`` refused, in the order they first appear: a file is refused when its run holds one
    of its (rank, step) already, from ``held`` (committed traces) or from a file of ``new`` before it that was
    not refused. A refused file's steps hold nothing. The overlap named is that of its lowest rank in
    clash, and the file holding its lowest step there. ``rank_given``: the traces whose rank came from
    --rank or their file name (:data:`GIVEN_RANKS`)."""
    taken: dict[tuple[str, int, int], tuple[Hashable, str]] = {}
    for c in held:
        taken.setdefault((c.run, c.rank, c.step), (c.trace, c.path))
    files: dict[Hashable, list[Claim]] = {}
    for c in new:
        files.setdefault(c.trace, []).append(c)
    given = set(rank_given)
    refused = []
    for trace, claims in files.items():
        clash = sorted((c.rank, c.step, c.run) for c in claims if (c.run, c.rank, c.step) in taken
                       and taken[(c.run, c.rank, c.step)][0] != trace)
        if not clash:
            for c in claims:
                taken.setdefault((c.run, c.rank, c.step), (trace, c.path))
            continue
        rank, step, run = clash[0]
        other = taken[(run, rank, step)]
        steps = tuple(s for r, s, u in clash if r == rank and u == run and taken[(u, r, s)] == other)
        refused.append(Overlap(trace, claims[0].path, other[1], run, rank, steps, trace in given))
    return refused


def refuse_overlap(held: Iterable[Claim], new: Iterable[Claim], rank_given: Iterable[Hashable] = ()) -> None:
    """ConfigError (:meth:`Overlap.message`) for the first file of ``new`` that :func:`overlaps` refuses."""
    refused = overlaps(held, new, rank_given)
    if refused:
        raise refused[0].error()


def next_rankless(ranks: Iterable[int]) -> int:
    """The rank of a file that names none, in a run holding ``ranks``: one below the lowest negative one, else -1."""
    return min([0, *(r for r in ranks if r < 0)]) - 1


def rankless_ranks(runs: Sequence[str | None], held: Mapping[str, Iterable[int]] | None = None) -> list[int | None]:
    """The ranks of the files of one call that name none, in order: -1, -2, ... per run, below the ranks
    ``held`` (run -> ranks its committed traces hold). ``runs``: each file's run, None for a file that names
    its rank (it gets None)."""
    lowest = {run: next_rankless(ranks) + 1 for run, ranks in (held or {}).items()}
    out: list[int | None] = []
    for run in runs:
        if run is None:
            out.append(None)
        else:
            lowest[run] = next_rankless([lowest.get(run, 0)])
            out.append(lowest[run])
    return out
