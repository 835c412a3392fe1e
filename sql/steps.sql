-- inputs: marker_spans
-- steps of one trace ($trace_id): one row per (rank, step), the rows of the steps table: the CPU spans of
-- sql/marker_spans.sql (ProfilerStep#N, or the step marker given at ingest). A rank with events but no
-- marker gets one step, -1, over its whole timeline (source 'whole_trace'), so that it is reported as one
-- window, never left out.
-- Columns: start_ns/end_ns (CPU span, trace clock), step_time_ns, launches_without_gpu_work (device
-- launches in the step whose device work is missing AND that come after the rank's last recorded
-- device activity: the trace ended before that work ran, so the step is incomplete), source.
with spans as (
    select rank, step, start_ns, end_ns, 'marker' as source
    from marker_spans
    where side = 'cpu'
),

events as (
    select rank, start_ns, start_ns + dur_ns as end_ns from gpu_events where trace_id = $trace_id
    union all
    select rank, start_ns, start_ns + dur_ns as end_ns from host_events where trace_id = $trace_id
),

timelines as (
    select rank, min(start_ns) as start_ns, max(end_ns) as end_ns from events group by all
),

whole_trace as (
    select t.rank, -1 as step, t.start_ns, t.end_ns, 'whole_trace' as source
    from timelines as t
    anti join spans as s on s.rank = t.rank
),

all_spans as (
    select * from spans
    union all
    select * from whole_trace
),

device_correlations as (
    select distinct rank, correlation from gpu_events where trace_id = $trace_id and correlation is not null
),

last_device as (
    select rank, max(start_ns) as last_start_ns from gpu_events where trace_id = $trace_id group by all
),

launch_patterns as (
    select unnest($launch_patterns, recursive := true)
),

-- the runtime calls that put work on the device: patterns are matched on the few distinct names, not
-- on every call
launch_names as (
    select distinct r.cat, r.name_id
    from (select distinct cat, name_id from host_events where trace_id = $trace_id and list_contains($runtime_cats, cat)) as r
    inner join names as n on n.trace_id = $trace_id and n.name_id = r.name_id
    inner join launch_patterns as p on p.cat = r.cat
    where regexp_matches(n.name, p.pattern)
),

-- only the launches that count: joining every launch to the step spans by time was 0.02 s of a
-- 0.05 s statement on a 500 MB trace
launches_without_device_work as (
    select h.rank, h.start_ns
    from host_events as h
    semi join launch_names as l on l.cat = h.cat and l.name_id = h.name_id
    left join device_correlations as dc on dc.rank = h.rank and dc.correlation = h.correlation
    left join last_device as ld on ld.rank = h.rank
    where h.trace_id = $trace_id
        and dc.correlation is null
        and h.start_ns > coalesce(ld.last_start_ns, -1)
),

cut as (
    select s.rank, s.step, count(l.rank) as launches_without_gpu_work
    from spans as s
    left join launches_without_device_work as l on l.rank = s.rank and l.start_ns >= s.start_ns and l.start_ns < s.end_ns
    group by all
),

final as (
    select
        $trace_id as trace_id,
        s.rank,
        s.step,
        s.start_ns,
        s.end_ns,
        s.end_ns - s.start_ns as step_time_ns,
        coalesce(c.launches_without_gpu_work, 0) as launches_without_gpu_work,
        s.source
    from all_spans as s
    left join cut as c on c.rank = s.rank and c.step = s.step
)

select * from final
