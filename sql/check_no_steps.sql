-- check_no_steps: one row per (trace, rank) whose trace has no step marker: it is reported over its whole
-- trace as one window (step -1).
-- Columns: run, path, rank, check, severity (info), count (1), detail.
select
    t.run,
    t.path,
    s.rank,
    'no_steps' as "check",
    'info' as severity,
    1::bigint as count,
    format('no step matches the step marker {}: reported over the whole trace as one window (step -1); '
        || 'if its steps have another name, ingest it again with --step-marker REGEX',
        coalesce(t.step_marker, '^ProfilerStep#(\d+)$')) as detail
from steps as s
inner join traces as t using (trace_id)
where s.source = 'whole_trace'
