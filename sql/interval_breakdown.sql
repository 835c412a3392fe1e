-- inputs: device_activity, windows
-- interval_breakdown: one row per window (trace_id, rank, device, step) of `windows` (the selected steps'
-- device windows, sql/selected_windows.sql, or the whole timeline, sql/trace_windows.sql) with the
-- interval metrics of the README's Metrics table in integer ns, over ALL activity of the device inside the window,
-- whichever step launched it, clipped at the window's edges. U = union over all streams of one device.
--   comm_kernel_ns / compute_kernel_ns  sum of the (clipped) kernel durations
--   comm_ns, compute_ns                 |U(comm)|, |U(compute)|
--   overlapped_comm_ns                  |U(comm) ∩ U(compute)|
--   exposed_comm_ns                     |U(comm) − U(compute)|
--   exposed_memcpy_ns                   |U(memcpy ∪ memset) − U(compute) − U(comm)|
--   busy_ns                             |U(all activity)|
--   window_start_ns, window_ns          the window
--   idle_ns                             window_ns − busy_ns (0 <= idle_ns <= window_ns)
--   overlap_ratio                       overlapped_comm_ns / comm_ns
--   comm_wait_ns                        |U(wait parts) − U(transfer parts)|: every running comm kernel is
--                                       in its first wait_ns (device_activity.wait_ns: 0 unless bound to
--                                       sql/split_activity.sql), waiting for its last peer
--   comm_transfer_ns                    comm_ns − comm_wait_ns (where two kernels overlap, moving data wins)
--   exposed_comm_wait_ns                comm_wait_ns − U(compute); exposed_comm_transfer_ns the rest of
--                                       exposed_comm_ns
-- Identity: compute_ns + exposed_comm_ns + exposed_memcpy_ns + idle_ns = window_ns.
-- One sweep over each device's timeline: window edges are boundaries too, so no segment straddles one,
-- and each segment is placed in the window that holds it (so per-step figures summed over steps a..b
-- equal the figures over the span of those windows, to the ns).
with spans as (
    select trace_id, rank, device, min(start_ns) as lo_ns, max(end_ns) as hi_ns
    from windows
    group by all
),

-- the activity that can reach a window
activity as (
    select a.trace_id, a.rank, a.device, a.start_ns, a.end_ns, a.class, a.wait_ns
    from device_activity as a
    inner join spans as s on s.trace_id = a.trace_id and s.rank = a.rank and s.device = a.device
    where a.end_ns >= s.lo_ns and a.start_ns <= s.hi_ns
),

-- +1 when an interval of a class opens, -1 when it closes; zero-length intervals cancel out. The three
-- counts travel packed in one bigint, 21 bits each (comm, compute, memcpy/memset from the low bits up),
-- so that one running sum does the work of three (0.18 -> 0.155 s on the 500 MB trace): the packed sum
-- is exact, and where it is read (the last boundary of each instant, below) every count is the number
-- of open intervals, >= 0 and far below 2**21. Window edges enter with 0.
-- A second running sum counts the comm kernels in their wait part: +1 at the start of one that waits,
-- -1 where its wait ends.
boundaries as (
    select trace_id, rank, device, start_ns as ts,
           case when class = 'comm' then 1 when class = 'compute' then 2097152 when class in ('memcpy', 'memset') then 4398046511104 else 0 end::bigint as delta,
           (wait_ns > 0)::bigint as d_wait
    from activity
    union all
    select trace_id, rank, device, end_ns as ts,
           -(case when class = 'comm' then 1 when class = 'compute' then 2097152 when class in ('memcpy', 'memset') then 4398046511104 else 0 end::bigint),
           0::bigint
    from activity
    union all
    select trace_id, rank, device, start_ns + wait_ns, 0::bigint, -1::bigint from activity where wait_ns > 0
    union all
    select trace_id, rank, device, start_ns, 0::bigint, 0::bigint from windows
    union all
    select trace_id, rank, device, end_ns, 0::bigint, 0::bigint from windows
),

