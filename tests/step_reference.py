"""Brute-force reference for per-step device windows and their interval metrics.

This module is a reference written APART from traceq's SQL: it reads nothing from ``traceq/`` nor any
``sql/*.sql`` file (only the data file ``sql/kernel_rules.csv``), uses only the standard library, and
favours obviously-correct code (sort-and-merge unions, explicit loops) over speed. Tests compare
traceq's figures against it.

Rules implemented (the project's design contract, briefly):

Parsing
  * Only complete events (``ph == "X"``) are spans; an event whose ``ts`` or ``dur`` is missing, not a
    number (strings and booleans are not numbers; NaN/Infinity neither) or whose ``dur < 0`` is skipped.
  * Times are exact integer nanoseconds: the JSON is parsed with ``parse_float=Decimal`` and
    ``ns(v) = round_half_even(Decimal(v) * 1000)``; ``start = ns(ts)``, ``end = start + ns(dur)``.
  * Integers in args may be ints, integral floats or strings (``"7"``, ``"stream 7"``); a value that
    does not convert is missing.
  * rank = ``args.rank``, else the file's ``distributedInfo.rank``, else -1.
  * device (GPU events and ``gpu_user_annotation``) = ``args.device``, else the pid as int, else -1.

Device activity
  * cat kernel/Kernel/mtia_ccp_events = kernel; gpu_memcpy/Memcpy = memcpy; gpu_memset/Memset =
    memset; every other category is host-side.
  * A kernel's class comes from ``sql/kernel_rules.csv``: of all rules whose pattern ``re.search``-es
    the name the lowest priority wins; no rule = compute. A kernel with a non-null
    ``args["Collective name"]`` is comm unless its winning rule says sync or memcpy.
  * Class sync is not activity: ignored everywhere.

Launches and steps
  * Runtime events: host X events of cat cuda_runtime/Runtime/cuda_driver/mtia_runtime with an
    ``args.correlation``; the launch of a device event is the earliest runtime event with the same
    (rank, correlation).
  * Step marker (default ``^ProfilerStep#(\\d+)$``, ``re.search``). CPU step spans: host events (cat
    != gpu_user_annotation) matching it; group 1 as an integer is the step number and all events of one
    (rank, number) merge into min start..max end; otherwise steps are numbered 1, 2, ... per rank by
    (start, end). Device annotations: gpu_user_annotation events matching it, per (rank, device), same
    numbering.
  * The step that launched a device event: (1) with a launch, the CPU span of its rank with the greatest
    start <= launch ts, if launch ts < its end; (2) without a launch, the annotation of its (rank,
    device) with the greatest start <= event start, if event start < its end; (3) without a launch and
    without such an annotation, and only if the rank has no activity with a launch and no device
    annotation at all, the CPU span containing the event's start (same rule). Otherwise: no step.

Windows, per (rank, device), over all CPU steps N of the rank in step-number order
  * f_N = min start of activity launched by N; no f at all -> no windows; g_N = f_N, else the next
    later f, else E; s_N = running max of g; clamped = g_N < s_N; E = max end of activity launched by
    any step (at least the last s); e_N = s_{N+1}, e_last = E.
  * A rank without any CPU step: one window per device, step None, min start..max end of its activity.

Metrics of a window [s, e) on one device: every activity clipped to it (length <= 0 dropped):
  comm/compute_kernel_ns = sums of clipped lengths; comm_ns = |U(comm)|; compute_ns = |U(compute)|;
  overlapped_comm_ns = |U(comm) & U(compute)|; exposed_comm_ns = |U(comm) - U(compute)|;
  exposed_memcpy_ns = |U(memcpy|memset) - U(compute) - U(comm)|; busy_ns = |U(all)|;
  window_ns = e - s; idle_ns = window_ns - busy_ns.
  Identity: compute_ns + exposed_comm_ns + exposed_memcpy_ns + idle_ns == window_ns.

Outside the windows (devices with windows): before_ns = |U(all) & (-inf, s_first)|, n_before = events
starting before s_first; after_ns = |U(all) & [E, +inf)|, n_after = events ending after E.
Whole trace: the same metrics per device over min start..max end of all its activity, unclipped.

Resolutions of points the contract leaves open (see also the report that came with this file):
  * A marker match whose group 1 is not an integer (or a marker without a group) gets its ordinal among
    ALL matching events of its rank (or (rank, device)) ordered by (start, end); colliding numbers merge.
  * Spans with equal starts: the one with the greatest end (then greatest step number) is "the one with
    the greatest start"; containment is then checked on it only.
  * An annotation step number that is not a CPU step of the rank launches nothing (windows are built on
    CPU steps only); a rank whose marker only matches gpu_user_annotation events counts as step-less.
  * "any device event with a launch" in rule (3) counts activity only (sync events are ignored).
  * ``launched`` of a step-None window (step-less rank) is the number of all activity on the device.
  * String integers: optional surrounding blanks, optional sign, ASCII digits, optional "stream " prefix;
    "7.0" as a string is not an integer (an integral JSON number 7.0 is).

Run the self-checks with ``python -m tests.step_reference`` from the project root.
"""

