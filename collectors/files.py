"""File names the collectors write, and how they are written without clobbering anything.

Layout, shared with `traceq ingest`: one directory per run, one set of files per rank::

    <out_dir>/<run>/rank<r>.trace.json.gz        Kineto trace (gzip of the Chrome-trace JSON)
    <out_dir>/<run>/rank<r>.cycle<k>.trace.json.gz  cycles k >= 1 when repeat != 1
    <out_dir>/<run>/rank<r>.run.json             run metadata (see `traceq.collectors.metadata`)
    <out_dir>/<run>/rank<r>.power.jsonl          power log (see `traceq.collectors.power`)

Files appear complete or not at all: each is written to a hidden temporary name in the same
directory and renamed into place. A rank claims its run.json with an exclusive create before it
writes anything, so two processes that believe they are the same rank of the same run (a reused run
name, a launcher that sets no RANK) cannot overwrite each other: the second one gets
`CollectorConfigError` before training starts, naming the file and the fix (a new run name, or
`overwrite=True` to replace an earlier attempt of this rank). No suffixes are invented: a file name
always says exactly which run and rank it holds.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from traceq.collectors.errors import CollectorConfigError

TRACE_FILE = "rank{rank}.trace.json.gz"
TRACE_CYCLE_FILE = "rank{rank}.cycle{cycle}.trace.json.gz"
RUN_FILE = "rank{rank}.run.json"
POWER_FILE = "rank{rank}.power.jsonl"

GZIP_LEVEL = 6  # level 9 costs ~2x the time for a few % smaller traces
_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def trace_file_name(rank: int, cycle: int) -> str:
    """Name of the trace of profiling cycle `cycle` (0-based) of rank `rank`."""
    if cycle == 0:
        return TRACE_FILE.format(rank=rank)
    return TRACE_CYCLE_FILE.format(rank=rank, cycle=cycle)


def claim_rank_files(run_dir: Path, rank: int, overwrite: bool) -> None:
    """Create `run_dir` and claim rank `rank`'s files there; refuse if another process owns them."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_file = run_dir / RUN_FILE.format(rank=rank)
    if overwrite:
        for pattern in (f"rank{rank}.trace.json.gz", f"rank{rank}.cycle*.trace.json.gz", POWER_FILE.format(rank=rank)):
            for old in run_dir.glob(pattern):
                old.unlink()
        run_file.touch()
        return
    try:
        fd = os.open(run_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise CollectorConfigError(
            f"{run_file}: already exists, from an earlier run with this name or another process that "
            f"thinks it is rank {rank}; pick a new run name, or pass overwrite=True to replace this rank's files"
        ) from None
    os.close(fd)
    for other in (run_dir / TRACE_FILE.format(rank=rank), run_dir / POWER_FILE.format(rank=rank)):
        if other.exists():
            run_file.unlink()
            raise CollectorConfigError(
                f"{other}: already exists; pick a new run name, or pass overwrite=True to replace this rank's files"
            )


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as JSON to `path` via a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(obj, out, indent=1, allow_nan=False)
        out.write("\n")
    os.replace(tmp, path)


def gzip_atomic(src: Path, dest: Path, remove_src: bool = True) -> None:
    """Gzip file `src` into `dest` (temporary name, then rename); remove `src` afterwards."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    with open(src, "rb") as fin, gzip.open(tmp, "wb", compresslevel=GZIP_LEVEL) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    os.replace(tmp, dest)
    if remove_src:
        src.unlink()


def read_base_time_ns(trace_json: Path) -> int | None:
    """`baseTimeNanoseconds` from the head of an uncompressed Kineto JSON file, or None if absent.

    Kineto writes it before "traceEvents", so reading the first 64 KiB avoids parsing the trace.
    """
    with open(trace_json, "rb") as f:
        head = f.read(1 << 16)
    match = _BASE_TIME.search(head)
    return int(match.group(1)) if match else None
