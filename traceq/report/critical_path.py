"""The critical path of a step across ranks (README: The critical path): which rank, and which of its work,
made the step as long as it was.

Per step, the walk starts at the end of the window of the rank whose device window ends last (on the
wall clock) and goes back in time to that window's start. On a rank, time goes to what its device was
doing (:class:`Timeline`): compute (with its kernel), the transfer part of a communication kernel, a
memcpy or memset, or idle (split host-bound / sync / other as the idle breakdown does). Where the device
was in the *wait* part of a matched collective (``sql/comm_instances.sql``), it was waiting for the rank
that arrived last: the path jumps to that rank at the moment its kernel started (by the duration rule
that splits wait from transfer, the end of the wait part) and goes on there. The segments tile the step
on the last-ending rank: they sum to its window, to the ns.

What the device was doing at an instant: compute over communication transfer over communication wait
over memcpy/memset (the order of the interval breakdown: compute hides comm, comm hides copies, moving
data wins over waiting), and among activities of one kind the one that started first (then: ended last,
lowest stream, smallest name).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb

from traceq import query
from traceq.errors import ConfigError, EmptySelection
from traceq.report import crossrank
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

# what a timeline is doing: a piece's kind, or an idle kind (negative codes in Timeline.codes)
KINDS = ("compute", "comm_transfer", "comm_wait", "memcpy", "memset", "idle_host_bound", "idle_sync", "idle_other")
IDLE_OTHER, IDLE_HOST_BOUND, IDLE_SYNC = -1, -2, -3
_IDLE_KIND = {IDLE_OTHER: "idle_other", IDLE_HOST_BOUND: "idle_host_bound", IDLE_SYNC: "idle_sync"}
# a piece's priority, by kind (lower wins)
_PRIORITY = {"compute": 0, "comm_transfer": 1, "comm_wait": 2, "memcpy": 3, "memset": 3}
_FAR = 2**62  # "no bound": before or after every time of a trace
# activity rows read per batch of steps (the walk holds one batch at a time)
BATCH_ROWS = 4_000_000

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
        [t - 1, t). Codes >= 0 are pieces (:meth:`piece`), < 0 idle kinds."""
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
                t_w = int(act["start_ns"][i]) + int(act["wait_ns"][i])
                s_l = int(act["to_start_ns"][i])
                jumps.append({
                    "run": step.run, "step": step.step, "from_rank": key[1], "to_rank": int(act["to_rank"][i]),
                    "path_ns": t + offset, "collective_type": act["collective_type"][i],
                    "process_group": act["process_group"][i], "instance_id": instance, "name": act["name"][i],
                    "wait_on_path_ns": t - int(act["start_ns"][i]),
                })
                key = (int(act["to_trace_id"][i]), int(act["to_rank"][i]), int(act["to_device"][i]))
                offset += t_w - s_l
                t += s_l - t_w
                continue
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


