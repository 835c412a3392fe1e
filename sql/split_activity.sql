-- inputs: gpu_classified, cpu_activity, comm_instances
-- split_activity: sql/device_activity.sql with each communication kernel's wait for its last peer
-- (wait_ns, from sql/comm_instances.sql: the first part of the kernel; 0 where unmatched), for the
-- reports that split communication into waiting and transfer (bound in place of device_activity).
-- The communication kernels of runs that were not matched are left out.
select trace_id, rank, coalesce(device, -1) as device, step, start_ns, end_ns, dur_ns, class, 0::bigint as wait_ns
from gpu_classified
where class not in ('sync', 'comm')
union all
select trace_id, rank, device, step, start_ns, end_ns, dur_ns, class, 0::bigint
from cpu_activity
where class <> 'comm'
union all
select trace_id, rank, device, step, start_ns, end_ns, dur_ns, 'comm', wait_ns
from comm_instances
