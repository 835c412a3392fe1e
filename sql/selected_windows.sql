-- inputs: device_windows, selected_steps
-- selected_windows: the device windows of the steps a report uses (sql/selected_steps.sql), one row per
-- (trace_id, rank, device, step).
select w.trace_id, w.rank, w.device, w.step, w.start_ns, w.end_ns
from device_windows as w
semi join selected_steps as s on s.trace_id = w.trace_id and s.rank = w.rank and s.step = w.step
