"""What the SQL derives once a transaction holds a group's files (:func:`derive`): their steps, step
attribution, side files and wall-clock windows, and the refusal of a run that would hold a step twice;
a rank for a file that names none (:func:`free_rank`); the CPU operators of a GPU trace written before
it showed GPU activity, deleted (:func:`drop_plain_ops`); DuckDB's buffer pool while ingesting."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from traceq.catalog import StepMarker, event_categories
from traceq.errors import TraceFormatError
from traceq.identity import GIVEN_RANKS, Claim, next_rankless, refuse_overlap
from traceq.ingest.sidecar import load_side_files, side_value_notes, write_wall_times
from traceq.query import params_of, sql_text
from traceq.store.derive import check_step_marker, write_steps
from traceq.store.schema import fetch_one

from traceq.ingest.results import FileResult

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
class Stored:
    """A trace whose rows are in the open transaction, its steps not derived yet (:func:`derive`)."""

    trace_id: int
    path: Path
    run: str
    rank_source: str
    file_rank: int | None
    base_ns: int | None  # baseTimeNanoseconds
    result: FileResult


def derive(con: Any, stored: list[Stored], marker: StepMarker) -> None:
    """The steps of the traces ``stored`` (consecutive ids), their device events' steps, their side
    files, their steps' wall-clock windows and their results' ranks: one statement each, whatever the
    number of traces (but the side files). ConfigError when a run would hold a step twice
    (:func:`_refuse_rank_collisions`); TraceFormatError for a side file or a clock offset that is
    not one."""
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