# --------------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class CriticalPath:
    """The critical paths of a run's selected steps (:func:`critical_path`).

    Attributes:
        steps: one row per step: its span on the last-ending rank (``last_rank``), how many ranks the path
            crosses and how often it jumps, its time by kind (ms), the rank and the kernel most on it.
        segments: the paths, one row per segment in time order (``order`` 0 first): rank, device, start_ns
            and end_ns on that rank's clock, path_start_ns on the last-ending rank's, dur_ns, kind, the
            kernel (name, category) or the collective (collective_type, process_group, instance_id).
        jumps: one row per jump: the step, the rank that waited (from_rank) and the one it waited for
            (to_rank, the last to arrive), the collective, and the waiting rank's wait up to the jump
            (wait_on_path_ns: what the late rank's lateness cost the step there).
        notes: how the collectives were matched, what the selection left out.
    """

    steps: pl.DataFrame
    segments: pl.DataFrame
    jumps: pl.DataFrame
    notes: list[str]

    def blame(self, by: Sequence[str] = ("rank", "kind")) -> pl.DataFrame:
        """Time on the path per step and ``by`` (columns of :attr:`segments`), in ms, largest first."""
        import polars as pl

        keys = ["run", "step", *by]
        return (self.segments.group_by(keys).agg(_ms(pl.col("dur_ns").sum()).alias("critical_ms"))
                .sort(["run", "step", "critical_ms"], descending=[False, False, True]))

    def ranks(self) -> pl.DataFrame:
        """Per rank over the steps: its time on the path (ms) and share of the paths' time, the steps it is
        on, its compute on the path, and the waiting its lateness cost (``wait_caused_ms``: the waits the
        path jumped through to it)."""
        import polars as pl

        total = self.segments.group_by("run").agg(pl.col("dur_ns").sum().alias("total"))
        per = self.segments.group_by("run", "rank").agg(
            _ms(pl.col("dur_ns").sum()).alias("critical_ms"),
            _ms(pl.col("dur_ns").filter(pl.col("kind") == "compute").sum()).alias("compute_ms"),
            pl.col("step").n_unique().alias("steps_on_path"),
        )
        caused = self.jumps.group_by("run", pl.col("to_rank").alias("rank")).agg(
            _ms(pl.col("wait_on_path_ns").sum()).alias("wait_caused_ms"), pl.len().alias("waited_for"))
        steps = self.steps.group_by("run").agg(pl.len().alias("steps"))
        return (
            per.join(total, on="run").join(steps, on="run").join(caused, on=["run", "rank"], how="left")
            .with_columns((pl.col("critical_ms") * 1e6 / pl.col("total")).alias("share"),
                          pl.col("wait_caused_ms").fill_null(0.0), pl.col("waited_for").fill_null(0))
            .select("run", "rank", "critical_ms", "share", "steps_on_path", "steps", "compute_ms", "waited_for",
                    "wait_caused_ms")
            .sort(["run", "critical_ms", "rank"], descending=[False, True, False])
        )

    def kernels(self, top: int | None = 20) -> pl.DataFrame:
        """The kernels and collectives most on the paths: per (kind, name) their time on the path (ms), its
        share, the steps they are on and the ranks they ran on; idle is left out (``steps`` and
        :meth:`blame` hold it)."""
        import polars as pl

        work = self.segments.filter(~pl.col("kind").str.starts_with("idle"))
        total = max(int(self.segments["dur_ns"].sum()), 1)
        table = (
            work.group_by("run", "kind", "name").agg(
                _ms(pl.col("dur_ns").sum()).alias("critical_ms"),
                pl.col("step").n_unique().alias("steps_on_path"),
                pl.col("rank").unique().sort().alias("ranks"),
                pl.col("category").drop_nulls().first().alias("category"),
                pl.col("collective_type").drop_nulls().first().alias("collective_type"),
            )
            .with_columns((pl.col("critical_ms") * 1e6 / total).alias("share"),
                          pl.col("ranks").list.eval(pl.element().cast(pl.String)).list.join(",").alias("ranks"))
            .sort(["run", "critical_ms", "name"], descending=[False, True, False])
            .select("run", "kind", "critical_ms", "share", "steps_on_path", "ranks", "category", "collective_type",
                    "name")
        )
        return table.head(top) if top else table

    def sentence(self, step: int) -> str:
        """The step's path in one sentence: 'step 12 took 93.0 ms on rank 3's clock: 61.0 ms is rank 3's
        compute (mostly nvjet_... 40.1 ms), ...'."""
        import polars as pl

        row = self.steps.filter(pl.col("step") == step).row(0, named=True)
        parts = self.blame(("rank", "kind")).filter(pl.col("step") == step)
        words = []
        for r in parts.head(3).iter_rows(named=True):
            text = f"{r['critical_ms']:.1f} ms is rank {r['rank']}'s {r['kind'].replace('_', ' ')}"
            if r["kind"] in ("compute", "comm_transfer", "memcpy", "memset"):
                top = (self.segments.filter((pl.col("step") == step) & (pl.col("rank") == r["rank"])
                                            & (pl.col("kind") == r["kind"]))
                       .group_by("name").agg(pl.col("dur_ns").sum()).sort(["dur_ns", "name"], descending=[True, False]))
                if top.height:
                    text += f" (mostly {_short(top['name'][0])}, {top['dur_ns'][0] / 1e6:.1f} ms)"
            words.append(text)
        jumps = self.jumps.filter(pl.col("step") == step)
        tail = ""
        if jumps.height:
            waited = jumps.group_by("to_rank").agg(pl.col("wait_on_path_ns").sum(), pl.len()).sort(
                "wait_on_path_ns", descending=True).row(0, named=True)
            tail = (f"; the path jumps {jumps.height} time(s) at collectives, most to rank {waited['to_rank']} "
                    f"({waited['len']} time(s), {waited['wait_on_path_ns'] / 1e6:.1f} ms of waiting on the path)")
        return (f"step {step} took {row['span_ms']:.1f} ms on rank {row['last_rank']}'s clock (the last to end): "
                + "; ".join(words) + tail)


