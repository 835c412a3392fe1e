-- inputs: comm_instances, device_activity, windows, stragglers
-- comm_split: one row per window of `windows` (as in sql/interval_breakdown.sql) with communication split
-- into waiting and transfer (sql/comm_instances.sql: each kernel's first wait_ns wait, the rest transfer;
-- an unmatched kernel is all transfer), clipped to the window like every interval metric:
--   comm_transfer_ns          |U(transfer parts)|
--   comm_wait_ns              |U(wait parts) − U(transfer parts)|
--   exposed_comm_transfer_ns  |U(transfer parts) − U(compute)|
--   exposed_comm_wait_ns      |U(wait parts) − U(transfer parts) − U(compute)|
-- so comm_wait_ns + comm_transfer_ns = comm_ns and exposed_comm_wait_ns + exposed_comm_transfer_ns =
-- exposed_comm_ns of interval_breakdown.sql, to the ns. Where two kernels overlap, moving data wins.
-- And the stragglers of the window (sql/stragglers.sql): matched_count, arrived_last_count, wait_caused_ns.
with spans as (
    select trace_id, rank, device, min(start_ns) as lo_ns, max(end_ns) as hi_ns
    from windows
    group by all
),

comm as (
    select c.trace_id, c.rank, c.device, c.start_ns, c.end_ns, c.wait_ns
    from comm_instances as c
    inner join spans as s on s.trace_id = c.trace_id and s.rank = c.rank and s.device = c.device
    where c.end_ns >= s.lo_ns and c.start_ns <= s.hi_ns
),

-- +1 wait (1) at a kernel's start, wait -> transfer (2**21 - 1) where its wait ends, -transfer at its end;
-- compute (2**42) opens and closes: three counts packed in one running sum, as in sql/interval_breakdown.sql
-- (a kernel without wait starts as transfer; a zero-length one opens and closes at one instant)
boundaries as (
    select trace_id, rank, device, start_ns as ts, case when wait_ns > 0 then 1 else 2097152 end::bigint as delta
    from comm
    union all
    select trace_id, rank, device, start_ns + wait_ns, 2097151::bigint
    from comm
    where wait_ns > 0
    union all
    select trace_id, rank, device, end_ns, -2097152::bigint
    from comm
    union all
    select a.trace_id, a.rank, a.device, ts, delta
    from device_activity as a
    inner join spans as s on s.trace_id = a.trace_id and s.rank = a.rank and s.device = a.device
    cross join lateral (values (a.start_ns, 4398046511104::bigint), (a.end_ns, -4398046511104::bigint)) as b(ts, delta)
    where a.class = 'compute' and a.end_ns >= s.lo_ns and a.start_ns <= s.hi_ns
    union all
    select trace_id, rank, device, start_ns, 0::bigint from windows
    union all
    select trace_id, rank, device, end_ns, 0::bigint from windows
),

running as (
    select
        trace_id, rank, device, ts,
        (sum(delta) over w)::bigint as open_packed,
        lead(ts) over w - ts as seg_ns
    from boundaries
    window w as (partition by trace_id, rank, device order by ts rows between unbounded preceding and current row)
),

segments as (
    select
        trace_id, rank, device, ts, seg_ns,
        open_packed & 2097151 as n_wait,
        (open_packed >> 21) & 2097151 as n_transfer,
        open_packed >> 42 as n_compute
    from running
    where seg_ns > 0
),

placed as (
    select w.step, s.*
    from (select * from segments where n_wait > 0 or n_transfer > 0) as s
    asof inner join (select * from windows where end_ns > start_ns) as w
        on w.trace_id = s.trace_id and w.rank = s.rank and w.device = s.device and s.ts >= w.start_ns
    where s.ts < w.end_ns
),

sweep as (
    select
        trace_id, rank, device, step,
        coalesce(sum(seg_ns) filter (where n_transfer > 0), 0)::bigint as comm_transfer_ns,
        coalesce(sum(seg_ns) filter (where n_transfer = 0), 0)::bigint as comm_wait_ns,
        coalesce(sum(seg_ns) filter (where n_transfer > 0 and n_compute = 0), 0)::bigint as exposed_comm_transfer_ns,
        coalesce(sum(seg_ns) filter (where n_transfer = 0 and n_compute = 0), 0)::bigint as exposed_comm_wait_ns
    from placed
    group by all
),

final as (
    select
        w.trace_id,
        w.rank,
        w.device,
        w.step,
        coalesce(s.comm_wait_ns, 0) as comm_wait_ns,
        coalesce(s.comm_transfer_ns, 0) as comm_transfer_ns,
        coalesce(s.exposed_comm_wait_ns, 0) as exposed_comm_wait_ns,
        coalesce(s.exposed_comm_transfer_ns, 0) as exposed_comm_transfer_ns,
        coalesce(g.matched_count, 0) as matched_count,
        coalesce(g.arrived_last_count, 0) as arrived_last_count,
        coalesce(g.wait_caused_ns, 0) as wait_caused_ns
    from windows as w
    left join sweep as s using (trace_id, rank, device, step)
    left join stragglers as g using (trace_id, rank, device, step)
)

select * from final
