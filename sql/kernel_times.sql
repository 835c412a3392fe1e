-- inputs: gpu_classified, selected_steps
-- kernel_times: device time by kernel name in the steps a report uses (sql/selected_steps.sql), one
-- row per (trace_id, rank, step, class, category, name). A kernel counts in the step that launched it
-- (gpu_events.step), on a rank without steps in its one whole-trace step (-1). Kernel durations are
-- summed, not merged: two kernels at once count twice (what a kernel table means). Stream waits
-- (class sync) are not work and are left out.
--   category            the winning kernel rule's category (gemm, attention, elementwise, norm, optimizer,
--                       nccl, rccl, ...), memcpy / memset, 'collective' for an unmatched kernel that
--                       carries collective arguments, 'other' for a kernel no rule matched
--   count, total_ns, min_ns, max_ns
select
    g.trace_id,
    g.rank,
    s.step,
    g.class,
    g.category,
    g.name,
    count(*) as count,
    sum(g.dur_ns)::bigint as total_ns,
    min(g.dur_ns) as min_ns,
    max(g.dur_ns) as max_ns
from gpu_classified as g
inner join selected_steps as s
    on s.trace_id = g.trace_id
    and s.rank = g.rank
    and (s.step = g.step or (s.source = 'whole_trace' and g.step is null))
where g.class <> 'sync'
group by all
