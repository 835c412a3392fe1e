"""What ingest is given: files, globs and directories, their sizes, and the run each belongs to."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path

from traceq.errors import ConfigError

TRACE_SUFFIXES = (".json", ".json.gz")
SIDE_FILE_SUFFIXES = (".run.json", ".power.jsonl")


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files, globs and directories (searched recursively for ``*.json``/``*.json.gz``) -> trace paths."""
    out: list[Path] = []
    for item in inputs:
        text = str(item)
        matches = sorted(glob.glob(text, recursive=True)) if glob.has_magic(text) else [text]
        if not matches:
            raise ConfigError(f"{text}: the pattern matches no file")
        for m in matches:
            p = Path(m)
            if p.is_dir():
                found = sorted(q for q in p.rglob("*") if q.is_file() and _is_trace_name(q.name))
                if not found:
                    raise ConfigError(f"{p}: the directory holds no *.json or *.json.gz trace")
                out.extend(found)
            else:
                out.append(p)
    seen: set[Path] = set()
    return [p for p in out if not (p.resolve() in seen or seen.add(p.resolve()))]


def _is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES) and not name.endswith(SIDE_FILE_SUFFIXES)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def json_size(path: Path) -> int:
    """Bytes of JSON in ``path``: its size, or for gzip the size recorded in the trailer.

    The gzip trailer holds the size modulo 4 GiB; a file whose compressed size is not below that
    figure counts as large (the caller only needs to know whether a file is small).
    """
    size = file_size(path)
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return size
            f.seek(-4, os.SEEK_END)
            recorded = int.from_bytes(f.read(4), "little")
    except OSError:
        return size
    return recorded if recorded >= size else 2**32 + recorded


# ---------------------------------------------------------------------------------------------
# decoding with traceq.ingest.decode (the reference; files DuckDB would read differently)


def run_name_of(path: Path, run: str | None) -> str:
    """The run a file belongs to: ``run`` if given, else the name of the file's directory."""
    return run or path.resolve().parent.name or "default"
