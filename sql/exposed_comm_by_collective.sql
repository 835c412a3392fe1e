-- inputs: gpu_activity, windows
-- exposed_comm_by_collective: one row per window of `windows` (as in sql/interval_breakdown.sql) and
-- (dimension, key) seen on its device, with the exposed communication of one collective type or one
-- process group, clipped to the window like every interval metric.
--   dimension           collective (key = AllReduce, AllGather, ...) | process_group (key = "desc (name)")
--   key                 the collective type or process group label ('unknown' when the trace names none)
--   comm_ns             |U(comm of key)|, ns
--   exposed_comm_ns     |U(comm of key) − U(compute)|, ns
-- Every key seen on a device gets a row in each of its windows (0 when absent), so means over steps are
-- right. These do not add up to exposed_comm_ns of interval_breakdown.sql: where collectives of two keys
-- overlap each other, that time counts once for each key (so the sum can be larger than the total).
with spans as (
    select trace_id, rank, device, min(start_ns) as lo_ns, max(end_ns) as hi_ns
    from windows
    group by all
),

activity as (
    select
        a.trace_id,
        a.rank,
        coalesce(a.device, -1) as device,
        a.start_ns,
        a.end_ns,
        a.class,
        a.collective_type,
        coalesce(a.pg_desc || ' (' || a.pg_name || ')', a.pg_name, a.pg_desc, 'unknown') as process_group
    from gpu_activity as a
    inner join spans as s on s.trace_id = a.trace_id and s.rank = a.rank and s.device = coalesce(a.device, -1)
    where a.class in ('comm', 'compute') and a.end_ns >= s.lo_ns and a.start_ns <= s.hi_ns
),

comm as (
    select trace_id, rank, device, 'collective' as dimension, collective_type as key, start_ns, end_ns
    from activity
    where class = 'comm'
    union all
    select trace_id, rank, device, 'process_group' as dimension, process_group as key, start_ns, end_ns
    from activity
    where class = 'comm'
),

device_keys as (
    select distinct trace_id, rank, device, dimension, key from comm
),

-- comm intervals under their key; compute intervals under every key of their device
labelled as (
    select trace_id, rank, device, dimension, key, start_ns, end_ns, 1 as is_comm
    from comm
    union all
    select a.trace_id, a.rank, a.device, k.dimension, k.key, a.start_ns, a.end_ns, 0 as is_comm
    from activity as a
    inner join device_keys as k on k.trace_id = a.trace_id and k.rank = a.rank and k.device = a.device
    where a.class = 'compute'
),

boundaries as (
    select trace_id, rank, device, dimension, key, start_ns as ts, is_comm as d_comm, 1 - is_comm as d_compute
    from labelled
    union all
    select trace_id, rank, device, dimension, key, end_ns as ts, -is_comm, -(1 - is_comm)
    from labelled
    union all
    select k.trace_id, k.rank, k.device, k.dimension, k.key, e.ts, 0, 0
    from device_keys as k
    inner join (
        select trace_id, rank, device, start_ns as ts from windows
        union all
        select trace_id, rank, device, end_ns as ts from windows
    ) as e on e.trace_id = k.trace_id and e.rank = k.rank and e.device = k.device
),

-- boundaries at the same ts are not summed first: all but the last (in the window's order) start a
-- segment of length 0, and the last carries the sum of them all (sql/interval_breakdown.sql)
running as (
    select
        trace_id, rank, device, dimension, key, ts,
        sum(d_comm) over w as n_comm,
        sum(d_compute) over w as n_compute,
        lead(ts) over w - ts as seg_ns
    from boundaries
    window w as (
        partition by trace_id, rank, device, dimension, key
        order by ts rows between unbounded preceding and current row
    )
),

placed as (
    select w.step, s.*
    from (select * from running where seg_ns > 0 and n_comm > 0) as s
    asof inner join (select * from windows where end_ns > start_ns) as w
        on w.trace_id = s.trace_id and w.rank = s.rank and w.device = s.device and s.ts >= w.start_ns
    where s.ts < w.end_ns
),

sweep as (
    select
        trace_id, rank, device, step, dimension, key,
        sum(seg_ns)::bigint as comm_ns,
        coalesce(sum(seg_ns) filter (where n_compute = 0), 0)::bigint as exposed_comm_ns
    from placed
    group by all
),

final as (
    select
        w.trace_id,
        w.rank,
        w.device,
        w.step,
        k.dimension,
        k.key,
        coalesce(s.comm_ns, 0) as comm_ns,
        coalesce(s.exposed_comm_ns, 0) as exposed_comm_ns
    from windows as w
    inner join device_keys as k on k.trace_id = w.trace_id and k.rank = w.rank and k.device = w.device
    left join sweep as s
        on s.trace_id = w.trace_id and s.rank = w.rank and s.device = w.device and s.step = w.step
        and s.dimension = k.dimension and s.key = k.key
)

select * from final
