"""The hand-off between the parse stage and the writer: a job read (:class:`ParsedFile`, its
batches of rows, :class:`Batch`) and the parse stage run ahead of the writer on one thread (:class:`ReadAhead`),
across file boundaries: the next group is parsed while this one is written, within a budget of batches
and bytes (:class:`_Budget`). The main thread meets the parse stage only here: the reading thread makes
its :class:`~traceq.ingest.pipeline.Parser` itself."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import duckdb

from traceq import scratch
from traceq.errors import TraceqError
from traceq.ingest.native import BatchFiles, NeedsOps, NotNative, scratch_dir
from traceq.ingest.plan import GROUP_BYTES, FileJob

if TYPE_CHECKING:
    from traceq.ingest.reader import TraceHeader

# What a file's parse or write may end in that is the file's alone (the writer decodes it, reads it
# again with every CPU operator, or fails it: duckdb.Error is the machine's, out of memory or a full
# disk); an interrupt is none of them
FILE_ERRORS = (NotNative, NeedsOps, TraceqError, duckdb.Error)


@dataclass(frozen=True)
class Batch:
    """Parsed rows: by DuckDB, a relation on the parse cursor (with other files' batches where a group
    was parsed in one statement) and its scratch ``files``; decoded, an Arrow table of the same columns
    and no files. ``part`` (``files.part``) tells its rows."""

    files: BatchFiles
    rows: Any


def _nothing() -> None:
    pass


@dataclass
class ParsedFile:
    """A job read: its header (``fields`` complete once its batches are taken), whether its batches
    hold every CPU operator (``all_ops``), the batches (a list where the file is held whole, to be
    written again alone; else an iterator, each batch once, its files removed by the writer once
    written) or the ``error`` that stopped its reading. ``decoded``: why :mod:`traceq.ingest.decode`
    read it (None: DuckDB did). :meth:`close` stops the reading and removes its scratch files."""

    job: FileJob
    all_ops: bool = True
    header: TraceHeader | None = None
    batches: Iterable[Batch] = ()
    error: Exception | None = None
    decoded: str | None = None
    stop: Callable[[], None] = _nothing

    def close(self) -> None:
        stop, self.stop = self.stop, _nothing
        try:
            if not isinstance(self.batches, list) and hasattr(self.batches, "close"):
                self.batches.close()  # a generator: its reading stops (the file it reads is closed)
        finally:
            stop()


class Scratch:
    """The scratch directories of an ingest's batch files (both threads make them): each is removed
    as soon as its file is done, and by :meth:`cleanup` whatever happened in between."""

    def __init__(self) -> None:
        self._made: list[scratch.ScratchDir] = []
        self._lock = threading.Lock()

    def make(self) -> scratch.ScratchDir:
        directory = scratch_dir()
        with self._lock:
            self._made.append(directory)
        return directory

    def cleanup(self) -> None:
        with self._lock:
            made, self._made = self._made, []
        for directory in made:
            directory.cleanup()


class Parser(Protocol):
    """What reads the jobs (:class:`traceq.ingest.pipeline.Parser`): a group of small files in one
    statement, or a large file batch by batch."""

    def group(self, jobs: list[FileJob]) -> list[ParsedFile]: ...

    def alone(self, job: FileJob, all_ops: bool | None = None) -> ParsedFile: ...


# What the reading thread hands the writer, group by group, in plan order: a group of small files
# parsed (Group); or a large file's Start, its Parsed batches and End, or Stop where a batch could not
# be cut or parsed (the writer raises it there).


@dataclass(frozen=True)
class Group:
    files: list[ParsedFile]


@dataclass(frozen=True)
class Start:
    file: ParsedFile  # its batches are the Parsed items that follow


@dataclass(frozen=True)
class Parsed:
    path: Path
    batch: Batch


@dataclass(frozen=True)
class End:
    path: Path
    error: Exception | None = None


Item = Group | Start | Parsed | End


class ReadAhead:
    """``groups`` parsed in a thread by the parser ``make_parser`` makes there (``interrupt`` stops its
    statement from another thread), ahead of the writer: parsed batches wait for it
    while fewer than :data:`AHEAD_BATCHES` (or, for groups of small files, :data:`AHEAD_BYTES` of JSON)
    do. DuckDB's errors (out of memory, a full disk) are the files': an interrupt is a
    KeyboardInterrupt by then (:func:`traceq.ingest.pipeline.parse_batches`), and ends the thread."""

    AHEAD_BATCHES = 2
    AHEAD_BYTES = GROUP_BYTES

    def __init__(self, make_parser: Callable[[], Parser], groups: list[list[FileJob]], interrupt: Callable[[], None]) -> None:
        self.budget = _Budget(self.AHEAD_BATCHES, self.AHEAD_BYTES)
        self.closed = threading.Event()  # the one stop signal: set by close(), or when the writer stops taking
        self.items = prefetch(self._produce(make_parser, groups), self.closed, discard=_discard, interrupt=interrupt)

    def _produce(self, make_parser: Callable[[], Parser], groups: list[list[FileJob]]) -> Iterator[Item]:
        parser = None  # made on this thread, which alone uses it, once it has work
        for jobs in groups:
            if self.closed.is_set():
                return
            if len(jobs) == 1 and not jobs[0].small:
                yield from self._one_file(parser := parser or make_parser(), jobs[0])
                continue
            self.budget.wait(small=True)  # before its files are cut: they take room too
            files = (parser := parser or make_parser()).group(jobs)
            self.budget.add(sum(f.job.json_bytes for f in files), len(files))
            yield Group(files)

    def _one_file(self, parser: Parser, job: FileJob) -> Iterator[Item]:
        """A large file's items, each batch parsed while the writer takes the one before."""
        f = parser.alone(job)
        batches, f.batches = iter(f.batches), ()  # closed here, in this thread
        try:
            yield Start(f)
        except BaseException:
            f.close()
            _close_quietly(batches)
            raise
        try:
            while True:
                self.budget.wait()
                if self.closed.is_set() or self.budget.abandoned(job.path):
                    break
                batch = next(batches, None)
                if batch is None:
                    break
                self.budget.add(batch.files.bytes)
                yield Parsed(job.path, batch)
                del batch  # the writer's now: not held while the next is cut and parsed
        except FILE_ERRORS as exc:
            yield End(job.path, exc)
            return
        finally:
            _close_quietly(batches)
        yield End(job.path, f.error)

    def next_group(self, jobs: list[FileJob]) -> list[ParsedFile]:
        """The group ``jobs`` read (they come in plan order)."""
        first = self._take(jobs[0].path)
        if isinstance(first, Group):
            return first.files
        assert isinstance(first, Start)
        f, path, done = first.file, jobs[0].path, False

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
                    if isinstance(item, End) and item.error is not None:
                        raise item.error

        remove = f.stop

        def stop() -> None:  # what is left of this file, when the writer stopped taking it early
            try:
                if not done:
                    self.budget.abandon(path)
                    try:
                        for batch in batches():
                            batch.files.remove()
                    except FILE_ERRORS:
                        pass  # the file is given up already
            finally:
                remove()

        f.batches, f.stop = batches(), stop
        return [f]

    def _take(self, path: Path) -> Item:
        try:
            item = next(self.items)
        except StopIteration:  # ended by an error already raised (an interrupt): nothing more comes
            raise RuntimeError(f"read-ahead ended before {path} was read") from None
        if isinstance(item, Parsed):
            self.budget.taken(item.batch.files.bytes)
        elif isinstance(item, Group):
            self.budget.taken(sum(f.job.json_bytes for f in item.files), len(item.files))
        got = item.files[0].job.path if isinstance(item, Group) else item.file.job.path if isinstance(item, Start) \
            else item.path
        if got != path:  # the writer takes files in the order they were planned
            raise RuntimeError(f"read-ahead out of order: {got} where {path} was expected")
        return item

    def close(self) -> None:
        self.closed.set()
        self.budget.close()  # a reader waiting for room sees `closed`
        self.items.close()


