-- exposed_comm_by_collective: one row per (trace_id, rank, device, step, dimension, key) — step -1 when
-- $whole_trace — with the exposed communication of one collective type or one process group.
-- Expects temp table selected_steps(trace_id, rank, step) when not $whole_trace.
--   dimension           collective (key = AllReduce, AllGather, ...) | process_group (key = "desc (name)")
--   key                 the collective type or process group label ('unknown' when the trace names none)
--   comm_ns             |U(comm of key)|, ns
--   exposed_comm_ns     |U(comm of key) − U(compute)|, ns
-- Every key seen on a GPU gets a row in each of its steps (0 when absent), so means over steps are right.
-- These do not add up to exposed_comm_ns of interval_breakdown.sql: where collectives of two keys overlap each
-- other, that time counts once for each key (so the sum can be larger than the total).
with activity as (
    select
        a.trace_id,
        a.rank,
        coalesce(a.device, -1) as device,
        case when $whole_trace then -1 else a.step end as step,
        a.start_ns,
        a.end_ns,
        a.class,
        a.collective_type,
        coalesce(a.pg_desc || ' (' || a.pg_name || ')', a.pg_name, a.pg_desc, 'unknown') as process_group
    from gpu_activity as a
    where a.class in ('comm', 'compute')
        and ($whole_trace
            or exists (
                select 1 from selected_steps as s
                where s.trace_id = a.trace_id and s.rank = a.rank and s.step = a.step
            ))
),

comm as (
    select trace_id, rank, device, step, 'collective' as dimension, collective_type as key, start_ns, end_ns
    from activity
    where class = 'comm'
    union all
    select trace_id, rank, device, step, 'process_group' as dimension, process_group as key, start_ns, end_ns
    from activity
    where class = 'comm'
),

gpu_steps as (
    select distinct trace_id, rank, device, step from activity
),

gpu_keys as (
    select distinct trace_id, rank, device, dimension, key from comm
),

-- every step of a GPU × every key that GPU ever shows
grid as (
    select s.trace_id, s.rank, s.device, s.step, k.dimension, k.key
    from gpu_steps as s
    inner join gpu_keys as k on k.trace_id = s.trace_id and k.rank = s.rank and k.device = s.device
),

step_keys as (
    select distinct trace_id, rank, device, step, dimension, key from comm
),

-- comm intervals under their key; compute intervals under every key of their step
labelled as (
    select trace_id, rank, device, step, dimension, key, start_ns, end_ns, 1 as is_comm
    from comm
    union all
    select a.trace_id, a.rank, a.device, a.step, k.dimension, k.key, a.start_ns, a.end_ns, 0 as is_comm
    from activity as a
    inner join step_keys as k
        on k.trace_id = a.trace_id and k.rank = a.rank and k.device = a.device and k.step = a.step
    where a.class = 'compute'
),

boundaries as (
    select trace_id, rank, device, step, dimension, key, start_ns as ts, is_comm as d_comm, 1 - is_comm as d_compute
    from labelled
    union all
    select trace_id, rank, device, step, dimension, key, end_ns as ts, -is_comm, -(1 - is_comm)
    from labelled
),

-- boundaries at the same ts are not summed first: all but the last (in the window's order) start a
-- segment of length 0, and the last carries the sum of them all (sql/interval_breakdown.sql)
running as (
    select
        trace_id, rank, device, step, dimension, key,
        sum(d_comm) over w as n_comm,
        sum(d_compute) over w as n_compute,
        lead(ts) over w - ts as seg_ns
    from boundaries
    window w as (
        partition by trace_id, rank, device, step, dimension, key
        order by ts rows between unbounded preceding and current row
    )
),

sweep as (
    select
        trace_id, rank, device, step, dimension, key,
        coalesce(sum(seg_ns) filter (where n_comm > 0), 0)::bigint as comm_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 and n_compute = 0), 0)::bigint as exposed_comm_ns
    from running
    group by all
),

final as (
    select
        g.trace_id,
        g.rank,
        g.device,
        g.step,
        g.dimension,
        g.key,
        coalesce(s.comm_ns, 0) as comm_ns,
        coalesce(s.exposed_comm_ns, 0) as exposed_comm_ns
    from grid as g
    left join sweep as s
        on s.trace_id = g.trace_id and s.rank = g.rank and s.device = g.device and s.step = g.step
        and s.dimension = g.dimension and s.key = g.key
)

select * from final
