"""Brute-force reference for the critical path of a step across the ranks of a run (DESIGN §10).

Written APART from traceq's code: it reads nothing under ``traceq/`` nor any ``sql/*.sql`` file; it uses
only the standard library, the two other brute-force references (``tests/step_reference.py``: parsing,
kernel classes, launches, step windows, interval algebra; ``tests/comm_reference.py``: collective matching,
wait / transfer, the last arriver) and the data files ``sql/kernel_rules.csv`` (through step_reference)
and ``sql/event_categories.csv``. It favours obviously-correct code (explicit loops over sorted
boundaries) over speed.

Public API
  * ``critical_paths(paths, offsets=None, marker=DEFAULT_MARKER) -> {"steps", "segments", "jumps"}``
  * ``scenarios(tmp) -> {name: [trace paths]}``: hand-made Kineto traces; ``EXPECTED`` (their paths worked
    out by hand, closed steps), ``EXPECTED_LAST`` (the open last step), ``EXPECTED_JUMPS``, ``STEPS``.
  * Self-check: ``.venv/bin/python -m tests.critical_path_reference`` from the project root.

Rules implemented (the brief's precise spec of the critical path, with DESIGN §3, §4, §9, §10)
  Timelines and pieces
  * A timeline is one (rank, device) of the run, holding all its device activity (step_reference's
    activities: kernel/memcpy/memset events, class ``sync`` dropped) whatever step launched it.
  * Pieces: compute kernel -> ``compute`` [start, end); comm kernel with wait w (comm_reference: the
    duration rule for matched instances, the start-time rule for rooted ones on one clock, 0 when
    unmatched or not inferable) -> ``comm_wait`` [start, start + w) and ``comm_transfer`` [start + w, end);
    memcpy -> ``memcpy``; memset -> ``memset``; zero-length pieces dropped.
  * What a timeline is doing at instant x: the best piece with start <= x < end, by (priority compute 4 >
    comm_transfer 3 > comm_wait 2 > memcpy 1 = memset 1, then earliest piece start, latest piece end, lowest
    stream, smallest name). Where no piece runs: idle, split as the idle breakdown: inside a gap [g0, g1)
    (between the timeline's first start and last end, with no activity): ``idle_sync`` if a sync island
    (union of the rank's runtime events matching their category's sync pattern, dur > 0, any thread) holds
    x, else ``idle_unknown`` if no activity starting exactly at g1 has a launch (DESIGN §4: the trace has
    no launch event to tell; never guess), else ``idle_host_bound`` if x < h, else ``idle_other``; h = the
    earliest runtime event with the same (rank, correlation) as any activity starting exactly at g1,
    clamped to [g0, g1]. Outside every gap (before the first activity, after the last): ``idle_unknown``
    (no activity ends it, or none that the timeline holds: nothing tells a cause).
  * Implementation: every boundary of a timeline (piece starts/ends, gap ends, h, sync-island edges) is
    sorted; on each elementary interval between two consecutive boundaries "what the timeline is doing"
    is constant and is computed once (a heap of the running pieces ordered by the rule above); runs of
    equal consecutive things (the same piece, or the same idle kind) are merged. "What T is doing on
    [t - 1, t)" is the run holding t - 1.
  The walk, per step N
  * The step's timelines: those with a window for N with end > start (step_reference.step_windows per
    file). A = the one whose window ends last on the wall clock (end + file offset; ties: lowest rank, then
    lowest device). Cursor (T, t, o), path time P = t + o; start (A, A.end, 0); while P > A.start:
    the run R holding t - 1 on T; b = max(R.start, A.start - o). If R is the ``comm_wait`` piece of kernel
    k whose instance was not jumped through since the last segment: jump to the last arriver L's kernel
    k_L (start s_L): t_w = k.start + w_k; (T, t, o) <- (T_L, t + s_L - t_w, o + t_w - s_L); a jump record
    (step, from rank, to rank, P, k's name and start, wait_on_path = t - b: the waiting on the path, what
    ran beside it excluded). A rooted instance on one clock (rule 7r) jumps at the same instant (T_L, t, o).
    Otherwise write the
    segment [b, t) on T (a jumped-through instance met again is written as a ``comm_wait`` segment: the
    cycle rule) and set t = b.
  * Segments in time order tile [A.start, A.end] in path time (asserted by the self-check).
  CPU-only traces (gloo; a file with no device activity)
  * Timeline (rank, -1). Activity: ``gloo:*`` host spans = comm (collective type from the rest of the
    name, comm_reference.collective_type); operator spans (cat cpu_op / Operator / python_function: the
    ``operator`` role of event_categories.csv) on every (rank, pid, tid) thread that runs no gloo span =
    compute, except names starting with ``c10d::`` and names the step marker matches. No launches.
  * gloo spans are matched with comm_reference's matcher (its ``_match``): group = the header's
    distributedInfo.pg_config when it has exactly one entry (pg_name, ranks; group size = len(ranks), else
    pg_size), no Seq, so instances are keyed by (group, collective type, order of occurrence on the rank).
  * Windows: the marker's CPU spans of each rank (numbered and merged as step_reference numbers CPU
    steps), kept monotonic in step-number order: s_N = max(span start, e_{N-1}), e_N = max(span end, s_N).

Points the spec leaves open, and how they are resolved here (none silently):
  1. Tie-break "earliest start, then latest end" uses the PIECE's bounds (a transfer piece starts at
     start + w), not the kernel's.
  2. Pieces equal on every key (duplicate events): the one earlier in the run's file list, then earlier in
     its file, wins (deterministic; the spec gives no further key).
  3. Stream = args.stream as an integer, else the event's tid as an integer; a piece with neither sorts
     after every known stream. For CPU spans the "stream" is the tid.
  4. Zero-length activities make no piece but do take part in gaps, exactly like the idle breakdown's
     sweep (tests/test_idle_breakdown.py): a zero-length activity inside an idle stretch splits it into two
     gaps, and its launch decides h of the gap that ends at it; it also counts for the timeline's first
     start and last end.
  5. Launches: any host runtime event with an args.correlation counts (not only launch-pattern names),
     looked up by (rank, correlation) in the activity's own file (step_reference's launch_ts).
  6. Sync islands: the rank's runtime sync events from every file of the run holding that rank.
  7. wait_on_path_ns = t - b (b: where the wait run begins, cut at the step's start): the exposed wait, not
     the kernel's whole wait part (revised after review: t - k.start counted wait hidden under compute).
  8. The jumps of a step are listed in the order the walk made them (latest path time first); steps and
     segments by step, segments by order (0 = earliest).
  9. A rooted instance on one clock whose waiting kernel ended before the last arriver started (w = dur):
     t_w = k.start + w = k.end, which is not s_L: the jump then keeps the instant on the shared clock
     (revised after review: the spec's formula moved the cursor forward in time there).
 10. Windows whose step number is None (a rank without CPU steps: step_reference's step-None window) are
     not steps: skipped. All steps are returned, including each rank's last (open) step: no selection.
 11. CPU-only is decided per file: a file without any device activity (sync-class kernels aside). A GPU
     file's gloo spans (if any) are ignored.
 12. CPU-only windows: see above (s_N = max(start, e_{N-1}), e_N = max(end, s_N)); time between two step
     spans belongs to no step. Operator spans may nest: the outermost wins by rule 1's tie-break (earliest
     start, then latest end). ``record_param_comms`` and other non-c10d ops on a non-gloo thread are compute.
 13. gloo group size: comm_reference's rule 3 order (len(pg_config ranks), else pg_size); send/recv gloo
     spans are point-to-point and never matched (comm_reference rule 4).
 14. Two files holding the same (rank, device) timeline: an error (a run holds each timeline once).
 15. ``offsets`` keys are path strings as given (also tried: the resolved path); a file not in the dict
     gets its baseTimeNanoseconds (an integer) else 0.
 16. A jump target is the timeline (rank, device) of the last arriver's kernel, which always has activity.
     The cycle rule's set of jumped-through instances is cleared whenever a segment is written.
 17. Path time is A's clock: ``path_start_ns`` = segment start + o; ``path_ns`` of a jump = t + o before
     the jump. Segment start_ns / end_ns are on the segment's own timeline's clock (the file's ts, without
     the file's offset).
 18. "The maximal run of the same idle kind" is taken over instants: two idle stretches of the same kind
     separated only by a zero-length activity are one run, and the idle_unknown before a timeline's first
     activity / after its last one merges with an idle_unknown gap it touches (possible only through
     zero-length activities).
 19. "Smallest name" compares Python strings (code points). Windows with end == start never take part in
     choosing A (nor make a step).

Helpers of comm_reference used besides its documented rules: ``_read`` (JSON with Decimal floats),
``_comm_kernels`` (every comm kernel of the run with its raw attributes), ``_match`` (matching, wait,
transfer, arrived_last, in place; also applied to the gloo spans built here) and ``_members``.
"""

from __future__ import annotations

import bisect
import csv
import functools
import heapq
import json
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests import comm_reference as cr
from tests import step_reference as sr

DEFAULT_MARKER = sr.DEFAULT_MARKER
US = 1000

CATEGORIES_CSV = Path(__file__).resolve().parent.parent / "sql" / "event_categories.csv"
PRIORITY = {"compute": 4, "comm_transfer": 3, "comm_wait": 2, "memcpy": 1, "memset": 1}
IDLE_KINDS = ("idle_host_bound", "idle_sync", "idle_other", "idle_unknown")
KINDS = tuple(PRIORITY) + IDLE_KINDS
GLOO_PREFIX = "gloo:"
OUTSIDE = ("idle", "idle_unknown")  # idle outside every gap
NEG_INF, POS_INF = float("-inf"), float("inf")


