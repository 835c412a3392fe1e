-- The intervals the metrics intersect with windows, per (rank, device), in the shape of Perfetto's
-- interval macros (id, ts, dur, rank, device); zero-length intervals cover nothing and are left out:
--   traceq_comm_kernels, traceq_compute_kernels     the kernels themselves (they may overlap)
--   traceq_comm_union, traceq_compute_union         U(comm), U(compute)
--   traceq_comm_compute_union                       U(comm ∪ compute)
--   traceq_busy_union                               U(all activity)
-- Unions by Perfetto's interval_merge_overlapping_partitioned (intervals.overlap).
include perfetto module intervals.overlap;
include perfetto module traceq.activity;

create perfetto table traceq_comm_kernels as
select id, ts, dur, rank, device from traceq_activity where class = 'comm' and dur > 0;

create perfetto table traceq_compute_kernels as
select id, ts, dur, rank, device from traceq_activity where class = 'compute' and dur > 0;

create perfetto macro traceq_union(classes Expr)
returns TableOrSubquery as (
    select row_number() over (order by rank, device, ts) as id, ts, dur, rank, device
    from interval_merge_overlapping_partitioned!(
        (select ts, dur, rank, device from traceq_activity where class in $classes and dur > 0),
        (rank, device)
    )
);

create perfetto table traceq_comm_union as
select * from traceq_union!(('comm'));

create perfetto table traceq_compute_union as
select * from traceq_union!(('compute'));

create perfetto table traceq_comm_compute_union as
select * from traceq_union!(('comm', 'compute'));

create perfetto table traceq_busy_union as
select * from traceq_union!(('comm', 'compute', 'memcpy', 'memset'))
