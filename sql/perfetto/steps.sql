-- traceq_steps: one row per (rank, step): the CPU spans of traceq_marker_spans. A rank with events
-- but no marker gets one step, -1, over its whole timeline (source 'whole_trace'). The twin of
-- sql/steps.sql.
-- Columns: rank, step, start_ns, end_ns, step_time_ns, launches_without_gpu_work (device launches in
-- the step whose device work is missing AND that come after the rank's last device activity: the
-- trace ended before that work ran, so the step is incomplete), source.
include perfetto module traceq.marker_spans;
include perfetto module traceq.device_events;

-- the device launches whose device work is missing and that come after the rank's last device
-- activity (tables of their own: see sql/perfetto/marker_spans.sql)
create perfetto table _traceq_device_correlations as
select distinct rank, correlation from traceq_device_events where correlation is not null;

-- the runtime calls that put work on the device (traceq_launch_patterns), matched on the few
-- distinct names
create perfetto table _traceq_launch_names as
select r.cat, r.name
from (select distinct cat, name from traceq_events where role = 'runtime') as r
inner join traceq_launch_patterns as p on p.cat = r.cat
where iif(p.ci, lower(r.name) regexp p.pattern, r.name regexp p.pattern);

create perfetto table _traceq_launches_without_device_work as
with last_device as (
    select rank, max(start_ns) as last_start_ns from traceq_device_events group by rank
),

late_launches as (
    select e.rank, e.start_ns, extract_arg(e.arg_set_id, 'args.correlation') as correlation
    from traceq_events as e
    inner join _traceq_launch_names as l on l.cat = e.cat and l.name = e.name
    left join last_device as ld on ld.rank = e.rank
    where e.role = 'runtime' and e.start_ns > coalesce(ld.last_start_ns, -1)
)

select l.rank, l.start_ns
from late_launches as l
left join _traceq_device_correlations as dc on dc.rank = l.rank and dc.correlation = l.correlation
where dc.rank is null;

create perfetto table traceq_steps as
with spans as (
    select rank, step, start_ns, end_ns, 'marker' as source
    from traceq_marker_spans
    where side = 'cpu'
),

-- the rank's timeline: its events other than plain CPU operators (those without collective args that
-- are no step marker), as the DuckDB engine's warehouse keeps them for GPU traces, and other than
-- zero-length CPU slices (thread-scoped instant events, "[memory]" say, come as those)
timelines as (
    select rank, min(start_ns) as start_ns, max(end_ns) as end_ns
    from traceq_events
    where (dur_ns > 0 or role in ('kernel', 'memcpy', 'memset'))
        and (
            coalesce(role, '') <> 'operator'
            or extract_arg(arg_set_id, 'args.Collective name') is not null
            or name in (select name from _traceq_marker_names)
        )
    group by rank
),

whole_trace as (
    select t.rank, -1 as step, t.start_ns, t.end_ns, 'whole_trace' as source
    from timelines as t
    where t.rank not in (select rank from spans)
),

all_spans as (
    select * from spans
    union all
    select * from whole_trace
),

cut as (
    select s.rank, s.step, count(l.rank) as launches_without_gpu_work
    from spans as s
    left join _traceq_launches_without_device_work as l
        on l.rank = s.rank and l.start_ns >= s.start_ns and l.start_ns < s.end_ns
    group by s.rank, s.step
),

final as (
    select
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
