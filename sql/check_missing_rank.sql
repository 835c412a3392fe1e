-- check_missing_rank: one row per trace whose rank is unknown (traces.rank_source = 'unknown').
-- Columns: run, path, rank (-1), check, severity, count (events stored with rank -1), detail.
-- A warning when the run holds other traces (their GPUs cannot be told apart), else info.
with unknown as (
    select trace_id, count(*) as n_events
    from (
        select trace_id from gpu_events where rank = -1
        union all
        select trace_id from host_events where rank = -1
    )
    group by all
),

traces_per_run as (
    select run, count(*) as n_traces
    from traces
    group by all
),

final as (
    select
        t.run,
        t.path,
        -1 as rank,
        'missing_rank' as "check",
        case when r.n_traces > 1 then 'warning' else 'info' end as severity,
        coalesce(u.n_events, 0) as count,
        case when r.n_traces > 1 then format('no rank in distributedInfo, in event args or in the file name, and '
            || 'run {} holds {} traces: their GPUs cannot be told apart; ', t.run, r.n_traces)
            else 'no rank in distributedInfo, in event args or in the file name; '
        end || 're-ingest with --rank N or name the file rank<N>.json.gz' as detail
    from traces as t
    inner join traces_per_run as r using (run)
    left join unknown as u using (trace_id)
    where t.rank_source = 'unknown'
)

select * from final
