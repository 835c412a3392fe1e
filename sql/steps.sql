-- inputs: marker_spans
-- steps of the traces $first_trace..$last_trace (ingest derives several small files in one statement): one row
-- per (trace_id, rank, step), the rows of the steps table: the CPU spans of
-- sql/marker_spans.sql (ProfilerStep#N, or the step marker given at ingest). A rank with events but no
-- marker gets one step, -1, over its whole timeline (source 'whole_trace'), so that it is reported as one
-- window, never left out.
-- Columns: start_ns/end_ns (CPU span, trace clock), step_time_ns, launches_without_gpu_work (device
-- launches in the step whose device work is missing AND that come after the rank's last recorded
-- device activity: the trace ended before that work ran, so the step is incomplete), source.
with spans as (
    select trace_id, rank, step, start_ns, end_ns, 'marker' as source
    from marker_spans
    where side = 'cpu'
),

events as (
    select trace_id, rank, start_ns, start_ns + dur_ns as end_ns
    from gpu_events where trace_id between $first_trace and $last_trace
    union all
    select trace_id, rank, start_ns, start_ns + dur_ns as end_ns
    from host_events where trace_id between $first_trace and $last_trace
),

timelines as (
    select trace_id, rank, min(start_ns) as start_ns, max(end_ns) as end_ns from events group by all
),

whole_trace as (
    select t.trace_id, t.rank, -1 as step, t.start_ns, t.end_ns, 'whole_trace' as source
    from timelines as t
    anti join spans as s on s.trace_id = t.trace_id and s.rank = t.rank
),

all_spans as (
    select * from spans
    union all
    select * from whole_trace
),

device_correlations as (
    select distinct trace_id, rank, correlation
    from gpu_events
    where trace_id between $first_trace and $last_trace and correlation is not null
),

last_device as (
    select trace_id, rank, max(start_ns) as last_start_ns
    from gpu_events
    where trace_id between $first_trace and $last_trace
    group by all
),

launch_patterns as (
    select unnest($launch_patterns, recursive := true)
),

-- the runtime calls that put work on the device: patterns are matched on the few distinct names, not
-- on every call
launch_names as (
    select distinct r.trace_id, r.cat, r.name_id
    from (
        select distinct trace_id, cat, name_id
        from host_events
        where trace_id between $first_trace and $last_trace and list_contains($runtime_cats, cat)
    ) as r
    inner join names as n on n.trace_id = r.trace_id and n.name_id = r.name_id
    inner join launch_patterns as p on p.cat = r.cat
    where regexp_matches(n.name, p.pattern)
),

-- only the launches that count: joining every launch to the step spans by time was 0.02 s of a
-- 0.05 s statement on a 500 MB trace
launches_without_device_work as (
    select h.trace_id, h.rank, h.start_ns
    from host_events as h
    semi join launch_names as l on l.trace_id = h.trace_id and l.cat = h.cat and l.name_id = h.name_id
    left join device_correlations as dc
        on dc.trace_id = h.trace_id and dc.rank = h.rank and dc.correlation = h.correlation
    left join last_device as ld on ld.trace_id = h.trace_id and ld.rank = h.rank
    where h.trace_id between $first_trace and $last_trace
        and dc.correlation is null
        and h.start_ns > coalesce(ld.last_start_ns, -1)
),

cut as (
    select s.trace_id, s.rank, s.step, count(l.rank) as launches_without_gpu_work
    from spans as s
    left join launches_without_device_work as l
        on l.trace_id = s.trace_id and l.rank = s.rank and l.start_ns >= s.start_ns and l.start_ns < s.end_ns
    group by all
),

final as (
    select
        s.trace_id,
        s.rank,
        s.step,
        s.start_ns,
        s.end_ns,
        s.end_ns - s.start_ns as step_time_ns,
        coalesce(c.launches_without_gpu_work, 0) as launches_without_gpu_work,
        s.source
    from all_spans as s
    left join cut as c on c.trace_id = s.trace_id and c.rank = s.rank and c.step = s.step
)

select * from final
