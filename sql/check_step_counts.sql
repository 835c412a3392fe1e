-- check_step_counts: one row per run whose ranks recorded different numbers of steps.
-- Columns: run, path (null), rank (null), check, severity, count (ranks whose step count differs
-- from the most common one), detail (step counts and the ranks that have them).
with per_rank as (
    select t.run, s.rank, count(distinct s.step) as n_steps
    from steps as s
    inner join traces as t using (trace_id)
    group by all
),

histogram as (
    select run, n_steps, count(*) as n_ranks, string_agg(rank::varchar, ',' order by rank) as ranks
    from per_rank
    group by all
),

runs_with_mismatch as (
    select
        run,
        count(*) as n_distinct,
        sum(n_ranks) - max(n_ranks) as n_off,
        string_agg(format('{} step(s) on rank {}', n_steps, ranks), '; ' order by n_steps desc) as which
    from histogram
    group by all
    having count(*) > 1
),

final as (
    select
        run,
        null::varchar as path,
        null::bigint as rank,
        'step_count_mismatch' as "check",
        'warning' as severity,
        n_off as count,
        format('ranks recorded different numbers of steps ({}); compare ranks with --steps a:b', which) as detail
    from runs_with_mismatch
)

select * from final
