"""Files the collectors write beside each trace (``rank<r>.run.json``, ``rank<r>.power.jsonl``).

:func:`load_side_files` is called by ingest, inside the trace's transaction, after the trace's
events are in the warehouse. It

- stores the run metadata (whole file in ``run_files``; run-level values merged into
  ``runs.metadata``, see :mod:`traceq.store.run_metadata`);
- finds the trace's clock offset, which :func:`write_wall_times` gives every step once the steps are
  in (``step_wall_times``), using the collectors' documented mapping ``wall_ns = ts_us * 1000 +
  offset_ns``: offset_ns is the trace's ``baseTimeNanoseconds``, else run.json's
  ``trace_files[].offset_ns`` / ``clock.offset_ns`` for this file, else 0 (older Kineto wrote epoch
  microseconds);
- loads the power log (``power_logs`` header, ``power_samples`` readings). A log whose source is
  ``unavailable`` is stored as such, with no samples: power metrics stay null, never invented.

Formats: ``traceq.collectors.metadata`` (run.json) and ``traceq.collectors.power`` (power.jsonl).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb

from traceq.catalog import RUN_KEYS
from traceq.errors import TraceFormatError
from traceq.query import params_of, sql_text
from traceq.store.run_metadata import merge_run_metadata, run_level
from traceq.store.schema import execute_over

_CYCLE = re.compile(r"\.cycle\d+$")


def find_side_file(trace_path: Path, suffix: str) -> Path | None:
    """The side file of ``trace_path`` if it exists (``runs/x/rank0.trace.json.gz`` + ``.run.json`` ->
    ``runs/x/rank0.run.json``); ``rank0.cycle2.trace.json.gz`` shares rank0's."""
    name = trace_path.name
    stem = next((name[: -len(e)] for e in (".trace.json.gz", ".trace.json", ".json.gz", ".json") if name.endswith(e)), name)
    for candidate in dict.fromkeys((stem, _CYCLE.sub("", stem))):  # once where it names no cycle
        if (path := trace_path.with_name(candidate + suffix)).is_file():
            return path
    return None


def collector_run_name(trace_path: Path) -> tuple[str, Path] | None:
    """The run the collector's run.json beside ``trace_path`` names (its ``"run"``, a string), and the
    run.json; None without one. A run.json that cannot be read names no run here: loading it
    (:func:`load_side_files`) says what is wrong with it."""
    meta_path = find_side_file(trace_path, ".run.json")
    if meta_path is None:
        return None
    try:
        meta = read_run_file(meta_path)
    except TraceFormatError:
        return None
    run = meta.get("run")
    return (run, meta_path) if isinstance(run, str) else None


def load_side_files(
    con: duckdb.DuckDBPyConnection, trace_id: int, trace_path: Path, run: str, file_rank: int | None, base_ns: int | None
) -> tuple[int, str]:
    """Load the run metadata and power log that sit beside ``trace_path``, if any; returns the
    trace's clock offset (:func:`clock_offset`; ``base_ns``: its ``baseTimeNanoseconds``).

    Raises TraceFormatError for a side file that is not in the collectors' format (the trace's whole
    ingest is then rolled back).
    """
    meta: dict[str, Any] | None = None
    meta_path = find_side_file(trace_path, ".run.json")
    if meta_path is not None:
        meta = read_run_file(meta_path)
        con.execute(
            "insert into run_files (trace_id, run, rank, path, metadata) values (?, ?, ?, ?, ?)",
            [trace_id, run, _int(meta.get("rank")), str(meta_path.resolve()), json.dumps(meta)],
        )
        merge_run_metadata(con, run, run_level(meta))

    power_path = find_side_file(trace_path, ".power.jsonl")
    if power_path is None and meta and isinstance(meta.get("power_file"), str):
        candidate = trace_path.with_name(Path(meta["power_file"]).name)
        power_path = candidate if candidate.is_file() else None
    if power_path is not None:
        load_power_log(con, trace_id, file_rank, power_path)
    return clock_offset(base_ns, meta, trace_path.name)


def write_wall_times(con: duckdb.DuckDBPyConnection, offsets: dict[int, tuple[int, str]]) -> None:
    """The wall-clock window of every step of the traces ``offsets`` names (trace id -> (offset_ns,
    source)), in one statement (``step_wall_times``)."""
    ids = sorted(offsets)
    con.execute(
        """
        insert into step_wall_times
        select s.trace_id, s.rank, s.step, s.start_ns + o.offset_ns, s.end_ns + o.offset_ns, o.offset_ns, o.source
        from steps as s
        inner join (select unnest($ids) as trace_id, unnest($offsets) as offset_ns, unnest($sources) as source) as o
            using (trace_id)
        where s.trace_id between $first and $last
        """,
        {"ids": ids, "offsets": [offsets[i][0] for i in ids], "sources": [offsets[i][1] for i in ids],
         "first": ids[0], "last": ids[-1]},
    )


