-- inputs: windows
-- shared_windows: the windows of `windows` at the steps that every rank of the run has a window at: the
-- cross-rank tables (sql/stragglers.sql, sql/collectives.sql) compare ranks over the same steps, so a step
-- that one rank kept and another dropped (its cut last step, say) is left out of them. With
-- $shared_steps false, every window (per-step report rows count each rank's own windows).
with held as (
    select w.trace_id, w.rank, w.device, w.step, w.start_ns, w.end_ns, t.run
    from windows as w
    inner join traces as t using (trace_id)
),

step_ranks as (
    select run, step, count(distinct rank) as n from held group by all
),

run_ranks as (
    select run, count(distinct rank) as n from held group by all
)

select h.trace_id, h.rank, h.device, h.step, h.start_ns, h.end_ns
from held as h
inner join step_ranks as s using (run, step)
inner join run_ranks as r using (run)
where s.n = r.n or not $shared_steps
