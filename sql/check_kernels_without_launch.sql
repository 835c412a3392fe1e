-- check_kernels_without_launch: one row per (trace, rank) with kernels that have no launch event.
-- Columns: run, path, rank, check, severity, count (kernels whose correlation id matches no
-- runtime event ($runtime_cats) of the same rank), detail (share of all kernels).
-- Expected for GPU-only traces and kernels launched before the profiler started; such kernels get their
-- step from the device-side step annotation, or by time on ranks with neither (README: device windows, steps).
with launches as (
    select distinct trace_id, rank, correlation
    from host_events
    where list_contains($runtime_cats, cat) and correlation is not null
),

kernels as (
    select trace_id, rank, count(*) as n_kernels
    from gpu_events
    where kind = 1
    group by all
),

orphans as (
    select g.trace_id, g.rank, count(*) as n_orphans
    from gpu_events as g
    anti join launches as l on l.trace_id = g.trace_id and l.rank = g.rank and l.correlation = g.correlation
    where g.kind = 1
    group by all
),

final as (
    select
        t.run,
        t.path,
        o.rank,
        'kernels_without_launch' as "check",
        'info' as severity,
        o.n_orphans as count,
        format(
            '{} of {} kernels ({}%) have no launch event (launched before the profiler started, or a GPU-only '
            || 'trace); their step comes from the device-side step annotation, else by time on ranks without launches',
            o.n_orphans, k.n_kernels, round(100 * o.n_orphans / k.n_kernels, 1)
        ) as detail
    from orphans as o
    inner join kernels as k using (trace_id, rank)
    inner join traces as t using (trace_id)
)

select * from final
