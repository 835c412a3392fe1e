"""Build a many-rank run at real density: one step of a real H200 trace replicated per rank and step, with
NCCL collectives between the layers, one late rank per step and clocks apart.

    python benchmarks/make_density.py --ranks 8                       # -> benchmarks/out/density/r8_s50
    python benchmarks/make_density.py --ranks 64 --steps 50 --processes 2
    python benchmarks/make_density.py --ranks 2048 --steps 4 --keep-every 8    # sparser, for 2048 ranks

Source: ``../shared/corpus/traceq_h200/h200-ddp/rank0.trace.json.gz`` (traceq's collector on one H200, DDP,
12 layers, ~1,250 kernels + ~340 memcpy/memset per step, world size 1: no communication kernels). Its
representative step is the steady step (not the first two, not the last) of median CPU duration. That step's
device events (kernels, memcpy, memset: stream, start relative to the step, duration, name and args) and the
runtime/driver call that launched each (thread, lead over its kernel, duration) are the template.

Per step and rank the template is written again with fresh correlation / External ids, and a collective
is inserted on a communication stream (20) between "layers": an AllGather before each of the 12 forward
layers (at each occurrence of the earliest kernel name that runs exactly once per layer in the forward:
SDPA flash forward here), a ReduceScatter after each backward layer (before each occurrence of the first
per-layer backward kernel, the last one a layer's length after the last), and an AllReduce (one float: a
gradient norm) halfway through the optimizer's part: 25 collectives, cutting the step into 26 chunks of
compute. Each collective has a kernel ``ncclDevKernel_<Coll>_RING_LL(ncclDevKernelArgsStorage<4096ul>)``
carrying the args traceq classifies and matches on (sql/read_events.sql, sql/gpu_activity.sql,
sql/comm_instances.sql): "Collective name", "Process Group Name" ("0"), "Process Group Description"
("default_pg"), "Process Group Ranks" (cut after 30 ranks as Kineto does: "[0, 1, ..., 29, ...]"),
"Group size", "In msg nelems", "Out msg nelems", "dtype" and "Seq" (the same on every rank: step x 25 +
collective), and on the CPU a ``record_param_comms`` op with the same args, an ``nccl:<op>`` annotation
and the ``cudaLaunchKernel`` (same correlation) inside them. Message sizes: one layer of the source model
(n_params_non_embedding / n_layers of bf16, sharded over the group); transfer = 8 us + bytes x
(n-1)/n / 350 GB/s.

Time model (integer ns, "true" time): every rank starts step s's device work at the same instant. Chunk c
of rank r runs the template's chunk c stretched by f (starts and durations of its events, relative to the
chunk's first event): f = 1 + U(0, jitter) on most ranks, f = 1 + lateness + U(0, jitter) on the step's late
rank (7 x step + 3) % N. A rank arrives at collective c when its chunk ends; its collective kernel starts
5 us later and every rank's kernel ends at the same instant: the last arrival + 5 us + transfer (so the late
rank's kernel is the shortest and the others wait for it). The next chunk starts after that end plus the
template's gap between the two chunks; the next step starts when the last rank's last chunk has ended plus
the template's tail. A launch keeps its template lead over its kernel (clipped to the step's CPU start).
ProfilerStep#N spans [start of step N, start of step N+1) on every rank. Then every timestamp of rank r is
shifted by its own clock offset (|offset| log-uniform in 20 us .. 2 ms, random sign) while every file keeps
the source's baseTimeNanoseconds: the ranks' clocks disagree as separate hosts' do.

Dropped from the source (the point is device density): CPU operators (cpu_op) other than the
record_param_comms of the inserted collectives, runtime calls that launched no device event
(cudaStreamIsCapturing, cudaEventQuery, ...), flow events, the gpu_user_annotation step copies. Kept: the
metadata events, and the top-level keys (schemaVersion, deviceProperties, distributedInfo with rank,
world_size and a pg_config of one group of N, cuda versions, displayTimeUnit, baseTimeNanoseconds); the
collector's own "traceq" key is left out (it names a run.json that is not written), so traceq analyses
every step (no warm-up) and names the run after the folder or --name.

``--keep-every k`` keeps every k-th template device event (with its launch; positions and durations
unchanged, so the step is as long, only sparser): for runs too large at full density (2048 ranks).

Writes ``OUT/rank{r}.trace.json.gz`` (gzip level 1) and ``OUT.truth.json`` beside the folder (so that
``traceq ingest OUT`` reads the traces alone): the late rank of every step,
each rank's clock offset, device events and kernels per rank-step, the collectives, sizes and times.
Memory: one step of one rank at a time per process (plus the plan: ranks x steps x 26 floats).
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO.parent / "shared" / "corpus" / "traceq_h200" / "h200-ddp" / "rank0.trace.json.gz"
OUT = REPO / "benchmarks" / "out" / "density"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
HEADER_KEYS = ("schemaVersion", "deviceProperties", "trace_id", "record_shapes", "distributedInfo",
               "cuda_driver_version", "cuda_runtime_version", "cupti_version", "displayTimeUnit",
               "baseTimeNanoseconds")
COMM_STREAM = 20
LAUNCH_GAP_NS = 5_000  # a rank's collective kernel starts this long after its compute before it ends
BUSBW_BYTES_PER_NS = 350.0  # 350 GB/s
TRUNCATE = 30  # Kineto lists at most 30 ranks of a group: "[0, 1, ..., 29, ...]"
COLLECTIVES = {  # kind -> (Collective name, nccl annotation, kernel name)
    "AllGather": ("_allgather_base", "nccl:_all_gather_base",
                  "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    "ReduceScatter": ("_reduce_scatter_base", "nccl:_reduce_scatter_base",
                      "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    "AllReduce": ("allreduce", "nccl:all_reduce",
                  "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
}


def us(ns: int) -> str:
    """Integer ns as Kineto's microseconds with three decimals (exact: no float in between)."""
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def late_rank(step: int, ranks: int) -> int:
    """The late rank of step number ``step`` (ProfilerStep#step)."""
    return (7 * step + 3) % ranks


