"""Perfetto trace files: TracePackets on one sequence with interned names, appended to a file a batch
at a time and moved into place when complete (the writer of :mod:`traceq.perfetto.timeline`).

A Perfetto trace is a ``Trace`` message: a repeated ``packet`` field. Two serialized Traces, one after
the other, read as one Trace holding the packets of both, so a batch of packets is serialized with the
``perfetto`` package's ``TraceProtoBuilder`` and appended, and memory holds one batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import IO, Any

from traceq.errors import ConfigError

BATCH_PACKETS = 8_192  # packets serialized and appended to the file at a time
_SEQUENCE = 1  # every packet is on one sequence (its interned names)


def require_perfetto() -> None:
    """ConfigError naming the fix when the ``perfetto`` package is not installed."""
    try:
        import perfetto.trace_builder.proto_builder  # noqa: F401
    except ImportError:
        raise ConfigError('writing a Perfetto trace needs the perfetto package: pip install "traceq[perfetto]"') from None


class TraceWriter:
    """TracePackets on one sequence, interned names, appended to ``file`` a batch at a time: each batch
    is a perfetto ``TraceProtoBuilder``'s Trace, and Traces concatenate (``packet`` is a repeated field)."""

    def __init__(self, file: IO[bytes]) -> None:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder

        self._pb = pb
        self._new = TraceProtoBuilder
        self._builder = TraceProtoBuilder()
        self._file = file
        self._pending = 0
        self._uuids = itertools.count(1)
        self._interned: dict[str, dict[str, int]] = {
            "event_names": {}, "event_categories": {}, "debug_annotation_names": {}, "debug_annotation_string_values": {},
        }
        self._cleared = False

    def _packet(self, ts: int | None = None) -> Any:
        if self._pending >= BATCH_PACKETS:
            self.flush()
        packet = self._builder.add_packet()
        self._pending += 1
        packet.trusted_packet_sequence_id = _SEQUENCE
        if self._cleared:
            packet.sequence_flags = self._pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        else:
            packet.sequence_flags = self._pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self._cleared = True
        if ts is not None:
            packet.timestamp = ts
        return packet

    def _intern(self, packet: Any, kind: str, value: str) -> int:
        table = self._interned[kind]
        iid = table.get(value)
        if iid is None:
            iid = table[value] = len(table) + 1
            entry = getattr(packet.interned_data, kind).add()
            entry.iid = iid
            if kind == "debug_annotation_string_values":
                entry.str = value.encode()
            else:
                entry.name = value
        return iid

    def process(self, pid: int, name: str, labels: list[str], description: str) -> int:
        """A process track (its children ordered as they are made); returns its uuid."""
        uuid = next(self._uuids)
        d = self._packet().track_descriptor
        d.uuid = uuid
        d.process.pid = pid
        d.process.process_name = name
        d.process.process_labels.extend(labels)
        d.description = description
        d.child_ordering = self._pb.TrackDescriptor.EXPLICIT
        d.sibling_order_rank = pid
        return uuid

    def track(self, parent: int, name: str, order: int, description: str | None = None, *,
              unit_ns: bool = False, unit_name: str | None = None) -> int:
        """A named child track of ``parent`` (a counter track with a unit); returns its uuid."""
        uuid = next(self._uuids)
        d = self._packet().track_descriptor
        d.uuid = uuid
        d.parent_uuid = parent
        d.name = name
        d.sibling_order_rank = order
        if description:
            d.description = description
        if unit_ns:
            d.counter.unit = self._pb.CounterDescriptor.UNIT_TIME_NS
        elif unit_name:
            d.counter.unit_name = unit_name
        return uuid

    def slice(self, track: int, ts: int, dur: int, name: str, category: str, args: Sequence[tuple[str, Any]], *,
              flow_out: int | None = None, flow_in: int | None = None) -> None:
        """A slice [ts, ts + dur] on ``track`` (a begin and an end), with debug annotations ``args``; an arrow
        (a flow) leaves it where ``flow_out`` is given and ends at the slice whose ``flow_in`` is the same id."""
        packet = self._packet(ts)
        event = packet.track_event
        event.type = self._pb.TrackEvent.TYPE_SLICE_BEGIN
        event.track_uuid = track
        if flow_out is not None:
            event.flow_ids.append(flow_out)
        if flow_in is not None:
            event.terminating_flow_ids.append(flow_in)
        event.name_iid = self._intern(packet, "event_names", name)
        event.category_iids.append(self._intern(packet, "event_categories", category))
        for key, value in args:
            if value is None:
                continue
            a = event.debug_annotations.add()
            a.name_iid = self._intern(packet, "debug_annotation_names", key)
            if isinstance(value, bool):
                a.bool_value = value
            elif isinstance(value, int):
                a.int_value = value
            elif isinstance(value, float):
                a.double_value = value
            else:
                a.string_value_iid = self._intern(packet, "debug_annotation_string_values", str(value))
        end = self._packet(ts + dur).track_event
        end.type = self._pb.TrackEvent.TYPE_SLICE_END
        end.track_uuid = track

    def counter(self, track: int, ts: int, value: int | float) -> None:
        """A counter value from ``ts`` on (an int in the track's unit, or a float)."""
        event = self._packet(ts).track_event
        event.type = self._pb.TrackEvent.TYPE_COUNTER
        event.track_uuid = track
        if isinstance(value, float):
            event.double_counter_value = value
        else:
            event.counter_value = value

    def metadata(self, name: str, json_text: str) -> None:
        """A metadata entry (Perfetto's metadata table: cr-<name>)."""
        entry = self._packet().chrome_events.metadata.add()
        entry.name = name
        entry.json_value = json_text

    def flush(self) -> None:
        """Append the packets so far to the file."""
        if self._pending:
            self._file.write(self._builder.serialize())
            self._builder = self._new()
            self._pending = 0


