"""The plan of an ingest, made once on the main thread before any file is read: one :class:`FileJob`
per input file, plain data (its size, JSON size, run, digest where the warehouse needs it told,
whether it is in already, its group). Nothing after asks these again."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from traceq.errors import TraceqError
from traceq.ingest.digests import file_digest, file_identity, stored_digest
from traceq.ingest.inputs import json_size, run_name_of
from traceq.ingest.results import FileResult

# A file of up to this much JSON is small: parsed in one batch, in one statement with the small files
# beside it, and written with them in one transaction (a statement costs ms whatever its rows)
WHOLE_FILE_BATCH_BYTES = 16 << 20
# A group of small files: at most this many files, and this many bytes of JSON (their parsed rows are
# held until the group is written)
GROUP_FILES = 16
GROUP_BYTES = 32 << 20


@dataclass(frozen=True)
class FileJob:
    """One input file as the plan has it: what the parse stage and the writer need, taken once."""

    path: Path
    size: int  # bytes as stored (0 where it cannot be looked at: reading it names the problem)
    json_bytes: int  # bytes of JSON (the gzip trailer's figure for a compressed file)
    run: str | None  # the run its folder (or --name) names; None where the file failed already
    identity: tuple[int, ...] | None  # (device, inode, size, mtime ns) when planned: a change fails it
    digest: str | None = None  # taken where the warehouse holds a file of its size, else beside the parse
    done: FileResult | None = None  # not to be read: in the warehouse already, or failed before reading
    small: bool = False  # parsed in one batch, with the small files of its group (else batch by batch, alone)


Known = Callable[[int], Collection[str]]  # the digests in the warehouse of files of a size
Already = Callable[[Path, str], "FileResult | None"]  # a file's result when its content is in


def plan(
    paths: list[Path], known: Known, already: Already, *, run: str | None, force: bool, native: bool,
) -> list[list[FileJob]]:
    """The jobs of ``paths`` as their groups, in order: the files of a group are parsed in one statement
    and written in one transaction. A file whose size the warehouse holds is hashed now, and skipped
    when its content is in (``already``: its result; not with ``force``). Small files (at most
    :data:`WHOLE_FILE_BATCH_BYTES` of JSON, read natively, without ``force``) share groups of up to
    :data:`GROUP_FILES` files and :data:`GROUP_BYTES`; any other file is a group of its own."""
    groups: list[list[FileJob]] = []
    json_total = 0
    for path in paths:
        identity = file_identity(path)
        size = identity[2] if identity else 0
        try:
            folder_run = run_name_of(path, run)  # a directory name that cannot name a run fails before the work
            digest, done = None, None
            if stored := known(size):
                digest = file_digest(path)
                held = stored_digest(path, digest, stored)
                done = already(path, held) if held is not None and not force else None
        except TraceqError as exc:
            groups.append([FileJob(path, size, 0, None, identity, done=FileResult(str(path), "failed", str(exc)))])
            continue
        json_bytes = 0 if done else json_size(path)
        small = native and not force and not done and json_bytes <= WHOLE_FILE_BATCH_BYTES
        job = FileJob(path, size, json_bytes, folder_run, identity, digest, done, small)
        if small and groups and groups[-1][-1].small and len(groups[-1]) < GROUP_FILES and json_total < GROUP_BYTES:
            groups[-1].append(job)
            json_total += json_bytes
        else:
            groups.append([job])
            json_total = json_bytes
    return groups