# --------------------------------------------------------------------------------------------------
# the template: one step of the source trace


@dataclass
class Template:
    """One step of the source: its device events in start order and their launches, the cuts where the
    collectives go, the header and metadata events. Times in ns relative to the step's CPU start."""

    source: str
    step: int
    header: dict
    meta: list[str]
    step_pid: object
    step_tid: object
    comm_tid: object
    cpu_ns: int  # the step's CPU span
    base_ns: int  # the step's CPU start in the source (its clock: the output keeps it)
    starts: list[int]
    durs: list[int]
    heads: list[str]  # '{"ph":"X","cat":..,"name":..,"pid":..,"tid":..,"ts":'
    tails: list[str]  # ',"args":{...static args...,' (then External id, correlation)
    lags: list[int]  # launch lead over its kernel
    l_durs: list[int]
    l_heads: list[str]
    l_tails: list[str]
    cuts: list[tuple[int, str]] = field(default_factory=list)  # (device event index, collective kind)
    layer_params: int = 0
    kernels: int = 0


def _ns(us_value: float) -> int:
    return round(us_value * 1000)


def _head(e: dict) -> str:
    return (f'{{"ph":"X","cat":{json.dumps(e["cat"])},"name":{json.dumps(e["name"])},'
            f'"pid":{json.dumps(e["pid"])},"tid":{json.dumps(e["tid"])},"ts":')


def _tail(args: dict) -> str:
    rest = {k: v for k, v in args.items() if k not in ("External id", "correlation")}
    inner = json.dumps(rest, separators=(",", ":"))[1:-1]
    return ',"args":{' + (inner + "," if inner else "")