# ----------------------------------------------------------------------------------------------------
# Event categories (sql/event_categories.csv): roles and sync patterns


@functools.lru_cache(maxsize=1)
def _categories() -> tuple[dict[str, str], dict[str, re.Pattern]]:
    roles, sync = {}, {}
    with open(CATEGORIES_CSV, newline="") as fh:
        for row in csv.DictReader(fh):
            cat = row["cat"].strip()
            roles[cat] = row["role"].strip()
            pattern = (row.get("sync_pattern") or "").strip()
            if pattern:
                sync[cat] = re.compile(pattern)
    return roles, sync


def _runtime_cats() -> frozenset:
    return frozenset(c for c, r in _categories()[0].items() if r == "runtime")


def _operator_cats() -> frozenset:
    return frozenset(c for c, r in _categories()[0].items() if r == "operator")


# ----------------------------------------------------------------------------------------------------
# Loading one run


@dataclass(eq=False)
class Act:
    """One activity of a timeline (a device event, or a CPU span of a CPU-only file)."""

    pi: int  # index of the file in the run
    order: int  # index of the event in the file's traceEvents
    rank: int
    device: int
    start: int
    end: int
    cls: str  # compute | comm | memcpy | memset
    name: str
    stream: int | None
    launch: int | None  # start of the earliest runtime event with the same (rank, correlation)
    comm: dict | None = None  # comm_reference's kernel dict (wait_ns, instance, arrived_last, ...)


