"""The walk of the critical path (README: The critical path): what each rank's device was doing at every
instant (:class:`Timeline`), and the walk back from the end of a step across ranks (:class:`Walker`);
:mod:`traceq.report.critical_path` selects the steps, hands them over a batch at a time and reports.

What the device was doing at an instant: compute over communication transfer over communication wait
over memcpy/memset (the order of the interval breakdown: compute hides comm, comm hides copies, moving
data wins over waiting), and among activities of one kind the one that started first (then: ended last,
lowest stream, smallest name); where nothing ran, idle split host-bound / sync / other as
``sql/idle_breakdown.sql`` does. Where the device was in the *wait* part of a matched collective
(``sql/comm_instances.sql``), the walk jumps to the rank that arrived last, at the end of the wait part
(by the duration rule, where that rank's kernel started); for a rooted collective placed by start times
(all its kernels on one clock), at the same instant.

Sized for real steps (1,000-2,000 kernels a rank): a timeline is numpy arrays built without a Python
loop per kernel (only kernels that overlap another are painted one by one), the walk takes a whole
stretch of a rank between two jumps at once, names stay ids until a batch's segments are made, and
the timelines held are bounded by :data:`HELD_ROWS` (the least recently walked are dropped and read
again if the walk comes back).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb

from traceq import query
from traceq.report.selection import query_params
from traceq.store.frames import to_polars

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

# what a timeline is doing, by code: a piece's kind (0-4) or an idle kind (5-7)
KINDS = ("compute", "comm_transfer", "comm_wait", "memcpy", "memset", "idle_host_bound", "idle_sync", "idle_other")
COMPUTE, TRANSFER, WAIT, MEMCPY, MEMSET, IDLE_HOST_BOUND, IDLE_SYNC, IDLE_OTHER = range(8)
_PRIORITY = (0, 1, 2, 3, 3)  # a piece's priority by kind (lower wins)
_CLASS_KIND = {"compute": COMPUTE, "memcpy": MEMCPY, "memset": MEMSET}
_FAR = 2**62  # "no bound": before or after every time of a trace
# activity rows the walk holds at most (timelines and rows read but not built yet), beyond the one walked
HELD_ROWS = 1_000_000

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
        self.lo_safe = -_FAR if lo <= -_FAR else (max(lo, int(start.min())) if n else _FAR)
        self.hi_safe = _FAR if hi >= _FAR else (int(start.max()) if n else -_FAR)
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
        bounds = np.unique(np.concatenate([ps, pe, *gaps, isl_start, isl_end]))
        owner = _paint(bounds, ps, pe, order)
        idle = np.flatnonzero(owner < 0)
        code = np.where(owner >= 0, pk[np.maximum(owner, 0)], IDLE_OTHER)
        act_of = np.where(owner >= 0, pa[np.maximum(owner, 0)], n)
        if len(idle):
            x0, x1 = bounds[idle], bounds[idle + 1]
            g0, g1, h = gaps if len(gaps[0]) else (np.array([_FAR]), np.array([_FAR]), np.array([_FAR]))
            j = np.searchsorted(g0, x0, side="right") - 1
            in_gap = (j >= 0) & (x1 <= g1[np.maximum(j, 0)])
            host = in_gap & (x1 <= h[np.maximum(j, 0)])
            k = np.searchsorted(isl_start, x0, side="right") - 1
            in_sync = in_gap & (k >= 0) & (x0 < isl_end[np.maximum(k, 0)]) if len(isl_start) else np.zeros(len(idle), bool)
            code[idle] = np.where(in_sync, IDLE_SYNC, np.where(host, IDLE_HOST_BOUND, IDLE_OTHER))
        # runs of one owner (a piece, or an idle kind), with idle before and after everything
        ident = np.where(owner >= 0, owner, -code)
        ident = np.concatenate([[-IDLE_OTHER], ident, [-IDLE_OTHER]])
        code = np.concatenate([[IDLE_OTHER], code, [IDLE_OTHER]])
        act_of = np.concatenate([[n], act_of, [n]])
        edges = np.concatenate([[-_FAR], bounds, [_FAR]])
        if not len(bounds):
            ident, code, act_of, edges = ident[:1], code[:1], act_of[:1], np.array([-_FAR, _FAR])
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
        return self.lo_safe < t <= self.hi_safe

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


def _gaps(start: np.ndarray, end: np.ndarray, launch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The idle gaps between a timeline's activities (sql/idle_breakdown.sql): (g0, g1, h) arrays, h = the
    launch of the activity that ends the gap (the earliest of those starting at g1) clamped to [g0, g1],
    g0 without one: before h the host had launched nothing (host-bound)."""
    import numpy as np

    if len(start) < 2:
        empty = np.array([], dtype=np.int64)
        return empty, empty, empty
    order = np.lexsort((end, start))
    s, e, launch = start[order], end[order], launch[order]
    busy = np.maximum.accumulate(e)[:-1]
    opens = np.flatnonzero(s[1:] > busy) + 1
    g0, g1 = busy[opens - 1], s[opens]
    # the earliest launch among the activities that start at g1 (rows of one start are adjacent)
    first = np.searchsorted(s, g1, side="left")
    stop = np.searchsorted(s, g1, side="right")
    if len(g1):
        padded = np.concatenate([launch, [_FAR]])
        launched = np.minimum.reduceat(padded, np.ravel(np.column_stack([first, stop])))[::2]
    else:
        launched = np.array([], np.int64)
    h = np.where(launched >= _FAR, g0, np.minimum(np.maximum(launched, g0), g1))
    return g0, g1, h


