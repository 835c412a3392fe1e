"""Commands that load traces: ``ingest``, ``ingest-cluster``, ``import-parquet``, ``migrate``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from traceq.cli.base import DbOption, NameOption, app, echo, resolved, shown
from traceq.errors import ConfigError
from traceq.store.warehouse import DEFAULT_DB

# the names these options had (until 0.1): --run selects runs in every other command, and --workers
# meant threads here and processes in ingest-cluster
FormerRunOption = Annotated[Optional[str], typer.Option("--run", hidden=True)]
FormerWorkersOption = Annotated[Optional[int], typer.Option("--workers", hidden=True)]


def _renamed(run: str | None, workers: int | None, count: str) -> None:
    """A ConfigError that names the option's new name, where a former one is given."""
    if run is not None:
        raise ConfigError(f"selects runs in the reports; name the run these traces go to with --name {run}",
                          param="run", value=run)
    if workers is not None:
        raise ConfigError(f"renamed: {count} {workers}", param="workers", value=workers)


@app.command()
def ingest(
    inputs: Annotated[list[str], typer.Argument(help="Trace files (.json, .json.gz), globs or directories.")],
    db: DbOption = Path(DEFAULT_DB),
    name: NameOption = None,
    rank: Annotated[Optional[int], typer.Option(help="Rank for files that name none (no distributedInfo, no per-event rank, none in the file name); without it each such file gets a rank of its own: -1, -2, ...")] = None,
    step_marker: Annotated[Optional[str], typer.Option(help="Regular expression naming the steps, for traces whose steps are not ProfilerStep#N, e.g. '^step\\[DECODE' or 'Optimizer.step#'. A group that captures an integer numbers the steps; else they are numbered 1, 2, ... in time order.")] = None,
    threads: Annotated[Optional[int], typer.Option(help="DuckDB threads (default: one per CPU; 1 to 4 per CPU); two of them parse a batch of files side by side.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Ingest files that are in the warehouse already: each one's earlier trace is replaced in the same transaction (e.g. to move it under another --name).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    run: FormerRunOption = None,
    workers: FormerWorkersOption = None,
) -> None:
    """Load Kineto traces into the warehouse (each file all or nothing; re-ingesting is a no-op unless --force).

    Steps are the ProfilerStep#N spans unless --step-marker names others; a trace with no step is
    reported over its whole timeline as one window. Each file's ranks belong to it alone: a file whose
    run already holds a step of one of its ranks is refused (the same trace twice, or two jobs in one
    run: use --name).

    Examples:

    \b
      traceq ingest runs/llama-8n/*.json.gz --db runs.duckdb --name llama-8n

      traceq ingest vllm_decode.json.gz --step-marker '^step\\[DECODE'
    """
    from traceq.ingest import ingest_traces

    _renamed(run, workers, "--threads")
    with _no_new_file_if_refused(db) as refused:
        summary = _with_progress(
            lambda progress: ingest_traces(
                inputs, db, name=name, rank=rank, threads=threads, progress=progress, step_marker=step_marker,
                force=force,
            ),
            enabled=not quiet and sys.stderr.isatty(),
        )
        refused.append(not summary.by_status("ingested"))
    for note in summary.notes:
        echo(f"note: {note}", err=True)
    for f in summary.files:
        if f.status == "ingested":
            ranks = ",".join(str(r) for r in f.ranks) or "none"
            echo(f"ingested {f.path}: run {f.run}, rank {ranks}, {f.events:,} events ({f.gpu_events:,} on GPU) in {f.seconds:.2f} s")
            for note in f.notes:
                echo(f"note: {note}", err=True)
        elif f.status == "skipped":
            echo(f"skipped {f.message}")
        else:
            echo(f"failed {f.message}", err=True)
    counts = {s: len(summary.by_status(s)) for s in ("ingested", "skipped", "failed")}
    echo(f"{counts['ingested']} ingested, {counts['skipped']} skipped, {counts['failed']} failed -> {shown(db)}")
    if not summary.ok:
        raise typer.Exit(code=1)


@contextmanager
def _no_new_file_if_refused(db: Path) -> Iterator[list[bool]]:
    """A warehouse ``db`` that this command made and then stored nothing in (every file refused, an error,
    Ctrl-C) is removed again when the block ends: a refused first ingest leaves no file. The block appends
    whether it stored nothing."""
    from traceq.store.manage import remove_if_empty

    fresh = not os.path.lexists(db)
    refused: list[bool] = []
    try:
        yield refused
    finally:
        if fresh and (not refused or refused[-1]) and os.path.isfile(db):
            remove_if_empty(db)


def _with_progress(work: Any, enabled: bool) -> Any:
    if not enabled:
        return work(None)
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("ingest"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[files]}"), TimeRemainingColumn(),
        console=__import__("rich.console").console.Console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task("ingest", total=None, files="")
        state = {"done": 0, "files": 0}

        def progress(event: str, info: dict[str, Any]) -> None:
            if event == "start":
                state["files"] = info["files"]
                bar.update(task, total=info["bytes"], files=f"0/{info['files']} files")
            elif event == "file_read" or (event == "bytes" and "bytes" in info):
                bar.advance(task, info["bytes"])
            elif event == "done":
                state["done"] += 1
                bar.update(task, files=f"{state['done']}/{state['files']} files")

        return work(progress)


@app.command("ingest-cluster")
def ingest_cluster(
    inputs: Annotated[list[str], typer.Argument(help="Trace files, globs or directories, at paths every worker can read.")],
    parquet: Annotated[Path, typer.Option("--parquet", callback=resolved, help="Output directory (same layout as `traceq export`), on storage every worker can write.")],
    scheduler: Annotated[Optional[str], typer.Option(help="Dask scheduler address, e.g. tcp://10.0.0.5:8786 (default: a local cluster).")] = None,
    processes: Annotated[Optional[int], typer.Option(help="Worker processes of the local cluster (default: one per CPU; 1 to 4 per CPU); ignored with --scheduler.")] = None,
    name: NameOption = None,
    rank: Annotated[Optional[int], typer.Option(help="Rank for files that name none.")] = None,
    worker_wait: Annotated[Optional[float], typer.Option(help="Seconds to wait for a first worker to join --scheduler before giving up in one line (default: $TRACEQ_WORKER_WAIT_S, else 60).")] = None,
    run: FormerRunOption = None,
    workers: FormerWorkersOption = None,
) -> None:
    """Ingest traces on a Dask cluster, one task per file, into a Parquet directory.

    Needs the dask extra (pip install "traceq[dask]") here and on every worker. Files already in
    the directory are skipped. Report on the directory, or load it into a warehouse with
    `traceq import-parquet`. A scheduler that no worker joins within --worker-wait seconds (60 by
    default) is given up on, naming the `dask worker` command to start.

    Example:

    \b
      traceq ingest-cluster /shared/runs/job1 --parquet /shared/tq/job1 --scheduler tcp://head:8786

      traceq report --metric exposed_comm --db /shared/tq/job1
    """
    from traceq.ingest.cluster import ingest_with_dask

    _renamed(run, workers, "--processes")
    summary = ingest_with_dask(inputs, parquet, scheduler=scheduler, processes=processes, name=name, rank=rank,
                               worker_wait=worker_wait)
    for note in summary.notes:
        echo(f"note: {note}", err=True)
    for f in summary.files:
        if f.status == "failed":
            echo(f"failed {f.message}", err=True)
        elif f.status == "skipped":
            echo(f"skipped {f.message}")
        else:
            for note in f.notes:
                echo(f"note: {note}", err=True)
    counts = {s: len(summary.by_status(s)) for s in ("ingested", "skipped", "failed")}
    echo(f"{counts['ingested']} ingested, {counts['skipped']} skipped, {counts['failed']} failed -> {shown(parquet)}")
    if not summary.ok:
        raise typer.Exit(code=1)


@app.command("import-parquet")
def import_parquet_command(
    parquet: Annotated[Path, typer.Argument(help="Parquet directory written by `traceq export` or `traceq ingest-cluster`.")],
    db: DbOption = Path(DEFAULT_DB),
) -> None:
    """Load a Parquet directory into the warehouse (traces already in it are skipped).

    Example:

      traceq import-parquet /shared/tq/job1 --db runs.duckdb
    """
    from traceq.store.export import import_parquet

    with _no_new_file_if_refused(db) as refused:
        added = import_parquet(parquet, db)
        refused.append(False)
    echo(f"imported {added} trace(s) from {shown(parquet)} -> {shown(db)}")


@app.command()
def migrate(db: DbOption = Path(DEFAULT_DB)) -> None:
    """Bring a warehouse made by an older traceq up to this traceq's schema, in one transaction.

    Reports never write to the warehouse: on an older one they stop and name this command. A writing
    command (ingest, runs set/rm/rename, rules --add, import-parquet) migrates it too, and says so.
    A DuckDB file that is not a traceq warehouse, or one made by a newer traceq, is left untouched.

    Example:

      traceq migrate --db runs-2025.duckdb
    """
    from traceq.store.schema import SCHEMA_VERSION
    from traceq.store.warehouse import connect, migrations

    if not db.exists():
        raise ConfigError(f"{db}: no warehouse here; give --db the warehouse to migrate")
    connect(db).close()
    done = migrations()
    echo(done[0] if done else f"{db}: already at schema {SCHEMA_VERSION}; nothing to do")
