-- check_duplicate_ranks: one row per (run, rank) that more than one trace claims.
-- Columns: run, path (null: several), rank, check, severity, count (traces), detail (their paths).
-- Usually the same trace stored twice with different bytes (e.g. .json and .json.gz) or unrelated
-- traces in one directory: every metric of that rank mixes both.
with claims as (
    select t.run, r.rank, t.path
    from traces as t
    inner join (
        select distinct trace_id, rank from gpu_events
        union
        select distinct trace_id, rank from host_events
    ) as r using (trace_id)
    where r.rank >= 0
),

duplicates as (
    select run, rank, count(distinct path) as n_traces, string_agg(distinct path, ', ' order by path) as paths
    from claims
    group by all
    having count(distinct path) > 1
),

final as (
    select
        run,
        null::varchar as path,
        rank,
        'duplicate_rank' as "check",
        'warning' as severity,
        n_traces as count,
        format('{} traces of run {} hold rank {}: {}; delete one or ingest them as separate runs (--run)',
            n_traces, run, rank, paths) as detail
    from duplicates
)

select * from final
