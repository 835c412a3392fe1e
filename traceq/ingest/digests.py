"""Which files the warehouse holds already: a file's content digest (taken before it is read, or beside
the parse), the digests in the warehouse by file size, and a file's identity on disk (to tell a file
changed while it was read)."""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path


from traceq.ingest.reader import digest_in, file_digest


def file_identity(path: Path) -> tuple[int, ...] | None:
    """(device, inode, size, mtime ns) of ``path``; None where it cannot be looked at."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class Digest:
    """A file's content digest (:func:`traceq.ingest.reader.file_digest`): taken before the file is
    read (``checked``: the warehouse was asked whether it holds it), or in a thread beside the parse
    (:meth:`value` waits for it)."""

    def __init__(self, pending: Future[str], checked: bool) -> None:
        self._pending = pending
        self.checked = checked

    @classmethod
    def taken(cls, digest: str) -> Digest:
        done: Future[str] = Future()
        done.set_result(digest)
        return cls(done, checked=True)

    @classmethod
    def beside(cls, hasher: ThreadPoolExecutor, path: Path) -> Digest:
        return cls(hasher.submit(file_digest, path), checked=False)

    def value(self) -> str:
        """The digest; raises what hashing raised (:class:`TraceFormatError`: the file cannot be read)."""
        return self._pending.result()


class KnownDigests:
    """The content digests in the warehouse, by file size. The writer adds to it while the reader
    thread asks (:class:`ReadAhead`): under a lock, answers are copies."""

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


def stored_digest(path: Path, digest: str, known: Collection[str]) -> str | None:
    """The digest under which ``path`` (BLAKE3 ``digest``) is in the warehouse, if it is: a file
    ingested before BLAKE3 is known by its SHA-256. ``known``: the digests of files of its size."""
    return digest if digest in known else digest_in(path, set(known) - {digest})
