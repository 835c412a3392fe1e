-- inputs: comm_instances, shared_windows, run_metadata
-- collectives: the collective instances of the windows (sql/comm_instances.sql), summed per (run,
-- collective_type, process_group, group_size, inter_node, size_bucket_bytes, matched, kernel_name): the
-- finest grain that `traceq collectives` groups up from.
--   kernel_name        the name of the instance's kernel that arrived last (an unmatched one: its own)
--   an instance        counts in the window (of its rank and device, at a step every rank of the run has:
--                      sql/shared_windows.sql) that holds the start of the kernel that arrived last; an
--                      unmatched kernel is an instance of its own, in the window of its start
--   inter_node         the group's ranks (those seen in the run) sit on more than one host (run.json host of
--                      each rank), else on more than one node of gpus_per_node ranks; null when neither is known
--   size_bucket_bytes  2^floor(log2(size_bytes)): the bucket [b, 2b); null when the size is unknown
--   count, sized       instances, and those with a known size
--   size_bytes         sum of the sized instances' bytes; bus_bytes the same x the busbw factor
--   transfer_ns        sum over instances; sized_transfer_ns over the sized ones (the bandwidths' time)
--   wait_ns, rank_kernels  the waiting of every rank of the instances, and how many rank kernels they hold
with placed as (
    select c.*, w.step
    from (select * from comm_instances where arrived_last or not matched) as c
    asof inner join (select * from shared_windows where end_ns > start_ns) as w
        on w.trace_id = c.trace_id and w.rank = c.rank and w.device = c.device and c.start_ns >= w.start_ns
    where c.start_ns < w.end_ns
),

hosts as (
    select run, rank, max(json_extract_string(metadata, '$.host')) as host
    from run_files
    group by all
),

group_ranks as (
    select distinct c.run, c.group_id, c.rank, h.host, m.gpus_per_node
    from comm_instances as c
    left join hosts as h using (run, rank)
    left join run_metadata as m using (run)
),

nodes as (
    select
        run, group_id,
        case
            when count(host) = count(*) then count(distinct host) > 1
            when bool_and(gpus_per_node > 0 and rank >= 0) then count(distinct rank // gpus_per_node) > 1
        end as inter_node
    from group_ranks
    group by all
),

final as (
    select
        p.run,
        p.collective_type,
        p.process_group,
        p.group_size,
        n.inter_node,
        case when p.size_bytes > 0 then (2::bigint ** floor(log2(p.size_bytes)))::bigint end as size_bucket_bytes,
        p.matched,
        k.name as kernel_name,
        count(*) as count,
        count(p.size_bytes) as sized,
        sum(p.size_bytes)::bigint as size_bytes,
        sum(p.size_bytes * busbw_factor(p.collective_type, p.group_size)) as bus_bytes,
        sum(p.transfer_ns)::bigint as transfer_ns,
        sum(p.transfer_ns) filter (where p.size_bytes is not null)::bigint as sized_transfer_ns,
        sum(p.wait_caused_ns)::bigint as wait_ns,
        sum(case when p.matched then p.group_size else 1 end)::bigint as rank_kernels
    from placed as p
    left join nodes as n on n.run = p.run and n.group_id = p.group_id
    left join names as k on k.trace_id = p.trace_id and k.name_id = p.name_id
    group by all
)

select * from final
