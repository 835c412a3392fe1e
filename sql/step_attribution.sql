-- inputs: marker_spans
-- step_attribution: the step that launched each device event of the traces $first_trace..$last_trace (README: device
-- windows, steps); one row per attributed event: rid (gpu_events.rowid), step, step_source. In O(n log n) (ASOF joins):
-- 1. launch: the runtime event with the same (rank, correlation) lies inside the step's CPU span;
-- 2. no launch event: the device-side step annotation (same rank and device) contains its start;
-- 3. neither, on a rank that has no launch event for any device event and no device-side step
--    annotation (a GPU-only trace): the CPU step span contains its start. On other ranks such an event
--    was launched by no step (e.g. before the profiler started) and is not attributed.
-- A rank without any step marker has one step, -1, over its whole trace: every event belongs to it.
-- The device-side step annotations come from sql/marker_spans.sql.
with events as (
    select rowid as rid, trace_id, rank, device, start_ns, correlation
    from gpu_events
    where trace_id between $first_trace and $last_trace
),

launches as (
    select trace_id, rank, correlation, min(start_ns) as launch_ns
    from host_events
    where trace_id between $first_trace and $last_trace and list_contains($runtime_cats, cat) and correlation is not null
    group by all
),

cpu_steps as (
    select trace_id, rank, step, start_ns, end_ns, source
    from steps
    where trace_id between $first_trace and $last_trace
),

whole_trace_ranks as (
    select distinct trace_id, rank from cpu_steps where source = 'whole_trace'
),

device_steps as (
    select trace_id, rank, device, step, start_ns, end_ns from marker_spans where side = 'device'
),

with_launch as (
    select e.*, l.launch_ns
    from events as e
    left join launches as l on l.trace_id = e.trace_id and l.rank = e.rank and l.correlation = e.correlation
    anti join whole_trace_ranks as w on w.trace_id = e.trace_id and w.rank = e.rank
),

-- ranks where time containment may decide: no device event has a launch, no device-side step annotation
by_time_ranks as (
    select distinct trace_id, rank from with_launch
    except
    select distinct trace_id, rank from with_launch where launch_ns is not null
    except
    select distinct trace_id, rank from device_steps
),

by_launch as (
    select w.rid, s.step
    from with_launch as w
    asof inner join cpu_steps as s on s.trace_id = w.trace_id and s.rank = w.rank and w.launch_ns >= s.start_ns
    where w.launch_ns < s.end_ns
),

by_device as (
    select w.rid, d.step
    from with_launch as w
    asof inner join device_steps as d
        on d.trace_id = w.trace_id and d.rank = w.rank and d.device = w.device and w.start_ns >= d.start_ns
    where w.launch_ns is null and w.start_ns < d.end_ns
),

by_time as (
    select w.rid, s.step
    from with_launch as w
    semi join by_time_ranks as r on r.trace_id = w.trace_id and r.rank = w.rank
    asof inner join cpu_steps as s on s.trace_id = w.trace_id and s.rank = w.rank and w.start_ns >= s.start_ns
    where w.start_ns < s.end_ns
),

whole_trace as (
    select e.rid, -1 as step
    from events as e
    semi join whole_trace_ranks as w on w.trace_id = e.trace_id and w.rank = e.rank
),

-- by_launch holds events with a launch; by_device those without; by_time events of ranks with neither
-- launches nor device annotations (so never one in by_device); whole_trace the rest of the ranks
final as (
    select rid, step, 'launch' as step_source from by_launch
    union all
    select rid, step, 'device_annotation' from by_device
    union all
    select rid, step, 'time' from by_time
    union all
    select rid, step, 'whole_trace' from whole_trace
)

select * from final
