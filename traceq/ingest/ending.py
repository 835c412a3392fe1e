"""Where a trace's event array ends, what follows it (the rest of the top-level object) and the errors
that name what is wrong with a trace's JSON: for :mod:`traceq.ingest.reader`. The end is found by
decoding alone (:func:`split_tail`); msgspec's messages are never read: where a document it refused goes
wrong comes from :mod:`traceq.ingest.jsonfault`, on error paths only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from traceq.errors import TraceFormatError
from traceq.ingest.jsonfault import fault_of, utf8_lenient

# ']' looked at from the end, and full decodes tried, before _array_end leaves a tail to
# _array_end_reported: Kineto writes a few scalar fields after the event array.
_TAIL_BRACKETS = 64
_TAIL_DECODES = 4
_RAW = msgspec.json.Decoder(msgspec.Raw)
_LENIENT_FLOATS = msgspec.json.Decoder(float_hook=float)


def not_json(path: Path, detail: str) -> TraceFormatError:
    return TraceFormatError(f"{path}: not a Kineto trace ({detail}); expected a JSON object with a \"traceEvents\" array")


def decodes(data: bytes) -> bool:
    try:
        _RAW.decode(data)
    except msgspec.DecodeError:
        return False
    return True


def _may_follow_array(after: bytes) -> bool:
    """Whether ``after`` can follow the event array: nothing (a bare array), ``}`` or ``, "key":
    value ... }`` (the rest of the top-level object)."""
    after = after.strip()
    return after in (b"", b"}") or (after[:1] == b"," and decodes(b"{" + after[1:]))


def _array_end(data: bytes) -> int | None:
    """The index just past the ``]`` that closes the array ``data`` opens, found by decoding (the
    last ``]`` after which the top-level object can end and before which the array is valid); None
    when none of the last few is (a malformed or truncated end, or an odd tail: see
    :func:`array_end_reported`)."""
    pos, tried = len(data), 0
    for _ in range(_TAIL_BRACKETS):
        close = data.rfind(b"]", 0, pos)
        if close < 0:
            return None
        pos = close
        if _may_follow_array(data[close + 1 :]):
            if decodes(data[: close + 1]):
                return close + 1
            tried += 1
            if tried == _TAIL_DECODES:
                return None
    return None


def array_end_reported(data: bytes, path: Path, offset: int) -> int:
    """The end of the array ``data`` opens, read by :func:`~traceq.ingest.jsonfault.fault_of` (a value
    followed by more: garbage after the trace, a long tail), else the TraceFormatError that says what is
    wrong."""
    fault = fault_of(data)
    if fault.kind in ("valid", "trailing"):
        return fault.at
    if fault.kind == "malformed":
        raise malformed(path, data[1:], fault.at - 1, offset)
    raise truncated(path, f"the file ends inside the event array, after about {offset + len(data) - 1:,} bytes")


def split_tail(rest: bytes, path: Path, offset: int) -> tuple[bytes, bytes]:
    """Split the final bytes into (last events, what follows the array's closing bracket)."""
    data = b"[" + rest
    close = _array_end(data)
    if close is None:
        close = array_end_reported(data, path, offset)
    array = data[:close].rstrip()
    return array[1:-1], data[close:]


def truncated(path: Path, detail: str) -> TraceFormatError:
    return TraceFormatError(
        f"{path}: truncated trace ({detail}); the job or the copy stopped while writing it: copy it again or re-export it"
    )


def malformed(path: Path, buf: bytes, index: int, offset: int) -> TraceFormatError:
    near = buf[max(0, index - 20) : index + 20].decode("utf-8", "replace")
    hint = ""
    if buf[index : index + 3] in (b"NaN", b"Inf") or buf[index : index + 4] == b"-Inf":
        hint = " (NaN and Infinity are not JSON: write null or a number)"
    return TraceFormatError(
        f"{path}: invalid JSON in the event array near byte {offset + index:,}: {near!r}{hint}; "
        "fix or regenerate the file (a Kineto trace is plain JSON)"
    )


def parse_header(prefix: bytes, tail: bytes, path: Path, bare: bool) -> dict[str, Any]:
    if bare:
        if tail.strip():
            raise not_json(path, "unexpected data after the event array")
        return {}
    whole = prefix + b"null" + tail
    try:
        try:
            fields = utf8_lenient(msgspec.json.decode, whole)  # bytes not UTF-8 read as U+FFFD, as in events
        except msgspec.ValidationError:  # a number beyond float64 (1e999): read it as inf
            fields = utf8_lenient(_LENIENT_FLOATS.decode, whole)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        if fault_of(whole).kind == "truncated":  # cut short, wherever inside it
            raise truncated(path, "the file ends after the event array, inside the top-level object") from None
        raise not_json(path, f"the top-level object around the event array is malformed: {exc}") from None
    fields.pop("traceEvents", None)
    return fields
