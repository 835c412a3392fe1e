"""Collectives across ranks (docs/explanation/across-ranks.md): ``traceq collectives`` (time, wait and bandwidth per
collective type, process group and message size), ``traceq stragglers`` (who arrives last, how often,
how much waiting it causes) and the per-instance rows behind them.

Bandwidth follows nccl-tests: algbw = bytes / transfer time, busbw = algbw × 2(n−1)/n for AllReduce,
(n−1)/n for AllGather, ReduceScatter and AllToAll, 1 for Broadcast, Reduce and point-to-point. An
unmatched kernel's transfer is its whole duration, waiting included, so its bandwidth is a lower bound:
such rows say so in ``basis``.

Beside the collective type stand NCCL's algorithm and protocol where the kernel's name establishes them
(``nccl_algo``, ``nccl_proto``: :func:`traceq.nccl_kernels.algorithm_protocol`), each a key: a Ring and a
Tree AllReduce of one size move data at different rates, and one mean over both would describe neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import duckdb

from traceq import query
from traceq.catalog import META_COLUMNS, columns
from traceq.errors import ConfigError, EmptySelection
from traceq.nccl_kernels import NOTE as NCCL_NOTE
from traceq.nccl_kernels import algorithm_protocol
from traceq.report import crossrank
from traceq.report.metrics import nothing_selected, require_runs, run_metadata_frame, steps_selected
from traceq.report.notes import selection_notes
from traceq.report.result import Report
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars
from traceq.store.warehouse import DEFAULT_DB, Warehouse, opened

if TYPE_CHECKING:
    import polars as pl

GRAINS = ("run", "collective_type", "process_group", "size_bucket", "inter_node")
NCCL_KEYS = ("nccl_algo", "nccl_proto")  # beside collective_type (traceq.nccl_kernels)
DEFAULT_GRAIN = ("run", "collective_type", "process_group", "size_bucket")
MATCHED = "matched"
LOWER_BOUND = "kernel duration (lower bound)"
BANDWIDTH_NOTE = (
    "size_bytes: mean message size (AllGather: output, others: input); transfer_us: mean transfer per instance; "
    "wait_us: mean wait per rank and instance; algbw_gbps = total bytes / total transfer (GB/s, 1e9 bytes); "
    "busbw_gbps = algbw × 2(n−1)/n AllReduce, (n−1)/n AllGather/ReduceScatter/AllToAll, 1 otherwise (nccl-tests)"
)
# `traceq scaling --metric`: collective figures across runs (the study's Figure 4: latency against nodes)
SCALING_METRICS = ("busbw_gbps", "algbw_gbps", "transfer_us", "wait_us")
STRAGGLER_COLUMNS = ("matched_count", "arrived_last_count", "arrived_last_share", "wait_caused_us", "wait_us")


def size_label(lo: int) -> str:
    """The size bucket [lo, 2 lo) as text: '1-2 MiB', '512 B-1 KiB'."""
    return f"{_bytes(lo)}-{_bytes(2 * lo)}"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} PiB"


def collectives_report(
    db: Warehouse = DEFAULT_DB,
    *,
    by: str | Sequence[str] = DEFAULT_GRAIN,
    selection: StepSelection = StepSelection(),
    whole_trace: bool = False,
    runs: Sequence[str] | None = None,
    nccl: bool = True,
) -> Report:
    """Collective instances of the selected steps (or the whole trace) per group of ``by`` (of
    :data:`GRAINS`), matched ones apart from unmatched ones (``basis``), with the notes to read beside.

    Columns: the ``by`` columns (with collective_type: nccl_algo and nccl_proto too, NCCL's algorithm and
    protocol where the kernel's name establishes them, else null; with process_group: group_size and
    inter_node too), ``basis``, ``count`` (instances), ``size_bytes``, ``transfer_us``, ``wait_us``,
    ``algbw_gbps``, ``busbw_gbps`` (see :data:`BANDWIDTH_NOTE`). An instance counts in the step of the
    kernel that arrived last, over the steps every rank of its run has. ``nccl``: False leaves nccl_algo
    and nccl_proto out (a type's rows are not split by them).
    """
    table, notes = _collectives_table(db, by=by, selection=selection, whole_trace=whole_trace, runs=runs, nccl=nccl)
    title = (f"collectives by {','.join(columns(by, GRAINS))} "
             f"({'whole trace, every kernel' if whole_trace else selection.describe()})")
    return Report(table, notes, title, narrow=("algbw_gbps", "inter_node", "group_size"))


def _collectives_table(
    db: Warehouse = DEFAULT_DB,
    *,
    by: str | Sequence[str] = DEFAULT_GRAIN,
    selection: StepSelection = StepSelection(),
    whole_trace: bool = False,
    runs: Sequence[str] | None = None,
    keep_bucket: bool = False,
    nccl: bool = True,
) -> tuple[pl.DataFrame, list[str]]:
    """The table and notes of :func:`collectives_report` (the HTML report's and :func:`collective_scaling`'s
    source).

    Columns: the ``by`` columns (with process_group: group_size and inter_node too), ``basis``,
    ``count`` (instances), ``size_bytes``, ``transfer_us``, ``wait_us``, ``algbw_gbps``, ``busbw_gbps``
    (see :data:`BANDWIDTH_NOTE`). An instance counts in the step of the kernel that arrived last, over
    the steps every rank of its run has. ``keep_bucket``: also ``_bucket``, the size bucket's lower
    bound in bytes (to order by). ``nccl``: with collective_type, ``nccl_algo`` and ``nccl_proto`` beside it
    (keys: a type whose kernels name different algorithms or protocols has a row for each).
    """
    import polars as pl

    grain = columns(by, GRAINS)
    if nccl and "collective_type" in grain:
        at = grain.index("collective_type") + 1
        grain[at:at] = list(NCCL_KEYS)
    if "process_group" in grain:
        grain += [c for c in ("group_size", "inter_node") if c not in grain]
    windows = "trace_windows" if whole_trace else "selected_windows"
    with opened(db) as con:
        rows, matching, shared = _shared_step_rows(con, "collectives", windows, selection, runs)
        notes = [*matching, *shared]
        if rows.height == 0:
            if not whole_trace:
                if not steps_selected(con, selection, runs):
                    raise EmptySelection(nothing_selected(con, selection, runs))
                left = [n for n in shared if "no step left by the selection" in n]  # runs the selection took out
                raise EmptySelection("; ".join(["no communication kernel in the selected steps", *left]))
            raise EmptySelection("no communication kernel in the warehouse's traces")
    rows = rows.with_columns(
        # a kernel without element counts or dtype has no size: its bucket is unknown
        pl.col("size_bucket_bytes").map_elements(size_label, return_dtype=pl.Utf8).fill_null("unknown").alias("size_bucket"),
        pl.when(pl.col("matched")).then(pl.lit(MATCHED)).otherwise(pl.lit(LOWER_BOUND)).alias("basis"),
    )
    if nccl and "collective_type" in grain:
        rows, nccl_notes = _with_nccl_choice(rows)
        notes = [*nccl_notes, *notes]
    keys = [*grain, "basis"]
    table = rows.group_by(keys).agg(
        pl.col("count").sum(),
        (pl.col("size_bytes").sum() / _positive(pl.col("sized").sum())).alias("size_bytes"),
        (pl.col("transfer_ns").sum() / pl.col("count").sum() / 1e3).alias("transfer_us"),
        pl.when(pl.col("matched").all()).then(pl.col("wait_ns").sum() / pl.col("rank_kernels").sum() / 1e3).alias("wait_us"),
        (pl.col("size_bytes").sum() / _positive(pl.col("sized_transfer_ns").sum())).alias("algbw_gbps"),
        (pl.col("bus_bytes").sum() / _positive(pl.col("sized_transfer_ns").sum())).alias("busbw_gbps"),
        pl.col("size_bucket_bytes").min().alias("_bucket"),
    )
    table = table.sort([c if c != "size_bucket" else "_bucket" for c in keys], nulls_last=True)
    figures = ("count", "size_bytes", "transfer_us", "wait_us", "algbw_gbps", "busbw_gbps")
    return table.select(*keys, *figures, *(["_bucket"] if keep_bucket else [])), [BANDWIDTH_NOTE, *notes]


def _with_nccl_choice(rows: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """``rows`` (of ``sql/collectives.sql``) with ``nccl_algo`` and ``nccl_proto`` from each kernel name, and
    the note on reading them where an NCCL or RCCL kernel is among the rows."""
    import polars as pl

    names = rows["kernel_name"].drop_nulls().unique().to_list()
    choice = [algorithm_protocol(name) for name in names]
    parsed = pl.DataFrame(
        {"kernel_name": names, "nccl_algo": [a for a, _ in choice], "nccl_proto": [p for _, p in choice]},
        schema={"kernel_name": pl.Utf8, "nccl_algo": pl.Utf8, "nccl_proto": pl.Utf8},
    )
    rows = rows.join(parsed, on="kernel_name", how="left")
    return rows, [NCCL_NOTE] if any("nccl" in name.lower() for name in names) else []


def collective_scaling(
    db: Warehouse = DEFAULT_DB,
    metric: str = "busbw_gbps",
    *,
    by: str | Sequence[str] = (),
    selection: StepSelection = StepSelection(),
    runs: Sequence[str] | None = None,
) -> Report:
    """Collective figures across runs: one row per (``by`` metadata columns, collective type, size bucket,
    basis, run), with the run's world size and nodes, ordered by world size within each series (runs are
    compared at the same message sizes). ``metric`` (one of
    :data:`SCALING_METRICS`) comes first after the keys; the other figures follow."""
    if metric not in SCALING_METRICS:
        raise ConfigError(f"one of {', '.join(SCALING_METRICS)} (or leave it out for tokens/s)", param="metric",
                          value=metric)
    group = columns(by, [c for c in META_COLUMNS if c not in ("world_size", "nodes")])
    table, notes = _collectives_table(db, by=("run", "collective_type", "size_bucket"), selection=selection, runs=runs,
                                      keep_bucket=True, nccl=False)
    with opened(db) as con:
        meta = run_metadata_frame(con).select("run", "world_size", "nodes", *group)
    table = table.join(meta, on="run", how="left")
    keys = [*group, "collective_type", "size_bucket", "basis"]
    figures = ["count", "size_bytes", *[m for m in ("transfer_us", "wait_us", "algbw_gbps", "busbw_gbps") if m != metric]]
    order = [*group, "collective_type", "_bucket", "basis", "world_size", "run"]
    table = table.sort(order, nulls_last=True).select(*keys, "run", "world_size", "nodes", metric, *figures)
    return Report(table, notes, f"{metric} across {table['run'].n_unique()} run(s) ({selection.describe()})")


def _shared_step_rows(
    con: duckdb.DuckDBPyConnection, name: str, windows: str, selection: StepSelection, runs: Sequence[str] | None,
) -> tuple[pl.DataFrame, list[str], list[str]]:
    """``sql/<name>.sql`` over the steps every rank of a run has, collectives matched within ``runs``;
    with the matching notes and the notes on steps left out."""
    require_runs(con, runs)
    with crossrank.matched(con, runs) as table:
        rows = to_polars(query.run(con, name, {**query_params(selection, runs), "shared_steps": True},
                                   bind={"windows": windows, "comm_instances": table}))
        left = selection_notes(con, selection, runs) if windows == "selected_windows" else []  # runs left out, named
        return rows, crossrank.matching_notes(con, runs), [*left, *crossrank.shared_steps_notes(con, windows, selection, runs)]


def _positive(expr: pl.Expr) -> pl.Expr:
    """``expr`` where it is > 0, else null (a mean over nothing is unknown, not NaN)."""
    import polars as pl

    return pl.when(expr > 0).then(expr)


def stragglers_report(
    db: Warehouse = DEFAULT_DB,
    *,
    by_step: bool = False,
    selection: StepSelection = StepSelection(),
    whole_trace: bool = False,
    runs: Sequence[str] | None = None,
) -> Report:
    """Per (run, rank), or per (run, rank, step) with ``by_step``: the matched collectives the rank took
    part in (``matched_count``), how many it arrived last at and their share, the waiting that made the
    others do (``wait_caused_us``) and its own waiting (``wait_us``: its kernels' first parts, summed),
    over the selected steps; the ranks that caused the most waiting first. A kernel counts in the step
    whose window holds its start."""
    import polars as pl

    windows = "trace_windows" if whole_trace else "selected_windows"
    with opened(db) as con:
        rows, matching, shared = _shared_step_rows(con, "stragglers", windows, selection, runs)
        notes = [*matching, *shared]
        traces = to_polars(con.sql("select trace_id, run from traces"))
        rows = rows.join(traces, on="trace_id")
        if rows.height == 0:
            if not whole_trace and not steps_selected(con, selection, runs):
                raise EmptySelection(nothing_selected(con, selection, runs))
            left = [n for n in shared if "no step left by the selection" in n]  # runs the selection took out
            raise EmptySelection("no collective matched across ranks in the selected steps; "
                                 + "; ".join([*left, *[n for n in matching if n != crossrank.SPLIT_NOTE]]
                                             or ["no communication kernels"]))
    keys = ["run", "rank", *(["step"] if by_step else [])]
    table = rows.group_by(keys).agg(
        pl.col("matched_count").sum(), pl.col("arrived_last_count").sum(),
        (pl.col("wait_caused_ns").sum() / 1e3).alias("wait_caused_us"), (pl.col("wait_ns").sum() / 1e3).alias("wait_us"),
    ).with_columns((pl.col("arrived_last_count") / pl.col("matched_count")).alias("arrived_last_share"))
    order = ["run", *(["step"] if by_step else []), "wait_caused_us", "rank"]
    table = table.sort(order, descending=[False, *([False] if by_step else []), True, False])
    notes.append("summed over the selected steps: wait_caused_us = the waiting the other ranks did at the collectives "
                 "this rank arrived last at; wait_us = this rank's own waiting (kernel time, overlaps counted twice; "
                 "traceq report --metric comm_wait_us gives the union)")
    title = f"stragglers by {','.join(keys)} ({'whole trace' if whole_trace else selection.describe()})"
    return Report(table.select(*keys, *STRAGGLER_COLUMNS), notes, title, narrow=("matched_count",))


def instances_report(db: Warehouse = DEFAULT_DB, *, runs: Sequence[str] | None = None) -> Report:
    """One row per communication kernel: its run, instance (matched ones: 1, 2, ... in the order they
    began, per run), collective type, process group, Seq or order, rank, start and duration, and its wait
    and transfer (docs/explanation/across-ranks.md)."""
    import polars as pl

    with opened(db) as con:
        require_runs(con, runs)
        with crossrank.matched(con, runs) as table:
            rows = to_polars(con.sql(
                f"select run, instance_id, collective_type, process_group, group_size, seq, ordinal, rank, device, "
                f"start_ns, dur_ns, wait_ns, transfer_ns, arrived_last, size_bytes, matched, reason from {table} "
                f"order by run, rank, start_ns"
            ))
    first = rows.group_by("run", "instance_id").agg(pl.col("start_ns").min().alias("_first"))
    rows = rows.join(first, on=["run", "instance_id"], how="left", nulls_equal=True).with_columns(
        pl.when(pl.col("matched")).then(pl.struct("_first", "instance_id").rank("dense").over("run"))
        .cast(pl.Int64).alias("instance"),
    ).sort("run", "instance", "rank", "start_ns", nulls_last=True).drop("_first", "instance_id")
    table = rows.select("run", "instance", *[c for c in rows.columns if c not in ("run", "instance")]).with_columns(
        (pl.col("start_ns") / 1e3).alias("start_us"),
        (pl.col("dur_ns") / 1e3).alias("dur_us"),
        (pl.col("wait_ns") / 1e3).alias("wait_us"),
        (pl.col("transfer_ns") / 1e3).alias("transfer_us"),
    ).drop("start_ns", "dur_ns", "wait_ns", "transfer_ns")
    return Report(table, (), "collectives by instance (every kernel)",
                  narrow=("inter_node", "group_size", "ordinal", "seq", "reason", "device"))