def load_template(source: Path, layers: int, step: int | None = None) -> Template:
    """The representative step of ``source`` (its steady step of median CPU duration, or ``step``) and
    where its ``layers`` x 2 + 1 collectives go."""
    with gzip.open(source, "rb") if source.suffix == ".gz" else open(source, "rb") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    spans = {int(e["name"].split("#")[1]): e for e in events
             if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")}
    numbers = sorted(spans)
    if step is None:
        steady = numbers[2:-1] or numbers
        median = statistics.median_low([spans[n]["dur"] for n in steady])
        step = next(n for n in steady if spans[n]["dur"] == median)
    span = spans[step]
    t0, t1 = span["ts"], span["ts"] + span["dur"]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("ph") == "X" and e.get("cat") in RUNTIME_CATS and t0 <= e["ts"] < t1
                and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS
                  and e.get("args", {}).get("correlation") in launches), key=lambda e: (e["ts"], e["dur"]))
    comm_ops = [e for e in events if e.get("name") == "record_param_comms" and t0 <= e["ts"] < t1]
    header = {k: doc[k] for k in HEADER_KEYS if k in doc}
    meta = [json.dumps(e, separators=(",", ":")) for e in events if e.get("ph") == "M"]
    base = _ns(t0)
    t = Template(
        source=str(source), step=step, header=header, meta=meta, step_pid=span["pid"], step_tid=span["tid"],
        comm_tid=comm_ops[0]["tid"] if comm_ops else span["tid"], cpu_ns=_ns(span["dur"]), base_ns=base,
        starts=[_ns(e["ts"]) - base for e in gpu], durs=[_ns(e["dur"]) for e in gpu],
        heads=[_head(e) for e in gpu], tails=[_tail(e["args"]) for e in gpu],
        lags=[max(0, _ns(e["ts"]) - _ns(launches[e["args"]["correlation"]]["ts"])) for e in gpu],
        l_durs=[_ns(launches[e["args"]["correlation"]]["dur"]) for e in gpu],
        l_heads=[_head(launches[e["args"]["correlation"]]) for e in gpu],
        l_tails=[_tail(launches[e["args"]["correlation"]]["args"]) for e in gpu],
    )
    t.kernels = sum(e["cat"] == "kernel" for e in gpu)
    t.cuts = _cuts([e["name"] if e["cat"] == "kernel" else None for e in gpu], layers)
    run_json = source.with_name(source.name.replace(".trace.json.gz", ".run.json"))
    meta_run = json.loads(run_json.read_text()) if run_json.exists() else {}
    t.layer_params = int((meta_run.get("n_params_non_embedding") or 667_994_112) / (meta_run.get("n_layers") or 12))
    return t


