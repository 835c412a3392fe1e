"""Ingest on a Dask cluster: each task decodes one whole trace file into Parquet partitions.

Every task runs :func:`ingest_file_to_parquet` on a worker: it ingests the file into a private
in-memory DuckDB with the local ingest's own code (chunk by chunk, so memory stays bounded; steps
and step attribution by traceq's SQL),
and writes the result under the output directory in the layout of ``traceq export --parquet``
(files named ``trace<id>_<i>.parquet``; the ``traces`` file last). The client decides identity before
any task runs, as a local ingest does (:mod:`traceq.identity`): it reads each file's header and hands out
paths, trace ids and the rank each file gets if it names none (-1, -2, ... per run); it collects one
:class:`~traceq.ingest.FileResult` per file and refuses, in ingest's words, a file whose run holds its steps. A report then
runs on the directory (``traceq report --db DIR``), or :func:`traceq.store.export.import_parquet` loads
it into a warehouse.

Needs ``dask[distributed]`` (the ``traceq[dask]`` extra) on the client and on every worker, and the
trace files and the output directory at the same paths on every machine (a shared filesystem).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from contextlib import ExitStack, closing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from traceq.errors import ConfigError, TraceFormatError, TraceqError
from traceq.identity import GIVEN_RANKS, Claim, overlaps, rankless_ranks
from traceq.catalog import check_parallelism, check_rank, check_run_name
from traceq.ingest.identity import header_identity, run_of
from traceq.ingest.loader import IngestSummary, load
from traceq.ingest.pipeline import INGEST_CHUNK_BYTES
from traceq.ingest.plan import IngestOptions, expand_inputs, not_utf8
from traceq.ingest.write import FileResult
from traceq.ingest.digests import digest_in
from traceq.store.parquet import (
    TRACES,
    known_digests,
    next_trace_id,
    steps_by_trace,
    warehouse_tables,
    write_partitions,
)
from traceq.store.warehouse import connect


WORKER_WAIT_ENV = "TRACEQ_WORKER_WAIT_S"  # seconds to wait for a first worker to join the scheduler (default 60)
WORKER_WAIT_S = 60.0


def worker_wait_s(given: float | None = None) -> float:
    """How long to wait for a first worker on the scheduler: ``given``, else $TRACEQ_WORKER_WAIT_S, else 60 s."""
    if given is None:
        text = os.environ.get(WORKER_WAIT_ENV, "").strip()
        if not text:
            return WORKER_WAIT_S
        try:
            given = float(text)
        except ValueError:
            given = -1.0
        where = f"{WORKER_WAIT_ENV}={text!r}"
    else:
        where = f"--worker-wait {given:g}"
    if not 0 < given <= 86_400:
        raise ConfigError(f"{where}: give the seconds to wait for a first Dask worker, above 0 and at most 86400")
    return given


def wait_for_a_worker(client: Any, wait_s: float) -> None:
    """Return once the client's scheduler has a worker; ConfigError naming the scheduler and the fix after
    ``wait_s`` seconds (else tasks would wait for a worker forever, silently)."""
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError:
        address = client.scheduler.address
        raise ConfigError(
            f"no worker joined scheduler {address} in {wait_s:g} s: start dask workers (dask worker {address}) "
            f"or use traceq ingest (wait longer with --worker-wait or {WORKER_WAIT_ENV})"
        ) from None


def ingest_file_to_parquet(
    path: str,
    trace_id: int,
    out_dir: str,
    *,
    run: str | None = None,
    rank: int | None = None,
    skip_digests: frozenset[str] = frozenset(),
    chunk_bytes: int = INGEST_CHUNK_BYTES,
    rank_if_none: int | None = None,
) -> tuple[FileResult, str | None]:
    """Decode one trace file into Parquet partitions under ``out_dir`` as trace ``trace_id``.

    Runs on a cluster worker, in a private in-memory warehouse whose ``trace_ids`` sequence starts at
    ``trace_id``. Returns the file's result and its content digest (None if it failed).
    ``rank_if_none``: the rank the file gets if it names none (the client gives each file its own).
    Files are written to a staging folder first and moved into place with the ``traces`` file
    last, so a task that dies leaves no trace that a report reads.
    """
    started = time.perf_counter()
    trace_path = Path(path)
    if skip_digests:
        try:
            match = digest_in(trace_path, skip_digests)
        except TraceFormatError:
            match = None  # the ingest below names the problem
        if match is not None:
            return FileResult(path, "skipped", f"{path}: already in {out_dir}"), match
    root = Path(out_dir)
    staging = root / f".staging-trace{trace_id}"
    shutil.rmtree(staging, ignore_errors=True)
    con = connect(":memory:")
    try:
        con.execute("set threads = 1")  # a task per worker thread already
        con.execute("drop sequence trace_ids")
        con.execute(f"create sequence trace_ids start {int(trace_id)}")
        options = IngestOptions(run, rank, rank_if_none=rank_if_none)
        with closing(load(con, [trace_path], options, chunk_bytes=chunk_bytes)) as results:
            result = next(results)
        if result.status != "ingested":
            return result, None
        stored, digest = con.execute("select trace_id, content_digest from traces").fetchall()[0]
        if stored != trace_id:  # read a second time (with CPU operators, or by the decoder): a later id was drawn
            for table in warehouse_tables(con):
                if "trace_id" in table.columns:
                    con.execute(f"update {table.name} set trace_id = ? where trace_id = ?", [trace_id, stored])
            result.trace_id = trace_id
        write_partitions(con, staging, file_prefix=f"trace{trace_id}")
    finally:
        con.close()
    # the traces file last: a trace counts once its traces row is in place
    files = sorted(staging.rglob("*.parquet"), key=lambda f: f.relative_to(staging).parts[0] == TRACES)
    for f in files:
        target = root / f.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        f.replace(target)
    shutil.rmtree(staging, ignore_errors=True)
    result.seconds = time.perf_counter() - started
    return result, digest


def ingest_with_dask(
    inputs: Iterable[str | Path],
    out_dir: str | Path,
    *,
    client: Any = None,
    scheduler: str | None = None,
    processes: int | None = None,
    name: str | None = None,
    rank: int | None = None,
    chunk_bytes: int = INGEST_CHUNK_BYTES,
    worker_wait: float | None = None,
) -> IngestSummary:
    """Ingest trace files into a Parquet directory with one Dask task per file.

    Args:
        inputs: files, globs or directories (as for :func:`traceq.ingest.ingest_traces`), at paths
            every worker can read.
        out_dir: the Parquet directory (created; files already in it are skipped by content).
        client: a ``distributed.Client``; else one is made for ``scheduler``; else a local cluster of
            ``processes`` worker processes (default: one per CPU) is started for this call.
        scheduler: address of a running scheduler, e.g. ``tcp://10.0.0.5:8786``.
        name, rank: as for ``ingest_traces``.
        chunk_bytes: decode chunk size (bytes of JSON).
        worker_wait: seconds to wait for a first worker on the scheduler before giving up with a
            ConfigError (:func:`worker_wait_s`: default $TRACEQ_WORKER_WAIT_S, else 60).

    Returns one result per file, in input order.
    """
    check_rank(rank)
    if client is None and scheduler is None:
        check_parallelism(processes, "processes")
    run = name if name is None else check_run_name(name, "name")
    wait_s = worker_wait_s(worker_wait)
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ConfigError('Dask is not installed; pip install "traceq[dask]" on the client and every worker') from None
    with ExitStack() as owned:
        if client is None and scheduler is not None:
            try:
                client = owned.enter_context(Client(scheduler, timeout="30s"))
            except (ValueError, OSError, TimeoutError) as exc:
                raise ConfigError(f"no Dask scheduler reached at this address ({type(exc).__name__}: {exc}); give a "
                                  "running scheduler's address, e.g. tcp://head:8786", param="scheduler", value=scheduler) from None
        if client is None:  # a local cluster, for this call; Dask's own warnings (a worker slow to close, garbage
            # collection time) are not the command's output
            cluster = owned.enter_context(LocalCluster(n_workers=processes, threads_per_worker=1, processes=True,
                                                       dashboard_address=":0", silence_logs=logging.ERROR))
            client = owned.enter_context(Client(cluster))
        else:
            wait_for_a_worker(client, wait_s)
        return _ingest(client, inputs, out_dir, run=run, rank=rank, chunk_bytes=chunk_bytes)


def _ingest(
    client: Any, inputs: Iterable[str | Path], out_dir: str | Path, *, run: str | None, rank: int | None,
    chunk_bytes: int,
) -> IngestSummary:
    notes: list[str] = []
    paths = [p.resolve() for p in expand_inputs(inputs, notes)]
    root = Path(out_dir).resolve()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root}: is a file; pass a directory for the Parquet output")
    root.mkdir(parents=True, exist_ok=True)
    known = known_digests(root)
    first_id = next_trace_id(root)
    held = steps_by_trace(root)
    plan = _identities(paths, held, run, rank)  # decided here, before any task runs, as a local ingest does
    unnamed = [not_utf8(p) for p in paths]  # failed here: a task could not pass such a name on
    futures = [
        client.submit(
            ingest_file_to_parquet, str(p), first_id + i, str(root), run=run, rank=rank,
            skip_digests=frozenset(known.get(p.stat().st_size, ())) if p.exists() else frozenset(),
            chunk_bytes=chunk_bytes, rank_if_none=plan[i][0], pure=False,
        )
        for i, (p, failed) in enumerate(zip(paths, unnamed)) if failed is None
    ]
    results = _drop_duplicates(root, client.gather(futures))
    given = {str(p) for p, (_, rank_given) in zip(paths, plan) if rank_given}
    gathered = iter(_refuse_overlaps(root, held, results, given))
    return IngestSummary(files=[failed or next(gathered) for failed in unnamed], notes=notes)


def _identities(
    paths: list[Path], held: dict[int, tuple[str, str, list[tuple[int, int]]]], run: str | None, rank: int | None,
) -> list[tuple[int | None, bool]]:
    """Per file, the rank it gets if it names none, and whether its rank is one the user may give another
    (:data:`traceq.identity.GIVEN_RANKS`): read from its header, numbered -1, -2, ... per run below the ranks
    its run holds in the directory (:func:`traceq.identity.rankless_ranks`), as a local ingest numbers
    them. A file whose header cannot be read gets None: its task names the problem."""
    runs: list[str | None] = []
    given = []
    for path in paths:
        try:
            file_rank, source, job = header_identity(path, rank)
            runs.append(None if file_rank is not None else run_of(path, run, names_rank=False, job=job))
        except (TraceqError, OSError):
            runs.append(None)
            source = "unknown"
        given.append(source in GIVEN_RANKS)
    ranks: dict[str, list[int]] = {}
    for run_name, _, claims in held.values():
        ranks.setdefault(run_name, []).extend(r for r, _ in claims)
    return list(zip(rankless_ranks(runs, ranks), given))


def _remove_trace(root: Path, trace_id: int) -> None:
    """Remove a trace's files from ``root``: its traces file first, so that no reader sees half of it."""
    files = root.rglob(f"trace{trace_id}_*.parquet")
    for f in sorted(files, key=lambda f: f.relative_to(root).parts[0] != TRACES):
        f.unlink()


