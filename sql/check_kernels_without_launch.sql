-- inputs: gpu_classified
-- check_kernels_without_launch: one row per (trace, rank) with kernels that have no launch event.
-- Columns: run, path, rank, check, severity, count (kernels whose correlation id matches no
-- runtime event ($runtime_cats) of the same rank), detail (share of all kernels).
-- Expected for GPU-only traces and kernels launched before the profiler started; such kernels get their
-- step from the device-side step annotation, or by time on ranks with neither (README: device windows, steps).
-- Device events that a rule makes copies or waits (MTIA's dma_request, event_record, event_wait) are
-- issued on the device, launched by no runtime call: they are counted apart, not as kernels.
with launches as (
    select distinct trace_id, rank, correlation
    from host_events
    where list_contains($runtime_cats, cat) and correlation is not null
),

device_kernels as (
    select trace_id, rank, correlation, class in ('memcpy', 'sync') as device_side
    from gpu_classified
    where kind = 1
),

kernels as (
    select trace_id, rank, count(*) filter (where not device_side) as n_kernels
    from device_kernels
    group by all
),

orphans as (
    select
        g.trace_id,
        g.rank,
        count(*) filter (where not g.device_side) as n_orphans,
        count(*) filter (where g.device_side) as n_device_side
    from device_kernels as g
    anti join launches as l on l.trace_id = g.trace_id and l.rank = g.rank and l.correlation = g.correlation
    group by all
    having count(*) filter (where not g.device_side) > 0
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
        ) || case
            when o.n_device_side > 0
                then format(' ({} device-side copies and waits, which no launch starts, are not counted)', o.n_device_side)
            else ''
        end as detail
    from orphans as o
    inner join kernels as k using (trace_id, rank)
    inner join traces as t using (trace_id)
)

select * from final