from __future__ import annotations

import bisect
import csv
import functools
import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Context, Decimal
from pathlib import Path

DEFAULT_MARKER = r"^ProfilerStep#(\d+)$"

KERNEL_CATS = frozenset({"kernel", "Kernel", "mtia_ccp_events"})
MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
MEMSET_CATS = frozenset({"gpu_memset", "Memset"})
DEVICE_CATS = KERNEL_CATS | MEMCPY_CATS | MEMSET_CATS
RUNTIME_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "mtia_runtime"})
GPU_ANNOTATION_CAT = "gpu_user_annotation"

RULES_CSV = Path(__file__).resolve().parent.parent / "sql" / "kernel_rules.csv"

METRIC_KEYS = (
    "comm_kernel_ns",
    "compute_kernel_ns",
    "comm_ns",
    "compute_ns",
    "overlapped_comm_ns",
    "exposed_comm_ns",
    "exposed_memcpy_ns",
    "busy_ns",
    "window_ns",
    "idle_ns",
)

# Enough precision that Decimal * 1000 is always exact; rounding to an integer is half-even.
_CTX = Context(prec=100_000, rounding=ROUND_HALF_EVEN, Emax=999_999_999, Emin=-999_999_999)
_INT_STRING = re.compile(r"\s*(?:stream\s+)?([+-]?[0-9]+)\s*")
_INT_GROUP = re.compile(r"[+-]?[0-9]+")


# ----------------------------------------------------------------------------------------------------
# Scalars


def ns(value) -> int | None:
    """Exact integer nanoseconds of a microsecond JSON number, or None if it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        value = Decimal(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            return None
        return int(_CTX.to_integral_value(_CTX.multiply(value, Decimal(1000))))
    return None


def to_int(value) -> int | None:
    """An int from an int, an integral float/Decimal or an integer string ("7", "stream 7"); else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")) or not value.is_integer():
            return None
        return int(value)
    if isinstance(value, Decimal):
        if not value.is_finite() or _CTX.to_integral_value(value) != value:
            return None
        return int(value)
    if isinstance(value, str):
        m = _INT_STRING.fullmatch(value)
        return int(m.group(1)) if m else None
    return None


# ----------------------------------------------------------------------------------------------------
# Kernel classification


@functools.lru_cache(maxsize=1)
def kernel_rules() -> tuple[tuple[int, int, re.Pattern, str], ...]:
    """(priority, file order, compiled pattern, class) for every row of sql/kernel_rules.csv."""
    rules = []
    with open(RULES_CSV, newline="") as fh:
        for order, row in enumerate(csv.DictReader(fh)):
            pattern = (row.get("pattern") or "").strip()
            if not pattern:
                continue
            rules.append((int(row["priority"]), order, re.compile(pattern), row["class"].strip()))
    return tuple(rules)


@functools.lru_cache(maxsize=None)
def rule_class(name: str) -> str | None:
    """Class of the lowest-priority rule matching name (first in the file on a tie), None if none."""
    best = None
    for priority, order, rx, cls in kernel_rules():
        if rx.search(name) and (best is None or (priority, order) < best[:2]):
            best = (priority, order, cls)
    return None if best is None else best[2]


def kernel_class(name: str, args: dict) -> str:
    cls = rule_class(name)
    if args.get("Collective name") is not None and cls not in ("sync", "memcpy"):
        return "comm"
    return cls if cls is not None else "compute"


# ----------------------------------------------------------------------------------------------------
# Loading


@dataclass(slots=True)
class Activity:
    rank: int
    device: int
    start: int
    end: int
    cls: str  # comm | compute | memcpy | memset
    name: str
    correlation: int | None


@dataclass
class Trace:
    path: str
    file_rank: int | None
    activities: list[Activity] = field(default_factory=list)
    # (rank, correlation) -> start ns of the earliest runtime event
    launch_ts: dict[tuple[int, int], int] = field(default_factory=dict)
    # host-side X events other than gpu_user_annotation: (rank, name, start, end)
    host_spans: list[tuple[int, str, int, int]] = field(default_factory=list)
    # gpu_user_annotation X events: (rank, device, name, start, end)
    gpu_annotations: list[tuple[int, int, str, int, int]] = field(default_factory=list)
    n_sync: int = 0
    # (rank, device) -> its activity sorted by start (filled at the end of parsing)
    buckets: dict[tuple[int, int], "_DeviceBucket"] = field(default_factory=dict)