@dataclass
class _File:
    pi: int
    path: str
    offset: int
    cpu_only: bool
    acts: list[Act] = field(default_factory=list)
    sync: dict[int, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    gloo: list[dict] = field(default_factory=list)  # comm_reference-style kernel dicts for gloo spans
    windows: list[dict] = field(default_factory=list)  # rank, device, step, start_ns, end_ns


def _rank_of(args: dict, file_rank) -> int:
    r = sr.to_int(args.get("rank"))
    if r is not None:
        return r
    return file_rank if file_rank is not None else -1


def _name_of(ev: dict) -> str:
    name = ev.get("name")
    return name if isinstance(name, str) else ("" if name is None else str(name))


def _offset_for(path, offsets, header_base) -> int:
    if offsets:
        for key in (str(path), str(Path(path).resolve())):
            if key in offsets:
                return int(offsets[key])
    return header_base if header_base is not None else 0


def _cpu_windows(host_spans, rx: re.Pattern) -> list[dict]:
    """CPU-only windows: the marker's CPU spans per rank, numbered like step_reference's CPU steps,
    kept monotonic (s_N = max(start, e_{N-1}), e_N = max(end, s_N))."""
    matches = defaultdict(list)
    for rank, name, s, e in host_spans:
        m = rx.search(name)
        if m is None:
            continue
        num = None
        if rx.groups >= 1 and m.group(1) is not None and re.fullmatch(r"[+-]?[0-9]+", m.group(1)):
            num = int(m.group(1))
        matches[rank].append((s, e, num))
    out = []
    for rank in sorted(matches):
        spans: dict[int, tuple[int, int]] = {}
        for ordinal, (s, e, num) in enumerate(sorted(matches[rank], key=lambda m: (m[0], m[1])), start=1):
            n = num if num is not None else ordinal
            if n in spans:
                spans[n] = (min(spans[n][0], s), max(spans[n][1], e))
            else:
                spans[n] = (s, e)
        prev_end = None
        for n in sorted(spans):
            s, e = spans[n]
            if prev_end is not None:
                s = max(s, prev_end)
            e = max(e, s)
            out.append(dict(rank=rank, device=-1, step=n, start_ns=s, end_ns=e))
            prev_end = e
    return out


def _load_file(pi: int, path, offsets, rx: re.Pattern) -> _File:
    doc = cr._read(path)
    file_rank, base, pg_cfg = None, None, None
    events = doc if isinstance(doc, list) else []
    if isinstance(doc, dict):
        info = doc.get("distributedInfo")
        if isinstance(info, dict):
            file_rank = sr.to_int(info.get("rank"))
            pgc = info.get("pg_config")
            if isinstance(pgc, list) and len(pgc) == 1 and isinstance(pgc[0], dict):
                pg_cfg = pgc[0]
        base = sr.to_int(doc.get("baseTimeNanoseconds"))
        events = doc.get("traceEvents") or []
    trace = sr.load(path)
    runtime_cats = _runtime_cats()
    sync_rx = _categories()[1]
    acts: list[Act] = []
    host = []  # (order, rank, cat, name, start, end, thread, tid)
    sync = defaultdict(list)
    for order, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        start, dur = sr.ns(ev.get("ts")), sr.ns(ev.get("dur"))
        if start is None or dur is None or dur < 0:
            continue
        end = start + dur
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        rank = _rank_of(args, file_rank)
        cat = ev.get("cat")
        name = _name_of(ev)
        if cat in sr.DEVICE_CATS:
            device = sr.to_int(args.get("device"))
            if device is None:
                device = sr.to_int(ev.get("pid"))
            if device is None:
                device = -1
            if cat in sr.MEMCPY_CATS:
                cls = "memcpy"
            elif cat in sr.MEMSET_CATS:
                cls = "memset"
            else:
                cls = sr.kernel_class(name, args)
            if cls == "sync":
                continue
            stream = sr.to_int(args.get("stream"))
            if stream is None:
                stream = sr.to_int(ev.get("tid"))
            corr = sr.to_int(args.get("correlation"))
            launch = trace.launch_ts.get((rank, corr)) if corr is not None else None
            acts.append(Act(pi, order, rank, device, start, end, cls, name, stream, launch))
            continue
        if cat == sr.GPU_ANNOTATION_CAT:
            continue
        if cat in runtime_cats and cat in sync_rx and sync_rx[cat].search(name) and dur > 0:
            sync[rank].append((start, end))
        thread = (rank, str(ev.get("pid")), str(ev.get("tid")))
        host.append((order, rank, cat, name, start, end, thread, sr.to_int(ev.get("tid"))))

    # the same activities, in the same order, as step_reference's parse (windows come from it)
    mine = [(a.rank, a.device, a.start, a.end, a.cls, a.name) for a in acts]
    theirs = [(a.rank, a.device, a.start, a.end, a.cls, a.name) for a in trace.activities]
    assert mine == theirs, f"{path}: activity parse differs from step_reference"

    f = _File(pi=pi, path=str(path), offset=_offset_for(path, offsets, base), cpu_only=not acts, sync=sync)
    if acts:
        f.acts = acts
        f.windows = [w for w in sr.step_windows(path, rx.pattern) if w["step"] is not None]
        return f

    # CPU-only file: gloo spans are comm, operator spans on threads without gloo spans are compute
    operator_cats = _operator_cats()
    gloo_threads = {h[6] for h in host if h[3].startswith(GLOO_PREFIX)}
    for order, rank, cat, name, start, end, thread, tid in host:
        if name.startswith(GLOO_PREFIX):
            act = Act(pi, order, rank, -1, start, end, "comm", name, tid, None)
            f.acts.append(act)
            k = dict(path=str(path), pi=pi, order=order, name=name, rank=rank, device=-1, start_ns=start,
                     end_ns=end, dur_ns=end - start, seq=None, reason=None, size_bytes=None,
                     collective_type=cr.collective_type(name[len(GLOO_PREFIX):]))
            pg, members, n = None, None, None
            if pg_cfg is not None and pg_cfg.get("pg_name") not in (None, ""):
                pg, members = str(pg_cfg["pg_name"]), cr._members(pg_cfg.get("ranks"))
                n = len(members) if members is not None else sr.to_int(pg_cfg.get("pg_size"))
                n = n if n is not None and n > 0 else None
            k.update(pg_name=pg, members=members, group_size=n)
            k["reason"] = ("no process group" if pg is None else "no group size" if n is None
                           else "point-to-point" if k["collective_type"] in cr.P2P else None)
            f.gloo.append(k)
        elif (cat in operator_cats and thread not in gloo_threads and not name.startswith("c10d::")
              and rx.search(name) is None):
            f.acts.append(Act(pi, order, rank, -1, start, end, "compute", name, tid, None))
    f.windows = _cpu_windows(trace.host_spans, rx)
    return f


def _match(paths, files: list[_File]) -> dict:
    """Attach comm_reference's matched kernel dicts to the comm activities; instance -> last arriver."""
    kernels = cr._comm_kernels(paths)  # device comm kernels of the whole run (pi = index in paths)
    for f in files:
        kernels.extend(f.gloo)
    cr._match(kernels)
    by_key = {(k["pi"], k["order"]): k for k in kernels}
    assert len(by_key) == len(kernels)
    n_comm = 0
    for f in files:
        for a in f.acts:
            if a.cls == "comm":
                a.comm = by_key[(a.pi, a.order)]
                assert a.comm["rank"] == a.rank and a.comm["device"] == a.device
                assert a.comm["start_ns"] == a.start and a.comm["end_ns"] == a.end
                assert 0 <= a.comm["wait_ns"] <= a.end - a.start
                n_comm += 1
    assert n_comm == len(kernels), "comm kernels of comm_reference and activities differ"
    last = {}
    for k in kernels:
        if k["matched"] and k["arrived_last"]:
            assert k["instance"] not in last
            last[k["instance"]] = k
    return last


# ----------------------------------------------------------------------------------------------------
# A timeline: what it is doing, instant by instant (as runs over sorted boundaries)


@dataclass(eq=False)
class Piece:
    kind: str
    start: int
    end: int
    act: Act


class Timeline:
    """One (rank, device): its runs [start, end) of 'the same thing' (a piece, or an idle kind)."""

    def __init__(self, rank: int, device: int, acts: list[Act], islands: list[tuple[int, int]]):
        self.rank, self.device = rank, device
        acts = sorted(acts, key=lambda a: (a.start, a.end, a.pi, a.order))
        pieces: list[Piece] = []
        for a in acts:
            if a.cls == "comm":
                w = a.comm["wait_ns"] if a.comm is not None else 0
                cand = [Piece("comm_wait", a.start, a.start + w, a), Piece("comm_transfer", a.start + w, a.end, a)]
            else:
                cand = [Piece(a.cls, a.start, a.end, a)]
            pieces.extend(p for p in cand if p.end > p.start)
        self.pieces = pieces

        # gaps, exactly as the idle breakdown's sweep (zero-length activities included)
        gaps = []  # (g0, g1, h); h None: no activity ending the gap has a launch
        busy = None
        i = 0
        while i < len(acts):
            s = acts[i].start
            j = i
            while j < len(acts) and acts[j].start == s:
                j += 1
            if busy is not None and s > busy:
                launches = [a.launch for a in acts[i:j] if a.launch is not None]
                lch = min(launches) if launches else None
                h = None if lch is None else min(s, max(busy, lch))
                gaps.append((busy, s, h))
            for a in acts[i:j]:
                busy = a.end if busy is None else max(busy, a.end)
            i = j
        self.gaps = gaps
        self.first = acts[0].start if acts else None
        self.last = busy
        self.islands = sr.union(islands)

        self.runs: list[tuple] = []
        if self.first is None or self.last <= self.first:  # nothing but idle outside every gap, everywhere
            self.runs = [(NEG_INF, POS_INF, OUTSIDE)]
            self.run_starts = [NEG_INF]
            return
        bounds = {self.first, self.last}
        for p in pieces:
            bounds.add(p.start)
            bounds.add(p.end)
        for g0, g1, h in gaps:
            bounds.update((g0, g1) if h is None else (g0, g1, h))
        for s, e in self.islands:
            bounds.update((s, e))
        xs = sorted(x for x in bounds if self.first <= x <= self.last)

        order = sorted(range(len(pieces)), key=lambda i: pieces[i].start)
        heap: list[tuple] = []
        nxt = gi = ii = 0
        for x, y in zip(xs, xs[1:]):
            while nxt < len(order) and pieces[order[nxt]].start <= x:
                k = order[nxt]
                p = pieces[k]
                stream_key = (0, p.act.stream) if p.act.stream is not None else (1, 0)
                heapq.heappush(heap, (-PRIORITY[p.kind], p.start, -p.end, stream_key, p.act.name,
                                      p.act.pi, p.act.order, k))
                nxt += 1
            while heap and pieces[heap[0][-1]].end <= x:
                heapq.heappop(heap)
            if heap:
                thing = ("piece", heap[0][-1])
            else:
                while gi < len(gaps) and gaps[gi][1] <= x:
                    gi += 1
                assert gi < len(gaps) and gaps[gi][0] <= x < gaps[gi][1], (rank, device, x)
                while ii < len(self.islands) and self.islands[ii][1] <= x:
                    ii += 1
                if ii < len(self.islands) and self.islands[ii][0] <= x:
                    kind = "idle_sync"
                elif gaps[gi][2] is None:
                    kind = "idle_unknown"
                elif x < gaps[gi][2]:
                    kind = "idle_host_bound"
                else:
                    kind = "idle_other"
                thing = ("idle", kind)
            if self.runs and self.runs[-1][1] == x and self.runs[-1][2] == thing:
                self.runs[-1] = (self.runs[-1][0], y, thing)
            else:
                self.runs.append((x, y, thing))
        # outside [first, last): idle_unknown, merged with an idle_unknown run it touches (a zero-length
        # activity can make the first or last run an idle gap)
        if self.runs[0][2] == OUTSIDE:
            self.runs[0] = (NEG_INF, self.runs[0][1], OUTSIDE)
        else:
            self.runs.insert(0, (NEG_INF, self.first, OUTSIDE))
        if self.runs[-1][2] == OUTSIDE:
            self.runs[-1] = (self.runs[-1][0], POS_INF, OUTSIDE)
        else:
            self.runs.append((self.last, POS_INF, OUTSIDE))
        for r0, r1 in zip(self.runs, self.runs[1:]):
            assert r0[1] == r1[0] and r0[2] != r1[2]
        self.run_starts = [r[0] for r in self.runs]

    def run_before(self, t: int) -> tuple:
        """(start of the run holding instant t - 1 (-inf before the first activity), the thing it is)."""
        x = t - 1
        i = bisect.bisect_right(self.run_starts, x) - 1
        s, e, thing = self.runs[i]
        assert s <= x < e
        return s, thing

    def describe(self, thing) -> tuple[str, str | None, Piece | None]:
        if thing[0] == "idle":
            return thing[1], None, None
        p = self.pieces[thing[1]]
        return p.kind, p.act.name, p


# ----------------------------------------------------------------------------------------------------
# The walk


def _walk(step: int, a_tl: Timeline, a_start: int, a_end: int, timelines: dict, last: dict):
    segments, jumps = [], []
    T, t, o = a_tl, a_end, 0
    jumped: set = set()
    guard = 0
    while t + o > a_start:
        guard += 1
        assert guard < 50_000_000, "walk does not end"
        run_start, thing = T.run_before(t)
        b = a_start - o if run_start == NEG_INF else max(run_start, a_start - o)
        assert isinstance(b, int) and b < t
        kind, name, piece = T.describe(thing)
        if kind == "comm_wait":
            k = piece.act
            inst = k.comm["instance"]
            assert k.comm["matched"] and inst is not None
            if inst not in jumped:
                jumped.add(inst)
                L = last[inst]
                assert L is not k.comm
                t_w = k.start + k.comm["wait_ns"]
                s_l = L["start_ns"]
                jumps.append(dict(step=step, from_rank=T.rank, to_rank=L["rank"], path_ns=t + o, name=k.name,
                                  start_ns=k.start, wait_on_path_ns=t - b))
                # a rooted collective on one clock (all its kernels in one file): placed by start times, the
                # jump keeps the instant; otherwise the end of the wait part is where L's kernel began
                one_clock = k.comm.get("pi") == L.get("pi") and (
                    k.comm["collective_type"] in cr.ROOTED or L["collective_type"] in cr.ROOTED)
                if not one_clock:
                    t, o = t + (s_l - t_w), o + t_w - s_l
                T = timelines[(L["rank"], L["device"])]
                continue
            # cycle rule: an instance already jumped through since the last segment -> a comm_wait segment
        segments.append(dict(step=step, rank=T.rank, device=T.device, start_ns=b, end_ns=t, path_start_ns=b + o,
                             kind=kind, name=name))
        t = b
        jumped.clear()
    segments.reverse()
    for i, s in enumerate(segments):
        s["order"] = i
    return [{k: s[k] for k in ("step", "order", "rank", "device", "start_ns", "end_ns", "path_start_ns", "kind",
                               "name")} for s in segments], jumps


def _build(paths, offsets=None, marker=DEFAULT_MARKER):
    paths = [str(p) for p in paths]
    rx = re.compile(marker)
    files = [_load_file(pi, p, offsets, rx) for pi, p in enumerate(paths)]
    last = _match(paths, files)
    by_tl = defaultdict(list)
    owner = {}
    for f in files:
        keys = {(a.rank, a.device) for a in f.acts} | {(w["rank"], w["device"]) for w in f.windows}
        for key in keys:
            if key in owner and owner[key] != f.pi:
                raise ValueError(f"timeline rank {key[0]} device {key[1]} is in two files of the run")
            owner[key] = f.pi
        for a in f.acts:
            by_tl[(a.rank, a.device)].append(a)
    sync = defaultdict(list)
    for f in files:
        for rank, spans in f.sync.items():
            sync[rank].extend(spans)
    timelines = {key: Timeline(key[0], key[1], by_tl.get(key, []), sync.get(key[0], [])) for key in owner}
    return files, timelines, last


def critical_paths(paths, offsets=None, marker: str = DEFAULT_MARKER) -> dict:
    """The critical path of every step of one run (a list of Kineto trace files)."""
    files, timelines, last = _build(paths, offsets, marker)
    windows = defaultdict(list)  # step -> (wall end, rank, device, start, end)
    for f in files:
        for w in f.windows:
            if w["end_ns"] > w["start_ns"]:
                windows[w["step"]].append((w["end_ns"] + f.offset, w["rank"], w["device"], w["start_ns"], w["end_ns"]))
    steps, segments, jumps = [], [], []
    for n in sorted(windows):
        _, rank, device, s, e = min(windows[n], key=lambda x: (-x[0], x[1], x[2]))
        steps.append(dict(step=n, rank=rank, device=device, start_ns=s, end_ns=e))
        segs, jps = _walk(n, timelines[(rank, device)], s, e, timelines, last)
        segments.extend(segs)
        jumps.extend(jps)
    return {"steps": steps, "segments": segments, "jumps": jumps}


# ----------------------------------------------------------------------------------------------------
# Hand-made scenarios (Kineto JSON, the shape tests/tracegen.py writes; times below in us)

GEMM = "ampere_sgemm_128x64_nn"
GEMM_B = "ampere_sgemm_64x64_tn"
OPT = "multi_tensor_apply_kernel"
ELEMENTWISE = "vectorized_elementwise_kernel"
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
MEMCPY = "Memcpy DtoH (Device -> Pinned)"
MEMSET = "Memset (Device)"
BASE_NS = 1_700_000_000_000_000_000


def _coll(kind: str, pg: str, ranks, seq: int | None = None) -> dict:
    """record_param_comms-style collective args of one kernel."""
    n = len(ranks)
    a = {"Collective name": kind, "Process Group Name": pg,
         "Process Group Description": "default_pg" if pg == "0" else "undefined",
         "Process Group Ranks": json.dumps(list(ranks)), "Group size": n, "In msg nelems": 1024,
         "Out msg nelems": 1024 * n if kind == "allgather" else 1024, "dtype": "Float"}
    if seq is not None:
        a["Seq"] = seq
    return a


class _Trace:
    """One rank's trace. Times are given in integer us on the rank's own clock (shift_us is added)."""

    def __init__(self, rank: int, world: int, *, shift_us: int = 0, base_ns: int | None = None,
                 backend: str = "nccl", pg_config: list | None = None):
        self.rank, self.device, self.shift = rank, rank, shift_us
        self.info = {"backend": backend, "rank": rank, "world_size": world}
        if pg_config is not None:
            self.info["pg_config"] = pg_config
        self.base_ns = base_ns
        self.events: list[dict] = []
        self.corr = 1000

    def _x(self, cat, name, s, e, pid, tid, args) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": float(s + self.shift),
              "dur": float(e - s), "args": args}
        self.events.append(ev)
        return ev

    def step(self, n: int, s: int, e: int) -> None:
        self._x("cpu_op", f"ProfilerStep#{n}", s, e, 100, 1, {})

    def op(self, name: str, s: int, e: int, tid: int = 1, cat: str = "cpu_op") -> None:
        self._x(cat, name, s, e, 100, tid, {})

    def sync(self, s: int, e: int) -> None:
        self.corr += 1
        self._x("cuda_runtime", "cudaStreamSynchronize", s, e, 100, 1, {"correlation": self.corr})

    def kernel(self, name: str, s: int, e: int, *, stream: int = 7, launch: int | None = None,
               cat: str = "kernel", **args) -> None:
        self.corr += 1
        self._x(cat, name, s, e, self.device, stream,
                {"device": self.device, "stream": stream, "correlation": self.corr, "External id": self.corr, **args})
        if launch is not None:
            lname = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync", "gpu_memset": "cudaMemsetAsync"}[cat]
            self._x("cuda_runtime", lname, launch, launch + 1, 100, 1, {"correlation": self.corr})

    def write(self, path: Path) -> Path:
        doc = {"schemaVersion": 1, "distributedInfo": self.info, "traceEvents": self.events}
        if self.base_ns is not None:
            doc["baseTimeNanoseconds"] = self.base_ns
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
        return path


