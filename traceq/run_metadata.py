"""Run metadata: what the collector's ``rank<r>.run.json`` says about a run, plus what users set.

``runs.metadata`` holds the effective run-level values: the collector's (merged over the rank
files ingested so far) overlaid with the values set with ``traceq runs set``, which live in
``run_settings`` and survive later ingests. ``sql/run_metadata.sql`` turns them into typed columns
(world_size, tp, gpu, tokens_per_step, flops_per_step, peak_tflops, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from traceq import query
from traceq.catalog import gpu_peaks, peak_for
from traceq.errors import ConfigError
from traceq.warehouse import DEFAULT_DB, connect, fetch_one, to_polars

if TYPE_CHECKING:  # polars loads with the first report, not with ingest
    import polars as pl

# Values that differ between the rank files of one run: kept per rank in run_files, not in runs.metadata.
PER_RANK_KEYS = frozenset({
    "rank", "local_rank", "rank_source", "host", "pid", "clock", "trace_file", "trace_files", "power_file",
    "errors", "complete", "steps_seen", "traceq_run_metadata",
})


@dataclass(frozen=True)
class RunKey:
    """A run metadata value users may set: its key in runs.metadata, type and meaning."""

    key: str
    kind: type
    help: str


# Keys as the collector writes them (run.json), so that `runs set` corrects the same fields.
RUN_KEYS: tuple[RunKey, ...] = (
    RunKey("world_size", int, "ranks (GPUs) in the run"),
    RunKey("nodes", int, "nodes"),
    RunKey("gpus_per_node", int, "GPUs per node"),
    RunKey("tp", int, "tensor-parallel degree"),
    RunKey("pp", int, "pipeline-parallel degree"),
    RunKey("cp", int, "context-parallel degree"),
    RunKey("dp", int, "data-parallel degree"),
    RunKey("tokens_per_step", int, "global tokens per optimizer step (all ranks together)"),
    RunKey("global_batch_size", int, "sequences per optimizer step, all ranks"),
    RunKey("micro_batch_size", int, "sequences per rank and micro-step"),
    RunKey("model", str, "model name"),
    RunKey("seq_len", int, "sequence length T (tokens)"),
    RunKey("n_params_non_embedding", int, "N: non-embedding parameters (FLOPs convention 6N + 12LHQT)"),
    RunKey("n_layers", int, "L: layers"),
    RunKey("n_heads", int, "H: attention heads"),
    RunKey("head_dim", int, "Q: head dimension"),
    RunKey("model_flops_per_token", float, "model FLOPs per token (replaces 6N + 12LHQT)"),
    RunKey("flops_per_step", float, "global model FLOPs per optimizer step (replaces the per-token convention)"),
    RunKey("gpu_model", str, "GPU model, e.g. 'NVIDIA H100 80GB HBM3' (sets peak_tflops from the table)"),
    RunKey("peak_tflops", float, "peak dense BF16 TFLOP/s of one GPU (overrides the table)"),
    RunKey("warmup_steps", int, "recorded steps that reports skip"),
)
RUN_KEY_NAMES = tuple(k.key for k in RUN_KEYS)


def run_level(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The run-wide part of one rank's run.json (drops rank, host, clock and the like)."""
    return {k: v for k, v in metadata.items() if k not in PER_RANK_KEYS}


def settings(con: duckdb.DuckDBPyConnection, run: str) -> dict[str, Any]:
    """Values set for ``run`` with :func:`set_run_metadata`."""
    rows = con.execute("select key, value from run_settings where run = ? order by key", [run]).fetchall()
    return {key: json.loads(value) for key, value in rows}