def _read_json(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return json.loads(fh.read(), parse_float=Decimal)


def _parse(path: str) -> Trace:
    doc = _read_json(path)
    file_rank = None
    if isinstance(doc, dict):
        info = doc.get("distributedInfo")
        if isinstance(info, dict):
            file_rank = to_int(info.get("rank"))
        events = doc.get("traceEvents") or []
    else:
        events = doc if isinstance(doc, list) else []
    trace = Trace(path=path, file_rank=file_rank)
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        start = ns(ev.get("ts"))
        dur = ns(ev.get("dur"))
        if start is None or dur is None or dur < 0:
            continue
        end = start + dur
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        rank = to_int(args.get("rank"))
        if rank is None:
            rank = file_rank if file_rank is not None else -1
        cat = ev.get("cat")
        name = ev.get("name")
        name = name if isinstance(name, str) else ("" if name is None else str(name))

        if cat in DEVICE_CATS or cat == GPU_ANNOTATION_CAT:
            device = to_int(args.get("device"))
            if device is None:
                device = to_int(ev.get("pid"))
            if device is None:
                device = -1
            if cat == GPU_ANNOTATION_CAT:
                trace.gpu_annotations.append((rank, device, name, start, end))
                continue
            if cat in MEMCPY_CATS:
                cls = "memcpy"
            elif cat in MEMSET_CATS:
                cls = "memset"
            else:
                cls = kernel_class(name, args)
            if cls == "sync":
                trace.n_sync += 1
                continue
            trace.activities.append(
                Activity(rank, device, start, end, cls, name, to_int(args.get("correlation")))
            )
            continue

        # host side
        trace.host_spans.append((rank, name, start, end))
        if cat in RUNTIME_CATS:
            corr = to_int(args.get("correlation"))
            if corr is not None:
                key = (rank, corr)
                if key not in trace.launch_ts or start < trace.launch_ts[key]:
                    trace.launch_ts[key] = start
    by_dev = defaultdict(list)
    for a in trace.activities:
        by_dev[(a.rank, a.device)].append(a)
    trace.buckets = {k: _DeviceBucket(v) for k, v in sorted(by_dev.items())}
    return trace


def _key(path) -> str:
    return str(Path(path).resolve())


@functools.lru_cache(maxsize=4)
def _load_cached(resolved: str) -> Trace:
    return _parse(resolved)


def load(path) -> Trace:
    """The parsed trace of a .json or .json.gz Kineto file (cached per resolved path)."""
    return _load_cached(_key(path))


# ----------------------------------------------------------------------------------------------------
# Interval algebra on sorted, disjoint [start, end) lists


def union(intervals) -> list[tuple[int, int]]:
    """Sorted disjoint union of [s, e) intervals; empty ones are dropped, touching ones merge."""
    out: list[list[int]] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(u) -> int:
    return sum(e - s for s, e in u)


def intersect(a, b) -> list[tuple[int, int]]:
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a, b) -> list[tuple[int, int]]:
    out = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e and cur < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _metrics(acts, s: int, e: int) -> dict:
    """Metrics of window [s, e) over acts (iterable of Activity of one device), clipping each."""
    ivs = defaultdict(list)
    kernel_sum = {"comm": 0, "compute": 0}
    for a in acts:
        lo, hi = max(a.start, s), min(a.end, e)
        if hi - lo <= 0:
            continue
        ivs[a.cls].append((lo, hi))
        if a.cls in kernel_sum:
            kernel_sum[a.cls] += hi - lo
    comm = union(ivs["comm"])
    comp = union(ivs["compute"])
    mem = union(ivs["memcpy"] + ivs["memset"])
    busy = union(ivs["comm"] + ivs["compute"] + ivs["memcpy"] + ivs["memset"])
    window_ns = e - s
    busy_ns = total(busy)
    return {
        "comm_kernel_ns": kernel_sum["comm"],
        "compute_kernel_ns": kernel_sum["compute"],
        "comm_ns": total(comm),
        "compute_ns": total(comp),
        "overlapped_comm_ns": total(intersect(comm, comp)),
        "exposed_comm_ns": total(subtract(comm, comp)),
        "exposed_memcpy_ns": total(subtract(subtract(mem, comp), comm)),
        "busy_ns": busy_ns,
        "window_ns": window_ns,
        "idle_ns": window_ns - busy_ns,
    }


