"""Load Kineto trace files into the warehouse: one transaction per file, idempotent by content hash.

Two ways a file is decoded, both in worker processes, with the main process as the only writer:

- a large file is cut by the main process into chunks of whole events (:mod:`traceq.reader`) and
  its chunks are decoded in parallel (:mod:`traceq.decode`), at most
  :data:`CHUNKS_IN_FLIGHT_PER_WORKER` per worker, each inserted as it comes back;
- when several files are given, each file small enough to decode whole (:data:`WHOLE_FILE_BYTES`
  of JSON) is decoded by one worker from its path, so many rank files decode on all cores at once.

Either way the main process writes one file per transaction, in the order the files were given.

What keeps memory flat whatever the trace size (DESIGN §7; benchmarks/bench_scale.py measures it):
chunks in flight are bounded; rows reach DuckDB as one-shot Arrow streams (a registered table
would stay pinned until the commit); DuckDB's buffer pool is capped (:data:`INGEST_MEMORY_LIMIT`:
appended row groups go to the file as they fill); ranks from ``distributedInfo`` are filled in as
rows go in, not by an UPDATE afterwards; workers fork before duckdb is imported; glibc returns
large buffers to the OS (:func:`release_large_buffers`).
"""

from __future__ import annotations

import gc
import glob
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceq.decode import ChunkTables, decode_chunk, to_int
from traceq.errors import ConfigError, TraceFormatError, TraceqError
from traceq.reader import file_digest, read_trace

# duckdb (via traceq.warehouse and traceq.sidecar) is imported only once the workers have forked:
# a forked worker's resident memory includes every module its parent had loaded.
DEFAULT_DB = "traceq.duckdb"  # == traceq.warehouse.DEFAULT_DB

TRACE_SUFFIXES = (".json", ".json.gz")
SIDE_FILE_SUFFIXES = (".run.json", ".power.jsonl")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
# Chunks of a large file handed to workers (bytes of JSON). Smaller chunks cut the main process's
# buffers and each worker's working set (measured: 4 MB chunks peak ~100 MB lower than 8 MB, at
# the same speed); the decoded tables are a fraction of the chunk.
INGEST_CHUNK_BYTES = 4 << 20
CHUNKS_IN_FLIGHT_PER_WORKER = 2
# Files of up to this many bytes of JSON are decoded whole by one worker when several files are
# given; a worker holds at most a few such files' tables and the main process writes them in order.
WHOLE_FILE_BYTES = 32 << 20
FILES_IN_FLIGHT_PER_WORKER = 2
# DuckDB's buffer pool while ingesting: row groups are written to the file as they fill, so the
# pool only needs room for one file's steps and step attribution (which spill beyond it).
INGEST_MEMORY_LIMIT = "64MB"
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
# Decoding makes ~10 tracked objects per event, all alive until the chunk is converted: with the
# default thresholds the cyclic GC scans them over and over (measured: msgspec decode 163 -> 273
# MB/s per core, decode_chunk 89 -> 110 MB/s, with these). The objects hold no cycles.
DECODE_GC_THRESHOLDS = (100_000, 50, 100)

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
    chunk_bytes: int = INGEST_CHUNK_BYTES,
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
        progress: called as ``progress(event, info)`` for "start", "bytes", "file_read" and "done".

    A file that fails leaves nothing behind; the others still ingest. Re-ingesting a file whose
    content is already in the warehouse is a no-op reported as skipped.
    """
    paths = expand_inputs(inputs)
    release_large_buffers()
    notify = progress or (lambda event, info: None)
    summary = IngestSummary()
    n_workers = (os.cpu_count() or 1) if workers is None else workers
    # Workers start before DuckDB opens its threads, so forking them is safe (and unlike spawn,
    # fork does not re-run the caller's __main__ module).
    pool = _start_pool(n_workers) if n_workers > 0 else None
    try:
        from traceq.warehouse import connect

        con = connect(db)
    except BaseException:
        if pool is not None:
            pool.shutdown()
        raise
    try:
        con.execute(f"set memory_limit = '{INGEST_MEMORY_LIMIT}'")
        if pool is not None:
            con.execute("set threads = 1")  # the workers have the other cores
        notify("start", {"files": len(paths), "bytes": sum(_size(p) for p in paths)})
        loader = _Loader(con, run, rank, pool, n_workers, chunk_bytes, notify)
        with few_collections():  # matters when decoding here (workers=0); workers set it themselves
            for result in loader.load(paths):
                summary.files.append(result)
                notify("done", {"result": result})
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        con.close()
    return summary


def _start_pool(n_workers: int) -> ProcessPoolExecutor:
    method = "fork" if sys.platform == "linux" else "spawn"
    pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=get_context(method), initializer=_init_worker)
    list(pool.map(_noop, range(n_workers)))  # start every worker now
    return pool


def _noop(_: int) -> None:
    return None


def _init_worker() -> None:
    _exit_with_parent()
    gc.set_threshold(*DECODE_GC_THRESHOLDS)


def _exit_with_parent() -> None:
    """Linux: have the kernel kill this worker when the ingest process dies (even by SIGKILL)."""
    if sys.platform != "linux":
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)
    except (OSError, AttributeError):
        pass


@contextmanager
def few_collections() -> Iterator[None]:
    """Run the block with :data:`DECODE_GC_THRESHOLDS`, then restore the previous thresholds."""
    previous = gc.get_threshold()
    gc.set_threshold(*DECODE_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


def release_large_buffers() -> None:
    """Have glibc return buffers of 1 MB and more to the OS when freed (Linux only; else a no-op).

    By default glibc raises its mmap threshold after the first large free, so the main process's
    multi-MB chunk buffers end up in a heap that fragments and never shrinks (measured: ~30 MB more
    peak RSS at 1.5 GB). The price is page faults on each new buffer (~1 s of system time per GB);
    in the workers it bought nothing measurable, so only the main process does it.
    """
    if sys.platform != "linux":
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):
        pass  # not glibc (e.g. musl)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def json_size(path: Path) -> int:
    """Bytes of JSON in ``path``: its size, or for gzip the size recorded in the trailer.

    The gzip trailer holds the size modulo 4 GiB; a file whose compressed size is not below that
    figure counts as large (the caller only needs to know whether a file is small).
    """
    size = _size(path)
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
# decoding (runs in workers, or here when workers=0)


class _Names:
    """File-level interning of event names; maps each chunk's local ids to file ids."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def remap(self, chunk_names: list[str]) -> np.ndarray:
        ids = self.ids
        return np.fromiter((ids.setdefault(n, len(ids)) for n in chunk_names), dtype=np.int32, count=len(chunk_names))

    def table(self) -> pa.Table:
        return pa.table({"name_id": pa.array(range(len(self.ids)), pa.int32()), "name": list(self.ids)})


