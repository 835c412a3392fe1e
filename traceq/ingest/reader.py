"""Stream a Kineto trace file as byte chunks of whole events, in bounded memory.

A trace is ``{"...": ..., "traceEvents": [ {event}, {event}, ... ], "...": ...}`` or, in the
oldest traces, a bare ``[ {event}, ... ]``. :func:`read_trace` decompresses as it goes, cuts the
event array into chunks of about ``chunk_bytes`` at event boundaries and returns the top-level
metadata (everything but the event array) once the file has been read.

A cut is placed after a ``}`` that is followed by ``,`` and ``{`` (whitespace allowed) and is
verified with msgspec's skip-only decoder (about 1 GB/s), so a ``}, {`` inside a string or a nested
value can never split an event. The end of the event array is the last ``]`` that closes a valid
array and is followed by what may follow it (:func:`_array_end`: msgspec's decode succeeding or
not, never its message).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from traceq.errors import TraceFormatError

try:  # ISA-L inflates 3-4 times as fast as zlib: a .json.gz ingest takes ~10 % less (BENCHMARKS.md)
    from isal.igzip import IGzipFile as _GzipFile
    from isal.isal_zlib import error as _InflateError
except ImportError:  # a platform without its wheels: the standard library's
    _GzipFile, _InflateError = gzip.GzipFile, zlib.error
from traceq.ingest.chunks import Chunk, FileRange, Pieces
from traceq.ingest.ending import decodes, malformed, not_json, parse_header, split_tail, truncated
from traceq.ingest.jsonfault import fault_of, replace_lone_surrogates, utf8_lenient

CHUNK_BYTES = 8 << 20
_READ_BYTES = 1 << 20
_UNVERIFIED_WINDOW = 64 << 10  # where the last boundary is looked for first
_SPLIT = re.compile(rb"\}\s*,\s*(?=\{)")
# msgspec's DecodeError says where and why only in its words: where a document it refused goes wrong
# (the byte of a syntax error, a cut inside a string, the end of a value followed by more) comes from
# traceq.ingest.jsonfault instead, on error paths only; the end of the event array is found by
# decoding alone (traceq.ingest.ending).
_RAW = msgspec.json.Decoder(msgspec.Raw)
_LENIENT_FLOATS = msgspec.json.Decoder(float_hook=float)
_KEY = b'"traceEvents"'
# Bytes read without reaching what comes next (the event array, the first event, the next event
# boundary): past this the input is not a trace (a gzip of whitespace would otherwise be read to its
# end, gigabytes from a few MB). A real trace's largest event or header is far smaller.
MAX_SCAN_BYTES = 128 << 20
_BOUNDARY_OVERLAP = 4096  # a boundary '}, {' split across two reads is found if its whitespace is shorter


@dataclass
class TraceHeader:
    """Top-level fields of a trace other than ``traceEvents``.

    ``leading`` holds those written before the event array (Kineto writes ``distributedInfo`` there)
    and is known as soon as :func:`read_trace` returns; ``fields`` holds all of them once the last
    chunk has been read. ``lone_surrogates``: the lone surrogate escapes replaced by ``\\ufffd`` in the
    top-level fields before the events and in the events read in memory (:func:`_chunks`).
    """

    fields: dict[str, Any] = field(default_factory=dict)
    leading: dict[str, Any] = field(default_factory=dict)
    bare_array: bool = False
    lone_surrogates: int = 0


def open_raw(path: Path) -> BinaryIO:
    """``path`` opened for reading its bytes as stored; TraceFormatError naming it where it cannot be."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file; check the path or glob") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a directory; pass the trace files or the directory to ingest") from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot be read ({exc.strerror})") from None


def _open(path: Path) -> BinaryIO:
    raw = open_raw(path)
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return _GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _read(stream: BinaryIO, path: Path, size: int) -> bytes:
    try:
        return stream.read(size)
    except (EOFError, zlib.error, _InflateError, gzip.BadGzipFile) as exc:
        raise TraceFormatError(
            f"{path}: the gzip stream is truncated or corrupt ({exc}); re-copy the file or regenerate the trace"
        ) from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot be read ({exc})") from None


