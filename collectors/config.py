"""`CollectorConfig`: every option of `TraceCollector`, checked once when it is built.

Two different warm-ups, on purpose with different names:

- `warmup` is torch.profiler's: steps where the profiler is switched on but records nothing, so that
  its start-up cost lands outside the trace.
- `warmup_steps` is the analysis protocol's: of the `active` steps that *are* recorded, reports skip
  the first `warmup_steps` (caches, allocator and communicator set-up). The study behind traceq
  measures steps 11-60 of 60; the default records 61 and skips 10, since the last recorded step's
  device window is open (nothing after it closes it) and reports leave it out: steps 11-60 are then
  all closed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from traceq.collectors.errors import CollectorConfigError

POWER_GPUS = ("own", "all")

# A run name becomes a directory name shared by every rank: keep it to one portable path segment.
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=@-]*$")


@dataclass
class CollectorConfig:
    """Options of one `TraceCollector`; invalid values raise `CollectorConfigError` at construction.

    Files land in `<out_dir>/<run>/rank<r>.*`. Profiler schedule (torch.profiler.schedule): `wait`
    idle steps, `warmup` steps with the profiler on but not recording, `active` recorded steps,
    `repeat` cycles (0 = cycle until the collector exits); `record_shapes` (on by default, as in
    torchtitan: it gives gloo collectives their message size) and `with_stack` as in torch.profiler.
    `warmup_steps`: how many of the recorded steps reports skip. Run description (written to run.json, never used to drive training):
    `tokens_per_step` (global tokens per optimizer step), parallel degrees `tp`, `pp`, `cp`, `dp`
    (dp defaults to world_size / (tp*pp*cp)), `nodes` and `gpus_per_node` (default: from torchrun's
    environment), model dimensions for the FLOPs convention 6N + 12*L*H*Q*T or `flops_per_step`,
    `peak_tflops` to override the GPU table. Power: `power` on/off, `power_interval_ms` between
    NVML samples, `power_gpus` "own" (the GPU this rank drives) or "all" (every NVML device of the
    node). `overwrite=True` replaces this rank's files of an earlier attempt of the same run.
    """

    run: str
    out_dir: str | os.PathLike[str] = "runs"
    # torch.profiler schedule
    wait: int = 0
    warmup: int = 1
    active: int = 61  # the study's 60 steps and one more, whose start closes the 60th's device window
    repeat: int = 1
    record_shapes: bool = True  # input shapes give gloo collectives their message size
    with_stack: bool = False
    # analysis protocol
    warmup_steps: int = 10
    # run description
    tokens_per_step: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    model: str | None = None
    n_params_non_embedding: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    head_dim: int | None = None
    seq_len: int | None = None
    flops_per_step: float | None = None
    peak_tflops: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # power
    power: bool = True
    power_interval_ms: float = 100.0
    power_gpus: str = "own"
    # files
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.run, str) or not _RUN_NAME.match(self.run) or self.run in (".", ".."):
            raise CollectorConfigError(
                f"run={self.run!r}: the run name becomes a directory shared by all ranks; use letters, "
                "digits and . _ - + = @ (no slashes or spaces), e.g. run='llama7b-32n-tp2'"
            )
        _check_int("wait", self.wait, 0, "0 starts profiling at the first step")
        _check_int("warmup", self.warmup, 0, "1 (the default) keeps the profiler's start-up cost out of the trace")
        _check_int("active", self.active, 1, "the profiler must record at least one step; the study uses 60 (61 recorded)")
        _check_int("repeat", self.repeat, 0, "1 records one window; 0 repeats until the collector exits")
        _check_int("warmup_steps", self.warmup_steps, 0, "the study skips 10 of its 60 steps")
        if self.warmup_steps >= self.active:
            raise CollectorConfigError(
                f"warmup_steps={self.warmup_steps} >= active={self.active}: reports would skip every recorded "
                f"step; set warmup_steps below active (e.g. active=60, warmup_steps=10)"
            )
        for name in ("tp", "pp", "cp"):
            _check_int(name, getattr(self, name), 1, "use 1 when that kind of parallelism is not used")
        for name in ("dp", "nodes", "gpus_per_node", "tokens_per_step", "global_batch_size",
                     "micro_batch_size", "n_params_non_embedding", "n_layers", "n_heads", "head_dim", "seq_len"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1, "leave it None when unknown")
        for name in ("flops_per_step", "peak_tflops"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise CollectorConfigError(f"{name}={value!r}: must be a positive number, or None when unknown")
        if (isinstance(self.power_interval_ms, bool) or not isinstance(self.power_interval_ms, (int, float))
                or not 1 <= self.power_interval_ms <= 60_000):
            raise CollectorConfigError(
                f"power_interval_ms={self.power_interval_ms!r}: must be between 1 and 60000 ms; the default "
                "100 ms matches how often NVML refreshes its power reading"
            )
        if self.power_gpus not in POWER_GPUS:
            raise CollectorConfigError(
                f"power_gpus={self.power_gpus!r}: use 'own' (the GPU this rank drives) or 'all' (every GPU "
                "of the node, for single-process multi-GPU jobs)"
            )
        try:
            json.dumps(self.extra, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CollectorConfigError(
                f"extra: {exc}; extra goes into run.json, so give plain JSON values (str, int, float, list, dict)"
            ) from None


def _check_int(name: str, value: Any, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CollectorConfigError(f"{name}={value!r}: must be an integer >= {minimum} ({hint})")
    if value < minimum:
        raise CollectorConfigError(f"{name}={value}: must be >= {minimum}; {hint}")