class _DeviceBucket:
    """Activity of one (rank, device), sorted by start, for window look-ups with bisect."""

    def __init__(self, acts: list[Activity]):
        self.acts = sorted(acts, key=lambda a: (a.start, a.end))
        self.starts = [a.start for a in self.acts]
        self.max_dur = max((a.end - a.start for a in self.acts), default=0)

    def overlapping(self, s: int, e: int) -> list[Activity]:
        """A superset of the activity with a non-empty intersection with [s, e)."""
        lo = bisect.bisect_left(self.starts, s - self.max_dur)
        hi = bisect.bisect_left(self.starts, e)
        return self.acts[lo:hi]

    def metrics(self, s: int, e: int) -> dict:
        return _metrics(self.overlapping(s, e), s, e)


def _buckets(resolved: str) -> dict[tuple[int, int], _DeviceBucket]:
    return _load_cached(resolved).buckets


# ----------------------------------------------------------------------------------------------------
# Steps, launches, windows


class _Spans:
    """Step spans of one rank (or one (rank, device)): look up the span containing a time."""

    def __init__(self, spans: dict[int, tuple[int, int]]):
        self.by_step = spans
        self.sorted = sorted((s, e, n) for n, (s, e) in spans.items())
        self.starts = [s for s, _, _ in self.sorted]

    def containing(self, t: int) -> int | None:
        i = bisect.bisect_right(self.starts, t) - 1  # greatest start <= t (greatest end on ties)
        if i < 0:
            return None
        s, e, n = self.sorted[i]
        return n if t < e else None


def _number_steps(matches: list[tuple[int, int, int | None]]) -> dict[int, tuple[int, int]]:
    """(start, end, number or None) of one rank / (rank, device) -> {step: (min start, max end)}."""
    out: dict[int, tuple[int, int]] = {}
    for ordinal, (s, e, num) in enumerate(sorted(matches, key=lambda m: (m[0], m[1])), start=1):
        step = num if num is not None else ordinal
        if step in out:
            os_, oe = out[step]
            out[step] = (min(os_, s), max(oe, e))
        else:
            out[step] = (s, e)
    return out


@dataclass
class _Analysis:
    cpu_steps: dict[int, _Spans]  # rank -> spans (only ranks with at least one CPU step)
    launched_by: dict[int, int | None]  # id(activity) -> step
    windows: list[dict]
    s_first_E: dict[tuple[int, int], tuple[int, int]]  # (rank, device) -> (s_first, E)


@functools.lru_cache(maxsize=8)
def _analysis(resolved: str, marker: str) -> _Analysis:
    trace = _load_cached(resolved)
    rx = re.compile(marker)

    def match_number(name: str):
        m = rx.search(name)
        if m is None:
            return False, None
        if rx.groups >= 1:
            g = m.group(1)
            if g is not None and _INT_GROUP.fullmatch(g):
                return True, int(g)
        return True, None

    cpu_matches = defaultdict(list)
    for rank, name, s, e in trace.host_spans:
        ok, num = match_number(name)
        if ok:
            cpu_matches[rank].append((s, e, num))
    cpu_steps = {rank: _Spans(_number_steps(m)) for rank, m in cpu_matches.items()}

    ann_matches = defaultdict(list)
    for rank, device, name, s, e in trace.gpu_annotations:
        ok, num = match_number(name)
        if ok:
            ann_matches[(rank, device)].append((s, e, num))
    ann_steps = {k: _Spans(_number_steps(m)) for k, m in ann_matches.items()}
    ranks_with_ann = {rank for rank, _ in ann_steps}

    def launch_of(a: Activity):
        if a.correlation is None:
            return None
        return trace.launch_ts.get((a.rank, a.correlation))

    ranks_with_launch = {a.rank for a in trace.activities if launch_of(a) is not None}

    launched_by: dict[int, int | None] = {}
    for a in trace.activities:
        step = None
        cpu = cpu_steps.get(a.rank)
        lts = launch_of(a)
        if lts is not None:
            step = cpu.containing(lts) if cpu else None
        else:
            ann = ann_steps.get((a.rank, a.device))
            step = ann.containing(a.start) if ann else None
            if step is None and a.rank not in ranks_with_launch and a.rank not in ranks_with_ann:
                step = cpu.containing(a.start) if cpu else None
        if step is not None and (cpu is None or step not in cpu.by_step):
            step = None  # an annotation step that is no CPU step of the rank
        launched_by[id(a)] = step

    windows: list[dict] = []
    s_first_E: dict[tuple[int, int], tuple[int, int]] = {}
    for (rank, device), bucket in trace.buckets.items():  # the same Activity objects as launched_by
        acts = bucket.acts
        cpu = cpu_steps.get(rank)
        if cpu is None:
            s, e = min(a.start for a in acts), max(a.end for a in acts)
            windows.append(
                dict(rank=rank, device=device, step=None, start_ns=s, end_ns=e, clamped=False,
                     launched=len(acts))
            )
            s_first_E[(rank, device)] = (s, e)
            continue
        steps = sorted(cpu.by_step)
        f: dict[int, int | None] = {n: None for n in steps}
        count = {n: 0 for n in steps}
        E = None
        for a in acts:
            n = launched_by[id(a)]
            if n is None:
                continue
            count[n] += 1
            f[n] = a.start if f[n] is None else min(f[n], a.start)
            E = a.end if E is None else max(E, a.end)
        if E is None:
            continue  # no step launched anything on this device
        g = {}
        nxt = E
        for n in reversed(steps):
            if f[n] is not None:
                nxt = f[n]
            g[n] = nxt
        s_of = {}
        run = None
        for n in steps:
            run = g[n] if run is None else max(run, g[n])
            s_of[n] = run
        last_with_activity = max(n for n in steps if f[n] is not None)
        E = max(E, s_of[last_with_activity])
        for i, n in enumerate(steps):
            e = s_of[steps[i + 1]] if i + 1 < len(steps) else E
            windows.append(
                dict(rank=rank, device=device, step=n, start_ns=s_of[n], end_ns=e,
                     clamped=g[n] < s_of[n], launched=count[n])
            )
        s_first_E[(rank, device)] = (s_of[steps[0]], E)
    return _Analysis(cpu_steps, launched_by, windows, s_first_E)


