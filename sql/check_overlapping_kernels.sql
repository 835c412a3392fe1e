-- check_overlapping_kernels: one row per (trace, rank) with kernels that overlap on one stream.
-- Columns: run, path, rank, check, severity, count (kernels that start before an earlier kernel on
-- the same device and stream has ended), detail (streams involved, largest overlap in us).
-- A stream runs its kernels in order, so an overlap is graph replay reporting or bad timestamps:
-- union-based metrics are unaffected, sums of kernel durations count the overlap twice.
with distinct_kernels as (  -- exact copies are check_duplicate_events' finding, not an overlap
    select distinct trace_id, rank, device, stream, name_id, start_ns, dur_ns, correlation
    from gpu_events
    where kind = 1
),

kernels as (
    select
        trace_id,
        rank,
        device,
        stream,
        start_ns,
        max(start_ns + dur_ns) over (
            partition by trace_id, rank, device, stream
            order by start_ns, dur_ns
            rows between unbounded preceding and 1 preceding
        ) as previous_end_ns
    from distinct_kernels
),

overlapping as (
    select
        trace_id,
        rank,
        count(*) as n_kernels,
        count(distinct (device, stream)) as n_streams,
        max(previous_end_ns - start_ns) as max_overlap_ns
    from kernels
    where start_ns < previous_end_ns
    group by all
),

final as (
    select
        t.run,
        t.path,
        o.rank,
        'overlapping_kernels' as "check",
        'warning' as severity,
        o.n_kernels as count,
        format(
            '{} kernel(s) start before the previous kernel on their stream ended ({} stream(s), overlap up to {} us); '
            || 'typical of CUDA/HIP graph replay: overlap metrics are unaffected, kernel-time sums count it twice',
            o.n_kernels, o.n_streams, round(o.max_overlap_ns / 1000, 3)
        ) as detail
    from overlapping as o
    inner join traces as t using (trace_id)
)

select * from final