def merge_run_metadata(con: duckdb.DuckDBPyConnection, run: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Merge collector ``values`` into ``runs.metadata`` of ``run``; user settings stay on top.

    Returns the effective metadata. The run row must exist.
    """
    row = fetch_one(con, "select metadata from runs where run = ?", [run])
    current = json.loads(row[0]) if row and row[0] else {}
    merged = {**current, **{k: v for k, v in values.items() if v is not None or k not in current}}
    merged.update(settings(con, run))
    con.execute("update runs set metadata = ? where run = ?", [json.dumps(merged), run])
    return merged


def _coerce(key: RunKey, value: Any) -> Any:
    if value is None:
        return None
    try:
        out = key.kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--{key.key.replace('_', '-')} {value!r}: expected {key.kind.__name__}") from None
    if key.kind in (int, float) and out <= 0:
        raise ConfigError(f"--{key.key.replace('_', '-')} {value!r}: must be positive")
    return out


def set_run_metadata(
    db: str | Path | duckdb.DuckDBPyConnection, run: str, values: Mapping[str, Any]
) -> dict[str, Any]:
    """Set (or correct) metadata of ``run``: keys from :data:`RUN_KEY_NAMES`; None values are ignored.

    Reports look the peak of ``gpu_model`` up in the peak table (:func:`traceq.catalog.peak_for`) unless
    ``peak_tflops`` is set; a GPU the table does not know needs ``peak_tflops`` with it (ConfigError),
    so that setting a GPU never silently leaves MFU without a peak. Returns the effective metadata.
    """
    known = {k.key: k for k in RUN_KEYS}
    bad = sorted(set(values) - set(known))
    if bad:
        raise ConfigError(f"unknown run metadata {bad}; settable: {', '.join(RUN_KEY_NAMES)}")
    given = {k: _coerce(known[k], v) for k, v in values.items() if v is not None}
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else connect(db)
    try:
        if fetch_one(con, "select 1 from runs where run = ?", [run]) is None:
            names = [r for (r,) in con.execute("select run from runs order by run").fetchall()]
            raise ConfigError(f"no run {run!r} in the warehouse; `traceq runs` lists them: {', '.join(names) or 'none'}")
        peak_by_hand = settings(con, run).get("peak_tflops_source") == "user"
        if "gpu_model" in given and "peak_tflops" not in given and not peak_by_hand and peak_for(given["gpu_model"]) is None:
            raise ConfigError(
                f"GPU {given['gpu_model']!r} is not in the peak table, so MFU would have no peak; give its dense BF16 "
                f"peak with it (--peak-tflops P); the table knows: {', '.join(p.gpu for p in gpu_peaks())}"
            )
        if "peak_tflops" in given:
            given["peak_tflops_source"] = "user"
        con.begin()
        try:
            con.executemany(
                "insert or replace into run_settings (run, key, value) values (?, ?, ?)",
                [(run, key, json.dumps(value)) for key, value in given.items()],
            )
            merged = merge_run_metadata(con, run, {})
            con.commit()
        except BaseException:
            con.rollback()
            raise
        return merged
    finally:
        if con is not db:
            con.close()


def run_metadata(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per run: its metadata as typed columns (see ``sql/run_metadata.sql``)."""
    from traceq.metrics import query_params

    return to_polars(query.run(con, "run_metadata", query_params()).order("run"))


def list_runs(db: str | Path | duckdb.DuckDBPyConnection = DEFAULT_DB) -> pl.DataFrame:
    """Runs in the warehouse: traces, ranks, the typed metadata and which values were set by hand."""
    from traceq.metrics import require_side_tables

    con = db if isinstance(db, duckdb.DuckDBPyConnection) else connect(db, read_only=True)
    try:
        require_side_tables(con)
        meta = run_metadata(con)
        counts = to_polars(con.sql(
            """
            select t.run, count(distinct t.trace_id) as traces, count(distinct s.rank) as ranks_with_steps,
                   (select string_agg(key, ',' order by key) from run_settings as u
                    where u.run = t.run and u.key <> 'peak_tflops_source') as set_by_user
            from traces as t
            left join steps as s using (trace_id)
            group by t.run
            """
        ))
    finally:
        if con is not db:
            con.close()
    return counts.join(meta, on="run", how="left").sort("run")


def list_traces(db: str | Path | duckdb.DuckDBPyConnection = DEFAULT_DB) -> pl.DataFrame:
    """Every trace file in the warehouse with what traceq took from it: its run, ranks, steps, GPU and
    where its rank came from. A (run, rank, step) comes from one file, so every report row traces back
    to one of these."""
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else connect(db, read_only=True)
    try:
        return to_polars(con.sql(
            """
            select
                t.run,
                string_agg(distinct s.rank::varchar, ',' order by s.rank::varchar) as ranks,
                t.rank_source,
                count(s.step) filter (where s.source = 'marker') as steps,
                min(s.step) filter (where s.source = 'marker') as first_step,
                max(s.step) filter (where s.source = 'marker') as last_step,
                t.gpu_model as gpu,
                t.n_events as events,
                t.n_gpu_events as device_events,
                t.step_marker,
                t.path
            from traces as t
            left join steps as s using (trace_id)
            group by t.trace_id, t.run, t.rank_source, t.gpu_model, t.n_events, t.n_gpu_events, t.step_marker, t.path
            order by t.run, min(s.rank), t.path
            """
        ))
    finally:
        if con is not db:
            con.close()
