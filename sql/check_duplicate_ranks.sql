-- check_duplicate_ranks: one row per (run, rank) with steps that more than one trace holds (a rank
-- collision). Ingest refuses such a file since traceq 0.2; a warehouse written before may hold them.
-- Columns: run, path (null: several), rank, check, severity, count (traces), detail (their paths).
-- Usually the same trace stored twice with different bytes (e.g. .json and .json.gz), or traces of two
-- jobs in one run, or rankless traces that all got rank -1: every metric of that rank mixes them.
with claims as (
    select t.run, s.rank, s.step, t.path
    from steps as s
    inner join traces as t using (trace_id)
),

shared as (
    select run, rank, step
    from claims
    group by all
    having count(distinct path) > 1
),

duplicates as (
    select c.run, c.rank, count(distinct c.path) as n_traces, count(distinct c.step) as n_steps,
           string_agg(distinct c.path, ', ' order by c.path) as paths
    from claims as c
    semi join shared as s on s.run = c.run and s.rank = c.rank and s.step = c.step
    group by all
),

final as (
    select
        run,
        null::varchar as path,
        rank,
        'duplicate_rank' as "check",
        'warning' as severity,
        n_traces as count,
        format('{} traces of run {} hold the same step(s) of rank {} ({} step(s)): {}; delete one, or ingest '
            || 'them again into a new warehouse (each file then keeps a rank of its own, or use --name)',
            n_traces, run, rank, n_steps, paths) as detail
    from duplicates
)

select * from final
