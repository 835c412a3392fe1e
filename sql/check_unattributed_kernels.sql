-- check_unattributed_kernels: one row per (trace, rank) with kernels outside every ProfilerStep.
-- Columns: run, path, rank, check, severity, count (kernels with gpu_events.step null), detail.
-- A rank without any ProfilerStep#N has no step metrics at all (warning: use --window trace);
-- otherwise kernels outside the profiled steps are normal but left out of step metrics (info).
with steps_per_rank as (
    select trace_id, rank, count(*) as n_steps
    from steps
    group by all
),

unattributed as (
    select trace_id, rank, count(*) as n_kernels, count(*) filter (where step is null) as n_unattributed
    from gpu_events
    where kind = 1
    group by all
),

final as (
    select
        t.run,
        t.path,
        u.rank,
        'unattributed_kernels' as "check",
        case when s.n_steps is null then 'warning' else 'info' end as severity,
        u.n_unattributed as count,
        case
            when s.n_steps is null then format(
                'no ProfilerStep#N annotation: none of the {} kernels belongs to a step, so step metrics are empty; '
                || 'report with --window trace, or profile with a schedule and call prof.step()', u.n_kernels
            )
            else format(
                '{} of {} kernels ({}%) fall outside every ProfilerStep and are left out of step metrics',
                u.n_unattributed, u.n_kernels, round(100 * u.n_unattributed / u.n_kernels, 1)
            )
        end as detail
    from unattributed as u
    inner join traces as t using (trace_id)
    left join steps_per_rank as s using (trace_id, rank)
    where u.n_unattributed > 0
)

select * from final
