"""Load Kineto trace files into the warehouse: one transaction per file, idempotent by content hash.

The main process decompresses and cuts each file into chunks of whole events
(:mod:`traceq.reader`); worker processes decode chunks into Arrow tables (:mod:`traceq.decode`);
the main process is the only writer. Memory stays bounded by the number of chunks in flight.
"""

from __future__ import annotations

import glob
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import numpy as np
import pyarrow as pa

from traceq.decode import ChunkTables, decode_chunk, to_int
from traceq.errors import ConfigError, TraceFormatError, TraceqError
from traceq.reader import CHUNK_BYTES, file_digest, read_trace
from traceq.sidecar import load_side_files
from traceq.warehouse import DEFAULT_DB, connect, fetch_one, sql_text

TRACE_SUFFIXES = (".json", ".json.gz")
SIDE_FILE_SUFFIXES = (".run.json", ".power.jsonl")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)

Progress = Callable[[str, dict[str, Any]], None]


@dataclass
class FileResult:
    """What happened to one input file."""

    path: str
    status: str  # ingested | skipped | failed
    message: str = ""
    trace_id: int | None = None
    run: str | None = None
    ranks: list[int] = field(default_factory=list)
    events: int = 0
    gpu_events: int = 0
    seconds: float = 0.0


@dataclass
class IngestSummary:
    """Per-file results of one :func:`ingest_traces` call."""

    files: list[FileResult] = field(default_factory=list)

    def by_status(self, status: str) -> list[FileResult]:
        return [f for f in self.files if f.status == status]

    @property
    def ok(self) -> bool:
        return not self.by_status("failed")


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


def ingest_traces(
    inputs: Iterable[str | Path],
    db: str | Path = DEFAULT_DB,
    *,
    run: str | None = None,
    rank: int | None = None,
    workers: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Progress | None = None,
) -> IngestSummary:
    """Ingest trace files into the warehouse at ``db``.

    Args:
        inputs: files, globs or directories.
        db: DuckDB warehouse path (created if missing).
        run: run name for every file (default: each file's parent directory name).
        rank: rank for files that name none (no distributedInfo.rank, no per-event rank).
        workers: decoding processes (default: the number of CPUs; 0 decodes in this process).
        chunk_bytes: size of the event chunks handed to workers (bytes of JSON).
        progress: called as ``progress(event, info)`` for "start", "bytes" and "done" events.

    A file that fails leaves nothing behind; the others still ingest. Re-ingesting a file whose
    content is already in the warehouse is a no-op reported as skipped.
    """
    paths = expand_inputs(inputs)
    notify = progress or (lambda event, info: None)
    summary = IngestSummary()
    n_workers = (os.cpu_count() or 1) if workers is None else workers
    # Workers start before DuckDB opens its threads, so forking them is safe (and unlike spawn,
    # fork does not re-run the caller's __main__ module).
    pool = _start_pool(n_workers) if n_workers > 0 else None
    try:
        con = connect(db)
    except BaseException:
        if pool is not None:
            pool.shutdown()
        raise
    try:
        notify("start", {"files": len(paths), "bytes": sum(_size(p) for p in paths)})
        for path in paths:
            result = _ingest_one(con, path, run, rank, pool, n_workers, chunk_bytes, notify)
            summary.files.append(result)
            notify("done", {"result": result})
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        con.close()
    return summary


def _start_pool(n_workers: int) -> ProcessPoolExecutor:
    method = "fork" if sys.platform == "linux" else "spawn"
    pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=get_context(method))
    list(pool.map(_noop, range(n_workers)))  # start every worker now
    return pool


def _noop(_: int) -> None:
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _ingest_one(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    run: str | None,
    rank: int | None,
    pool: ProcessPoolExecutor | None,
    n_workers: int,
    chunk_bytes: int,
    notify: Progress,
) -> FileResult:
    started = time.perf_counter()
    try:
        digest = file_digest(path)
    except FileNotFoundError:
        return FileResult(str(path), "failed", f"{path}: no such file; check the path or glob")
    except OSError as exc:
        return FileResult(str(path), "failed", f"{path}: cannot be read ({exc.strerror})")
    known = fetch_one(con, "select path, run from traces where content_sha256 = ?", [digest])
    if known is not None:
        notify("bytes", {"bytes": _size(path)})
        return FileResult(str(path), "skipped", f"{path}: already ingested (as {known[0]}, run {known[1]})", run=known[1])

    run_name = run or path.resolve().parent.name or "default"
    con.begin()
    try:
        result = _load_file(con, path, digest, run_name, rank, pool, n_workers, chunk_bytes, notify)
        con.commit()
    except TraceqError as exc:
        con.rollback()
        return FileResult(str(path), "failed", str(exc))
    except BaseException:
        con.rollback()
        raise
    result.seconds = time.perf_counter() - started
    return result