def side_value_notes(con: duckdb.DuckDBPyConnection, trace_ids: list[int]) -> dict[int, list[str]]:
    """Per trace of ``trace_ids`` (stored on ``con``), one note per side file of it holding values left out:
    run.json fields of numeric run keys that are not numbers of their kind, power log records not stored or
    stored without their figure (``sql/side_value_notes.sql``: the rules of ``traceq check``'s side_values)."""
    if not trace_ids:
        return {}
    numeric = [k for k in RUN_KEYS if k.kind in (int, float)]
    params = {"first": min(trace_ids), "last": max(trace_ids), "run_keys": [k.key for k in numeric],
              "run_key_kinds": [k.kind.__name__ for k in numeric]}
    text = sql_text("side_value_notes.sql")
    wanted = set(trace_ids)
    notes: dict[int, list[str]] = {}
    for trace_id, _, _, _, note in con.execute(text, params_of(text, params)).fetchall():
        if trace_id in wanted:
            notes.setdefault(trace_id, []).append(note)
    return notes


def read_run_file(path: Path) -> dict[str, Any]:
    """A collector's run.json as a dict; TraceFormatError naming the file when it is not one."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a readable run.json ({exc}); fix or remove it, then ingest again") from None
    if not isinstance(meta, dict):
        raise TraceFormatError(f"{path}: run.json must hold one JSON object; fix or remove it, then ingest again")
    return meta


def clock_offset(base_ns: int | None, meta: dict[str, Any] | None, trace_name: str) -> tuple[int, str]:
    """(offset_ns, source) such that wall-clock ns = trace ns + offset_ns for this trace file."""
    if base_ns is not None:
        return int(base_ns), "baseTimeNanoseconds"
    if meta:
        for entry in meta.get("trace_files") or []:
            if isinstance(entry, dict) and entry.get("file") == trace_name and _int(entry.get("offset_ns")) is not None:
                return int(entry["offset_ns"]), "run.json"
        clock = meta.get("clock") if isinstance(meta.get("clock"), dict) else {}
        if meta.get("trace_file") == trace_name and _int(clock.get("offset_ns")) is not None:
            return int(clock["offset_ns"]), "run.json"
    return 0, "none (trace ts taken as epoch us)"


def load_power_log(con: duckdb.DuckDBPyConnection, trace_id: int, file_rank: int | None, path: Path) -> None:
    """Store one ``rank<r>.power.jsonl`` under the trace's rank (else its header's).

    A last line cut short by a crash is ignored (the collectors flush line by line); any other
    malformed line raises TraceFormatError.
    """
    header, records = read_power_log(path)
    rank = file_rank if file_rank is not None else _int(header.get("rank"))
    power = [r for r in records if r.get("kind") == "power"]
    energy = [r for r in records if r.get("kind") == "energy"]
    errors = [r for r in records if r.get("kind") == "error"]
    end = next((r for r in records if r.get("kind") == "end"), None)
    source = str(header.get("source") or "unavailable")
    if source != "nvml":  # the format says: no numbers follow; make sure none are used
        power, energy = [], []
    con.execute(
        """
        insert into power_logs (trace_id, rank, path, source, reason, interval_ms, gpus, note, end_wall_ns,
            n_samples, n_energy, n_errors)
        values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        """,
        [
            trace_id, rank, str(path.resolve()), source, _text(header.get("reason")),
            _float(header.get("interval_ms")), json.dumps(header.get("gpus") or []), _text(header.get("note")),
            _int(end.get("wall_ns")) if end else None, len(power), len(energy), len(errors),
        ],
    )
    rows = power + energy
    if rows:
        import pyarrow as pa  # only with a power log: an ingest without one imports no pyarrow

        table = pa.table({
            "gpu": pa.array([_int(r.get("gpu")) for r in rows], pa.int64()),
            "kind": pa.array([r["kind"] for r in rows], pa.string()),
            "wall_ns": pa.array([_int(r.get("wall_ns")) for r in rows], pa.int64()),
            "step": pa.array([_int(r.get("step")) for r in rows], pa.int64()),
            "power_w": pa.array([_float(r.get("power_w")) for r in rows], pa.float64()),
            "energy_mj": pa.array([_int(r.get("energy_mj")) for r in rows], pa.int64()),
        })
        execute_over(
            con,
            """
            insert into power_samples (trace_id, rank, gpu, kind, wall_ns, step, power_w, energy_mj)
            select ?, ?, gpu, kind, wall_ns, step, power_w, energy_mj from _rows
            where gpu is not null and wall_ns is not null
            """,
            [trace_id, rank],
            table,
        )


def read_power_log(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, records) of a power log in the ``traceq.collectors.power`` format."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: cannot read the power log ({exc})") from None
    lines = text.split("\n")
    complete_last = text.endswith("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not complete_last:
                break  # cut short by a crash: the format allows losing the last line
            raise TraceFormatError(
                f"{path}:{number}: not a JSON line; is this a traceq power log? (fix or remove it, then ingest again)"
            ) from None
        if not isinstance(record, dict):
            raise TraceFormatError(f"{path}:{number}: each line must be a JSON object")
        records.append(record)
    if not records or records[0].get("kind") != "header":
        raise TraceFormatError(
            f"{path}: the first line is not a power log header ({{\"kind\": \"header\", ...}}); "
            "was it written by traceq.collectors.PowerSampler?"
        )
    return records[0], records[1:]


_INT64 = (-(2**63), 2**63 - 1)


def _int(value: Any) -> int | None:
    """``value`` as an integer a BIGINT holds; None for anything else (1e30, 1e400 = inf, "x", true)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if _INT64[0] <= number <= _INT64[1] else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
