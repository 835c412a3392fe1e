"""Run metadata: what `rank<r>.run.json` holds and where each value comes from.

One JSON object per rank (written at start with `"complete": false`, rewritten at exit)::

    traceq_run_metadata  1 (format version)
    complete             true once the collector exited and every trace file is in place
    run, rank, local_rank, world_size, rank_source ("torch.distributed" | "env" | "default")
    host, pid, backend   hostname, process id, torch.distributed backend or null
    nodes, gpus_per_node user-given, else torchrun's GROUP_WORLD_SIZE / LOCAL_WORLD_SIZE, else derived
                         (on CPU jobs gpus_per_node counts ranks per node)
    tp, pp, cp, dp       parallel degrees; dp = world_size / (tp*pp*cp) when not given
    tokens_per_step      global tokens per optimizer step (user-given), global_batch_size, micro_batch_size
    model, n_params_non_embedding, n_layers, n_heads, head_dim, seq_len, flops_per_step
    device_type          "cuda" | "cpu" (`device` in files of traceq 0.1); gpu_model (torch.cuda.get_device_name) or null
    peak_tflops          dense BF16 peak of one GPU if the user gave one (peak_tflops_source "user"), else
                         null: reports take it from traceq's peak table for gpu_model
    torch_version, cuda_version, nccl_version, python_version
    warmup_steps         recorded steps that reports skip (study: 10)
    profiled_steps       recorded steps per cycle (= schedule.active; default 61: the study's 60 and one that closes the last)
    first_profiled_step  N of the first recorded ProfilerStep#N (= wait + warmup)
    schedule             {"wait", "warmup", "active", "repeat"} as given to torch.profiler.schedule
    steps_seen           number of .step() calls; a ProfilerStep#N with N >= steps_seen is the tail
                         between the last .step() and the exit (no training work: drop it)
    trace_file           name of the first trace file (cycle 0), null until written
    trace_files          [{"file", "cycle", "offset_ns"}] every trace file this rank wrote
    power_file           name of the power log, or null when power sampling is off
    clock                see below
    errors               ["..."] problems met while profiling (export failed, sampler failed, ...)
    extra                user-given JSON

`clock` ties trace time, wall-clock time and the local clocks together::

    {"rule": "wall_ns = trace_ts_ns + offset_ns; trace_ts_ns = ts_us * 1000",
     "offset_ns": <baseTimeNanoseconds of trace_file>, "offset_source": "baseTimeNanoseconds",
     "wall_clock": "time.time_ns() ...",
     "start": {"time_ns", "perf_counter_ns", "monotonic_ns"},  taken when the collector started
     "end":   {"time_ns", "perf_counter_ns", "monotonic_ns"}}  taken when it exited (null before)

`start`/`end` let a reader map perf_counter or monotonic stamps from other tools to wall time and
see whether the wall clock was stepped during the run (the three differences should agree).
"""

from __future__ import annotations

import os
import platform
import socket
import time
from typing import Any

from traceq.collectors.config import CollectorConfig

RUN_METADATA_VERSION = 1
CLOCK_RULE = "wall_ns = trace_ts_ns + offset_ns; trace_ts_ns = ts_us * 1000"
WALL_CLOCK = "time.time_ns(): CLOCK_REALTIME, ns since the Unix epoch (also the power log's wall_ns)"

def sample_clocks() -> dict[str, int]:
    """The three Python clocks read back to back, in ns."""
    return {"time_ns": time.time_ns(), "perf_counter_ns": time.perf_counter_ns(), "monotonic_ns": time.monotonic_ns()}


def detect_rank(torch: Any) -> dict[str, Any]:
    """Rank, local rank and world size from torch.distributed, else RANK/WORLD_SIZE/LOCAL_RANK, else 0/1."""
    local_world = _env_int("LOCAL_WORLD_SIZE")
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        rank, world, source = dist.get_rank(), dist.get_world_size(), "torch.distributed"
        backend = str(dist.get_backend())
    elif _env_int("RANK") is not None and _env_int("WORLD_SIZE") is not None:
        rank, world, source, backend = _env_int("RANK"), _env_int("WORLD_SIZE"), "env", None
    else:
        rank, world, source, backend = 0, 1, "default", None
    local_rank = _env_int("LOCAL_RANK")
    if local_rank is None:
        local_rank = rank % local_world if local_world else (rank if world == 1 else 0)
    return {"rank": rank, "local_rank": local_rank, "world_size": world, "local_world_size": local_world,
            "rank_source": source, "backend": backend}


