-- inputs: device_activity, device_windows
-- outside_steps: one row per (trace_id, rank, device) with device activity outside every step window: before
-- the first step's window (e.g. kernels launched before the profiler started) or after the last one. No
-- step counts it; `--whole-trace` does.
--   before_ns, after_ns   |U(activity) ∩ (−∞, first window start)|, |U(activity) ∩ [last window end, ∞)|
--   n_before, n_after     events that start before the first window / end after the last
with edges as (
    select trace_id, rank, device, min(start_ns) as first_ns, max(end_ns) as last_ns
    from device_windows
    group by all
),

outside as (
    select a.trace_id, a.rank, a.device, 'before' as part, a.start_ns, least(a.end_ns, e.first_ns) as end_ns
    from device_activity as a
    inner join edges as e using (trace_id, rank, device)
    where a.start_ns < e.first_ns
    union all
    select a.trace_id, a.rank, a.device, 'after' as part, greatest(a.start_ns, e.last_ns), a.end_ns
    from device_activity as a
    inner join edges as e using (trace_id, rank, device)
    where a.end_ns > e.last_ns
),

-- the union of each part's intervals as islands: an interval that starts after every earlier one ended
-- opens a new island
ordered as (
    select
        *,
        max(end_ns) over (
            partition by trace_id, rank, device, part order by start_ns, end_ns
            rows between unbounded preceding and 1 preceding
        ) as reach_ns
    from outside
),

islands as (
    select
        *,
        sum(case when reach_ns is null or start_ns > reach_ns then 1 else 0 end) over (
            partition by trace_id, rank, device, part order by start_ns, end_ns rows between unbounded preceding and current row
        ) as island
    from ordered
),

merged as (
    select trace_id, rank, device, part, island, max(end_ns) - min(start_ns) as union_ns, count(*) as n
    from islands
    group by all
),

final as (
    select
        trace_id,
        rank,
        device,
        coalesce(sum(union_ns) filter (where part = 'before'), 0)::bigint as before_ns,
        coalesce(sum(n) filter (where part = 'before'), 0)::bigint as n_before,
        coalesce(sum(union_ns) filter (where part = 'after'), 0)::bigint as after_ns,
        coalesce(sum(n) filter (where part = 'after'), 0)::bigint as n_after
    from merged
    group by all
)

select * from final
