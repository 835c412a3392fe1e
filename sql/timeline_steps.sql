-- inputs: selected_steps
-- timeline_steps: one row per selected step (sql/selected_steps.sql) with its CPU span, for the step
-- track of `traceq export --perfetto`: trace_id, rank, step, start_ns, end_ns (the trace's clock, ns),
-- source (marker | whole_trace: a rank without step markers, one span over its whole trace).
select s.trace_id, s.rank, s.step, s.start_ns, s.end_ns, s.source
from steps as s
semi join selected_steps as x on x.trace_id = s.trace_id and x.rank = s.rank and x.step = s.step