def _ms(ns: pl.Expr) -> pl.Expr:
    """ns as ms, rounded to the ns (no float noise in CSV and JSON)."""
    return (ns / 1e6).round(6)


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def critical_path(
    db: Warehouse = DEFAULT_DB,
    *,
    run: str | None = None,
    selection: StepSelection = StepSelection(),
    steps: Sequence[int] | None = None,
) -> CriticalPath:
    """The critical path of every selected step of ``run`` (README: The critical path).

    Args:
        db: the warehouse.
        run: the run (may be left out when the warehouse holds one).
        selection: which steps (the open last step is left out by default, as everywhere).
        steps: only these step numbers, within the selection.
    """
    import polars as pl

    from traceq.report.metrics import nothing_selected, require_runs
    from traceq.report.notes import selection_notes

    with opened(db) as con:
        require_runs(con, [run] if run else None)
        held = [r for (r,) in con.execute("select distinct run from traces order by run").fetchall()]
        if run is None:
            if len(held) > 1:
                raise ConfigError(f"the warehouse holds {len(held)} runs: name one with --run ({', '.join(held[:8])}"
                                  f"{', ...' if len(held) > 8 else ''})", param="run")
            run = held[0]
        windows = _windows(con, run, selection)
        if steps is not None:
            wanted = sorted(set(steps))
            missing = [s for s in wanted if s not in set(windows["step"].to_list())]
            if missing:
                have = windows["step"].unique().sort().to_list()
                raise EmptySelection(
                    f"run {run}: no step {', '.join(map(str, missing))} in the selection ({selection.describe()}); "
                    f"it has {_ranges(have) if have else 'none'}")
            windows = windows.filter(pl.col("step").is_in(wanted))
        if windows.height == 0:
            raise EmptySelection(nothing_selected(con, selection, [run]))
        with crossrank.matched(con, [run]) as table:
            walker = Walker(con, run, table)
            for batch in _batches(con, run, windows):
                walker.batch(_bounds(batch))
                for step in _step_starts(run, batch):
                    walker.walk(step)
            notes = [*crossrank.matching_notes(con, [run]), *selection_notes(con, selection, [run])]
    return _report(run, windows, walker, notes)


def _windows(con: duckdb.DuckDBPyConnection, run: str, selection: StepSelection) -> pl.DataFrame:
    """The run's selected device windows with their wall-clock offsets (windows of length 0 left out)."""
    rel = query.run(con, "selected_windows", query_params(selection)).set_alias("w")
    offsets = query.run(con, "wall_offsets").set_alias("o")
    rows = con.sql(
        """
        select w.trace_id, w.rank, w.device, w.step, w.start_ns, w.end_ns, o.offset_ns
        from rel as w
        inner join offsets as o using (trace_id)
        inner join traces as t using (trace_id)
        where t.run = $run and w.end_ns > w.start_ns
        order by w.step, w.rank, w.device
        """,
        params={"run": run},
    )
    return to_polars(rows)


