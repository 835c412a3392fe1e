"""Across ranks: collective kernels matched over the ranks of each run (``sql/comm_instances.sql``), the
stragglers per window (``sql/stragglers.sql``, read by ``sql/window_metrics.sql``; the wait/transfer
split itself is part of ``sql/interval_breakdown.sql`` over ``sql/split_activity.sql``), and the notes
that say how much could be matched and why the rest could not (docs/explanation/across-ranks.md).

Matching runs once per report: :func:`matched` keeps its result in a temporary table for the block, and
every query of the block reads it from there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import duckdb

from traceq import query
from traceq.report.selection import StepSelection, query_params
from traceq.store.frames import to_polars

INSTANCES_TABLE = "traceq_comm_instances"
SPLIT_NOTE = (
    "wait vs transfer: collectives are matched across the ranks of a run (by process group and Seq, else by "
    "collective type and order); an instance's transfer = its shortest kernel, each rank's wait = its kernel's "
    "first (duration − transfer); an unmatched kernel counts as transfer. Rooted collectives (Broadcast, Reduce), "
    "whose root can finish first: by start times where all ranks are in one file (one clock), else arrival is not "
    "inferable and the kernel counts as transfer"
)


@contextmanager
def matched(con: duckdb.DuckDBPyConnection, runs: Sequence[str] | None = None) -> Iterator[str]:
    """The matched collective kernels (``sql/comm_instances.sql``) of ``runs`` (None: every run) as a
    temporary table on ``con`` for the block; yields its name. Nested blocks share the outer block's
    table (and its runs)."""
    held = con.execute(
        "select count(*) from duckdb_tables() where temporary and table_name = ?", [INSTANCES_TABLE]
    ).fetchall()[0][0]
    if held:
        yield INSTANCES_TABLE
        return
    statement = query.statement(con, "comm_instances", runs=runs)
    params = query_params(runs=runs)
    con.execute(f"create temp table {INSTANCES_TABLE} as {statement}", query.params_of(statement, params))
    try:
        yield INSTANCES_TABLE
    finally:
        con.execute(f"drop table if exists {INSTANCES_TABLE}")


def shared_steps_notes(
    con: duckdb.DuckDBPyConnection, windows: str, selection: StepSelection, runs: Sequence[str] | None = None
) -> list[str]:
    """A line per run whose ranks do not all have the same steps in ``windows``: the cross-rank tables
    leave the steps that only some ranks have out (``sql/shared_windows.sql``)."""
    import polars as pl

    held = to_polars(query.run(con, windows, query_params(selection, runs)).select("trace_id, rank, step"))
    held = held.join(to_polars(con.sql("select trace_id, run from traces")), on="trace_id")
    ranks = held.group_by("run").agg(pl.col("rank").n_unique().alias("ranks"))
    partial = (
        held.group_by("run", "step").agg(pl.col("rank").n_unique().alias("n"))
        .join(ranks, on="run").filter(pl.col("n") < pl.col("ranks")).sort("run", "step")
    )
    notes = []
    for (run,), part in partial.group_by("run", maintain_order=True):
        left = ", ".join(f"{s} ({n} of {r} ranks)" for s, n, r in part.select("step", "n", "ranks").iter_rows())
        notes.append(f"run {run}: ranks are compared over the steps every rank has; left out: step {left}")
    return notes


def matching_notes(con: duckdb.DuckDBPyConnection, runs: Sequence[str] | None = None) -> list[str]:
    """One line per run: how many communication kernels were matched across how many ranks, and for the
    rest, why not (and that their time counts as transfer)."""
    with matched(con, runs) as table:
        summary = con.execute(
            f"""
            select c.run, count(*), count(*) filter (where c.matched), count(distinct c.instance_id),
                   count(distinct c.rank) filter (where c.matched), any_value(r.ranks), any_value(r.world_size),
                   count(*) filter (where c.arrival = 'start time'), count(*) filter (where c.arrival = 'not inferable')
            from {table} as c
            inner join (
                select run, count(distinct s.rank) filter (where s.rank >= 0) as ranks, max(t.world_size) as world_size
                from traces as t left join steps as s using (trace_id) group by run
            ) as r using (run)
            where $runs is null or list_contains($runs, c.run)
            group by c.run order by c.run
            """,
            {"runs": list(runs) if runs else None},
        ).fetchall()
        reasons = con.execute(
            f"""
            select run, reason, string_agg(distinct collective_type, ', ' order by collective_type), count(*)
            from {table}
            where not matched and ($runs is null or list_contains($runs, run))
            group by all order by run, count(*) desc, reason
            """,
            {"runs": list(runs) if runs else None},
        ).fetchall()
    notes = [SPLIT_NOTE] if summary else []
    for run, kernels, n_matched, instances, ranks, run_ranks, world_size, by_start, not_inferable in summary:
        line = f"run {run}: {n_matched} of {kernels} communication kernels matched"
        if n_matched:
            line += f", {instances} collective instances over {ranks} ranks"
        if by_start:
            line += f"; {by_start} kernels of rooted collectives (Broadcast, Reduce) placed by start time (one clock)"
        if not_inferable:
            line += (f"; {not_inferable} kernels of rooted collectives on clocks of their own: arrival not inferable, "
                     "no straggler, counted as transfer")
        why = [f"{n} {reason} ({types})" for r, reason, types, n in reasons if r == run]
        if why:
            line += f"; unmatched (counted as transfer): {'; '.join(why)}"
        if world_size and run_ranks is not None and run_ranks < world_size and not any("the run holds" in w for w in why):
            line += f"; the run holds {run_ranks} of its {world_size} ranks"
        notes.append(line)
    return notes
