"""The GPU peak table (``sql/gpu_peaks.csv``): each GPU's dense BF16 peak with its source, looked up by a
device name as a trace gives it or by a GPU name as a user gives it (``runs set --gpu-model``).

A leaf module, beside :mod:`traceq.catalog`: the standard library and the data file only.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache

from traceq.catalog import data_text


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


_VENDOR = re.compile(r"^\s*(nvidia|amd(\s+instinct)?)\s+", re.IGNORECASE)


def peak_candidates(gpu_model: str) -> tuple[GpuPeak, ...]:
    """The peak table's rows a GPU name a user gives could mean (``runs set --gpu-model``): the row it
    names ('H100 SXM', 'NVIDIA H100 PCIe'); else, where it names a family whose members' peaks
    differ, every member ('H100': H100 NVL 835, H100 PCIe 756, H100 SXM 989); else the row
    :func:`peak_for` matches (a device name as torch gives it, 'NVIDIA H100 80GB HBM3'); () for a GPU
    the table does not know. More than one row: the name alone gives no peak."""
    bare = _VENDOR.sub("", gpu_model).strip()
    named = [p for p in gpu_peaks() if p.gpu.casefold() == bare.casefold()]
    if named:
        return (named[0],)
    word = re.compile(rf"(?<![\w-]){re.escape(bare)}(?![\w-])", re.IGNORECASE) if bare else None
    family = tuple(p for p in gpu_peaks() if word and word.search(p.gpu))
    if len({p.peak_tflops for p in family}) > 1:
        return family
    peak = peak_for(gpu_model)
    return (peak,) if peak else ()
