"""Where JSON that a fast decoder refused goes wrong, from structured answers alone.

msgspec says that a document does not decode, but where and why only in the words of its message,
which change between versions. :func:`fault_of` asks the standard library instead, whose answers
are attributes (``UnicodeDecodeError.start``, ``JSONDecodeError.pos``, the end ``raw_decode``
returns): the first value's end when something follows it, the byte where it is malformed, or that
it is only cut short. It reads the document at the standard library's speed (about 100 MB/s), so it
runs only where a document has been refused: error paths and odd file ends.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from collections.abc import Callable
from typing import Literal, TypeVar

import msgspec

class _Constant(ValueError):
    """NaN or Infinity met: Python's json module reads them, JSON (and msgspec) does not."""


def _refuse(name: str) -> None:
    raise _Constant(name)


_DECODER = json.JSONDecoder(parse_constant=_refuse)
# a JSON string, or one of the constants Python's json module reads and JSON does not have
_STRING_OR_CONSTANT = re.compile(r'"(?:[^"\\]|\\.)*"|(NaN|-?Infinity)', re.DOTALL)
# the escapes of a string: a surrogate pair, a lone surrogate (group 1: JSON allows it, msgspec and
# UTF-8 do not), any other
_ESCAPES = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|\\.")
# what may complete a document cut inside its last token: a string (or an escape in it), a literal, a
# number; a document is cut short when one of them moves its first error to its end
_COMPLETIONS = ('"', 'n"', '0"', '00"', '000"', '0000"', '\\udc00"', "rue", "ue", "e", "alse", "lse", "se",
                "ull", "ll", "l", "0")


@dataclass(frozen=True)
class Fault:
    """What is wrong with a document: ``kind`` is

    - ``valid``: nothing (``at`` = its length);
    - ``trailing``: a whole value, then more (``at`` = the byte just past the value);
    - ``malformed``: not JSON from byte ``at`` (NaN and Infinity included: JSON has neither);
    - ``truncated``: a valid beginning that ends too early (``at`` = its length).
    """

    kind: Literal["valid", "trailing", "malformed", "truncated"]
    at: int


def fault_of(data: bytes) -> Fault:
    """What is wrong with the JSON document ``data`` (leading whitespace allowed), and at which byte."""
    # bytes that are not UTF-8 pass as they do for msgspec: inside a string, as its characters (kept
    # apart as lone surrogates, so that the byte offsets still count them one each); elsewhere, malformed
    text = data.decode("utf-8", "surrogateescape")
    start = len(text) - len(text.lstrip())
    try:
        _, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        if _cut_short(text, exc.pos):
            return Fault("truncated", len(data))
        return Fault("malformed", _byte(text, exc.pos))
    except _Constant:  # all before the first constant is JSON: the walk over strings finds it
        return Fault("malformed", _byte(text, _not_msgspec_json(text, start, len(text)) or start))
    wrong = _not_msgspec_json(text, start, end)
    if wrong is not None:
        return Fault("malformed", _byte(text, wrong))
    if text[end:].strip():
        return Fault("trailing", _byte(text, end))
    return Fault("valid", len(data))


def _not_msgspec_json(text: str, start: int, end: int) -> int | None:
    """Where the value at ``text[start:end]``, which the standard library read, holds what msgspec does
    not read: a NaN or Infinity, or a lone surrogate escape in a string (the first of them); else None."""
    for token in _STRING_OR_CONSTANT.finditer(text, start, end):
        if token.group(1):
            return token.start(1)
        lone = next((m for m in _ESCAPES.finditer(text, token.start(), token.end()) if m.group(1)), None)
        if lone is not None:
            return lone.start(1)
    return None


def _cut_short(text: str, pos: int) -> bool:
    """Whether the first error of ``text``, at ``pos``, is its end coming too early: nothing left after
    it, or a completion of the last token (a string, an escape, a literal, a number) moves the error to
    the end. Parsing is decided left to right, so no completion moves an error that is not the end's."""
    if not text[pos:].strip():
        return True
    for completion in _COMPLETIONS:
        longer = text + completion
        try:
            _DECODER.raw_decode(longer, len(longer) - len(longer.lstrip()))
        except json.JSONDecodeError as exc:
            if exc.pos >= len(longer):
                return True
            continue
        except _Constant:
            continue
        return True
    return False


def _byte(text: str, index: int) -> int:
    """The byte offset in the UTF-8 encoding of ``text`` of its character ``index``."""
    return len(text[:index].encode("utf-8", "surrogateescape"))


# the text of a surrogate escape (high: d800-dbff, low: dc00-dfff): one where its backslash is not escaped (_escape_at)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_HIGH = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_LOW = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
# what may begin a low surrogate escape: after a high one at the end of a buffer, the pair may be cut there
_LOW_BEGUN = re.compile(rb"(?:\\(?:u(?:[dD](?:[c-fC-F][0-9a-fA-F]{0,2})?)?)?)?\Z")
REPLACEMENT_ESCAPE = rb"\ufffd"  # U+FFFD, six bytes as a lone surrogate's escape is


def replace_lone_surrogates(data: bytes) -> tuple[bytes, int]:
    """``data`` (JSON that starts outside a string) with each lone surrogate escape (``\\ud800`` not
    followed by a low one, or a low one alone: JSON allows them, UTF-8, msgspec and DuckDB's reader do not)
    replaced by ``\\ufffd``, and how many were replaced. The length is kept, so byte offsets still hold;
    a surrogate pair and an escaped backslash before ``u`` are left as they are, and so is a high surrogate
    escape that only the end of ``data`` follows (with at most the beginning of a low one): a buffer read
    from a stream may cut a pair there, and the next read, scanned again, tells. Only the surrogate escapes
    are looked at, each by the bytes around it: 3.6 GB/s on a 91 MB trace, with or without a pair in each
    8 MB (one regex pairing every escape from the left read 70 MB/s once a buffer held one)."""
    lone: list[int] = []
    for match in _SURROGATE.finditer(data):
        at = match.start()
        if not _escape_at(data, at):
            continue
        if data[at + 3] in b"89abAB":
            paired = _LOW.match(data, at + 6) is not None or _LOW_BEGUN.match(data, at + 6) is not None
        else:
            paired = at >= 6 and _HIGH.match(data, at - 6) is not None and _escape_at(data, at - 6)
        if not paired:
            lone.append(at)
    if not lone:
        return data, 0
    parts: list[bytes] = []
    last = 0
    for at in lone:
        parts += [data[last:at], REPLACEMENT_ESCAPE]
        last = at + len(REPLACEMENT_ESCAPE)
    parts.append(data[last:])
    return b"".join(parts), len(lone)


def _escape_at(data: bytes, at: int) -> bool:
    """Whether the backslash at ``data[at]`` begins an escape: an even number of backslashes before it (in a
    document, backslashes stand only in strings, each escape's first escaping the next byte)."""
    before = at
    while before and data[before - 1] == 0x5C:
        before -= 1
    return (at - before) % 2 == 0


T = TypeVar("T")


def utf8_lenient(decode: Callable[[bytes], T], data: bytes) -> T:
    """``decode(data)``, where ``data`` holds bytes that are not UTF-8 with U+FFFD in their place.

    msgspec refuses them inside a string it decodes: with UnicodeDecodeError before 0.23, with a
    DecodeError from 0.23; so the bytes are asked, not the exception's type.
    """
    try:
        return decode(data)
    except (UnicodeDecodeError, msgspec.DecodeError):
        fixed = data.decode("utf-8", "replace").encode()
        if fixed == data:
            raise
        return decode(fixed)
