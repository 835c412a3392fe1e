"""What is written of a file beside its events, and what the ingest says of it: its traces row
(:func:`store_trace`) and result (:class:`FileResult`); its earlier trace where it is read again
(:func:`replace`); what the SQL derives once a transaction holds a group's files (:func:`derive`): their
steps, step attribution, side files and wall-clock windows, and the refusal of a run that would hold a
step twice; a rank for a file that names none (:func:`free_rank`); the CPU operators of a GPU trace
written before it showed GPU activity, deleted (:func:`drop_plain_ops`); DuckDB's buffer pool while
ingesting."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from traceq.catalog import StepMarker, event_categories
from traceq.errors import TraceFormatError
from traceq.identity import GIVEN_RANKS, Claim, next_rankless, refuse_overlap
from traceq.ingest.digests import stored_digest
from traceq.ingest.native import Counts, Executor
from traceq.ingest.sidecar import load_side_files, side_value_notes, write_wall_times
from traceq.kineto import to_int
from traceq.query import params_of, sql_text
from traceq.store.derive import check_step_marker, device_properties, gpu_model_of, write_steps
from traceq.store.manage import forget_run, remove_traces
from traceq.store.schema import fetch_one

# DuckDB's buffer pool while ingesting: room for a batch's parse beside the one being written; row
# groups go to the file as they fill. 1.5 GB traces, 96 MB batches: 225-310 MiB peak RSS at 160 MB,
# 278-385 MiB at 384 MB, for 0-10 % more time (three trace shapes, BENCHMARKS.md, issue 23).
INGEST_MEMORY_LIMIT_MB = 160
INGEST_MEMORY_LIMIT = f"{INGEST_MEMORY_LIMIT_MB}MB"
# ... and where every file is small: two groups' parsed rows (one written, one read ahead) fill the pool, and
# 128 MB holds them as fast: 512 files of 9 MB, 288 MiB peak RSS where 160 MB gave 326, 84 CPU-s either way
# (1.5 GB traces pay up to 30 % at 128 MB, BENCHMARKS.md)
SMALL_FILES_MEMORY_LIMIT = "128MB"


@dataclass
class FileResult:
    """What happened to one input file."""

    path: str
    status: str  # ingested | skipped | failed
    message: str = ""
    trace_id: int | None = None
    run: str | None = None
    ranks: list[int] = field(default_factory=list)
    events: int = 0
    gpu_events: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what a user should know, e.g. a rank assigned


def skipped(path: Path, held: tuple[str, str], name: str | None) -> FileResult:
    """The result of ``path``, whose content the warehouse holds already (``held``: as which file, in
    which run); ``name``: the run --name gave, which went unused."""
    where, run = held
    into = f" into run {name}" if name is not None and name != run else ""
    return FileResult(str(path), "skipped", f"{path}: already ingested (as {where}, run {run}); "
                      f"--force reads it again{into}", run=run)


@dataclass
class Stored:
    """A trace whose rows are in the open transaction, its steps not derived yet (:func:`derive`)."""

    trace_id: int
    path: Path
    run: str
    rank_source: str
    file_rank: int | None
    base_ns: int | None  # baseTimeNanoseconds
    result: FileResult


def derive(con: Any, stored: list[Stored], marker: StepMarker, executor: Executor) -> None:
    """The steps of the traces ``stored`` (consecutive ids; none: nothing to do), their device events'
    steps, their side files, their steps' wall-clock windows and their results' ranks: one statement
    each, whatever the number of traces (but the side files), after ``executor``'s step ``"steps"``.
    ConfigError when a run would hold a step twice (:func:`_refuse_rank_collisions`); TraceFormatError
    for a side file or a clock offset that is not one."""
    if not stored:
        return
    executor.step("steps", [s.path for s in stored])
    ids = [s.trace_id for s in stored]
    write_steps(con, ids, {**event_categories().sql_params(), **marker.sql_params()})
    if marker != StepMarker():
        notes = check_step_marker(con, {s.trace_id: s.path for s in stored}, marker.pattern)
        for s in stored:
            s.result.notes.extend(notes.get(s.trace_id, []))
    _refuse_rank_collisions(con, stored)
    clocks = {s.trace_id: load_side_files(con, s.trace_id, s.path, s.run, s.file_rank, s.base_ns) for s in stored}
    try:
        write_wall_times(con, clocks)
    except duckdb.OutOfRangeException:
        far = [str(s.path) for s in stored if abs(clocks[s.trace_id][0]) >= 1 << 61]
        raise TraceFormatError(
            f"{', '.join(far) or ', '.join(str(s.path) for s in stored)}: its clock offset (baseTimeNanoseconds, or "
            "run.json's offset_ns) puts its steps beyond 64-bit nanoseconds; fix or remove it, then ingest again"
        ) from None
    side = side_value_notes(con, ids)  # the values its side files held that were left out
    for s in stored:
        s.result.notes.extend(side.get(s.trace_id, []))
    ranks = dict(con.execute(
        """
        select trace_id, list(distinct rank order by rank)
        from (
            select trace_id, rank from gpu_events where trace_id between $first and $last
            union all
            select trace_id, rank from host_events where trace_id between $first and $last
        )
        group by trace_id
        """,
        {"first": ids[0], "last": ids[-1]},
    ).fetchall())
    for s in stored:
        s.result.ranks = ranks.get(s.trace_id, [])


def _refuse_rank_collisions(con: Any, stored: list[Stored]) -> None:
    """ConfigError when the run of a trace ``stored`` already holds a step of one of its ranks from another
    trace (:func:`traceq.identity.refuse_overlap` decides and words it): the rows gathered are those of the
    (run, rank, step) that more than one trace holds, where one of them is ``stored``."""
    rows = con.execute(sql_text("step_claims.sql"), {"first": stored[0].trace_id, "last": stored[-1].trace_id}).fetchall()
    if not rows:
        return
    given = {s.trace_id: str(s.path) for s in stored}
    claims = [(new, Claim(trace_id, given.get(trace_id, path), run, rank, step))
              for trace_id, path, run, rank, step, new in rows]
    refuse_overlap([c for new, c in claims if not new], [c for new, c in claims if new],
                   rank_given=[s.trace_id for s in stored if s.rank_source in GIVEN_RANKS])


def free_rank(con: Any, run: str) -> int:
    """The rank for a file that names none: -1, -2, ... below the lowest negative rank held in ``run``
    (:func:`traceq.identity.next_rankless`)."""
    lowest = fetch_one(
        con,
        "select min(s.rank) from steps as s inner join traces as t using (trace_id) where t.run = ? and s.rank < 0",
        [run],
    )[0]
    return next_rankless([] if lowest is None else [lowest])


def drop_plain_ops(con: Any, trace_id: int, marker: StepMarker) -> int:
    """Delete the CPU operators of trace ``trace_id`` written before it showed GPU activity
    (``sql/plain_ops.sql``); returns how many."""
    params = {"trace_id": trace_id, **event_categories().sql_params(), **marker.sql_params()}
    statement = f"delete from host_events where rowid in (select rid from ({sql_text('plain_ops.sql')}))"
    return con.execute(statement, params_of(statement, params)).fetchall()[0][0]


def store_trace(
    con: Any, trace_id: int, path: Path, digest: str, size: int, fields: dict[str, Any], counts: Counts, *,
    run: str, new_run: bool, file_rank: int | None, rank_source: str, marker: StepMarker, seconds: float,
) -> Stored:
    """The traces row of trace ``trace_id`` (the file at ``path``, ``size`` bytes of content ``digest``,
    top-level ``fields``) and its run's (``new_run``), once its events are in (``counts``)."""
    if counts.gpu and counts.kept_ops:  # its CPU operators written before it showed GPU activity go, and their drops
        counts.host -= drop_plain_ops(con, trace_id, marker)
        counts.dropped -= counts.dropped_plain_ops
    dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
    devices = device_properties(fields.get("deviceProperties"))
    try:  # the top-level fields less the bulky log lists
        header = msgspec.json.encode({k: v for k, v in fields.items() if k not in ("INFO", "ERROR", "WARNING")}).decode()
    except RecursionError:  # read on the reading thread, yet deeper than this one can write back
        raise TraceFormatError(f"{path}: its top-level fields are nested too deeply to store (about 1,000 levels); "
                               "nothing was stored") from None
    devices_json = msgspec.json.encode(devices).decode() if devices else None
    if (text_mb := (len(header) + len(devices_json or "")) >> 20) >= 1:
        # storing and compressing 80 MB of header text takes buffers of 128 MB, beyond INGEST_MEMORY_LIMIT (a
        # deviceProperties name of 40 MB, tests/test_hostile.py): the pool is raised until another file's needs more
        con.execute(f"set memory_limit = '{INGEST_MEMORY_LIMIT_MB + 4 * (text_mb + 1)}MB'")
    if new_run:
        con.execute("insert into runs (run) values (?) on conflict do nothing", [run])
    base_ns = to_int(fields.get("baseTimeNanoseconds"))
    con.execute(
        """
        insert into traces (trace_id, run, path, content_digest, size_bytes, rank_source, file_rank, world_size,
            backend, schema_version, base_time_ns, display_time_unit, trace_name, header, step_marker, devices,
            gpu_model, n_events, n_gpu_events, n_host_events, n_dropped, parse_seconds)
        values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        """,
        [
            trace_id, run, str(path.resolve()), digest, size, rank_source, file_rank,
            to_int(dist.get("world_size")), _text(dist.get("backend")), to_int(fields.get("schemaVersion")), base_ns,
            _text(fields.get("displayTimeUnit")), _text(fields.get("traceName")), header,
            marker.pattern, devices_json, gpu_model_of(con, trace_id, devices),
            counts.events, counts.gpu, counts.host, counts.dropped, seconds,
        ],
    )
    result = FileResult(str(path), "ingested", trace_id=trace_id, run=run, events=counts.events, gpu_events=counts.gpu)
    return Stored(trace_id, path, run, rank_source, file_rank, base_ns, result)