def _write(tmp: Path, name: str, traces: dict[int, _Trace]) -> list[Path]:
    return [t.write(tmp / name / f"rank{r}.json") for r, t in sorted(traces.items())]


def _late_rank(tmp: Path) -> list[Path]:
    """3 ranks, AllReduce over group '0' = [0, 1, 2] (Seq = step) every step; rank 2 is always late.

    Host: ProfilerStep#N = [80(N-1), 80N) us; launches at 80(N-1) + 1 (gemm), 3 (AR), 5 (opt).
    GPU, back to back on each rank: gemm c_r (stream 7), AR (stream 20) to the common end X_N, opt o_r
    (stream 7), then the next step's gemm. c = 40, 50, 70; o = 10, 20, 5; transfer = 10 (rank 2's AR).
      step 1: r0 gemm [50,90) AR [90,130) opt [130,140); r1 [50,100) [100,130) [130,150);
              r2 [50,120) [120,130) [130,135)
      step 2: r0 [140,180) [180,215) [215,225); r1 [150,200) [200,215) [215,235); r2 [135,205) [205,215) [215,220)
      step 3: r0 [225,265) [265,300) [300,310); r1 [235,285) [285,300) [300,320); r2 [220,290) [290,300) [300,305)
      step 4: r0 [310,350) [350,385) [385,395); r1 [320,370) [370,385) [385,405); r2 [305,375) [375,385) [385,390)
    """
    ranks = (0, 1, 2)
    c, o, transfer = {0: 40, 1: 50, 2: 70}, {0: 10, 1: 20, 2: 5}, 10
    ts = {r: _Trace(r, 3) for r in ranks}
    start = {r: 50 for r in ranks}
    for n in range(1, 5):
        h = 80 * (n - 1)
        x = max(start[r] + c[r] for r in ranks) + transfer
        for r in ranks:
            t = ts[r]
            t.step(n, h, h + 80)
            t.kernel(GEMM, start[r], start[r] + c[r], stream=7, launch=h + 1)
            t.kernel(AR, start[r] + c[r], x, stream=20, launch=h + 3, **_coll("allreduce", "0", ranks, n))
            t.kernel(OPT, x, x + o[r], stream=7, launch=h + 5)
            start[r] = x + o[r]
    return _write(tmp, "late_rank", ts)


def _late_rank_changes(tmp: Path) -> list[Path]:
    """3 ranks, AllReduce over group '0' = [0, 1, 2] (Seq = step); the late rank is 0, 2, 1, 0 in steps 1-4.

    Clocks: ranks 0 and 2 write every timestamp 1000 us later than rank 1 and say so with
    baseTimeNanoseconds = BASE - 1 ms (rank 1: BASE), so the wall clocks agree. Times below are on the
    common (rank 1) clock. Host: ProfilerStep#N = [100(N-1), 100N); launches at +1 (gemm), +2 (AR), +3.
    GPU: S_N = 100(N-1) + 40; rank 1 starts every step 5 us late (S_N + 5); gemm (stream 7), then AR
    (stream 20) to X_N = the late rank's gemm end + 10; idle until the next step.
      step 1: gemm r0 [40,100) r1 [45,75) r2 [40,80); AR r0 [100,110) r1 [75,110) r2 [80,110)
      step 2: gemm r0 [140,170) r1 [145,185) r2 [140,200); AR r0 [170,210) r1 [185,210) r2 [200,210);
              rank 1 also runs an elementwise kernel on stream 8 at [195,205) (overlaps its AR)
      step 3: gemm r0 [240,280) r1 [245,305) r2 [240,270); AR r0 [280,315) r1 [305,315) r2 [270,315)
      step 4: gemm r0 [340,400) r1 [345,375) r2 [340,380); AR r0 [400,410) r1 [375,410) r2 [380,410)
    Rank 1's host calls cudaStreamSynchronize at [X_N + 5, X_N + 15) in steps 1-3 (inside its gap).
    """
    ranks = (0, 1, 2)
    shift = {0: 1000, 1: 0, 2: 1000}
    ts = {r: _Trace(r, 3, shift_us=shift[r], base_ns=BASE_NS - shift[r] * US) for r in ranks}
    d = {0: 0, 1: 5, 2: 0}
    c = {1: {0: 60, 1: 30, 2: 40}, 2: {0: 30, 1: 40, 2: 60}, 3: {0: 40, 1: 60, 2: 30}, 4: {0: 60, 1: 30, 2: 40}}
    for n in range(1, 5):
        h, s = 100 * (n - 1), 100 * (n - 1) + 40
        ends = {r: s + d[r] + c[n][r] for r in ranks}
        x = max(ends.values()) + 10
        for r in ranks:
            t = ts[r]
            t.step(n, h, h + 100)
            t.kernel(GEMM, s + d[r], ends[r], stream=7, launch=h + 1)
            t.kernel(AR, ends[r], x, stream=20, launch=h + 2, **_coll("allreduce", "0", ranks, n))
        if n == 2:
            ts[1].kernel(ELEMENTWISE, 195, 205, stream=8, launch=h + 3)
        if n < 4:
            ts[1].sync(x + 5, x + 15)
    return _write(tmp, "late_rank_changes", ts)


def _host_bound(tmp: Path) -> list[Path]:
    """2 ranks, AllReduce over group '0' = [0, 1] (Seq = step). Rank 1's host launches its gemm late.

    Host: ProfilerStep#N = [100(N-1), 100N); S_N = 100(N-1) + 40.
      rank 0: gemm [S, S+30) (launch 100(N-1)), AR [S+30, S+60) stream 20 (launch +1),
              memcpy [S+70, S+80) stream 9 (cudaMemcpyAsync at +2)
      rank 1: elementwise [S, S+10) (launch 100(N-1)), gemm [S+30, S+50) launched LATE at host S+25
              (S+15 in step 2), AR [S+50, S+60) stream 20 (launch just after the gemm's)
    """
    ranks = (0, 1)
    ts = {r: _Trace(r, 2) for r in ranks}
    for n in range(1, 5):
        h, s = 100 * (n - 1), 100 * (n - 1) + 40
        late = s + (15 if n == 2 else 25)
        for r in ranks:
            ts[r].step(n, h, h + 100)
        t0, t1 = ts[0], ts[1]
        t0.kernel(GEMM, s, s + 30, stream=7, launch=h)
        t0.kernel(AR, s + 30, s + 60, stream=20, launch=h + 1, **_coll("allreduce", "0", ranks, n))
        t0.kernel(MEMCPY, s + 70, s + 80, stream=9, launch=h + 2, cat="gpu_memcpy")
        t1.kernel(ELEMENTWISE, s, s + 10, stream=7, launch=h)
        t1.kernel(GEMM, s + 30, s + 50, stream=7, launch=late)
        t1.kernel(AR, s + 50, s + 60, stream=20, launch=late + 1, **_coll("allreduce", "0", ranks, n))
    return _write(tmp, "host_bound", ts)


