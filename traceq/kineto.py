"""What values in a Kineto trace mean, for both readers (:mod:`traceq.ingest.decode`, :mod:`traceq.ingest.native`).

Kept apart from :mod:`traceq.ingest.decode` so that the fast path, which never decodes an event in Python,
imports neither numpy nor pyarrow (70 ms of an ingest's start-up).
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

INT64_MAX = 2**63 - 1


def to_int(value: Any) -> int | None:
    """An int64 from a JSON scalar (int, integral float, decimal string, "stream 7"), else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -INT64_MAX - 1 <= value <= INT64_MAX else None
    if isinstance(value, (float, Decimal)):
        if not math.isfinite(value) or value != int(value):
            return None
        return to_int(int(value))
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("stream "):
            text = text[7:]
        try:
            return to_int(int(text, 0) if text.lower().startswith(("0x", "-0x")) else int(text))
        except ValueError:
            return None
    return None