def _refuse_overlaps(
    root: Path, held: dict[int, tuple[str, str, list[tuple[int, int]]]], results: list[FileResult], given: set[str],
) -> list[FileResult]:
    """As a local ingest does, a file whose run already holds one of its (rank, step) fails
    (:func:`traceq.identity.overlaps`), here after the fact (the tasks ran apart): in input order, after the
    traces ``held`` in the directory before the call; its files are removed."""
    new = {r.trace_id: r for r in results if r.status == "ingested"}
    steps = steps_by_trace(root)
    claims = [Claim(t, path, run, rank, step) for t, (run, path, pairs) in held.items() for rank, step in pairs]
    mine = [Claim(t, new[t].path, steps[t][0], rank, step) for t in new if t in steps for rank, step in steps[t][2]]
    refused = {o.trace: o for o in overlaps(claims, mine, [t for t in new if new[t].path in given])}
    out = []
    for result in results:
        overlap = refused.get(result.trace_id) if result.status == "ingested" else None
        if overlap is not None:
            _remove_trace(root, result.trace_id)
            result = FileResult(result.path, "failed", overlap.message())
        out.append(result)
    return out


def _drop_duplicates(root: Path, results: list[tuple[FileResult, str | None]]) -> list[FileResult]:
    """Files with the same content given twice in one call: keep the first, remove the others' files."""
    first: dict[str, FileResult] = {}
    out = []
    for result, digest in results:
        if result.status == "ingested" and digest is not None:
            if digest in first:
                _remove_trace(root, result.trace_id)
                result = FileResult(result.path, "skipped", f"{result.path}: same content as {first[digest].path}")
            else:
                first[digest] = result
        out.append(result)
    return out
