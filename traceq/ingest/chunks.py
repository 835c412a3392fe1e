"""Whole events of a trace file as the reader hands them to DuckDB's parse, without copying them into
one buffer: a byte range of an uncompressed file (:class:`FileRange`) or consecutive pieces of what a
compressed one inflates (:class:`Pieces`); each appends itself to a batch file (``copy_to``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileRange:
    """Whole events as a byte range of an uncompressed trace file, copied without reading them into
    Python (:meth:`copy_to`, through ``fd``: valid while the iterator that yielded it has not moved
    on; later, the range can be read from ``path``)."""

    fd: int
    offset: int
    length: int
    path: Path

    def __len__(self) -> int:
        return self.length

    def copy_to(self, out_fd: int) -> None:
        """Append the range to the file open as ``out_fd`` (``sendfile``: the bytes stay in the kernel)."""
        offset, left = self.offset, self.length
        while left:
            sent = os.sendfile(out_fd, self.fd, offset, left)
            if sent == 0:
                raise OSError(f"the trace file ended {left} bytes before the range did (was it truncated while read?)")
            offset += sent
            left -= sent


@dataclass(frozen=True)
class Pieces:
    """Whole events as consecutive pieces of inflated bytes, not copied into one (that cost 0.45 CPU-s
    of the reader's 0.63 on a 553 MB trace, BENCHMARKS.md)."""

    parts: tuple[bytes | memoryview, ...]

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def copy_to(self, out_fd: int) -> None:
        """Append the pieces to the file open as ``out_fd``."""
        for part in self.parts:
            view = memoryview(part)
            while view:
                view = view[os.write(out_fd, view):]


Chunk = bytes | FileRange | Pieces
