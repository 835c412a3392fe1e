-- inputs: device_windows
-- check_clamped_windows: one row per (trace, rank, device) where a step's first device activity started
-- before the previous step's window began, so its window start was moved up to keep windows in order
-- (README, device windows: windows tile the timeline); its activity before that point counts in the earlier step.
-- Columns: run, path, rank, check, severity (info), count (clamped windows), detail (which steps).
select
    t.run,
    t.path,
    w.rank,
    'clamped_windows' as "check",
    'info' as severity,
    count(*) as count,
    format('{}: the device window of step {} started before the previous one and was moved up to it; '
        || 'its first activity counts in the earlier step',
        case when w.device < 0 then 'CPU' else 'device ' || w.device end,
        string_agg(w.step::varchar, ', ' order by w.step)) as detail
from device_windows as w
inner join traces as t using (trace_id)
where w.clamped
group by t.run, t.path, w.rank, w.device
