-- inputs: kernel_classes, optimizer_launches
-- gpu_classified: one row per device event (kernel, memcpy, memset) with its class, category and the
-- collective its rule names: all that interval metrics read (sql/device_activity.sql; they skip the
-- launch lookup of sql/gpu_activity.sql, 0.05 -> 0.01 s on the 500 MB trace). Classified when read,
-- so changed rules apply to data already ingested; each kernel name is matched against the rules once
-- per connection (traceq/classify.py: rule_collective is the collective the winning rule names).
-- class: comm | compute | memcpy | memset | sync. A kernel is comm when it carries a "Collective name"
-- argument or its name matches a comm rule, unless a rule makes it memcpy (MTIA dma) or sync (a stream
-- waiting on another's event: not work, left out of every interval); otherwise the winning rule's
-- class, else compute.
-- category: context before name: a compute kernel launched inside an optimizer step
-- (sql/optimizer_launches.sql: its launch, same rank and correlation, inside `Optimizer.step#...` on the
-- launching thread; kept per connection beside the kernel classes) is 'optimizer' whatever its name; any
-- other kernel, and one without a launch (graph replay, GPU-only traces), takes its rule's category.
with classified as (
    select
        g.*,
        n.name,
        g.start_ns + g.dur_ns as end_ns,
        case
            when g.kind = 2 then 'memcpy'
            when g.kind = 3 then 'memset'
            when kc.class in ('sync', 'memcpy') then kc.class
            when g.collective is not null or kc.class = 'comm' then 'comm'
            else 'compute'
        end as class,
        case
            when g.kind = 2 then 'memcpy'
            when g.kind = 3 then 'memset'
            else coalesce(kc.category, case when g.collective is not null then 'collective' else 'other' end)
        end as category,
        kc.rule_collective,
        o.correlation is not null as in_optimizer_step
    from gpu_events as g
    inner join names as n on n.trace_id = g.trace_id and n.name_id = g.name_id
    left join kernel_classes as kc on kc.name = n.name
    left join optimizer_launches as o
        on g.kind = 1 and o.trace_id = g.trace_id and o.rank = g.rank and o.correlation = g.correlation
),

final as (
    select * exclude (in_optimizer_step)
        replace (case when class = 'compute' and in_optimizer_step then 'optimizer' else category end as category)
    from classified
)

select * from final