def _two_groups(tmp: Path) -> list[Path]:
    """4 ranks; groups '1' = [0, 1] and '2' = [2, 3] (pair AllReduce) and '0' = [0, 1, 2, 3] (world).

    Host: ProfilerStep#N = [100(N-1), 100N); S = 100(N-1) + 40; launches at +0 .. +5.
    Per rank: gemm A [S, S+a) (stream 7), pair AR (stream 20) to the pair's end, gemm B (stream 7),
    world AR (stream 21) to the world end W, idle to the next step. a = 10, 20, 12, 15.
      pair {0,1}: r0 [S+10, S+25) r1 [S+20, S+25) (transfer 5, r1 last)
      pair {2,3}: r2 [S+12, S+20) r3 [S+15, S+20) (transfer 5, r3 last)
      gemm B: r0 [S+25, S+35) r1 [S+25, S+30) (step 3: [S+25, S+55)) r2 [S+20, S+50) r3 [S+20, S+30)
      world: W = S+60 (step 3: S+65); last arriver r2 (step 3: r1); transfer 10
    Step 2: rank 0 also runs an elementwise kernel on stream 8 at [S+55, S+65).
    """
    ranks = (0, 1, 2, 3)
    ts = {r: _Trace(r, 4) for r in ranks}
    a = {0: 10, 1: 20, 2: 12, 3: 15}
    pairs = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    pg = {(0, 1): "1", (2, 3): "2"}
    for n in range(1, 5):
        h, s = 100 * (n - 1), 100 * (n - 1) + 40
        b = {0: 10, 1: 30 if n == 3 else 5, 2: 30, 3: 10}
        pend = {p: s + max(a[r] for r in p) + 5 for p in pg}
        wstart = {r: pend[pairs[r]] + b[r] for r in ranks}
        w = max(wstart.values()) + 10
        for r in ranks:
            t, p = ts[r], pairs[r]
            t.step(n, h, h + 100)
            t.kernel(GEMM, s, s + a[r], stream=7, launch=h)
            t.kernel(AR, s + a[r], pend[p], stream=20, launch=h + 1, **_coll("allreduce", pg[p], p, n))
            t.kernel(GEMM_B, pend[p], wstart[r], stream=7, launch=h + 2)
            t.kernel(AR, wstart[r], w, stream=21, launch=h + 3, **_coll("allreduce", "0", ranks, n))
        if n == 2:
            ts[0].kernel(ELEMENTWISE, s + 55, s + 65, stream=8, launch=h + 5)
    return _write(tmp, "two_groups", ts)


def _unmatched_rank(tmp: Path) -> list[Path]:
    """3 ranks. Group '0' = [0, 1] (Seq = step): matched. Group '1' = [0, 1, 2] without Seq: rank 2 has no
    group-1 AllReduce in step 4 (3 kernels against 4), so every group-1 kernel is unmatched ("ranks saw
    different numbers of kernels"): rank 2's collectives cannot be matched at all.

    Host: ProfilerStep#N = [100(N-1), 100N); S = 100(N-1) + 50; launches at +0 .. +3 (all before S).
    A rank may start a step 5 us late (d): step 2 rank 2, step 3 rank 0, step 4 rank 2.
      ranks 0, 1: gemm A [S+d, S+d+a) a = 10, 20 (stream 7); AR g0 [.., S+25) (stream 20); gemm B [S+25, S+40);
                  AR g1 [S+40, S+50) (stream 21)
      rank 2: gemm [S+d, S+d+35) then AR g1 [.., S+50) (stream 21); step 4: gemm [S+5, S+50) only;
              step 3: a memset [S+55, S+60) (stream 9) in its gap
    """
    ranks = (0, 1, 2)
    ts = {r: _Trace(r, 3) for r in ranks}
    late = {1: {}, 2: {2: 5}, 3: {0: 5}, 4: {2: 5}}
    a = {0: 10, 1: 20}
    for n in range(1, 5):
        h, s = 100 * (n - 1), 100 * (n - 1) + 50
        d = {r: late[n].get(r, 0) for r in ranks}
        for r in ranks:
            ts[r].step(n, h, h + 100)
        for r in (0, 1):
            t = ts[r]
            t.kernel(GEMM, s + d[r], s + d[r] + a[r], stream=7, launch=h)
            t.kernel(AR, s + d[r] + a[r], s + 25, stream=20, launch=h + 1, **_coll("allreduce", "0", (0, 1), n))
            t.kernel(GEMM_B, s + 25, s + 40, stream=7, launch=h + 2)
            t.kernel(AR, s + 40, s + 50, stream=21, launch=h + 3, **_coll("allreduce", "1", ranks))
        t = ts[2]
        if n < 4:
            t.kernel(ELEMENTWISE, s + d[2], s + d[2] + 35, stream=7, launch=h)
            t.kernel(AR, s + d[2] + 35, s + 50, stream=21, launch=h + 1, **_coll("allreduce", "1", ranks))
        else:
            t.kernel(ELEMENTWISE, s + d[2], s + 50, stream=7, launch=h)
        if n == 3:
            t.kernel(MEMSET, s + 55, s + 60, stream=9, launch=h + 3, cat="gpu_memset")
    return _write(tmp, "unmatched_rank", ts)


def _cycle(tmp: Path) -> list[Path]:
    """2 ranks, two collectives per step whose last arrivers point at each other (the cycle rule).

    Host: ProfilerStep#N = [100(N-1), 100N), N = 1..3; S = 100(N-1) + 40; launches at +0 .. +2.
      rank 0: AR (group '0' = [0, 1]) [S, S+60) stream 20; AG (group '1' = [0, 1]) [S+45, S+50) stream 21
      rank 1: gemm [S, S+20) stream 7; AG [S+20, S+60) stream 21; AR [S+50, S+60) stream 20
    AR: durations 60 / 10 -> transfer 10, rank 1 last, rank 0 waits 50: wait [S, S+50), transfer [S+50, S+60).
    AG: durations 5 / 40 -> transfer 5, rank 0 last, rank 1 waits 35: wait [S+20, S+55), transfer [S+55, S+60).
    """
    ranks = (0, 1)
    ts = {r: _Trace(r, 2) for r in ranks}
    for n in range(1, 4):
        h, s = 100 * (n - 1), 100 * (n - 1) + 40
        for r in ranks:
            ts[r].step(n, h, h + 100)
        ts[0].kernel(AR, s, s + 60, stream=20, launch=h, **_coll("allreduce", "0", ranks, n))
        ts[0].kernel(AG, s + 45, s + 50, stream=21, launch=h + 1, **_coll("allgather", "1", ranks, n))
        ts[1].kernel(GEMM, s, s + 20, stream=7, launch=h)
        ts[1].kernel(AG, s + 20, s + 60, stream=21, launch=h + 1, **_coll("allgather", "1", ranks, n))
        ts[1].kernel(AR, s + 50, s + 60, stream=20, launch=h + 2, **_coll("allreduce", "0", ranks, n))
    return _write(tmp, "cycle", ts)


def _gloo_cpu_only(tmp: Path) -> list[Path]:
    """2 ranks, gloo backend, no device events. pg_config has one entry: group '0' = [0, 1].

    ProfilerStep#N (cpu_op) = [100(N-1), 100N), N = 1..4: windows [100(N-1), 100N).
    Per step (tau = time - 100(N-1)); the late rank is rank 1 in odd steps, rank 0 in even steps:
      late rank:  aten::mm [0, 50), c10d::allreduce_ [50, 52) (main thread), gloo:all_reduce [52, 70) (tid 2)
      other rank: aten::mm [0, 30), c10d::allreduce_ [30, 32), gloo:all_reduce [32, 70) (tid 2)
      aten::add_ rank 0 [70, 90), rank 1 [70, 80) (main thread)
    Step 1: rank 1 has aten::resize_ [1, 3) nested in its mm; rank 0 has aten::copy_ [92, 96) on the gloo
    thread (tid 2), which is not compute (a thread that runs gloo spans).
    gloo: durations 38 / 18 -> transfer 18, the late rank arrived last, the other waits 20.
    """
    ranks = (0, 1)
    cfg = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo", "pg_size": 2, "ranks": [0, 1]}]
    ts = {r: _Trace(r, 2, backend="gloo", pg_config=cfg) for r in ranks}
    for n in range(1, 5):
        h = 100 * (n - 1)
        late = 1 if n % 2 else 0
        for r in ranks:
            t = ts[r]
            t.step(n, h, h + 100)
            mm = 50 if r == late else 30
            t.op("aten::mm", h, h + mm)
            t.op("c10d::allreduce_", h + mm, h + mm + 2)
            t.op("gloo:all_reduce", h + mm + 2, h + 70, tid=2, cat="user_annotation")
            t.op("aten::add_", h + 70, h + (90 if r == 0 else 80))
        if n == 1:
            ts[1].op("aten::resize_", h + 1, h + 3)
            ts[0].op("aten::copy_", h + 92, h + 96, tid=2)
    return _write(tmp, "gloo_cpu_only", ts)


def scenarios(tmp: Path) -> dict[str, list[Path]]:
    """Hand-made multi-rank runs: {name: trace files}. See EXPECTED for their paths."""
    tmp = Path(tmp)
    return {
        "late_rank": _late_rank(tmp),
        "late_rank_changes": _late_rank_changes(tmp),
        "host_bound": _host_bound(tmp),
        "two_groups": _two_groups(tmp),
        "unmatched_rank": _unmatched_rank(tmp),
        "cycle": _cycle(tmp),  # extra: the cycle rule
        "gloo_cpu_only": _gloo_cpu_only(tmp),  # extra: a CPU-only (gloo) run
    }