class _Names:
    """File-level interning of event names; maps each chunk's local ids to file ids."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.pending: list[str] = []

    def remap(self, chunk_names: list[str]) -> np.ndarray:
        ids = self.ids
        out = np.empty(len(chunk_names), dtype=np.int32)
        for i, name in enumerate(chunk_names):
            got = ids.get(name)
            if got is None:
                got = ids[name] = len(ids)
                self.pending.append(name)
            out[i] = got
        return out

    def flush(self) -> pa.Table:
        start = len(self.ids) - len(self.pending)
        table = pa.table({"name_id": pa.array(range(start, len(self.ids)), pa.int32()), "name": self.pending})
        self.pending = []
        return table


def _decoded_chunks(
    chunks: Iterator[bytes], pool: ProcessPoolExecutor | None, n_workers: int
) -> Iterator[ChunkTables]:
    """Decode chunks, in worker processes when there is more than one chunk; bounded in flight."""
    first = next(chunks, None)
    if first is None:
        return
    second = next(chunks, None)
    if second is None or pool is None:
        yield decode_chunk(first)
        if second is not None:
            yield decode_chunk(second)
            for c in chunks:
                yield decode_chunk(c)
        return
    in_flight: list[Future[ChunkTables]] = [pool.submit(decode_chunk, first), pool.submit(decode_chunk, second)]
    limit = max(2, 2 * n_workers)
    for c in chunks:
        in_flight.append(pool.submit(decode_chunk, c))
        while len(in_flight) >= limit:
            yield in_flight.pop(0).result()
    while in_flight:
        yield in_flight.pop(0).result()


def _load_file(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    digest: str,
    run_name: str,
    option_rank: int | None,
    pool: ProcessPoolExecutor | None,
    n_workers: int,
    chunk_bytes: int,
    notify: Progress,
) -> FileResult:
    parse_start = time.perf_counter()
    trace_id = fetch_one(con, "select nextval('trace_ids')")[0]
    header, chunks = read_trace(path, chunk_bytes)
    names = _Names()
    counts = {"events": 0, "gpu": 0, "host": 0, "dropped": 0}
    size = _size(path)
    for ct in _decoded_chunks(_counting(chunks, notify, size), pool, n_workers):
        remap = names.remap(ct.names)
        _insert(con, "names", names.flush(), trace_id)
        _insert(con, "gpu_events", _remapped(ct.gpu, remap), trace_id)
        _insert(con, "host_events", _remapped(ct.host, remap), trace_id)
        _insert(con, "trace_threads", ct.meta, trace_id)
        for key in counts:
            counts[key] += ct.counts.get(key, 0)
    if counts["events"] == 0:
        raise TraceFormatError(f"{path}: the trace holds no events; was the profiler started (schedule active > 0)?")

    fields = header.fields
    dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
    file_rank, rank_source = _file_rank(path, dist, option_rank)
    per_event = fetch_one(
        con,
        "select (select count(*) from gpu_events where trace_id = $t and rank is not null)"
        " + (select count(*) from host_events where trace_id = $t and rank is not null)",
        {"t": trace_id},
    )[0]
    if rank_source != "distributedInfo" and per_event:
        rank_source = "event args"
    fill = -1 if file_rank is None else file_rank
    for table in ("gpu_events", "host_events", "trace_threads"):
        con.execute(f"update {table} set rank = ? where trace_id = ? and rank is null", [fill, trace_id])

    con.execute("insert into runs (run) values (?) on conflict do nothing", [run_name])
    con.execute(
        """
        insert into traces (trace_id, run, path, content_sha256, size_bytes, rank_source, file_rank, world_size,
            backend, schema_version, base_time_ns, display_time_unit, trace_name, header, n_events, n_gpu_events,
            n_host_events, n_dropped, parse_seconds)
        values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        """,
        [
            trace_id, run_name, str(path.resolve()), digest, size, rank_source, file_rank,
            to_int(dist.get("world_size")), _text(dist.get("backend")), to_int(fields.get("schemaVersion")),
            to_int(fields.get("baseTimeNanoseconds")), _text(fields.get("displayTimeUnit")),
            _text(fields.get("traceName")), msgspec.json.encode(_header_summary(fields)).decode(),
            counts["events"], counts["gpu"], counts["host"], counts["dropped"], time.perf_counter() - parse_start,
        ],
    )
    con.execute(sql_text("steps.sql"), {"trace_id": trace_id})
    con.execute(sql_text("step_attribution.sql"), {"trace_id": trace_id})
    load_side_files(con, trace_id, path, run_name)
    ranks = [r for (r,) in con.execute(
        "select distinct rank from gpu_events where trace_id = ? union select distinct rank from host_events "
        "where trace_id = ? order by 1", [trace_id, trace_id]).fetchall()]
    return FileResult(
        str(path), "ingested", trace_id=trace_id, run=run_name, ranks=ranks,
        events=counts["events"], gpu_events=counts["gpu"],
    )


def _counting(chunks: Iterator[bytes], notify: Progress, size: int) -> Iterator[bytes]:
    """Pass chunks through, reporting progress in (approximate) file bytes."""
    total = 0
    for c in chunks:
        total += len(c)
        yield c
        notify("bytes", {"uncompressed": len(c)})
    notify("file_read", {"bytes": size, "uncompressed": total})


def _remapped(table: pa.Table, remap: np.ndarray) -> pa.Table:
    if table.num_rows == 0:
        return table
    ids = table.column("name_id").to_numpy()
    return table.set_column(table.schema.get_field_index("name_id"), "name_id", pa.array(remap[ids]))


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table, trace_id: int) -> None:
    if rows.num_rows == 0:
        return
    columns = ", ".join(rows.column_names)
    con.register("_chunk", rows)  # re-registering replaces it; no unregister needed on the error path
    con.execute(f"insert into {table} (trace_id, {columns}) select ?, {columns} from _chunk", [trace_id])
    con.unregister("_chunk")


def _file_rank(path: Path, dist: dict[str, Any], option_rank: int | None) -> tuple[int | None, str]:
    rank = to_int(dist.get("rank"))
    if rank is not None:
        return rank, "distributedInfo"
    if option_rank is not None:
        return option_rank, "option"
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1)), "file name"
    return None, "unknown"


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _header_summary(fields: dict[str, Any]) -> dict[str, Any]:
    """Top-level fields worth keeping (drops bulky log lists such as INFO/ERROR)."""
    return {k: v for k, v in fields.items() if k not in ("INFO", "ERROR", "WARNING")}
