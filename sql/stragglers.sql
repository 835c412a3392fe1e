-- inputs: comm_instances, shared_windows
-- stragglers: one row per window of `windows` (as in sql/interval_breakdown.sql) at a step every rank of
-- the run has (sql/shared_windows.sql) that holds the start of a matched collective kernel
-- (sql/comm_instances.sql) of its rank and device:
--   matched_count       matched kernels
--   arrived_last_count  those whose rank arrived last
--   wait_caused_ns      the waiting those made the other ranks of their instances do
--   wait_ns             the waiting of the window's own kernels (their first parts, summed)
select
    w.trace_id, w.rank, w.device, w.step,
    count(*) as matched_count,
    count(*) filter (where c.arrived_last) as arrived_last_count,
    sum(c.wait_caused_ns)::bigint as wait_caused_ns,
    sum(c.wait_ns)::bigint as wait_ns
from (select trace_id, rank, device, start_ns, arrived_last, wait_caused_ns, wait_ns from comm_instances where matched) as c
asof inner join (select * from shared_windows where end_ns > start_ns) as w
    on w.trace_id = c.trace_id and w.rank = c.rank and w.device = c.device and c.start_ns >= w.start_ns
where c.start_ns < w.end_ns
group by all
