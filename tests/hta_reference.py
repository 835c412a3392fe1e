"""Reference numbers for communication/computation overlap, used by the tests.

Three independent ways to get the overlap of a Kineto trace:

* :func:`run_hta_overlap` runs Meta's Holistic Trace Analysis (HTA, the peer we compare against) and
  returns its ``comp_comm_overlap_pctg`` per rank.
* :func:`hta_semantics_overlap` re-implements, in plain Python, exactly what HTA 0.5 computes (its
  filters, its microsecond rounding, its name rules). It exists to explain why traceq and HTA differ
  on a trace: when it agrees with :func:`run_hta_overlap`, the difference is one of the documented
  HTA choices listed below, not a bug on either side.
* :func:`brute_force_comm_overlap` is the simple, obviously-right check of docs/explanation/metrics.md over
  the whole trace: integer nanoseconds parsed exactly from the JSON text, unions over all streams of
  one GPU, a plain boundary sweep.

What HTA 0.5.0 does for ``TraceAnalysis(trace_dir=...).get_comm_comp_overlap()`` (paths relative to
``site-packages/hta``):

1. Parsing (``common/trace_parser.py``): the default backend is plain ``json`` (l.78-85, 352), all events
   become one DataFrame (l.357). If the ``ts`` column is float64 (any fractional ts), times are rounded
   to *integer microseconds*, start rounded up and end rounded down: ``end = ts + dur`` in float,
   ``ts = ceil(ts)``, ``end = floor(end)``, ``dur = end - ts`` (``round_down_time_stamps``, l.319-336).
   Kernels shorter than the rounding lose time; a kernel inside one microsecond gets ``dur`` 0 or -1.
   Integer-ts (old, epoch-us) traces are left as they are. Events without ``dur`` or ``cat`` and
   ``cat == "Trace"`` are dropped (l.253-254). ``stream`` and ``correlation`` come from ``args`` with
   default -1 (``_compress_df`` l.288-300; ``configs/default_event_args.py`` l.61-63, 101-103);
   ``gpu_user_annotation`` events carry no ``args.stream`` and so count as CPU events (stream -1).
2. Rank (``common/trace_file.py`` l.43-75): the first line matching ``"rank":\\s+(\\d+)`` (note: at
   least one space after the colon), else rank 0 -- several rank-less files in one directory overwrite
   each other. :func:`run_hta_overlap` therefore passes an explicit ``{rank: file}`` map.
3. Step filter (``common/trace.py`` ``_filter_irrelevant_gpu_kernels`` l.705-744, called by
   ``load_traces`` l.418 with ``include_last_profiler_step=False``): if the global symbol table has at
   least two distinct names containing ``"ProfilerStep"``, each rank keeps only its "CPU" events (not
   [stream >= 0 and correlation >= 0], ``common/trace_filter.py`` l.320-374) with
   ``ts < max(ts of CPU events named *ProfilerStep*)`` and only GPU events whose ``correlation`` equals
   the correlation of such a kept CPU event (inner merge, l.729-731). So: the LAST step is always
   dropped (kernels launched at or after the start of the last ProfilerStep), the first step is kept,
   and everything launched BEFORE the first ProfilerStep is kept too; kernels without a launch event
   are dropped. Because ``gpu_user_annotation`` copies of ``ProfilerStep#N`` count as CPU events, the
   cut is at the later of the CPU and GPU starts of the last step. With fewer than two step names
   nothing is filtered (whole trace, l.734-741).
4. Steps are otherwise NOT used: ``add_iteration`` (``common/trace.py`` l.156-216, a loop over all
   steps for every event) fills an ``iteration`` column that the overlap code never reads. There is
   no per-step average: the result is one ratio over all kept kernels of the rank,
   ``|U(comm) & U(comp)| / |U(comm)|`` (``analyzers/communication_analysis.py`` l.73-75), reported as
   ``round(100 * ratio, 2)`` (l.84-86).
5. Kernel classes (``utils/utils.py`` l.56-117, applied to every event with ``stream != -1``, i.e.
   kernels, gpu_memcpy, gpu_memset; ``communication_analysis.py`` l.34-37):
   communication = ``re.match(r"^nccl.*Kernel", name)`` (so ``ncclKernel_*`` and ``ncclDevKernel_*``
   incl. RCCL's ``ncclDevKernel_Generic``; not ``rccl*``, DeepEP, symmetric-memory or custom
   all-reduce kernels); memory = ``^Memcpy|^Memset|^dma``; computation = everything else that does not
   ``re.match(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")`` (names containing ``Memcpy`` or
   ``Sync`` anywhere are neither); the rest is OTHER and ignored.
6. Unions (``utils/utils.py`` ``merge_kernel_intervals`` l.130-144): comm and compute intervals are each
   merged across ALL streams of the rank (touching intervals merge: a new group starts only when
   ``ts > cummax(previous end)``), then a +1/-1 (comm) and +2/-2 (compute) sweep sums the time where the
   running status is 3 (``communication_analysis.py`` l.51-72). The denominator is the length of the
   merged comm union (l.73-75). Microsecond rounding can give a merged group ``end < ts``; it then
   counts negatively in the denominator (tiny effect, reproduced by :func:`hta_semantics_overlap`).
"""