def describe_device(torch: Any, peak_override: float | None) -> dict[str, Any]:
    """Device kind, GPU model, the peak TFLOPS the user gave (else null) and the torch / CUDA / NCCL versions."""
    info: dict[str, Any] = {"device_type": "cpu", "gpu_model": None, "gpu_uuid": None}
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        info["device_type"] = "cuda"
        info["gpu_model"] = torch.cuda.get_device_name(index)
        try:
            info["gpu_uuid"] = str(torch.cuda.get_device_properties(index).uuid)
        except Exception:
            pass
    # traceq's reports take the peak of gpu_model from their table (sql/gpu_peaks.csv), unless one is given
    info["peak_tflops"] = peak_override
    info["peak_tflops_source"] = "user" if peak_override is not None else None
    info["torch_version"] = str(torch.__version__)
    info["cuda_version"] = torch.version.cuda
    info["nccl_version"] = None
    if info["device_type"] == "cuda":
        try:
            version = torch.cuda.nccl.version()
            info["nccl_version"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:
            pass
    info["python_version"] = platform.python_version()
    return info


def build_run_metadata(config: CollectorConfig, ranks: dict[str, Any], device: dict[str, Any],
                       start_clocks: dict[str, int], power_file: str | None) -> dict[str, Any]:
    """The run.json object as written at start (`complete` false, no trace file yet)."""
    world = ranks["world_size"]
    gpus_per_node = config.gpus_per_node or ranks["local_world_size"]
    nodes = config.nodes or _env_int("GROUP_WORLD_SIZE")
    if nodes is None and gpus_per_node and world % gpus_per_node == 0:
        nodes = world // gpus_per_node
    if gpus_per_node is None and nodes and world % nodes == 0:
        gpus_per_node = world // nodes
    model_parallel = config.tp * config.pp * config.cp
    dp = config.dp if config.dp is not None else (world // model_parallel if world % model_parallel == 0 else None)
    return {
        "traceq_run_metadata": RUN_METADATA_VERSION,
        "complete": False,
        "run": config.run,
        "rank": ranks["rank"],
        "local_rank": ranks["local_rank"],
        "world_size": world,
        "rank_source": ranks["rank_source"],
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "backend": ranks["backend"],
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "tp": config.tp,
        "pp": config.pp,
        "cp": config.cp,
        "dp": dp,
        "tokens_per_step": config.tokens_per_step,
        "global_batch_size": config.global_batch_size,
        "micro_batch_size": config.micro_batch_size,
        "model": config.model,
        "n_params_non_embedding": config.n_params_non_embedding,
        "n_layers": config.n_layers,
        "n_heads": config.n_heads,
        "head_dim": config.head_dim,
        "seq_len": config.seq_len,
        "flops_per_step": config.flops_per_step,
        **{k: v for k, v in device.items() if k != "gpu_uuid"},
        "warmup_steps": config.warmup_steps,
        "profiled_steps": config.active,
        "first_profiled_step": config.wait + config.warmup,
        "schedule": {"wait": config.wait, "warmup": config.warmup, "active": config.active, "repeat": config.repeat},
        "steps_seen": 0,
        "trace_file": None,
        "trace_files": [],
        "power_file": power_file,
        "clock": {
            "rule": CLOCK_RULE,
            "offset_ns": None,
            "offset_source": "baseTimeNanoseconds",
            "wall_clock": WALL_CLOCK,
            "start": start_clocks,
            "end": None,
        },
        "errors": [],
        "extra": config.extra,
    }


def check_degrees(config: CollectorConfig, world_size: int) -> str | None:
    """A message naming the fix when tp*pp*cp*dp cannot make `world_size`, else None."""
    model_parallel = config.tp * config.pp * config.cp
    if config.dp is not None and model_parallel * config.dp != world_size:
        return (f"tp*pp*cp*dp = {config.tp}*{config.pp}*{config.cp}*{config.dp} = {model_parallel * config.dp} "
                f"but world_size is {world_size}; fix the degrees or leave dp=None to derive it")
    if world_size % model_parallel:
        return (f"tp*pp*cp = {model_parallel} does not divide world_size {world_size}; "
                "fix tp/pp/cp for this launch")
    return None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None

