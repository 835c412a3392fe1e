-- inputs: outside_steps
-- check_outside_steps: one row per (trace, rank, device) with activity before the first step's device
-- window or after the last one (sql/outside_steps.sql): no step counts it.
-- Columns: run, path, rank, check, severity (info), count (events), detail.
select
    t.run,
    t.path,
    o.rank,
    'outside_steps' as "check",
    'info' as severity,
    o.n_before + o.n_after as count,
    format('{}: {} events ({} ms of activity) before the first step''s window and {} ({} ms) after the last one; '
        || 'no step counts them (--whole-trace does)',
        case when o.device < 0 then 'CPU' else 'device ' || o.device end,
        o.n_before, round(o.before_ns / 1e6, 3), o.n_after, round(o.after_ns / 1e6, 3)) as detail
from outside_steps as o
inner join traces as t using (trace_id)
where o.n_before + o.n_after > 0
