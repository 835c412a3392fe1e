"""Load Kineto trace files into the warehouse: each file all or nothing, idempotent by content hash.

A file is cut into chunks of whole events by :mod:`traceq.ingest.reader` (in a thread, one batch ahead)
and parsed by DuckDB's JSON reader on every core, straight into the warehouse (:mod:`traceq.ingest.native`).
Where DuckDB would read a file differently from :mod:`traceq.ingest.decode` (the typed msgspec reference),
the transaction is rolled back and the file is decoded by :mod:`traceq.ingest.decode` in this process; the
file's result says so in its message. Files are written one at a time, in the order given; with
several, the reading thread goes on to the next file's batches while this one's are written, its
steps attributed and its transaction committed (:class:`_ReadAhead`). A large file is one
transaction; small files are written several to a transaction, their steps derived together
(:class:`_Together`), and a file that fails among them has the others ingested one by one: a failed
file leaves nothing behind either way.

What keeps memory flat whatever the trace size (benchmarks/bench_scale.py measures it):
one batch of chunks in flight (plus the one being read); DuckDB's buffer pool is capped
(:data:`INGEST_MEMORY_LIMIT`: appended row groups go to the file as they fill); ranks from
``distributedInfo`` are filled in as rows go in, not by an UPDATE afterwards. Nothing process-wide
is changed (no GC thresholds, no glibc settings: measured, neither pays any more, BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import msgspec

from traceq import scratch
from traceq.catalog import WHOLE_TRACE_STEP, StepMarker, check_parallelism, event_categories
from traceq.errors import ConfigError, TraceFormatError, TraceqError
from traceq.ingest.inputs import check_run_name, expand_inputs, file_size, json_size, run_name_of
from traceq.ingest.native import (
    BatchCounts,
    BatchFiles,
    NOT_THE_FILE,
    NotNative,
    Part,
    batch_files,
    count_batches,
    parse_batch,
    parse_batches,
    parser,
    prefetch,
    rows_of,
    scratch_dir,
    write_parts,
)
from traceq.ingest.reader import (
    FileRange,
    TraceHeader,
    digest_in,
    file_digest,
    read_trace,
    read_trace_ranges,
    too_deep_is_not_json,
)
from traceq.ingest.identity import (
    MAX_RANK,
    check_rank,
    distributed_rank,
    names_job,
    no_rank_note,
    rank_of_file,
    run_of,
)
from traceq.ingest.sidecar import load_side_files, write_wall_times
from traceq.interrupts import interruptible, is_interrupt
from traceq.kineto import to_int
from traceq.query import params_of, sql_text
from traceq.store.derive import check_step_marker, device_properties, gpu_model_of, write_steps
from traceq.store.manage import forget_run, remove_traces
from traceq.store.schema import execute_over, fetch_one, rollback
from traceq.store.warehouse import DEFAULT_DB, connect, environment_error

if TYPE_CHECKING:  # the decode path imports them when it runs: the fast path needs neither
    import numpy as np
    import pyarrow as pa

    from traceq.ingest.decode import ChunkTables

# Chunks the reader cuts a file into (bytes of JSON); traceq.ingest.native parses several per statement.
INGEST_CHUNK_BYTES = 8 << 20
MIN_CHUNK_BYTES = 1 << 20
# DuckDB's buffer pool while ingesting: room for a batch's parse beside the one being written; row
# groups go to the file as they fill. 1.5 GB traces, 96 MB batches: 225-310 MiB peak RSS at 160 MB,
# 278-385 MiB at 384 MB, for 0-10 % more time (three trace shapes, BENCHMARKS.md, issue 23).
INGEST_MEMORY_LIMIT_MB = 160
INGEST_MEMORY_LIMIT = f"{INGEST_MEMORY_LIMIT_MB}MB"

Progress = Callable[[str, dict[str, Any]], None]
Chunk = TypeVar("Chunk", bytes, FileRange)


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


@dataclass
class IngestSummary:
    """Per-file results of one :func:`ingest_traces` call."""

    files: list[FileResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the inputs: entries of a directory passed over

    def by_status(self, status: str) -> list[FileResult]:
        return [f for f in self.files if f.status == status]

    @property
    def ok(self) -> bool:
        return not self.by_status("failed")


def ingest_traces(
    inputs: Iterable[str | Path],
    db: str | Path = DEFAULT_DB,
    *,
    name: str | None = None,
    rank: int | None = None,
    threads: int | None = None,
    chunk_bytes: int = INGEST_CHUNK_BYTES,
    progress: Progress | None = None,
    native: bool = True,
    step_marker: str | None = None,
    force: bool = False,
) -> IngestSummary:
    """Ingest trace files into the warehouse at ``db``.

    Args:
        inputs: files, globs or directories.
        db: DuckDB warehouse path (created if missing).
        name: the name of the run every file goes to (default: each file's parent directory name; a file that
            names no rank and no job is a run of its own, <directory>/<file>: traceq.ingest.identity).
        rank: rank for files that name none (no distributedInfo.rank, no per-event rank).
        threads: DuckDB threads that parse (default: one per CPU; 1 to 4 per CPU).
        chunk_bytes: size of the event chunks the file is cut into (bytes of JSON).
        progress: called as ``progress(event, info)`` for "start", "bytes", "file_read" and "done".
        native: parse with DuckDB where it reads a file the same (:mod:`traceq.ingest.native`); False
            decodes every file with :mod:`traceq.ingest.decode` (the reference the tests compare with).
        step_marker: regular expression naming the steps (default ``ProfilerStep#N``), e.g.
            ``^step\[DECODE`` (see :class:`traceq.catalog.StepMarker`).
        force: ingest files whose content is in the warehouse already: each one's earlier trace is
            removed in the same transaction (to put it under another run, or read it again).

    A file that fails leaves nothing behind; the others still ingest (an error that is not about
    one file, such as a full disk, stops the ingest; the files before it are in). Re-ingesting a file whose
    content is already in the warehouse is a no-op reported as skipped. A file that names no rank
    gets a rank of its own in its run (-1, -2, ...; noted in its result). A file is refused when its
    run already holds a step of one of its ranks (the same trace twice, or two jobs in one run).
    """
    marker = StepMarker.parse(step_marker)
    check_rank(rank)
    check_parallelism(threads, "threads")
    run = name if name is None else check_run_name(name, "name")
    summary = IngestSummary()
    paths = expand_inputs(inputs, summary.notes)
    unnamed = [not_utf8(path) for path in paths]
    summary.files += [result for result in unnamed if result is not None]
    paths = [path for path, result in zip(paths, unnamed) if result is None]
    notify = progress or (lambda event, info: None)
    with interruptible():  # Ctrl-C stops the ingest, whatever it landed in
        con = connect(db)
        try:
            con.execute(f"set memory_limit = '{INGEST_MEMORY_LIMIT}'")
            # row order within a table means nothing to traceq; keeping it would make DuckDB parse the
            # JSON on one thread within this memory limit
            con.execute("set preserve_insertion_order = false")
            con.execute(f"set threads = {(os.cpu_count() or 1) if threads is None else threads}")
            check_marker(con, marker)
            loader = _Loader(con, run, rank, chunk_bytes, notify, native, marker, force=force)
        except BaseException:
            con.close()
            raise
        try:
            notify("start", {"files": len(paths), "bytes": sum(file_size(p) for p in paths)})
            # closed here, whatever stops the loop (Ctrl-C between two results, a progress callback that
            # raises): its reading thread is joined now, not when the generator is collected, and makes
            # no scratch directory after loader.close() removed them
            with closing(loader.load(paths)) as results:
                for result in results:
                    summary.files.append(result)
                    notify("done", {"result": result})
        finally:
            loader.close()
            con.close()
    return summary


class _Names:
    """File-level interning of event names; maps each chunk's local ids to file ids."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def remap(self, chunk_names: list[str]) -> np.ndarray:
        import numpy as np

        ids = self.ids
        return np.fromiter((ids.setdefault(n, len(ids)) for n in chunk_names), dtype=np.int32, count=len(chunk_names))

    def table(self) -> pa.Table:
        import pyarrow as pa

        return pa.table({"name_id": pa.array(range(len(self.ids)), pa.int32()), "name": list(self.ids)})


def _remapped(table: pa.Table, remap: np.ndarray) -> pa.Table:
    import pyarrow as pa

    if table.num_rows == 0:
        return table
    ids = table.column("name_id").to_numpy()
    return table.set_column(table.schema.get_field_index("name_id"), "name_id", pa.array(remap[ids]))


# events read with nothing stored, after which a file is not read on (real traces store their first events)
UNUSABLE_EVENTS = 1_000_000


@dataclass
class _Counts:
    """Running totals over a file's chunks."""

    events: int = 0
    gpu: int = 0
    host: int = 0
    dropped: int = 0
    dropped_plain_ops: int = 0  # of dropped, CPU operators kept only because all_ops
    rows_with_rank: int = 0  # events carrying their own args.rank
    rows_without_rank: int = 0
    skipped_ops: int = 0  # CPU operators left out while decoding (all_ops=False)
    kept_ops: bool = False  # some chunk was written with all_ops=True

    def require_usable(self, path: Path) -> None:
        """TraceFormatError once :data:`UNUSABLE_EVENTS` events are read and not one of them is stored: a
        file of events without content (``{}`` by the hundred million, a few KB of gzip) is not read to
        its end."""
        if self.events >= UNUSABLE_EVENTS and not (self.gpu or self.host):
            raise TraceFormatError(f"{path}: its first {self.events:,} events hold nothing a trace event holds "
                                   "(no phase, name, time or category): not a profiler trace; nothing was stored")

    def add_batch(self, b: BatchCounts, all_ops: bool) -> None:
        """Count a batch written with its CPU operators (``all_ops``) or without."""
        self.events += b.events
        self.gpu += b.gpu
        self.host += b.host - (0 if all_ops else b.host_plain_ops)
        self.dropped += b.dropped - (0 if all_ops else b.dropped_plain_ops)
        self.dropped_plain_ops += b.dropped_plain_ops if all_ops else 0
        self.skipped_ops += b.skipped_ops
        self.kept_ops = self.kept_ops or all_ops
        self.rows_without_rank += b.rows_without_rank
        self.rows_with_rank += b.rows_with_rank

    def add(self, ct: ChunkTables, all_ops: bool) -> None:
        self.events += ct.counts.get("events", 0)
        self.gpu += ct.counts.get("gpu", 0)
        self.host += ct.counts.get("host", 0)
        self.dropped += ct.counts.get("dropped", 0)
        self.dropped_plain_ops += ct.counts.get("dropped_plain_ops", 0)
        self.skipped_ops += ct.counts.get("skipped_ops", 0)
        self.kept_ops = self.kept_ops or all_ops
        for t in (ct.gpu, ct.host, ct.meta):
            self.rows_without_rank += t.column("rank").null_count
        for t in (ct.gpu, ct.host):
            self.rows_with_rank += t.num_rows - t.column("rank").null_count


class OpsPolicy:
    """Whether the chunks of one file are decoded with every CPU operator (``all_ops``).

    CPU operators are most of a trace's events, yet on a trace with GPU activity no metric reads
    them (:func:`traceq.ingest.decode.events_to_tables`). A file starts without them when its header has
    ``deviceProperties`` (Kineto writes it before the events on CUDA/ROCm machines) and switches to
    without them once a chunk shows GPU activity. A batch parsed with them before is written without
    them after the switch; ops written before it are deleted if the file has GPU activity
    (:func:`_drop_plain_ops`), and a file that was decoded
    without them and shows no GPU activity after all is decoded again with them (:class:`_NeedsOps`).

    The writer switches it (:meth:`saw`) while the reader thread cuts and parses by it: both go
    through a lock.
    """

    def __init__(self, leading: dict[str, Any], marker: StepMarker, all_ops: bool | None = None) -> None:
        self._all_ops = not leading.get("deviceProperties") if all_ops is None else all_ops
        self.fixed = all_ops is not None
        self.marker = marker  # operators that are steps are always kept
        self._lock = threading.Lock()

    @property
    def all_ops(self) -> bool:
        with self._lock:
            return self._all_ops

    def saw(self, gpu_rows: int) -> None:
        if gpu_rows and not self.fixed:
            with self._lock:
                self._all_ops = False

    def undecided(self) -> bool:
        """Whether the file may still switch to without CPU operators."""
        with self._lock:
            return self._all_ops and not self.fixed


class _NeedsOps(Exception):
    """A file decoded without CPU operators turned out to have no GPU activity: decode it again."""


def _with_rank(table: pa.Table, rank: int | None) -> pa.Table:
    """``table`` with a null rank (the event named none) set to ``rank``."""
    if rank is None or table.column("rank").null_count == 0:
        return table
    import pyarrow as pa
    import pyarrow.compute as pc

    filled = pc.fill_null(table.column("rank"), pa.scalar(rank, pa.int64()))
    return table.set_column(table.schema.get_field_index("rank"), "rank", filled)


def _require_events(path: Path, counts: _Counts) -> None:
    if counts.events == 0:
        raise TraceFormatError(f"{path}: the trace holds no events; was the profiler started (schedule active > 0)?")


def _rank_of(
    path: Path, fields: dict[str, Any], option_rank: int | None, counts: _Counts, notes: list[str]
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


# ---------------------------------------------------------------------------------------------
# writing (main process only)


def check_marker(con: Any, marker: StepMarker) -> None:
    """ConfigError when DuckDB's regular expressions (RE2) cannot read ``marker``."""
    try:
        con.execute("select regexp_matches('', ?)", [marker.pattern])
    except duckdb.Error as exc:
        raise ConfigError(f"not a regular expression DuckDB reads (RE2): {str(exc).splitlines()[0]}",
                          param="step_marker", value=marker.pattern) from None


@dataclass
class _Stored:
    """A trace whose rows are in the open transaction, its steps not derived yet (:func:`_derive`)."""

    trace_id: int
    path: Path
    run: str
    rank_source: str
    file_rank: int | None
    base_ns: int | None  # baseTimeNanoseconds
    result: FileResult


def _finish_trace(
    con: Any,
    path: Path,
    trace_id: int,
    run_name: str,
    digest: str,
    size: int,
    fields: dict[str, Any],
    counts: _Counts,
    file_rank: int | None,
    rank_source: str,
    parse_seconds: float,
    marker: StepMarker,
    new_run: bool,
) -> _Stored:
    """After the events are in: the traces row. Its steps and side files come with :func:`_derive`.
    ``new_run``: the run may not be in the warehouse yet."""
    if counts.gpu and counts.kept_ops:
        # the CPU operators read before the policy switched go, and so do their drops: which
        # batches kept them depends on when the switch happened (the reader parses ahead)
        params = {"trace_id": trace_id, **event_categories().sql_params(), **marker.sql_params()}
        counts.host -= _drop_plain_ops(con, params)
        counts.dropped -= counts.dropped_plain_ops
    dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
    devices = device_properties(fields.get("deviceProperties"))
    header = msgspec.json.encode(_header_summary(fields)).decode()
    devices_json = msgspec.json.encode(devices).decode() if devices else None
    _room_for(con, len(header) + len(devices_json or ""))
    if new_run:
        con.execute("insert into runs (run) values (?) on conflict do nothing", [run_name])
    base_ns = to_int(fields.get("baseTimeNanoseconds"))
    con.execute(
        """
        insert into traces (trace_id, run, path, content_digest, size_bytes, rank_source, file_rank, world_size,
            backend, schema_version, base_time_ns, display_time_unit, trace_name, header, step_marker, devices,
            gpu_model, n_events, n_gpu_events, n_host_events, n_dropped, parse_seconds)
        values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        """,
        [
            trace_id, run_name, str(path.resolve()), digest, size, rank_source, file_rank,
            to_int(dist.get("world_size")), _text(dist.get("backend")), to_int(fields.get("schemaVersion")),
            base_ns, _text(fields.get("displayTimeUnit")),
            _text(fields.get("traceName")), header, marker.pattern, devices_json, gpu_model_of(con, trace_id, devices),
            counts.events, counts.gpu, counts.host, counts.dropped, parse_seconds,
        ],
    )
    result = FileResult(str(path), "ingested", trace_id=trace_id, run=run_name, events=counts.events, gpu_events=counts.gpu)
    return _Stored(trace_id, path, run_name, rank_source, file_rank, base_ns, result)


def _derive(con: Any, stored: list[_Stored], marker: StepMarker) -> None:
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


def _room_for(con: Any, text_bytes: int) -> None:
    """Raise the ingest's buffer pool (until another file's header needs another) where a trace's
    header text is large: storing and compressing 80 MB of it takes buffers of 128 MB, beyond
    :data:`INGEST_MEMORY_LIMIT` (a deviceProperties name of 40 MB, tests/test_hostile.py)."""
    if text_bytes >= 1 << 20:
        con.execute(f"set memory_limit = '{INGEST_MEMORY_LIMIT_MB + 4 * ((text_bytes >> 20) + 1)}MB'")


def _refuse_rank_collisions(con: Any, stored: list[_Stored]) -> None:
    """ConfigError when the run of a trace ``stored`` already holds a step of one of its ranks from
    another trace: (run, rank, step) comes from one file, so that no step is counted twice (the same
    trace as .json and .json.gz, or two jobs in one run). Files of one rank with other steps (the
    collectors' profiling cycles) are fine."""
    clash = fetch_one(
        con,
        """
        select mine.trace_id, s.rank, any_value(t.path), count(*), min(s.step), max(s.step)
        from steps as mine
        inner join traces as m on m.trace_id = mine.trace_id
        inner join steps as s on s.rank = mine.rank and s.step = mine.step and s.trace_id <> mine.trace_id
        inner join traces as t on t.trace_id = s.trace_id and t.run = m.run
        where mine.trace_id between $first and $last
        group by mine.trace_id, s.rank
        order by mine.trace_id, s.rank
        limit 1
        """,
        {"first": stored[0].trace_id, "last": stored[-1].trace_id},
    )
    if clash is None:
        return
    trace_id, rank, other, n, lo, hi = clash
    mine = next(s for s in stored if s.trace_id == trace_id)
    held = "the whole timeline (no steps)" if lo == hi == WHOLE_TRACE_STEP else (
        f"step {lo}" if n == 1 else f"steps {lo}..{hi}" if hi - lo + 1 == n else f"{n} steps in {lo}..{hi}")
    fix = "ingest it under another run (--name NAME)"
    if mine.rank_source in ("option", "file name"):
        fix += " or give it another rank (--rank N)"
    raise ConfigError(
        f"{mine.path}: run {mine.run} already holds {held} of rank {rank} from {other}; "
        f"the same trace twice, or traces of two jobs in one run? {fix[0].upper()}{fix[1:]}"
    )


def free_rank(con: Any, run: str) -> int:
    """The rank for a file that names none: -1, -2, ... the first negative rank not held in ``run``."""
    return fetch_one(
        con,
        "select least(coalesce(min(s.rank), 0), 0) - 1 from steps as s inner join traces as t using (trace_id) "
        "where t.run = ? and s.rank < 0",
        [run],
    )[0]


def _drop_plain_ops(con: Any, params: dict[str, Any]) -> int:
    """Delete the CPU operators read before :class:`OpsPolicy` switched (``sql/plain_ops.sql``);
    returns how many."""
    statement = f"delete from host_events where rowid in (select rid from ({sql_text('plain_ops.sql')}))"
    return con.execute(statement, params_of(statement, params)).fetchall()[0][0]


def ingest_in_process(
    con: Any, path: Path, *, run: str | None = None, rank: int | None = None, chunk_bytes: int = INGEST_CHUNK_BYTES,
    step_marker: str | None = None, rank_if_none: int | None = None,
) -> FileResult:
    """Ingest one file into the open warehouse ``con`` (one transaction).

    The trace id comes from the warehouse's ``trace_ids`` sequence. ``rank_if_none``: the (negative)
    rank the file gets if it names none, where ``con`` cannot tell which are free (a cluster task's
    private warehouse); by default the first free one in its run.
    """
    marker = StepMarker.parse(step_marker)
    check_marker(con, marker)
    loader = _Loader(con, run, rank, chunk_bytes, lambda event, info: None, marker=marker, rank_if_none=rank_if_none)
    try:
        return next(loader.load([path]))
    finally:
        loader.close()


class _Loader:
    """Writes each file all or nothing, in input order: parsed by DuckDB (:mod:`traceq.ingest.native`),
    else decoded by :mod:`traceq.ingest.decode`."""

    def __init__(
        self, con: Any, run: str | None, rank: int | None, chunk_bytes: int, notify: Progress, native: bool = True,
        marker: StepMarker = StepMarker(), rank_if_none: int | None = None, force: bool = False,
    ) -> None:
        self.con = con
        self.force = force
        self.native = native
        self.marker = marker
        self.rank_if_none = rank_if_none
        self.run = run
        self.rank = rank
        self.chunk_bytes = chunk_bytes
        self.notify = _once_per_file(notify)
        self.threads = con.execute("select current_setting('threads')").fetchall()[0][0]
        self.hasher = ThreadPoolExecutor(1, thread_name_prefix="traceq-hash")  # BLAKE3 releases the GIL
        # a file is hashed before it is read only when a file of its size is already in the
        # warehouse (else the hash is taken beside the parsing)
        self.known = _KnownDigests(con.execute("select size_bytes, content_digest from traces").fetchall())
        self.runs = {r for (r,) in con.execute("select run from runs").fetchall()}  # as of the last commit
        self.pending: list[_Stored] = []  # stored in the open transaction, steps not derived yet
        self.uncommitted: list[tuple[int, str]] = []  # (size, digest) of the files the open transaction holds
        self._cursor: Any = None
        self._scratch: list[scratch.ScratchDir] = []  # every scratch directory made, removed by close()
        self._scratch_lock = threading.Lock()  # the reader thread makes them too
        self.listed: dict[str, tuple[int, ...] | None] = {}  # each file as it was before any was read

    def changed(self, path: Path) -> str | None:
        """Why ``path`` is not the file it was when the ingest listed it (device, inode, size, mtime), or
        None: a file rewritten while it was read would be stored mixed, under a digest of neither."""
        if self.listed.get(str(path)) == _identity(path):
            return None
        return (f"{path}: the file changed while traceq read it (written, replaced or removed): nothing of it "
                "was stored; ingest it again once it is complete")

    def close(self) -> None:
        """Stop the hashing thread, close the parse cursor and remove every scratch directory this
        loader made: each is removed as soon as its file is done, and here again whatever happened
        in between (an interrupt between two statements hands a directory to no one). The reader
        threads have ended by now (their consumers join them before they return)."""
        self.hasher.shutdown(cancel_futures=True)
        if self._cursor is not None:
            self._cursor.close()
        with self._scratch_lock:
            made, self._scratch = self._scratch, []
        for directory in made:
            directory.cleanup()

    def scratch_dir(self) -> scratch.ScratchDir:
        """A scratch directory for a file's batches (:func:`traceq.ingest.native.scratch_dir`), removed
        by :meth:`close` at the latest."""
        directory = scratch_dir()
        with self._scratch_lock:
            self._scratch.append(directory)
        return directory

    def _parse_cursor(self) -> Any:
        """The cursor batches are parsed on (:func:`traceq.ingest.native.parser`), made once: every file's
        reader thread has finished before the next file's starts."""
        if self._cursor is None:
            self._cursor = parser(self.con)
        return self._cursor

    def load(self, paths: list[Path]) -> Iterator[FileResult]:
        """Ingest ``paths``, yielding each file's result in input order.

        With several files, a thread parses ahead across file boundaries (:class:`_ReadAhead`): the
        next file's first batch is parsed while this one's rows are written, its steps attributed and
        its transaction committed. Small files are written several to a transaction (:class:`_Together`):
        many small rank files are otherwise bound by the statements each file's steps take.
        """
        self.listed.update((str(p), _identity(p)) for p in paths)
        if not self.native or len(paths) < 2:
            for path in paths:
                yield self._load(path)
            return
        with closing(_ReadAhead(self, paths)) as ahead, closing(_Together(self)) as together:
            for path in paths:
                try:
                    parse, digest = ahead.next_file(path)
                except TraceqError as exc:  # it could not be opened or hashed
                    yield from together.commit()
                    yield FileResult(str(path), "failed", str(exc))
                    continue
                try:
                    if parse is not None and together.takes(parse.json_bytes):
                        taken, parse = parse, None  # together closes it
                        yield from together.add(path, taken, digest)
                    else:
                        yield from together.commit()
                        yield self._load(path, parse, digest)
                finally:
                    if parse is not None:
                        parse.close()
            yield from together.commit()

    def _already(self, path: Path, digest: str) -> FileResult | None:
        if self.force:  # read again; its earlier trace goes in the same transaction (_replace)
            return None
        known = self.con.execute("select path, run from traces where content_digest = ?", [digest]).fetchall()
        if not known:
            return None
        self.notify("bytes", {"bytes": file_size(path), "path": str(path)})
        return FileResult(str(path), "skipped", f"{path}: already ingested (as {known[0][0]}, run {known[0][1]}); "
                          "--force reads it again", run=known[0][1])

    def _replace(self, path: Path, digest: str, size: int) -> list[str]:
        """Remove the trace(s) of this file's content, or of this file (its path: written again since,
        with other content), in the file's transaction (``force``); a note for each."""
        digests = {digest} | ({stored} if (stored := _stored_digest(path, digest, self.known.of_size(size))) else set())
        earlier = self.con.execute(
            "select trace_id, run from traces where content_digest in (select unnest(?)) or path = ? order by trace_id",
            [sorted(digests), str(path.resolve())],
        ).fetchall()
        remove_traces(self.con, [trace_id for trace_id, _ in earlier])
        target = run_name_of(path, self.run)
        emptied = [r for (r,) in self.con.execute(
            "select run from runs where run in (select unnest(?)) and run <> ? and run not in (select run from traces)",
            [sorted({run for _, run in earlier}), target],
        ).fetchall()]
        for run in emptied:  # a run left without traces goes, as `traceq runs rm` would remove it
            forget_run(self.con, run)
            self.runs.discard(run)
        return [f"{path}: ingested again; its earlier trace in run {run} is replaced"
                + (f" (run {run} had no other trace and is removed)" if run in emptied else "") for _, run in earlier]

    def _load(self, path: Path, parse: _FileParse | None = None, taken_digest: str | None = None) -> FileResult:
        """Ingest one file in a transaction of its own; ``parse``: its batches parsed ahead
        (:class:`_ReadAhead`), else it is read here; ``taken_digest``: its digest, where the reader
        took it already."""
        started = time.perf_counter()
        ready = self._before_reading(path, taken_digest)
        if isinstance(ready, FileResult):
            return ready
        size, digest = ready
        try:
            with too_deep_is_not_json(path):
                result = self._in_transaction(path, digest, size, parse)
        except TraceqError as exc:
            return FileResult(str(path), "failed", str(exc))
        except NOT_THE_FILE as exc:  # out of memory, a full disk: this file is not in, nothing of it
            return FileResult(str(path), "failed", f"{path}: {environment_error(exc) or str(exc).splitlines()[0]}")
        result.seconds = time.perf_counter() - started
        return result

    def _before_reading(self, path: Path, taken_digest: str | None) -> tuple[int, _Digest] | FileResult:
        """``path``'s size and digest (taken now where a file of its size is in the warehouse, else
        beside the parse); its result instead where it is not to be read (it is in the warehouse
        already, or names no run)."""
        size = file_size(path)
        try:
            run_name_of(path, self.run)  # a directory name that cannot name a run fails before the work
            known = self.known.of_size(size)
            if not known:
                return size, _Digest.beside(self.hasher, path)
            digest = _Digest.taken(taken_digest or file_digest(path))
            skipped = self._already(path, _stored_digest(path, digest.value(), known) or digest.value())
        except TraceqError as exc:
            return FileResult(str(path), "failed", str(exc))
        return (size, digest) if skipped is None else skipped

    def _in_transaction(
        self, path: Path, digest: _Digest, size: int, parse: _FileParse | None = None
    ) -> FileResult:
        """Read ``path`` in one transaction: with DuckDB, else (:class:`NotNative`) roll back and
        decode with :mod:`traceq.ingest.decode`; on :class:`_NeedsOps` roll back and read again with every
        CPU operator. ``parse`` (batches parsed ahead) serves the first reading only."""
        con = self.con
        native, all_ops, reason = self.native, None, "native=False"
        while True:
            con.begin()
            try:
                if native:
                    ahead, parse = parse, None
                    result = self._native(path, digest, size, all_ops, ahead)
                else:
                    result = self._chunked(path, digest, size, all_ops)
                self.derive_pending()
            except NotNative as why:
                self._roll_back()
                native, reason = False, str(why)
                continue
            except _NeedsOps:
                self._roll_back()
                all_ops = True
                continue
            except BaseException:
                self._roll_back()
                raise
            if result.status == "skipped":
                self._roll_back()
            elif why := self.changed(path):
                self._roll_back()
                return FileResult(str(path), "failed", why)
            else:
                con.commit()
                self.committed([(size, digest.value())], [result.run])
                if not native:
                    result.message = f"read by traceq.ingest.decode: {reason}"
            return result

    def committed(self, files: Iterable[tuple[int, str]], runs: Iterable[str]) -> None:
        """A transaction stored ``files`` (their size and digest: a copy of one is skipped from now
        on) in ``runs``."""
        for size, digest in files:
            self.known.add(size, digest)
        self.runs.update(runs)
        self.uncommitted.clear()

    def _roll_back(self) -> None:
        """Roll back the open transaction, and forget what it stored."""
        self.pending.clear()
        self.uncommitted.clear()
        rollback(self.con)

    def chunk_bytes_for(self, json_bytes: int) -> int:
        """The chunk size for ``path``: a small file is cut finer, so that DuckDB still parses it on
        every thread."""
        return min(self.chunk_bytes, max(MIN_CHUNK_BYTES, json_bytes // (2 * self.threads)))

    def _native(
        self, path: Path, digest: _Digest, size: int, all_ops: bool | None = None,
        parse: _FileParse | None = None,
    ) -> FileResult:
        """Parse ``path`` with DuckDB, batch by batch (:mod:`traceq.ingest.native`), or take the batches
        parsed ahead (``parse``)."""
        con = self.con
        parse_start = time.perf_counter()
        trace_id = self._next_trace_id()
        with closing(parse or self._parse_file(path, size, all_ops)) as parsed:
            header, policy = parsed.header, parsed.policy
            fill = _leading_rank(header)
            counts = _Counts()
            n_names = 0
            # a batch parsed before the policy switched holds its CPU operators: written without
            # them once the trace showed device activity, else with them (deleted at the end if it
            # shows some later, _drop_plain_ops); parsing it again cost more (11 ms a small file)
            for files, used, events in parsed.batches:
                (batch,) = count_batches(con, events, [files])
                policy.saw(batch.gpu)  # before the writes: the reader cuts its next batch by it
                keep_ops = used and policy.all_ops  # parsed with them, and still no device activity
                n_names += write_parts(con, events, [Part(files, trace_id, n_names, fill, keep_ops)])
                del events  # written: its rows go before the next batch is waited for
                files.remove()
                counts.add_batch(batch, keep_ops)
                counts.require_usable(path)
        return self._finish_file(path, trace_id, header, digest, size, counts, fill, parse_start)

    def _parse_file(self, path: Path, size: int, all_ops: bool | None) -> _FileParse:
        """The batches of ``path`` alone, each parsed (on a cursor, in a reader thread) while the one
        before is written."""
        json_bytes = json_size(path)
        header, chunks = read_trace_ranges(path, self.chunk_bytes_for(json_bytes))
        policy = OpsPolicy(header.leading, self.marker, all_ops)
        directory = self.scratch_dir()
        cursor = self._parse_cursor()

        def parsed() -> Iterator[Batch]:
            for files in _cut(chunks, self.notify, path, size, json_bytes, directory.name, policy):
                yield _parsed(cursor, files, policy)

        ready = prefetch(parsed(), discard=_remove_batch)
        return _FileParse(header, policy, json_bytes, ready, stop=ready.close, remove_scratch=directory.cleanup)

    def _chunked(self, path: Path, digest: _Digest, size: int, all_ops: bool | None = None) -> FileResult:
        """Decode ``path`` chunk by chunk with :mod:`traceq.ingest.decode` in this process."""
        import pyarrow as pa

        from traceq.ingest.decode import decode_chunk

        con = self.con
        parse_start = time.perf_counter()
        trace_id = self._next_trace_id()
        header, chunks = read_trace(path, self.chunk_bytes)
        fill = _leading_rank(header)
        names = _Names()
        counts = _Counts()
        meta: list[pa.Table] = []
        policy = OpsPolicy(header.leading, self.marker, all_ops)
        for c in _counting(chunks, self.notify, path, size):
            used = policy.all_ops
            ct = decode_chunk(c, used, policy.marker)
            policy.saw(ct.counts.get("gpu", 0))
            counts.add(ct, used)
            counts.require_usable(path)
            remap = names.remap(ct.names)
            _insert(con, "gpu_events", _with_rank(_remapped(ct.gpu, remap), fill), trace_id)
            _insert(con, "host_events", _with_rank(_remapped(ct.host, remap), fill), trace_id)
            meta.append(_with_rank(ct.meta, fill))
        _insert(con, "names", names.table(), trace_id)
        if meta:
            _insert(con, "trace_threads", pa.concat_tables(meta), trace_id)
        return self._finish_file(path, trace_id, header, digest, size, counts, fill, parse_start)

    def _finish_file(
        self, path: Path, trace_id: int, header: TraceHeader, digest: _Digest, size: int, counts: _Counts,
        fill: int | None, parse_start: float,
    ) -> FileResult:
        """After the events of a file are in: its rank and its traces row; its steps, step
        attribution and side files come with :meth:`derive_pending`."""
        con = self.con
        _require_events(path, counts)
        if counts.skipped_ops and not counts.gpu:
            raise _NeedsOps
        # the file may be in the warehouse after all: a copy earlier in this transaction, or (its
        # digest taken beside the parse) a file of its size and content an earlier one committed
        if (size, digest.value()) in self.uncommitted or (
            not digest.checked and digest.value() in self.known.of_size(size)
        ):
            skipped = self._already(path, digest.value())
            if skipped is not None:
                return skipped
        notes: list[str] = self._replace(path, digest.value(), size) if self.force else []
        file_rank, rank_source = _rank_of(path, header.fields, self.rank, counts, notes)
        job = names_job(path, header.fields)
        run = run_of(path, self.run, names_rank=file_rank is not None or counts.rows_with_rank > 0, job=job)
        fill_rank = file_rank
        if fill_rank is None and counts.rows_without_rank:  # a rank of its own: never shared by accident
            if self.rank_if_none is None:
                self.derive_pending()  # the ranks of the files before it in this transaction are taken
                fill_rank = free_rank(con, run)
            else:
                fill_rank = self.rank_if_none
            if not counts.rows_with_rank:
                file_rank = fill_rank
                notes.append(no_rank_note(path, run, file_rank, alone=self.run is None and not job))
        if counts.rows_without_rank and fill is None:  # the header is complete only now
            for table in ("gpu_events", "host_events", "trace_threads"):
                con.execute(f"update {table} set rank = ? where trace_id = ? and rank is null", [fill_rank, trace_id])
        stored = _finish_trace(
            con, path, trace_id, run, digest.value(), size, header.fields, counts, file_rank, rank_source,
            time.perf_counter() - parse_start, self.marker, new_run=run not in self.runs,
        )
        stored.result.notes.extend(notes)
        self.pending.append(stored)
        return stored.result

    def derive_pending(self) -> None:
        """Derive the steps of the traces stored in the open transaction (:func:`_derive`)."""
        if self.pending:
            pending, self.pending = self.pending, []
            _derive(self.con, pending, self.marker)

    def _next_trace_id(self) -> int:
        return self.con.execute("select nextval('trace_ids')").fetchall()[0][0]


class _Regroup(Exception):
    """A file of a :class:`_Together` group cannot be written with the others (it needs another
    reading, or it failed): the group's transaction is rolled back and its files are ingested one by
    one."""


@dataclass
class _Held:
    """A small file parsed ahead, waiting for its group's writes (:class:`_Together`)."""

    path: Path
    size: int
    digest: _Digest
    parse: _FileParse
    batch: Batch
    seconds: float  # spent on it before the group's writes
    result: FileResult | None = None  # once written, or skipped as a copy


class _Together:
    """Small files written in one transaction, with one statement per table for all of them
    (:func:`traceq.ingest.native.write_parts`), their steps derived at once (:func:`_derive`): a
    statement costs milliseconds whatever its rows, and a file takes about ten (BENCHMARKS.md, many
    files). The parsed rows of a group's files are held until it is full.

    Each file still leaves nothing behind when it fails. A file that cannot be held (it needs
    decoding, it has no events, it could not be cut) ends the group: the files before it are
    committed, then it is ingested alone. A copy of a file before it in the group is skipped, as
    alone. A file that cannot be written with the others (:class:`_Regroup`), or a group whose steps
    clash, rolls the group back, and its files are ingested again one by one, each in its own
    transaction. Ctrl-C rolls the group back and stops.
    """

    FILES = 16  # files to a transaction, at most
    BYTES = 32 << 20  # bytes of JSON to a transaction, at most (their parsed rows are held)

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader
        self.entries: list[_Held | FileResult] = []  # in input order; a result: a file not to be read
        self.bytes = 0
        self.open = False

    def takes(self, json_bytes: int) -> bool:
        """Whether a file of ``json_bytes`` of JSON is written with others: a small file (one batch),
        where no earlier trace of it is to be replaced (``force``)."""
        return not self.loader.force and json_bytes <= WHOLE_FILE_BATCH_BYTES

    def add(self, path: Path, parse: _FileParse, digest: str | None) -> Iterator[FileResult]:
        """Hold ``path``'s parsed batch for the group (``parse`` is this group's to close); yields
        the group's results once it is full and committed, and those of a file ingested alone."""
        started = time.perf_counter()
        try:
            ready = self.loader._before_reading(path, digest)
            batch = None if isinstance(ready, FileResult) else _single_batch(parse)
        except (NotNative, _Regroup, TraceqError):  # it needs another reading, or fails: alone, after the group
            parse.close()
            yield from self.commit()
            yield self.loader._load(path, None, digest)
            return
        except BaseException as exc:
            parse.close()
            if is_interrupt(exc) or not isinstance(exc, Exception):
                self.close()
            else:  # an error that is no file's: the files before it are in, as when each is committed alone
                yield from self.commit()
            raise
        if batch is None:
            parse.close()
            self.entries.append(ready)  # type: ignore[arg-type]
        else:
            size, taken = ready  # type: ignore[misc]
            self.entries.append(_Held(path, size, taken, parse, batch, time.perf_counter() - started))
            self.bytes += parse.json_bytes
        if len(self.entries) >= self.FILES or self.bytes >= self.BYTES:
            yield from self.commit()

    def commit(self) -> Iterator[FileResult]:
        """Write the group's files, derive their steps and commit; yields its files' results."""
        if not self.entries:
            return
        loader = self.loader
        started = time.perf_counter()
        held = [e for e in self.entries if isinstance(e, _Held)]
        failed = False
        try:
            if held:
                loader.con.begin()
                self.open = True
                self._write(held)
                loader.derive_pending()
                if any(loader.changed(h.path) for h in held):  # read alone, that one fails
                    raise _Regroup
        except Exception as exc:  # a file that needs another reading, steps that clash (which file
            if is_interrupt(exc):  # keeps them), a side file, an error: one by one, below
                self.close()
                raise
            failed = True
        except BaseException:
            self.close()
            raise
        if failed:  # out of the except block: its traceback held the group's rows
            del held
            yield from self._one_by_one()
            return
        results = [e if isinstance(e, FileResult) else e.result for e in self.entries]
        if self.open:
            loader.con.commit()
            self.open = False
            loader.committed(loader.uncommitted, [r.run for r in results if r is not None and r.status == "ingested"])
        share = (time.perf_counter() - started) / max(1, len(held))
        seconds = [0.0 if isinstance(e, FileResult) else e.seconds + share for e in self.entries]
        del held
        self.close()
        for result, spent in zip(results, seconds):
            assert result is not None
            if result.status == "ingested":
                result.seconds = spent
            yield result

    def _write(self, held: list[_Held]) -> None:
        """The rows of the ``held`` files (one statement per table for all), then each file's traces
        row; :class:`_Regroup` where a file needs another reading (decoding, every CPU operator). A
        copy of a file before it in the group is not written: it is skipped as a copy of that one, as
        it would be alone."""
        loader, con = self.loader, self.loader.con
        writers, copies, seen = [], [], set()
        for h in held:  # their digests: taken by now where the files are small
            key = (h.size, h.digest.value())
            (copies if key in seen else writers).append(h)
            seen.add(key)
        rows = rows_of(con, [(h.batch[2], h.batch[0].part) for h in writers])
        try:
            counts = count_batches(con, rows, [h.batch[0] for h in writers])
        except NotNative as exc:
            raise _Regroup from exc
        parts, totals = [], []
        for h, batch in zip(writers, counts):
            files, used, _ = h.batch
            h.parse.policy.saw(batch.gpu)
            keep_ops = used and h.parse.policy.all_ops  # parsed with them, and still no device activity
            total = _Counts()
            total.add_batch(batch, keep_ops)
            totals.append(total)
            parts.append(Part(files, loader._next_trace_id(), 0, _leading_rank(h.parse.header), keep_ops))
        write_parts(con, rows, parts)
        del rows
        for h, part, total in zip(writers, parts, totals):
            try:
                with too_deep_is_not_json(h.path):
                    result = loader._finish_file(  # its parse time: its own, not its group's wait
                        h.path, part.trace_id, h.parse.header, h.digest, h.size, total, part.fill_rank,
                        time.perf_counter() - h.seconds)
            except (_NeedsOps, TraceqError) as exc:
                raise _Regroup from exc
            if result.status != "ingested":  # in the warehouse after all: not expected, read alone
                raise _Regroup
            loader.uncommitted.append((h.size, h.digest.value()))
            h.result = result
        for h in copies:  # the traces row of the file it copies is in now
            h.result = loader._already(h.path, h.digest.value())
            if h.result is None:  # not expected (--force files are read alone): read alone
                raise _Regroup

    def _one_by_one(self) -> Iterator[FileResult]:
        todo = [e if isinstance(e, FileResult) else e.path for e in self.entries]
        self.close()  # the group's parsed rows go before its files are read again
        for entry in todo:
            yield entry if isinstance(entry, FileResult) else self.loader._load(entry)

    def close(self) -> None:
        """Roll back what is not committed (an error, an interrupt), and let go of the parsed files."""
        entries, self.entries, self.bytes = self.entries, [], 0
        try:
            if self.open:
                self.open = False
                self.loader._roll_back()
        finally:
            for entry in entries:
                if isinstance(entry, _Held):
                    entry.parse.close()


def _single_batch(parse: _FileParse) -> Batch:
    """The one batch of a small file (:data:`WHOLE_FILE_BATCH_BYTES`); :class:`_Regroup` where it has
    none (no events: it fails alone) or, against expectation, more (their files go with ``parse``'s
    scratch directory)."""
    batches = list(parse.batches)
    if len(batches) != 1:
        raise _Regroup
    return batches[0]


Batch = tuple[BatchFiles, bool, Any]  # batch files, all_ops they were parsed with, the parsed rows


# A file of up to this much JSON is parsed in one batch: small first batches (while the policy may
# switch) would save little writing of CPU operators and cost a batch's statements (BENCHMARKS.md)
WHOLE_FILE_BATCH_BYTES = 16 << 20


def _cut(
    chunks: Iterator[bytes | FileRange], notify: Progress, path: Path, size: int, json_bytes: int, directory: str,
    policy: OpsPolicy,
) -> Iterator[BatchFiles]:
    """A file's ``chunks`` as batch files in ``directory``, counted for progress; small batches
    while ``policy`` may still switch, unless the file is small (``json_bytes`` of JSON)."""
    if json_bytes <= WHOLE_FILE_BATCH_BYTES:
        return batch_files(_counting(chunks, notify, path, size), directory)
    return batch_files(_counting(chunks, notify, path, size), directory, small=policy.undecided)


def _parsed(cursor: Any, files: BatchFiles, policy: OpsPolicy) -> Batch:
    """``files`` parsed under ``policy`` as it is now (the writer may switch it meanwhile: the
    batch is written as parsed, :meth:`_Loader._native`)."""
    used = policy.all_ops
    return files, used, parse_batch(cursor, files, used, policy.marker)


def not_utf8(path: Path) -> FileResult | None:
    """The failed result of a file whose name is not UTF-8 text (DuckDB holds text as UTF-8: such a
    name cannot be stored), shown with its odd bytes escaped; None for any other name."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        return FileResult(shown, "failed", f"{shown}: the file's name is not UTF-8 text; rename it")
    return None


def _identity(path: Path) -> tuple[int, ...] | None:
    """(device, inode, size, mtime ns) of ``path``; None where it cannot be looked at."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


@dataclass
class _FileParse:
    """One file's parsed batches for :meth:`_Loader._native`, in order, with the file's header and
    the policy they are parsed under. :meth:`close` stops the parsing (the batches not taken are
    dropped) and removes the file's scratch directory."""

    header: TraceHeader
    policy: OpsPolicy
    json_bytes: int  # of the file (inputs.json_size), taken once by whoever reads it
    batches: Iterator[Batch]
    stop: Callable[[], None]
    remove_scratch: Callable[[], Any]

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.remove_scratch()


class _Digest:
    """A file's content digest (:func:`traceq.ingest.reader.file_digest`): taken before the file is
    read (``checked``: the warehouse was asked whether it holds it), or in a thread beside the parse
    (:meth:`value` waits for it)."""

    def __init__(self, pending: Future[str], checked: bool) -> None:
        self._pending = pending
        self.checked = checked

    @classmethod
    def taken(cls, digest: str) -> _Digest:
        done: Future[str] = Future()
        done.set_result(digest)
        return cls(done, checked=True)

    @classmethod
    def beside(cls, hasher: ThreadPoolExecutor, path: Path) -> _Digest:
        return cls(hasher.submit(file_digest, path), checked=False)

    def value(self) -> str:
        """The digest; raises what hashing raised (:class:`TraceFormatError`: the file cannot be read)."""
        return self._pending.result()


class _KnownDigests:
    """The content digests in the warehouse, by file size. The writer adds to it while the reader
    thread asks (:class:`_ReadAhead`): under a lock, answers are copies."""

    def __init__(self, rows: Iterable[tuple[int, str]]) -> None:
        self._lock = threading.Lock()
        self._by_size: dict[int, set[str]] = {}
        for size, digest in rows:
            self._by_size.setdefault(size, set()).add(digest)

    def of_size(self, size: int) -> frozenset[str]:
        with self._lock:
            return frozenset(self._by_size.get(size, ()))

    def add(self, size: int, digest: str) -> None:
        with self._lock:
            self._by_size.setdefault(size, set()).add(digest)


def _stored_digest(path: Path, digest: str, known: Collection[str]) -> str | None:
    """The digest under which ``path`` (BLAKE3 ``digest``) is in the warehouse, if it is: a file
    ingested before BLAKE3 is known by its SHA-256. ``known``: the digests of files of its size."""
    return digest if digest in known else digest_in(path, set(known) - {digest})


class _ReadAhead:
    """Files parsed in a thread, on a cursor of their own, ahead of the writer and across file
    boundaries (:meth:`_Loader.load`). Items come in file order: for each file ``deferred`` (it is
    in the warehouse already: the writer skips it) or ``stop`` (it could not be read), else
    ``start``, its ``batch``es and ``end`` (``stop`` if a batch could not be cut or parsed: the
    exception is raised where the writer takes that batch). Small files come in runs of up to a
    group's (:class:`_Together`), their batches parsed in one statement. Parsed batches wait for the
    writer (:class:`_Ahead`): two, as within one file, or runs of small files up to
    :data:`AHEAD_BYTES` of JSON; the markers do not count.
    """

    AHEAD_BATCHES = 2
    AHEAD_BYTES = _Together.BYTES

    def __init__(self, loader: _Loader, paths: list[Path]) -> None:
        self.loader = loader
        self.cursor = parser(loader.con)
        self._abandoned: set[Path] = set()  # files the writer stopped reading: cut no more of them
        self._abandoned_lock = threading.Lock()
        self.ahead = _Ahead(self.AHEAD_BATCHES, self.AHEAD_BYTES)
        self.closed = threading.Event()
        self.items = prefetch(self._produce(paths), ahead=0, discard=_discard_item)

    def _known(self, path: Path, size: int) -> tuple[bool, str | None]:
        """Whether ``path`` is in the warehouse already (files of its size are: its digest tells),
        and the digest taken to tell."""
        known = self.loader.known.of_size(size)
        if not known:
            return False, None
        digest = file_digest(path)
        return _stored_digest(path, digest, known) is not None, digest

    def _produce(self, paths: list[Path]) -> Iterator[tuple[str, Path, Any]]:
        loader = self.loader
        run: list[_RunFile] = []  # small files cut, to be parsed in one statement
        try:
            for path in paths:
                size = file_size(path)
                try:
                    known, digest = self._known(path, size)
                    if not known:
                        json_bytes = json_size(path)
                        header, chunks = read_trace_ranges(path, loader.chunk_bytes_for(json_bytes))
                except TraceqError as exc:
                    yield from self._parse_run(run)
                    yield "stop", path, exc
                    continue
                if known:
                    yield from self._parse_run(run)
                    yield "deferred", path, digest
                    continue
                policy = OpsPolicy(header.leading, loader.marker)
                if json_bytes > WHOLE_FILE_BATCH_BYTES or loader.force:  # --force: each file alone
                    yield from self._parse_run(run)
                    yield from self._one_file(path, size, json_bytes, header, chunks, policy, digest)
                    continue
                if not run:
                    self.ahead.wait(small=True)  # before its files are written: they take room too
                if self.closed.is_set():
                    return
                run.append(_RunFile(path, header, policy, loader.scratch_dir(), digest, json_bytes))
                try:
                    run[-1].batches = list(
                        _cut(chunks, loader.notify, path, size, json_bytes, run[-1].directory.name, policy))
                except (NotNative, TraceqError) as exc:
                    run[-1].error = exc
                if len(run) >= _Together.FILES or sum(f.json_bytes for f in run) >= _Together.BYTES:
                    yield from self._parse_run(run)
            yield from self._parse_run(run)
        finally:
            for f in run:  # not handed to the writer
                f.directory.cleanup()

    def _parse_run(self, run: list[_RunFile]) -> Iterator[tuple[str, Path, Any]]:
        """The items of the small files ``run`` (emptied), their batches parsed in one statement
        (:func:`traceq.ingest.native.parse_batches`); where DuckDB cannot parse them together, each
        file's on its own, so that only the file it cannot read ends in that error."""
        files = list(run)
        run.clear()
        handed = 0  # files whose directory the writer has (it removes them)
        try:
            cut = [(f, batch, f.policy.all_ops) for f in files if f.error is None for batch in f.batches]
            events = None
            if len(cut) > 1:
                try:
                    events = parse_batches(self.cursor, [(batch, used) for _, batch, used in cut], self.loader.marker)
                except NotNative:
                    pass  # one by one, below
            for f in files:
                yield "start", f.path, (f.header, f.policy, f.json_bytes, f.directory.cleanup, f.digest)
                handed += 1
                if f.error is not None:
                    yield "stop", f.path, f.error
                    continue
                try:
                    for batch, used in ((b, u) for g, b, u in cut if g is f):
                        parsed = (batch, used, events) if events is not None else _parsed(self.cursor, batch, f.policy)
                        self.ahead.add(batch.bytes)
                        yield "batch", f.path, parsed
                except NotNative as exc:
                    yield "stop", f.path, exc
                    continue
                yield "end", f.path, None
        finally:
            for f in files[handed:]:
                f.directory.cleanup()

    def _one_file(
        self, path: Path, size: int, json_bytes: int, header: TraceHeader, chunks: Iterator[FileRange],
        policy: OpsPolicy, digest: str | None,
    ) -> Iterator[tuple[str, Path, Any]]:
        """The items of a file parsed batch by batch, each batch while the writer takes the one before."""
        loader = self.loader
        directory = None
        handed = False  # once the writer has the scratch directory, it removes it
        try:
            directory = loader.scratch_dir()
            yield "start", path, (header, policy, json_bytes, directory.cleanup, digest)
            handed = True
            batches = _cut(chunks, loader.notify, path, size, json_bytes, directory.name, policy)
            while True:
                self.ahead.wait()  # before the batch's files are written: they take room too
                files = None if self.closed.is_set() or self._is_abandoned(path) else next(batches, None)
                if files is None:
                    break
                batch = _parsed(self.cursor, files, policy)
                self.ahead.add(files.bytes)
                yield "batch", path, batch
                del batch  # the writer's now: not held while the next is cut and parsed
        except (NotNative, TraceqError) as exc:
            yield "stop", path, exc
            return
        finally:
            if not handed and directory is not None:
                directory.cleanup()
        yield "end", path, None

    def _is_abandoned(self, path: Path) -> bool:
        with self._abandoned_lock:
            return path in self._abandoned

    def _take(self, path: Path) -> tuple[str, Any]:
        try:
            kind, item_path, value = next(self.items)
        except StopIteration:  # ended by an error already raised (an interrupt): nothing more comes
            raise RuntimeError(f"read-ahead ended before {path} was read") from None
        if kind == "batch":
            self.ahead.taken(value[0].bytes)
        if item_path != path:  # the writer takes files in the order they were given
            raise RuntimeError(f"read-ahead out of order: {item_path} where {path} was expected")
        return kind, value

    def next_file(self, path: Path) -> tuple[_FileParse | None, str | None]:
        """``path``'s parse (None where the writer skips the file, being in the warehouse) and its
        digest where the reader took it. Raises the error that kept the reader from opening it."""
        kind, value = self._take(path)
        if kind == "deferred":
            return None, value
        if kind == "stop":
            raise value
        header, policy, json_bytes, remove_scratch, digest = value
        done = False

        def batches() -> Iterator[Batch]:
            nonlocal done
            while not done:
                try:
                    kind, value = self._take(path)
                except BaseException:  # an interrupt while waiting: the stream is over, nothing to drain
                    done = True
                    raise
                if kind == "batch":
                    yield value
                    del value  # the writer's now: not held while the next is awaited
                else:
                    done = True
                    if kind == "stop":
                        raise value

        def drain() -> None:  # what is left of this file, when the writer stopped taking it early
            if done:
                return
            with self._abandoned_lock:
                self._abandoned.add(path)
            try:
                for files, _, _ in batches():
                    files.remove()
            except (NotNative, TraceqError):
                pass  # the file is given up already

        return _FileParse(header, policy, json_bytes, batches(), stop=drain, remove_scratch=remove_scratch), digest

    def close(self) -> None:
        self.closed.set()
        self.ahead.close()  # a reader waiting for room sees `closed`
        try:
            self.items.close()
        finally:
            self.cursor.close()


@dataclass
class _RunFile:
    """A small file cut by :class:`_ReadAhead`, to be parsed with the files beside it."""

    path: Path
    header: TraceHeader
    policy: OpsPolicy
    directory: scratch.ScratchDir
    digest: str | None
    json_bytes: int
    batches: list[BatchFiles] = field(default_factory=list)
    error: Exception | None = None  # it could not be cut


class _Ahead:
    """How far the reader thread runs ahead of the writer: it cuts another batch of a file while
    fewer than ``batches`` parsed batches wait for the writer, and starts another run of small files
    (:meth:`_ReadAhead._parse_run`) while fewer than ``batches`` or ``json_bytes`` of JSON wait. The
    writer holds a group's batches before it writes them (:class:`_Together`): with a run being cut
    and parsed, up to three groups' rows are in memory."""

    def __init__(self, batches: int, json_bytes: int) -> None:
        self._room = threading.Condition()
        self._limits = (batches, json_bytes)
        self._batches = self._bytes = 0
        self._closed = False

    def wait(self, small: bool = False) -> None:
        """Wait for room for another batch (``small``: another run of small files), or :meth:`close`."""
        batches, json_bytes = self._limits
        with self._room:
            self._room.wait_for(
                lambda: self._closed or self._batches < batches or (small and self._bytes < json_bytes))

    def add(self, json_bytes: int) -> None:
        """A batch of ``json_bytes`` waits for the writer."""
        with self._room:
            self._batches += 1
            self._bytes += json_bytes

    def taken(self, json_bytes: int) -> None:
        """The writer took a batch of ``json_bytes``."""
        with self._room:
            self._batches -= 1
            self._bytes -= json_bytes
            self._room.notify_all()

    def close(self) -> None:
        with self._room:
            self._closed = True
            self._room.notify_all()


def _remove_batch(batch: Batch) -> None:
    """A parsed batch the writer will not take: its files go (the rows with the cursor)."""
    batch[0].remove()


def _discard_item(item: tuple[str, Path, Any]) -> None:
    """What :class:`_ReadAhead` made and the writer will not take: scratch directories and files go."""
    kind, _, value = item
    if kind == "start":
        value[3]()  # the file's scratch directory
    elif kind == "batch":
        _remove_batch(value)


def _leading_rank(header: TraceHeader) -> int | None:
    """Kineto writes distributedInfo before the events: with it, ranks are filled as rows go in (an
    UPDATE of every row afterwards would hold a copy of the column in memory). A value that is no rank
    fills nothing: the rows get the rank the notes report (:func:`traceq.ingest.identity.distributed_rank`)."""
    return distributed_rank(header.leading)


def _counting(chunks: Iterator[Chunk], notify: Progress, path: Path, size: int) -> Iterator[Chunk]:
    """Pass chunks through, reporting progress in (approximate) file bytes."""
    total = 0
    for c in chunks:
        total += len(c)
        yield c
        notify("bytes", {"uncompressed": len(c)})
    notify("file_read", {"bytes": size, "uncompressed": total, "path": str(path)})


def _once_per_file(notify: Progress) -> Progress:
    """``notify``, told a file's bytes once per ingest: a file read again (its group rolled back,
    :class:`_Together`; decoded after DuckDB could not read it) is not counted twice. Called from
    the reader threads too."""
    reported: set[str] = set()
    lock = threading.Lock()

    def once(event: str, info: dict[str, Any]) -> None:
        path = info.get("path")
        if path is not None and event in ("file_read", "bytes"):
            with lock:
                if path in reported:
                    return
                reported.add(path)
        notify(event, info)

    return once


def _insert(con: Any, table: str, rows: pa.Table | None, trace_id: int) -> None:
    if rows is None or rows.num_rows == 0:
        return
    columns = ", ".join(rows.column_names)
    execute_over(con, f"insert into {table} (trace_id, {columns}) select ?, {columns} from _rows", [trace_id], rows)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _header_summary(fields: dict[str, Any]) -> dict[str, Any]:
    """Top-level fields worth keeping (drops bulky log lists such as INFO/ERROR)."""
    return {k: v for k, v in fields.items() if k not in ("INFO", "ERROR", "WARNING")}