from __future__ import annotations

import contextlib
import decimal
import gzip
import io
import json
import logging
import math
import os
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

__all__ = [
    "HTA_COMM_RE",
    "hta_is_comm",
    "trace_rank",
    "run_hta_overlap",
    "hta_semantics_overlap",
    "brute_force_comm_overlap",
    "load_trace_exact",
]

# ---------------------------------------------------------------------------------------------------
# HTA's own name rules (hta/utils/utils.py l.56, 72, 88), copied so tests can use them without HTA.
HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def hta_is_comm(name: str, args: dict | None = None) -> bool:
    """HTA 0.5's communication test: the kernel name matches ``^nccl.*Kernel``."""
    return HTA_COMM_RE.match(name) is not None


def hta_kernel_type(name: str) -> str:
    if HTA_COMM_RE.match(name):
        return "COMMUNICATION"
    if HTA_MEMORY_RE.match(name):
        return "MEMORY"
    if not HTA_NOT_COMPUTE_RE.match(name):
        return "COMPUTATION"
    return "OTHER"


# ---------------------------------------------------------------------------------------------------
# Reading traces


def _open_text(path: Path):
    path = Path(path)
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, "r", encoding="utf-8")


def load_trace_exact(trace_path: Path | str) -> tuple[dict, list[dict]]:
    """(top-level metadata without traceEvents, events) with every float as ``decimal.Decimal``."""
    with _open_text(Path(trace_path)) as fh:
        doc = json.load(fh, parse_float=decimal.Decimal)
    if isinstance(doc, list):  # 2021 traces: a bare array of events
        return {}, doc
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    return meta, doc.get("traceEvents", [])


def trace_rank(trace_path: Path | str, head_bytes: int = 4 << 20) -> int | None:
    """``distributedInfo.rank`` of a trace file, or None.

    Looks in the first ``head_bytes`` of the (decompressed) text, where Kineto writes the metadata,
    and decodes only the ``distributedInfo`` object; falls back to a full decode for small files.
    """
    trace_path = Path(trace_path)
    dec = json.JSONDecoder()

    def find(text: str) -> tuple[bool, int | None]:
        for m in re.finditer(r'"distributedInfo"\s*:\s*', text):
            try:
                info, _ = dec.raw_decode(text, m.end())
            except json.JSONDecodeError:
                continue
            if isinstance(info, dict):
                rank = info.get("rank")
                return True, (int(rank) if rank is not None else None)
        return False, None

    with _open_text(trace_path) as fh:
        head = fh.read(head_bytes)
        found, rank = find(head)
        if found or len(head) < head_bytes:
            return rank
        tail = head  # distributedInfo may follow the events: keep only the end of the text
        while chunk := fh.read(head_bytes):
            tail = tail[-head_bytes:] + chunk
    return find(tail[-2 * head_bytes :])[1]


# ---------------------------------------------------------------------------------------------------
# Running HTA itself


_HTA_PATCHED = False