# Every step critical_paths returns, per scenario; the last one is each rank's last (open) step, which the
# default report selection drops: EXPECTED holds the closed steps, EXPECTED_LAST the open one.
STEPS = {"late_rank": [1, 2, 3, 4], "late_rank_changes": [1, 2, 3, 4], "host_bound": [1, 2, 3, 4],
         "two_groups": [1, 2, 3, 4], "unmatched_rank": [1, 2, 3, 4], "cycle": [1, 2, 3], "gloo_cpu_only": [1, 2, 3, 4]}

# (rank, kind, name or None, duration ns), in time order. Worked by hand from the timestamps above.
EXPECTED: dict[str, dict[int, list[tuple]]] = {
    "late_rank": {
        # Windows step 1: r0 [50,140), r1 [50,150), r2 [50,135) -> A = rank 1 (its opt is the longest).
        # Walk back from 150: opt [130,150) 20; AR r1 [100,130): durations 40/30/10 -> transfer 10, wait 20:
        # transfer [120,130) 10; wait [100,120) -> jump to rank 2 (last) at its AR start 120; rank 2's gemm
        # [50,120) down to A.start 50: 70. 70 + 10 + 20 = 100 = 150 - 50.
        1: [(2, "compute", GEMM, 70 * US), (1, "comm_transfer", AR, 10 * US), (1, "compute", OPT, 20 * US)],
        # A = rank 1 [150,235): opt [215,235) 20; AR r1 [200,215) dur 15, transfer 10 -> [205,215) 10;
        # wait [200,205) -> rank 2 at 205: gemm [135,205) cut at 150: 55. 55 + 10 + 20 = 85.
        2: [(2, "compute", GEMM, 55 * US), (1, "comm_transfer", AR, 10 * US), (1, "compute", OPT, 20 * US)],
        # A = rank 1 [235,320): opt 20; AR r1 [285,300) -> transfer [290,300) 10; rank 2 gemm [220,290) cut 235: 55.
        3: [(2, "compute", GEMM, 55 * US), (1, "comm_transfer", AR, 10 * US), (1, "compute", OPT, 20 * US)],
    },
    "late_rank_changes": {
        # Wall-clock window ends (rank 1 clock): r0 140, r1 145, r2 140 -> A = rank 1 [45,145) (without the
        # offsets ranks 0/2 would look 1 ms later). Gap [110,145) (next gemm launched at 101 < 110: no
        # host-bound), sync [115,125): other [125,145) 20, sync 10, other [110,115) 5. AR r1 [75,110):
        # durations 10/35/30 -> transfer 10 [100,110); wait [75,100) -> rank 0 (last), whose AR starts at
        # 1100 on its clock = 100 on rank 1's: o = -1000 us. Rank 0's gemm [40,100) cut at 45: 55.
        1: [(0, "compute", GEMM, 55 * US), (1, "comm_transfer", AR, 10 * US), (1, "idle_other", None, 5 * US),
            (1, "idle_sync", None, 10 * US), (1, "idle_other", None, 20 * US)],
        # A = rank 1 [145,245): other [225,245) 20, sync [215,225) 10, other [210,215) 5; AR r1 [185,210)
        # (durations 40/25/10: transfer 10, wait 15: wait [185,200), transfer [200,210)); elementwise
        # [195,205) on stream 8 hides it on [195,205): transfer [205,210) 5, elementwise [195,205) 10; then
        # the wait [185,195) -> rank 2 at its AR start 200: its gemm [140,200) from 195 down to 145: 50.
        2: [(2, "compute", GEMM, 50 * US), (1, "compute", ELEMENTWISE, 10 * US), (1, "comm_transfer", AR, 5 * US),
            (1, "idle_other", None, 5 * US), (1, "idle_sync", None, 10 * US), (1, "idle_other", None, 20 * US)],
        # A = rank 1 [245,345), itself the last arriver (AR [305,315), dur 10 = transfer): other [330,345) 15,
        # sync [320,330) 10, other [315,320) 5, transfer 10, gemm [245,305) 60. No jump.
        3: [(1, "compute", GEMM, 60 * US), (1, "comm_transfer", AR, 10 * US), (1, "idle_other", None, 5 * US),
            (1, "idle_sync", None, 10 * US), (1, "idle_other", None, 15 * US)],
    },
    "host_bound": {
        # Windows [40,140) on both ranks: a tie -> A = rank 0. Gap [120,140) (next gemm launched at 100 <
        # 120): other 20; memcpy [110,120) 10; gap [100,110) (memcpy launched at 2): other 10; AR r0 [70,100):
        # durations 30/10 -> transfer [90,100) 10, wait [70,90) -> rank 1 at its AR start 90: gemm [70,90) 20;
        # gap [50,70) whose gemm was launched at 65: other [65,70) 5, host-bound [50,65) 15; elementwise
        # [40,50) 10. 10+15+5+20+10+10+10+20 = 100.
        1: [(1, "compute", ELEMENTWISE, 10 * US), (1, "idle_host_bound", None, 15 * US), (1, "idle_other", None, 5 * US),
            (1, "compute", GEMM, 20 * US), (0, "comm_transfer", AR, 10 * US), (0, "idle_other", None, 10 * US),
            (0, "memcpy", MEMCPY, 10 * US), (0, "idle_other", None, 20 * US)],
        # The same in [140,240), except rank 1's gemm is launched at 155: host-bound [150,155) 5, other 15.
        2: [(1, "compute", ELEMENTWISE, 10 * US), (1, "idle_host_bound", None, 5 * US), (1, "idle_other", None, 15 * US),
            (1, "compute", GEMM, 20 * US), (0, "comm_transfer", AR, 10 * US), (0, "idle_other", None, 10 * US),
            (0, "memcpy", MEMCPY, 10 * US), (0, "idle_other", None, 20 * US)],
        # As step 1 in [240,340) (launch at 265).
        3: [(1, "compute", ELEMENTWISE, 10 * US), (1, "idle_host_bound", None, 15 * US), (1, "idle_other", None, 5 * US),
            (1, "compute", GEMM, 20 * US), (0, "comm_transfer", AR, 10 * US), (0, "idle_other", None, 10 * US),
            (0, "memcpy", MEMCPY, 10 * US), (0, "idle_other", None, 20 * US)],
    },
    "two_groups": {
        # Windows [40,140) on all four ranks: A = rank 0. Gap [100,140): other 40. World AR r0 [75,100):
        # durations 25/30/10/30 -> transfer 10 [90,100); wait -> rank 2 (last) at 90: gemm B [60,90) 30; pair
        # AR r2 [52,60) (durations 8/5 -> transfer 5, wait 3): transfer [55,60) 5; wait -> rank 3 at 55
        # (group '2'): gemm A [40,55) 15. 15+5+30+10+40 = 100.
        1: [(3, "compute", GEMM, 15 * US), (2, "comm_transfer", AR, 5 * US), (2, "compute", GEMM_B, 30 * US),
            (0, "comm_transfer", AR, 10 * US), (0, "idle_other", None, 40 * US)],
        # [140,240): gap [205,240) other 35; elementwise [195,205) (stream 8) hides the transfer on [195,200):
        # 10; transfer [190,195) 5; wait -> rank 2 at 190 -> rank 3 at 155 as in step 1.
        2: [(3, "compute", GEMM, 15 * US), (2, "comm_transfer", AR, 5 * US), (2, "compute", GEMM_B, 30 * US),
            (0, "comm_transfer", AR, 5 * US), (0, "compute", ELEMENTWISE, 10 * US), (0, "idle_other", None, 35 * US)],
        # [240,340): rank 1 is the world's last (gemm B [265,295)): gap [305,340) other 35; world AR r0 [275,305)
        # transfer [295,305) 10; -> rank 1 at 295: gemm B 30; pair AR r1 [260,265) (last of its pair) 5; gemm A
        # [240,260) 20.
        3: [(1, "compute", GEMM, 20 * US), (1, "comm_transfer", AR, 5 * US), (1, "compute", GEMM_B, 30 * US),
            (0, "comm_transfer", AR, 10 * US), (0, "idle_other", None, 35 * US)],
    },
    "unmatched_rank": {
        # Windows: r0 [50,150), r1 [50,150), r2 [50,155) -> A = rank 2. Gap [100,155) other 55 (next gemm
        # launched at 100 = g0); its AR g1 [85,100) is unmatched: all transfer, 15; gemm [50,85) 35. No jump.
        1: [(2, "compute", ELEMENTWISE, 35 * US), (2, "comm_transfer", AR, 15 * US), (2, "idle_other", None, 55 * US)],
        # r0 [150,255), r1 [150,250), r2 [155,250) -> A = rank 0. Gap [200,255) 55; AR g1 [190,200) unmatched:
        # transfer 10; gemm B [175,190) 15; AR g0 [160,175) (durations 15/5): transfer [170,175) 5, wait
        # [160,170) -> rank 1 at 170: gemm A [150,170) 20. 20+5+15+10+55 = 105.
        2: [(1, "compute", GEMM, 20 * US), (0, "comm_transfer", AR, 5 * US), (0, "compute", GEMM_B, 15 * US),
            (0, "comm_transfer", AR, 10 * US), (0, "idle_other", None, 55 * US)],
        # r0 [255,350), r1 [250,350), r2 [250,355) -> A = rank 2: gap [310,355) 45; memset [305,310) 5; gap
        # [300,305) 5; AR g1 [285,300) 15; gemm [250,285) 35.
        3: [(2, "compute", ELEMENTWISE, 35 * US), (2, "comm_transfer", AR, 15 * US), (2, "idle_other", None, 5 * US),
            (2, "memset", MEMSET, 5 * US), (2, "idle_other", None, 45 * US)],
    },
    "cycle": {
        # Windows [40,140) on both: A = rank 0. Gap [100,140) other 40; AR transfer [90,100) 10; at 89 the AG
        # transfer [85,90) beats the AR's wait: 5; at 84 the AR's wait -> jump to rank 1 (t_w = 90 = its AR
        # start): t = 85, o = 0; rank 1 at 84 is in its AG's wait [60,95) -> jump to rank 0 (t_w = 95, AG
        # start 85): t = 75, o = +10; rank 0 at 74 is in the AR's wait again: cycle rule -> comm_wait segment
        # [40,75) 35 (path [50,85)); then before rank 0's first activity (40): idle_unknown [30,40) (path
        # [40,50)) 10: nothing in the trace says why the device had not started. 10+35+5+10+40 = 100.
        1: [(0, "idle_unknown", None, 10 * US), (0, "comm_wait", AR, 35 * US), (0, "comm_transfer", AG, 5 * US),
            (0, "comm_transfer", AR, 10 * US), (0, "idle_other", None, 40 * US)],
        # The same in [140,240); before 140 rank 0 is in the gap [100,140) (idle_other).
        2: [(0, "idle_other", None, 10 * US), (0, "comm_wait", AR, 35 * US), (0, "comm_transfer", AG, 5 * US),
            (0, "comm_transfer", AR, 10 * US), (0, "idle_other", None, 40 * US)],
    },
    "gloo_cpu_only": {
        # Windows = the step spans [0,100): A = rank 0 (tie). Idle [90,100) unknown 10 (copy_ on the gloo
        # thread is no compute); add_ [70,90) 20; gloo r0 [32,70): durations 38/18 -> transfer [52,70) 18,
        # wait [32,52) -> rank 1 at 52; rank 1 at 51: c10d::allreduce_ [50,52) is no activity: unknown 2;
        # aten::mm [0,50) 50 (resize_ nested in it loses the tie-break).
        1: [(1, "compute", "aten::mm", 50 * US), (1, "idle_unknown", None, 2 * US),
            (0, "comm_transfer", "gloo:all_reduce", 18 * US), (0, "compute", "aten::add_", 20 * US),
            (0, "idle_unknown", None, 10 * US)],
        # Rank 0 is late (last arriver, no wait): all on rank 0.
        2: [(0, "compute", "aten::mm", 50 * US), (0, "idle_unknown", None, 2 * US),
            (0, "comm_transfer", "gloo:all_reduce", 18 * US), (0, "compute", "aten::add_", 20 * US),
            (0, "idle_unknown", None, 10 * US)],
        3: [(1, "compute", "aten::mm", 50 * US), (1, "idle_unknown", None, 2 * US),
            (0, "comm_transfer", "gloo:all_reduce", 18 * US), (0, "compute", "aten::add_", 20 * US),
            (0, "idle_unknown", None, 10 * US)],
    },
}