@contextmanager
def too_deep_is_not_json(path: Path) -> Iterator[None]:
    """A value nested deeper than msgspec reads (RecursionError) is a TraceFormatError naming ``path``."""
    try:
        yield
    except RecursionError:
        raise not_json(path, "values nested too deeply to read: 1,000 levels or more") from None


def _find_array_start(stream: BinaryIO, path: Path) -> tuple[bytes, bytes, bool, int]:
    """Read until the event array opens. Returns (prefix up to the key's colon, bytes after '[', bare,
    the offset in the file's JSON of the first byte after '[')."""
    buf = b""
    search_from = 0
    scanned = 0
    lead = 0  # bytes before the top-level value (a byte order mark, whitespace), dropped
    while True:
        more = raw = _read(stream, path, _READ_BYTES)
        if not scanned and more.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark (some Windows tools)
            more, lead, scanned = more[3:], 3, 3
        scanned += len(more)
        if not buf:  # leading whitespace is not kept
            stripped = more.lstrip()
            lead += len(more) - len(stripped)
            more = stripped
        buf += more
        if scanned > MAX_SCAN_BYTES:
            raise not_json(path, f'no "traceEvents" array in its first {MAX_SCAN_BYTES >> 20} MB')
        start = buf
        if not start and not raw:
            raise TraceFormatError(
                f"{path}: the file is empty; the profiler did not finish writing it or the copy failed: "
                "re-export or copy it again"
            )
        if start[:1] == b"[":
            return b"", start[1:], True, lead + 1
        if start and start[:1] != b"{":
            raise not_json(path, "it does not start with '{' or '['")
        while True:
            pos = buf.find(_KEY, search_from)
            if pos < 0:
                search_from = max(0, len(buf) - len(_KEY))
                break
            colon = re.compile(rb"\s*:\s*").match(buf, pos + len(_KEY))
            if colon is None or colon.end() >= len(buf):
                search_from = pos  # need more bytes to see what follows the key
                break
            prefix = buf[: colon.end()]
            if buf[colon.end() : colon.end() + 1] == b"[" and _is_top_level_key(prefix):
                return prefix, buf[colon.end() + 1 :], False, lead + colon.end() + 1
            search_from = pos + 1
        if not raw:
            raise not_json(path, 'no "traceEvents" array')


def _leading_fields(prefix: bytes) -> dict[str, Any]:
    """The top-level fields before the event array ({} for a bare array or when unreadable: the
    full header parse after the last chunk names any problem)."""
    if not prefix:
        return {}
    try:
        fields = utf8_lenient(_LENIENT_FLOATS.decode, prefix + b"null}")
    except (msgspec.DecodeError, UnicodeDecodeError):
        return {}
    return fields if isinstance(fields, dict) else {}


def _is_top_level_key(prefix: bytes) -> bool:
    try:
        _RAW.decode(replace_lone_surrogates(prefix)[0] + b"null}")  # msgspec refuses them; JSON allows them
        return True
    except msgspec.DecodeError:
        return False