# ----------------------------------------------------------------------------------------------------
# Public API


def step_windows(path, marker: str = DEFAULT_MARKER) -> list[dict]:
    """One dict per window: rank, device, step, start_ns, end_ns, clamped, launched."""
    return [dict(w) for w in _analysis(_key(path), marker).windows]


def step_metrics(path, marker: str = DEFAULT_MARKER) -> list[dict]:
    """One dict per window: rank, device, step, start_ns, end_ns and the METRIC_KEYS."""
    resolved = _key(path)
    buckets = _buckets(resolved)
    out = []
    for w in _analysis(resolved, marker).windows:
        row = {k: w[k] for k in ("rank", "device", "step", "start_ns", "end_ns")}
        row.update(buckets[(w["rank"], w["device"])].metrics(w["start_ns"], w["end_ns"]))
        out.append(row)
    return out


def span_metrics(path, rank: int, device: int, start_ns: int, end_ns: int) -> dict:
    """The metrics of an arbitrary window [start_ns, end_ns) on one (rank, device)."""
    bucket = _buckets(_key(path)).get((rank, device))
    return _metrics(bucket.overlapping(start_ns, end_ns) if bucket else [], start_ns, end_ns)


def outside(path, marker: str = DEFAULT_MARKER) -> list[dict]:
    """Per (rank, device) with windows: activity before the first window and after the last one."""
    resolved = _key(path)
    buckets = _buckets(resolved)
    out = []
    for (rank, device), (s_first, E) in sorted(_analysis(resolved, marker).s_first_E.items()):
        acts = buckets[(rank, device)].acts
        busy = union((a.start, a.end) for a in acts)
        out.append(
            dict(
                rank=rank,
                device=device,
                before_ns=total(intersect(busy, [(min(busy[0][0], s_first), s_first)])) if busy else 0,
                n_before=sum(1 for a in acts if a.start < s_first),
                after_ns=total(intersect(busy, [(E, max(busy[-1][1], E))])) if busy else 0,
                n_after=sum(1 for a in acts if a.end > E),
            )
        )
    return out


def whole_trace(path) -> list[dict]:
    """Per (rank, device) with activity: the metrics over min start..max end of all its activity."""
    out = []
    for (rank, device), bucket in _buckets(_key(path)).items():
        s = min(a.start for a in bucket.acts)
        e = max(a.end for a in bucket.acts)
        row = {"rank": rank, "device": device}
        row.update(_metrics(bucket.acts, s, e))
        out.append(row)
    return out


def clear_caches() -> None:
    _load_cached.cache_clear()
    _analysis.cache_clear()


# ----------------------------------------------------------------------------------------------------
# Self-checks: python -m tests.step_reference


def _check_interval_algebra() -> None:
    import random

    rnd = random.Random(1234)

    def rand_union():
        return union(
            (s, s + rnd.randint(0, 8)) for s in (rnd.randint(0, 40) for _ in range(rnd.randint(0, 6)))
        )

    def points(u):
        return {t for s, e in u for t in range(s, e)}

    for _ in range(3000):
        a, b = rand_union(), rand_union()
        pa, pb = points(a), points(b)
        assert total(a) == len(pa)
        assert points(intersect(a, b)) == pa & pb and total(intersect(a, b)) == len(pa & pb)
        assert points(subtract(a, b)) == pa - pb and total(subtract(a, b)) == len(pa - pb)
        assert union(a + b) == union(list(a) + list(b)) and points(union(a + b)) == pa | pb
        d = subtract(a, b)
        assert all(s < e for s, e in d) and all(d[i][1] < d[i + 1][0] for i in range(len(d) - 1))


