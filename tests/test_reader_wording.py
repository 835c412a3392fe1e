"""The reader finds the end of the event array by decoding alone, and reads msgspec's messages only
for where a syntax error is: these tests fail the day msgspec words them otherwise (the version is
pinned in pyproject.toml for that reason)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

import traceq.ingest.reader as reader
from traceq.errors import TraceFormatError


def _error(doc: bytes) -> msgspec.DecodeError:
    with pytest.raises(msgspec.DecodeError) as info:
        msgspec.json.Decoder(msgspec.Raw).decode(doc)
    return info.value


def test_msgspec_words_its_errors_as_the_reader_reads_them() -> None:
    assert msgspec.__version__.startswith("0.22.")  # the pin in pyproject.toml; review the wording to move it
    assert str(_error(b'[{"a": 1}, {"a": NaN}]')) == "JSON is malformed: invalid character (byte 17)"
    assert reader.syntax_error_at(_error(b'[{"a": 1}, {"a": NaN}]')) == 17  # the N, counted from 0
    assert reader.syntax_error_at(_error(b'[{"a": 1}, {"a": "x')) is None  # cut short, not malformed
    assert str(_error(b'[{"a": 1}, {"a": "x')) == reader.MSGSPEC_TRUNCATED
    trailing = _error(b'[{"a": 1}] , "b": 2}')
    assert reader.syntax_error_at(trailing) is None
    assert re.fullmatch(reader.MSGSPEC_TRAILING, str(trailing))
    assert reader.MSGSPEC_TRAILING.search(str(trailing))[1] == "12"  # the comma, counted from 1


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
    monkeypatch.setattr(reader, "_array_end_reported", lambda *a: pytest.fail("read msgspec's message"))
    assert reader._split_tail(rest, Path("t.json"), 0) == (events, tail)


def test_an_odd_end_is_told_by_the_message() -> None:
    """Garbage after the trace: the array's end comes from msgspec's 'trailing characters' and the
    header parse names the garbage; a truncated array and a syntax error in the last events are told
    apart by the message too."""
    assert reader._split_tail(b'{"a": 1}]}\x00garbage', Path("t.json"), 0) == (b'{"a": 1}', b"}\x00garbage")
    with pytest.raises(TraceFormatError, match="truncated trace"):
        reader._split_tail(b'{"a": 1}, {"b": "x', Path("t.json"), 0)
    with pytest.raises(TraceFormatError, match=r"invalid JSON in the event array near byte 116: .*NaN and Infinity"):
        reader._split_tail(b'{"a": 1}, {"b": NaN}]}', Path("t.json"), 100)


def test_a_top_level_object_cut_short_after_the_array_is_truncated_not_malformed() -> None:
    for tail in (b', "traceName": "x"', b', "traceName": "x', b', "traceName"', b', "traceName":', b",", b"",
                 b', "deviceProperties": [{"id": 0, "name": "H1'):  # inside a nested value: told by the message
        with pytest.raises(TraceFormatError, match="truncated trace"):
            reader._parse_header(b'{"schemaVersion": 1, "traceEvents": ', tail, Path("t.json"), False)
    with pytest.raises(TraceFormatError, match="malformed"):
        reader._parse_header(b'{"traceEvents": ', b', "x": 1} junk', Path("t.json"), False)


def test_duckdb_words_an_interrupted_statement_as_ingest_reads_it() -> None:
    """SIGINT while a statement runs ends it with a bare RuntimeError that traceq.ingest.native
    .is_interrupt recognizes by its text: this fails the day DuckDB words it otherwise (ingest would
    then take Ctrl-C for an error of the files it was writing, and read them again one by one). In
    a process of its own, with Python's own SIGINT handler. DuckDB may notice the signal only when
    the statement ends (it did so in the full suite): the statement takes seconds, not forever."""
    import subprocess
    import sys

    script = """
import os, signal, threading, duckdb
from traceq.interrupts import is_interrupt
signal.signal(signal.SIGINT, signal.default_int_handler)
con = duckdb.connect()
for attempt in range(3):  # the signal may come before the statement starts, on a loaded machine: again
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        con.execute("select sum(range) from range(4000000000)").fetchall()  # about 3 s on 2 cores
        print("the statement ran to its end")
        break
    except KeyboardInterrupt:
        timer.join()
    except RuntimeError as exc:
        print("interrupt" if is_interrupt(exc) else repr(exc))
        break
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "interrupt", (done.stdout, done.stderr)
