-- traceq_step_attribution: the step that launched each device event; one row per attributed event: id
-- (slice id), step, step_source. The twin of sql/step_attribution.sql:
-- 1. launch: the runtime event with the same (rank, correlation) lies inside the step's CPU span;
-- 2. no launch event: the device-side step annotation (same rank and device) contains its start;
-- 3. neither, on a rank that has no launch event for any device event and no device-side step
--    annotation (a GPU-only trace): the CPU step span contains its start.
-- A rank without any step marker has one step, -1, over its whole trace: every event belongs to it.
-- "The latest span that starts at or before t" is a running maximum over span starts and probes
-- merged in time order (spans first at a tie): O(n log n), like DuckDB's ASOF join. The steps are
-- tables of their own (_traceq_*): as common table expressions of one statement, SQLite ran the
-- window again for every span (14 s against 0.1 s on a 35 MB trace).
include perfetto module traceq.steps;

-- each device event with its launch time: the launches and the events in one table, the launch
-- carried to the events of its (rank, correlation) by a window (a join on the two columns ran as a
-- nested loop: 21 s on the 500 MB benchmark trace)
create perfetto table _traceq_with_launch as
with keyed as (
    select rank, correlation, null as id, null as device, null as start_ns, launch_ns from _traceq_launches
    union all
    select rank, correlation, id, device, start_ns, null
    from traceq_device_events
    where rank not in (select rank from traceq_steps where source = 'whole_trace')
),

carried as (
    select id, rank, device, start_ns, max(launch_ns) over (partition by rank, correlation) as launch_ns
    from keyed
)

select id, rank, device, start_ns, launch_ns
from carried
where id is not null;

-- the spans each kind of probe looks up (key: the device for device annotations, else 0)
create perfetto table _traceq_attribution_spans as
select 'launch' as kind, rank, 0 as key, step, start_ns, end_ns from traceq_steps where source = 'marker'
union all
select 'time', rank, 0, step, start_ns, end_ns from traceq_steps where source = 'marker'
union all
select 'device', rank, device, step, start_ns, end_ns from traceq_marker_spans where side = 'device';

create perfetto table _traceq_attribution_carried as
with by_time_ranks as (
    -- ranks where time containment may decide: no device event has a launch, no device-side step annotation
    select distinct rank from _traceq_with_launch
    except
    select distinct rank from _traceq_with_launch where launch_ns is not null
    except
    select distinct rank from traceq_marker_spans where side = 'device'
),

probes as (
    select 'launch' as kind, rank, 0 as key, id, launch_ns as ts from _traceq_with_launch where launch_ns is not null
    union all
    select 'device', rank, device, id, start_ns from _traceq_with_launch where launch_ns is null
    union all
    select 'time', rank, 0, id, start_ns from _traceq_with_launch where rank in (select rank from by_time_ranks)
),

merged as (
    select kind, rank, key, null as id, start_ns as ts, 0 as tie from _traceq_attribution_spans
    union all
    select kind, rank, key, id, ts, 1 from probes
)

select
    kind, rank, key, id, ts,
    max(iif(id is null, ts, null)) over (partition by kind, rank, key order by ts, tie rows between unbounded preceding and current row) as span_start_ns
from merged;

create perfetto table traceq_step_attribution as
with found as (
    select c.id, max(s.step) as step, c.kind
    from _traceq_attribution_carried as c
    inner join _traceq_attribution_spans as s
        on s.kind = c.kind and s.rank = c.rank and s.key = c.key and s.start_ns = c.span_start_ns
    where c.id is not null and c.ts < s.end_ns
    group by c.id, c.kind
)

select id, step, case kind when 'launch' then 'launch' when 'device' then 'device_annotation' else 'time' end as step_source
from found
union all
select d.id, -1, 'whole_trace'
from traceq_device_events as d
where d.rank in (select rank from traceq_steps where source = 'whole_trace')
