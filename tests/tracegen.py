"""Build small Kineto traces by hand, for given/expect tests whose answers are worked out by hand.

Times are given in integer nanoseconds and written as Kineto microseconds with three decimals.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def us(ns: int) -> float:
    """ns -> Kineto microseconds; exact for the small values used in tests."""
    return ns / 1000


@dataclass
class TraceBuilder:
    rank: int | None = 0
    pid: int = 100
    tid: int = 1
    events: list[dict[str, Any]] = field(default_factory=list)
    _corr: int = 1000

    def step(self, n: int, start_ns: int, end_ns: int, *, rank: int | None = None) -> None:
        self.events.append(self._span("user_annotation", f"ProfilerStep#{n}", start_ns, end_ns, rank))

    def kernel(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        stream: int = 7,
        launch_ns: int | None = None,
        device: int = 0,
        cat: str = "kernel",
        rank: int | None = None,
        **args: Any,
    ) -> None:
        """A GPU event; with launch_ns, also its cudaLaunchKernel runtime event (same correlation)."""
        self._corr += 1
        ev = {
            "ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream,
            "ts": us(start_ns), "dur": us(end_ns - start_ns),
            "args": {"device": device, "stream": stream, "correlation": self._corr, "External id": self._corr, **args},
        }
        if rank is not None:
            ev["args"]["rank"] = rank
        self.events.append(ev)
        if launch_ns is not None:
            launch = self._span("cuda_runtime", "cudaLaunchKernel", launch_ns, launch_ns + 1000, rank)
            launch["args"]["correlation"] = self._corr
            self.events.append(launch)

    def _span(self, cat: str, name: str, start_ns: int, end_ns: int, rank: int | None) -> dict[str, Any]:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid,
              "ts": us(start_ns), "dur": us(end_ns - start_ns), "args": {}}
        if rank is not None:
            ev["args"]["rank"] = rank
        return ev

    def document(self, **top: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"schemaVersion": 1}
        if self.rank is not None:
            doc["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": 2}
        doc["traceEvents"] = self.events
        doc.update(top)
        return doc

    def write(self, path: Path, **top: Any) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(self.document(**top)).encode()
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path