@dataclass(frozen=True)
class Step:
    run: str
    step: int
    key: TimelineKey
    start_ns: int
    end_ns: int


# the columns of a segment an activity gives, besides its name (looked up per batch)
_ACT_COLUMNS = ("category", "collective_type", "process_group", "instance_id")


class Walker:
    """The critical paths of one run's steps, a batch of steps at a time (:meth:`walk`)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run: str, instances: str,
                 islands: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]], held_rows: int = HELD_ROWS) -> None:
        self.con, self.run, self.instances, self.islands, self.held_rows = con, run, instances, islands, held_rows
        self.timelines: OrderedDict[TimelineKey, Timeline] = OrderedDict()
        self.pending: dict[TimelineKey, pl.DataFrame] = {}
        self.read: dict[int, tuple[int, int]] = {}
        self.batch_bounds: dict[int, tuple[int, int]] = {}  # per trace, the range of the batch's steps
        self.sources: dict[int, pl.DataFrame] = {}  # per trace reached, its rows over that range
        self.queries = 0  # statements run on the warehouse (for the benchmark and the tests)
        self.window = 1  # the longest window of the batch (ns): how much a first read takes about its time
        self.reads = 0  # reads of a trace's rows (for the benchmark and the tests)

    # ---------------------------------------------------------------------------------------------- reading

    def _query(self, trace_id: int, lo: int, hi: int) -> pl.DataFrame:
        """The activity of one trace over [lo, hi) from the warehouse (sql/path_activity.sql), by start."""
        import polars as pl

        self.queries += 1
        table = pl.DataFrame({"trace_id": [trace_id], "lo_ns": [lo], "hi_ns": [hi]},
                             schema={"trace_id": pl.Int64, "lo_ns": pl.Int64, "hi_ns": pl.Int64})
        self.con.register("traceq_path_bounds", table.to_arrow())
        try:
            rows = to_polars(query.run(
                self.con, "path_activity", query_params(),
                bind={"path_bounds": "traceq_path_bounds", "comm_instances": self.instances},
            ))
        finally:
            self.con.unregister("traceq_path_bounds")
        return rows.with_columns(
            pl.col("stream").fill_null(-1), pl.col("wait_ns").fill_null(0), pl.col("launch_ns").fill_null(_FAR),
            pl.col("instance_id").fill_null(0), pl.col("to_trace_id", "to_rank", "to_device", "to_start_ns").fill_null(-1),
        ).sort("start_ns")

    def _read(self, trace_id: int, lo: int, hi: int) -> None:
        """The activity of one trace over [lo, hi), as rows to build its timelines from: out of the rows of
        the trace over the batch's range (read from the warehouse the first time the walk reaches the
        trace in the batch), or from the warehouse where [lo, hi) reaches beyond that range."""
        import polars as pl

        self.reads += 1
        self.read[trace_id] = (lo, hi)
        for held in (self.timelines, self.pending):
            for key in [k for k in held if k[0] == trace_id]:
                del held[key]
        batch = self.batch_bounds.get(trace_id)
        if batch is not None and batch[0] <= lo and hi <= batch[1]:
            if trace_id not in self.sources:
                self.sources[trace_id] = self._query(trace_id, *batch)
            rows = self.sources[trace_id].filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))
        else:
            rows = self._query(trace_id, lo, hi)
        for (_, rank, device), part in rows.partition_by("trace_id", "rank", "device", as_dict=True).items():
            self.pending[(trace_id, int(rank), int(device))] = part

    def _build(self, key: TimelineKey) -> Timeline | None:
        import numpy as np

        part = self.pending.pop(key, None)
        if part is None:
            return None
        lo, hi = self.read[key[0]]
        none = (np.array([], np.int64), np.array([], np.int64))
        self.timelines[key] = Timeline(key, lo, hi, part, self.islands.get(key[:2], none))
        return self.timelines[key]

    def timeline(self, key: TimelineKey, t: int) -> Timeline:
        """The timeline ``key`` where the walk is at ``t``: its rows about ``t`` (two windows before it, one
        after), read again over a wider range (back or forward, doubling) where they cannot tell, at last
        over the whole trace."""
        tl = self.timelines.get(key)
        if tl is None and key[0] in self.read:
            tl = self._build(key)
        tries = 0
        while (tl is None or not tl.covers(t)) and self.read.get(key[0]) != (-_FAR, _FAR):
            tries += 1
            self._read(key[0], *self._range(key[0], t, tl, tries))
            tl = self._build(key)
        tl = tl or _empty(key)
        self.timelines[key] = tl
        self.timelines.move_to_end(key)
        self._evict()
        return tl

    def _range(self, trace_id: int, t: int, tl: Timeline | None, tries: int) -> tuple[int, int]:
        """What to read of ``trace_id`` for the walk at ``t``: a range about ``t`` first; then earlier where
        ``t`` is before what was read (the walk goes back in time within a step), later where it is after
        (the next steps), both where the rank held nothing there; the whole trace after a few tries."""
        w = self.window
        read = self.read.get(trace_id)
        if read is None:
            lo, hi = t - 2 * w, t + w
        elif tries > 6:
            return -_FAR, _FAR
        else:
            lo, hi = read
            span = max(hi - lo, 3 * w)
            if tl is None:
                lo, hi = lo - span, hi + span
            elif t <= tl.lo_safe:
                lo = t - 2 * span
            elif t - 2 * w > hi:  # far after: what was read is behind the walk for good
                lo, hi = t - 2 * w, t + w
            else:
                lo, hi = max(lo, t - 2 * w), max(hi, t) + span
        return max(lo, -_FAR), min(hi, _FAR)

    def _evict(self) -> None:
        """Beyond ``held_rows``, drop all that is held of the least recently walked traces (their rows over
        the batch, timelines, rows not built yet), never the trace walked now; a trace dropped is read again
        if the walk comes back to it."""
        rows: dict[int, int] = {}
        for store in (self.timelines, self.pending):
            for key, held in store.items():
                rows[key[0]] = rows.get(key[0], 0) + (held.rows if isinstance(held, Timeline) else held.height)
        for trace_id, source in self.sources.items():
            rows[trace_id] = rows.get(trace_id, 0) + source.height
        held = sum(rows.values())
        if held <= self.held_rows:
            return
        current = next(reversed(self.timelines))[0]
        recent = list(dict.fromkeys(k[0] for k in reversed(self.timelines)))  # most recently walked first
        for trace_id in [t for t in rows if t not in recent] + recent[:0:-1]:
            if held <= self.held_rows:
                break
            if trace_id == current:
                continue
            held -= rows.pop(trace_id)
            for store in (self.timelines, self.pending):
                for key in [k for k in store if k[0] == trace_id]:
                    del store[key]
            self.sources.pop(trace_id, None)
            self.read.pop(trace_id, None)

    # ---------------------------------------------------------------------------------------------- the walk

    def walk(self, bounds: dict[int, tuple[int, int]], steps: list[Step]) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The paths of a batch of steps: (segments, jumps) as frames (README: The critical path).
        ``bounds``: per trace, the time range to read first ({trace_id: (lo, hi)}); a trace is read when
        the walk first reaches it (most ranks of a large run never are)."""
        self.window = max([s.end_ns - s.start_ns for s in steps] + [1])
        self.batch_bounds = dict(bounds)
        self.read.clear()
        self.timelines.clear()
        self.pending.clear()
        self.sources.clear()
        pieces: list[pl.DataFrame] = []  # a frame per step: the timelines it read may be dropped after it
        jumps: list[dict[str, Any]] = []
        for step in steps:
            self._walk_step(step, pieces, jumps)
        return self._segments(pieces), _frame(jumps, JUMP_SCHEMA)

    def _walk_step(self, step: Step, pieces: list[pl.DataFrame], jumps: list[dict[str, Any]]) -> None:
        import numpy as np

        stop = step.start_ns
        key, t, offset = step.key, step.end_ns, 0
        stretches: list[dict[str, Any]] = []  # latest first
        taken: list[dict[str, Any]] = []
        jumped: set[int] = set()
        while t + offset > stop:
            tl = self.timeline(key, t)
            floor = max(stop - offset, tl.lo_safe)
            j = tl.run_at(t)
            instance = int(tl.value("instance_id", j)) if tl.run_jump[j] else 0
            if tl.run_jump[j] and instance not in jumped:
                begin = max(int(tl.run_start[j]), floor)
                jumped.add(instance)
                to = tuple(int(tl.value(c, j)) for c in ("to_trace_id", "to_rank", "to_device"))
                taken.append({
                    "run": step.run, "step": step.step, "from_rank": key[1], "to_rank": to[1],
                    "path_ns": t + offset, "collective_type": tl.value("collective_type", j),
                    "process_group": tl.value("process_group", j), "instance_id": instance,
                    "trace_id": key[0], "name_id": int(tl.value("name_id", j)),
                    "wait_on_path_ns": t - begin,  # the waiting on the path: nothing else ran beside it
                })
                if tl.value("arrival", j) != "start time":  # on clocks of their own: where the late kernel began
                    t_w = int(tl.value("start_ns", j)) + int(tl.value("wait_ns", j))
                    s_l = int(tl.value("to_start_ns", j))
                    offset += t_w - s_l
                    t += s_l - t_w
                key = to
                continue  # one clock (a rooted collective placed by start times): the same instant
            # a stretch on this rank: back from run j to the first jump before it, or to the floor
            low = max(int(tl.prev_jump[j]) + 1, int(np.searchsorted(tl.run_end, floor, side="right")))
            runs = np.arange(low, j + 1)
            starts = np.maximum(tl.run_start[runs], floor)
            ends = np.minimum(tl.run_end[runs], t)
            keep = ends > starts
            runs, starts, ends = runs[keep], starts[keep], ends[keep]
            if len(runs):
                jumped.clear()
                stretch = {"tl": tl, "runs": runs, "start": starts, "end": ends, "offset": offset}
                if stretches and _same_piece(stretch, stretches[-1]):
                    stretches[-1]["start"][0] = stretch["start"][-1]
                    runs = runs[:-1]
                    stretch.update(runs=runs, start=starts[:-1], end=ends[:-1])
                if len(runs):
                    stretches.append(stretch)
                t = int(starts[0])
            else:  # cannot be: run j holds [t - 1, t) and t > floor
                raise AssertionError(f"critical path: no stretch at {t} on {key}")
        pieces.append(_step_frame(step, list(reversed(stretches))))
        jumps.extend(reversed(taken))

    def _segments(self, pieces: list[pl.DataFrame]) -> pl.DataFrame:
        """The batch's segments as one frame, names looked up once (``names``)."""
        import polars as pl

        if not pieces:
            return pl.DataFrame(schema=_types(SEGMENT_SCHEMA))
        segments = pl.concat(pieces, how="vertical_relaxed").with_columns(
            pl.lit(self.run).alias("run"), pl.col("kind").replace_strict(dict(enumerate(KINDS)), return_dtype=pl.String),
            (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
            pl.when(pl.col("instance_id") > 0).then(pl.col("instance_id")).alias("instance_id"))
        segments = segments.join(self._names(segments), on=["trace_id", "name_id"], how="left", maintain_order="left")
        return segments.select(*SEGMENT_SCHEMA).cast(_types(SEGMENT_SCHEMA))

    def _names(self, rows: pl.DataFrame) -> pl.DataFrame:
        import polars as pl

        ids = rows.select("trace_id", "name_id").drop_nulls().unique()
        self.con.register("traceq_path_names", ids.to_arrow())
        try:
            return to_polars(self.con.sql(
                "select n.trace_id, n.name_id, n.name from names as n "
                "semi join traceq_path_names as i on i.trace_id = n.trace_id and i.name_id = n.name_id"))
        finally:
            self.con.unregister("traceq_path_names")

    def jump_names(self, jumps: pl.DataFrame) -> pl.DataFrame:
        """``jumps`` with the collective kernel's name in place of its id."""
        import polars as pl

        if not jumps.height:
            return jumps.drop("trace_id", "name_id").with_columns(pl.lit(None, pl.String).alias("name"))
        return (jumps.join(self._names(jumps), on=["trace_id", "name_id"], how="left")
                .select(*[c for c in JUMP_SCHEMA if c not in ("trace_id", "name_id")], "name"))


def _step_frame(step: Step, stretches: list[dict[str, Any]]) -> pl.DataFrame:
    """A step's stretches (in time order) as segments, names still ids."""
    import numpy as np
    import polars as pl

    frames, order = [], 0
    for s in stretches:
        tl, runs = s["tl"], s["runs"]
        n = len(runs)
        frames.append(pl.concat([pl.DataFrame({
            "step": np.full(n, step.step, dtype=np.int64), "order": np.arange(order, order + n, dtype=np.int64),
            "rank": np.full(n, tl.key[1], dtype=np.int64), "device": np.full(n, tl.key[2], dtype=np.int64),
            "trace_id": np.full(n, tl.key[0], dtype=np.int64), "start_ns": s["start"], "end_ns": s["end"],
            "path_start_ns": s["start"] + s["offset"], "kind": tl.run_kind[runs],
        }), tl.act_ext[tl.run_act[runs]].select("name_id", *_ACT_COLUMNS)], how="horizontal"))
        order += n
    return pl.concat(frames, how="vertical_relaxed")


def _same_piece(earlier: dict[str, Any], later: dict[str, Any]) -> bool:
    """Whether the first segment of ``later`` (a stretch walked before) and the last of ``earlier`` (met
    next, back in time) are one: the same piece seen through two reads of a timeline."""
    a, b = earlier["tl"], later["tl"]
    i, k = int(earlier["runs"][-1]), int(later["runs"][0])
    if a.key != b.key or int(earlier["end"][-1]) != int(later["start"][0]) or a.run_kind[i] != b.run_kind[k]:
        return False
    if a.run_act[i] == a.rows or b.run_act[k] == b.rows:  # idle: one idle kind is one thing
        return a.run_act[i] == a.rows and b.run_act[k] == b.rows
    return all(a.value(c, i) == b.value(c, k) for c in ("start_ns", "name_id", "instance_id"))


SEGMENT_SCHEMA = {
    "run": "String", "step": "Int64", "order": "Int64", "rank": "Int64", "device": "Int64", "trace_id": "Int64",
    "start_ns": "Int64", "end_ns": "Int64", "dur_ns": "Int64", "path_start_ns": "Int64", "kind": "String",
    "name": "String", "category": "String", "collective_type": "String", "process_group": "String",
    "instance_id": "UInt64",
}
JUMP_SCHEMA = {
    "run": "String", "step": "Int64", "from_rank": "Int64", "to_rank": "Int64", "path_ns": "Int64",
    "collective_type": "String", "process_group": "String", "instance_id": "UInt64", "trace_id": "Int64",
    "name_id": "Int64", "wait_on_path_ns": "Int64",
}


def _types(schema: dict[str, str]) -> dict[str, Any]:
    import polars as pl

    return {c: getattr(pl, t) for c, t in schema.items()}


def _frame(rows: list[dict[str, Any]], schema: dict[str, str]) -> pl.DataFrame:
    import polars as pl

    types = _types(schema)
    return pl.DataFrame([{c: r.get(c) for c in schema} for r in rows], schema=types, orient="row") if rows \
        else pl.DataFrame(schema=types)


def _empty(key: TimelineKey) -> Timeline:
    import numpy as np
    import polars as pl

    act = pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "wait_ns": pl.Int64, "stream": pl.Int64,
                               "launch_ns": pl.Int64, "name_order": pl.Int64, "to_trace_id": pl.Int64,
                               "class": pl.String, "name_id": pl.Int64, "category": pl.String,
                               "collective_type": pl.String, "process_group": pl.String, "instance_id": pl.UInt64})
    return Timeline(key, -_FAR, _FAR, act, (np.array([], np.int64), np.array([], np.int64)))