def replace(con: Any, path: Path, digest: str, held: dict[str, tuple[str, str]], run: str | None) -> tuple[list[str], list[str]]:
    """Remove the trace(s) of this file's content, or of this file (its path: written again since,
    with other content), in the file's transaction (``force``; ``held``: the digests of files of its
    size in the warehouse; ``run``: the run it goes to). Returns a note for each, and the runs left
    without traces, removed too (as `traceq runs rm` would)."""
    digests = {digest} | ({stored} if (stored := stored_digest(path, digest, held)) else set())
    earlier = con.execute(
        "select trace_id, run from traces where content_digest in (select unnest(?)) or path = ? order by trace_id",
        [sorted(digests), str(path.resolve())],
    ).fetchall()
    remove_traces(con, [trace_id for trace_id, _ in earlier])
    emptied = [r for (r,) in con.execute(
        "select run from runs where run in (select unnest(?)) and run <> ? and run not in (select run from traces)",
        [sorted({r for _, r in earlier}), run],
    ).fetchall()]
    for r in emptied:
        forget_run(con, r)
    return [f"{path}: ingested again; its earlier trace in run {r} is replaced"
            + (f" (run {r} had no other trace and is removed)" if r in emptied else "") for _, r in earlier], emptied


def _text(value: object) -> str | None:
    return None if value is None else str(value)