def _hta_pandas_compat() -> None:
    """Make HTA 0.5.0 run under pandas 3.x (one monkeypatch, idempotent, harmless on pandas 2).

    ``hta.common.trace.transform_correlation_to_index`` (``common/trace.py`` l.116-130) creates
    ``index_correlation = np.minimum(df["correlation"], 0)``, which inherits the dtype of
    ``correlation`` -- downcast by ``_compress_df`` (``common/trace_parser.py`` l.311-314) to the
    smallest int type, e.g. int16 when all correlation ids are < 32768 -- and then stores event row
    indices into it (l.128-129). pandas 2 upcast with a FutureWarning; pandas 3 raises
    ``TypeError: Invalid value ... for dtype 'int16'`` (seen on tracelens/mi300/resnet_act_checkpoint).
    The patch widens ``correlation`` to int64 before the original function runs; values, and hence
    HTA's results, are unchanged. Without it: pin ``pandas<3``.
    """
    global _HTA_PATCHED
    if _HTA_PATCHED:
        return
    import hta.common.trace as hta_trace

    original = hta_trace.transform_correlation_to_index

    def transform_correlation_to_index(df, symbol_table):
        if "correlation" in df.columns and df["correlation"].dtype.kind in "iu":
            df["correlation"] = df["correlation"].astype("int64")
        return original(df, symbol_table)

    hta_trace.transform_correlation_to_index = transform_correlation_to_index
    _HTA_PATCHED = True


