-- interval_breakdown: one row per (trace_id, rank, device, step) — step -1 when $whole_trace — with
-- the interval metrics of DESIGN §4 in integer ns. U = union over all streams of one GPU.
-- Reads temp view breakdown_input (gpu_classified, or cpu_activity for CPU-only gloo traces: device -1)
-- with columns trace_id, rank, device, step, start_ns, end_ns, dur_ns, class; and temp table
-- selected_steps(trace_id, rank, step) when not $whole_trace.
--   comm_kernel_ns / compute_kernel_ns  sum of kernel durations
--   comm_ns, compute_ns                 |U(comm)|, |U(compute)|
--   overlapped_comm_ns                  |U(comm) ∩ U(compute)|
--   exposed_comm_ns                     |U(comm) − U(compute)|
--   exposed_memcpy_ns                   |U(memcpy ∪ memset) − U(compute) − U(comm)|
--   busy_ns                             |U(all GPU activity)|
--   window_ns                           first activity start to last activity end
--   idle_ns                             window_ns − busy_ns
-- Identity: compute_ns + exposed_comm_ns + exposed_memcpy_ns + idle_ns = window_ns.
with activity as (
    select
        a.trace_id,
        a.rank,
        coalesce(a.device, -1) as device,
        case when $whole_trace then -1 else a.step end as step,
        a.start_ns,
        a.end_ns,
        a.dur_ns,
        a.class
    from breakdown_input as a
    where $whole_trace
        or exists (
            select 1 from selected_steps as s
            where s.trace_id = a.trace_id and s.rank = a.rank and s.step = a.step
        )
),

-- +1 when an interval of a class opens, -1 when it closes; zero-length intervals cancel out. The three
-- counts travel packed in one bigint, 21 bits each (comm, compute, memcpy/memset from the low bits up),
-- so that one running sum does the work of three (0.18 -> 0.155 s on the 500 MB trace): the packed sum
-- is exact, and where it is read (the last boundary of each instant, below) every count is the number
-- of open intervals, >= 0 and far below 2**21.
boundaries as (
    select trace_id, rank, device, step, start_ns as ts,
           case when class = 'comm' then 1 when class = 'compute' then 2097152 when class in ('memcpy', 'memset') then 4398046511104 else 0 end::bigint as delta
    from activity
    union all
    select trace_id, rank, device, step, end_ns as ts,
           -(case when class = 'comm' then 1 when class = 'compute' then 2097152 when class in ('memcpy', 'memset') then 4398046511104 else 0 end::bigint)
    from activity
),

-- One running sum per rank over its (device, step) groups in turn, not one per group (a partition per
-- step made DuckDB's window 1.7x slower on a 153-step trace): each group's +1s and -1s cancel, so
-- every count is back at 0 at a group's last boundary, and the segment from there to the next
-- group's first boundary counts in no sum.
-- Boundaries at the same ts are not summed first: all but the last of them (in the window's order)
-- start a segment of length 0, and the last carries the sum of them all (0.22 -> 0.17 s on the 500 MB
-- trace without the group by).
running as (
    select
        trace_id, rank, device, step,
        (sum(delta) over w)::bigint as open_packed,
        lead(ts) over w - ts as seg_ns
    from boundaries
    window w as (partition by trace_id, rank order by device, step, ts rows between unbounded preceding and current row)
),

-- (a boundary that is not the last of its instant may read garbage here, from a count that is -1 for
-- a moment; its segment has length 0)
counts as (
    select
        trace_id, rank, device, step, seg_ns,
        open_packed & 2097151 as n_comm,
        (open_packed >> 21) & 2097151 as n_compute,
        open_packed >> 42 as n_mem
    from running
),

sweep as (
    select
        trace_id, rank, device, step,
        coalesce(sum(seg_ns) filter (where n_comm > 0), 0)::bigint as comm_ns,
        coalesce(sum(seg_ns) filter (where n_compute > 0), 0)::bigint as compute_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 and n_compute > 0), 0)::bigint as overlapped_comm_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 and n_compute = 0), 0)::bigint as exposed_comm_ns,
        coalesce(sum(seg_ns) filter (where n_mem > 0 and n_comm = 0 and n_compute = 0), 0)::bigint as exposed_memcpy_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 or n_compute > 0 or n_mem > 0), 0)::bigint as busy_ns
    from counts
    group by all
),

totals as (
    select
        trace_id, rank, device, step,
        coalesce(sum(dur_ns) filter (where class = 'comm'), 0)::bigint as comm_kernel_ns,
        coalesce(sum(dur_ns) filter (where class = 'compute'), 0)::bigint as compute_kernel_ns,
        count(*) filter (where class = 'comm') as n_comm_kernels,
        count(*) filter (where class = 'compute') as n_compute_kernels,
        min(start_ns) as window_start_ns,
        max(end_ns) as window_end_ns
    from activity
    group by all
),

final as (
    select
        t.trace_id,
        t.rank,
        t.device,
        t.step,
        t.n_comm_kernels,
        t.n_compute_kernels,
        t.comm_kernel_ns,
        t.compute_kernel_ns,
        s.comm_ns,
        s.compute_ns,
        s.overlapped_comm_ns,
        s.exposed_comm_ns,
        s.exposed_memcpy_ns,
        s.busy_ns,
        t.window_start_ns,
        t.window_end_ns - t.window_start_ns as window_ns,
        t.window_end_ns - t.window_start_ns - s.busy_ns as idle_ns,
        case when s.comm_ns > 0 then s.overlapped_comm_ns / s.comm_ns end as overlap_ratio,
        st.step_time_ns
    from totals as t
    inner join sweep as s using (trace_id, rank, device, step)
    left join steps as st on st.trace_id = t.trace_id and st.rank = t.rank and st.step = t.step
)

select * from final
