"""The walk of the critical path (README: The critical path): what each rank's device was doing at every
instant (:class:`Timeline`), and the walk back from the end of a step across ranks (:class:`Walker`);
:mod:`traceq.report.critical_path` selects the steps and reports the paths.

What the device was doing at an instant: compute over communication transfer over communication wait
over memcpy/memset (the order of the interval breakdown: compute hides comm, comm hides copies, moving
data wins over waiting), and among activities of one kind the one that started first (then: ended last,
lowest stream, smallest name); where nothing ran, idle split host-bound / sync / other as
``sql/idle_breakdown.sql`` does. Where the device was in the *wait* part of a matched collective
(``sql/comm_instances.sql``), the walk jumps to the rank that arrived last, at the end of the wait part
(by the duration rule, where that rank's kernel started); for a rooted collective placed by start times
(all its kernels on one clock), at the same instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb

from traceq import query
from traceq.report.selection import query_params
from traceq.store.frames import to_polars

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

# what a timeline is doing: a piece's kind, or an idle kind (the negative codes of Timeline.run_code)
KINDS = ("compute", "comm_transfer", "comm_wait", "memcpy", "memset", "idle_host_bound", "idle_sync", "idle_other")
IDLE_OTHER, IDLE_HOST_BOUND, IDLE_SYNC = -1, -2, -3
_IDLE_KIND = {IDLE_OTHER: "idle_other", IDLE_HOST_BOUND: "idle_host_bound", IDLE_SYNC: "idle_sync"}
# a piece's priority, by kind (lower wins)
_PRIORITY = {"compute": 0, "comm_transfer": 1, "comm_wait": 2, "memcpy": 3, "memset": 3}
_FAR = 2**62  # "no bound": before or after every time of a trace

TimelineKey = tuple[int, int, int]  # (trace_id, rank, device)


@dataclass
class Timeline:
    """One (trace, rank, device) over a time range: what its device was doing at every instant, as runs
    of one piece (an activity's compute, transfer, wait or copy) or one idle kind.

    Built from the activity rows of ``sql/path_activity.sql`` (numpy arrays, any order) and the rank's
    sync islands (``sql/sync_islands.sql``). ``lo``/``hi``: the range the rows were read for (an activity
    is read when it ends after lo and starts before hi); what the timeline says holds for
    ``lo_safe < t <= hi_safe`` (:meth:`covers`).
    """

    key: TimelineKey
    lo: int
    hi: int
    act: dict[str, np.ndarray]
    run_start: np.ndarray = field(init=False)
    run_end: np.ndarray = field(init=False)
    run_code: np.ndarray = field(init=False)
    piece_act: np.ndarray = field(init=False)
    piece_kind: list[str] = field(init=False)
    lo_safe: int = field(init=False)
    hi_safe: int = field(init=False)

    @classmethod
    def build(cls, key: TimelineKey, lo: int, hi: int, act: dict[str, np.ndarray],
              islands: tuple[np.ndarray, np.ndarray]) -> Timeline:
        tl = cls(key, lo, hi, act)
        tl._segment(islands)
        return tl

    def covers(self, t: int) -> bool:
        return self.lo_safe < t <= self.hi_safe

    def _segment(self, islands: tuple[np.ndarray, np.ndarray]) -> None:
        import numpy as np

        a = self.act
        start, end, wait = a["start_ns"], a["end_ns"], a["wait_ns"]
        n = len(start)
        # where the rows can be trusted: after the first activity read (anything that ended before lo and
        # was not read cannot run then) and up to the last start read (a gap reaching past hi is not seen)
        self.lo_safe = -_FAR if self.lo <= -_FAR else (max(self.lo, int(start.min())) if n else _FAR)
        self.hi_safe = _FAR if self.hi >= _FAR else (int(start.max()) if n else -_FAR)
        cls_ = a["class"]
        comm = cls_ == "comm"
        split = np.where(comm, np.minimum(start + wait, end), start)
        # pieces: (start, end, kind, activity index)
        specs = [
            (start, end, ~comm, None),
            (start, split, comm, "comm_wait"),
            (split, end, comm, "comm_transfer"),
        ]
        p_start, p_end, p_act, p_kind = [], [], [], []
        for s, e, keep, kind in specs:
            keep = keep & (e > s)
            idx = np.flatnonzero(keep)
            p_start.append(s[idx])
            p_end.append(e[idx])
            p_act.append(idx)
            p_kind.append(cls_[idx] if kind is None else np.full(len(idx), kind, dtype=object))
        ps, pe, pa = np.concatenate(p_start), np.concatenate(p_end), np.concatenate(p_act)
        pk = np.concatenate(p_kind)
        prio = np.array([_PRIORITY[k] for k in pk], dtype=np.int64)
        stream = a["stream"][pa]
        _, name_rank = np.unique(a["name"][pa].astype(str), return_inverse=True)
        # best first: priority, earliest start, latest end, lowest stream, smallest name
        order = np.lexsort((name_rank, stream, -pe, ps, prio))

        gaps = _gaps(start, end, a["launch_ns"])
        isl_start, isl_end = islands
        bounds = np.unique(np.concatenate([ps, pe, *gaps, isl_start, isl_end]))
        owner = np.full(max(len(bounds) - 1, 0), IDLE_OTHER, dtype=np.int64)
        first = np.searchsorted(bounds, ps)
        last = np.searchsorted(bounds, pe)
        for i in order[::-1]:  # the best piece paints last
            owner[first[i]:last[i]] = i
        idle = np.flatnonzero(owner < 0)
        if len(idle):
            x0, x1 = bounds[idle], bounds[idle + 1]
            g0, g1, h = gaps if len(gaps[0]) else (np.array([_FAR]), np.array([_FAR]), np.array([_FAR]))
            j = np.searchsorted(g0, x0, side="right") - 1
            in_gap = (j >= 0) & (x1 <= g1[np.maximum(j, 0)])
            host = in_gap & (x1 <= h[np.maximum(j, 0)])
            k = np.searchsorted(isl_start, x0, side="right") - 1
            in_sync = in_gap & (k >= 0) & (x0 < isl_end[np.maximum(k, 0)]) if len(isl_start) else np.zeros(len(idle), bool)
            owner[idle] = np.where(in_sync, IDLE_SYNC, np.where(host, IDLE_HOST_BOUND, IDLE_OTHER))
        # runs of one owner, with idle before and after everything
        codes = np.concatenate([[IDLE_OTHER], owner, [IDLE_OTHER]])
        edges = np.concatenate([[-_FAR], bounds, [_FAR]]) if len(bounds) else np.array([-_FAR, _FAR])
        if not len(bounds):
            codes = np.array([IDLE_OTHER])
        change = np.flatnonzero(np.diff(codes)) + 1
        starts = np.concatenate([[0], change])
        self.run_start = edges[starts]
        self.run_end = np.concatenate([edges[change], [edges[-1]]])
        self.run_code = codes[starts]
        self.piece_act = pa
        self.piece_kind = list(pk)

    def doing(self, t: int) -> tuple[int, int]:
        """(where it began, code) of what the timeline was doing just before ``t``: the run that holds
        [t - 1, t). Codes >= 0 are pieces (their activity: :attr:`piece_act`), < 0 idle kinds."""
        import numpy as np

        j = int(np.searchsorted(self.run_end, t, side="left"))
        return int(self.run_start[j]), int(self.run_code[j])

    def kind(self, code: int) -> str:
        return _IDLE_KIND[code] if code < 0 else self.piece_kind[code]


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
    launched = np.array([launch[a:b].min() for a, b in zip(first, stop)], dtype=np.int64) if len(g1) else np.array([], np.int64)
    h = np.where(launched >= _FAR, g0, np.minimum(np.maximum(launched, g0), g1))
    return g0, g1, h


@dataclass(frozen=True)
class Step:
    run: str
    step: int
    key: TimelineKey
    start_ns: int
    end_ns: int


class Walker:
    """The critical paths of one run's steps: the walk over timelines read batch by batch."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run: str, instances: str):
        self.con, self.run, self.instances = con, run, instances
        self.timelines: dict[TimelineKey, Timeline] = {}
        self.pending: dict[TimelineKey, pl.DataFrame] = {}
        self.islands: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.bounds: dict[int, tuple[int, int]] = {}
        self.read: dict[int, tuple[int, int]] = {}
        self.segments: list[dict[str, Any]] = []
        self.jumps: list[dict[str, Any]] = []

    # ---------------------------------------------------------------------------------------------- reading

    def batch(self, bounds: dict[int, tuple[int, int]]) -> None:
        """Start a batch of steps: per trace, the time range to read ({trace_id: (lo, hi)}). A trace is read
        when the walk first reaches it (most ranks of a large run never are), and read again whole where the
        walk goes outside that range."""
        self.bounds = dict(bounds)
        self.read: dict[int, tuple[int, int]] = {}
        self.timelines.clear()
        self.pending.clear()
        self.islands.clear()

    def _read(self, trace_id: int, lo: int, hi: int) -> None:
        """Read the activity of one trace over [lo, hi) (sql/path_activity.sql) and its sync islands."""
        import numpy as np
        import polars as pl

        self.read[trace_id] = (lo, hi)
        for held in (self.timelines, self.pending):
            for key in [k for k in held if k[0] == trace_id]:
                del held[key]
        table = pl.DataFrame({"trace_id": [trace_id], "lo_ns": [lo], "hi_ns": [hi]},
                             schema={"trace_id": pl.Int64, "lo_ns": pl.Int64, "hi_ns": pl.Int64})
        self.con.register("traceq_path_bounds", table.to_arrow())
        try:
            rows = to_polars(query.run(
                self.con, "path_activity", query_params(),
                bind={"path_bounds": "traceq_path_bounds", "comm_instances": self.instances},
            ))
            islands = to_polars(query.run(self.con, "sync_islands", query_params()).filter(
                duckdb.ColumnExpression("trace_id") == duckdb.ConstantExpression(trace_id)))
        finally:
            self.con.unregister("traceq_path_bounds")
        rows = rows.with_columns(
            pl.col("stream").fill_null(-1), pl.col("wait_ns").fill_null(0), pl.col("launch_ns").fill_null(_FAR),
            pl.col("name").fill_null(""), pl.col("instance_id").fill_null(0),
            pl.col("to_trace_id", "to_rank", "to_device", "to_start_ns").fill_null(-1),
        )
        for (_, rank, device), part in rows.partition_by("trace_id", "rank", "device", as_dict=True).items():
            self.pending[(trace_id, int(rank), int(device))] = part
        for (_, rank), part in islands.sort("start_ns").partition_by("trace_id", "rank", as_dict=True).items():
            self.islands[(trace_id, int(rank))] = (part["start_ns"].to_numpy().astype(np.int64),
                                                   part["end_ns"].to_numpy().astype(np.int64))

    def _build(self, key: TimelineKey) -> Timeline | None:
        import numpy as np

        if key[0] not in self.read:
            self._read(key[0], *self.bounds.get(key[0], (-_FAR, _FAR)))
        part = self.pending.pop(key, None)
        if part is None:
            return None
        lo, hi = self.read[key[0]]
        none = (np.array([], np.int64), np.array([], np.int64))
        act = {c: part[c].to_numpy() for c in part.columns}
        self.timelines[key] = Timeline.build(key, lo, hi, act, self.islands.get(key[:2], none))
        return self.timelines[key]

    def timeline(self, key: TimelineKey, t: int) -> Timeline:
        """The timeline ``key`` where the walk is at ``t``: read first for the batch's range, again over the
        whole trace where ``t`` lies outside what that read can tell."""
        tl = self.timelines.get(key) or self._build(key)
        if tl is None or not tl.covers(t):
            if self.read.get(key[0]) != (-_FAR, _FAR):
                self._read(key[0], -_FAR, _FAR)
                tl = self._build(key)
            tl = tl or _empty(key)
            self.timelines[key] = tl
        return tl

    # ---------------------------------------------------------------------------------------------- the walk

    def walk(self, step: Step) -> None:
        """Append ``step``'s path to :attr:`segments` (in time order) and its jumps to :attr:`jumps`."""
        stop = step.start_ns
        key, t, offset = step.key, step.end_ns, 0
        path: list[dict[str, Any]] = []
        jumps: list[dict[str, Any]] = []
        jumped: set[int] = set()
        while t + offset > stop:
            tl = self.timeline(key, t)
            begin, code = tl.doing(t)
            begin = max(begin, stop - offset)
            begin = max(begin, tl.lo_safe)
            kind = tl.kind(code)
            act = tl.act
            i = int(tl.piece_act[code]) if code >= 0 else -1
            if kind == "comm_wait" and int(act["instance_id"][i]) not in jumped and act["to_trace_id"][i] >= 0:
                instance = int(act["instance_id"][i])
                jumped.add(instance)
                jumps.append({
                    "run": step.run, "step": step.step, "from_rank": key[1], "to_rank": int(act["to_rank"][i]),
                    "path_ns": t + offset, "collective_type": act["collective_type"][i],
                    "process_group": act["process_group"][i], "instance_id": instance, "name": act["name"][i],
                    "wait_on_path_ns": t - begin,  # the waiting on the path: nothing else ran beside it
                })
                key = (int(act["to_trace_id"][i]), int(act["to_rank"][i]), int(act["to_device"][i]))
                if act["arrival"][i] != "start time":  # on clocks of their own: where the late kernel began
                    t_w = int(act["start_ns"][i]) + int(act["wait_ns"][i])
                    s_l = int(act["to_start_ns"][i])
                    offset += t_w - s_l
                    t += s_l - t_w
                continue  # one clock (a rooted collective placed by start times): the same instant
            jumped.clear()
            segment = {
                "run": step.run, "step": step.step, "rank": key[1], "device": key[2], "trace_id": key[0],
                "start_ns": begin, "end_ns": t, "path_start_ns": begin + offset, "kind": kind,
                "name": act["name"][i] if i >= 0 else None,
                "category": act["category"][i] if i >= 0 else None,
                "collective_type": act["collective_type"][i] if i >= 0 else None,
                "process_group": act["process_group"][i] if i >= 0 else None,
                "instance_id": (int(act["instance_id"][i]) or None) if i >= 0 else None,
                "act_start_ns": int(act["start_ns"][i]) if i >= 0 else None,
            }
            previous = path[-1] if path else None
            if previous is not None and _same_thing(previous, segment):
                previous["start_ns"], previous["path_start_ns"] = segment["start_ns"], segment["path_start_ns"]
            else:
                path.append(segment)
            t = begin
        for order, segment in enumerate(reversed(path)):
            segment["order"] = order
            self.segments.append(segment)
        self.jumps.extend(reversed(jumps))


def _same_thing(later: dict[str, Any], earlier: dict[str, Any]) -> bool:
    """Whether two segments met one after the other (``earlier`` ends where ``later`` starts) are one: the
    same piece seen through two reads of a timeline."""
    return (later["start_ns"] == earlier["end_ns"] and later["trace_id"] == earlier["trace_id"]
            and later["rank"] == earlier["rank"] and later["device"] == earlier["device"]
            and later["kind"] == earlier["kind"] and later["act_start_ns"] == earlier["act_start_ns"]
            and later["name"] == earlier["name"] and later["instance_id"] == earlier["instance_id"])


def _empty(key: TimelineKey) -> Timeline:
    import numpy as np

    act = {c: np.array([], dtype=object if c in ("class", "name") else np.int64) for c in
           ("start_ns", "end_ns", "wait_ns", "class", "name", "stream", "launch_ns")}
    return Timeline.build(key, -_FAR, _FAR, act, (np.array([], np.int64), np.array([], np.int64)))
