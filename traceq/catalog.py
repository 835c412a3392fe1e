"""What traceq knows before it reads a trace: event categories, step markers, GPU peaks.

A leaf module: it imports only the standard library, and reads the data files shipped beside the
SQL (``sql/event_categories.csv``, ``sql/gpu_peaks.csv``), so that ingest, the SQL and reports all
take these lists from one place.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from traceq.errors import ConfigError

# The step marker of PyTorch's profiler: ProfilerStep#N, numbered by N.
DEFAULT_STEP_MARKER = r"^ProfilerStep#(\d+)$"
# Step number of the one window of a rank whose trace has no step marker: its whole timeline.
WHOLE_TRACE_STEP = -1
ROLES = ("kernel", "memcpy", "memset", "runtime", "operator", "device_annotation")


def data_text(name: str) -> str:
    """The text of a data file shipped in ``traceq.sql``."""
    return files("traceq.sql").joinpath(name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class EventCategories:
    """Kineto event categories by what traceq does with them (``sql/event_categories.csv``).

    kernel / memcpy / memset: device activity (the ``kind`` of gpu_events: 1, 2, 3);
    runtime: the host-side calls whose correlation id links a launch to its device activity, and
    ``launch_patterns`` the names among them that put work on the device (a launch that has no
    device activity in the trace shows the trace was cut);
    operator: CPU operators, kept only for traces without device activity (and where they are a
    step marker or carry collective arguments);
    device_annotation: annotations the profiler copies onto the device timeline.
    """

    by_role: dict[str, tuple[str, ...]]
    launch_patterns: dict[str, str]

    def cats(self, role: str) -> tuple[str, ...]:
        return self.by_role.get(role, ())

    def gpu_kinds(self) -> dict[str, int]:
        """Category -> gpu_events.kind (1 kernel, 2 memcpy, 3 memset)."""
        return {cat: kind for kind, role in enumerate(("kernel", "memcpy", "memset"), start=1) for cat in self.cats(role)}

    def sql_params(self) -> dict[str, object]:
        """The lists as DuckDB parameters: $kernel_cats, $memcpy_cats, $memset_cats, $runtime_cats,
        $op_cats, $device_annotation_cats, and $launch_patterns (list of {cat, pattern})."""
        params: dict[str, object] = {
            f"{'op' if role == 'operator' else role}_cats": list(self.cats(role)) for role in ROLES
        }
        params["launch_patterns"] = [{"cat": c, "pattern": p} for c, p in sorted(self.launch_patterns.items())]
        return params


@cache
def event_categories() -> EventCategories:
    """The shipped ``sql/event_categories.csv``."""
    by_role: dict[str, list[str]] = {}
    patterns: dict[str, str] = {}
    for line, row in enumerate(csv.DictReader(data_text("event_categories.csv").splitlines()), start=2):
        role = row["role"]
        if role not in ROLES:
            raise ValueError(f"event_categories.csv:{line}: unknown role {role!r}")
        by_role.setdefault(role, []).append(row["cat"])
        if row.get("launch_pattern"):
            patterns[row["cat"]] = row["launch_pattern"]
    return EventCategories({role: tuple(cats) for role, cats in by_role.items()}, patterns)


@dataclass(frozen=True)
class StepMarker:
    """Which CPU annotations are training steps: a regular expression on event names.

    When the pattern has a group and it captures an integer, that integer numbers the step (spans of
    one number are one step); otherwise a rank's matching spans are its steps 1, 2, ... in time order.
    """

    pattern: str = DEFAULT_STEP_MARKER

    @classmethod
    def parse(cls, pattern: str | None) -> StepMarker:
        """A marker from user text (None: ``ProfilerStep#N``); ConfigError naming the problem."""
        if pattern is None:
            return cls()
        if not pattern.strip():
            raise ConfigError("--step-marker '': give a regular expression on step names, e.g. '^step\\[DECODE'")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"--step-marker {pattern!r}: not a regular expression ({exc})") from None
        return cls(pattern)

    @property
    def prefix(self) -> str:
        """The literal text every match starts with ('' if none is certain): a cheap first test."""
        m = re.match(r"\^((?:[^\\\[\](){}.*+?^$|]|\\[^A-Za-z0-9])*)", self.pattern)
        if not m or "|" in self.pattern:
            return ""
        text = re.sub(r"\\(.)", r"\1", m.group(1))
        # a quantifier after the literal applies to its last character
        rest = self.pattern[m.end():]
        return text[:-1] if rest[:1] in ("*", "?", "{") else text

    def sql_params(self) -> dict[str, object]:
        """$step_marker and $step_marker_prefix."""
        return {"step_marker": self.pattern, "step_marker_prefix": self.prefix}


@dataclass(frozen=True)
class GpuPeak:
    """One row of the peak table: a GPU, its dense BF16 peak and where the figure comes from."""

    pattern: str  # case-insensitive regular expression on the device name
    gpu: str
    peak_tflops: float
    source: str


@cache
def gpu_peaks() -> tuple[GpuPeak, ...]:
    """The shipped ``sql/gpu_peaks.csv``, in match order (first match wins)."""
    return tuple(
        GpuPeak(row["pattern"], row["gpu"], float(row["peak_tflops"]), row["source"])
        for row in csv.DictReader(line for line in data_text("gpu_peaks.csv").splitlines() if not line.startswith("#"))
    )


def peak_for(device_name: str | None) -> GpuPeak | None:
    """The peak table's row for a device name (e.g. 'NVIDIA H100 80GB HBM3'), or None if unknown."""
    if not device_name:
        return None
    for peak in gpu_peaks():
        if re.search(peak.pattern, device_name, re.IGNORECASE):
            return peak
    return None
