"""Data-quality findings about the traces in a warehouse: what to know before trusting a number.

Each check is one query in ``sql/check_<name>.sql`` returning rows of the same shape (see
:data:`COLUMNS`). Severity ``warning`` means a number computed from that trace or run may be
wrong or missing unless the user acts; ``info`` is worth knowing but handled by traceq.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceq import query
from traceq.catalog import RUN_KEYS
from traceq.report.result import Report
from traceq.report.selection import query_params
from traceq.store.frames import to_polars
from traceq.store.warehouse import DEFAULT_DB, connect

# sql/check_<name>.sql, in report order: per-trace checks, then per-run checks.
CHECKS = (
    "dropped_events",
    "duplicate_events",
    "missing_rank",
    "overlapping_kernels",
    "kernels_without_launch",
    "unattributed_kernels",
    "no_steps",
    "outside_steps",
    "clamped_windows",
    "comm_without_compute",
    "incomplete_steps",
    "missing_metadata",
    "side_values",
    "duplicate_ranks",
    "step_counts",
    "clock_skew",
)
COLUMNS = {
    "run": pl.String,
    "path": pl.String,
    "rank": pl.Int64,
    "check": pl.String,
    "severity": pl.String,
    "count": pl.Int64,
    "detail": pl.String,
}
SEVERITIES = ("warning", "info")
DEFAULT_SKEW_THRESHOLD_US = 50.0


def check_warehouse(db: str | Path = DEFAULT_DB, *, skew_threshold_us: float = DEFAULT_SKEW_THRESHOLD_US) -> Report:
    """Run every data-quality check on the warehouse at ``db``; one row per finding.

    Args:
        db: DuckDB warehouse path (opened read-only).
        skew_threshold_us: report a rank's clock skew only beyond this many microseconds.

    Returns a :class:`~traceq.report.result.Report` whose table has the columns run, path (null for
    run-level findings), rank (the trace's rank, as in every report; null where a finding is not about one
    rank), check, severity (warning | info), count (of the things found) and detail, warnings first. An
    empty table means every check passed.
    """
    numeric = [k for k in RUN_KEYS if k.kind in (int, float)]
    params = {"threshold_ns": skew_threshold_us * 1000, "run_keys": [k.key for k in numeric],
              "run_key_kinds": [k.kind.__name__ for k in numeric], "first": 0, "last": 2**63 - 1,
              **query_params()}
    con = connect(db, read_only=True)
    try:
        frames = []
        for name in CHECKS:
            frame = to_polars(query.run(con, f"check_{name}", params))
            frames.append(frame.select([pl.col(c).cast(t) for c, t in COLUMNS.items()]))
    finally:
        con.close()
    findings = pl.concat(frames)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings = (
        findings.with_columns(pl.col("severity").replace_strict(order, return_dtype=pl.Int8).alias("_order"))
        .sort(["_order", "run", "path", "rank", "check"], nulls_last=True)
        .drop("_order")
    )
    warnings = findings.filter(pl.col("severity") == "warning").height
    title = f"{warnings} warning(s), {findings.height - warnings} info finding(s) in {db}"
    # on a narrow terminal the finding (check, severity, detail) stays
    return Report(findings, (), title, narrow=("count", "rank", "path"))


def needs_attention(findings: Report) -> bool:
    """Whether any finding is a warning (the CLI's exit code 1)."""
    return findings.table.filter(pl.col("severity") == "warning").height > 0
