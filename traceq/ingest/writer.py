"""The one writer of an ingest (:class:`Writer`): it owns the warehouse connection, what the warehouse
holds (digests by size, runs) and what the open transaction holds, and writes the parsed files it is
handed, whichever parser read them."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import msgspec

from traceq.catalog import StepMarker
from traceq.errors import TraceFormatError
from traceq.ingest.digests import file_digest, stored_digest
from traceq.ingest.identity import distributed_rank, names_job, no_rank_note, rank_of, run_of
from traceq.ingest.native import BatchCounts, Executor, Part, write_batches
from traceq.ingest.pipeline import NeedsOps, ParsedFile
from traceq.ingest.plan import FileJob, file_identity
from traceq.ingest.reader import too_deep_is_not_json
from traceq.ingest.results import FileResult, skipped
from traceq.ingest.write import INGEST_MEMORY_LIMIT_MB, Stored, derive, drop_plain_ops, free_rank
from traceq.kineto import to_int
from traceq.store.derive import device_properties, gpu_model_of
from traceq.store.manage import forget_run, remove_traces
from traceq.store.schema import fetch_one, rollback


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


def require_events(path: Path, counts: Counts) -> None:
    """TraceFormatError for a file without events, or whose events are mostly unusable (:meth:`Counts.require_usable`)."""
    if counts.events == 0:
        raise TraceFormatError(f"{path}: the trace holds no events; was the profiler started (schedule active > 0)?")
    counts.require_usable(path)


@dataclass(frozen=True)
class WriteOptions:
    """How files are written: ``run`` (--name), ``rank`` (for files that name none), the step
    ``marker``, ``force`` (read again what is in; its earlier trace goes in the same transaction) and
    ``rank_if_none`` (the rank of a file that names none where the warehouse cannot tell which are
    free: a cluster task's private warehouse)."""

    run: str | None = None
    rank: int | None = None
    marker: StepMarker = StepMarker()
    force: bool = False
    rank_if_none: int | None = None


@dataclass
class _Entry:
    """A file being written in the open transaction."""

    file: ParsedFile
    digest: str
    trace_id: int
    fill: int | None  # the rank of its events that name none, from its header
    counts: Counts = field(default_factory=Counts)
    names: int = 0  # its next name id


class Writer:
    """Writes parsed files into the warehouse ``con``, each all or nothing (:func:`write_group` says
    which transaction); statements over parsed rows go through ``executor``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, options: WriteOptions, executor: Executor) -> None:
        self.con, self.options, self.executor = con, options, executor
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="traceq-hash")  # BLAKE3 releases the GIL
        self._digests: dict[Path, Future[str]] = {}
        self.held: dict[int, dict[str, tuple[str, str]]] = {}  # the files in the warehouse, committed (plan.Held)
        for size, digest, path, run in con.execute(
                "select size_bytes, content_digest, path, run from traces order by trace_id").fetchall():
            self.held.setdefault(size, {})[digest] = (path, run)
        self._runs = {r for (r,) in con.execute("select run from runs").fetchall()}  # as of the last commit
        self._pending: list[Stored] = []  # stored in the open transaction, steps not derived yet
        self._uncommitted: dict[tuple[int, str], tuple[str, str]] = {}  # the files it holds: (size, digest) -> (path, run)

    def hash_beside(self, jobs: list[FileJob]) -> None:
        """Start hashing the files of ``jobs`` whose digest the plan did not take (beside the parse)."""
        for job in jobs:
            if job.digest is None and job.path not in self._digests:
                self._digests[job.path] = self._hasher.submit(file_digest, job.path)

    def begin(self) -> None:
        self.con.begin()

    def write(self, files: list[ParsedFile]) -> list[FileResult]:
        """Write ``files`` in the open transaction, one statement per table for the batches of them
        all: their rows, then each one's traces row. A file whose content is in already (committed, or
        earlier among ``files``) is skipped, not written. Raises the error of a file that failed to
        read (its ``error``), :class:`NeedsOps`, or DuckDB's."""
        started = time.perf_counter()
        entries: list[_Entry | tuple[Path, tuple[int, str]]] = []  # a file to write, or a copy (path, key)
        keys = set(self._uncommitted)
        for f in files:
            if f.error is not None:
                raise f.error
            digest = f.job.digest or self._digest(f.job.path)
            key = (f.job.size, digest)
            if not self.options.force and (digest in self.held.get(f.job.size, {}) or key in keys):
                entries.append((f.job.path, key))
                continue
            keys.add(key)
            assert f.header is not None
            # Kineto writes distributedInfo before the events: with it, ranks are filled as rows go in (an
            # UPDATE of every row afterwards would hold a copy of the column in memory)
            trace_id = fetch_one(self.con, "select nextval('trace_ids')")[0]
            entries.append(_Entry(f, digest, trace_id, distributed_rank(f.header.leading)))
        self._write_rows([e for e in entries if isinstance(e, _Entry)])
        results = []
        for e in entries:
            if isinstance(e, _Entry):
                with too_deep_is_not_json(e.file.job.path):
                    results.append(self._finish(e, started))
        for result in results:  # the group's time, shared
            result.seconds = (time.perf_counter() - started) / len(results)
        for i, e in enumerate(entries):  # a copy: of a committed file, or of one written before it (in now)
            if not isinstance(e, _Entry):
                path, (size, digest) = e
                results.insert(i, skipped(path, self.held.get(size, {}).get(digest) or self._uncommitted[size, digest],
                                          self.options.run))
        for f in files:  # a file rewritten while it was read would be stored mixed, under a digest of neither
            if f.job.identity is None or file_identity(f.job.path) != f.job.identity:
                raise TraceFormatError(
                    f"{f.job.path}: the file changed while traceq read it (written, replaced or removed): nothing of "
                    "it was stored; ingest it again once it is complete")
        return results

    def _digest(self, path: Path) -> str:
        """``path``'s digest, taken beside the parse (:meth:`hash_beside`) or now."""
        pending = self._digests.get(path) or self._hasher.submit(file_digest, path)
        self._digests[path] = pending
        return pending.result()

    def _write_rows(self, entries: list[_Entry]) -> None:
        """The batches of ``entries``, round by round: each round the next batch of every file that has
        one, in one statement per table (a small file has one batch; a large file is written alone)."""
        con, live, stale = self.con, [(e, iter(e.file.batches)) for e in entries], False
        while live:
            taken = [(e, it, next(it, None)) for e, it in live]
            taken = [(e, it, b) for e, it, b in taken if b is not None]
            live = [(e, it) for e, it, _ in taken]
            if not taken:
                return
            if stale:  # the name ids of a trace: from its names written in the rounds before
                named = dict(con.execute("select trace_id, count(*) from names where trace_id in (select unnest(?)) "
                                         "group by trace_id", [[e.trace_id for e, _, _ in taken]]).fetchall())
                for e, _, _ in taken:
                    e.names = named.get(e.trace_id, 0)
            # CPU operators parsed with the file (its header has no deviceProperties) are written until it
            # shows GPU activity (those before go at its end, _traces_row)
            parts = [Part(b.files, e.trace_id, e.names, e.fill, e.file.all_ops and not e.counts.gpu) for e, _, b in taken]
            counts, added = write_batches(con, [(b.rows, p) for (_, _, b), p in zip(taken, parts)], self.executor)
            stale = len(taken) > 1
            for (e, _, b), p, c in zip(taken, parts, counts):
                e.counts.add_batch(c, p.keep_plain_ops)
                e.names += added
                if not e.file.held:
                    b.files.remove()  # written, and never again
                e.counts.require_usable(e.file.job.path)
            del taken, b, parts  # the batch's rows go before the next batch is waited for

    def _finish(self, e: _Entry, started: float) -> FileResult:
        """After the events of a file are in: its rank and its traces row; its steps, step attribution
        and side files come with :meth:`derive`."""
        path, counts, options, header = e.file.job.path, e.counts, self.options, e.file.header
        assert header is not None
        require_events(path, counts)
        if counts.skipped_ops and not counts.gpu:
            raise NeedsOps
        self.executor.step("traces row", [path])
        notes: list[str] = self._replace(e.file.job, e.digest) if options.force else []
        file_rank, rank_source = rank_of(path, header.fields, options.rank, counts.rows_with_rank > 0, notes)
        job = names_job(path, header.fields)
        run = run_of(path, options.run, names_rank=file_rank is not None or counts.rows_with_rank > 0, job=job)
        fill_rank = file_rank
        if fill_rank is None and counts.rows_without_rank:  # a rank of its own: never shared by accident
            if options.rank_if_none is None:
                self.derive()  # the ranks of the files before it in this transaction are taken
                fill_rank = free_rank(self.con, run)
            else:
                fill_rank = options.rank_if_none
            if not counts.rows_with_rank:
                file_rank = fill_rank
                notes.append(no_rank_note(path, run, file_rank, alone=options.run is None and not job))
        if counts.rows_without_rank and e.fill is None:  # the header is complete only now
            for table in ("gpu_events", "host_events", "trace_threads"):
                self.con.execute(f"update {table} set rank = ? where trace_id = ? and rank is null",
                                 [fill_rank, e.trace_id])
        stored = self._traces_row(e, run, file_rank, rank_source, time.perf_counter() - started)
        if lone := header.lone_surrogates:  # JSON allows them; UTF-8, msgspec and DuckDB do not (traceq.ingest.reader)
            notes.append(f"{path}: {lone:,} lone surrogate escape{'s' * (lone > 1)} (such as \\ud800) in its strings "
                         "replaced by U+FFFD")
        stored.result.notes.extend(notes)
        if e.file.decoded is not None:
            stored.result.message = f"read by traceq.ingest.decode: {e.file.decoded}"
        self._pending.append(stored)
        self._uncommitted[e.file.job.size, e.digest] = (str(e.file.job.path.resolve()), run)
        return stored.result

    def _traces_row(self, e: _Entry, run: str, file_rank: int | None, rank_source: str, seconds: float) -> Stored:
        """The traces row of ``e`` (and its run's, where new), once its events are in."""
        con, path, counts, fields = self.con, e.file.job.path, e.counts, e.file.header.fields  # type: ignore[union-attr]
        if counts.gpu and counts.kept_ops:  # its CPU operators written before it showed GPU activity go, and their drops
            counts.host -= drop_plain_ops(con, e.trace_id, self.options.marker)
            counts.dropped -= counts.dropped_plain_ops
        dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
        devices = device_properties(fields.get("deviceProperties"))
        # the top-level fields less the bulky log lists
        header = msgspec.json.encode({k: v for k, v in fields.items() if k not in ("INFO", "ERROR", "WARNING")}).decode()
        devices_json = msgspec.json.encode(devices).decode() if devices else None
        if (text_mb := (len(header) + len(devices_json or "")) >> 20) >= 1:
            # storing and compressing 80 MB of header text takes buffers of 128 MB, beyond INGEST_MEMORY_LIMIT (a
            # deviceProperties name of 40 MB, tests/test_hostile.py): the pool is raised until another file's needs more
            con.execute(f"set memory_limit = '{INGEST_MEMORY_LIMIT_MB + 4 * (text_mb + 1)}MB'")
        if run not in self._runs:
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
                e.trace_id, run, str(path.resolve()), e.digest, e.file.job.size, rank_source, file_rank,
                to_int(dist.get("world_size")), _text(dist.get("backend")), to_int(fields.get("schemaVersion")), base_ns,
                _text(fields.get("displayTimeUnit")), _text(fields.get("traceName")), header,
                self.options.marker.pattern, devices_json, gpu_model_of(con, e.trace_id, devices),
                counts.events, counts.gpu, counts.host, counts.dropped, seconds,
            ],
        )
        result = FileResult(str(path), "ingested", trace_id=e.trace_id, run=run, events=counts.events, gpu_events=counts.gpu)
        return Stored(e.trace_id, path, run, rank_source, file_rank, base_ns, result)

    def _replace(self, job: FileJob, digest: str) -> list[str]:
        """Remove the trace(s) of this file's content, or of this file (its path: written again since,
        with other content), in the file's transaction (``force``); a note for each."""
        path = job.path
        digests = {digest} | ({stored} if (stored := stored_digest(path, digest, self.held.get(job.size, {}))) else set())
        earlier = self.con.execute(
            "select trace_id, run from traces where content_digest in (select unnest(?)) or path = ? order by trace_id",
            [sorted(digests), str(path.resolve())],
        ).fetchall()
        remove_traces(self.con, [trace_id for trace_id, _ in earlier])
        emptied = [r for (r,) in self.con.execute(
            "select run from runs where run in (select unnest(?)) and run <> ? and run not in (select run from traces)",
            [sorted({run for _, run in earlier}), job.run],
        ).fetchall()]
        for run in emptied:  # a run left without traces goes, as `traceq runs rm` would remove it
            forget_run(self.con, run)
            self._runs.discard(run)
        return [f"{path}: ingested again; its earlier trace in run {run} is replaced"
                + (f" (run {run} had no other trace and is removed)" if run in emptied else "") for _, run in earlier]

    def derive(self) -> None:
        """Derive the steps of the traces written in the open transaction (:func:`derive`)."""
        if self._pending:
            pending, self._pending = self._pending, []
            self.executor.step("steps", [s.path for s in pending])
            derive(self.con, pending, self.options.marker)

    def commit(self) -> None:
        """Commit the open transaction: a copy of a file it holds is skipped from now on."""
        self.derive()
        self.con.commit()
        for (size, digest), (path, run) in self._uncommitted.items():
            self.held.setdefault(size, {})[digest] = (path, run)
            self._runs.add(run)
        self._uncommitted.clear()

    def roll_back(self) -> None:
        """Roll back the open transaction, and forget what it stored."""
        self._pending.clear()
        self._uncommitted.clear()
        rollback(self.con)

    def close(self) -> None:
        """Stop the hashing thread."""
        self._hasher.shutdown(cancel_futures=True)


def _text(value: object) -> str | None:
    return None if value is None else str(value)
