"""The plan of an ingest, made once on the main thread before any file is read, from plain data: the
trace files the inputs name (:func:`expand_inputs`: files, globs, directories), what the user asked
(:class:`IngestOptions`) and the files the warehouse holds (:data:`Held`); one :class:`FileJob` per file
(its size, JSON size, run, digest where the warehouse needs it told, whether it is in already, its
group). Nothing after asks these again."""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from traceq.catalog import StepMarker
from traceq.errors import ConfigError, TraceqError
from traceq.ingest.digests import file_digest, stored_digest
from traceq.ingest.identity import run_name_of
from traceq.ingest.write import FileResult, skipped

TRACE_SUFFIXES = (".json", ".json.gz")
SIDE_FILE_SUFFIXES = (".run.json", ".power.jsonl")


def expand_inputs(inputs: Iterable[str | Path], notes: list[str] | None = None) -> list[Path]:
    """Files, globs and directories (searched recursively for ``*.json``/``*.json.gz``) -> trace paths.

    A named input that is not a regular file (a named pipe, a device, a socket), a symlink loop or
    an unreadable directory is refused (ConfigError naming it): reading one would block or never
    end. Inside a directory such entries are passed over, each with a line in ``notes``.
    """
    out: list[Path] = []
    notes = notes if notes is not None else []
    for item in inputs:
        text = str(item)
        matches = sorted(glob.glob(text, recursive=True)) if glob.has_magic(text) else [text]
        if not matches:
            raise ConfigError(f"{text}: the pattern matches no file")
        for m in matches:
            p = Path(m)
            kind = _kind(p)
            if kind == "directory":
                found = _walk(p, notes)
                if not found:
                    raise ConfigError(f"{p}: the directory holds no *.json or *.json.gz trace")
                out.extend(found)
            elif kind in ("file", "missing"):  # a missing file fails alone, in one line, at ingest
                out.append(p)
            elif "cannot be read" in kind:
                raise ConfigError(f"{p}: {kind}; check its permissions")
            else:
                raise ConfigError(f"{p}: {kind}; traceq reads trace files (.json, .json.gz) only")
    seen: set[Path] = set()
    return [p for p in out if not (p.resolve() in seen or seen.add(p.resolve()))]


@dataclass(frozen=True)
class IngestOptions:
    """What the user asked of an ingest: ``run`` (--name), ``rank`` (for files that name none), the step
    ``marker``, ``force`` (read again what is in; its earlier trace goes in the same transaction) and
    ``rank_if_none`` (the rank of a file that names none where the warehouse cannot tell which are
    free: a cluster task's private warehouse)."""

    run: str | None = None
    rank: int | None = None
    marker: StepMarker = StepMarker()
    force: bool = False
    rank_if_none: int | None = None


def _kind(path: Path) -> str:
    """file | directory | missing, or what else ``path`` is, in words."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "missing" if not path.is_symlink() else "a symlink to nothing"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        if not os.access(path, os.R_OK | os.X_OK):
            return "a directory that cannot be read (permission denied)"
        return "directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe, not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a regular file"
    return "not a regular file"


def _walk(root: Path, notes: list[str]) -> list[Path]:
    """Trace files under ``root`` (symlinked directories are not followed, so no loop)."""
    found: list[Path] = []

    def unreadable(exc: OSError) -> None:
        notes.append(f"{exc.filename}: directory passed over, it cannot be read ({exc.strerror})")

    for folder, _dirs, files in os.walk(root, onerror=unreadable):
        for name in sorted(files):
            if not name.endswith(TRACE_SUFFIXES) or name.endswith(SIDE_FILE_SUFFIXES):
                continue
            path = Path(folder) / name
            kind = _kind(path)
            if kind == "file":
                found.append(path)
            else:
                notes.append(f"{path}: passed over, {kind}")
    return sorted(found)


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


# The files in the warehouse: by file size, by content digest, (the path it was read from, its run)
Held = Mapping[int, Mapping[str, tuple[str, str]]]


def plan(paths: list[Path], held: Held, options: IngestOptions, *, native: bool) -> list[list[FileJob]]:
    """The jobs of ``paths`` as their groups, in order: the files of a group are parsed in one statement
    and written in one transaction. A file whose size the warehouse holds is hashed now, and skipped
    when its content is in (``held``; not with ``options.force``: its earlier trace is replaced). Small files (at most
    :data:`WHOLE_FILE_BATCH_BYTES` of JSON, read natively, without ``force``) share groups of up to
    :data:`GROUP_FILES` files and :data:`GROUP_BYTES`; any other file is a group of its own. A file
    whose name cannot be stored (:func:`not_utf8`) or whose run cannot be named fails here, in its place."""
    groups: list[list[FileJob]] = []
    json_total = 0
    run, force = options.run, options.force
    for path in paths:
        if (unnamed := not_utf8(path)) is not None:
            groups.append([FileJob(path, 0, 0, None, None, done=unnamed)])
            continue
        identity = file_identity(path)
        size = identity[2] if identity else 0
        try:
            digest, done = None, None
            if stored := held.get(size):
                digest = file_digest(path)
                match = stored_digest(path, digest, stored)
                done = skipped(path, stored[match], run) if match is not None and not force else None
            json_bytes = 0 if done else json_size(path)
            folder_run = run_name_of(path, run)  # a directory name that cannot name a run fails before the work
        except TraceqError as exc:
            groups.append([FileJob(path, size, 0, None, identity, done=FileResult(str(path), "failed", str(exc)))])
            continue
        small = native and not force and not done and json_bytes <= WHOLE_FILE_BATCH_BYTES
        job = FileJob(path, size, json_bytes, folder_run, identity, digest, done, small)
        if small and groups and groups[-1][-1].small and len(groups[-1]) < GROUP_FILES and json_total < GROUP_BYTES:
            groups[-1].append(job)
            json_total += json_bytes
        else:
            groups.append([job])
            json_total = json_bytes
    return groups


def file_identity(path: Path) -> tuple[int, ...] | None:
    """(device, inode, size, mtime ns) of ``path``; None where it cannot be looked at."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def json_size(path: Path) -> int:
    """Bytes of JSON in ``path``: its size, or for gzip the size recorded in the trailer.

    The gzip trailer holds the size modulo 4 GiB; a file whose compressed size is not below that
    figure counts as large (the caller only needs to know whether a file is small).
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(2) != b"\x1f\x8b":
                return size
            f.seek(-4, os.SEEK_END)
            recorded = int.from_bytes(f.read(4), "little")
    except OSError:
        return 0  # reading it names the problem
    return recorded if recorded >= size else 2**32 + recorded


def not_utf8(path: Path) -> FileResult | None:
    """The failed result of a file whose name is not UTF-8 text (DuckDB holds text as UTF-8: such a
    name cannot be stored), shown with its odd bytes escaped; None for any other name."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        return FileResult(shown, "failed", f"{shown}: the file's name is not UTF-8 text; rename it")
    return None
