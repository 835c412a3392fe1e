"""How many device events a trace file holds, by role: what another reader's import of it (Perfetto's,
:mod:`traceq.perfetto.engine`) is checked against. A decode of two fields per event, nothing kept."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from traceq.catalog import event_categories
from traceq.ingest.jsonfault import utf8_lenient
from traceq.ingest.reader import read_trace


class _Head(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    ts: Any = None
    dur: Any = None


_DECODER = msgspec.json.Decoder(list[_Head])


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def count_device_events(path: Path) -> dict[str, int]:
    """The complete ("X") events of ``path`` whose category is a device role (kernel, memcpy, memset)
    and that traceq reads (ts and dur numbers, dur >= 0: :mod:`traceq.ingest.decode`), by role;
    TraceFormatError naming the file for anything that is not a trace."""
    roles = {cat: role for role in ("kernel", "memcpy", "memset") for cat in event_categories().cats(role)}
    counts: Counter[str] = Counter()
    _, chunks = read_trace(path)
    try:
        for chunk in chunks:
            for event in utf8_lenient(_DECODER.decode, b"[" + chunk + b"]"):
                if (event.ph == "X" and isinstance(event.cat, str) and event.cat in roles
                        and _number(event.ts) and _number(event.dur) and event.dur >= 0):
                    counts[roles[event.cat]] += 1
    finally:
        chunks.close()
    return dict(counts)
