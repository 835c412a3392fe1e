-- inputs: device_activity
-- trace_windows: one row per (trace_id, rank, device): the whole timeline as one window, from the first
-- activity start to the last activity end, step -1 (what `--whole-trace` reports).
select trace_id, rank, device, -1::bigint as step, min(start_ns) as start_ns, max(end_ns) as end_ns
from device_activity
group by all