def run_hta_overlap(
    trace_paths: Iterable[Path | str],
    ranks: Iterable[int] | None = None,
    quiet: bool = True,
) -> dict[int, float]:
    """Run HTA's ``get_comm_comp_overlap`` on the given trace files (one file per rank, one job).

    Returns ``{rank: comp_comm_overlap_pctg}`` (a percentage rounded to 2 decimals by HTA; NaN when
    the rank has no communication kernel). Files and ranks as for :func:`hta_analysis`.
    """
    with hta_analysis(trace_paths, ranks, quiet) as analysis:
        df = analysis.get_comm_comp_overlap(visualize=False)
    return {int(r): float(v) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"])}


@contextlib.contextmanager
def hta_analysis(
    trace_paths: Iterable[Path | str],
    ranks: Iterable[int] | None = None,
    quiet: bool = True,
) -> Iterator[Any]:
    """HTA's ``TraceAnalysis`` over the given trace files (one file per rank, one job), for the block.

    The files are symlinked into a temporary directory as ``rank-<r>.<ext>``; ranks come from
    ``ranks`` if given, else from each file's ``distributedInfo.rank``, else from the file's position
    in the list. HTA gets an explicit ``{rank: file}`` map, so rank-less files work. ``quiet``: HTA's
    logging and stderr are silenced for the block.
    """
    from hta.trace_analysis import TraceAnalysis  # imported late: heavy, and optional for users

    _hta_pandas_compat()
    paths = [Path(p).resolve() for p in trace_paths]
    if not paths:
        raise ValueError("no trace files given")
    if ranks is not None:
        rank_list = [int(r) for r in ranks]
        if len(rank_list) != len(paths):
            raise ValueError("ranks and trace_paths differ in length")
    else:
        rank_list = []
        for i, p in enumerate(paths):
            r = trace_rank(p)
            rank_list.append(i if r is None else r)
    if len(set(rank_list)) != len(rank_list):
        raise ValueError(f"duplicate ranks {rank_list} for {paths}")

    with tempfile.TemporaryDirectory(prefix="hta_ref_") as tmp:
        files: dict[int, str] = {}
        for r, p in zip(rank_list, paths):
            ext = ".json.gz" if p.name.endswith(".gz") else ".json"
            link = Path(tmp) / f"rank-{r}{ext}"
            os.symlink(p, link)
            files[r] = str(link)
        hta_logger = logging.getLogger("hta")
        old_level = hta_logger.level
        redirect = contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext()
        try:
            if quiet:
                hta_logger.setLevel(logging.ERROR)
            with redirect:
                yield TraceAnalysis(trace_files=files, trace_dir=tmp)
        finally:
            hta_logger.setLevel(old_level)


# ---------------------------------------------------------------------------------------------------
# HTA's computation, re-implemented


def hta_semantics_overlap(
    trace_paths: Iterable[Path | str], exact_ns: bool = False
) -> dict[int | None, dict]:
    """What HTA 0.5 computes, in plain Python: ``{rank: {...}}`` per file (the module docstring's rules).

    Returns per rank ``overlap``, ``comm`` (HTA's integer microseconds), ``ratio`` and
    ``pctg`` (= ``round(100 * ratio, 2)``, what HTA prints), plus ``n_comm``/``n_compute`` kernels used.
    ``trace_paths`` are the files of one HTA run (the ProfilerStep-name test is global over them).

    ``exact_ns=True`` keeps HTA's kernel selection (step filter, name rules) but uses exact integer ns
    instead of HTA's ceil/floor microseconds; ``overlap``/``comm`` are then in ns. Comparing the two
    separates the effect of HTA's rounding from the effect of its kernel selection.
    """
    per_file = []
    step_names: set[str] = set()
    for i, p in enumerate(trace_paths):
        with _open_text(Path(p)) as fh:  # floats as doubles, like HTA, unless exact
            doc = json.load(fh, parse_float=decimal.Decimal if exact_ns else float)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        info = doc.get("distributedInfo", {}) if isinstance(doc, dict) else {}
        rank = info.get("rank", i) if isinstance(info, dict) else i
        any_float_ts = any(isinstance(e.get("ts"), (float, decimal.Decimal)) for e in events)
        missing_ts = any("ts" not in e for e in events)
        rows = []
        for e in events:
            if e.get("dur") is None or e.get("cat") is None or e["cat"] == "Trace":
                continue
            if "ts" not in e:
                continue
            ts, dur = e["ts"], e["dur"]
            if exact_ns:
                ts = _to_ns(ts, "ts")
                end = ts + _to_ns(dur, "dur")
            elif any_float_ts or missing_ts:  # pandas column is float64 -> HTA rounds
                end = float(ts) + float(dur)
                ts = math.ceil(float(ts))
                end = math.floor(end)
            else:
                end = ts + dur
            args = e.get("args") or {}
            try:
                stream = int(args.get("stream", -1))
            except (TypeError, ValueError):
                stream = -1
            corr = args.get("correlation", -1)
            rows.append((e["name"], ts, end, stream, corr))
            if "ProfilerStep" in e["name"]:
                step_names.add(e["name"])
        per_file.append((rank, rows))

    out: dict[int | None, dict] = {}
    for rank, rows in per_file:
        def is_gpu(row):
            return (row[3] >= 0 and row[4] >= 0) or row[0] in ("Event Sync", "Context Sync")

        if len(step_names) >= 2:
            cpu = [r for r in rows if not is_gpu(r)]
            last_start = max(r[1] for r in cpu if "ProfilerStep" in r[0])
            kept_cpu = [r for r in cpu if r[1] < last_start]
            kept_corr = {r[4] for r in kept_cpu}
            gpu = [r for r in rows if is_gpu(r) and r[4] in kept_corr]
            rows = gpu + kept_cpu
        comm, comp = [], []
        for name, ts, end, stream, _ in rows:
            if stream == -1:
                continue
            kind = hta_kernel_type(name)
            if kind == "COMMUNICATION":
                comm.append((ts, end))
            elif kind == "COMPUTATION":
                comp.append((ts, end))

        def merge(iv):  # merge_kernel_intervals, including its handling of end < ts
            iv = sorted(iv, key=lambda x: x[0])
            groups: list[list[int]] = []
            run_max = None
            for ts, end in iv:
                if run_max is None or ts > run_max:
                    groups.append([ts, end])
                else:
                    groups[-1][0] = min(groups[-1][0], ts)
                    groups[-1][1] = max(groups[-1][1], end)
                run_max = end if run_max is None else max(run_max, end)
            return groups

        mcomm, mcomp = merge(comm), merge(comp)
        pts = [(t, s) for a, b in mcomm for t, s in ((a, 1), (b, -1))]
        pts += [(t, s) for a, b in mcomp for t, s in ((a, 2), (b, -2))]
        pts.sort(key=lambda x: x[0])
        overlap, running = 0, 0
        for j, (t, s) in enumerate(pts):
            running += s
            if running == 3 and j + 1 < len(pts):
                overlap += pts[j + 1][0] - t
        comm_us = sum(b - a for a, b in mcomm)
        ratio = overlap / comm_us if comm_us else float("nan")
        out[rank] = {
            "overlap": overlap,
            "comm": comm_us,
            "unit": "ns" if exact_ns else "us",
            "ratio": ratio,
            "pctg": round(100 * ratio, 2) if comm_us else float("nan"),
            "n_comm": len(comm),
            "n_compute": len(comp),
        }
    return out


# ---------------------------------------------------------------------------------------------------
# Brute-force reference (docs/explanation/metrics.md over the whole trace)

KERNEL_CATS = ("kernel", "Kernel")


def _to_ns(value: Any, what: str) -> int:
    """Kineto microseconds (int or Decimal parsed from the JSON text) -> integer ns, exactly."""
    if isinstance(value, bool) or not isinstance(value, (int, decimal.Decimal)):
        raise ValueError(f"{what}: not a number: {value!r}")
    ns = decimal.Decimal(value) * 1000
    if ns != ns.to_integral_value():
        raise ValueError(f"{what}: {value} us is not a whole number of ns")
    return int(ns)


def _union_lengths(comm: list[tuple[int, int]], comp: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(|U(comm)|, |U(comm) & U(comp)|, |U(comm) - U(comp)|) by a boundary sweep."""
    # At every boundary t, count how many comm and compute intervals cover [t, next boundary).
    delta: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for start, end in comm:
        delta[start][0] += 1
        delta[end][0] -= 1
    for start, end in comp:
        delta[start][1] += 1
        delta[end][1] -= 1
    times = sorted(delta)
    n_comm = n_comp = 0
    comm_len = both_len = only_comm_len = 0
    for t, t_next in zip(times, times[1:]):
        n_comm += delta[t][0]
        n_comp += delta[t][1]
        seg = t_next - t
        if n_comm > 0:
            comm_len += seg
            if n_comp > 0:
                both_len += seg
            else:
                only_comm_len += seg
    return comm_len, both_len, only_comm_len


def brute_force_comm_overlap(
    trace_path: Path | str,
    is_comm: Callable[[str, dict], bool],
) -> dict[tuple[int | None, Any], dict[str, int]]:
    """Whole-trace comm/compute overlap per (rank, device), in integer nanoseconds.

    GPU kernels are the events with ``cat`` ``kernel``/``Kernel``; ``is_comm(name, args)`` decides
    comm, every other kernel is compute (memcpy/memset are not kernels here). Rank is
    ``distributedInfo.rank``, else the kernel's ``args.rank``, else None; device is
    ``args.device``, else the event's ``pid``. ts/dur are converted from the JSON text exactly.

    Returns ``{(rank, device): {"comm_ns", "overlapped_ns", "exposed_ns", "compute_ns",
    "comm_kernel_ns", "n_comm", "n_compute"}}`` with ``comm_ns = overlapped_ns + exposed_ns``.
    """
    meta, events = load_trace_exact(trace_path)
    info = meta.get("distributedInfo")
    file_rank = info.get("rank") if isinstance(info, dict) else None
    comm: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    comp: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    comm_kernel_ns: dict[tuple, int] = defaultdict(int)
    for e in events:
        if e.get("cat") not in KERNEL_CATS:
            continue
        args = e.get("args") or {}
        rank = file_rank if file_rank is not None else args.get("rank")
        device = args.get("device", e.get("pid"))
        key = (int(rank) if rank is not None else None, device)
        start = _to_ns(e["ts"], "ts")
        dur = _to_ns(e.get("dur", 0), "dur")
        if dur < 0:
            raise ValueError(f"negative dur in {e}")
        if is_comm(e["name"], args):
            comm[key].append((start, start + dur))
            comm_kernel_ns[key] += dur
        else:
            comp[key].append((start, start + dur))
    out = {}
    for key in sorted(set(comm) | set(comp), key=str):
        comm_len, both, exposed = _union_lengths(comm[key], comp[key])
        compute_len, _, _ = _union_lengths(comp[key], [])
        out[key] = {
            "comm_ns": comm_len,
            "overlapped_ns": both,
            "exposed_ns": exposed,
            "compute_ns": compute_len,
            "comm_kernel_ns": comm_kernel_ns[key],
            "n_comm": len(comm[key]),
            "n_compute": len(comp[key]),
        }
    return out
