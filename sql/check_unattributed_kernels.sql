-- inputs: device_activity
-- check_unattributed_kernels: one row per (trace, rank) with device events that no step launched (their
-- launch lies outside every step's CPU span, e.g. before the profiler's first step, or they have no launch
-- event and no device-side step annotation holds them).
-- Columns: run, path, rank, check, severity (info), count (such events), detail.
-- Step figures still count the part of them that lies inside a step's device window (README: device windows, steps).
with per_rank as (
    select trace_id, rank, count(*) as n_events, count(*) filter (where step is null) as n_unattributed
    from device_activity
    where device >= 0
    group by all
),

final as (
    select
        t.run,
        t.path,
        p.rank,
        'unattributed_kernels' as "check",
        'info' as severity,
        p.n_unattributed as count,
        format(
            '{} of {} device events ({}%) were launched by no step (e.g. before the profiler''s first step); '
            || 'step figures count what of them lies inside a step''s window',
            p.n_unattributed, p.n_events, round(100 * p.n_unattributed / p.n_events, 1)
        ) as detail
    from per_rank as p
    inner join traces as t using (trace_id)
    where p.n_unattributed > 0
)

select * from final
