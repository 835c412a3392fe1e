-- check_incomplete_steps: one row per (trace, rank) with steps cut by the end of the trace.
-- Columns: run, path, rank, check, severity, count (steps with launches_without_gpu_work > 0),
-- detail (which steps). Reports drop such a last step by default (README: device windows, steps).
with incomplete as (
    select
        trace_id,
        rank,
        count(*) as n_steps,
        string_agg(format('step {} ({} launches without device work)', step, launches_without_gpu_work), ', '
            order by step) as which
    from steps
    where launches_without_gpu_work > 0
    group by all
),

final as (
    select
        t.run,
        t.path,
        i.rank,
        'incomplete_steps' as "check",
        'info' as severity,
        i.n_steps as count,
        format('the trace ends before the GPU work of {} ran; reports leave out a cut last step', i.which) as detail
    from incomplete as i
    inner join traces as t using (trace_id)
)

select * from final
