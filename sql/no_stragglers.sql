-- no_stragglers: what sql/window_metrics.sql reads as `stragglers` where a report does not match
-- collectives across ranks: the columns of sql/stragglers.sql and no row, so nothing is matched (the
-- report leaves the columns out).
select
    null::integer as trace_id,
    null::bigint as rank,
    null::bigint as device,
    null::bigint as step,
    null::bigint as matched_count,
    null::bigint as arrived_last_count,
    null::bigint as wait_caused_ns,
    null::bigint as wait_ns
where false
