"""What a rank's device was doing at every instant, for the critical path (docs/explanation/across-ranks.md: the critical path):
:class:`Timeline`, built from the activity rows of ``sql/path_activity.sql``; the walk over timelines is
:mod:`traceq.report.path_walk`.

What the device was doing at an instant: compute over communication transfer over communication wait
over memcpy/memset (the order of the interval breakdown: compute hides comm, comm hides copies, moving
data wins over waiting), and among activities of one kind the one that started first (then: ended last,
lowest stream, smallest name); where nothing ran, idle split host-bound / sync / other / unknown as
``sql/idle_breakdown.sql`` does (unknown: a gap whose ending activity has no launch event).

Sized for real steps (1,000-2,000 kernels a rank): a timeline is numpy arrays built without a Python
loop per kernel; only kernels that overlap another are painted one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

# what a timeline is doing, by code: a piece's kind (0-4) or an idle kind (5-8)
KINDS = ("compute", "comm_transfer", "comm_wait", "memcpy", "memset", "idle_host_bound", "idle_sync", "idle_other",
         "idle_unknown")
COMPUTE, TRANSFER, WAIT, MEMCPY, MEMSET, IDLE_HOST_BOUND, IDLE_SYNC, IDLE_OTHER, IDLE_UNKNOWN = range(9)
_PRIORITY = (0, 1, 2, 3, 3)  # a piece's priority by kind (lower wins)
_CLASS_KIND = {"compute": COMPUTE, "memcpy": MEMCPY, "memset": MEMSET}
FAR = 2**62  # "no bound": before or after every time of a trace
TimelineKey = tuple[int, int, int]  # (trace_id, rank, device)


class Timeline:
    """One (trace, rank, device) over a time range: what its device was doing at every instant, as runs
    of one piece (an activity's compute, transfer, wait or copy) or one idle kind.

    Built from the activity rows of ``sql/path_activity.sql`` (any order) and the rank's sync islands
    (``sql/sync_islands.sql``). ``lo``/``hi``: the range the rows were read for (an activity is read when
    it ends after lo and starts before hi); what the timeline says holds for ``lo_safe < t <= hi_safe``
    (:meth:`covers`). Per run: ``run_start``/``run_end`` (ns), ``run_kind`` (a code of :data:`KINDS`),
    ``run_act`` (the row of :attr:`act` it is a piece of; ``len(act)`` for idle), ``run_jump`` (a wait
    the walk jumps from), and ``prev_jump[j]``: the last jump run before run j (-1: none).
    """

    def __init__(self, key: TimelineKey, lo: int, hi: int, act: pl.DataFrame,
                 islands: tuple[np.ndarray, np.ndarray]) -> None:
        import numpy as np
        import polars as pl

        self.key, self.lo, self.hi, self.act = key, lo, hi, act
        self.rows = act.height
        self.act_ext = pl.concat([act, act.clear(1)])  # a row of nulls at len(act): what idle runs point to
        col = {c: act[c].to_numpy() for c in ("start_ns", "end_ns", "wait_ns", "stream", "launch_ns", "name_order",
                                               "to_trace_id")}
        start, end = col["start_ns"].astype(np.int64), col["end_ns"].astype(np.int64)
        n = len(start)
        # where the rows can be trusted: after the first activity read (anything that ended before lo and
        # was not read cannot run then) and up to the last start read (a gap reaching past hi is not seen)
        self.lo_safe = -FAR if lo <= -FAR else (max(lo, int(start.min())) if n else FAR)
        self.hi_safe = FAR if hi >= FAR else (int(start.max()) if n else -FAR)
        cls_ = act["class"].to_numpy()
        comm = cls_ == "comm"
        kind = np.full(n, COMPUTE, dtype=np.int64)
        for name, code in _CLASS_KIND.items():
            kind[cls_ == name] = code
        split = np.where(comm, np.minimum(start + col["wait_ns"], end), start)
        # pieces: a non-comm activity whole; a comm kernel as its wait part, then its transfer part
        parts = [(start, end, ~comm, kind), (start, split, comm, WAIT), (split, end, comm, TRANSFER)]
        p_start, p_end, p_act, p_kind = [], [], [], []
        for s, e, keep, k in parts:
            idx = np.flatnonzero(keep & (e > s))
            p_start.append(s[idx])
            p_end.append(e[idx])
            p_act.append(idx)
            p_kind.append(k[idx] if isinstance(k, np.ndarray) else np.full(len(idx), k, dtype=np.int64))
        ps, pe, pa, pk = (np.concatenate(x) for x in (p_start, p_end, p_act, p_kind))
        prio = np.asarray(_PRIORITY, dtype=np.int64)[pk]
        # best first: priority, earliest start, latest end, lowest stream, smallest name
        order = np.lexsort((col["name_order"][pa], col["stream"][pa], -pe, ps, prio))

        gaps = _gaps(start, end, col["launch_ns"].astype(np.int64))
        isl_start, isl_end = islands
        bounds = np.unique(np.concatenate([ps, pe, *gaps[:3], isl_start, isl_end]))
        owner = _paint(bounds, ps, pe, order)
        idle = np.flatnonzero(owner < 0)
        # a piece's kind and activity, and past the last piece an idle one's (no piece at all: zero-length
        # kernels only, whose edges still cut the timeline)
        slot = np.where(owner >= 0, owner, len(pk))
        code = np.concatenate([pk, [IDLE_OTHER]])[slot]
        act_of = np.concatenate([pa, [n]])[slot]
        if len(idle):
            x0, x1 = bounds[idle], bounds[idle + 1]
            g0, g1, h, known = gaps if len(gaps[0]) else (np.array([FAR]), np.array([FAR]), np.array([FAR]),
                                                          np.array([True]))
            j = np.searchsorted(g0, x0, side="right") - 1
            in_gap = (j >= 0) & (x1 <= g1[np.maximum(j, 0)])
            host = in_gap & (x1 <= h[np.maximum(j, 0)])
            # other: the ending activity was launched; no launch (h = g0: nothing host-bound) or outside every
            # gap (before the first activity, after the last: nothing ends it): unknown, no cause guessed
            other = in_gap & known[np.maximum(j, 0)]
            k = np.searchsorted(isl_start, x0, side="right") - 1
            in_sync = in_gap & (k >= 0) & (x0 < isl_end[np.maximum(k, 0)]) if len(isl_start) else np.zeros(len(idle), bool)
            code[idle] = np.where(in_sync, IDLE_SYNC, np.where(host, IDLE_HOST_BOUND,
                                                               np.where(other, IDLE_OTHER, IDLE_UNKNOWN)))
        # runs of one owner (a piece, or an idle kind), with idle before and after everything
        ident = np.where(owner >= 0, owner, -code)
        ident = np.concatenate([[-IDLE_UNKNOWN], ident, [-IDLE_UNKNOWN]])
        code = np.concatenate([[IDLE_UNKNOWN], code, [IDLE_UNKNOWN]])
        act_of = np.concatenate([[n], act_of, [n]])
        edges = np.concatenate([[-FAR], bounds, [FAR]])
        if not len(bounds):
            ident, code, act_of, edges = ident[:1], code[:1], act_of[:1], np.array([-FAR, FAR])
        change = np.flatnonzero(np.diff(ident)) + 1
        firsts = np.concatenate([[0], change])
        self.run_start = edges[firsts]
        self.run_end = np.concatenate([edges[change], [edges[-1]]])
        self.run_kind = code[firsts]
        self.run_act = act_of[firsts]
        to_trace = np.concatenate([col["to_trace_id"], [-1]])
        self.run_jump = (self.run_kind == WAIT) & (to_trace[self.run_act] >= 0)
        marks = np.where(self.run_jump, np.arange(len(self.run_jump)), -1)
        self.prev_jump = np.concatenate([[-1], np.maximum.accumulate(marks)[:-1]]) if len(marks) else marks

    def covers(self, t: int) -> bool:
        """Whether the rows read tell what the device was doing just before ``t``: after the first of them,
        and up to the last start read, or up to the end of the range read where a piece holds [t - 1, t)
        (every activity that started before then was read; idle would need the start that ends it)."""
        if not self.lo_safe < t:
            return False
        return t <= self.hi_safe or (t <= self.hi and self.run_kind[self.run_at(t)] < IDLE_HOST_BOUND)

    def run_at(self, t: int) -> int:
        """The run that holds [t - 1, t)."""
        import numpy as np

        return int(np.searchsorted(self.run_end, t, side="left"))

    def value(self, column: str, run: int) -> Any:
        """``column`` of the activity run ``run`` is a piece of."""
        return self.act[column][int(self.run_act[run])]


def _paint(bounds: np.ndarray, ps: np.ndarray, pe: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Per elementary interval [bounds[i], bounds[i+1]), the piece that holds it (the first of ``order``
    among those covering it), -1 where none does. Where one piece covers an interval (most of a real
    timeline), its index comes from prefix sums; only pieces that overlap another are painted in a loop."""
    import numpy as np

    m = max(len(bounds) - 1, 0)
    if not len(ps):
        return np.full(m, -1, dtype=np.int64)
    first = np.searchsorted(bounds, ps)
    last = np.searchsorted(bounds, pe)
    count = np.cumsum(np.bincount(first, minlength=m + 1) - np.bincount(last, minlength=m + 1))[:m]
    index = np.arange(len(ps), dtype=np.int64)
    total = np.cumsum(np.bincount(first, weights=index + 1, minlength=m + 1)
                      - np.bincount(last, weights=index + 1, minlength=m + 1))[:m]
    owner = np.where(count == 1, np.rint(total).astype(np.int64) - 1, -1)
    several = count > 1
    if several.any():
        seen = np.concatenate([[0], np.cumsum(several)])
        rank = np.empty(len(ps), dtype=np.int64)
        rank[order] = index
        overlapping = np.flatnonzero(seen[last] > seen[first])
        for i in overlapping[np.argsort(-rank[overlapping], kind="stable")]:  # the best paints last
            owner[first[i]:last[i]] = i
    return owner


def _gaps(start: np.ndarray, end: np.ndarray, launch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The idle gaps between a timeline's activities (sql/idle_breakdown.sql): (g0, g1, h, known) arrays,
    h = the launch of the activity that ends the gap (the earliest of those starting at g1) clamped to
    [g0, g1]: before h the host had launched nothing (host-bound), after it the work waited (other);
    ``known`` false where no activity starting at g1 has a launch (h = g0): the gap's cause is unknown."""
    import numpy as np

    if len(start) < 2:
        empty = np.array([], dtype=np.int64)
        return empty, empty, empty, np.array([], dtype=bool)
    order = np.lexsort((end, start))
    s, e, launch = start[order], end[order], launch[order]
    busy = np.maximum.accumulate(e)[:-1]
    opens = np.flatnonzero(s[1:] > busy) + 1
    g0, g1 = busy[opens - 1], s[opens]
    # the earliest launch among the activities that start at g1 (rows of one start are adjacent)
    first = np.searchsorted(s, g1, side="left")
    stop = np.searchsorted(s, g1, side="right")
    if len(g1):
        padded = np.concatenate([launch, [FAR]])
        launched = np.minimum.reduceat(padded, np.ravel(np.column_stack([first, stop])))[::2]
    else:
        launched = np.array([], np.int64)
    known = launched < FAR
    h = np.where(known, np.minimum(np.maximum(launched, g0), g1), g0)
    return g0, g1, h, known


def empty_timeline(key: TimelineKey) -> Timeline:
    import numpy as np
    import polars as pl

    act = pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "wait_ns": pl.Int64, "stream": pl.Int64,
                               "launch_ns": pl.Int64, "name_order": pl.Int64, "to_trace_id": pl.Int64,
                               "class": pl.String, "name_id": pl.Int64, "category": pl.String,
                               "collective_type": pl.String, "process_group": pl.String, "instance_id": pl.UInt64})
    return Timeline(key, -FAR, FAR, act, (np.array([], np.int64), np.array([], np.int64)))
