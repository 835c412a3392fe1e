"""Where JSON goes wrong, told without reading any library's words: traceq.ingest.jsonfault.fault_of
against msgspec's verdict (does it decode) on random documents and their mutations, against documents
cut short by hand, and the reader's use of it at the end of the event array."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import traceq.ingest.ending as ending
from traceq.errors import TraceFormatError
from traceq.ingest.jsonfault import Fault, fault_of

PROPERTY = settings(max_examples=300, deadline=None)
_RAW = msgspec.json.Decoder(msgspec.Raw)

values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _msgspec_decodes(data: bytes) -> bool:
    try:
        _RAW.decode(data)
    except msgspec.DecodeError:
        return False
    return True


@pytest.mark.parametrize(("doc", "fault"), [
    (b'[{"a": 1}, {"a": NaN}]', Fault("malformed", 17)),   # the N
    (b'[{"a": "NaN"}, Infinity]', Fault("malformed", 15)),  # a constant, not the string
    (b'[{"ts": NaN,  4458}]', Fault("malformed", 8)),        # the constant, not what is wrong after it
    (b'[{"a": x}]', Fault("malformed", 7)),
    (b'[1,]', Fault("malformed", 3)),
    (b'[1 2]', Fault("malformed", 3)),
    (b'{"a" "b"}', Fault("malformed", 5)),                 # a closed string where ':' belongs
    (b'["a\\q"]', Fault("malformed", 3)),                  # the backslash of a bad escape
    (b'["\xff"]', Fault("valid", 5)),                       # not UTF-8, inside a string: as msgspec reads it
    (b'[\xff]', Fault("malformed", 1)),                      # not UTF-8 where a value belongs
    (b'["\xc3\xa9", x]', Fault("malformed", 7)),           # bytes, not characters: the e-acute is 2
    (b'[-Inf', Fault("malformed", 1)),                     # no JSON value starts so
    (b'[{"a": 1}] , "b": 2}', Fault("trailing", 10)),      # just past the ']'
    (b'  [1]  ', Fault("valid", 7)),
    (b'[{"a": 1}, {"a": "x', Fault("truncated", 19)),
    (b'[1.', Fault("truncated", 3)), (b'[1.5e+', Fault("truncated", 6)), (b'[-', Fault("truncated", 2)),
    (b'[nul', Fault("truncated", 4)), (b'["ab\\', Fault("truncated", 5)), (b'["ab\\u12', Fault("truncated", 8)),
    (b'{"a": [1, {"b": "H1', Fault("truncated", 19)),
])
def test_faults_by_hand(doc: bytes, fault: Fault) -> None:
    assert fault_of(doc) == fault
    assert _msgspec_decodes(doc) is (fault.kind == "valid")


@pytest.mark.slow
@PROPERTY
@given(st.lists(values, max_size=6))
def test_every_cut_of_a_valid_array_is_truncated_and_more_after_it_trails(items: list) -> None:
    doc = json.dumps(items, ensure_ascii=False).encode()
    assert fault_of(doc) == Fault("valid", len(doc))
    for k in range(1, len(doc)):
        assert fault_of(doc[:k]).kind == "truncated", doc[:k]
    assert fault_of(doc + b', "x": 1}') == Fault("trailing", len(doc))


@pytest.mark.slow
@PROPERTY
@given(st.lists(values, min_size=1, max_size=6), st.data())
def test_a_mutated_document_is_valid_exactly_when_msgspec_decodes_it(items: list, data: st.DataObject) -> None:
    doc = bytearray(json.dumps(items, ensure_ascii=data.draw(st.booleans())).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(doc) - 1))
        doc[at:at + 1] = data.draw(st.sampled_from([b"", b"x", b",", b"]", b"}", b'"', b"\\", b"NaN", b"\xff", b" "]))
        if not doc:
            return
    fault = fault_of(bytes(doc))
    assert (fault.kind == "valid") is _msgspec_decodes(bytes(doc)), (bytes(doc), fault)
    assert 0 <= fault.at <= len(doc)


@pytest.mark.parametrize(
    ("rest", "events", "tail"),
    [
        (b'{"a": 1}, {"b": [1]}]', b'{"a": 1}, {"b": [1]}', b""),  # a bare array
        (b'{"a": [1]}]\n}\n', b'{"a": [1]}', b"\n}\n"),
        (b'{"a": "]"}],\n "traceName": "x]", "n": [1, 2], "m": {"k": [3]}}', b'{"a": "]"}',
         b',\n "traceName": "x]", "n": [1, 2], "m": {"k": [3]}}'),
        (b'{"a": 1}  ]  ,"distributedInfo": {"rank": 3}}', b'{"a": 1}  ', b'  ,"distributedInfo": {"rank": 3}}'),
    ],
)
def test_the_end_of_the_event_array_is_found_without_reading_any_message(
    rest: bytes, events: bytes, tail: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ending, "array_end_reported", lambda *a: pytest.fail("looked for the fault"))
    assert ending.split_tail(rest, Path("t.json"), 0) == (events, tail)


def test_an_odd_end_is_told_by_the_message() -> None:
    """Garbage after the trace: the array's end is where fault_of says a value ends and more follows,
    and the header parse names the garbage; a truncated array and a syntax error in the last events are
    told apart by fault_of too."""
    assert ending.split_tail(b'{"a": 1}]}\x00garbage', Path("t.json"), 0) == (b'{"a": 1}', b"}\x00garbage")
    with pytest.raises(TraceFormatError, match="truncated trace"):
        ending.split_tail(b'{"a": 1}, {"b": "x', Path("t.json"), 0)
    with pytest.raises(TraceFormatError, match=r"invalid JSON in the event array near byte 116: .*NaN and Infinity"):
        ending.split_tail(b'{"a": 1}, {"b": NaN}]}', Path("t.json"), 100)


def test_a_top_level_object_cut_short_after_the_array_is_truncated_not_malformed() -> None:
    for tail in (b', "traceName": "x"', b', "traceName": "x', b', "traceName"', b', "traceName":', b",", b"",
                 b', "deviceProperties": [{"id": 0, "name": "H1'):  # inside a nested value: told by fault_of
        with pytest.raises(TraceFormatError, match="truncated trace"):
            ending.parse_header(b'{"schemaVersion": 1, "traceEvents": ', tail, Path("t.json"), False)
    with pytest.raises(TraceFormatError, match="malformed"):
        ending.parse_header(b'{"traceEvents": ', b', "x": 1} junk', Path("t.json"), False)