# The open last step (windows end at each rank's last activity).
EXPECTED_LAST: dict[str, dict[int, list[tuple]]] = {
    # A = rank 1 [320,405): opt 20, AR transfer [375,385) 10, rank 2 gemm [305,375) cut at 320: 55.
    "late_rank": {4: [(2, "compute", GEMM, 55 * US), (1, "comm_transfer", AR, 10 * US), (1, "compute", OPT, 20 * US)]},
    # All end at 410 on the wall clock: A = rank 0 (the last arriver): AR [400,410) 10, gemm [340,400) 60.
    "late_rank_changes": {4: [(0, "compute", GEMM, 60 * US), (0, "comm_transfer", AR, 10 * US)]},
    # r0 [340,420), r1 [340,400): A = rank 0.
    "host_bound": {4: [(1, "compute", ELEMENTWISE, 10 * US), (1, "idle_host_bound", None, 15 * US),
                       (1, "idle_other", None, 5 * US), (1, "compute", GEMM, 20 * US), (0, "comm_transfer", AR, 10 * US),
                       (0, "idle_other", None, 10 * US), (0, "memcpy", MEMCPY, 10 * US)]},
    # [340,400) on all: A = rank 0.
    "two_groups": {4: [(3, "compute", GEMM, 15 * US), (2, "comm_transfer", AR, 5 * US), (2, "compute", GEMM_B, 30 * US),
                       (0, "comm_transfer", AR, 10 * US)]},
    # r0 [350,400), r1 [350,400), r2 [355,400): A = rank 0.
    "unmatched_rank": {4: [(1, "compute", GEMM, 20 * US), (0, "comm_transfer", AR, 5 * US),
                           (0, "compute", GEMM_B, 15 * US), (0, "comm_transfer", AR, 10 * US)]},
    "cycle": {3: [(0, "idle_other", None, 10 * US), (0, "comm_wait", AR, 35 * US), (0, "comm_transfer", AG, 5 * US),
                  (0, "comm_transfer", AR, 10 * US)]},
    # The last CPU window is its span [300,400): as step 2 (its last 10 after the rank's last activity:
    # unknown, as every idle stretch without a launch).
    "gloo_cpu_only": {4: [(0, "compute", "aten::mm", 50 * US), (0, "idle_unknown", None, 2 * US),
                          (0, "comm_transfer", "gloo:all_reduce", 18 * US), (0, "compute", "aten::add_", 20 * US),
                          (0, "idle_unknown", None, 10 * US)]},
}

# (from_rank, to_rank, path_ns, name, start_ns of the waiting kernel on its own clock, wait_on_path_ns),
# in walk order. Steps not listed have no jump.
EXPECTED_JUMPS: dict[str, dict[int, list[tuple]]] = {
    "late_rank": {1: [(1, 2, 120 * US, AR, 100 * US, 20 * US)], 2: [(1, 2, 205 * US, AR, 200 * US, 5 * US)],
                  3: [(1, 2, 290 * US, AR, 285 * US, 5 * US)], 4: [(1, 2, 375 * US, AR, 370 * US, 5 * US)]},
    "late_rank_changes": {1: [(1, 0, 100 * US, AR, 75 * US, 25 * US)], 2: [(1, 2, 195 * US, AR, 185 * US, 10 * US)],
                          3: [], 4: []},
    "host_bound": {n: [(0, 1, (100 * (n - 1) + 90) * US, AR, (100 * (n - 1) + 70) * US, 20 * US)] for n in (1, 2, 3, 4)},
    "two_groups": {1: [(0, 2, 90 * US, AR, 75 * US, 15 * US), (2, 3, 55 * US, AR, 52 * US, 3 * US)],
                   2: [(0, 2, 190 * US, AR, 175 * US, 15 * US), (2, 3, 155 * US, AR, 152 * US, 3 * US)],
                   3: [(0, 1, 295 * US, AR, 275 * US, 20 * US)],
                   4: [(0, 2, 390 * US, AR, 375 * US, 15 * US), (2, 3, 355 * US, AR, 352 * US, 3 * US)]},
    "unmatched_rank": {1: [], 2: [(0, 1, 170 * US, AR, 160 * US, 10 * US)], 3: [],
                       4: [(0, 1, 370 * US, AR, 360 * US, 10 * US)]},
    "cycle": {n: [(0, 1, (100 * (n - 1) + 85) * US, AR, (100 * (n - 1) + 40) * US, 45 * US),
                  (1, 0, (100 * (n - 1) + 85) * US, AG, (100 * (n - 1) + 60) * US, 25 * US)] for n in (1, 2, 3)},
    "gloo_cpu_only": {1: [(0, 1, 52 * US, "gloo:all_reduce", 32 * US, 20 * US)], 2: [],
                      3: [(0, 1, 252 * US, "gloo:all_reduce", 232 * US, 20 * US)], 4: []},
}


def path_tuples(result: dict, step: int) -> list[tuple]:
    return [(s["rank"], s["kind"], s["name"], s["end_ns"] - s["start_ns"])
            for s in result["segments"] if s["step"] == step]


def jump_tuples(result: dict, step: int) -> list[tuple]:
    return [(j["from_rank"], j["to_rank"], j["path_ns"], j["name"], j["start_ns"], j["wait_on_path_ns"])
            for j in result["jumps"] if j["step"] == step]


# ----------------------------------------------------------------------------------------------------
# Self-check: .venv/bin/python -m tests.critical_path_reference


def check_tiling(result: dict) -> None:
    """Each step's segments tile A's window in path time: contiguous, end > start, sum = window."""
    for st in result["steps"]:
        segs = [s for s in result["segments"] if s["step"] == st["step"]]
        assert segs, st
        assert [s["order"] for s in segs] == list(range(len(segs)))
        p = st["start_ns"]
        for s in segs:
            assert s["end_ns"] > s["start_ns"], s
            assert s["path_start_ns"] == p, (st, s, p)
            assert s["kind"] in KINDS and (s["name"] is None) == s["kind"].startswith("idle")
            p += s["end_ns"] - s["start_ns"]
        assert p == st["end_ns"], (st, p)
        assert sum(s["end_ns"] - s["start_ns"] for s in segs) == st["end_ns"] - st["start_ns"]


