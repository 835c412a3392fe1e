"""Reference: which kernels of a trace an optimizer step launched, straight from the trace JSON.

Written APART from traceq's SQL and rules: it reads one Kineto trace with the standard library only.
An optimizer step is a complete event (``ph == "X"``) on the CPU, not a ``gpu_user_annotation``, named
``Optimizer.step#<Class>.step``, ``Optimizer.step`` or ``optimizer.step``. A kernel (``cat`` kernel or
Kernel) is the optimizer's when a runtime call (``cat`` cuda_runtime, cuda_driver, Runtime or
mtia_runtime) with the same ``args.correlation`` starts inside such a span of the same ``pid`` and
``tid`` (and ``args.rank``, in files that merge ranks): ``ts <= launch ts < ts + dur``. Brute force:
every launch against every span of its thread. Times are compared as Decimal microseconds, as written.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

OPTIMIZER_STEP = re.compile(r"^[Oo]ptimizer\.step(#|$)")
RUNTIME = {"cuda_runtime", "cuda_driver", "Runtime", "mtia_runtime"}
KERNEL = {"kernel", "Kernel"}


def events(path: Path) -> list[dict]:
    raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    doc = json.loads(raw, parse_float=Decimal)
    return doc if isinstance(doc, list) else doc.get("traceEvents", [])


def optimizer_kernels(path: Path) -> tuple[list[dict], list[dict]]:
    """(every kernel event, the kernel events an optimizer step launched) of one single-rank trace."""
    evs = [e for e in events(path) if isinstance(e, dict) and e.get("ph") == "X"]
    spans: dict[tuple, list[tuple[Decimal, Decimal]]] = defaultdict(list)
    for e in evs:
        if e.get("cat") != "gpu_user_annotation" and OPTIMIZER_STEP.match(str(e.get("name", ""))):
            start = Decimal(e["ts"])
            spans[(_rank(e), e.get("pid"), e.get("tid"))].append((start, start + Decimal(e.get("dur", 0))))
    inside: set = set()
    for e in evs:
        if e.get("cat") in RUNTIME and (e.get("args") or {}).get("correlation") is not None:
            ts = Decimal(e["ts"])
            if any(lo <= ts < hi for lo, hi in spans.get((_rank(e), e.get("pid"), e.get("tid")), ())):
                inside.add((_rank(e), e["args"]["correlation"]))
    kernels = [e for e in evs if e.get("cat") in KERNEL]
    return kernels, [e for e in kernels if (_rank(e), (e.get("args") or {}).get("correlation")) in inside]


def _rank(e: dict):
    return (e.get("args") or {}).get("rank")


def optimizer_share(path: Path) -> float:
    """The optimizer's share of the trace's kernel time (0..1): Σ dur of its kernels / Σ dur of all."""
    kernels, launched = optimizer_kernels(path)
    total = sum(Decimal(e.get("dur") or 0) for e in kernels)
    return float(sum(Decimal(e.get("dur") or 0) for e in launched) / total) if total else 0.0


if __name__ == "__main__":
    import sys

    for arg in sys.argv[1:]:
        kernels, launched = optimizer_kernels(Path(arg))
        print(f"{arg}: {len(launched)} of {len(kernels)} kernels, {100 * optimizer_share(Path(arg)):.3f} % of kernel time")
