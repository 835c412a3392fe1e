"""Decode one chunk of Kineto ``traceEvents`` into columnar Arrow tables.

The reference reader: :mod:`traceq.ingest.native` is checked against it, and ingest falls back to it for
files DuckDB's JSON reader would read differently. It depends on msgspec, numpy and pyarrow only.
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
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa

from traceq.catalog import StepMarker, event_categories
from traceq.kineto import to_int  # noqa: F401 (re-exported)

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
DEVICE_ANNOTATION_CATS = frozenset(event_categories().cats("device_annotation"))

# Collective args (args["Collective name"] etc.), the same columns in gpu_events and host_events.
_COLLECTIVE_COLUMNS = [
    ("collective", pa.string()),
    ("pg_name", pa.string()),
    ("pg_desc", pa.string()),
    ("pg_ranks", pa.string()),
    ("group_size", pa.int64()),
    ("in_nelems", pa.int64()),
    ("out_nelems", pa.int64()),
    ("dtype", pa.string()),
    ("seq", pa.int64()),
]
GPU_SCHEMA = pa.schema(
    [
        ("kind", pa.int8()),
        ("name_id", pa.int32()),
        ("rank", pa.int64()),
        ("device", pa.int64()),
        ("stream", pa.int64()),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        *_COLLECTIVE_COLUMNS,
    ]
)
HOST_SCHEMA = pa.schema(
    [
        ("cat", pa.string()),
        ("name_id", pa.int32()),
        ("rank", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("device", pa.int64()),
        *_COLLECTIVE_COLUMNS,
    ]
)
META_SCHEMA = pa.schema(
    [("rank", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()), ("key", pa.string()), ("value", pa.string())]
)
_COLL_FIELDS = tuple(name for name, _ in _COLLECTIVE_COLUMNS)
_INT_COLL = frozenset(name for name, type_ in _COLLECTIVE_COLUMNS if type_ == pa.int64())
# Times and durations beyond +-2**62 ns (146 years) are not real; rejecting them keeps
# start_ns + dur_ns inside int64 in every query.
_TIME_LIMIT_NS = 2**62


@dataclass
class ChunkTables:
    """What one decoded chunk yields: Arrow tables whose ``name_id`` index into ``names``."""

    names: list[str]
    gpu: pa.Table
    host: pa.Table
    meta: pa.Table
    counts: dict[str, int] = field(default_factory=dict)
    inexact: bool = False  # float64 rounded a time (|ts| >= 2**43 us with a fraction): decode exactly


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
    return out, valid, False


def _decode_lenient(data: bytes, exact: bool = False) -> tuple[list[Event], int, bool]:
    """(events, elements left out, whether floats are Decimal). Invalid UTF-8 in a string becomes
    U+FFFD rather than an error."""
    try:
        return _decode_typed(data, exact)
    except UnicodeDecodeError:
        return _decode_typed(data.decode("utf-8", "replace").encode(), exact)


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


def decode_chunk(chunk: bytes, all_ops: bool = True, marker: StepMarker = StepMarker()) -> ChunkTables:
    """Decode ``chunk`` (whole events joined by commas, without the enclosing brackets).

    The reader has checked the JSON syntax; values of the wrong type never raise here: an element
    that is not an object, or an event without ``ph`` or without numeric ``ts``/``dur`` (for
    complete events), is counted in ``counts["dropped"]``. With ``all_ops=False`` the CPU operators
    that no metric of a GPU trace reads are left out (see :func:`events_to_tables`).
    """
    data = b"[" + chunk + b"]"
    events, left_out, exact = _decode_lenient(data)
    tables = events_to_tables(events, all_ops, marker)
    if tables.inexact and not exact:  # epoch-microsecond times with a fraction: decode them exactly
        events, left_out, _ = _decode_lenient(data, exact=True)
        tables = events_to_tables(events, all_ops, marker)
    tables.counts["events"] += left_out
    tables.counts["dropped"] += left_out
    return tables


def events_to_tables(events: list[Event], all_ops: bool = True, marker: StepMarker = StepMarker()) -> ChunkTables:
    """Split decoded events into GPU activity, host spans and thread/process metadata tables.

    ``all_ops=False`` (traces with GPU activity) leaves out the CPU operators (``cpu_op``,
    ``python_function``) that carry no collective arguments and are not a step (``marker``): the
    metrics of a GPU trace read the runtime launches, annotations and ``record_param_comms`` only,
    and the operators are most of a trace's events. They are counted in ``counts["skipped_ops"]``.
    CPU-only traces need them (they are the compute, ``sql/cpu_activity.sql``).
    """
    names: dict[str, int] = {}
    gpu_rows: list[Event] = []
    gpu_kind: list[int] = []
    host_rows: list[Event] = []
    meta_rows: list[Event] = []
    counts = {"events": len(events), "dropped": 0, "other": 0, "skipped_ops": 0}
    plain_host: list[bool] = []  # host_rows[i] is a CPU operator kept only because all_ops
    no_phase = 0
    is_step = re.compile(marker.pattern).search
    for e in events:
        ph = e.ph
        if ph == "X":
            cat = e.cat
            kind = GPU_KINDS.get(cat) if isinstance(cat, str) else None
            if kind is not None:
                gpu_rows.append(e)
                gpu_kind.append(kind)
            elif not _is_plain_op(e, is_step):
                host_rows.append(e)
                plain_host.append(False)
            elif all_ops:
                host_rows.append(e)
                plain_host.append(True)
            else:
                counts["skipped_ops"] += 1
        elif ph == "M":
            meta_rows.append(e)
        elif ph is None:
            no_phase += 1
        else:
            counts["other"] += 1

    gpu, dropped_gpu, inexact_gpu = _gpu_table(gpu_rows, gpu_kind, names)
    host, host_kept, inexact_host = _host_table(host_rows, names)
    counts["dropped"] = dropped_gpu + int((~host_kept).sum()) + no_phase
    # CPU operators a GPU trace will not keep (ingest deletes them): their drops are not the trace's
    counts["dropped_plain_ops"] = int((~host_kept & np.array(plain_host, dtype=bool)).sum()) if host_rows else 0
    counts["gpu"] = gpu.num_rows
    counts["host"] = host.num_rows
    return ChunkTables(
        names=list(names), gpu=gpu, host=host, meta=_meta_table(meta_rows), counts=counts,
        inexact=inexact_gpu or inexact_host,
    )


def _is_plain_op(e: Event, is_step: Callable[[str], object]) -> bool:
    """A CPU operator that GPU-trace metrics do not read (see :func:`events_to_tables`)."""
    return (
        isinstance(e.cat, str) and e.cat in OP_CATS
        and (e.args is None or e.args.collective is None)
        and not (isinstance(e.name, str) and is_step(e.name))
    )


def _intern(rows: list[Event], names: dict[str, int]) -> np.ndarray:
    setdefault = names.setdefault
    return np.fromiter(
        (setdefault(e.name if isinstance(e.name, str) else _to_text(e.name) or "", len(names)) for e in rows),
        dtype=np.int32,
        count=len(rows),
    )


def _valid_spans(rows: list[Event]) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    start, ok_start, inexact = _time_ns([e.ts for e in rows])
    dur, ok_dur, _ = _time_ns([e.dur for e in rows])
    keep = ok_start & ok_dur & (dur >= 0)
    return start, dur, keep, inexact


def _int_list(values: list[Any]) -> list[Any]:
    """``values`` as ints or None: unchanged when they already are (the common case, checked at C
    speed), else through :func:`to_int`. Ints beyond int64 are caught when the Arrow array is built."""
    if all(v is None or type(v) is int for v in values):
        return values
    return [to_int(v) for v in values]


def _args_column(rows: list[Event], attr: str, as_int: bool) -> list[Any]:
    values = [None if e.args is None else getattr(e.args, attr) for e in rows]
    return _int_list(values) if as_int else [_to_text(v) for v in values]


def _external_ids(rows: list[Event]) -> list[Any]:
    return _int_list([
        None if e.args is None else (e.args.external_id if e.args.external_id is not None else e.args.external_id_2021)
        for e in rows
    ])


def _collective_columns(rows: list[Event]) -> dict[str, list[Any]]:
    """Collective arguments, filled only for the (few) events that name a collective."""
    cols: dict[str, list[Any]] = {f: [None] * len(rows) for f in _COLL_FIELDS}
    for i, e in enumerate(rows):
        a = e.args
        if a is not None and a.collective is not None:
            for f in _COLL_FIELDS:
                v = getattr(a, f)
                cols[f][i] = to_int(v) if f in _INT_COLL else _to_text(v)
    return cols


def _array(values: Any, type_: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=type_)
    except OverflowError:  # an int beyond int64 (e.g. a uint64 id): unknown, like to_int says
        return pa.array([to_int(v) for v in values], type=type_)


def _filtered(table: dict[str, Any], keep: np.ndarray, schema: pa.Schema) -> pa.Table:
    arrays = [_array(table[f.name], f.type) for f in schema]
    result = pa.Table.from_arrays(arrays, schema=schema)
    if not keep.all():
        result = result.filter(pa.array(keep))
    return result


def _gpu_table(rows: list[Event], kinds: list[int], names: dict[str, int]) -> tuple[pa.Table, int, bool]:
    start, dur, keep, inexact = _valid_spans(rows)
    device = _args_column(rows, "device", True)
    stream = _args_column(rows, "stream", True)
    for i, e in enumerate(rows):  # fall back to the trace viewer's pid (device) / tid (stream)
        if device[i] is None:
            device[i] = to_int(e.pid)
        if stream[i] is None:
            stream[i] = to_int(e.tid)
    cols: dict[str, Any] = {
        "kind": np.asarray(kinds, dtype=np.int8),
        "name_id": _intern(rows, names),
        "rank": _args_column(rows, "rank", True),
        "device": device,
        "stream": stream,
        "start_ns": start,
        "dur_ns": dur,
        "correlation": _args_column(rows, "correlation", True),
        "external_id": _external_ids(rows),
        **_collective_columns(rows),
    }
    return _filtered(cols, keep, GPU_SCHEMA), int((~keep).sum()), inexact


def _host_table(rows: list[Event], names: dict[str, int]) -> tuple[pa.Table, np.ndarray, bool]:
    """The host rows with usable times, which of ``rows`` they are (a mask), and whether a time was inexact."""
    start, dur, keep, inexact = _valid_spans(rows)
    cols: dict[str, Any] = {
        "cat": [e.cat if isinstance(e.cat, str) else _to_text(e.cat) for e in rows],
        "name_id": _intern(rows, names),
        "rank": _args_column(rows, "rank", True),
        "pid": _int_list([e.pid for e in rows]),
        "tid": _int_list([e.tid for e in rows]),
        "start_ns": start,
        "dur_ns": dur,
        "correlation": _args_column(rows, "correlation", True),
        "external_id": _external_ids(rows),
        "device": _host_devices(rows),
        **_collective_columns(rows),
    }
    return _filtered(cols, keep, HOST_SCHEMA), keep, inexact


def _host_devices(rows: list[Event]) -> list[int | None]:
    """args.device; for device-side annotations without it (ROCm), the trace viewer's pid."""
    out = _args_column(rows, "device", True)
    for i, e in enumerate(rows):
        if out[i] is None and isinstance(e.cat, str) and e.cat in DEVICE_ANNOTATION_CATS:
            out[i] = to_int(e.pid)
    return out


def _meta_table(rows: list[Event]) -> pa.Table:
    keep = [e for e in rows if e.name in ("process_name", "thread_name", "process_labels") and e.args is not None]
    return pa.table(
        {
            "rank": pa.array([to_int(e.args.rank) for e in keep], pa.int64()),  # type: ignore[union-attr]
            "pid": pa.array([to_int(e.pid) for e in keep], pa.int64()),
            "tid": pa.array([to_int(e.tid) for e in keep], pa.int64()),
            "key": pa.array([e.name for e in keep], pa.string()),
            "value": pa.array(
                [_to_text(e.args.meta_name if e.args.meta_name is not None else e.args.labels) for e in keep],  # type: ignore[union-attr]
                pa.string(),
            ),
        },
        schema=META_SCHEMA,
    )
