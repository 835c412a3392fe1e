"""The one writer of an ingest (:class:`Writer`): it owns the warehouse connection, what the warehouse
holds (digests by size, runs) and the digests taken beside the parse, and writes the parsed files it is
handed, whichever parser read them, in one pass: their rows (:mod:`traceq.ingest.native`), then each
one's rank and run (:mod:`traceq.ingest.identity`) and traces row, then their steps
(:mod:`traceq.ingest.write`), then the commit."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import duckdb

from traceq.errors import TraceFormatError
from traceq.ingest.digests import file_digest
from traceq.ingest.identity import distributed_rank, names_job, no_rank_note, rank_of, run_of
from traceq.ingest.native import Executor, Rows, write_rows
from traceq.ingest.plan import FileJob, IngestOptions, file_identity
from traceq.ingest.readahead import ParsedFile
from traceq.ingest.write import FileResult, Stored, derive, free_rank, replace, skipped, store_trace
from traceq.store.schema import fetch_one, rollback


class Writer:
    """Writes parsed files into the warehouse ``con``, each call one transaction (:func:`write_group`
    says which files go together); statements over parsed rows go through ``executor``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, options: IngestOptions, executor: Executor) -> None:
        self.con, self.options, self.executor = con, options, executor
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="traceq-hash")  # BLAKE3 releases the GIL
        self._digests: dict[Path, Future[str]] = {}
        self.held: dict[int, dict[str, tuple[str, str]]] = {}  # the files in the warehouse, committed (plan.Held)
        for size, digest, path, run in con.execute(
                "select size_bytes, content_digest, path, run from traces order by trace_id").fetchall():
            self.held.setdefault(size, {})[digest] = (path, run)
        self._runs = {r for (r,) in con.execute("select run from runs").fetchall()}  # as of the last commit

    def hash_beside(self, jobs: list[FileJob]) -> None:
        """Start hashing the files of ``jobs`` whose digest the plan did not take (beside the parse)."""
        for job in jobs:
            if job.digest is None and job.done is None and job.path not in self._digests:
                self._digests[job.path] = self._hasher.submit(file_digest, job.path)

    def write(self, files: list[ParsedFile]) -> list[FileResult]:
        """Write ``files`` in one transaction, committed once they are all in, rolled back when any
        fails (its error raised: a file's that failed to read, its ``error``; :class:`NeedsOps`;
        DuckDB's): their rows, one statement per table for the batches of them all; each one's rank,
        run and traces row; their steps. A file whose content is in already (committed, or earlier
        among ``files``) is skipped, not written."""
        started, options, con = time.perf_counter(), self.options, self.con
        con.begin()
        try:
            entries, copies = self._entries(files)
            # Kineto writes distributedInfo before the events: with it, ranks are filled as rows go in (an
            # UPDATE of every row afterwards would hold a copy of the column in memory)
            rows = [Rows(f.job.path, trace_id, distributed_rank(f.header.leading), f.all_ops, f.batches)  # type: ignore[union-attr]
                    for f, _, trace_id in entries]
            tallies = write_rows(con, rows, self.executor)
            stored: list[Stored] = []  # in
            pending: list[Stored] = []  # of those, the ones whose steps are not derived yet
            written: dict[tuple[int, str], tuple[str, str]] = {}  # the files in now: (size, digest) -> (path, run)
            for (f, digest, trace_id), r, counts in zip(entries, rows, tallies):
                path, header = f.job.path, f.header
                assert header is not None
                self.executor.step("traces row", [path])
                notes, emptied = (replace(con, path, digest, self.held.get(f.job.size, {}), f.job.run)
                                  if options.force else ([], []))
                self._runs.difference_update(emptied)
                file_rank, rank_source = rank_of(path, header.fields, options.rank, counts.rows_with_rank > 0, notes)
                job = names_job(path, header.fields)
                run = run_of(path, options.run, names_rank=file_rank is not None or counts.rows_with_rank > 0, job=job)
                fill_rank = file_rank
                if fill_rank is None and counts.rows_without_rank:  # a rank of its own: never shared by accident
                    if options.rank_if_none is None:
                        derive(con, pending, options.marker, self.executor)  # the ranks of the files before it are taken
                        pending, fill_rank = [], free_rank(con, run)
                    else:
                        fill_rank = options.rank_if_none
                    if not counts.rows_with_rank:
                        file_rank = fill_rank
                        notes.append(no_rank_note(path, run, file_rank, alone=options.run is None and not job))
                if counts.rows_without_rank and r.fill_rank is None:  # the header is complete only now
                    for table in ("gpu_events", "host_events", "trace_threads"):
                        con.execute(f"update {table} set rank = ? where trace_id = ? and rank is null", [fill_rank, trace_id])
                s = store_trace(con, trace_id, path, digest, f.job.size, header.fields, counts, run=run,
                                new_run=run not in self._runs, file_rank=file_rank, rank_source=rank_source,
                                marker=options.marker, seconds=time.perf_counter() - started)
                if lone := header.lone_surrogates:  # JSON allows them; UTF-8, msgspec and DuckDB do not (traceq.ingest.reader)
                    notes.append(f"{path}: {lone:,} lone surrogate escape{'s' * (lone > 1)} (such as \\ud800) in its "
                                 "strings replaced by U+FFFD")
                s.result.notes.extend(notes)
                if f.decoded is not None:
                    s.result.message = f"read by traceq.ingest.decode: {f.decoded}"
                stored.append(s)
                pending.append(s)
                written[f.job.size, digest] = (str(path.resolve()), run)
            for f in files:  # a file rewritten while it was read would be stored mixed, under a digest of neither
                if f.job.identity is None or file_identity(f.job.path) != f.job.identity:
                    raise TraceFormatError(
                        f"{f.job.path}: the file changed while traceq read it (written, replaced or removed): nothing "
                        "of it was stored; ingest it again once it is complete")
            derive(con, pending, options.marker, self.executor)
            con.commit()
        except BaseException:
            rollback(con)
            raise
        results = [s.result for s in stored]
        for result in results:  # the group's time, shared
            result.seconds = (time.perf_counter() - started) / len(results)
        for i, (path, key) in copies:  # a copy: of a committed file, or of one written before it (in now)
            results.insert(i, skipped(path, self.held.get(key[0], {}).get(key[1]) or written[key], options.run))
        for (size, digest), (path, run) in written.items():  # a copy of a file it holds is skipped from now on
            self.held.setdefault(size, {})[digest] = (path, run)
            self._runs.add(run)
        return results

    def _entries(self, files: list[ParsedFile]) -> tuple[list[tuple[ParsedFile, str, int]], list[tuple[int, tuple[Path, tuple[int, str]]]]]:
        """The files to write (each with its digest and trace id), and the copies: of files committed or
        earlier among ``files`` (their place, path and (size, digest)). Raises a file's reading error."""
        entries, copies = [], []
        keys: set[tuple[int, str]] = set()
        for i, f in enumerate(files):
            if f.error is not None:
                raise f.error
            digest = f.job.digest or self._digest(f.job.path)
            key = (f.job.size, digest)
            if not self.options.force and (digest in self.held.get(f.job.size, {}) or key in keys):
                copies.append((i, (f.job.path, key)))
                continue
            keys.add(key)
            entries.append((f, digest, fetch_one(self.con, "select nextval('trace_ids')")[0]))
        return entries, copies

    def _digest(self, path: Path) -> str:
        """``path``'s digest, taken beside the parse (:meth:`hash_beside`) or now."""
        pending = self._digests.get(path) or self._hasher.submit(file_digest, path)
        self._digests[path] = pending
        return pending.result()

    def close(self) -> None:
        """Stop the hashing thread."""
        self._hasher.shutdown(cancel_futures=True)
