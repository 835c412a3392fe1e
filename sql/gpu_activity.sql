-- inputs: gpu_classified
-- gpu_activity: the rows of gpu_classified with each comm kernel's collective type, process group, message
-- (element counts, dtype) and sequence number:
-- from the kernel's own "Collective name" argument, else from the CPU record_param_comms op around its
-- launch (runtime calls: $runtime_cats), else from the innermost `nccl:<op>` / `c10d::<op>` annotation
-- around the launch (NCCL runs all-to-all, and more, as SendRecv kernels: README, Across ranks), else from the
-- rule that made it comm.
-- comm kernels without collective args: the record_param_comms op around their launch
with comm_launches as (
    select e.trace_id, e.rank, e.correlation, min(h.start_ns) as launch_ns, any_value(h.tid) as tid
    from gpu_classified as e
    inner join host_events as h
        on h.trace_id = e.trace_id and h.rank = e.rank and h.correlation = e.correlation
        and list_contains($runtime_cats, h.cat)
    where e.class = 'comm' and e.collective is null
    group by all
),

param_ops as (
    select h.trace_id, h.rank, h.tid, h.start_ns, h.start_ns + h.dur_ns as end_ns, h.collective, h.pg_name,
           h.pg_desc, h.pg_ranks, h.group_size, h.in_nelems, h.out_nelems, h.dtype, h.seq
    from host_events as h
    where h.collective is not null
),

launch_params as (
    select l.trace_id, l.rank, l.correlation, p.collective, p.pg_name, p.pg_desc, p.pg_ranks,
           p.group_size, p.in_nelems, p.out_nelems, p.dtype, p.seq
    from comm_launches as l
    asof inner join param_ops as p
        on p.trace_id = l.trace_id and p.rank = l.rank and p.tid = l.tid and l.launch_ns >= p.start_ns
    where l.launch_ns <= p.end_ns
),

annotations as (
    select h.trace_id, h.rank, h.tid, h.start_ns, h.start_ns + h.dur_ns as end_ns,
           collective_type(ltrim(n.name[strpos(n.name, ':') + 1:], ':')) as collective
    from host_events as h
    inner join names as n on n.trace_id = h.trace_id and n.name_id = h.name_id
    where starts_with(n.name, 'nccl:') or starts_with(n.name, 'c10d::')
),

launch_annotations as (
    select l.trace_id, l.rank, l.correlation, a.collective
    from comm_launches as l
    asof inner join annotations as a
        on a.trace_id = l.trace_id and a.rank = l.rank and a.tid = l.tid and l.launch_ns >= a.start_ns
    where l.launch_ns <= a.end_ns
),

final as (
    select
        e.trace_id,
        e.rank,
        e.device,
        e.stream,
        e.kind,
        e.name_id,
        e.name,
        e.start_ns,
        e.dur_ns,
        e.end_ns,
        e.correlation,
        e.external_id,
        e.step,
        e.step_source,
        e.class,
        e.category,
        case when e.class = 'comm' then
            coalesce(collective_type(coalesce(e.collective, lp.collective)), nullif(la.collective, 'Other'),
                     e.rule_collective, 'Other')
        end as collective_type,
        coalesce(e.pg_name, lp.pg_name) as pg_name,
        coalesce(e.pg_desc, lp.pg_desc) as pg_desc,
        coalesce(e.pg_ranks, lp.pg_ranks) as pg_ranks,
        coalesce(e.group_size, lp.group_size) as group_size,
        coalesce(e.in_nelems, lp.in_nelems) as in_nelems,
        coalesce(e.out_nelems, lp.out_nelems) as out_nelems,
        coalesce(e.dtype, lp.dtype) as dtype,
        coalesce(e.seq, lp.seq) as seq
    from gpu_classified as e
    left join launch_params as lp
        on e.class = 'comm' and e.collective is null
        and lp.trace_id = e.trace_id and lp.rank = e.rank and lp.correlation = e.correlation
    left join launch_annotations as la
        on e.class = 'comm' and e.collective is null
        and la.trace_id = e.trace_id and la.rank = e.rank and la.correlation = e.correlation
)

select * from final