def _idle_split(tl: Timeline, w0: int, w1: int) -> dict:
    """The idle breakdown of window [w0, w1) on a timeline, the plain way (test_idle_breakdown's sweep)."""
    def overlap(lo, hi, spans):
        return sum(max(0, min(hi, b) - max(lo, a)) for a, b in spans)

    sync = host = other = unknown = 0
    covered = 0
    for g0, g1, h in tl.gaps:
        a, b = max(g0, w0), min(g1, w1)
        if a >= b:
            continue
        covered += b - a
        s = overlap(a, b, tl.islands)
        if h is None:  # no launch of the gap's ending activity: the rest of the gap is unknown
            sync, unknown = sync + s, unknown + (b - a) - s
            continue
        c = min(b, max(a, h))
        hb = max(0, c - a) - overlap(a, max(a, c), tl.islands)
        sync, host, other = sync + s, host + hb, other + (b - a) - s - hb
    outside = 0  # idle outside every gap: before the first activity, after the last
    if tl.first is None:
        outside = w1 - w0
    else:
        outside += max(0, min(w1, tl.first) - w0) + max(0, w1 - max(w0, tl.last))
    return {"idle_sync": sync, "idle_host_bound": host, "idle_other": other, "idle_unknown": unknown + outside}


def check_single_rank(paths, result: dict) -> int:
    """Where no collective is matched, each step's path is on A alone and its totals are A's window metrics."""
    files, timelines, last = _build(paths)
    assert not last
    checked = 0
    for st in result["steps"]:
        segs = [s for s in result["segments"] if s["step"] == st["step"]]
        assert all((s["rank"], s["device"]) == (st["rank"], st["device"]) for s in segs)
        assert not any(j["step"] == st["step"] for j in result["jumps"])
        tot = defaultdict(int)
        for s in segs:
            tot[s["kind"]] += s["end_ns"] - s["start_ns"]
        assert tot["comm_wait"] == 0
        tl = timelines[(st["rank"], st["device"])]
        split = _idle_split(tl, st["start_ns"], st["end_ns"])
        for k in IDLE_KINDS:
            assert tot[k] == split[k], (st, k, tot[k], split[k])
        if st["device"] < 0:
            continue  # CPU-only: step_reference has no metrics for it
        path = next(f.path for f in files if any((w["rank"], w["device"], w["step"]) ==
                                                 (st["rank"], st["device"], st["step"]) for w in f.windows))
        m = sr.span_metrics(path, st["rank"], st["device"], st["start_ns"], st["end_ns"])
        assert tot["compute"] == m["compute_ns"], (st, tot, m)
        assert tot["comm_transfer"] == m["exposed_comm_ns"], (st, tot, m)
        assert tot["memcpy"] + tot["memset"] == m["exposed_memcpy_ns"], (st, tot, m)
        assert sum(tot[k] for k in IDLE_KINDS) == m["idle_ns"], (st, tot, m)
        checked += 1
    return checked


def _check_timelines_instant_by_instant(n_cases: int = 3000) -> None:
    """Random small timelines: the runs agree, at every ns, with 'what it is doing' evaluated directly from
    the definitions (running pieces, best by the priority key; else the gap around x, its launch, islands)."""
    import random

    rnd = random.Random(2024)
    for case in range(n_cases):
        acts = []
        for i in range(rnd.randint(0, 7)):
            s = rnd.randint(0, 40)
            e = s + rnd.choice([0, 1, 2, 3, 5, 8, 13])
            cls = rnd.choice(["compute", "comm", "comm", "memcpy", "memset"])
            a = Act(0, i, 0, 0, s, e, cls, rnd.choice(["a", "b"]), rnd.choice([None, 0, 1, 2]),
                    rnd.choice([None, rnd.randint(-5, 50)]))
            if cls == "comm":
                a.comm = {"wait_ns": rnd.randint(0, e - s)}
            acts.append(a)
        spans = [(s, s + rnd.randint(0, 6)) for s in (rnd.randint(-5, 50) for _ in range(rnd.randint(0, 3)))]
        tl = Timeline(0, 0, acts, spans)
        if not acts:
            assert tl.runs == [(NEG_INF, POS_INF, OUTSIDE)]
            continue
        first = min(a.start for a in acts)
        last = max(a.end for a in acts)

        def key(p):
            return (-PRIORITY[p.kind], p.start, -p.end, (0, p.act.stream) if p.act.stream is not None else (1, 0),
                    p.act.name, p.act.order)

        for x in range(first - 3, last + 3):
            running = [p for p in tl.pieces if p.start <= x < p.end]
            if running:
                best = min(running, key=key)
                want = (best.kind, best.act.name, best)
            elif x < first or x >= last:
                want = ("idle_unknown", None, None)
            else:
                g0 = max(a.end for a in acts if a.end <= x)
                g1 = min(a.start for a in acts if a.start > x)
                launches = [a.launch for a in acts if a.start == g1 and a.launch is not None]
                h = g0 if not launches else min(g1, max(g0, min(launches)))
                if any(s <= x < e for s, e in spans):
                    want = ("idle_sync", None, None)
                elif not launches:
                    want = ("idle_unknown", None, None)
                elif x < h:
                    want = ("idle_host_bound", None, None)
                else:
                    want = ("idle_other", None, None)
            got = tl.describe(tl.run_before(x + 1)[1])
            assert got[0] == want[0] and got[1] == want[1] and got[2] is want[2], (case, x, got, want)


def _check_scenarios(tmp: Path) -> None:
    runs = scenarios(tmp)
    for name, paths in runs.items():
        sr.clear_caches()
        res = critical_paths(paths)
        check_tiling(res)
        assert [s["step"] for s in res["steps"]] == STEPS[name], (name, res["steps"])
        for step, want in list(EXPECTED[name].items()) + list(EXPECTED_LAST[name].items()):
            got = path_tuples(res, step)
            assert got == want, (name, step, got, want)
        for step, want in EXPECTED_JUMPS[name].items():
            got = jump_tuples(res, step)
            assert got == want, (name, step, got, want)
        for step in STEPS[name]:
            if step not in EXPECTED_JUMPS[name]:
                assert not jump_tuples(res, step), (name, step)
        # each rank's file alone: its collectives are unmatched, so paths are single-rank
        n_single = 0
        for p in paths:
            sr.clear_caches()
            one = critical_paths([p])
            check_tiling(one)
            n_single += check_single_rank([p], one)
        print(f"scenario {name}: steps {STEPS[name]} OK; single-rank identity on {n_single} windows", flush=True)
    # the order of the files and gzip do not matter
    import gzip
    import shutil

    for name in ("late_rank_changes", "two_groups", "gloo_cpu_only"):
        paths = runs[name]
        sr.clear_caches()
        want = critical_paths(paths)
        sr.clear_caches()
        assert critical_paths(list(reversed(paths))) == want, name
        gz = []
        for p in paths:
            q = p.with_name(p.name + ".gz")
            with open(p, "rb") as src, gzip.open(q, "wb") as dst:
                shutil.copyfileobj(src, dst)
            gz.append(q)
        sr.clear_caches()
        assert critical_paths(gz, offsets=None) == want, name
    # the offsets argument: forcing all offsets to 0 in late_rank_changes makes rank 0 look 1 ms later
    paths = runs["late_rank_changes"]
    res = critical_paths(paths, offsets={str(p): 0 for p in paths})
    check_tiling(res)
    assert [s["rank"] for s in res["steps"]] == [0, 0, 0, 0], res["steps"]


def _summary(result: dict, label: str, seconds: float, single_rank: bool, paths) -> None:
    for st in result["steps"]:
        segs = [s for s in result["segments"] if s["step"] == st["step"]]
        by = defaultdict(int)
        for s in segs:
            by[(s["rank"], s["kind"])] += s["end_ns"] - s["start_ns"]
        top = ", ".join(f"r{r}:{k}={v / 1e3:.1f}us" for (r, k), v in sorted(by.items(), key=lambda x: -x[1]))
        n_j = sum(1 for j in result["jumps"] if j["step"] == st["step"])
        print(f"  {label} step {st['step']}: A=rank {st['rank']} device {st['device']} "
              f"span={(st['end_ns'] - st['start_ns']) / 1e3:.1f}us segments={len(segs)} jumps={n_j} | {top}")
    print(f"  {label}: {len(result['steps'])} steps in {seconds:.2f}s"
          f"{' (single-rank checks passed)' if single_rank else ''}", flush=True)


def _check_corpus(corpus: Path) -> None:
    runs = [
        ("amd merged 4 ranks", [corpus / "amd_hpctraining/fused_traces/merged_all_events.json.gz"], False),
        ("hta trace_filter 2 ranks", [corpus / "hta/trace_filter/sampled_rank-0.json.gz",
                                      corpus / "hta/trace_filter/sampled_rank-1.json.gz"], True),
        ("hta cpu_only 1 rank", [corpus / "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"], True),
    ]
    for label, paths, single in runs:
        if not all(p.is_file() for p in paths):
            print(f"  {label}: absent, skipped")
            continue
        sr.clear_caches()
        t0 = time.perf_counter()
        res = critical_paths(paths)
        dt = time.perf_counter() - t0
        check_tiling(res)
        for j in res["jumps"]:
            st = next(x for x in res["steps"] if x["step"] == j["step"])
            assert st["start_ns"] < j["path_ns"] <= st["end_ns"] and j["wait_on_path_ns"] > 0, j
        if single:
            check_single_rank(paths, res)
        _summary(res, label, dt, single, paths)
    sr.clear_caches()


if __name__ == "__main__":
    import sys
    import tempfile

    _check_timelines_instant_by_instant()
    print("timelines instant by instant: OK", flush=True)
    with tempfile.TemporaryDirectory() as d:
        _check_scenarios(Path(d))
    sr.clear_caches()
    print("hand-made scenarios: OK")
    corpus = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"
    if len(sys.argv) > 1:
        corpus = Path(sys.argv[1])
    if corpus.is_dir():
        _check_corpus(corpus)
        print("corpus: OK")
    else:
        print(f"{corpus} is absent: corpus checks skipped")
