-- no_idle_breakdown: what sql/window_metrics.sql reads as `idle_breakdown` where a report asks for no idle
-- split by cause: the columns of sql/idle_breakdown.sql and no row, so the split costs nothing (its
-- columns are null, and the report leaves them out).
select
    null::integer as trace_id,
    null::bigint as rank,
    null::bigint as device,
    null::bigint as step,
    null::bigint as idle_sync_ns,
    null::bigint as idle_host_bound_ns,
    null::bigint as idle_other_ns,
    null::bigint as idle_unknown_ns
where false
