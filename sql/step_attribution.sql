-- Assign every GPU event of one trace ($trace_id) to a step (DESIGN §3), in O(n log n):
-- 1. launch: the runtime event with the same (rank, correlation) lies inside the CPU ProfilerStep span;
-- 2. no launch event: the device-side ProfilerStep annotation (same rank and device) contains its start;
-- 3. else the CPU step span contains its start. Events matching none stay unattributed (step null).
update gpu_events as g
set step = a.step, step_source = a.step_source
from (
    with kernels as (
        select rowid as rid, rank, device, start_ns, correlation
        from gpu_events
        where trace_id = $trace_id
    ),

    launches as (
        select rank, correlation, min(start_ns) as launch_ns
        from host_events
        where trace_id = $trace_id and cat in ('cuda_runtime', 'Runtime', 'cuda_driver') and correlation is not null
        group by all
    ),

    cpu_steps as (
        select rank, step, start_ns, end_ns from steps where trace_id = $trace_id
    ),

    device_steps as (
        select h.rank, h.device, profiler_step(n.name) as step, min(h.start_ns) as start_ns,
               max(h.start_ns + h.dur_ns) as end_ns
        from host_events as h
        inner join names as n on n.trace_id = h.trace_id and n.name_id = h.name_id
        where h.trace_id = $trace_id and h.cat = 'gpu_user_annotation' and profiler_step(n.name) is not null
        group by all
    ),

    with_launch as (
        select k.*, l.launch_ns
        from kernels as k
        left join launches as l on l.rank = k.rank and l.correlation = k.correlation
    ),

    by_launch as (
        select w.rid, s.step
        from with_launch as w
        asof inner join cpu_steps as s on s.rank = w.rank and w.launch_ns >= s.start_ns
        where w.launch_ns < s.end_ns
    ),

    by_device as (
        select w.rid, d.step
        from with_launch as w
        asof inner join device_steps as d on d.rank = w.rank and d.device = w.device and w.start_ns >= d.start_ns
        where w.launch_ns is null and w.start_ns < d.end_ns
    ),

    by_time as (
        select w.rid, s.step
        from with_launch as w
        asof inner join cpu_steps as s on s.rank = w.rank and w.start_ns >= s.start_ns
        where w.launch_ns is null and w.start_ns < s.end_ns
    ),

    -- by_launch holds kernels with a launch, the other two kernels without one: a kernel is in
    -- by_launch, or in by_device, or in by_time alone
    final as (
        select rid, step, 'launch' as step_source from by_launch
        union all
        select rid, step, 'device_annotation' from by_device
        union all
        select t.rid, t.step, 'time' from by_time as t anti join by_device as d on d.rid = t.rid
    )

    select * from final
) as a
where g.rowid = a.rid and a.step is not null