class _Budget:
    """How far the reading thread runs ahead of the writer: it parses another batch of a file while
    fewer than ``batches`` wait for the writer, and another group of small files while fewer than
    ``batches`` (a group's files count one each) or ``json_bytes`` of JSON wait. Also the files the writer stopped taking (cut no more)."""

    def __init__(self, batches: int, json_bytes: int) -> None:
        self._room = threading.Condition()
        self._limits = (batches, json_bytes)
        self._batches = self._bytes = 0
        self._closed = False
        self._abandoned: set[Path] = set()

    def wait(self, small: bool = False) -> None:
        """Wait for room for another batch (``small``: another group of small files), or :meth:`close`."""
        batches, json_bytes = self._limits
        with self._room:
            self._room.wait_for(
                lambda: self._closed or self._batches < batches or (small and self._bytes < json_bytes))

    def add(self, json_bytes: int, batches: int = 1) -> None:
        """``batches`` (a group: one per file) of ``json_bytes`` wait for the writer."""
        with self._room:
            self._batches += batches
            self._bytes += json_bytes

    def taken(self, json_bytes: int, batches: int = 1) -> None:
        with self._room:
            self._batches -= batches
            self._bytes -= json_bytes
            self._room.notify_all()

    def abandon(self, path: Path) -> None:
        with self._room:
            self._abandoned.add(path)

    def abandoned(self, path: Path) -> bool:
        with self._room:
            return path in self._abandoned

    def close(self) -> None:
        with self._room:
            self._closed = True
            self._room.notify_all()


