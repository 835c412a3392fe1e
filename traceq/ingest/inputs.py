"""What ingest is given: files, globs and directories, their sizes, and the run each belongs to."""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from traceq.catalog import check_run_name
from traceq.errors import ConfigError
from traceq.ingest.sidecar import collector_run_name

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


def run_name_of(path: Path, run: str | None) -> str:
    """The run a file belongs to: ``run`` if given; else the run its collector's run.json names (its
    ``"run"``: docs/explanation/metrics.md, trace identity); else the name of the file's directory as the path gives it (a link is
    not followed: a trace reached through a linked folder is in the run of the link's name, as its side
    files are the link's folder's)."""
    if run is not None:
        return check_run_name(run)
    named = collector_run_name(path)
    if named is not None:
        try:
            return check_run_name(named[0])
        except ConfigError as exc:
            raise ConfigError(f'{named[1]}: its "run" is no run name ({exc.message}); give the run a name') from None
    name = folder_name(path) or "default"
    try:
        return check_run_name(name)
    except ConfigError as exc:
        raise ConfigError(f"{path}: its directory's name is no run name ({exc.message}); give the run a name") from None


def folder_name(path: Path) -> str:
    """The name of ``path``'s directory as the path gives it, made absolute without following links
    (``runs/x/rank0.json`` -> ``x``, also where ``runs/x`` links to ``/data/job-17``)."""
    return Path(os.path.abspath(path)).parent.name
