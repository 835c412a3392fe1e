"""Small files written several to a transaction (:class:`Together`): one statement per table for all of
them, their steps derived at once; a group that fails is rolled back and its files ingested one by one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceq.errors import TraceqError
from traceq.ingest.native import NotNative, Part, count_batches, rows_of, write_parts
from traceq.ingest.reader import too_deep_is_not_json
from traceq.interrupts import is_interrupt

from traceq.ingest.digests import Digest
from traceq.ingest.pipeline import FILE_ERRORS, GROUP_BYTES, GROUP_FILES, Batch, FileParse
from traceq.ingest.results import FileResult
from traceq.ingest.write import Counts, NeedsOps, leading_rank


class Regroup(Exception):
    """A file of a :class:`Together` group cannot be written with the others (it needs another
    reading, or it failed): the group's transaction is rolled back and its files are ingested one by
    one."""


@dataclass
class _Held:
    """A small file parsed ahead, waiting for its group's writes (:class:`Together`)."""

    path: Path
    size: int
    digest: Digest
    parse: FileParse
    batch: Batch
    seconds: float  # spent on it before the group's writes
    result: FileResult | None = None  # once written, or skipped as a copy


class Together:
    """Small files written in one transaction, with one statement per table for all of them
    (:func:`traceq.ingest.native.write_parts`), their steps derived at once (:func:`derive`): a
    statement costs milliseconds whatever its rows, and a file takes about ten (BENCHMARKS.md, many
    files). The parsed rows of a group's files are held until it is full.

    Each file still leaves nothing behind when it fails. A file that cannot be held (it needs
    decoding, it has no events, it could not be cut) ends the group: the files before it are
    committed, then it is ingested alone. A copy of a file before it in the group is skipped, as
    alone. A file that cannot be written with the others (:class:`Regroup`), or a group whose steps
    clash, rolls the group back, and its files are ingested again one by one, each in its own
    transaction. Ctrl-C rolls the group back and stops.
    """

    FILES = GROUP_FILES  # files to a transaction, at most
    BYTES = GROUP_BYTES  # bytes of JSON to a transaction, at most (their parsed rows are held)

    def __init__(self, loader: Any) -> None:  # a traceq.ingest.loader.Loader
        self.loader = loader
        self.entries: list[_Held | FileResult] = []  # in input order; a result: a file not to be read
        self.bytes = 0
        self.open = False

    def add(self, path: Path, parse: FileParse, digest: str | None) -> Iterator[FileResult]:
        """Hold ``path``'s parsed batch for the group (``parse`` is this group's to close); yields
        the group's results once it is full and committed, and those of a file ingested alone."""
        started = time.perf_counter()
        try:
            ready = self.loader._before_reading(path, digest)
            batch = None if isinstance(ready, FileResult) else _single_batch(parse)
        except (Regroup, *FILE_ERRORS) as exc:  # it needs another reading, or fails:
            parse.close()  # alone, after the group
            if is_interrupt(exc):
                self.close()
                raise
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
                    raise Regroup
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
        row; :class:`Regroup` where a file needs another reading (decoding, every CPU operator). A
        copy of a file before it in the group is not written: it is skipped as a copy of that one, as
        it would be alone."""
        loader, con = self.loader, self.loader.con
        writers, copies, seen = [], [], set()
        for h in held:  # their digests: taken by now where the files are small
            key = (h.size, h.digest.value())
            (copies if key in seen else writers).append(h)
            seen.add(key)
        rows = rows_of(con, [(h.batch.rows, h.batch.files.part) for h in writers])
        try:
            counts = count_batches(con, rows, [h.batch.files for h in writers])
        except NotNative as exc:
            raise Regroup from exc
        parts, totals = [], []
        for h, batch in zip(writers, counts):
            files, used = h.batch.files, h.batch.all_ops
            h.parse.policy.saw(batch.gpu)
            keep_ops = used and h.parse.policy.all_ops  # parsed with them, and still no device activity
            total = Counts()
            total.add_batch(batch, keep_ops)
            totals.append(total)
            parts.append(Part(files, loader._next_trace_id(), 0, leading_rank(h.parse.header), keep_ops))
        write_parts(con, rows, parts)
        del rows
        for h, part, total in zip(writers, parts, totals):
            try:
                with too_deep_is_not_json(h.path):
                    result = loader._finish_file(  # its parse time: its own, not its group's wait
                        h.path, part.trace_id, h.parse.header, h.digest, h.size, total, part.fill_rank,
                        time.perf_counter() - h.seconds)
            except (NeedsOps, TraceqError) as exc:
                raise Regroup from exc
            if result.status != "ingested":  # in the warehouse after all: not expected, read alone
                raise Regroup
            loader.uncommitted.append((h.size, h.digest.value()))
            h.result = result
        for h in copies:  # the traces row of the file it copies is in now
            h.result = loader._already(h.path, h.digest.value())
            if h.result is None:  # not expected (--force files are read alone): read alone
                raise Regroup

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


def _single_batch(parse: FileParse) -> Batch:
    """The one batch of a small file (``parse.small``); :class:`Regroup` where it has none (no events:
    it fails alone) or, against expectation, more (their files go with ``parse``'s scratch directory)."""
    batches = list(parse.batches)
    if len(batches) != 1:
        raise Regroup
    return batches[0]
