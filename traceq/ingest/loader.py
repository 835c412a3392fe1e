"""Load Kineto trace files into the warehouse: each file all or nothing, idempotent by content hash.

The walk from ``traceq ingest`` to the stored rows, by stage:

1. plan (:mod:`traceq.ingest.inputs`): the files, in order; each file's run (:mod:`traceq.ingest.identity`);
2. read ahead (:mod:`traceq.ingest.pipeline`, one thread): each file cut into chunks of whole events
   (:mod:`traceq.ingest.reader`), written as batch files and parsed by DuckDB's JSON reader on every
   core (:mod:`traceq.ingest.native`), a batch ahead of the writer and across file boundaries;
3. write (here, :func:`traceq.ingest.native.write_parts` and :mod:`traceq.ingest.write`): a large file's
   batches in one transaction of its own; small files, parsed in one statement, written several to a
   transaction (:class:`~traceq.ingest.groups.Together`); then each file's traces row, steps and step
   attribution.

Where DuckDB's reader refuses a file's JSON or would read it differently from
:mod:`traceq.ingest.decode` (the typed msgspec reference), the transaction is rolled back and the file
is decoded by :mod:`traceq.ingest.decode` in this process, into the rows DuckDB's parse gives, which the
same writer stores (:meth:`Loader._write`); the file's result says so in its message.
Any other error fails the file and leaves nothing of it. A group that fails is rolled back and its
files ingested one by one; a file read again (alone, or with every CPU operator) gets a read-ahead of
its own.

What keeps memory flat whatever the trace size (benchmarks/bench_scale.py measures it):
a few batches in flight; DuckDB's buffer pool is capped
(:data:`INGEST_MEMORY_LIMIT`: appended row groups go to the file as they fill); ranks from
``distributedInfo`` are filled in as rows go in, not by an UPDATE afterwards. Nothing process-wide
is changed (no GC thresholds, no glibc settings: measured, neither pays any more, BENCHMARKS.md).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import duckdb

from traceq import scratch
from traceq.catalog import StepMarker, check_parallelism
from traceq.errors import TraceFormatError, TraceqError
from traceq.ingest.inputs import check_run_name, expand_inputs, file_size, run_name_of
from traceq.ingest.native import NotNative, Part, count_batches, scratch_dir, write_parts
from traceq.ingest.reader import TraceHeader, read_trace, too_deep_is_not_json
from traceq.ingest.identity import check_rank, names_job, no_rank_note, run_of
from traceq.interrupts import interruptible, is_interrupt
from traceq.store.manage import forget_run, remove_traces
from traceq.store.schema import rollback
from traceq.store.warehouse import DEFAULT_DB, connect, environment_error

from traceq.ingest.digests import Digest, KnownDigests, file_digest, file_identity, stored_digest
from traceq.ingest.groups import Together
from traceq.ingest.pipeline import Batch, FileParse, ReadAhead, counting, decoded_batches, once_per_file
from traceq.ingest.results import FileResult, IngestSummary, Progress, not_utf8
from traceq.ingest.write import (
    INGEST_MEMORY_LIMIT,
    Counts,
    NeedsOps,
    OpsPolicy,
    Stored,
    check_marker,
    derive,
    finish_trace,
    free_rank,
    leading_rank,
    rank_of,
    require_events,
)


# Chunks the reader cuts a file into (bytes of JSON); traceq.ingest.native parses several per statement.
INGEST_CHUNK_BYTES = 8 << 20
MIN_CHUNK_BYTES = 1 << 20


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
            loader = Loader(con, run, rank, chunk_bytes, notify, native, marker, force=force)
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


# ---------------------------------------------------------------------------------------------
# writing (main process only)


class Loader:
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
        self.notify = once_per_file(notify)
        self.threads = con.execute("select current_setting('threads')").fetchall()[0][0]
        self.hasher = ThreadPoolExecutor(1, thread_name_prefix="traceq-hash")  # BLAKE3 releases the GIL
        # a file is hashed before it is read only when a file of its size is already in the
        # warehouse (else the hash is taken beside the parsing)
        self.known = KnownDigests(con.execute("select size_bytes, content_digest from traces").fetchall())
        self.runs = {r for (r,) in con.execute("select run from runs").fetchall()}  # as of the last commit
        self.pending: list[Stored] = []  # stored in the open transaction, steps not derived yet
        self.uncommitted: list[tuple[int, str]] = []  # (size, digest) of the files the open transaction holds
        self._scratch: list[scratch.ScratchDir] = []  # every scratch directory made, removed by close()
        self._scratch_lock = threading.Lock()  # the reader thread makes them too
        self.listed: dict[str, tuple[int, ...] | None] = {}  # each file as it was before any was read

    def changed(self, path: Path) -> str | None:
        """Why ``path`` is not the file it was when the ingest listed it (device, inode, size, mtime), or
        None: a file rewritten while it was read would be stored mixed, under a digest of neither."""
        if self.listed.get(str(path)) == file_identity(path):
            return None
        return (f"{path}: the file changed while traceq read it (written, replaced or removed): nothing of it "
                "was stored; ingest it again once it is complete")

    def close(self) -> None:
        """Stop the hashing thread and remove every scratch directory this loader made: each is
        removed as soon as its file is done, and here again whatever happened in between (an interrupt
        between two statements hands a directory to no one). The reading threads have ended by now
        (:meth:`ReadAhead.close` joins its thread)."""
        self.hasher.shutdown(cancel_futures=True)
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

    def load(self, paths: list[Path]) -> Iterator[FileResult]:
        """Ingest ``paths``, yielding each file's result in input order.

        One thread parses ahead (:class:`ReadAhead`), within a file and across file boundaries: the
        next file's first batch is parsed while this one's rows are written, its steps attributed and
        its transaction committed. Small files are written several to a transaction (:class:`Together`):
        many small rank files are otherwise bound by the statements each file's steps take. A file
        read again (with every CPU operator, or alone after its group failed) gets a read-ahead of its
        own (:meth:`read_alone`).
        """
        self.listed.update((str(p), file_identity(p)) for p in paths)
        if not self.native:
            for path in paths:
                yield self._load(path)
            return
        with closing(ReadAhead(self, paths)) as ahead, closing(Together(self)) as together:
            for path in paths:
                try:
                    parse, digest = ahead.next_file(path)
                except TraceqError as exc:  # it could not be opened or hashed
                    yield from together.commit()
                    yield FileResult(str(path), "failed", str(exc))
                    continue
                try:
                    if parse is not None and parse.small:
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
        (held, run), = known[:1]
        into = f" into run {self.run}" if self.run is not None and self.run != run else ""  # --name went unused
        return FileResult(str(path), "skipped", f"{path}: already ingested (as {held}, run {run}); "
                          f"--force reads it again{into}", run=run)

    def _replace(self, path: Path, digest: str, size: int) -> list[str]:
        """Remove the trace(s) of this file's content, or of this file (its path: written again since,
        with other content), in the file's transaction (``force``); a note for each."""
        digests = {digest} | ({stored} if (stored := stored_digest(path, digest, self.known.of_size(size))) else set())
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

    def _load(self, path: Path, parse: FileParse | None = None, taken_digest: str | None = None) -> FileResult:
        """Ingest one file in a transaction of its own; ``parse``: its batches parsed ahead
        (:class:`ReadAhead`), else it is read here; ``taken_digest``: its digest, where the reader
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
        except duckdb.Error as exc:  # out of memory, a full disk, a lock: this file is not in, nothing of it
            if is_interrupt(exc):  # an error of a statement Ctrl-C stopped: the ingest stops
                raise KeyboardInterrupt from None
            return FileResult(str(path), "failed", f"{path}: {environment_error(exc) or str(exc).splitlines()[0]}")
        result.seconds = time.perf_counter() - started
        return result

    def _before_reading(self, path: Path, taken_digest: str | None) -> tuple[int, Digest] | FileResult:
        """``path``'s size and digest (taken now where a file of its size is in the warehouse, else
        beside the parse); its result instead where it is not to be read (it is in the warehouse
        already, or names no run)."""
        size = file_size(path)
        try:
            run_name_of(path, self.run)  # a directory name that cannot name a run fails before the work
            known = self.known.of_size(size)
            if not known:
                return size, Digest.beside(self.hasher, path)
            digest = Digest.taken(taken_digest or file_digest(path))
            skipped = self._already(path, stored_digest(path, digest.value(), known) or digest.value())
        except TraceqError as exc:
            return FileResult(str(path), "failed", str(exc))
        return (size, digest) if skipped is None else skipped

    def _in_transaction(
        self, path: Path, digest: Digest, size: int, parse: FileParse | None = None
    ) -> FileResult:
        """Read ``path`` in one transaction: with DuckDB, else (:class:`NotNative`) roll back and
        decode with :mod:`traceq.ingest.decode`; on :class:`NeedsOps` roll back and read again with every
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
                if not native:  # DuckDB refused the decoder's rows: a fault of traceq's, read no third way
                    raise TraceFormatError(f"{path}: DuckDB refused the rows traceq.ingest.decode read ({why}); "
                                           "nothing was stored. Please report it, with the file") from None
                native, reason = False, str(why)
                continue
            except NeedsOps:
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
        self, path: Path, digest: Digest, size: int, all_ops: bool | None = None,
        parse: FileParse | None = None,
    ) -> FileResult:
        """Parse ``path`` with DuckDB, batch by batch (:mod:`traceq.ingest.native`), or take the batches
        parsed ahead (``parse``)."""
        parse_start = time.perf_counter()
        trace_id = self._next_trace_id()
        with closing(parse or self.read_alone(path, all_ops)) as parsed:
            header, fill = parsed.header, leading_rank(parsed.header)
            counts = self._write(path, trace_id, parsed.batches, parsed.policy, fill)
        return self._finish_file(path, trace_id, header, digest, size, counts, fill, parse_start)

    def _write(self, path: Path, trace_id: int, batches: Iterable[Batch], policy: OpsPolicy, fill: int | None) -> Counts:
        """Write the parsed ``batches`` of ``path``, whichever parser made their rows, as rows of
        ``trace_id`` (``fill``: the rank of events that name none); the counts of its events."""
        con = self.con
        counts = Counts()
        n_names = 0
        # a batch parsed before the policy switched holds its CPU operators: written without
        # them once the trace showed device activity, else with them (deleted at the end if it
        # shows some later, drop_plain_ops); parsing it again cost more (11 ms a small file)
        for taken in batches:
            files, used, events = taken.files, taken.all_ops, taken.rows
            del taken  # its rows are let go of below, once written
            (batch,) = count_batches(con, events, [files])
            policy.saw(batch.gpu)  # before the writes: the reader cuts its next batch by it
            keep_ops = used and policy.all_ops  # parsed with them, and still no device activity
            n_names += write_parts(con, events, [Part(files, trace_id, n_names, fill, keep_ops)])
            del events  # written: its rows go before the next batch is waited for
            files.remove()
            counts.add_batch(batch, keep_ops)
            counts.require_usable(path)
        return counts

    def read_alone(self, path: Path, all_ops: bool | None = None) -> FileParse:
        """``path``'s batches from a read-ahead of its own (:class:`ReadAhead`), parsed under
        ``all_ops``: for a file read again in a transaction of its own."""
        ahead = ReadAhead(self, [path], all_ops=all_ops, skip_known=False)
        try:
            parse, _ = ahead.next_file(path)
        except BaseException:
            ahead.close()
            raise
        assert parse is not None  # skip_known: it is read whatever the warehouse holds
        parse.after = ahead.close
        return parse

    def _chunked(self, path: Path, digest: Digest, size: int, all_ops: bool | None = None) -> FileResult:
        """Decode ``path`` chunk by chunk with :mod:`traceq.ingest.decode` in this process, and write
        its rows as DuckDB's (:meth:`_write`)."""
        parse_start = time.perf_counter()
        trace_id = self._next_trace_id()
        header, chunks = read_trace(path, self.chunk_bytes)
        policy = OpsPolicy(header.leading, self.marker, all_ops)
        batches = decoded_batches(counting(chunks, self.notify, path, size), policy)
        fill = leading_rank(header)
        counts = self._write(path, trace_id, batches, policy, fill)
        return self._finish_file(path, trace_id, header, digest, size, counts, fill, parse_start)

    def _finish_file(
        self, path: Path, trace_id: int, header: TraceHeader, digest: Digest, size: int, counts: Counts,
        fill: int | None, parse_start: float,
    ) -> FileResult:
        """After the events of a file are in: its rank and its traces row; its steps, step
        attribution and side files come with :meth:`derive_pending`."""
        con = self.con
        require_events(path, counts)
        if counts.skipped_ops and not counts.gpu:
            raise NeedsOps
        # the file may be in the warehouse after all: a copy earlier in this transaction, or (its
        # digest taken beside the parse) a file of its size and content an earlier one committed
        if (size, digest.value()) in self.uncommitted or (
            not digest.checked and digest.value() in self.known.of_size(size)
        ):
            skipped = self._already(path, digest.value())
            if skipped is not None:
                return skipped
        notes: list[str] = self._replace(path, digest.value(), size) if self.force else []
        file_rank, rank_source = rank_of(path, header.fields, self.rank, counts, notes)
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
        stored = finish_trace(
            con, path, trace_id, run, digest.value(), size, header.fields, counts, file_rank, rank_source,
            time.perf_counter() - parse_start, self.marker, new_run=run not in self.runs,
        )
        stored.result.notes.extend(notes)
        self.pending.append(stored)
        return stored.result

    def derive_pending(self) -> None:
        """Derive the steps of the traces stored in the open transaction (:func:`derive`)."""
        if self.pending:
            pending, self.pending = self.pending, []
            derive(self.con, pending, self.marker)

    def _next_trace_id(self) -> int:
        return self.con.execute("select nextval('trace_ids')").fetchall()[0][0]