def _write(tmp: Path, name: str, doc) -> Path:
    p = tmp / name
    p.write_text(json.dumps(doc))
    return p


def _x(name, cat, ts, dur, pid=0, tid=0, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _check_hand_made(tmp: Path) -> None:
    US = 1000

    # ns conversion and integer parsing
    assert ns(Decimal("1.0005")) == 1000 and ns(Decimal("1.0015")) == 1002 and ns(Decimal("-0.0005")) == 0
    assert ns(Decimal("1695835535123456.789123456789")) == 1695835535123456789
    assert ns(7) == 7000 and ns("7") is None and ns(True) is None and ns(float("nan")) is None
    assert to_int("7") == 7 and to_int("stream 7") == 7 and to_int(Decimal("7.0")) == 7
    assert to_int(Decimal("7.5")) is None and to_int("x") is None and to_int(True) is None
    assert rule_class("ncclDevKernel_AllReduce_x") == "comm" and rule_class("event_record") == "sync"
    assert rule_class("void gemm_kernel") == "compute" and rule_class("dma_request") == "memcpy"
    assert rule_class("something_unknown") is None

    # --- 1. GPU lags the CPU (the example of the brief) ---
    ev = [
        _x("ProfilerStep#1", "user_annotation", 0, 100, pid=1),
        _x("ProfilerStep#2", "user_annotation", 100, 100, pid=1),
        _x("cudaLaunchKernel", "cuda_runtime", 10, 5, pid=1, correlation=1),
        _x("cudaLaunchKernel", "cuda_runtime", 20, 5, pid=1, correlation=2),
        _x("cudaLaunchKernel", "cuda_runtime", 110, 5, pid=1, correlation=3),
        _x("cudaLaunchKernel", "cuda_runtime", 120, 5, pid=1, correlation=4),
        _x("cudaLaunchKernel", "cuda_runtime", 190, 5, pid=1, correlation=3),  # later duplicate: ignored
        _x("gemm_a", "kernel", 150, 100, device=0, correlation=1),
        _x("gemm_b", "kernel", 260, 40, device=0, correlation=2),
        _x("gemm_c", "kernel", 300, 50, device=0, correlation=3),
        _x("ncclDevKernel_AllReduce_x", "kernel", 320, 80, device=0, correlation=4),
        _x("orphan", "kernel", 10, 10, device=0),
        _x("event_record", "kernel", 0, 1000, device=0, correlation=1),  # sync: ignored
        _x("bad", "kernel", "5", 1, device=0),  # string ts: skipped
        _x("bad", "kernel", 5, -1, device=0),  # negative dur: skipped
        {"ph": "i", "name": "instant", "cat": "kernel", "ts": 5, "pid": 0},
    ]
    p1 = _write(tmp, "lag.json", {"distributedInfo": {"rank": 3}, "traceEvents": ev})
    assert len(load(p1).activities) == 5 and load(p1).n_sync == 1
    w = step_windows(p1)
    assert w == [
        dict(rank=3, device=0, step=1, start_ns=150 * US, end_ns=300 * US, clamped=False, launched=2),
        dict(rank=3, device=0, step=2, start_ns=300 * US, end_ns=400 * US, clamped=False, launched=2),
    ], w
    m = step_metrics(p1)
    base = dict(rank=3, device=0)
    assert m[0] == dict(
        base, step=1, start_ns=150 * US, end_ns=300 * US, comm_kernel_ns=0, compute_kernel_ns=140 * US,
        comm_ns=0, compute_ns=140 * US, overlapped_comm_ns=0, exposed_comm_ns=0, exposed_memcpy_ns=0,
        busy_ns=140 * US, window_ns=150 * US, idle_ns=10 * US,
    ), m[0]
    assert m[1] == dict(
        base, step=2, start_ns=300 * US, end_ns=400 * US, comm_kernel_ns=80 * US, compute_kernel_ns=50 * US,
        comm_ns=80 * US, compute_ns=50 * US, overlapped_comm_ns=30 * US, exposed_comm_ns=50 * US,
        exposed_memcpy_ns=0, busy_ns=100 * US, window_ns=100 * US, idle_ns=0,
    ), m[1]
    assert outside(p1) == [dict(base, before_ns=10 * US, n_before=1, after_ns=0, n_after=0)], outside(p1)
    whole = whole_trace(p1)
    assert whole == [dict(
        base, comm_kernel_ns=80 * US, compute_kernel_ns=200 * US, comm_ns=80 * US, compute_ns=200 * US,
        overlapped_comm_ns=30 * US, exposed_comm_ns=50 * US, exposed_memcpy_ns=0, busy_ns=250 * US,
        window_ns=390 * US, idle_ns=140 * US,
    )], whole
    # the same file with an ordinal marker (no group): same windows
    assert [(x["step"], x["start_ns"], x["end_ns"]) for x in step_windows(p1, r"^ProfilerStep#")] == [
        (1, 150 * US, 300 * US), (2, 300 * US, 400 * US)]
    # a marker that matches nothing: one step-None window over all activity = the whole trace
    none_w = step_metrics(p1, r"^NoSuchStep$")
    assert len(none_w) == 1 and none_w[0]["step"] is None
    assert {k: none_w[0][k] for k in METRIC_KEYS} == {k: whole[0][k] for k in METRIC_KEYS}
    assert step_windows(p1, r"^NoSuchStep$")[0]["launched"] == 5
    assert outside(p1, r"^NoSuchStep$") == [dict(base, before_ns=0, n_before=0, after_ns=0, n_after=0)]
    assert span_metrics(p1, 3, 0, 150 * US, 400 * US)["busy_ns"] == 240 * US
    assert span_metrics(p1, 3, 9, 0, 10)["window_ns"] == 10  # unknown device: all idle

    # --- 2. clamping: step 1's kernel runs after step 2's; step 3 launches nothing ---
    ev = [
        _x("ProfilerStep#1", "cpu_op", 0, 100),
        _x("ProfilerStep#2", "cpu_op", 100, 100),
        _x("ProfilerStep#3", "cpu_op", 200, 100),
        _x("launch", "cuda_runtime", 50, 1, correlation=1),
        _x("launch", "cuda_runtime", 150, 1, correlation=2),
        _x("k1", "kernel", 500, 100, pid=7, correlation=1),
        _x("k2", "kernel", 400, 50, pid=7, correlation=2),
        _x("after", "gpu_memcpy", 590, 30, pid=7),  # no launch -> no step; ends after E
    ]
    p2 = _write(tmp, "clamp.json", ev)  # bare list, no distributedInfo: rank -1
    w = step_windows(p2)
    assert [(x["step"], x["start_ns"], x["end_ns"], x["clamped"], x["launched"]) for x in w] == [
        (1, 500 * US, 500 * US, False, 1),
        (2, 500 * US, 600 * US, True, 1),
        (3, 600 * US, 600 * US, False, 0),
    ], w
    assert all(x["rank"] == -1 and x["device"] == 7 for x in w)
    assert outside(p2) == [dict(rank=-1, device=7, before_ns=50 * US, n_before=1, after_ns=20 * US, n_after=1)]
    m = step_metrics(p2)
    assert m[1]["compute_ns"] == 100 * US and m[1]["exposed_memcpy_ns"] == 0 and m[1]["busy_ns"] == 100 * US

    # --- 3. no launches: device-side annotations, rank from args, Collective name, memcpy rule ---
    ev = [
        _x("ProfilerStep#5", "Operator", 0, 100, pid=100, rank="2"),
        _x("ProfilerStep#6", "Operator", 100, 100, pid=100, rank="2"),
        _x("ProfilerStep#5", "gpu_user_annotation", 50, 100, pid=0, rank=2),
        _x("ProfilerStep#6", "gpu_user_annotation", 150, 110, pid=0, rank=2),
        _x("gemm", "kernel", 60, 30, pid=0, rank=2),
        _x("x", "kernel", 140, 30, pid=0, rank=2, **{"Collective name": "allreduce"}),
        _x("Memcpy HtoD", "gpu_memcpy", 160, 40, pid=0, rank=2),
        _x("event_record", "kernel", 0, 1000, pid=0, rank=2),
        _x("event_wait", "kernel", 0, 1000, pid=0, rank=2, **{"Collective name": "allreduce"}),
        _x("dma_request", "kernel", 250, 20, pid=0, rank=2, **{"Collective name": "allreduce"}),
        _x("other_dev", "kernel", 0, 10, pid=1, rank=2),
    ]
    p3 = _write(tmp, "annot.json", {"traceEvents": ev})
    w = step_windows(p3)
    assert [(x["rank"], x["device"], x["step"], x["start_ns"], x["end_ns"], x["launched"]) for x in w] == [
        (2, 0, 5, 60 * US, 160 * US, 2), (2, 0, 6, 160 * US, 270 * US, 2)], w
    m = step_metrics(p3)
    assert (m[0]["compute_ns"], m[0]["comm_ns"], m[0]["exposed_comm_ns"], m[0]["busy_ns"], m[0]["idle_ns"]) == (
        30 * US, 20 * US, 20 * US, 50 * US, 50 * US), m[0]
    assert (m[1]["compute_ns"], m[1]["comm_ns"], m[1]["comm_kernel_ns"], m[1]["exposed_comm_ns"],
            m[1]["exposed_memcpy_ns"], m[1]["busy_ns"], m[1]["idle_ns"]) == (
        0, 10 * US, 10 * US, 10 * US, 50 * US, 60 * US, 50 * US), m[1]
    assert [(x["device"], x["busy_ns"]) for x in whole_trace(p3)] == [(0, 110 * US), (1, 10 * US)]
    assert [x["device"] for x in outside(p3)] == [0]

    # --- 4. no launches and no annotations: kernels fall in the CPU span containing their start ---
    ev = [
        _x("ProfilerStep#1", "user_annotation", 0, 100),
        _x("k", "kernel", "@TS@", "@DUR@", pid="3"),  # fractional ns: exact, half-even
        _x("k", "kernel", 100, 5, pid="3"),  # starts exactly at the end of step 1: not in it
    ]
    p4 = tmp / "nolaunch.json"
    p4.write_text(json.dumps({"traceEvents": ev}).replace('"@TS@"', "50.0005").replace('"@DUR@"', "30.0015"))
    w = step_windows(p4)
    assert w == [dict(rank=-1, device=3, step=1, start_ns=50000, end_ns=50000 + 30002, clamped=False,
                      launched=1)], w
    assert outside(p4)[0]["after_ns"] == 5 * US and outside(p4)[0]["n_after"] == 1


def _check_corpus(corpus: Path) -> list[dict]:
    import time

    files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
                   and not p.name.endswith(".run.json"))  # a collector's side file, not a trace
    rows = []
    for f in files:
        clear_caches()
        t0 = time.perf_counter()
        load(f)
        t_load = time.perf_counter() - t0
        windows = step_windows(f)
        metrics = step_metrics(f)
        out = outside(f)
        whole = whole_trace(f)
        t_all = time.perf_counter() - t0

        by_dev = defaultdict(list)
        for w, m in zip(windows, metrics):
            assert all(w[k] == m[k] for k in ("rank", "device", "step", "start_ns", "end_ns"))
            by_dev[(m["rank"], m["device"])].append(m)
        for row in metrics + whole:
            assert row["compute_ns"] + row["exposed_comm_ns"] + row["exposed_memcpy_ns"] + row["idle_ns"] \
                == row["window_ns"], (f, row)
            assert 0 <= row["idle_ns"] <= row["window_ns"], (f, row)
            assert row["overlapped_comm_ns"] + row["exposed_comm_ns"] == row["comm_ns"], (f, row)
            assert row["comm_ns"] <= row["comm_kernel_ns"] and row["compute_ns"] <= row["compute_kernel_ns"]
        for (rank, device), ws in by_dev.items():
            for a, b in zip(ws, ws[1:]):
                assert a["start_ns"] <= a["end_ns"] == b["start_ns"] <= b["end_ns"], (f, a, b)
            steps = [x["step"] for x in ws]
            assert steps == sorted(steps, key=lambda s: (s is None, s)) and len(set(steps)) == len(steps)
            span = span_metrics(f, rank, device, ws[0]["start_ns"], ws[-1]["end_ns"])
            for k in METRIC_KEYS:
                assert sum(x[k] for x in ws) == span[k], (f, rank, device, k, sum(x[k] for x in ws), span[k])
        assert {(o["rank"], o["device"]) for o in out} == set(by_dev)
        for o in out:
            ws = by_dev[(o["rank"], o["device"])]
            # before + windows + after cover all of the device's busy time
            wh = next(x for x in whole if (x["rank"], x["device"]) == (o["rank"], o["device"]))
            assert o["before_ns"] + sum(x["busy_ns"] for x in ws) + o["after_ns"] == wh["busy_ns"], (f, o)
        rows.append(
            dict(
                file=str(f.relative_to(corpus)),
                devices=len(whole),
                windows=len(windows),
                clamped=sum(1 for w in windows if w["clamped"]),
                before_ns=sum(o["before_ns"] for o in out),
                after_ns=sum(o["after_ns"] for o in out),
                load_s=t_load,
                total_s=t_all,
            )
        )
        print(
            f"{rows[-1]['file']}: devices={len(whole)} windows={len(windows)} clamped={rows[-1]['clamped']} "
            f"before_ns={rows[-1]['before_ns']} after_ns={rows[-1]['after_ns']} "
            f"load={t_load:.2f}s total={t_all:.2f}s",
            flush=True,
        )
    clear_caches()
    return rows


if __name__ == "__main__":
    import sys
    import tempfile

    _check_interval_algebra()
    with tempfile.TemporaryDirectory() as d:
        _check_hand_made(Path(d))
    clear_caches()
    print("hand-made traces: OK")
    corpus = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"
    if len(sys.argv) > 1:
        corpus = Path(sys.argv[1])
    if corpus.is_dir():
        _check_corpus(corpus)
        print("corpus: OK")
    else:
        print(f"{corpus} is absent: corpus checks skipped")
