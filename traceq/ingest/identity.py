"""Trace identity, decided here for both engines (docs/explanation/metrics.md, trace identity): which rank a file names, and which run
it belongs to. What its rows may hold beside other files' (one file per (run, rank, step); -1, -2, ... for files
that name no rank) is decided over rows in :mod:`traceq.identity`, for every path alike.

- Rank: ``distributedInfo.rank`` (when it is a rank, 0 to 2^31-1: another value is passed over with a
  note), else the events' ``args.rank`` (a file merging ranks), else the user's ``--rank``, else
  ``rank<N>`` in the file name, else a rank of its own in its run (:func:`traceq.identity.rankless_ranks`).
- Run: ``--name`` where given; else a file that says it belongs to a job (a ``distributedInfo``, a
  collector's ``rank<N>.run.json`` beside it, a rank it names or its events name) is in the run its
  run.json names (``"run"``), else in the run named after its directory (as the path gives it: links
  are not followed for names); a file that names no rank and no job is a run of its own, named after its
  directory and file (two unrelated traces in one folder are never averaged as two ranks of one job).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from traceq.catalog import MAX_RANK, check_run_name
from traceq.errors import ConfigError
from traceq.ingest.reader import read_trace
from traceq.ingest.sidecar import collector_run_name, find_side_file
from traceq.kineto import to_int

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_TRACE_ENDINGS = re.compile(r"(\.pt)?(\.trace)?\.json(\.gz)?$", re.IGNORECASE)


def distributed_rank(fields: dict[str, Any]) -> int | None:
    """``distributedInfo.rank`` of a trace's top-level ``fields`` when it is a rank (0 to 2^31-1), else None:
    a value out of range names no rank, for the rows as for the notes."""
    dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
    rank = to_int(dist.get("rank"))
    return rank if rank is not None and 0 <= rank <= MAX_RANK else None


def rank_of_file(path: Path, fields: dict[str, Any], option_rank: int | None) -> tuple[int | None, str]:
    """The rank a file names and where it comes from: distributedInfo.rank, else ``option_rank``, else
    rank<N> in its file name; (None, 'unknown') when none does. (The events' args.rank, for files that
    merge ranks, is read with the events.)"""
    rank = distributed_rank(fields)
    if rank is not None:
        return rank, "distributedInfo"
    if option_rank is not None:
        return option_rank, "option"
    m = _RANK_IN_NAME.search(path.name)
    return (int(m.group(1)), "file name") if m and int(m.group(1)) <= MAX_RANK else (None, "unknown")


def rank_of(
    path: Path, fields: dict[str, Any], option_rank: int | None, events_name_ranks: bool, notes: list[str]
) -> tuple[int | None, str]:
    """The file's rank and where it came from (:func:`rank_of_file`; 'event args' where its events name
    ranks, ``events_name_ranks``). A distributedInfo.rank that is no rank is passed over with a line in ``notes``, never silently."""
    file_rank, source = rank_of_file(path, fields, option_rank)
    if source == "distributedInfo":
        return file_rank, source
    source = "event args" if events_name_ranks else source
    dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
    if dist.get("rank") is not None:
        instead = {"option": "the rank given is used", "file name": "the rank in the file name is used",
                   "event args": "the ranks in the event args are used"}.get(source, "the file gets a rank of its own")
        notes.append(f"{path}: distributedInfo.rank {json.dumps(dist.get('rank'))[:40]} is not a rank "
                     f"(0 to {MAX_RANK}): passed over, {instead}")
    return file_rank, source


def header_identity(path: Path, option_rank: int | None = None) -> tuple[int | None, str, bool]:
    """What a file's header says of it before its events are read (Kineto writes distributedInfo first):
    its rank and where that comes from (:func:`rank_of_file`), and whether it names a job (:func:`names_job`)."""
    header, chunks = read_trace(path)
    chunks.close()
    rank, source = rank_of_file(path, header.leading, option_rank)
    return rank, source, names_job(path, header.leading)


def names_job(path: Path, fields: dict[str, Any]) -> bool:
    """Whether a file says it belongs to a job: a ``distributedInfo`` object, or a collector's run.json beside it."""
    return isinstance(fields.get("distributedInfo"), dict) or find_side_file(path, ".run.json") is not None


def own_run_name(path: Path) -> str:
    """The run of a file that names no rank and no job: its directory and its name without the trace
    endings (``runs/x/worker0.pt.trace.json.gz`` -> ``x/worker0``), so that files of one name in other
    directories (TensorBoard's ``worker0``) stay apart."""
    stem = _TRACE_ENDINGS.sub("", path.name) or path.name
    folder = folder_name(path)
    return f"{folder}/{stem}" if folder else stem


def run_of(path: Path, run: str | None, *, names_rank: bool, job: bool) -> str:
    """The run of ``path``: ``run`` where given; else its directory's name when it names a rank (itself or
    in its events' args) or a job; else a run of its own (:func:`own_run_name`)."""
    if run is not None or names_rank or job:
        return run_name_of(path, run)
    try:
        return check_run_name(own_run_name(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: its file name is no run name ({exc.message}); give the run a name") from None


def no_rank_note(path: Path, run: str, rank: int, *, alone: bool, verb: str = "stored") -> str:
    """The note on a file that names no rank: a run of its own (``alone``), or rank ``rank`` of ``run``."""
    head = f"{path} names no rank (no distributedInfo, event args or rank<N> in its name): "
    if alone:
        return head + (f"a run of its own, {run}, as rank {rank}; join it to others with --name NAME, "
                       "name its rank with --rank N")
    return head + f"{verb} as rank {rank} of run {run}; set one with --rank N"


def run_name_of(path: Path, run: str | None) -> str:
    """The run a file belongs to: ``run`` if given; else the run its collector's run.json names (its
    ``"run"``: docs/explanation/metrics.md, trace identity); else the name of the file's directory as the path gives it (a link is
    not followed: a trace reached through a linked folder is in the run of the link's name, as its side
    files are the link's folder's)."""
    if run is not None:
        return check_run_name(run)
    name = folder_name(path) or "default"
    named = collector_run_name(path)
    if named is not None:
        try:
            return check_run_name(named[0])
        except ConfigError as exc:
            raise ConfigError(f'{named[1]}: its "run" is no run name ({exc.message}); give the run a name') from None
    try:
        return check_run_name(name)
    except ConfigError as exc:
        raise ConfigError(f"{path}: its directory's name is no run name ({exc.message}); give the run a name") from None


def folder_name(path: Path) -> str:
    """The name of ``path``'s directory as the path gives it, made absolute without following links
    (``runs/x/rank0.json`` -> ``x``, also where ``runs/x`` links to ``/data/job-17``)."""
    return Path(os.path.abspath(path)).parent.name
