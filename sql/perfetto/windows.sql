-- traceq_windows: every window the interval metrics are measured over, one row per (scope, rank,
-- device, step), shaped for Perfetto's interval macros (id, ts, dur, rank, device):
--   scope 'step': the device windows (traceq_device_windows) of the steps that launched activity
--   there (sql/selected_windows.sql keeps the same ones: an empty window has no metrics);
--   scope 'trace': the whole timeline of the device, step -1 (sql/trace_windows.sql).
include perfetto module traceq.device_windows;
include perfetto module traceq.activity;

create perfetto table traceq_windows as
with windows as (
    select 'step' as scope, rank, device, step, start_ns as ts, end_ns - start_ns as dur
    from traceq_device_windows
    where n_launched > 0
    union all
    select 'trace', rank, device, -1, min(ts), max(ts + dur) - min(ts)
    from traceq_activity
    group by rank, device
)

select row_number() over (order by scope, rank, device, step) as id, * from windows