def _cuts(names: list[str | None], layers: int) -> list[tuple[int, str]]:
    """Where the collectives go (indices into the step's device events in start order): an AllGather at
    each occurrence of the earliest kernel name seen exactly ``layers`` times (a forward layer), a
    ReduceScatter before each occurrence but the first of the earliest such name whose first occurrence
    follows the forward's last (a backward layer), the last one a layer's length after the last
    occurrence, and an AllReduce halfway from there to the end. Evenly spaced cuts where no such names."""
    n = len(names)
    where: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        if name is not None:
            where.setdefault(name, []).append(i)
    per_layer = sorted((idx for idx in where.values() if len(idx) == layers), key=lambda idx: idx[0])
    cuts: list[int] = []
    if per_layer:
        fwd = per_layer[0]
        bwd = next((idx for idx in per_layer if idx[0] > fwd[-1]), None)
        if bwd is not None:
            gap = int(statistics.median(b - a for a, b in zip(bwd, bwd[1:]))) if layers > 1 else (n - bwd[0]) // 2
            last = min(bwd[-1] + gap, n - 2)
            cuts = [*fwd, *bwd[1:], last, (last + n) // 2]
    if len(cuts) != 2 * layers + 1 or cuts[0] <= 0 or any(b <= a for a, b in zip(cuts, cuts[1:])) or cuts[-1] >= n:
        k = 2 * layers + 1
        cuts = [round(n * (i + 1) / (k + 1)) for i in range(k)]
    kinds = ["AllGather"] * layers + ["ReduceScatter"] * layers + ["AllReduce"]
    return list(zip(cuts, kinds))


# --------------------------------------------------------------------------------------------------
# the plan: when every chunk and collective runs on every rank


@dataclass
class Plan:
    ranks: int
    steps: int
    first_step: int
    keep_every: int
    chunk_first: list[int]  # per chunk: its first and one past its last device event index
    chunk_end: list[int]
    chunk_t0: list[int]  # template start of the chunk's first event
    chunk_span: list[int]
    chunk_gap: list[int]  # template gap to the next chunk (>= 0)
    kinds: list[str]
    transfer: list[int]
    nelems: list[tuple[int, int, str]]  # (in, out, dtype)
    factor: np.ndarray  # [rank, step, chunk]
    step_start: np.ndarray  # [step + 1]: true ns; the last one = end of the last step's CPU span
    chunk_start: np.ndarray  # [step, chunk]
    comm_end: np.ndarray  # [step, collective]
    offsets: np.ndarray  # [rank] ns
    late: list[int]


def make_plan(t: Template, ranks: int, steps: int, lateness: float, jitter: float, seed: int,
              keep_every: int = 1, first_step: int = 1) -> Plan:
    """The true-time plan of every step: chunk starts, collective ends, each rank's stretch factor."""
    rng = np.random.default_rng(seed)
    n = len(t.starts)
    bounds = [0, *[c for c, _ in t.cuts], n]
    first, end = bounds[:-1], bounds[1:]
    t0 = [t.starts[a] for a in first]
    stop = [max(t.starts[i] + t.durs[i] for i in range(a, b)) for a, b in zip(first, end)]
    span = [s - a for a, s in zip(t0, stop)]
    gap = [max(0, t0[c + 1] - stop[c]) for c in range(len(first) - 1)]
    tail = max(0, t.cpu_ns - stop[-1])
    chunks = len(first)
    kinds = [k for _, k in t.cuts]
    transfer, nelems = [], []
    for kind in kinds:
        if kind == "AllReduce":
            size, nelems_io = 4, (1, 1, "Float")
        else:
            shard = -(-t.layer_params // ranks)
            full = shard * ranks
            size = full * 2
            nelems_io = (shard, full, "BFloat16") if kind == "AllGather" else (full, shard, "BFloat16")
        transfer.append(8_000 + round(size * (ranks - 1) / ranks / BUSBW_BYTES_PER_NS))
        nelems.append(nelems_io)
    factor = 1.0 + rng.uniform(0.0, jitter, size=(ranks, steps, chunks))
    late = [late_rank(first_step + s, ranks) for s in range(steps)]
    for s, r in enumerate(late):
        factor[r, s, :] += lateness
    mag = np.exp(rng.uniform(np.log(20_000), np.log(2_000_000), size=ranks))
    offsets = (mag * rng.choice([-1, 1], size=ranks)).astype(np.int64)
    span_arr = np.array(span, dtype=np.float64)
    step_start = np.zeros(steps + 1, dtype=np.int64)
    chunk_start = np.zeros((steps, chunks), dtype=np.int64)
    comm_end = np.zeros((steps, chunks - 1), dtype=np.int64)
    clock = t.base_ns
    for s in range(steps):
        step_start[s] = clock
        a = clock + t0[0]
        for c in range(chunks):
            chunk_start[s, c] = a
            arrive = a + np.rint(span_arr[c] * factor[:, s, c]).astype(np.int64)
            if c == chunks - 1:
                clock = int(arrive.max()) + tail
                break
            comm_end[s, c] = int(arrive.max()) + LAUNCH_GAP_NS + transfer[c]
            a = int(comm_end[s, c]) + gap[c]
    step_start[steps] = clock
    return Plan(ranks, steps, first_step, keep_every, first, end, t0, span, gap, kinds, transfer, nelems, factor,
                step_start, chunk_start, comm_end, offsets, late)


# --------------------------------------------------------------------------------------------------
# writing a rank


def _group_ranks(ranks: int) -> str:
    shown = ", ".join(str(r) for r in range(min(ranks, TRUNCATE)))
    return f"[{shown}, ...]" if ranks > TRUNCATE else f"[{shown}]"


def _header(t: Template, rank: int, ranks: int) -> dict:
    h = json.loads(json.dumps(t.header))
    info = h.get("distributedInfo") or {}
    info.update({"backend": "nccl", "rank": rank, "world_size": ranks, "pg_count": 1,
                 "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                "pg_size": ranks, "ranks": list(range(ranks))}]})
    h["distributedInfo"] = info
    h["trace_id"] = f"{rank:032X}"
    return h


def rank_step_events(t: Template, p: Plan, rank: int, s: int, next_id: int) -> tuple[list[str], int]:
    """The events of rank ``rank``'s step index ``s`` as JSON texts; the next free id after them."""
    off = int(p.offsets[rank])
    out: list[str] = []
    cpu0 = int(p.step_start[s])
    cpu1 = int(p.step_start[s + 1])
    out.append(f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{p.first_step + s}",'
               f'"pid":{json.dumps(t.step_pid)},"tid":{json.dumps(t.step_tid)},"ts":{us(cpu0 + off)},'
               f'"dur":{us(cpu1 - cpu0)},"args":{{"External id":{next_id}}}}}')
    next_id += 1
    low = cpu0 + 1_000
    starts, durs, heads, tails = t.starts, t.durs, t.heads, t.tails
    lags, l_durs, l_heads, l_tails = t.lags, t.l_durs, t.l_heads, t.l_tails
    group = _group_ranks(p.ranks)
    seq_base = s * len(p.kinds)
    keep = p.keep_every
    for c in range(len(p.chunk_first)):
        f = float(p.factor[rank, s, c])
        a = int(p.chunk_start[s, c])
        c0 = p.chunk_t0[c]
        for i in range(p.chunk_first[c], p.chunk_end[c]):
            if keep > 1 and i % keep:
                continue
            start = a + round((starts[i] - c0) * f)
            dur = round(durs[i] * f)
            launch = max(low, start - lags[i])
            ids = f'"External id":{next_id},"correlation":{next_id}}}}}'
            out.append(f"{l_heads[i]}{us(launch + off)},\"dur\":{us(l_durs[i])}{l_tails[i]}{ids}")
            out.append(f"{heads[i]}{us(start + off)},\"dur\":{us(dur)}{tails[i]}{ids}")
            next_id += 1
        if c == len(p.kinds):
            break
        kind = p.kinds[c]
        coll, annotation, kernel = COLLECTIVES[kind]
        arrive = a + round(p.chunk_span[c] * f)
        k0 = arrive + LAUNCH_GAP_NS
        k1 = int(p.comm_end[s, c])
        n_in, n_out, dtype = p.nelems[c]
        args = (f'"Collective name":"{coll}","Process Group Name":"0","Process Group Description":"default_pg",'
                f'"Process Group Ranks":"{group}","Group size":{p.ranks},"In msg nelems":{n_in},'
                f'"Out msg nelems":{n_out},"dtype":"{dtype}","Seq":{seq_base + c + 1}')
        op0 = max(low, k0 - 60_000)
        pid, tid = json.dumps(t.step_pid), json.dumps(t.comm_tid)
        out.append(f'{{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":{pid},"tid":{tid},'
                   f'"ts":{us(op0 + off)},"dur":{us(40_000)},"args":{{"External id":{next_id},{args}}}}}')
        out.append(f'{{"ph":"X","cat":"user_annotation","name":"{annotation}","pid":{pid},"tid":{tid},'
                   f'"ts":{us(op0 + 2_000 + off)},"dur":{us(30_000)},"args":{{"External id":{next_id + 1}}}}}')
        out.append(f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":{pid},"tid":{tid},'
                   f'"ts":{us(op0 + 5_000 + off)},"dur":{us(8_000)},'
                   f'"args":{{"External id":{next_id + 2},"cbid":211,"correlation":{next_id + 2}}}}}')
        out.append(f'{{"ph":"X","cat":"kernel","name":"{kernel}","pid":0,"tid":{COMM_STREAM},'
                   f'"ts":{us(k0 + off)},"dur":{us(k1 - k0)},"args":{{"External id":{next_id + 2},'
                   f'"device":0,"context":1,"stream":{COMM_STREAM},"correlation":{next_id + 2},{args}}}}}')
        next_id += 3
    return out, next_id


def write_rank(t: Template, p: Plan, rank: int, out_dir: Path) -> tuple[int, int]:
    """Write ``out_dir/rank{rank}.trace.json.gz``; (bytes of JSON, events)."""
    header = _header(t, rank, p.ranks)
    head = json.dumps(header, separators=(",", ":"))[:-1] + ',"traceEvents":[\n'
    path = out_dir / f"rank{rank}.trace.json.gz"
    tmp = path.with_suffix(".gz.tmp")
    total = events = 0
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz:
        def put(text: str) -> None:
            nonlocal total
            data = text.encode()
            total += len(data)
            gz.write(data)

        put(head + ",\n".join(t.meta))
        events += len(t.meta)
        next_id = 1
        for s in range(p.steps):
            chunk, next_id = rank_step_events(t, p, rank, s, next_id)
            events += len(chunk)
            put(",\n" + ",\n".join(chunk))
        put('\n],"traceName":' + json.dumps(f"rank{rank}.trace.json") + "}\n")
    tmp.replace(path)
    return total, events


_STATE: dict = {}


def _work(rank: int) -> tuple[int, int]:
    return write_rank(_STATE["t"], _STATE["p"], rank, _STATE["out"])


def build(source: Path, out: Path, ranks: int, steps: int, *, layers: int = 12, lateness: float = 0.25,
          jitter: float = 0.01, seed: int = 48, processes: int = 2, keep_every: int = 1,
          template_step: int | None = None) -> dict:
    """Write the run (``ranks`` files) under ``out`` and its truth beside it (:func:`truth_path`); the truth as a dict."""
    started = time.perf_counter()
    t = load_template(source, layers, template_step)
    loaded = time.perf_counter() - started
    p = make_plan(t, ranks, steps, lateness, jitter, seed, keep_every)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.trace.json.gz"):
        old.unlink()
    _STATE.update(t=t, p=p, out=out)
    if processes > 1 and ranks > 1:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            written = pool.map(_work, range(ranks), chunksize=1)
    else:
        written = [_work(r) for r in range(ranks)]
    seconds = time.perf_counter() - started
    kept = [i for i in range(len(t.starts)) if keep_every == 1 or i % keep_every == 0]
    kernels = sum(t.heads[i].startswith('{"ph":"X","cat":"kernel"') for i in kept)
    device = len(kept)
    kinds = Counter(p.kinds)
    truth = {
        "source": str(source), "template_step": t.step, "ranks": ranks, "steps": steps,
        "step_numbers": [p.first_step, p.first_step + steps - 1], "layers": layers, "lateness": lateness,
        "jitter": jitter, "seed": seed, "keep_every": keep_every,
        "late_rank": {str(p.first_step + s): r for s, r in enumerate(p.late)},
        "late_rank_rule": "(7 * step + 3) % ranks",
        "offsets_ns": [int(x) for x in p.offsets],
        "collectives_per_step": len(p.kinds), "collective_kinds": dict(kinds),
        "cuts": [f"{k} before device event {i} of {len(t.starts)}" for i, k in t.cuts],
        "device_events_per_rank_step": device + len(p.kinds),
        "kernels_per_rank_step": kernels + len(p.kinds),
        "compute_kernels_per_rank_step": kernels,
        "memcpy_memset_per_rank_step": device - kernels,
        "events_per_rank": written[0][1],
        "true_step_ms": [round(int(p.step_start[s + 1] - p.step_start[s]) / 1e6, 3) for s in range(steps)],
        "transfer_us": dict(zip([f"{k}{i}" for i, k in enumerate(p.kinds)], [x / 1e3 for x in p.transfer])),
        "json_bytes": sum(b for b, _ in written),
        "gz_bytes": sum(f.stat().st_size for f in out.glob("rank*.trace.json.gz")),
        "events": sum(e for _, e in written),
        "load_s": round(loaded, 2), "seconds": round(seconds, 2), "processes": processes,
    }
    truth_path(out).write_text(json.dumps(truth, indent=1))
    return truth


def truth_path(out: Path) -> Path:
    """Where the known answer of the run in ``out`` is written: ``OUT.truth.json`` beside the folder."""
    return out.with_name(out.name + ".truth.json")


def default_out(ranks: int, steps: int, keep_every: int = 1) -> Path:
    return OUT / (f"r{ranks}_s{steps}" + (f"_k{keep_every}" if keep_every > 1 else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out", type=Path, help="folder (default: benchmarks/out/density/r<N>_s<S>[_k<k>])")
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--template-step", type=int, help="the source step to replicate (default: median steady step)")
    ap.add_argument("--layers", type=int, default=12, help="layers of the source model (AllGather/ReduceScatter each)")
    ap.add_argument("--lateness", type=float, default=0.25, help="the late rank's compute is this much longer")
    ap.add_argument("--jitter", type=float, default=0.01, help="other ranks' compute is up to this much longer")
    ap.add_argument("--keep-every", type=int, default=1, help="keep every k-th template device event")
    ap.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=48)
    args = ap.parse_args(argv)
    out = args.out or default_out(args.ranks, args.steps, args.keep_every)
    truth = build(args.source, out, args.ranks, args.steps, layers=args.layers, lateness=args.lateness,
                  jitter=args.jitter, seed=args.seed, processes=args.processes, keep_every=args.keep_every,
                  template_step=args.template_step)
    print(f"{out}: {args.ranks} ranks x {args.steps} steps, {truth['kernels_per_rank_step']} kernels "
          f"({truth['device_events_per_rank_step']} device events) per rank-step, {truth['events']:,} events, "
          f"{truth['json_bytes'] / 1e6:,.1f} MB of JSON, {truth['gz_bytes'] / 1e6:,.1f} MB gzipped, "
          f"{truth['seconds']:.1f} s (template {truth['load_s']:.1f} s, step {truth['template_step']}, "
          f"{args.processes} processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
