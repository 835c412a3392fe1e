-- gpu_classified: one row per GPU event (kernel, memcpy, memset) with its class, category and the
-- collective its rule names: all that interval metrics read (sql/interval_breakdown.sql; a report of
-- them skips the launch lookup below, 0.05 -> 0.01 s on the 500 MB trace).
-- gpu_activity: the same rows with each comm kernel's collective and process group.
-- Both are temporary views created on every connection, so changed rules apply to data already ingested.
-- class: comm | compute | memcpy | memset. A kernel is comm when it carries a "Collective name"
-- argument or its name matches a comm rule; collective type comes from the kernel's own argument,
-- else from the CPU record_param_comms op that launched it, else from the rule.
create or replace temp view gpu_classified as
with kernel_names as (
    select distinct n.name
    from names as n
    semi join gpu_events as g on g.trace_id = n.trace_id and g.name_id = n.name_id and g.kind = 1
),

ranked_rules as (
    select
        k.name,
        r.class,
        r.category,
        r.collective,
        row_number() over (partition by k.name order by r.priority, r.source = 'builtin') as pick
    from kernel_names as k
    inner join kernel_rules as r on regexp_matches(k.name, r.pattern)
),

kernel_classes as (
    select name, class, category, collective as rule_collective
    from ranked_rules
    where pick = 1
),

final as (
    select
        g.*,
        n.name,
        g.start_ns + g.dur_ns as end_ns,
        case
            when g.kind = 2 then 'memcpy'
            when g.kind = 3 then 'memset'
            when g.collective is not null or kc.class = 'comm' then 'comm'
            else 'compute'
        end as class,
        case
            when g.kind = 2 then 'memcpy'
            when g.kind = 3 then 'memset'
            else coalesce(kc.category, case when g.collective is not null then 'collective' else 'other' end)
        end as category,
        kc.rule_collective
    from gpu_events as g
    inner join names as n on n.trace_id = g.trace_id and n.name_id = g.name_id
    left join kernel_classes as kc on kc.name = n.name
)

select * from final;

create or replace temp view gpu_activity as
-- comm kernels without collective args: the record_param_comms op around their launch
with comm_launches as (
    select e.trace_id, e.rank, e.correlation, min(h.start_ns) as launch_ns, any_value(h.tid) as tid
    from gpu_classified as e
    inner join host_events as h
        on h.trace_id = e.trace_id and h.rank = e.rank and h.correlation = e.correlation
        and h.cat in ('cuda_runtime', 'Runtime', 'cuda_driver')
    where e.class = 'comm' and e.collective is null
    group by all
),

param_ops as (
    select h.trace_id, h.rank, h.tid, h.start_ns, h.start_ns + h.dur_ns as end_ns, h.collective, h.pg_name,
           h.pg_desc, h.pg_ranks, h.group_size, h.in_nelems, h.out_nelems, h.dtype
    from host_events as h
    where h.collective is not null
),

launch_params as (
    select l.trace_id, l.rank, l.correlation, p.collective, p.pg_name, p.pg_desc, p.pg_ranks,
           p.group_size, p.in_nelems, p.out_nelems, p.dtype
    from comm_launches as l
    asof inner join param_ops as p
        on p.trace_id = l.trace_id and p.rank = l.rank and p.tid = l.tid and l.launch_ns >= p.start_ns
    where l.launch_ns <= p.end_ns
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
            coalesce(collective_type(coalesce(e.collective, lp.collective)), e.rule_collective, 'Other')
        end as collective_type,
        coalesce(e.pg_name, lp.pg_name) as pg_name,
        coalesce(e.pg_desc, lp.pg_desc) as pg_desc,
        coalesce(e.pg_ranks, lp.pg_ranks) as pg_ranks,
        coalesce(e.group_size, lp.group_size) as group_size,
        coalesce(e.in_nelems, lp.in_nelems) as in_nelems,
        coalesce(e.out_nelems, lp.out_nelems) as out_nelems,
        coalesce(e.dtype, lp.dtype) as dtype
    from gpu_classified as e
    left join launch_params as lp
        on e.class = 'comm' and e.collective is null
        and lp.trace_id = e.trace_id and lp.rank = e.rank and lp.correlation = e.correlation
)

select * from final