def _remapped(table: pa.Table, remap: np.ndarray) -> pa.Table:
    if table.num_rows == 0:
        return table
    ids = table.column("name_id").to_numpy()
    return table.set_column(table.schema.get_field_index("name_id"), "name_id", pa.array(remap[ids]))


@dataclass
class _Counts:
    """Running totals over a file's chunks."""

    events: int = 0
    gpu: int = 0
    host: int = 0
    dropped: int = 0
    rows_with_rank: int = 0  # events carrying their own args.rank
    rows_without_rank: int = 0

    def add(self, ct: ChunkTables) -> None:
        self.events += ct.counts.get("events", 0)
        self.gpu += ct.counts.get("gpu", 0)
        self.host += ct.counts.get("host", 0)
        self.dropped += ct.counts.get("dropped", 0)
        for t in (ct.gpu, ct.host, ct.meta):
            self.rows_without_rank += t.column("rank").null_count
        for t in (ct.gpu, ct.host):
            self.rows_with_rank += t.num_rows - t.column("rank").null_count


@dataclass
class DecodedFile:
    """A whole trace file decoded by one worker: its tables (ranks filled in) and header facts."""

    digest: str
    size: int
    skipped: bool = False
    fields: dict[str, Any] = field(default_factory=dict)
    names: pa.Table | None = None
    gpu: pa.Table | None = None
    host: pa.Table | None = None
    meta: pa.Table | None = None
    counts: _Counts = field(default_factory=_Counts)
    file_rank: int | None = None
    rank_source: str = "unknown"
    seconds: float = 0.0