def _batches(con: duckdb.DuckDBPyConnection, run: str, windows: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """The windows in batches of consecutive steps whose activity is about :data:`BATCH_ROWS` rows."""
    import polars as pl

    events = con.execute(
        "select coalesce(sum(n_gpu_events + n_host_events), 0) from traces where run = ?", [run]).fetchall()[0][0]
    all_steps = con.execute(
        "select count(distinct step) from steps inner join traces using (trace_id) where run = ?", [run]).fetchall()[0][0]
    per_step = max(events / max(all_steps, 1), 1)
    size = max(1, int(BATCH_ROWS // per_step))
    steps = windows["step"].unique().sort().to_list()
    for i in range(0, len(steps), size):
        yield windows.filter(pl.col("step").is_in(steps[i:i + size]))


def _bounds(batch: pl.DataFrame) -> dict[int, tuple[int, int]]:
    """Per trace, the time range to read for a batch of windows: theirs, widened by the longest of them on
    each side (the walk may go before a jumped-to rank's window; beyond that it reads the whole trace)."""
    import polars as pl

    spans = batch.group_by("trace_id").agg(
        pl.col("start_ns").min(), pl.col("end_ns").max(), (pl.col("end_ns") - pl.col("start_ns")).max().alias("w"))
    return {int(r["trace_id"]): (int(r["start_ns"] - r["w"]), int(r["end_ns"] + r["w"])) for r in spans.iter_rows(named=True)}


def _step_starts(run: str, batch: pl.DataFrame) -> Iterator[Step]:
    """Per step of the batch, the window that ends last on the wall clock (ties: lowest rank, device)."""
    import polars as pl

    last = (batch.with_columns((pl.col("end_ns") + pl.col("offset_ns")).alias("wall_end"))
            .sort(["step", "wall_end", "rank", "device"], descending=[False, True, False, False])
            .group_by("step", maintain_order=True).first())
    for r in last.iter_rows(named=True):
        yield Step(run, int(r["step"]), (int(r["trace_id"]), int(r["rank"]), int(r["device"])),
                   int(r["start_ns"]), int(r["end_ns"]))


def _ranges(values: list[int]) -> str:
    return f"{values[0]}..{values[-1]}" if len(values) > 1 else str(values[0])


SEGMENT_SCHEMA = {
    "run": "String", "step": "Int64", "order": "Int64", "rank": "Int64", "device": "Int64", "trace_id": "Int64",
    "start_ns": "Int64", "end_ns": "Int64", "path_start_ns": "Int64", "kind": "String", "name": "String",
    "category": "String", "collective_type": "String", "process_group": "String", "instance_id": "UInt64",
}
JUMP_SCHEMA = {
    "run": "String", "step": "Int64", "from_rank": "Int64", "to_rank": "Int64", "path_ns": "Int64",
    "collective_type": "String", "process_group": "String", "instance_id": "UInt64", "name": "String",
    "wait_on_path_ns": "Int64",
}


def _frame(rows: list[dict[str, Any]], schema: dict[str, str]) -> pl.DataFrame:
    import polars as pl

    types = {c: getattr(pl, t) for c, t in schema.items()}
    return pl.DataFrame([{c: r.get(c) for c in schema} for r in rows], schema=types, orient="row") if rows \
        else pl.DataFrame(schema=types)


def _report(run: str, windows: pl.DataFrame, walker: Walker, notes: list[str]) -> CriticalPath:
    import polars as pl

    segments = _frame(walker.segments, SEGMENT_SCHEMA).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    jumps = _frame(walker.jumps, JUMP_SCHEMA)
    last = {(s.step): s for s in _step_starts(run, windows)}
    by_kind = segments.group_by("step").agg(
        *[_ms(pl.col("dur_ns").filter(pl.col("kind").is_in(kinds)).sum()).alias(f"{label}_ms")
          for label, kinds in (("compute", ["compute"]), ("transfer", ["comm_transfer"]), ("wait", ["comm_wait"]),
                               ("copy", ["memcpy", "memset"]),
                               ("idle", ["idle_host_bound", "idle_sync", "idle_other"]))],
        pl.col("rank").n_unique().alias("ranks_on_path"),
    )
    top_rank = (segments.group_by("step", "rank").agg(pl.col("dur_ns").sum())
                .sort(["step", "dur_ns", "rank"], descending=[False, True, False]).group_by("step", maintain_order=True)
                .first().select("step", pl.col("rank").alias("top_rank"), _ms(pl.col("dur_ns")).alias("top_rank_ms")))
    top_kernel = (segments.filter(~pl.col("kind").str.starts_with("idle")).group_by("step", "name").agg(pl.col("dur_ns").sum())
                  .sort(["step", "dur_ns", "name"], descending=[False, True, False]).group_by("step", maintain_order=True)
                  .first().select("step", pl.col("name").alias("top_kernel"), _ms(pl.col("dur_ns")).alias("top_kernel_ms")))
    n_jumps = jumps.group_by("step").agg(pl.len().alias("jumps"))
    steps = pl.DataFrame(
        [{"run": run, "step": s.step, "last_rank": s.key[1], "span_ms": round((s.end_ns - s.start_ns) / 1e6, 6)}
         for s in last.values()],
        schema={"run": pl.String, "step": pl.Int64, "last_rank": pl.Int64, "span_ms": pl.Float64},
    )
    steps = (steps.join(by_kind, on="step", how="left").join(n_jumps, on="step", how="left")
             .join(top_rank, on="step", how="left").join(top_kernel, on="step", how="left")
             .with_columns(pl.col("jumps").fill_null(0)).sort("step")
             .select("run", "step", "span_ms", "last_rank", "ranks_on_path", "jumps", "compute_ms", "transfer_ms",
                     "wait_ms", "copy_ms", "idle_ms", "top_rank", "top_rank_ms", "top_kernel_ms", "top_kernel"))
    order = ["run", "step", "order", "rank", "device", "trace_id", "start_ns", "end_ns", "dur_ns", "path_start_ns", "kind",
             "name", "category", "collective_type", "process_group", "instance_id"]
    return CriticalPath(steps, segments.select(order), jumps, notes)


def write_critical_path_html(path: str, result: CriticalPath, step: int | None = None) -> int:
    """The critical path as one self-contained page: the step's path across ranks (``step``; default: the
    longest step), the sentence per step, the steps, the ranks and the kernels on the paths. Returns the
    step drawn."""
    import polars as pl

    from traceq.report import plots
    from traceq.report.html import _figure, _notes, _section, _table, write_page

    steps = result.steps
    if step is None:
        step = int(steps.sort(["span_ms", "step"], descending=[True, False])["step"][0])
    start = result.segments.filter((pl.col("step") == step) & (pl.col("order") == 0))["path_start_ns"][0]
    run = steps["run"][0]
    sections = [
        _section(f"Step {step}", _figure(plots.critical_path_figure(result.segments, result.jumps, step, start), "path")
                 + _notes([result.sentence(step), KIND_NOTE])),
        _section("Every step", _table(steps) + _notes([result.sentence(s) for s in steps["step"].to_list()[:50]])),
        _section("Ranks on the path", _table(result.ranks())),
        _section("Kernels and collectives on the path", _table(result.kernels(30)) + _notes(result.notes)),
    ]
    write_page(path, f"traceq critical path: {run}", "traceq critical path", f"run {run} · {steps.height} step(s)",
               sections)
    return step


KIND_NOTE = (
    "the path walks back from the end of the step on the rank whose window ends last: its time goes to what the "
    "device was doing (compute over comm transfer over comm wait over memcpy/memset; idle split host-bound / "
    "sync / other), and where a rank waited at a matched collective it jumps to the rank that arrived last, at "
    "the moment that rank's kernel started; device-level: it does not see CPU-side dependencies inside a rank "
    "beyond the idle split"
)