def _discard(item: Item) -> None:
    """What :class:`ReadAhead` made and the writer will not take: scratch directories and files go."""
    if isinstance(item, Start):
        item.file.close()
    elif isinstance(item, Group):
        for f in item.files:
            f.close()
    elif isinstance(item, Parsed):
        item.batch.files.remove()  # the rows go with the cursor


def prefetch(
    items: Iterator[Any], stop: threading.Event, discard: Callable[[Any], None], interrupt: Callable[[], None],
) -> Iterator[Any]:
    """``items``, produced in a thread (reading and cutting overlap DuckDB's parsing); the producer
    bounds how far it runs ahead, and ends once ``stop`` is set.

    When the consumer stops early, ``stop`` is set, ``items`` is closed in its thread (its
    ``finally`` blocks run then, not when it is collected) and every item produced but not taken is
    given to ``discard`` (to remove its files) before this generator's ``close`` returns; the
    producer's statement is stopped (``interrupt``) and the thread joined, whatever comes meanwhile (a
    second Ctrl-C): a thread left inside DuckDB aborts the process at its exit.
    """
    q: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    discard(item)
                    return
                q.put(("item", item))
                del item  # not held while the next is produced (a parsed batch is ~100 MB)
            q.put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            q.put(("error", exc))
        finally:
            _close_quietly(items)

    thread = threading.Thread(target=produce, name="traceq-reader", daemon=True)
    try:
        thread.start()  # Ctrl-C while it starts: the producer may run, and is stopped below
        while True:
            kind, value = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
            del value  # nor while the consumer waits for the next
    finally:
        stop.set()
        taken: list[Any] = []  # discarded once the producer is gone: it may still be writing into them
        knocked = None
        while thread.is_alive():  # let the producer see `stop` (it may be waiting for room, ReadAhead.close)
            try:
                interrupt()
                _drain(q, taken.append)
                thread.join(timeout=0.05)
            except KeyboardInterrupt as exc:  # Ctrl-C again: raised once the thread is gone
                knocked = exc
        _drain(q, taken.append)
        for item in taken:
            discard(item)
        if knocked is not None:
            raise knocked


def _close_quietly(items: Iterator[Any]) -> None:
    """Close the generator ``items`` (its ``finally`` blocks run), in the producer thread. What that
    raises has no one to go to (the consumer has stopped taking, or has the error that ended it):
    dropped, never printed by the thread's excepthook as a traceback of its own."""
    close = getattr(items, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:
        pass


def _drain(q: queue.SimpleQueue[tuple[str, Any]], discard: Callable[[Any], None]) -> None:
    while True:
        try:
            kind, value = q.get_nowait()
        except queue.Empty:
            return
        if kind == "item":
            discard(value)