def decode_file(path: Path, chunk_bytes: int, option_rank: int | None, skip_digests: frozenset[str]) -> DecodedFile:
    """Decode the whole trace at ``path`` into Arrow tables, unless its digest is in ``skip_digests``.

    Runs in a worker process. Raises :class:`TraceFormatError` naming the file.
    """
    started = time.perf_counter()
    digest = file_digest(path)
    out = DecodedFile(digest=digest, size=_size(path))
    if digest in skip_digests:
        out.skipped = True
        return out
    header, chunks = read_trace(path, chunk_bytes)
    names = _Names()
    parts: dict[str, list[pa.Table]] = {"gpu": [], "host": [], "meta": []}
    for chunk in chunks:
        ct = decode_chunk(chunk)
        out.counts.add(ct)
        remap = names.remap(ct.names)
        parts["gpu"].append(_remapped(ct.gpu, remap))
        parts["host"].append(_remapped(ct.host, remap))
        parts["meta"].append(ct.meta)
    _require_events(path, out.counts)
    out.fields = header.fields
    out.file_rank, out.rank_source = _rank_of(path, out.fields, option_rank, out.counts)
    out.names = names.table()
    for key, tables in parts.items():
        setattr(out, key, _with_rank(pa.concat_tables(tables).combine_chunks(), -1 if out.file_rank is None else out.file_rank))
    out.seconds = time.perf_counter() - started
    return out


def _with_rank(table: pa.Table, rank: int | None) -> pa.Table:
    """``table`` with a null rank (the event named none) set to ``rank``."""
    if rank is None or table.column("rank").null_count == 0:
        return table
    filled = pc.fill_null(table.column("rank"), pa.scalar(rank, pa.int64()))
    return table.set_column(table.schema.get_field_index("rank"), "rank", filled)


def _require_events(path: Path, counts: _Counts) -> None:
    if counts.events == 0:
        raise TraceFormatError(f"{path}: the trace holds no events; was the profiler started (schedule active > 0)?")


def _rank_of(path: Path, fields: dict[str, Any], option_rank: int | None, counts: _Counts) -> tuple[int | None, str]:
    """The file's rank and where it came from (DESIGN §1)."""
    dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
    rank = to_int(dist.get("rank"))
    if rank is not None:
        return rank, "distributedInfo"
    if option_rank is not None:
        file_rank, source = option_rank, "option"
    else:
        m = _RANK_IN_NAME.search(path.name)
        file_rank, source = (int(m.group(1)), "file name") if m else (None, "unknown")
    return file_rank, ("event args" if counts.rows_with_rank else source)


# ---------------------------------------------------------------------------------------------
# writing (main process only)


def run_name_of(path: Path, run: str | None) -> str:
    """The run a file belongs to: ``run`` if given, else the name of the file's directory."""
    return run or path.resolve().parent.name or "default"


def write_decoded(con: Any, path: Path, dec: DecodedFile, run_name: str, trace_id: int) -> FileResult:
    """Write a decoded file as trace ``trace_id`` (inside the caller's transaction)."""
    for table, rows in (("names", dec.names), ("gpu_events", dec.gpu), ("host_events", dec.host), ("trace_threads", dec.meta)):
        _insert(con, table, rows, trace_id)
    return _finish_trace(
        con, path, trace_id, run_name, dec.digest, dec.size, dec.fields, dec.counts, dec.file_rank, dec.rank_source, dec.seconds
    )


def _finish_trace(
    con: Any,
    path: Path,
    trace_id: int,
    run_name: str,
    digest: str,
    size: int,
    fields: dict[str, Any],
    counts: _Counts,
    file_rank: int | None,
    rank_source: str,
    parse_seconds: float,
) -> FileResult:
    """Everything after the events are in: the traces row, steps, step attribution, side files."""
    from traceq.sidecar import load_side_files
    from traceq.warehouse import sql_text

    dist = fields.get("distributedInfo") if isinstance(fields.get("distributedInfo"), dict) else {}
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
            counts.events, counts.gpu, counts.host, counts.dropped, parse_seconds,
        ],
    )
    con.execute(sql_text("steps.sql"), {"trace_id": trace_id})
    con.execute(sql_text("step_attribution.sql"), {"trace_id": trace_id})
    load_side_files(con, trace_id, path, run_name)
    ranks = [r for (r,) in con.execute(
        "select distinct rank from gpu_events where trace_id = ? union select distinct rank from host_events "
        "where trace_id = ? order by 1", [trace_id, trace_id]).fetchall()]
    return FileResult(
        str(path), "ingested", trace_id=trace_id, run=run_name, ranks=ranks, events=counts.events, gpu_events=counts.gpu
    )


