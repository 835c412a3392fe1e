-- step_claims: the (run, rank, step) that more than one trace holds where one of those traces is new (trace_id from
-- $first to $last: the traces an ingest stored, or an import brought in), one row per trace holding it, ordered; for
-- traceq.identity to decide and word the refusal (ingest and import-parquet refuse a step counted twice).
with mine as (
    select
        t.run,
        s.rank,
        s.step
    from steps as s
    inner join traces as t using (trace_id)
    where s.trace_id between $first and $last
)

select
    s.trace_id,
    t.path,
    t.run,
    s.rank,
    s.step,
    s.trace_id between $first and $last as new
from steps as s
inner join traces as t using (trace_id)
semi join mine as m on m.run = t.run and m.rank = s.rank and m.step = s.step
window same as (partition by t.run, s.rank, s.step)
qualify min(s.trace_id) over same <> max(s.trace_id) over same
order by s.trace_id, s.rank, s.step
