"""The power samples and step wall-clock times a report plots, and where each run's power comes from."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

from traceq.store.frames import to_polars


def power_series(con: duckdb.DuckDBPyConnection, runs: Sequence[str] | None = None) -> pl.DataFrame:
    """NVML power samples: run, rank, gpu, wall_ns, power_w (one row per sample, time order)."""
    frame = to_polars(con.sql(
        """
        select t.run, p.rank, p.gpu, p.wall_ns, p.power_w
        from power_samples as p inner join traces as t using (trace_id)
        where p.kind = 'power' and p.power_w is not null and ($runs is null or list_contains($runs, t.run))
        order by t.run, p.rank, p.gpu, p.wall_ns
        """, params={"runs": list(runs) if runs else None}
    ))
    return frame


def step_wall_times(con: duckdb.DuckDBPyConnection, runs: Sequence[str] | None = None) -> pl.DataFrame:
    """Wall-clock times of the steps' CPU spans: run, rank, step, start_wall_ns, end_wall_ns, offset_source."""
    frame = to_polars(con.sql(
        """
        select t.run, w.rank, w.step, w.start_wall_ns, w.end_wall_ns, w.offset_source
        from step_wall_times as w inner join traces as t using (trace_id)
        where $runs is null or list_contains($runs, t.run)
        order by t.run, w.rank, w.step
        """, params={"runs": list(runs) if runs else None}
    ))
    return frame


def power_status(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per run: power source (nvml | unavailable | none) and the reason when unavailable."""
    return to_polars(con.sql(
        """
        select r.run, coalesce(any_value(p.source), 'none') as source, any_value(p.reason) as reason
        from runs as r
        left join traces as t on t.run = r.run
        left join power_logs as p on p.trace_id = t.trace_id
        group by r.run order by r.run
        """
    ))