def ingest_in_process(
    con: Any, path: Path, *, run: str | None = None, rank: int | None = None, chunk_bytes: int = INGEST_CHUNK_BYTES
) -> FileResult:
    """Ingest one file into the open warehouse ``con`` in this process, chunk by chunk (no workers).

    The trace id comes from the warehouse's ``trace_ids`` sequence. One transaction.
    """
    with few_collections():
        return next(_Loader(con, run, rank, None, 0, chunk_bytes, lambda event, info: None).load([path]))


class _Loader:
    """Schedules decoding on the pool and writes each file in one transaction, in input order."""

    def __init__(
        self,
        con: Any,
        run: str | None,
        rank: int | None,
        pool: ProcessPoolExecutor | None,
        n_workers: int,
        chunk_bytes: int,
        notify: Progress,
    ) -> None:
        self.con = con
        self.run = run
        self.rank = rank
        self.pool = pool
        self.n_workers = n_workers
        self.chunk_bytes = chunk_bytes
        self.notify = notify
        # Digests by file size: a file is hashed before it is decoded only when a file of its size
        # is already in the warehouse (else the hash is taken beside the decoding).
        self.known: dict[int, set[str]] = {}
        for size, digest in con.execute("select size_bytes, content_sha256 from traces").fetchall():
            self.known.setdefault(size, set()).add(digest)

    def load(self, paths: list[Path]) -> Iterator[FileResult]:
        """Ingest ``paths``, yielding each file's result in input order."""
        window: deque[tuple[Path, Future[DecodedFile]]] = deque()
        for path in paths:
            if self.pool is None or len(paths) == 1 or json_size(path) > WHOLE_FILE_BYTES:
                while window:
                    yield self._write_whole(*window.popleft())
                yield self._load_chunked(path)
                continue
            skip = frozenset(self.known.get(_size(path), ()))
            window.append((path, self.pool.submit(decode_file, path, self.chunk_bytes, self.rank, skip)))
            # write what is ready; wait only when the window of decoded files is full
            while window and (len(window) > FILES_IN_FLIGHT_PER_WORKER * self.n_workers or window[0][1].done()):
                yield self._write_whole(*window.popleft())
        while window:
            yield self._write_whole(*window.popleft())

    def _already(self, path: Path, digest: str) -> FileResult | None:
        known = self.con.execute("select path, run from traces where content_sha256 = ?", [digest]).fetchall()
        if not known:
            return None
        self.notify("bytes", {"bytes": _size(path)})
        return FileResult(str(path), "skipped", f"{path}: already ingested (as {known[0][0]}, run {known[0][1]})", run=known[0][1])

    def _write_whole(self, path: Path, future: Future[DecodedFile]) -> FileResult:
        try:
            dec = future.result()
        except TraceqError as exc:
            self.notify("file_read", {"bytes": _size(path)})
            return FileResult(str(path), "failed", str(exc))
        skipped = self._already(path, dec.digest)
        if skipped is not None:
            return skipped
        self.notify("file_read", {"bytes": dec.size})
        started = time.perf_counter()  # seconds = the worker's decoding + this write, not the wait in between
        con = self.con
        con.begin()
        try:
            result = write_decoded(con, path, dec, run_name_of(path, self.run), self._next_trace_id())
            con.commit()
        except BaseException:
            con.rollback()
            raise
        self.known.setdefault(dec.size, set()).add(dec.digest)
        result.seconds = dec.seconds + time.perf_counter() - started
        return result

    def _load_chunked(self, path: Path) -> FileResult:
        started = time.perf_counter()
        size = _size(path)
        digest: str | Future[str]
        try:
            if self.known.get(size) or self.pool is None:
                digest = file_digest(path)
                skipped = self._already(path, digest)
                if skipped is not None:
                    return skipped
            else:
                digest = self.pool.submit(file_digest, path)
        except TraceqError as exc:
            return FileResult(str(path), "failed", str(exc))
        con = self.con
        con.begin()
        try:
            result = self._chunked(path, digest, size)
            if result.status == "skipped":
                con.rollback()
            else:
                con.commit()
        except TraceqError as exc:
            con.rollback()
            return FileResult(str(path), "failed", str(exc))
        except BaseException:
            con.rollback()
            raise
        if result.status == "ingested":
            self.known.setdefault(size, set()).add(digest if isinstance(digest, str) else digest.result())
        result.seconds = time.perf_counter() - started
        return result

    def _chunked(self, path: Path, digest: str | Future[str], size: int) -> FileResult:
        """Decode ``path`` chunk by chunk on the pool, inserting as chunks come back."""
        con = self.con
        parse_start = time.perf_counter()
        trace_id = self._next_trace_id()
        header, chunks = read_trace(path, self.chunk_bytes)
        # Kineto writes distributedInfo before the events: with it, ranks are filled as rows go in
        # (an UPDATE of every row afterwards would hold a copy of the column in memory).
        dist = header.leading.get("distributedInfo")
        fill = to_int(dist.get("rank")) if isinstance(dist, dict) else None
        names = _Names()
        counts = _Counts()
        meta: list[pa.Table] = []
        for ct in _decoded_chunks(_counting(chunks, self.notify, size), self.pool, self.n_workers):
            counts.add(ct)
            remap = names.remap(ct.names)
            _insert(con, "gpu_events", _with_rank(_remapped(ct.gpu, remap), fill), trace_id)
            _insert(con, "host_events", _with_rank(_remapped(ct.host, remap), fill), trace_id)
            meta.append(_with_rank(ct.meta, fill))
        _require_events(path, counts)
        _insert(con, "names", names.table(), trace_id)
        _insert(con, "trace_threads", pa.concat_tables(meta), trace_id)
        if isinstance(digest, Future):
            digest = digest.result()
            skipped = self._already(path, digest)
            if skipped is not None:
                return skipped
        file_rank, rank_source = _rank_of(path, header.fields, self.rank, counts)
        if counts.rows_without_rank and fill is None:  # the header is complete only now
            for table in ("gpu_events", "host_events", "trace_threads"):
                con.execute(
                    f"update {table} set rank = ? where trace_id = ? and rank is null",
                    [-1 if file_rank is None else file_rank, trace_id],
                )
        if self.pool is not None:  # the workers are idle now: steps and attribution get every core
            con.execute("reset threads")
        try:
            return _finish_trace(
                con, path, trace_id, run_name_of(path, self.run), digest, size, header.fields, counts, file_rank,
                rank_source, time.perf_counter() - parse_start,
            )
        finally:
            if self.pool is not None:
                con.execute("set threads = 1")

    def _next_trace_id(self) -> int:
        return self.con.execute("select nextval('trace_ids')").fetchall()[0][0]


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
    in_flight: deque[Future[ChunkTables]] = deque([pool.submit(decode_chunk, first), pool.submit(decode_chunk, second)])
    limit = max(2, CHUNKS_IN_FLIGHT_PER_WORKER * n_workers)
    for c in chunks:
        in_flight.append(pool.submit(decode_chunk, c))
        while len(in_flight) >= limit:
            yield in_flight.popleft().result()
    while in_flight:
        yield in_flight.popleft().result()


def _counting(chunks: Iterator[bytes], notify: Progress, size: int) -> Iterator[bytes]:
    """Pass chunks through, reporting progress in (approximate) file bytes."""
    total = 0
    for c in chunks:
        total += len(c)
        yield c
        notify("bytes", {"uncompressed": len(c)})
    notify("file_read", {"bytes": size, "uncompressed": total})


def _insert(con: Any, table: str, rows: pa.Table | None, trace_id: int) -> None:
    if rows is None or rows.num_rows == 0:
        return
    columns = ", ".join(rows.column_names)
    # Registered as a one-shot stream: a registered pa.Table stays referenced by DuckDB until the
    # transaction ends, so the main process's memory would grow with the file.
    con.register("_chunk", pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches()))
    con.execute(f"insert into {table} (trace_id, {columns}) select ?, {columns} from _chunk", [trace_id])
    con.unregister("_chunk")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _header_summary(fields: dict[str, Any]) -> dict[str, Any]:
    """Top-level fields worth keeping (drops bulky log lists such as INFO/ERROR)."""
    return {k: v for k, v in fields.items() if k not in ("INFO", "ERROR", "WARNING")}
