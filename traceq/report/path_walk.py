"""The walk of the critical path (docs/explanation/across-ranks.md: the critical path): back from the end of a step across ranks,
over the timelines of :mod:`traceq.report.path_timeline` (:class:`Walker`);
:mod:`traceq.report.path_batches` hands it the steps a batch at a time.

Where the device was in the *wait* part of a matched collective (``sql/comm_instances.sql``), the walk
jumps to the rank that arrived last, at the end of the wait part (by the duration rule, where that rank's
kernel started); for a rooted collective placed by start times (all its kernels on one clock), at the
same instant. The walk takes a whole stretch of a rank between two jumps at once; names stay ids until
a batch's segments are made; what it holds read is bounded by ``held_rows`` (the least recently walked
ranks are dropped and read again if the walk comes back).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb

from traceq import query
from traceq.report.path_timeline import FAR, KINDS, Timeline, TimelineKey, empty_timeline
from traceq.report.selection import query_params
from traceq.store.frames import to_polars

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

# activity rows the walk holds at most (timelines and rows read but not built yet), beyond the one walked
HELD_ROWS = 1_000_000

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
            pl.col("stream").fill_null(-1), pl.col("wait_ns").fill_null(0), pl.col("launch_ns").fill_null(FAR),
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
        while (tl is None or not tl.covers(t)) and self.read.get(key[0]) != (-FAR, FAR):
            tries += 1
            self._read(key[0], *self._range(key[0], t, tl, tries))
            tl = self._build(key)
        tl = tl or empty_timeline(key)
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
            return -FAR, FAR
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
        return max(lo, -FAR), min(hi, FAR)

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
        """The paths of a batch of steps: (segments, jumps) as frames (docs/explanation/across-ranks.md: the critical path).
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
        """The names of ``rows``' (trace_id, name_id), from the warehouse's names."""
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
