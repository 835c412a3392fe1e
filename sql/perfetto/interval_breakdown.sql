-- traceq_interval_breakdown: the interval metrics (README: Metrics; integer ns) of every window: one row per
-- (scope, rank, device, step). scope 'step': the device windows of traceq_device_windows that hold
-- activity the step launched; scope 'trace': the whole timeline of the device (step -1), from its first
-- activity start to its last end. Every window measures ALL activity of the device inside it,
-- whichever step launched it, clipped at the window's edges; U = union over the device's streams.
-- The twin of sql/interval_breakdown.sql, computed another way: DuckDB sweeps one timeline of +1/-1
-- boundaries; here Perfetto's interval library merges each class into its union
-- (interval_merge_overlapping_partitioned) and intersects unions with windows (_interval_intersect):
--   comm_kernel_ns, compute_kernel_ns  sum of |kernel ∩ window|
--   comm_ns, compute_ns                |U(comm) ∩ window|, |U(compute) ∩ window|
--   overlapped_comm_ns                 |U(comm) ∩ U(compute) ∩ window|
--   exposed_comm_ns                    comm_ns − overlapped_comm_ns
--   busy_ns                            |U(all activity) ∩ window|
--   exposed_memcpy_ns                  busy_ns − |U(comm ∪ compute) ∩ window| = |U(memcpy ∪ memset) − U(compute) − U(comm)|
--   window_ns, idle_ns                 the window; window_ns − busy_ns
include perfetto module intervals.intersect;
include perfetto module traceq.windows;
include perfetto module traceq.unions;

create perfetto table traceq_interval_breakdown as
select
    w.scope,
    w.rank,
    w.device,
    w.step,
    coalesce(ck.ns, 0) as comm_kernel_ns,
    coalesce(pk.ns, 0) as compute_kernel_ns,
    coalesce(cu.ns, 0) as comm_ns,
    coalesce(pu.ns, 0) as compute_ns,
    coalesce(ov.ns, 0) as overlapped_comm_ns,
    coalesce(cu.ns, 0) - coalesce(ov.ns, 0) as exposed_comm_ns,
    coalesce(bu.ns, 0) - coalesce(cc.ns, 0) as exposed_memcpy_ns,
    coalesce(bu.ns, 0) as busy_ns,
    w.ts as window_start_ns,
    w.dur as window_ns,
    w.dur - coalesce(bu.ns, 0) as idle_ns
from traceq_windows as w
left join (select id_1 as id, sum(dur) as ns from _interval_intersect!((traceq_comm_kernels, traceq_windows), (rank, device)) group by 1) as ck using (id)
left join (select id_1 as id, sum(dur) as ns from _interval_intersect!((traceq_compute_kernels, traceq_windows), (rank, device)) group by 1) as pk using (id)
left join (select id_1 as id, sum(dur) as ns from _interval_intersect!((traceq_comm_union, traceq_windows), (rank, device)) group by 1) as cu using (id)
left join (select id_1 as id, sum(dur) as ns from _interval_intersect!((traceq_compute_union, traceq_windows), (rank, device)) group by 1) as pu using (id)
left join (select id_2 as id, sum(dur) as ns from _interval_intersect!((traceq_comm_union, traceq_compute_union, traceq_windows), (rank, device)) group by 1) as ov using (id)
left join (select id_1 as id, sum(dur) as ns from _interval_intersect!((traceq_busy_union, traceq_windows), (rank, device)) group by 1) as bu using (id)
left join (select id_1 as id, sum(dur) as ns from _interval_intersect!((traceq_comm_compute_union, traceq_windows), (rank, device)) group by 1) as cc using (id)
