"""The collector's own overhead beyond torch.profiler's, on the example (2 gloo ranks on CPU).

    python benchmarks/collector_overhead.py [--ranks 2] [--repeats 10] [--active 20]

Launches itself under torchrun. Every rank trains examples/train.py's tiny LM (DDP) through the
same loop in four modes, run in blocks of one run per mode, shuffled within each block, so that
drift hits all modes alike and each block gives one paired collector/profiler ratio:

- none:      no profiler (for scale only)
- profiler:  torch.profiler.profile with the collector's schedule and settings, on_trace_ready
             exporting the Chrome JSON: the cost every profiled run pays anyway (the baseline)
- profiler_gz: the same exporting to .json.gz (torch gzips in the training thread, level 9): what
             a user does without the collector to get the same compressed file
- collector: TraceCollector (same schedule) with its metadata, gzip on a background thread and the
             power sampler; on this GPU-less machine the sampler polls a fake NVML every 100 ms
             (each call sleeps --nvml-latency-ms, releasing the GIL like the real ctypes binding)

Reported per mode (rank 0's view, medians over repeats): the median time of a recorded step and the
wall time of the whole loop (start, recorded window, trace export, close). The overhead is the
collector/profiler ratio of each. On a shared 2-core machine these end-to-end numbers swing by tens
of percent between repeats, far more than the effect measured, so the script first measures the
collector's additions one by one, in this process, where they are stable:

- the cost of the one thing `.step()` adds to `profile.step()` (`PowerSampler.mark_step`),
- the CPU the sampler thread spends per step boundary (wake-up, energy counter read, record) and
  per second on its power rounds (process CPU time while the main thread sleeps, sampler on vs
  off): what it can take from training when no core is free.

Results also go to benchmarks/out/collector_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class SlowFakeNVML:
    """NVML stand-in: one GPU, constant readings, each call sleeping like a driver round trip."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    def _call(self, value):
        time.sleep(self.latency_s)
        return value

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return "fake GPU"

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-fake"

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._call(300_000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._call(1_000_000)


def run_loop(mode: str, args, model, opt, gen, out_dir: Path, tag: str) -> tuple[list[float], float]:
    """Train wait+warmup+active+1 steps under `mode`; return per-step seconds and the loop's seconds."""
    import torch
    import train
    from traceq.collectors import TraceCollector

    steps = args.warmup + args.active + 1
    times: list[float] = []

    def loop(mark) -> None:
        for _ in range(steps):
            t0 = time.perf_counter()
            train.train_step(model, opt, train.make_batch(gen, args.batch_size, args.seq_len, 256))
            mark()
            times.append(time.perf_counter() - t0)

    start = time.perf_counter()
    if mode == "none":
        loop(lambda: None)
    elif mode in ("profiler", "profiler_gz"):
        path = out_dir / f"{tag}.rank{torch.distributed.get_rank()}.json{'.gz' if mode == 'profiler_gz' else ''}"
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=args.warmup, active=args.active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
            record_shapes=True,
        )
        with prof:
            loop(prof.step)
    else:
        nvml = SlowFakeNVML(args.nvml_latency_ms / 1000)
        with TraceCollector(run=tag, out_dir=out_dir, wait=0, warmup=args.warmup, active=args.active,
                            warmup_steps=0, tokens_per_step=args.batch_size * args.seq_len * 2,
                            power_interval_ms=100, nvml=nvml) as tc:
            loop(tc.step)
    return times, time.perf_counter() - start


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "examples"))
    import train

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    margs = train.parse_args(["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)])
    model, opt = train.build("ddp", margs)
    gen = torch.Generator().manual_seed(rank)
    modes = ["none", "profiler", "profiler_gz", "collector"]
    rng = random.Random(0)  # same order on every rank
    order = [m for _ in range(args.repeats) for m in rng.sample(modes, len(modes))]  # shuffled blocks
    results: dict[str, dict[str, list[float]]] = {m: {"step_s": [], "loop_s": []} for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        run_loop("none", args, model, opt, gen, Path(tmp), "warm")  # first steps are slow: keep them out
        for i, mode in enumerate(order):
            dist.barrier()
            times, loop_s = run_loop(mode, args, model, opt, gen, Path(tmp), f"r{i}")
            recorded = times[args.warmup:args.warmup + args.active]
            results[mode]["step_s"].append(statistics.median(recorded))
            results[mode]["loop_s"].append(loop_s)
    dist.barrier()
    if rank == 0:
        report(args, results)
    dist.destroy_process_group()


def report(args, results) -> None:
    summary = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in results.items()}
    best = {m: {k: min(v) for k, v in r.items()} for m, r in results.items()}
    step_ratio = summary["collector"]["step_s"] / summary["profiler"]["step_s"]
    loop_ratio = summary["collector"]["loop_s"] / summary["profiler"]["loop_s"]
    paired = {k: statistics.median(c / p for c, p in zip(results["collector"][k], results["profiler"][k]))
              for k in ("step_s", "loop_s")}
    print(f"{args.ranks} gloo ranks, {args.repeats} repeats of {args.warmup + args.active + 1} steps "
          f"({args.active} recorded); medians over repeats")
    print(f"{'mode':12s} {'step ms (median)':>17s} {'loop s (median)':>16s} {'step ms (min)':>14s} {'loop s (min)':>13s}")
    for mode, s in summary.items():
        b = best[mode]
        print(f"{mode:12s} {s['step_s'] * 1e3:17.2f} {s['loop_s']:16.3f} {b['step_s'] * 1e3:14.2f} {b['loop_s']:13.3f}")
    print(f"collector / profiler: step time x{step_ratio:.4f} ({(step_ratio - 1) * 100:+.2f}%), "
          f"whole loop x{loop_ratio:.4f} ({(loop_ratio - 1) * 100:+.2f}%)")
    gz_ratio = summary["collector"]["loop_s"] / summary["profiler_gz"]["loop_s"]
    print(f"collector / profiler_gz: whole loop x{gz_ratio:.4f} ({(gz_ratio - 1) * 100:+.2f}%)")
    print(f"median of paired ratios (same block): step time x{paired['step_s']:.4f}, "
          f"whole loop x{paired['loop_s']:.4f}")
    spread = statistics.quantiles(results["profiler"]["step_s"], n=10)
    noisy = (spread[-1] - spread[0]) / summary["profiler"]["step_s"] > 0.02
    print(f"profiler-only step time p10..p90 across repeats: {spread[0] * 1e3:.1f}..{spread[-1] * 1e3:.1f} ms"
          + (": run-to-run noise exceeds 1%, so the end-to-end ratios cannot resolve a 1% overhead" if noisy else ""))
    components = json.loads((ROOT / "benchmarks" / "out" / "collector_components.json").read_text())
    step_s = summary["profiler"]["step_s"]
    per_step_s = (components["mark_step_us"] + components["boundary_cpu_us"]) * 1e-6
    estimate = components["sampler_core_share"] + per_step_s / step_s
    print(f"collector overhead from its components, as CPU taken from training: {estimate * 100:.2f}% of a "
          f"{step_s * 1e3:.1f} ms step (sampler core share + (mark_step + boundary work) / step time); "
          f"for a 1 s step: {(components['sampler_core_share'] + per_step_s) * 100:.3f}%")
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "collector_overhead.json").write_text(json.dumps(
        {"args": vars(args), "raw": results, "median": summary, "min": best,
         "step_ratio": step_ratio, "loop_ratio": loop_ratio, "paired_ratio": paired,
         "components": components, "component_estimate": estimate}, indent=1))


def component_costs(args) -> dict[str, float]:
    """What the collector adds, one part at a time, in CPU time (stable on a busy machine).

    mark_step_us: the call .step() adds to profile.step(), in the training thread;
    boundary_cpu_us: the sampler thread's work per step boundary (wake, energy read, record);
    sampler_core_share: the sampler's CPU per second of training at a 100 ms interval.
    """
    from traceq.collectors import PowerSampler

    nvml = SlowFakeNVML(args.nvml_latency_ms / 1000)
    with tempfile.TemporaryDirectory() as tmp:
        with PowerSampler(Path(tmp) / "a.jsonl", interval_ms=100, nvml=SlowFakeNVML(0)) as sampler:
            calls = 20_000
            t0 = time.perf_counter()
            for i in range(calls):
                sampler.mark_step(i)
            mark_us = (time.perf_counter() - t0) / calls * 1e6

        def cpu(seconds: float, sampler: bool, marks_per_s: float) -> float:
            """Process CPU seconds over `seconds` of a main thread that only sleeps (and marks steps)."""
            ps = PowerSampler(Path(tmp) / "b.jsonl", interval_ms=100, nvml=nvml) if sampler else None
            if ps:
                ps.start()
            ticks = max(1, int(seconds * marks_per_s))
            c0 = time.process_time()
            for i in range(ticks):
                if ps and marks_per_s:
                    ps.mark_step(i)
                time.sleep(seconds / ticks)
            used = time.process_time() - c0
            if ps:
                ps.stop()
            return used

        s, rate = args.idle_s, 50.0
        base_idle = min(cpu(s, False, 0) for _ in range(3))
        base_ticking = min(cpu(s, False, rate) for _ in range(3))
        idle = min(cpu(s, True, 0) for _ in range(3))
        ticking = min(cpu(s, True, rate) for _ in range(3))
    share = max(0.0, idle - base_idle) / s
    boundary_us = max(0.0, (ticking - base_ticking) - (idle - base_idle)) / (s * rate) * 1e6
    print(f"training thread, per .step(): mark_step {mark_us:.2f} us")
    print(f"sampler thread, per step boundary: {boundary_us:.0f} us CPU (wake-up, energy read, record)")
    print(f"sampler thread, power rounds at 100 ms: {share * 100:.3f}% of one core")
    return {"mark_step_us": mark_us, "boundary_cpu_us": boundary_us, "sampler_core_share": share}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2, help="gloo ranks (torchrun --nproc-per-node)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--active", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--nvml-latency-ms", type=float, default=0.2)
    p.add_argument("--idle-s", type=float, default=2.0, help="seconds per sampler CPU measurement")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    costs = component_costs(args)
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "collector_components.json").write_text(json.dumps(costs, indent=1))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
           __file__, "--worker", *sys.argv[1:]]
    sys.exit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
