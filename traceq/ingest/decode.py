"""Decode one chunk of Kineto ``traceEvents`` into the rows DuckDB's JSON reader gives for it, as Arrow.

The reference reader: :mod:`traceq.ingest.native` is checked against it, and ingest falls back to it for
files DuckDB's JSON reader would read differently. Its rows are those of ``sql/read_events.sql``, which one
writer stores (:func:`traceq.ingest.native.write_parts`), whichever parser made them. It depends on msgspec,
numpy and pyarrow only.
A chunk is the bytes of a run of whole events (``{...}, {...}``) as cut by :mod:`traceq.ingest.reader`.
Only the fields traceq uses are decoded (msgspec Structs skip the rest at C speed).

Times: Kineto ``ts``/``dur`` are microseconds, written as integers (old traces) or with three
decimals (nanoseconds). A float64 holds every such value exactly enough to round back to the
nanosecond while ``|ts| < 2**43`` us; beyond that (epoch microseconds with a fraction) the chunk is
decoded again with exact decimal arithmetic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa

from traceq.catalog import StepMarker, event_categories
from traceq.ingest.jsonfault import utf8_lenient
from traceq.kineto import to_int

# Largest |ts| in microseconds for which float64 -> integer ns rounding is exact (ULP/2 < 0.5 ns).
_FLOAT_EXACT_LIMIT_US = float(2**43)

# Any, not int|str|None: one odd arg type in a real trace must not fail the whole chunk.
Scalar = Any


class Args(msgspec.Struct, gc=False):
    external_id: Scalar = msgspec.field(name="External id", default=None)
    external_id_2021: Scalar = msgspec.field(name="external id", default=None)
    correlation: Scalar = None
    device: Scalar = None
    stream: Scalar = None
    rank: Scalar = None
    collective: Scalar = msgspec.field(name="Collective name", default=None)
    pg_name: Scalar = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Scalar = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    group_size: Scalar = msgspec.field(name="Group size", default=None)
    in_nelems: Scalar = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Scalar = msgspec.field(name="Out msg nelems", default=None)
    dtype: Scalar = None
    seq: Scalar = msgspec.field(name="Seq", default=None)
    # metadata events (ph "M"): {"name": "pt_gloo_runloop"} / {"labels": "..."}
    meta_name: Scalar = msgspec.field(name="name", default=None)
    labels: Scalar = None


class Event(msgspec.Struct, gc=False):
    ph: Scalar = None
    cat: Scalar = None
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    ts: Scalar = None
    dur: Scalar = None
    args: Union[Args, None] = None


_FAST = msgspec.json.Decoder(list[Event])
_EXACT = msgspec.json.Decoder(list[Event], float_hook=Decimal)
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_ANY_EXACT = msgspec.json.Decoder(float_hook=Decimal)

GPU_KINDS = event_categories().gpu_kinds()
OP_CATS = frozenset(event_categories().cats("operator"))
# metadata events (ph "M") kept as trace_threads rows
META_KEYS = ("process_name", "thread_name", "process_labels")

# The columns of sql/read_events.sql's rows, in its order and with its types: the one relation the
# writer (sql/batch_*.sql, traceq.ingest.native.write_parts) reads, whichever parser made it.
ROWS_SCHEMA = pa.schema(
    [
        ("part", pa.int32()),
        ("file_no", pa.int32()),
        ("bound", pa.int64()),
        ("kind", pa.int32()),
        ("plain_op", pa.bool_()),
        ("meta", pa.bool_()),
        ("span", pa.bool_()),
        ("name", pa.string()),
        ("cat", pa.string()),
        ("rank", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("device", pa.int64()),
        ("stream", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("collective", pa.string()),
        ("pg_name", pa.string()),
        ("pg_desc", pa.string()),
        ("pg_ranks", pa.string()),
        ("group_size", pa.int64()),
        ("in_nelems", pa.int64()),
        ("out_nelems", pa.int64()),
        ("dtype", pa.string()),
        ("seq", pa.int64()),
        ("meta_value", pa.string()),
        ("unsure_file", pa.string()),
        ("valid", pa.bool_()),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("odd", pa.bool_()),
    ]
)
# false where a row does not set them (every other column is null there)
_FLAGS = frozenset(("plain_op", "meta", "span"))
_EMPTY = pa.py_buffer(b"")
# Collective args, filled only for the events that name a collective: (column, an int)
_COLLECTIVE_COLUMNS = (
    ("collective", False), ("pg_name", False), ("pg_desc", False), ("pg_ranks", False), ("group_size", True),
    ("in_nelems", True), ("out_nelems", True), ("dtype", False), ("seq", True),
)
# Times and durations beyond +-2**62 ns (146 years) are not real; rejecting them keeps
# start_ns + dur_ns inside int64 in every query.
_TIME_LIMIT_NS = 2**62


def _to_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def _time_ns(values: list[Any]) -> tuple[np.ndarray, np.ndarray, bool]:
    """Integer ns, a validity mask and whether float64 rounding made any value inexact, from
    Kineto microsecond values.

    Numbers (int, float, Decimal) within +-2**62 ns are valid; None, strings, booleans, lists and
    objects are not (the event is dropped and counted, not guessed at).
    """
    types = {type(v) for v in values}
    if types <= {float, int, type(None)}:
        us = np.array(values, dtype=np.float64)  # None -> nan
        valid = np.isfinite(us) & (np.abs(us) < _TIME_LIMIT_NS / 1000)
        us = np.where(valid, us, 0.0)
        whole = np.floor(us)
        # a float (JSON written with a fraction) this large may have lost its ns; ints are exact
        inexact = float in types and any(
            type(values[i]) is float for i in np.flatnonzero(np.abs(us) >= _FLOAT_EXACT_LIMIT_US)
        )
        ns = whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)
        return ns, valid, inexact
    out = np.zeros(len(values), dtype=np.int64)
    valid = np.zeros(len(values), dtype=bool)
    # a value of another type among them (e.g. a string) does not make the floats' rounding exact
    inexact = any(type(v) is float and abs(v) >= _FLOAT_EXACT_LIMIT_US for v in values)
    for i, v in enumerate(values):
        if isinstance(v, float):
            if not math.isfinite(v):
                continue
            v = Decimal(repr(v))
        elif isinstance(v, bool) or not isinstance(v, (int, Decimal)) or (isinstance(v, Decimal) and not v.is_finite()):
            continue
        ns = int((Decimal(v) * 1000).to_integral_value())
        if -_TIME_LIMIT_NS < ns < _TIME_LIMIT_NS:
            out[i] = ns
            valid[i] = True
    return out, valid, inexact


def _decode_lenient(data: bytes, exact: bool = False) -> tuple[list[Event], int, bool]:
    """(events, elements left out, whether floats are Decimal). Invalid UTF-8 in a string becomes
    U+FFFD rather than an error."""
    return utf8_lenient(lambda d: _decode_typed(d, exact), data)


def _decode_typed(data: bytes, exact: bool) -> tuple[list[Event], int, bool]:
    """The fast typed decode, else Decimal floats, else an element-by-element rescue."""
    if not exact:
        try:
            return _FAST.decode(data), 0, False
        except msgspec.ValidationError:
            pass  # a number beyond float64, or an element or args that is not an object
    try:
        return _EXACT.decode(data), 0, True
    except msgspec.ValidationError:
        pass
    items = _ITEMS.decode(data)
    events: list[Event] = []
    for raw in items:
        value = _ANY_EXACT.decode(raw)
        if not isinstance(value, dict):
            continue
        if not isinstance(value.get("args"), dict):
            value["args"] = None
        events.append(msgspec.convert(value, Event))
    return events, len(items) - len(events), True


def decode_chunk(
    chunk: bytes, all_ops: bool = True, marker: StepMarker = StepMarker(), part: int = 0, file_no: int = 1,
) -> pa.Table:
    """Decode ``chunk`` (whole events joined by commas, without the enclosing brackets) into the rows
    ``sql/read_events.sql`` gives for it as the file ``file_no`` of batch ``part`` (:data:`ROWS_SCHEMA`,
    a row per element that is not dropped, and the two bounds that count them), which the writer stores
    as it stores DuckDB's.

    The reader has checked the JSON syntax; values of the wrong type never raise here: an element
    that is not an object or has no phase, and a complete event without numeric ``ts``/``dur`` (but a
    CPU operator, counted apart), are dropped: counted, never a row (``sql/batch_counts.sql``). With
    ``all_ops=False`` the CPU operators that no metric of a GPU trace reads are left out (see
    :func:`events_to_rows`). No row is ``odd`` or ``unsure_file``: this reader reads those values exactly.
    """
    data = b"[" + chunk + b"]"
    events, left_out, exact = _decode_lenient(data)
    rows, inexact = events_to_rows(events, all_ops, marker, part, left_out, file_no)
    if inexact and not exact:  # epoch-microsecond times with a fraction: decode them exactly
        events, left_out, _ = _decode_lenient(data, exact=True)
        rows, _ = events_to_rows(events, all_ops, marker, part, left_out, file_no)
    return rows


def events_to_rows(
    events: list[Event], all_ops: bool = True, marker: StepMarker = StepMarker(), part: int = 0, left_out: int = 0,
    file_no: int = 1,
) -> tuple[pa.Table, bool]:
    """The rows of decoded ``events`` (:func:`decode_chunk`) and ``left_out`` elements that were not
    objects, and whether float64 rounding made a time inexact.

    Complete events (``ph`` "X") are spans: a device activity by its category (``kind`` 1-3), else
    a host span (0). ``all_ops=False`` (traces with GPU activity) leaves out the CPU operators
    (``cpu_op``, ``python_function``) that carry no collective arguments and are not a step
    (``marker``): the metrics of a GPU trace read the runtime launches, annotations and
    ``record_param_comms`` only, and the operators are most of a trace's events. They are rows that
    only count (``plain_op``, not ``span``). CPU-only traces need them (they are the compute,
    ``sql/cpu_activity.sql``).
    """
    is_step = re.compile(marker.pattern).search
    spans: list[Event] = []
    span_kinds: list[int] = []
    span_plain: list[bool] = []
    metas: list[Event] = []
    skipped = other = 0  # rows that only count
    for e in events:
        ph = e.ph
        if ph == "X":
            cat = e.cat
            kind = GPU_KINDS.get(cat, 0) if isinstance(cat, str) else 0
            plain = kind == 0 and _is_plain_op(e, is_step)
            if all_ops or not plain:
                spans.append(e)
                span_kinds.append(kind)
                span_plain.append(plain)
            else:
                skipped += 1
        elif ph == "M" and e.args is not None and isinstance(e.name, str) and e.name in META_KEYS:
            metas.append(e)
        elif ph is not None:  # with none, dropped
            other += 1
    span_rows, inexact = _span_rows(spans, span_kinds, span_plain, part)
    tables = [
        span_rows,
        _rows(len(metas), part, {
            "meta": True,
            "name": [e.name for e in metas],
            "rank": _args_column(metas, "rank"),
            "pid": _int_list([e.pid for e in metas]),
            "tid": _int_list([e.tid for e in metas]),
            "meta_value": [
                _to_text(e.args.meta_name if e.args.meta_name is not None else e.args.labels)  # type: ignore[union-attr]
                for e in metas
            ],
        }),
        _rows(skipped, part, {"kind": 0, "plain_op": True}),  # CPU operators left out (all_ops=False)
        _rows(other, part, {}),  # other phases: instant, counter, flow, metadata traceq does not keep
        # the elements' bounds, as DuckDB's ordinality numbers those written around them (traceq.ingest.native)
        _rows(2, part, {"file_no": file_no, "bound": [1, len(events) + left_out + 2]}),
    ]
    return pa.concat_tables(tables), inexact


def _span_rows(rows: list[Event], kinds: list[int], plain: list[bool], part: int) -> tuple[pa.Table, bool]:
    """The rows of the complete events kept (``span``), their times typed and checked (``valid``)."""
    start, ok_start, inexact = _time_ns([e.ts for e in rows])
    dur, ok_dur, _ = _time_ns([e.dur for e in rows])
    valid = ok_start & ok_dur & (dur >= 0)
    return _rows(len(rows), part, {
        "kind": kinds,
        "plain_op": plain,
        "span": True,
        "name": [e.name if isinstance(e.name, str) else _to_text(e.name) or "" for e in rows],
        "cat": [e.cat if isinstance(e.cat, str) else _to_text(e.cat) for e in rows],
        "rank": _args_column(rows, "rank"),
        "pid": _int_list([e.pid for e in rows]),
        "tid": _int_list([e.tid for e in rows]),
        "device": _args_column(rows, "device"),
        "stream": _args_column(rows, "stream"),
        "correlation": _args_column(rows, "correlation"),
        "external_id": _int_list([
            None if e.args is None else (e.args.external_id if e.args.external_id is not None else e.args.external_id_2021)
            for e in rows
        ]),
        **_collective_columns(rows),
        "valid": valid,
        "start_ns": pa.array(start, mask=~valid),
        "dur_ns": pa.array(dur, mask=~valid),
        "odd": False,
    }).filter(pa.array(valid | np.array(plain, dtype=bool))), inexact  # others without valid times: dropped


def _rows(n: int, part: int, columns: dict[str, Any]) -> pa.Table:
    """``n`` rows of :data:`ROWS_SCHEMA`: ``columns`` (a value for each row, or one for all), else
    false for a flag and null for any other column."""
    arrays = []
    zeros = None  # one buffer of zeros for every null column (pa.nulls gives each its own: 150 bytes a row)
    for f in ROWS_SCHEMA:
        value = part if f.name == "part" else columns.get(f.name, False if f.name in _FLAGS else None)
        if value is None:
            zeros = zeros or pa.py_buffer(bytes(8 * n + 8))
            buffers = [zeros, zeros, _EMPTY] if f.type == pa.string() else [zeros, zeros]
            arrays.append(pa.Array.from_buffers(f.type, n, buffers, null_count=n))
        elif isinstance(value, (bool, int)):
            arrays.append(pa.repeat(pa.scalar(value, f.type), n))
        else:
            arrays.append(_array(value, f.type))
    return pa.Table.from_arrays(arrays, schema=ROWS_SCHEMA)


def _is_plain_op(e: Event, is_step: Callable[[str], object]) -> bool:
    """A CPU operator that GPU-trace metrics do not read (see :func:`events_to_rows`)."""
    return (
        isinstance(e.cat, str) and e.cat in OP_CATS
        and (e.args is None or e.args.collective is None)
        and not (isinstance(e.name, str) and is_step(e.name))
    )


def _int_list(values: list[Any]) -> list[Any]:
    """``values`` as ints or None: unchanged when they already are (the common case, checked at C
    speed), else through :func:`to_int`. Ints beyond int64 are caught when the Arrow array is built."""
    if all(v is None or type(v) is int for v in values):
        return values
    return [to_int(v) for v in values]


def _args_column(rows: list[Event], attr: str) -> list[Any]:
    return _int_list([None if e.args is None else getattr(e.args, attr) for e in rows])


def _collective_columns(rows: list[Event]) -> dict[str, list[Any]]:
    """Collective arguments, filled only for the (few) events that name a collective."""
    cols: dict[str, list[Any]] = {name: [None] * len(rows) for name, _ in _COLLECTIVE_COLUMNS}
    for i, e in enumerate(rows):
        a = e.args
        if a is not None and a.collective is not None:
            for name, is_int in _COLLECTIVE_COLUMNS:
                v = getattr(a, name)
                cols[name][i] = to_int(v) if is_int else _to_text(v)
    return cols


def _array(values: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(values, pa.Array):
        return values
    try:
        return pa.array(values, type=type_)
    except OverflowError:  # an int beyond int64 (e.g. a uint64 id): unknown, like to_int says
        return pa.array([to_int(v) for v in values], type=type_)
