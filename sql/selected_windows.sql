-- inputs: device_windows, selected_steps
-- selected_windows: the device windows of the steps a report uses (sql/selected_steps.sql), one row per
-- (trace_id, rank, device, step). A step that launched nothing on a device has no window there (its
-- window would be empty: it starts where the next step's does), so its interval metrics are null, not 0,
-- and do not pull means down (a profiler's tail step, say).
select w.trace_id, w.rank, w.device, w.step, w.start_ns, w.end_ns
from device_windows as w
semi join selected_steps as s on s.trace_id = w.trace_id and s.rank = w.rank and s.step = w.step
where w.n_launched is distinct from 0
