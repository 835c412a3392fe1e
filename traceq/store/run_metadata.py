"""Run metadata: what the collector's ``rank<r>.run.json`` says about a run, plus what users set.

``runs.metadata`` holds the effective run-level values: the collector's (merged over the rank
files ingested so far) overlaid with the values set with ``traceq runs set``, which live in
``run_settings`` and survive later ingests. ``sql/run_metadata.sql`` turns them into typed columns
(world_size, tp, gpu_model, tokens_per_step, flops_per_step, peak_tflops, ...).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import duckdb

from traceq.catalog import (
    PER_RANK_KEYS,
    RUN_KEY_NAMES,
    RUN_KEYS,
    RunKey,
)
from traceq.errors import ConfigError
from traceq.kineto import INT64_MAX
from traceq.peaks import gpu_peaks, peak_candidates
from traceq.store.schema import fetch_one, rollback
from traceq.store.warehouse import Warehouse, opened

if TYPE_CHECKING:  # polars loads with the first report, not with ingest
    pass

def run_level(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The run-wide part of one rank's run.json (drops rank, host, clock and the like)."""
    return {k: v for k, v in metadata.items() if k not in PER_RANK_KEYS}


def settings(con: duckdb.DuckDBPyConnection, run: str) -> dict[str, Any]:
    """Values set for ``run`` with :func:`set_run_metadata`."""
    rows = con.execute("select key, value from run_settings where run = ? order by key", [run]).fetchall()
    return {key: json.loads(value) for key, value in rows}


def merged_metadata(current: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` run-level metadata with a later rank file's ``values`` over it (a null value does
    not undo a known one): how the run.json files of a run add up, for both engines."""
    return {**current, **{k: v for k, v in values.items() if v is not None or k not in current}}


def merge_run_metadata(con: duckdb.DuckDBPyConnection, run: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Merge collector ``values`` into ``runs.metadata`` of ``run``; user settings stay on top.

    Returns the effective metadata. The run row must exist.
    """
    row = fetch_one(con, "select metadata from runs where run = ?", [run])
    merged = merged_metadata(json.loads(row[0]) if row and row[0] else {}, values)
    merged.update(settings(con, run))
    con.execute("update runs set metadata = ? where run = ?", [json.dumps(merged), run])
    return merged


def _coerce(key: RunKey, value: Any) -> Any:
    if value is None:
        return None
    try:
        out = key.kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"expected {key.kind.__name__}", param=key.key, value=value) from None
    if key.kind is float and not math.isfinite(out):
        raise ConfigError("must be a finite number", param=key.key, value=value)
    if key.kind is int and out > INT64_MAX:  # stored as JSON, read back as a bigint
        raise ConfigError(f"too large (the most is {INT64_MAX})", param=key.key, value=value)
    if key.key in _MAY_BE_ZERO:
        if out < 0:
            raise ConfigError("must be 0 or more", param=key.key, value=value)
    elif key.kind in (int, float) and out <= 0:
        raise ConfigError("must be positive", param=key.key, value=value)
    if key.kind is str and not out.strip():
        raise ConfigError("must not be empty", param=key.key, value=value)
    return out


_MAY_BE_ZERO = frozenset({"warmup_steps"})  # 0 resets a warm-up


def check_peak_known(gpu_model: str) -> None:
    """ConfigError unless the peak table gives ``gpu_model`` one peak: a GPU it does not know, or a
    name several of its rows could mean (``H100``: SXM 989, PCIe 756, NVL 835), needs the peak given
    with it (or, for the second, the full model)."""
    candidates = peak_candidates(gpu_model)
    if not candidates:
        raise ConfigError(
            "not in the peak table, so MFU would have no peak; give its dense BF16 peak (peak_tflops) with it; "
            f"the table knows: {', '.join(p.gpu for p in gpu_peaks())}", param="gpu_model", value=gpu_model
        )
    if len(candidates) > 1:
        raise ConfigError(
            f"names {len(candidates)} GPUs of the peak table ({', '.join(f'{p.gpu} {p.peak_tflops:g}' for p in candidates)} "
            "TFLOP/s), so it gives no one peak; give its dense BF16 peak (peak_tflops) with it, or the full model: "
            f"{' or '.join(repr(p.gpu) for p in candidates)}", param="gpu_model", value=gpu_model
        )


def set_run_metadata(
    db: Warehouse, run: str, values: Mapping[str, Any]
) -> dict[str, Any]:
    """Set (or correct) metadata of ``run``: keys from :data:`RUN_KEY_NAMES`; None values are ignored.

    Reports look the peak of ``gpu_model`` up in the peak table (:func:`traceq.peaks.peak_for`) unless
    ``peak_tflops`` is set; a GPU the table does not know, or a name that could mean several of its
    GPUs ('H100'), needs ``peak_tflops`` with it (ConfigError, :func:`check_peak_known`), so that setting a
    GPU never silently leaves MFU without a peak nor takes one variant's. Returns the effective metadata.
    """
    known = {k.key: k for k in RUN_KEYS}
    bad = sorted(set(values) - set(known))
    if bad:
        raise ConfigError(f"unknown run metadata {bad}; settable: {', '.join(RUN_KEY_NAMES)}")
    given = {k: _coerce(known[k], v) for k, v in values.items() if v is not None}
    with opened(db, read_only=False) as con:
        if fetch_one(con, "select 1 from runs where run = ?", [run]) is None:
            names = [r for (r,) in con.execute("select run from runs order by run").fetchall()]
            raise ConfigError(f"no run {run!r} in the warehouse; it holds: {', '.join(names) or 'none'}")
        peak_by_hand = settings(con, run).get("peak_tflops_source") == "user"
        if "gpu_model" in given and "peak_tflops" not in given and not peak_by_hand:
            check_peak_known(given["gpu_model"])
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
            rollback(con)
            raise
        return merged