-- Boundaries at the same ts are not summed first: all but the last of them (in the window's order)
-- start a segment of length 0, and the last carries the sum of them all (0.22 -> 0.17 s on the 500 MB
-- trace without the group by). Such a boundary may read a count that is -1 for a moment: its segment
-- has length 0 and is dropped.
running as (
    select
        trace_id, rank, device, ts,
        (sum(delta) over w)::bigint as open_packed,
        (sum(d_wait) over w)::bigint as n_wait,
        lead(ts) over w - ts as seg_ns
    from boundaries
    window w as (partition by trace_id, rank, device order by ts rows between unbounded preceding and current row)
),

segments as (
    select
        trace_id, rank, device, ts, seg_ns, n_wait,
        open_packed & 2097151 as n_comm,
        (open_packed >> 21) & 2097151 as n_compute,
        open_packed >> 42 as n_mem
    from running
    where seg_ns > 0
),

-- the window that holds each segment (windows of a device do not overlap; empty ones hold nothing)
placed as (
    select w.step, s.*
    from segments as s
    asof inner join (select * from windows where end_ns > start_ns) as w
        on w.trace_id = s.trace_id and w.rank = s.rank and w.device = s.device and s.ts >= w.start_ns
    where s.ts < w.end_ns
),

sweep as (
    select
        trace_id, rank, device, step,
        sum(seg_ns * n_comm)::bigint as comm_kernel_ns,
        sum(seg_ns * n_compute)::bigint as compute_kernel_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0), 0)::bigint as comm_ns,
        coalesce(sum(seg_ns) filter (where n_compute > 0), 0)::bigint as compute_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 and n_compute > 0), 0)::bigint as overlapped_comm_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 and n_compute = 0), 0)::bigint as exposed_comm_ns,
        coalesce(sum(seg_ns) filter (where n_mem > 0 and n_comm = 0 and n_compute = 0), 0)::bigint as exposed_memcpy_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 or n_compute > 0 or n_mem > 0), 0)::bigint as busy_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 and n_wait = n_comm), 0)::bigint as comm_wait_ns,
        coalesce(sum(seg_ns) filter (where n_comm > 0 and n_wait = n_comm and n_compute = 0), 0)::bigint as exposed_comm_wait_ns
    from placed
    group by all
),

final as (
    select
        w.trace_id,
        w.rank,
        w.device,
        w.step,
        coalesce(s.comm_kernel_ns, 0) as comm_kernel_ns,
        coalesce(s.compute_kernel_ns, 0) as compute_kernel_ns,
        coalesce(s.comm_ns, 0) as comm_ns,
        coalesce(s.compute_ns, 0) as compute_ns,
        coalesce(s.overlapped_comm_ns, 0) as overlapped_comm_ns,
        coalesce(s.exposed_comm_ns, 0) as exposed_comm_ns,
        coalesce(s.exposed_memcpy_ns, 0) as exposed_memcpy_ns,
        coalesce(s.busy_ns, 0) as busy_ns,
        w.start_ns as window_start_ns,
        w.end_ns - w.start_ns as window_ns,
        w.end_ns - w.start_ns - coalesce(s.busy_ns, 0) as idle_ns,
        case when s.comm_ns > 0 then s.overlapped_comm_ns / s.comm_ns end as overlap_ratio,
        coalesce(s.comm_wait_ns, 0) as comm_wait_ns,
        coalesce(s.comm_ns - s.comm_wait_ns, 0) as comm_transfer_ns,
        coalesce(s.exposed_comm_wait_ns, 0) as exposed_comm_wait_ns,
        coalesce(s.exposed_comm_ns - s.exposed_comm_wait_ns, 0) as exposed_comm_transfer_ns
    from windows as w
    left join sweep as s using (trace_id, rank, device, step)
)

select * from final
