"""What goes into the warehouse for one file besides its rows (which :func:`traceq.ingest.native.write_parts`
writes, whichever parser read them): the counts of its events, the policy on CPU operators, its rank, its
``traces`` row, and its steps, step attribution and side files derived in SQL once its transaction holds it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from traceq.catalog import StepMarker, event_categories
from traceq.errors import TraceFormatError
from traceq.identity import GIVEN_RANKS, Claim, next_rankless, refuse_overlap
from traceq.ingest.native import BatchCounts
from traceq.ingest.identity import MAX_RANK, rank_of_file
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


# A file is refused once it has read this many events and more than MAX_UNUSABLE_SHARE of them are none traceq
# stores or leaves out by its policy (CPU operators of a GPU trace): checked after every batch, wherever the
# unusable events sit (the corpus's largest share is 0.89, of a 75-event trace; 0.57 over 250 events or more)
UNUSABLE_EVENTS = 1_000_000
MAX_UNUSABLE_SHARE = 0.99


@dataclass
class Counts:
    """Running totals over a file's chunks."""

    events: int = 0
    gpu: int = 0
    host: int = 0
    dropped: int = 0
    dropped_plain_ops: int = 0  # of dropped, CPU operators kept only because all_ops
    rows_with_rank: int = 0  # events carrying their own args.rank
    rows_without_rank: int = 0
    skipped_ops: int = 0  # CPU operators left out while decoding (all_ops=False)
    left_out: int = 0  # events left out by policy: skipped_ops, and CPU operators written after GPU activity
    kept_ops: bool = False  # some chunk was written with all_ops=True

    def require_usable(self, path: Path) -> None:
        """TraceFormatError once :data:`UNUSABLE_EVENTS` events are read and more than :data:`MAX_UNUSABLE_SHARE`
        of them are not stored (a gzip of ``{}`` by the hundred million, one kernel first or every 2M, a
        few MB): the file is not read to its end, nor kept."""
        unusable = self.events - self.gpu - self.host - self.left_out
        if self.events >= UNUSABLE_EVENTS and unusable > MAX_UNUSABLE_SHARE * self.events:
            raise TraceFormatError(
                f"{path}: {unusable:,} of its first {self.events:,} events are none that traceq stores (it stores "
                'complete events, "ph": "X", with a valid time and duration; not elements without a phase, nor '
                f"metadata, flow, instant or counter events): with over {MAX_UNUSABLE_SHARE:.0%} unusable it is no profiler trace; "
                "nothing was stored. Check that it is the file the profiler wrote")

    def add_batch(self, b: BatchCounts, all_ops: bool) -> None:
        """Count a batch written with its CPU operators (``all_ops``) or without."""
        self.events += b.events
        self.gpu += b.gpu
        self.host += b.host - (0 if all_ops else b.host_plain_ops)
        self.dropped += b.dropped - (0 if all_ops else b.dropped_plain_ops)
        self.dropped_plain_ops += b.dropped_plain_ops if all_ops else 0
        self.skipped_ops += b.skipped_ops
        self.left_out += b.skipped_ops + (0 if all_ops else b.host_plain_ops + b.dropped_plain_ops)
        self.kept_ops = self.kept_ops or all_ops
        self.rows_without_rank += b.rows_without_rank
        self.rows_with_rank += b.rows_with_rank


def all_ops_of(leading: dict[str, Any], forced: bool | None = None) -> bool:
    """Whether a file's batches are parsed with every CPU operator, from its header (``forced``: as
    given). CPU operators are most of a trace's events, yet on a trace with GPU activity no metric
    reads them (:func:`traceq.ingest.decode.events_to_rows`): a file is parsed without them when its
    header has ``deviceProperties`` (Kineto writes it before the events on CUDA/ROCm machines). One
    without them that shows no GPU activity after all is read again with them (:class:`NeedsOps`); one
    with them that shows GPU activity writes none from its first batch with GPU rows on, and those
    written before go once its events are in (:func:`drop_plain_ops`)."""
    return not leading.get("deviceProperties") if forced is None else forced


class NeedsOps(Exception):
    """A file parsed without CPU operators turned out to have no GPU activity: read it again."""


def require_events(path: Path, counts: Counts) -> None:
    """TraceFormatError for a file without events, or whose events are mostly unusable (:meth:`Counts.require_usable`)."""
    if counts.events == 0:
        raise TraceFormatError(f"{path}: the trace holds no events; was the profiler started (schedule active > 0)?")
    counts.require_usable(path)


def rank_of(
    path: Path, fields: dict[str, Any], option_rank: int | None, counts: Counts, notes: list[str]
) -> tuple[int | None, str]:
    """The file's rank and where it came from (:func:`rank_of_file`; 'event args' when its events name
    ranks). A distributedInfo.rank that is no rank is passed over with a line in ``notes``, never silently."""
    file_rank, source = rank_of_file(path, fields, option_rank)
    if source == "distributedInfo":
        return file_rank, source
    source = "event args" if counts.rows_with_rank else source
    dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
    if dist.get("rank") is not None:
        instead = {"option": "the rank given is used", "file name": "the rank in the file name is used",
                   "event args": "the ranks in the event args are used"}.get(source, "the file gets a rank of its own")
        notes.append(f"{path}: distributedInfo.rank {json.dumps(dist.get('rank'))[:40]} is not a rank "
                     f"(0 to {MAX_RANK}): passed over, {instead}")
    return file_rank, source


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
