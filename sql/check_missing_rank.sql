-- check_missing_rank: one row per trace whose rank is unknown (traces.rank_source = 'unknown'): ingest
-- gave it a negative rank of its own in its run (-1, -2, ...), so it never merges with another trace.
-- Columns: run, path, rank (the one given), check, severity (info), count (events stored under it), detail.
with unknown as (
    select trace_id, count(*) as n_events
    from (
        select trace_id from gpu_events where rank < 0
        union all
        select trace_id from host_events where rank < 0
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
        t.file_rank as rank,
        'missing_rank' as "check",
        'info' as severity,
        coalesce(u.n_events, 0) as count,
        format('no rank in distributedInfo, in event args or in the file name: stored as rank {} of run {} '
            || '({} trace(s)), a rank of its own; re-ingest with --rank N or name the file rank<N>.json.gz to set it',
            t.file_rank, t.run, r.n_traces) as detail
    from traces as t
    inner join traces_per_run as r using (run)
    left join unknown as u using (trace_id)
    where t.rank_source = 'unknown'
)

select * from final
