-- inputs: gpu_classified, cpu_activity, comm_instances, path_bounds
-- path_activity: the activity the critical path walks over (traceq.report.critical_path; README: The
-- critical path), one row per device event (kernel, memcpy, memset; class sync is not activity) or, on
-- CPU-only traces, per CPU span of sql/cpu_activity.sql, of the traces and time ranges of `path_bounds`
-- (trace_id, lo_ns, hi_ns: an event is read when it ends after lo_ns and starts before hi_ns).
-- Columns: trace_id, rank, device (-1: none), stream (the thread on CPU), start_ns, end_ns, class (compute |
-- comm | memcpy | memset), name_id (names: the text is looked up for the segments alone), name_order (its
-- name's place in the alphabetical order of the names read: the walk's last tie-break), category,
-- launch_ns (the earliest runtime event of its correlation: when the host launched it; null without
-- one); communication: wait_ns (its first part, waiting for the last
-- peer: sql/comm_instances.sql), instance_id, collective_type, process_group, arrival (how the last to
-- arrive was found: duration | start time, on one clock | not inferable), and where wait_ns > 0 the
-- kernel of the same instance on the rank that arrived last (to_trace_id, to_rank, to_device,
-- to_start_ns): the walk jumps there.
with others as (
    select g.trace_id, g.rank, coalesce(g.device, -1) as device, g.stream, g.start_ns, g.end_ns, g.class, g.name_id,
           g.category, g.correlation
    from gpu_classified as g
    inner join path_bounds as b on b.trace_id = g.trace_id and g.end_ns > b.lo_ns and g.start_ns < b.hi_ns
    where g.class not in ('sync', 'comm')
    union all
    select c.trace_id, c.rank, c.device, c.tid, c.start_ns, c.end_ns, c.class, c.name_id, 'cpu op', null
    from cpu_activity as c
    inner join path_bounds as b on b.trace_id = c.trace_id and c.end_ns > b.lo_ns and c.start_ns < b.hi_ns
    where c.class <> 'comm'
),

comm as (
    select c.trace_id, c.rank, c.device, c.stream, c.start_ns, c.end_ns, c.name_id, c.correlation, c.wait_ns,
           c.instance_id, c.collective_type, c.process_group, c.arrival
    from comm_instances as c
    inner join path_bounds as b on b.trace_id = c.trace_id and c.end_ns > b.lo_ns and c.start_ns < b.hi_ns
),

-- the kernel of each waiting kernel's instance on the rank that arrived last
targets as (
    select c.instance_id, x.trace_id as to_trace_id, x.rank as to_rank, x.device as to_device,
           x.start_ns as to_start_ns
    from (select distinct instance_id from comm where wait_ns > 0) as c
    inner join comm_instances as x on x.instance_id = c.instance_id and x.arrived_last
),

activity as (
    select *, 0::bigint as wait_ns, null::ubigint as instance_id, null::varchar as collective_type,
           null::varchar as process_group, null::varchar as arrival
    from others
    union all by name
    select c.*, 'collective' as category, 'comm' as class
    from comm as c
),

-- the names' alphabetical order, sorted once per name, not once per row
name_orders as (
    select trace_id, name_id, dense_rank() over (order by name) as name_order
    from names
    semi join (select distinct trace_id, name_id from activity) as a using (trace_id, name_id)
),

launches as (
    select a.trace_id, a.rank, a.correlation, min(h.start_ns) as launch_ns
    from (select distinct trace_id, rank, correlation from activity where correlation is not null) as a
    inner join host_events as h
        on h.trace_id = a.trace_id and h.rank = a.rank and h.correlation = a.correlation
        and list_contains($runtime_cats, h.cat)
    group by all
)

select a.* exclude (correlation), o.name_order, l.launch_ns, t.to_trace_id, t.to_rank, t.to_device, t.to_start_ns
from activity as a
inner join name_orders as o using (trace_id, name_id)
left join launches as l using (trace_id, rank, correlation)
left join targets as t on a.wait_ns > 0 and t.instance_id = a.instance_id
