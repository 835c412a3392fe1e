-- inputs: device_activity
-- check_comm_without_compute: one row per (trace, rank, device) with communication kernels and no compute
-- kernel at all: every bit of its communication reports as exposed, which is rarely true (a trace that
-- kept only its NCCL kernels, or compute kernels that a rule classifies as comm).
-- Columns: run, path, rank, check, severity (warning), count (comm kernels), detail.
with per_device as (
    select
        trace_id, rank, device,
        count(*) filter (where class = 'comm') as n_comm,
        count(*) filter (where class = 'compute') as n_compute
    from device_activity
    where device >= 0
    group by all
)

select
    t.run,
    t.path,
    p.rank,
    'comm_without_compute' as "check",
    'warning' as severity,
    p.n_comm as count,
    format('device {}: {} communication kernels and no compute kernel, so exposed comm = comm; did the trace '
        || 'keep only its communication kernels? (`traceq rules` shows how kernels are classified)',
        p.device, p.n_comm) as detail
from per_device as p
inner join traces as t using (trace_id)
where p.n_comm > 0 and p.n_compute = 0
