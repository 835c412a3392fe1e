-- sync_islands: the synchronisation calls of each rank's host (runtime events whose name matches their
-- category's sync pattern, $sync_patterns: cudaStreamSynchronize, cudaDeviceSynchronize, event syncs;
-- dur > 0, any thread) merged into disjoint islands, one row per (trace_id, rank, island); ns. While
-- one is in flight the host waits for the device (sql/idle_breakdown.sql).
-- the names that are sync calls, matched once per name (not once per event)
with sync_names as (
    select n.trace_id, n.name_id, p.cat
    from names as n
    cross join (select unnest($sync_patterns, recursive := true)) as p
    where regexp_matches(n.name, p.pattern)
),

sync_calls as (
    select h.trace_id, h.rank, h.start_ns, h.start_ns + h.dur_ns as end_ns
    from host_events as h
    inner join sync_names as s on s.trace_id = h.trace_id and s.name_id = h.name_id and s.cat = h.cat
    where h.dur_ns > 0
),

-- several threads may sync at once: a call opens an island where it starts after every earlier one ended
sync_marked as (
    select
        *,
        case when start_ns > max(end_ns) over (
            partition by trace_id, rank order by start_ns, end_ns rows between unbounded preceding and 1 preceding
        ) then 1 else 0 end as opens
    from sync_calls
),

sync_numbered as (
    select *, sum(opens) over (partition by trace_id, rank order by start_ns, end_ns rows unbounded preceding) as island
    from sync_marked
)

select trace_id, rank, island, min(start_ns) as start_ns, max(end_ns) as end_ns
from sync_numbered
group by all
