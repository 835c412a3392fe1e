"""Reading ahead of the writer, in a thread (:class:`ReadAhead`): each file's chunks cut into batch
files and parsed by DuckDB while the batch before is written, and across files (the next file's
batches parsed while this one's are written; small files cut into runs parsed in one statement).
The writer takes a file as a :class:`FileParse`. A file read again (alone, or with every CPU
operator) gets a read-ahead of its own, beside the one that goes on with the files after it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from traceq import scratch
from traceq.errors import TraceqError
from traceq.ingest.inputs import file_size, json_size
from traceq.ingest.native import (
    BatchFiles,
    NotNative,
    batch_files,
    parse_batch,
    parse_batches,
    parser,
    prefetch,
)
from traceq.ingest.reader import Chunk, TraceHeader, read_trace_ranges

from traceq.ingest.digests import file_digest, stored_digest
from traceq.ingest.results import Progress
from traceq.ingest.write import OpsPolicy


# What a file's reading or parsing may end in that is the file's alone: the writer fails it (DuckDB's
# error: out of memory, a full disk) or decodes it (NotNative); an interrupt is none of them
FILE_ERRORS = (NotNative, TraceqError, duckdb.Error)

# A group of small files written in one transaction (traceq.ingest.groups.Together): at most this many
# files, and this many bytes of JSON (their parsed rows are held until the group is written)
GROUP_FILES = 16
GROUP_BYTES = 32 << 20


Counted = TypeVar("Counted", bound=Sized)  # a chunk of either reader (read_trace, read_trace_ranges)


@dataclass(frozen=True)
class Batch:
    """A batch parsed by DuckDB: its ``files`` (scratch files of whole events), whether it was parsed
    with every CPU operator (``all_ops``), and the parsed ``rows`` (a relation on the reading cursor;
    with other files' batches where a run of small files was parsed in one statement). Or a chunk
    decoded in this process (:func:`decoded_batches`): no files, its rows an Arrow table of the same columns."""

    files: BatchFiles
    all_ops: bool
    rows: Any


# What the reading thread hands the writer, file by file, in input order (ReadAhead.items): a file in
# the warehouse already (Known), one that could not be read (Stop), else Start, its Parsed batches
# and End, or Stop where a batch could not be cut or parsed (the writer raises it there).


@dataclass(frozen=True)
class Known:
    path: Path
    digest: str | None  # taken to tell


@dataclass(frozen=True)
class Stop:
    path: Path
    error: Exception


@dataclass(frozen=True)
class Start:
    path: Path
    header: TraceHeader
    policy: OpsPolicy
    json_bytes: int
    remove_scratch: Callable[[], Any]  # the file's scratch directory: the writer's to remove once it has this
    digest: str | None
    small: bool  # parsed in one batch with the small files beside it: written with them (Together)


@dataclass(frozen=True)
class Parsed:
    path: Path
    batch: Batch


@dataclass(frozen=True)
class End:
    path: Path


Item = Known | Stop | Start | Parsed | End


# Bytes of JSON decoded (traceq.ingest.decode) to a batch: a statement of the writer costs ms
# whatever its rows, and decoded rows take less memory than the chunks' Python objects (BENCHMARKS.md)
DECODE_BATCH_BYTES = 16 << 20
# A file of up to this much JSON is parsed in one batch: small first batches (while the policy may
# switch) would save little writing of CPU operators and cost a batch's statements (BENCHMARKS.md)
WHOLE_FILE_BATCH_BYTES = 16 << 20


def cut_batches(
    chunks: Iterator[Chunk], notify: Progress, path: Path, size: int, json_bytes: int, directory: str,
    policy: OpsPolicy,
) -> Iterator[BatchFiles]:
    """A file's ``chunks`` as batch files in ``directory``, counted for progress; small batches
    while ``policy`` may still switch, unless the file is small (``json_bytes`` of JSON)."""
    if json_bytes <= WHOLE_FILE_BATCH_BYTES:
        return batch_files(counting(chunks, notify, path, size), directory)
    return batch_files(counting(chunks, notify, path, size), directory, small=policy.undecided)


def parse_batch_files(cursor: Any, files: BatchFiles, policy: OpsPolicy) -> Batch:
    """``files`` parsed under ``policy`` as it is now (the writer may switch it meanwhile: the
    batch is written as parsed, :meth:`Loader._write`)."""
    used = policy.all_ops
    return Batch(files, used, parse_batch(cursor, files, used, policy.marker))


def decoded_batches(chunks: Iterator[bytes], policy: OpsPolicy, batch_bytes: int = DECODE_BATCH_BYTES) -> Iterator[Batch]:
    """``chunks`` decoded by :mod:`traceq.ingest.decode` under ``policy``: the rows DuckDB's parse
    gives (``sql/read_events.sql``), as Arrow, for the one writer; batches of no files. Each chunk's
    rows are made as it is decoded (its Python objects go with it); several chunks' rows, up to
    ``batch_bytes`` of JSON, are written together, one chunk at a time while the policy may switch
    (the writer switches it between batches: a batch's chunks are all decoded under one)."""
    import pyarrow as pa

    from traceq.ingest.decode import decode_chunk

    files, tables, size = BatchFiles(), [], 0
    for chunk in chunks:
        used = policy.all_ops
        tables.append(decode_chunk(chunk, used, policy.marker, files.part))
        size += len(chunk)
        if size >= batch_bytes or policy.undecided():
            yield Batch(files, used, pa.concat_tables(tables))
            files, tables, size = BatchFiles(), [], 0
    if tables:
        yield Batch(files, used, pa.concat_tables(tables))


@dataclass
class FileParse:
    """One file's parsed batches for :meth:`Loader._native`, in order, with the file's header and
    the policy they are parsed under. :meth:`close` stops the parsing (the batches not taken are
    dropped) and removes the file's scratch directory."""

    header: TraceHeader
    policy: OpsPolicy
    json_bytes: int  # of the file (inputs.json_size), taken once by whoever reads it
    batches: Iterator[Batch]
    stop: Callable[[], None]
    remove_scratch: Callable[[], Any]
    small: bool = False  # one batch, parsed with the small files beside it: written with them (Together)
    after: Callable[[], Any] = lambda: None  # then this (a read-ahead of its own closes)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            try:
                self.remove_scratch()
            finally:
                self.after()


class ReadAhead:
    """Files parsed in a thread, on a cursor of their own, ahead of the writer and across file
    boundaries (:meth:`Loader.load`). Items come in file order: for each file :class:`Known` (it is
    in the warehouse already: the writer skips it) or :class:`Stop` (it could not be read), else
    :class:`Start`, its :class:`Parsed` batches and :class:`End` (:class:`Stop` if a batch could not
    be cut or parsed: the exception, DuckDB's included, is raised where the writer takes that batch).
    DuckDB's errors (out of memory, a full disk) are the file's: an interrupt is a KeyboardInterrupt
    by then (:func:`traceq.ingest.native.parse_batches`), and ends the thread. Small files come in runs of up to a
    group's (:class:`Together`), their batches parsed in one statement. Parsed batches wait for the
    writer (:class:`_Ahead`): two, as within one file, or runs of small files up to
    :data:`AHEAD_BYTES` of JSON; the markers do not count.
    """

    AHEAD_BATCHES = 2
    AHEAD_BYTES = GROUP_BYTES

    def __init__(
        self, loader: Any, paths: list[Path], all_ops: bool | None = None, skip_known: bool = True,
    ) -> None:  # a traceq.ingest.loader.Loader
        self.loader = loader
        self.all_ops = all_ops  # the files' OpsPolicy (None: decided by each file's device activity)
        self.skip_known = skip_known  # tell files in the warehouse already (Known), not read
        self.cursor = parser(loader.con)
        self._abandoned: set[Path] = set()  # files the writer stopped reading: cut no more of them
        self._abandoned_lock = threading.Lock()
        self.ahead = _Ahead(self.AHEAD_BATCHES, self.AHEAD_BYTES)
        self.closed = threading.Event()  # the one stop signal: set by close(), or when the writer stops taking
        self.items = prefetch(self._produce(paths), self.closed, discard=_discard_item)

    def _known(self, path: Path, size: int) -> tuple[bool, str | None]:
        """Whether ``path`` is in the warehouse already (files of its size are: its digest tells),
        and the digest taken to tell."""
        known = self.loader.known.of_size(size) if self.skip_known else None
        if not known:
            return False, None
        digest = file_digest(path)
        return stored_digest(path, digest, known) is not None, digest

    def _produce(self, paths: list[Path]) -> Iterator[Item]:
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
                    yield Stop(path, exc)
                    continue
                if known:
                    yield from self._parse_run(run)
                    yield Known(path, digest)
                    continue
                policy = OpsPolicy(header.leading, loader.marker, self.all_ops)
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
                        cut_batches(chunks, loader.notify, path, size, json_bytes, run[-1].directory.name, policy))
                except (NotNative, TraceqError) as exc:
                    run[-1].error = exc
                if len(run) >= GROUP_FILES or sum(f.json_bytes for f in run) >= GROUP_BYTES:
                    yield from self._parse_run(run)
            yield from self._parse_run(run)
        finally:
            for f in run:  # not handed to the writer
                f.directory.cleanup()

    def _parse_run(self, run: list[_RunFile]) -> Iterator[Item]:
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
                except FILE_ERRORS:
                    pass  # one by one, below: the error goes to the file it is about
            for f in files:
                yield Start(f.path, f.header, f.policy, f.json_bytes, f.directory.cleanup, f.digest, small=True)
                handed += 1
                if f.error is not None:
                    yield Stop(f.path, f.error)
                    continue
                try:
                    for batch, used in ((b, u) for g, b, u in cut if g is f):
                        parsed = Batch(batch, used, events) if events is not None else parse_batch_files(
                            self.cursor, batch, f.policy)
                        self.ahead.add(batch.bytes)
                        yield Parsed(f.path, parsed)
                except FILE_ERRORS as exc:
                    yield Stop(f.path, exc)
                    continue
                yield End(f.path)
        finally:
            for f in files[handed:]:
                f.directory.cleanup()

    def _one_file(
        self, path: Path, size: int, json_bytes: int, header: TraceHeader, chunks: Iterator[Chunk],
        policy: OpsPolicy, digest: str | None,
    ) -> Iterator[Item]:
        """The items of a file parsed batch by batch, each batch while the writer takes the one before."""
        loader = self.loader
        directory = None
        handed = False  # once the writer has the scratch directory, it removes it
        try:
            directory = loader.scratch_dir()
            yield Start(path, header, policy, json_bytes, directory.cleanup, digest, small=False)
            handed = True
            batches = cut_batches(chunks, loader.notify, path, size, json_bytes, directory.name, policy)
            while True:
                self.ahead.wait()  # before the batch's files are written: they take room too
                files = None if self.closed.is_set() or self._is_abandoned(path) else next(batches, None)
                if files is None:
                    break
                batch = parse_batch_files(self.cursor, files, policy)
                self.ahead.add(files.bytes)
                yield Parsed(path, batch)
                del batch  # the writer's now: not held while the next is cut and parsed
        except FILE_ERRORS as exc:
            yield Stop(path, exc)
            return
        finally:
            if not handed and directory is not None:
                directory.cleanup()
        yield End(path)

    def _is_abandoned(self, path: Path) -> bool:
        with self._abandoned_lock:
            return path in self._abandoned

    def _take(self, path: Path) -> Item:
        try:
            item = next(self.items)
        except StopIteration:  # ended by an error already raised (an interrupt): nothing more comes
            raise RuntimeError(f"read-ahead ended before {path} was read") from None
        if isinstance(item, Parsed):
            self.ahead.taken(item.batch.files.bytes)
        if item.path != path:  # the writer takes files in the order they were given
            raise RuntimeError(f"read-ahead out of order: {item.path} where {path} was expected")
        return item

    def next_file(self, path: Path) -> tuple[FileParse | None, str | None]:
        """``path``'s parse (None where the writer skips the file, being in the warehouse) and its
        digest where the reader took it. Raises the error that kept the reader from opening it."""
        first = self._take(path)
        if isinstance(first, Known):
            return None, first.digest
        if isinstance(first, Stop):
            raise first.error
        assert isinstance(first, Start)
        done = False

        def batches() -> Iterator[Batch]:
            nonlocal done
            while not done:
                try:
                    item = self._take(path)
                except BaseException:  # an interrupt while waiting: the stream is over, nothing to drain
                    done = True
                    raise
                if isinstance(item, Parsed):
                    yield item.batch
                    del item  # the writer's now: not held while the next is awaited
                else:
                    done = True
                    if isinstance(item, Stop):
                        raise item.error

        def drain() -> None:  # what is left of this file, when the writer stopped taking it early
            if done:
                return
            with self._abandoned_lock:
                self._abandoned.add(path)
            try:
                for batch in batches():
                    batch.files.remove()
            except FILE_ERRORS:
                pass  # the file is given up already

        return FileParse(first.header, first.policy, first.json_bytes, batches(), stop=drain,
                         remove_scratch=first.remove_scratch, small=first.small), first.digest

    def close(self) -> None:
        self.closed.set()
        self.ahead.close()  # a reader waiting for room sees `closed`
        try:
            self.items.close()
        finally:
            self.cursor.close()


@dataclass
class _RunFile:
    """A small file cut by :class:`ReadAhead`, to be parsed with the files beside it."""

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
    (:meth:`ReadAhead._parse_run`) while fewer than ``batches`` or ``json_bytes`` of JSON wait. The
    writer holds a group's batches before it writes them (:class:`Together`): with a run being cut
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


def _discard_item(item: Item) -> None:
    """What :class:`ReadAhead` made and the writer will not take: scratch directories and files go."""
    if isinstance(item, Start):
        item.remove_scratch()
    elif isinstance(item, Parsed):
        item.batch.files.remove()  # the rows go with the cursor


def counting(chunks: Iterator[Counted], notify: Progress, path: Path, size: int) -> Iterator[Counted]:
    """Pass chunks through, reporting progress in (approximate) file bytes."""
    total = 0
    for c in chunks:
        total += len(c)
        yield c
        notify("bytes", {"uncompressed": len(c)})
    notify("file_read", {"bytes": size, "uncompressed": total, "path": str(path)})


def once_per_file(notify: Progress) -> Progress:
    """``notify``, told a file's bytes once per ingest: a file read again (its group rolled back,
    :class:`Together`; decoded after DuckDB could not read it) is not counted twice. Called from
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
