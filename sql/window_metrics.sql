-- inputs: interval_breakdown, idle_breakdown, stragglers
-- window_metrics: one row per window of `windows` (trace_id, rank, device, step; the selected steps'
-- device windows, or one per device over the whole timeline, step -1) with every figure a report measures
-- inside it:
--   comm_kernel_ns .. exposed_comm_transfer_ns   the interval metrics of sql/interval_breakdown.sql (ns)
--   activity                                     gpu: device activity; cpu: the trace has no GPU event, so
--                                                its windows hold CPU-side communication and operators
--   idle_sync_ns, idle_host_bound_ns, idle_other_ns, idle_unknown_ns   idle split by cause
--                                                (sql/idle_breakdown.sql; ns); null
--                                                where the windows have none (CPU-only traces), and where
--                                                the report asks for no split (`idle_breakdown` bound to
--                                                sql/no_idle_breakdown.sql)
--   matched_count, arrived_last_count, wait_caused_ns, wait_ns   the stragglers of sql/stragglers.sql (counts,
--                                                ns); 0 in a window without a matched kernel (wait_ns null),
--                                                where `stragglers` is bound to sql/no_stragglers.sql too
with final as (
    select
        i.*,
        case when t.n_gpu_events > 0 then 'gpu' else 'cpu' end as activity,
        p.idle_sync_ns,
        p.idle_host_bound_ns,
        p.idle_other_ns,
        p.idle_unknown_ns,
        coalesce(s.matched_count, 0) as matched_count,
        coalesce(s.arrived_last_count, 0) as arrived_last_count,
        coalesce(s.wait_caused_ns, 0) as wait_caused_ns,
        s.wait_ns
    from interval_breakdown as i
    inner join traces as t on t.trace_id = i.trace_id
    left join idle_breakdown as p
        on p.trace_id = i.trace_id and p.rank = i.rank and p.device = i.device and p.step = i.step
    left join stragglers as s
        on s.trace_id = i.trace_id and s.rank = i.rank and s.device = i.device and s.step = i.step
)

select * from final
