-- inputs: gpu_classified, windows, sync_islands
-- idle_breakdown: the idle time of each device window of `windows` (window − |U(all device activity)|,
-- as in sql/interval_breakdown.sql) split by why the device had nothing to run, one row per window of a
-- device with activity; ns. The four parts add up to its idle time, to the ns.
-- Idle lies in gaps: stretches of a device with no activity, between the end of everything before and
-- the start of the activity that ends the gap (cut at the window's edges). The cause is told per gap by
-- the launch of the activity that ends it: the earliest runtime event ($runtime_cats) on the rank with the
-- correlation of an activity starting at the gap's end, clamped to the gap.
--   idle_sync_ns        any gap: a synchronisation call was in flight on the rank's host (a runtime event
--                       matching $sync_patterns: cudaStreamSynchronize, cudaDeviceSynchronize, event
--                       syncs): the host waited for the device, which had run out of work
--   idle_host_bound_ns  a gap whose ending activity's launch is known, not in a sync, before that launch:
--                       nothing was queued, the CPU launched late (HTA's "host wait", which counts the
--                       whole gap where we count it up to the launch)
--   idle_other_ns       a gap whose ending activity's launch is known, not in a sync, from that launch on:
--                       the work was launched but had not started (launch latency, a stream waiting on an
--                       event or another device)
--   idle_unknown_ns     a gap whose ending activity has no launch event (a trace of device events only,
--                       such as a file of NCCL kernels; graph nodes without their launch), not in a sync:
--                       the trace cannot tell whether the host was late or the work waited, so no cause
--                       is guessed
with activity as (
    select trace_id, rank, device, correlation, start_ns, end_ns
    from gpu_classified
    where class <> 'sync' and device is not null
),

ordered as (
    select
        trace_id, rank, device, start_ns,
        max(end_ns) over (
            partition by trace_id, rank, device order by start_ns, end_ns
            rows between unbounded preceding and 1 preceding
        ) as busy_until
    from activity
),

gaps as (
    select trace_id, rank, device, busy_until as gap_start, start_ns as gap_end
    from ordered
    where start_ns > busy_until
),

-- the launch of the activity that ends each gap (the earliest, where several start together)
launches as (
    select a.trace_id, a.rank, a.device, a.start_ns, min(h.start_ns) as launch_ns
    from activity as a
    semi join gaps as g on g.trace_id = a.trace_id and g.rank = a.rank and g.device = a.device and g.gap_end = a.start_ns
    inner join host_events as h
        on h.trace_id = a.trace_id and h.rank = a.rank and h.correlation = a.correlation
        and list_contains($runtime_cats, h.cat)
    group by all
),

-- each gap cut at the window edges; the host-bound stretch runs from the gap's start to that launch
segments as (
    select
        w.trace_id, w.rank, w.device, w.step,
        greatest(g.gap_start, w.start_ns) as seg_start,
        least(g.gap_end, w.end_ns) as seg_end,
        greatest(
            greatest(g.gap_start, w.start_ns),
            least(g.gap_end, w.end_ns, greatest(g.gap_start, coalesce(l.launch_ns, g.gap_start)))
        ) as host_end,
        l.launch_ns is not null as launched
    from gaps as g
    inner join windows as w
        on w.trace_id = g.trace_id and w.rank = g.rank and w.device = g.device
        and g.gap_start < w.end_ns and g.gap_end > w.start_ns
    left join launches as l
        on l.trace_id = g.trace_id and l.rank = g.rank and l.device = g.device and l.start_ns = g.gap_end
),

gap_overlaps as (
    select
        s.trace_id, s.rank, s.device, s.step, s.seg_start, s.seg_end, s.host_end, s.launched,
        -- (least and greatest skip nulls: a segment without a sync island must add nothing)
        coalesce(sum(greatest(0, least(s.seg_end, y.end_ns) - greatest(s.seg_start, y.start_ns)))
            filter (where y.start_ns is not null), 0) as sync_ns,
        coalesce(sum(greatest(0, least(s.host_end, y.end_ns) - greatest(s.seg_start, y.start_ns)))
            filter (where y.start_ns is not null), 0) as host_sync_ns
    from segments as s
    left join sync_islands as y
        on y.trace_id = s.trace_id and y.rank = s.rank and y.start_ns < s.seg_end and y.end_ns > s.seg_start
    group by all
),

final as (
    select
        w.trace_id, w.rank, w.device, w.step,
        coalesce(sum(o.sync_ns), 0)::bigint as idle_sync_ns,
        coalesce(sum(o.host_end - o.seg_start - o.host_sync_ns), 0)::bigint as idle_host_bound_ns,
        -- (without a launch host_end = seg_start: nothing is host-bound, the rest of the gap is unknown)
        coalesce(sum(o.seg_end - o.seg_start - o.sync_ns - (o.host_end - o.seg_start - o.host_sync_ns))
            filter (where o.launched), 0)::bigint as idle_other_ns,
        coalesce(sum(o.seg_end - o.seg_start - o.sync_ns) filter (where not o.launched), 0)::bigint as idle_unknown_ns
    from windows as w
    left join gap_overlaps as o on o.trace_id = w.trace_id and o.rank = w.rank and o.device = w.device and o.step = w.step
    where w.device >= 0
    group by all
)

select * from final