def _cut(buf: bytes, path: Path, offset: int, verify: bool = True, search_from: int = 0) -> int:
    """Index just past the last verified event boundary in ``buf`` (0 if none).

    A candidate cut inside a string or a nested array fails as *truncated*; a syntax error before
    the cut fails as *malformed* at a byte inside the data, and is reported at once (otherwise the
    reader would buffer the rest of the file looking for a boundary that verifies). Unverified
    (``verify=False``), the cut is the last candidate: the caller must parse each chunk strictly
    (a wrong cut leaves both chunks invalid JSON) and read the file again verified if one fails.
    ``search_from``: where to start looking, when the bytes before it were searched already.
    """
    for window in ((CHUNK_BYTES // 4) if verify else _UNVERIFIED_WINDOW, len(buf)):
        candidates = [m.start() + 1 for m in _SPLIT.finditer(buf, max(search_from, len(buf) - window))]
        if candidates:
            break
    if not verify:
        return candidates[-1] if candidates else 0
    for end in reversed(candidates):
        if decodes(b"[" + buf[:end] + b"]"):
            return end
        fault = fault_of(b"[" + buf[:end] + b"]")
        if fault.kind == "malformed" and fault.at - 1 < end:  # not the ']' appended above
            raise malformed(path, buf, fault.at - 1, offset)
    return 0


def read_trace(path: Path, chunk_bytes: int = CHUNK_BYTES, verify: bool = True) -> tuple[TraceHeader, Iterator[bytes]]:
    """Open ``path`` and return its header (complete once the iterator is exhausted) and event chunks.

    Each chunk holds whole events separated by commas, without the enclosing brackets.
    Raises :class:`TraceFormatError` naming the file for anything that is not a readable trace.
    ``verify=False`` skips checking each cut (see :func:`_cut`).
    """
    stream, header, prefix, rest, offset = _open_events(path)
    return header, _chunks(stream, path, prefix, rest, header, chunk_bytes, verify, offset=offset)


def _open_events(path: Path) -> tuple[BinaryIO, TraceHeader, bytes, bytes, int]:
    """Open ``path`` and read up to its first event: (stream, header with the leading fields, the
    bytes before the event array, the bytes read after its '[' (less whitespace dropped), the offset
    of the first of them in the file's JSON)."""
    stream = _open(path)
    header = TraceHeader()
    try:
        with too_deep_is_not_json(path):
            prefix, rest, header.bare_array, start = _find_array_start(stream, path)
            prefix = _without_lone_surrogates(prefix, header)  # the top-level fields before the events, too
            header.leading = _leading_fields(prefix)
            rest, skipped = _first_event(stream, path, rest)
    except BaseException:
        stream.close()
        raise
    return stream, header, prefix, rest, start + skipped


def read_trace_ranges(path: Path, chunk_bytes: int = CHUNK_BYTES) -> tuple[TraceHeader, Iterator[Chunk]]:
    """Like ``read_trace(path, chunk_bytes, verify=False)`` (the caller must parse each chunk strictly),
    without copying the events into Python where it can be helped: an uncompressed file yields
    :class:`FileRange` pieces (only the bytes around each cut are read), a compressed one
    :class:`Pieces` of what it inflates; the last chunk, which holds the end of the array, is bytes."""
    stream, header, prefix, rest, offset = _open_events(path)
    if isinstance(stream, gzip.GzipFile):
        return header, _inflated(stream, path, prefix, rest, header, chunk_bytes, offset)
    start = stream.tell() - len(rest)  # file offset of rest[0]
    return header, _ranges(stream, path, prefix, start, header, chunk_bytes)


def _ranges(
    stream: BinaryIO, path: Path, prefix: bytes, start: int, header: TraceHeader, chunk_bytes: int
) -> Iterator[bytes | FileRange]:
    with stream:
        fd = stream.fileno()
        size = os.fstat(fd).st_size
        span = min(_UNVERIFIED_WINDOW, chunk_bytes)  # a cut is looked for in the last `span` bytes of a chunk
        stream.seek(start)  # the file position shows how far the reader is (e.g. in /proc/PID/fdinfo)
        while size - start > chunk_bytes + span:
            base = start + chunk_bytes - span
            try:
                window = os.pread(fd, span, base)
            except OSError as exc:
                raise TraceFormatError(f"{path}: cannot be read ({exc.strerror})") from None
            last = None
            for last in _SPLIT.finditer(window):
                pass
            if last is None:  # one event spans the window: cut the rest in memory
                break
            yield FileRange(fd, start, base + last.start() + 1 - start, path)
            start = base + last.end()
            stream.seek(start)
        yield from _chunks(stream, path, prefix, b"", header, chunk_bytes, verify=False, offset=start)


def _inflated(
    stream: BinaryIO, path: Path, prefix: bytes, rest: bytes, header: TraceHeader, chunk_bytes: int, offset: int,
) -> Iterator[bytes | Pieces]:
    """Unverified chunks of a compressed trace: the bytes left from the read before, and a read up to
    its last event boundary (looked for near its end first). From a read without one (an event larger
    than a read) or a short one (the end is near), the rest goes through :func:`_chunks`."""
    with stream:
        while True:
            # reads of one size: a read of another size each time cost twice the inflating
            more = _read(stream, path, chunk_bytes)
            last = None
            if len(more) == chunk_bytes:  # a full read: not near the end
                for start in (max(0, len(more) - _UNVERIFIED_WINDOW), 0):
                    for last in _SPLIT.finditer(more, start):
                        pass
                    if last is not None or start == 0:
                        break
            if last is None:
                yield from _chunks(stream, path, prefix, rest + more, header, chunk_bytes, verify=False, offset=offset)
                return
            chunk = Pieces((rest, memoryview(more)[:last.start() + 1]))
            offset += len(rest) + last.end()
            rest = more[last.end():]  # from the next event's '{'
            yield chunk


def _first_event(stream: BinaryIO, path: Path, rest: bytes) -> tuple[bytes, int]:
    """Check that the event array holds objects (or nothing), reading on until its first character.
    Returns the bytes from there and how many bytes of whitespace before them were dropped."""
    skipped = 0  # whitespace read and dropped (not kept: a gzip of whitespace would fill memory)
    while not rest.strip():
        more = _read(stream, path, _READ_BYTES)
        if not more:
            raise truncated(path, "the file ends right after the start of the event array")
        skipped += len(rest)
        if skipped > MAX_SCAN_BYTES:
            raise not_json(path, f"{skipped:,} bytes of whitespace and no event after the start of the event array")
        rest = more
    first = rest.lstrip()[:1]
    if first not in (b"{", b"]"):
        raise not_json(path, f"the event array starts with {first.decode('latin-1')!r}, not an event object '{{'")
    return rest, skipped


def _chunks(
    stream: BinaryIO, path: Path, prefix: bytes, rest: bytes, header: TraceHeader, chunk_bytes: int, verify: bool,
    offset: int,
) -> Iterator[bytes]:
    """Chunks of whole events from ``rest`` and the stream; ``offset``: where rest[0] is in the
    file's JSON (error messages name bytes by it). A lone surrogate escape (JSON allows it, msgspec and
    DuckDB do not) is replaced by ``\\ufffd``, of the same length, and counted in ``header``."""
    with stream, too_deep_is_not_json(path):
        eof = False
        searched = 0  # rest[:searched] holds no event boundary (an event larger than a chunk)
        while not eof:
            while len(rest) < chunk_bytes:
                more = _read(stream, path, max(_READ_BYTES, chunk_bytes - len(rest)))
                if not more:
                    eof = True
                    break
                rest += more
            if eof:
                break
            rest = _without_lone_surrogates(rest, header)
            end = _cut(rest, path, offset, verify, max(0, searched - _BOUNDARY_OVERLAP))
            if end == 0:  # one event larger than a chunk: read on, and look in what is new only
                searched = len(rest)
                if len(rest) > MAX_SCAN_BYTES:
                    raise not_json(path, f"no event boundary in {len(rest):,} bytes after byte {offset:,}: "
                                          f"an event over {MAX_SCAN_BYTES >> 20} MB")
                # doubling, so that the reads and copies are linear in all, up to just past the cap
                more = _read(stream, path, min(max(chunk_bytes, _READ_BYTES, len(rest)), MAX_SCAN_BYTES + 1 - len(rest)))
                if not more:
                    eof = True
                    break
                rest += more
                continue
            searched = 0
            chunk, after = rest[:end], rest[end:].lstrip().lstrip(b",").lstrip()
            offset += len(rest) - len(after)
            rest = after
            yield chunk
        events, tail = split_tail(_without_lone_surrogates(rest, header), path, offset)
        if events.strip():
            yield events
        header.fields = parse_header(prefix, tail, path, header.bare_array)


def _without_lone_surrogates(data: bytes, header: TraceHeader) -> bytes:
    """``data`` with its lone surrogate escapes replaced (:func:`traceq.ingest.jsonfault.replace_lone_surrogates`),
    counted in ``header``."""
    data, replaced = replace_lone_surrogates(data)
    header.lone_surrogates += replaced
    return data
