"""`TraceCollector`: wrap a training loop to record Kineto traces, NVML power and run metadata.

    from traceq.collectors import TraceCollector
    with TraceCollector(out_dir="runs", run="llama7b-32n-tp2", tokens_per_step=4_194_304, tp=2) as tc:
        for batch in loader:
            train_step(batch)
            tc.step()

Every rank writes `<out_dir>/<run>/rank<r>.{trace.json.gz,run.json,power.jsonl}` (see
`traceq.collectors.files`). The trace also carries a top-level key
`"traceq": {"run", "rank", "world_size", "run_file"}` so that it names its run without run.json. The profiler follows `CollectorConfig`'s schedule (default: 1 warm-up
step, then 60 recorded steps; reports skip the first 10 of those). CPU activity is always
recorded, CUDA when `torch.cuda.is_available()`.

Trace time to wall-clock time. Kineto (torch 2.13) stamps events on the Unix-epoch clock and writes
them relative to a base it stores in the trace header::

    wall_ns = trace_ts_ns + offset_ns,  trace_ts_ns = ts_us * 1000,  offset_ns = baseTimeNanoseconds

where `ts_us` is the event's `ts` (microseconds; a decimal with 3 fractional digits, so parse it
as a decimal string, not a double, to keep the last ns) and `baseTimeNanoseconds` is the trace's
top-level key (also copied to run.json `clock.offset_ns`). `wall_ns` is then on the same clock as
`time.time_ns()`, which stamps every power record. Traces without `baseTimeNanoseconds` (older
Kineto) carry epoch microseconds: offset_ns = 0. Evidence, torch 2.13.0+cpu, 15
`record_function` regions bracketed by `time.time_ns()` reads: every region's start and end mapped
this way fell inside its bracket (start 3.0-29 us after the read before entering, 3.1-56 us before
the read after entering; end 5.5-273 us after / 1.1-14 us before), with baseTimeNanoseconds =
1790857026000000000 and ts around 4.435e12 us. `clock.start` / `clock.end` in run.json also hold
perf_counter and monotonic readings taken with the wall clock, for tools stamped on those.

Safety: the collector never raises into training after it has started. A failed export or gzip
goes to run.json `errors` (and a RuntimeWarning); the power sampler is a daemon thread that logs its
own failures. Gzip runs on a background thread so the training step that ends a profiling window
pays only Kineto's own JSON export. Only misconfiguration raises, and only before training starts.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from traceq.collectors.config import CollectorConfig
from traceq.collectors.errors import CollectorConfigError, CollectorError
from traceq.collectors.files import (
    POWER_FILE,
    RUN_FILE,
    claim_rank_files,
    gzip_atomic,
    read_base_time_ns,
    trace_file_name,
    write_json_atomic,
)
from traceq.collectors.metadata import (
    build_run_metadata,
    check_degrees,
    describe_device,
    detect_rank,
    sample_clocks,
)
from traceq.collectors.power import PowerSampler


def import_torch() -> Any:
    """Import torch, or raise `CollectorError` saying how to install it."""
    try:
        import torch
        import torch.profiler  # noqa: F401 (submodule used below)
    except ImportError as exc:
        raise CollectorError(
            f"traceq.collectors.TraceCollector needs PyTorch, which cannot be imported here ({exc}); "
            "run it inside the training environment, or install it: pip install 'traceq[collectors]'"
        ) from None
    return torch


class TraceCollector:
    """Record a Kineto trace, run metadata and power of this rank; use as a context manager.

    Args:
        config: a `CollectorConfig`; or leave it out and pass its fields as keyword arguments
            (`TraceCollector(run="r1", out_dir="runs", tp=2)`).
        nvml: NVML binding for the power sampler (tests pass a fake); None loads pynvml lazily.
    """

    def __init__(self, config: CollectorConfig | None = None, *, nvml: Any = None, **options: Any) -> None:
        if config is None:
            config = CollectorConfig(**options)
        elif options:
            raise CollectorConfigError(f"pass either a CollectorConfig or keyword options, not both ({sorted(options)})")
        self.config = config
        self._torch = import_torch()
        self._nvml = nvml
        self.run_dir = Path(config.out_dir) / config.run
        self.rank: int | None = None
        self._step = 0
        self._cycle = 0
        self._prof: Any = None
        self._power: PowerSampler | None = None
        self._meta: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._gzips: list[threading.Thread] = []
        self._started = False

    # ------------------------------------------------------------------ public

    @property
    def step_num(self) -> int:
        """The step in progress: N of the ProfilerStep#N that the next `.step()` closes."""
        return self._step

    @property
    def run_file(self) -> Path:
        """Path of this rank's run.json (known once started)."""
        return self.run_dir / RUN_FILE.format(rank=self.rank)

    def start(self) -> TraceCollector:
        """Claim this rank's files, write the metadata, start the power sampler and the profiler."""
        if self._started:
            raise CollectorError("this TraceCollector was already started; create a new one per run")
        torch, config = self._torch, self.config
        ranks = detect_rank(torch)
        problem = check_degrees(config, ranks["world_size"])
        if problem:
            raise CollectorConfigError(problem)
        self.rank = rank = ranks["rank"]
        claim_rank_files(self.run_dir, rank, config.overwrite)
        self._started = True
        device = describe_device(torch, config.peak_tflops)
        power_name = POWER_FILE.format(rank=rank) if config.power else None
        self._meta = build_run_metadata(config, ranks, device, sample_clocks(), power_name)
        self._save()
        if power_name:
            self._start_power(power_name, device, ranks)
        try:
            self._prof = self._make_profiler(ranks)
            self._prof.__enter__()
        except BaseException:
            self._prof = None
            if self._power is not None:
                self._power.stop()
            raise
        return self

    def step(self) -> None:
        """Mark the end of one training step (call once per optimizer step, after it)."""
        if self._prof is None:
            raise CollectorError("TraceCollector.step() before start(): use `with TraceCollector(...) as tc:`")
        self._prof.step()
        self._step += 1
        if self._power is not None:
            self._power.mark_step(self._step)

    def stop(self) -> None:
        """Stop profiling, wait for the trace files, close the power log, finish run.json."""
        if not self._started or self._prof is None:
            return
        if self._power is not None:
            self._power.mark_step(self._step + 1)  # closes the step in progress
        try:
            self._prof.__exit__(None, None, None)
        except Exception as exc:  # the training already ran: keep what we have, say what failed
            self._note_error(f"profiler stop failed: {type(exc).__name__}: {exc}")
        self._prof = None
        for thread in self._gzips:
            thread.join()
        if self._power is not None:
            self._power.stop()
        with self._lock:
            self._meta["steps_seen"] = self._step
            self._meta["clock"]["end"] = sample_clocks()
            self._meta["complete"] = True
            self._save()

    def __enter__(self) -> TraceCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _make_profiler(self, ranks: dict[str, Any]) -> Any:
        torch, config = self._torch, self.config
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=config.wait, warmup=config.warmup, active=config.active, repeat=config.repeat
            ),
            on_trace_ready=self._on_trace_ready,
            record_shapes=config.record_shapes,
            with_stack=config.with_stack,
        )
        # Lets a trace file name its run and rank even when it travels without run.json.
        prof.preset_metadata_json("traceq", json.dumps({
            "run": config.run, "rank": ranks["rank"], "world_size": ranks["world_size"],
            "run_file": RUN_FILE.format(rank=ranks["rank"]),
        }))
        return prof

    def _start_power(self, power_name: str, device: dict[str, Any], ranks: dict[str, Any]) -> None:
        config = self.config
        gpus: list[int | str] | None = None
        if config.power_gpus == "own" and device.get("gpu_uuid"):
            gpus = [device["gpu_uuid"]]
        sampler = PowerSampler(
            self.run_dir / power_name,
            interval_ms=config.power_interval_ms,
            nvml=self._nvml,
            gpus=gpus,
            header={"run": config.run, "rank": ranks["rank"], "local_rank": ranks["local_rank"]},
        )
        try:
            sampler.start()
            sampler.mark_step(0)
            self._power = sampler
        except Exception as exc:  # cannot even write the log: train on without power
            self._note_error(f"power sampler failed to start: {type(exc).__name__}: {exc}")

    def _on_trace_ready(self, prof: Any) -> None:
        """torch.profiler callback: export JSON now, gzip and rename on a background thread."""
        cycle, self._cycle = self._cycle, self._cycle + 1
        name = trace_file_name(self.rank, cycle)
        # Kineto writes the export path into the trace ("traceName"): keep its base name meaningful.
        raw = self.run_dir / f".tmp.{name}.{os.getpid()}" / name.removesuffix(".gz")
        try:
            raw.parent.mkdir(exist_ok=True)
            prof.export_chrome_trace(str(raw))
            base_ns = read_base_time_ns(raw)
        except Exception as exc:
            self._note_error(f"{name}: export failed: {type(exc).__name__}: {exc}")
            return
        thread = threading.Thread(target=self._finish_trace, args=(raw, name, cycle, base_ns),
                                  name="traceq-gzip", daemon=False)
        thread.start()
        self._gzips.append(thread)

    def _finish_trace(self, raw: Path, name: str, cycle: int, base_ns: int | None) -> None:
        try:
            gzip_atomic(raw, self.run_dir / name)
            raw.parent.rmdir()
        except Exception as exc:
            self._note_error(f"{name}: gzip failed: {type(exc).__name__}: {exc}; raw JSON left at {raw}")
            return
        with self._lock:
            self._meta["trace_files"].append({"file": name, "cycle": cycle, "offset_ns": base_ns})
            self._meta["trace_files"].sort(key=lambda entry: entry["cycle"])
            if cycle == 0:
                self._meta["trace_file"] = name
                self._meta["clock"]["offset_ns"] = base_ns
            self._save()

    def _note_error(self, message: str) -> None:
        warnings.warn(f"traceq collector, {self.run_dir}: {message}", RuntimeWarning, stacklevel=2)
        with self._lock:
            self._meta.setdefault("errors", []).append(message)
            self._save()

    def _save(self) -> None:
        try:
            write_json_atomic(self.run_file, self._meta)
        except OSError as exc:
            warnings.warn(f"traceq collector: cannot write {self.run_file}: {exc}", RuntimeWarning, stacklevel=2)
