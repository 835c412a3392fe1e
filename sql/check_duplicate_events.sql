-- check_duplicate_events: one row per (trace, rank) with GPU events stored more than once.
-- Columns: run, path, rank, check, severity, count (extra copies), detail.
-- A copy has the same kind, name, device, stream, start, duration and correlation id: a trace
-- concatenated or merged twice. Sums of kernel durations count every copy.
with copies as (
    select trace_id, rank, count(*) - 1 as n_extra
    from gpu_events
    group by trace_id, rank, kind, name_id, device, stream, start_ns, dur_ns, correlation
    having count(*) > 1
),

per_rank as (
    select trace_id, rank, sum(n_extra)::bigint as n_extra, count(*) as n_distinct
    from copies
    group by all
),

final as (
    select
        t.run,
        t.path,
        p.rank,
        'duplicate_events' as "check",
        'warning' as severity,
        p.n_extra as count,
        format('{} GPU event(s) appear more than once (same name, stream, start, duration and correlation; '
            || '{} extra copies); the file was probably concatenated or merged twice: regenerate it',
            p.n_distinct, p.n_extra) as detail
    from per_rank as p
    inner join traces as t using (trace_id)
)

select * from final
