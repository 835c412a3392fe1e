"""`PowerSampler`: NVML power and energy of the local GPUs, logged beside the trace as JSON lines.

File `<out_dir>/<run>/rank<r>.power.jsonl`, one JSON object per line, UTF-8. The sampler writes the
header when it starts, then records as it goes, flushing once per power interval (energy records of
step boundaries ride along with the next power round), so a crash of the training process loses at
most the last interval. (Flushed means handed to the OS: a crash of the machine may lose more.)

Line 1, the header (always present)::

    {"kind": "header", "traceq_power_log": 1, "source": "nvml" | "unavailable",
     "reason": null | "<why there are no numbers>", "interval_ms": 100.0,
     "gpus": [{"gpu": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-..."}],
     "clock": "wall_ns = time.time_ns() ...", "note": "NVML power is a ~1 s moving average ...",
     "start_wall_ns": 1795292205150434563, ...extra keys the caller passes (run, rank)}

With `"source": "unavailable"` (no pynvml, no driver, no device: this is what a CPU machine writes)
the header is the whole file: `gpus` is empty, `reason` says why, and no record follows. Numbers
are never invented.

Then, in time order (all times `wall_ns` = `time.time_ns()`, ns since the Unix epoch, the clock
that Kineto's `baseTimeNanoseconds` is on; see `traceq.collectors.trace` for the mapping):

- `{"kind": "power", "wall_ns": ..., "step": N, "gpu": 0, "power_w": 312.5}`: instantaneous power
  (nvmlDeviceGetPowerUsage, mW / 1000) sampled every `interval_ms`; `step` is the step in progress
  (the collector's counter: ProfilerStep#N of the trace).
- `{"kind": "energy", "wall_ns": ..., "step": N, "gpu": 0, "energy_mj": 123456789}`: the GPU's
  total energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the driver loaded; Volta and
  newer) read at the boundary where step N *starts*. The record with step N+1 closes step N, so the
  energy of step N is `energy_mj[N+1] - energy_mj[N]`. The collector marks step 0 when it starts and
  one past the last step when it exits. `wall_ns` is when the counter was read: the sampler thread
  reads it right after the boundary (typically well under a few ms later).
- `{"kind": "error", "wall_ns": ..., "step": N, "gpu": 0, "call": "nvmlDeviceGetPowerUsage",
  "error": "..."}`: an NVML call failed; at most `MAX_ERRORS_PER_CALL` of these per call and GPU.
  The value is missing for that sample, never replaced by a guess.
- `{"kind": "end", "wall_ns": ..., "step": N, "samples": 1234, "errors": 0}`: written by `stop()`
  (source "nvml" only); `samples` counts power rounds, `errors` failed calls (including those not
  logged). A file without it was cut short by a crash.

`gpu` is the NVML device index; the header maps it to the device name and UUID.

The seam for tests: `PowerSampler(path, nvml=fake)` takes any object with the pynvml functions used
here (nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetName,
nvmlDeviceGetUUID, nvmlDeviceGetPowerUsage, nvmlDeviceGetTotalEnergyConsumption). By default the
real `pynvml` module (package nvidia-ml-py) is imported when the sampler starts, and only then.

Nothing here raises into training: a failing NVML call becomes an error record, a failing start
becomes an "unavailable" header, and the sampler is a daemon thread that only wakes every interval
or at a step boundary.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from typing import Any, Sequence

POWER_LOG_VERSION = 1
MAX_ERRORS_PER_CALL = 10
NVML_NOTE = (
    "NVML power (nvmlDeviceGetPowerUsage) is a ~1 s moving average on A100/H100, and the sensor "
    "samples only part of the time, so short power spikes are smoothed out; energy (energy_mj, "
    "nvmlDeviceGetTotalEnergyConsumption) is a cumulative counter and the better source for joules "
    "per step. power_w in watts, energy_mj in millijoules, wall_ns in ns since the Unix epoch."
)
WALL_CLOCK = (
    "wall_ns = time.time_ns() (CLOCK_REALTIME, ns since the Unix epoch); Kineto trace time maps to it "
    "as wall_ns = ts_us * 1000 + baseTimeNanoseconds"
)

_STOP = object()


class PowerSampler:
    """Background NVML power sampler; write `rank<r>.power.jsonl`-format lines to `path`.

    Args:
        path: the JSON-lines file to create (its directory must exist).
        interval_ms: time between power samples, in milliseconds.
        nvml: the NVML binding; None imports `pynvml` lazily. Tests pass a fake.
        gpus: which devices to sample: NVML indices (int) or UUID strings (str, matched by suffix so
            torch's bare UUID finds NVML's "GPU-<uuid>"); None samples every NVML device.
        header: extra keys for the header line (e.g. run, rank).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        interval_ms: float = 100.0,
        nvml: Any = None,
        gpus: Sequence[int | str] | None = None,
        header: dict[str, Any] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.interval_ms = float(interval_ms)
        self.source = "unavailable"
        self.reason: str | None = None
        self._nvml = nvml
        self._wanted = None if gpus is None else list(gpus)
        self._header_extra = dict(header or {})
        self._handles: list[tuple[int, Any]] = []
        self._file: Any = None
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._step = 0
        self._samples = 0
        self._errors: dict[tuple[str, int], int] = {}
        self._broken = False
        self._initialised = False

    # ---------------------------------------------------------------- training-thread side

    def start(self) -> PowerSampler:
        """Open the log, write the header and start the sampling thread (if NVML works)."""
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed in stop)
        gpus: list[dict[str, Any]] = []
        try:
            gpus = self._open_nvml()
            self.source = "nvml"
        except Exception as exc:  # any failure means: no numbers, say why
            self.reason = _describe(exc)
            self._handles = []
            self._shutdown_nvml()
        self._write({
            "kind": "header",
            "traceq_power_log": POWER_LOG_VERSION,
            "source": self.source,
            "reason": self.reason,
            "interval_ms": self.interval_ms,
            "gpus": gpus,
            "clock": WALL_CLOCK,
            "note": NVML_NOTE,
            "start_wall_ns": time.time_ns(),
            **self._header_extra,
        })
        if self._handles:
            self._thread = threading.Thread(target=self._run, name="traceq-power", daemon=True)
            self._thread.start()
        return self

    def mark_step(self, step: int) -> None:
        """Note that step `step` starts now: the thread reads the energy counters right away."""
        self._step = step
        if self._thread is not None:
            self._queue.put(step)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, write the end record, close the log and NVML. Safe to call twice."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout_s)
            stuck = self._thread.is_alive()
            if stuck:  # hung in an NVML call: drop its writes, leave NVML to it, never block longer
                self._broken = True
                self._initialised = False
            self._thread = None
        if self._file is not None:
            if self.source == "nvml":
                self._write({
                    "kind": "end",
                    "wall_ns": time.time_ns(),
                    "step": self._step,
                    "samples": self._samples,
                    "errors": sum(self._errors.values()),
                })
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        self._shutdown_nvml()

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- NVML set-up

    def _open_nvml(self) -> list[dict[str, Any]]:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise RuntimeError(f"pynvml (package nvidia-ml-py) is not importable: {exc}") from None
            self._nvml = pynvml
        nvml = self._nvml
        nvml.nvmlInit()
        self._initialised = True
        count = int(nvml.nvmlDeviceGetCount())
        if count < 1:
            raise RuntimeError("NVML found no GPU on this node")
        infos = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            infos.append((index, handle, _text(nvml.nvmlDeviceGetName(handle)), _text(nvml.nvmlDeviceGetUUID(handle))))
        chosen = infos if self._wanted is None else [_find(infos, want) for want in self._wanted]
        self._handles = [(index, handle) for index, handle, _, _ in chosen]
        return [{"gpu": index, "name": name, "uuid": uuid} for index, _, name, uuid in chosen]

    def _shutdown_nvml(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    # ---------------------------------------------------------------- sampler thread

    def _run(self) -> None:
        interval_s = self.interval_ms / 1000.0
        due = time.monotonic()
        while not self._broken:
            try:
                item = self._queue.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                if item is None:
                    self._sample("nvmlDeviceGetPowerUsage", "power", "power_w", 1e-3)
                    self._samples += 1
                    self._flush()
                else:  # buffered until the next power round: one flush per interval, not per step
                    self._sample("nvmlDeviceGetTotalEnergyConsumption", "energy", "energy_mj", None, step=item)
            except Exception as exc:  # a bug here must not kill the thread or reach training
                self._write({"kind": "error", "wall_ns": time.time_ns(), "step": self._step, "gpu": None,
                             "call": "sampler", "error": _describe(exc)})
            if item is None:
                due = max(due + interval_s, time.monotonic())  # never burst to catch up after a stall

    def _sample(self, call: str, kind: str, field: str, scale: float | None, step: int | None = None) -> None:
        step = self._step if step is None else step
        lines = []
        for gpu, handle in self._handles:
            wall_ns = time.time_ns()
            try:
                raw = getattr(self._nvml, call)(handle)
                value = raw * scale if scale is not None else int(raw)
                lines.append({"kind": kind, "wall_ns": wall_ns, "step": step, "gpu": gpu, field: value})
            except Exception as exc:
                seen = self._errors.get((call, gpu), 0)
                self._errors[(call, gpu)] = seen + 1
                if seen < MAX_ERRORS_PER_CALL:
                    lines.append({"kind": "error", "wall_ns": wall_ns, "step": step, "gpu": gpu,
                                  "call": call, "error": _describe(exc)})
        for line in lines:
            self._write(line, flush=False)

    # ---------------------------------------------------------------- file

    def _write(self, record: dict[str, Any], flush: bool = True) -> None:
        if self._file is None or self._broken:
            return
        try:
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
            if flush:
                self._file.flush()
        except (OSError, ValueError):  # disk full, closed file: stop logging, never raise
            self._broken = True

    def _flush(self) -> None:
        try:
            if self._file is not None:
                self._file.flush()
        except (OSError, ValueError):
            self._broken = True


def _find(infos: list[tuple[int, Any, str, str]], want: int | str) -> tuple[int, Any, str, str]:
    for info in infos:
        if (isinstance(want, int) and info[0] == want) or (
            isinstance(want, str) and want and info[3].lower().endswith(want.lower())
        ):
            return info
    raise RuntimeError(f"NVML has no GPU {want!r}; it sees {[(i[0], i[3]) for i in infos]}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
