-- traceq_device_events: one row per device event (kernel, memcpy, memset) with its class, category and
-- collective type: the twin of sql/gpu_classified.sql and sql/gpu_activity.sql.
-- class: comm | compute | memcpy | memset | sync. A kernel is comm when it carries a "Collective name"
-- argument or its name matches a comm rule, unless a rule makes it memcpy or sync; otherwise the
-- winning rule's class (lowest priority; user rules before built-in ones; then the rules' order),
-- else compute. The rules are traceq_kernel_rules (sql/kernel_rules.csv, passed in; a pattern that
-- starts with (?i) is matched on the lower-cased name, ci = 1).
-- collective_type (comm only): from the kernel's "Collective name", else from the record_param_comms
-- op around its launch, else from the nccl:<op> / c10d::<op> annotation around it, else from the rule, else Other.
-- device, stream: args.device / args.stream, else the JSON pid / tid.
-- category: a compute kernel launched inside an optimizer step is 'optimizer' whatever its name (as
-- sql/optimizer_launches.sql: _traceq_optimizer_launches below), else its rule's.
include perfetto module traceq.events;
include perfetto module traceq.functions;

-- the first launch (runtime event) of each (rank, correlation); SQLite takes the bare column id from
-- the row of the min
create perfetto table _traceq_launches as
select rank, extract_arg(arg_set_id, 'args.correlation') as correlation, id as launch_id, min(start_ns) as launch_ns
from traceq_events
where role = 'runtime' and extract_arg(arg_set_id, 'args.correlation') is not null
group by 1, 2;

-- the (rank, correlation) of every launch inside an optimizer step (Optimizer.step#<Class>.step,
-- Optimizer.step, optimizer.step) on the same thread, start <= launch < end. Only spans of a category
-- without a role (user_annotation): what the warehouse keeps of a trace with device activity (CPU
-- operators and the device-side copies of annotations are not CPU annotations there). The launches are a
-- table sorted by start, which the trace processor range-searches for each of the few spans (0.12 s on the
-- 500 MB benchmark trace; a join SQLite planned itself took 0.7 s, the spans' descendant slices missed the
-- ROCm launches that Perfetto does not nest under the span).
create perfetto table _traceq_runtime_launches as
select start_ns, utid, rank, extract_arg(arg_set_id, 'args.correlation') as correlation
from traceq_events
where role = 'runtime' and extract_arg(arg_set_id, 'args.correlation') is not null
order by start_ns;

create perfetto table _traceq_optimizer_launches as
with spans as materialized (
    select rank, utid, start_ns, end_ns
    from traceq_events
    where role is null
        and (name glob 'Optimizer.step#*' or name glob 'optimizer.step#*' or name in ('Optimizer.step', 'optimizer.step'))
)

select distinct l.rank, l.correlation
from spans as s
cross join _traceq_runtime_launches as l
where l.start_ns >= s.start_ns and l.start_ns < s.end_ns and l.utid = s.utid and l.rank is s.rank;

create perfetto table _traceq_classified as
with device_slices as (
    select
        e.id,
        e.rank,
        coalesce(extract_arg(e.arg_set_id, 'args.device'), pr.pid) as device,
        coalesce(extract_arg(e.arg_set_id, 'args.stream'), th.tid) as stream,
        e.role,
        e.name,
        e.start_ns,
        e.dur_ns,
        e.end_ns,
        extract_arg(e.arg_set_id, 'args.correlation') as correlation,
        extract_arg(e.arg_set_id, 'args.Collective name') as collective
    from traceq_events as e
    left join thread as th using (utid)
    left join process as pr using (upid)
    where e.role in ('kernel', 'memcpy', 'memset')
),

kernel_names as (
    select distinct name from device_slices where role = 'kernel'
),

ranked_rules as (
    select
        k.name,
        r.class,
        r.category,
        r.collective,
        row_number() over (partition by k.name order by r.priority, r.builtin, r.position) as pick
    from kernel_names as k
    inner join traceq_kernel_rules as r
        on iif(r.ci, lower(k.name) regexp r.pattern, k.name regexp r.pattern)
),

-- materialized: a table SQLite indexes for the join, computed once (the rules are matched on the
-- distinct names)
kernel_classes as materialized (
    select name, class, category, collective as rule_collective from ranked_rules where pick = 1
),

classified as (
    select
        d.*,
        case
            when d.role = 'memcpy' then 'memcpy'
            when d.role = 'memset' then 'memset'
            when kc.class in ('sync', 'memcpy') then kc.class
            when d.collective is not null or kc.class = 'comm' then 'comm'
            else 'compute'
        end as class,
        case
            when d.role in ('memcpy', 'memset') then d.role
            else coalesce(kc.category, iif(d.collective is not null, 'collective', 'other'))
        end as name_category,
        kc.rule_collective,
        o.correlation is not null as in_optimizer_step
    from device_slices as d
    left join kernel_classes as kc using (name)
    left join _traceq_optimizer_launches as o
        on d.role = 'kernel' and o.rank is d.rank and o.correlation = d.correlation
),

final as (
    select
        id, rank, device, stream, role, name, start_ns, dur_ns, end_ns, correlation, collective, class,
        iif(class = 'compute' and in_optimizer_step, 'optimizer', name_category) as category,
        rule_collective
    from classified
)

select * from final;

-- comm kernels without collective args: the innermost record_param_comms op around their launch, else the
-- innermost nccl:<op> / c10d::<op> annotation (as sql/gpu_activity.sql). The
-- launch is carried to the kernels of its (rank, correlation) by a window, and the small tables are
-- MATERIALIZED so that SQLite indexes them for the joins (a join of two Perfetto tables on these
-- columns ran as a nested loop: 21 s on the 500 MB benchmark trace).
create perfetto table traceq_device_events as
with keyed as (
    select rank, correlation, null as id, launch_id from _traceq_launches
    union all
    select rank, correlation, id, null from _traceq_classified where class = 'comm' and collective is null
),

comm_launches as (
    select id, max(launch_id) over (partition by rank, correlation) as launch_id from keyed
),

launch_params as materialized (
    select l.id, (
        select extract_arg(a.arg_set_id, 'args.Collective name')
        from ancestor_slice(l.launch_id) as a
        where a.name = 'record_param_comms' and extract_arg(a.arg_set_id, 'args.Collective name') is not null
        order by a.depth desc
        limit 1
    ) as collective, (
        select traceq_collective_type(ltrim(substr(a.name, instr(a.name, ':') + 1), ':'))
        from ancestor_slice(l.launch_id) as a
        where a.name glob 'nccl:*' or a.name glob 'c10d::*'
        order by a.depth desc
        limit 1
    ) as annotation
    from comm_launches as l
    where l.id is not null and l.launch_id is not null
),

final as (
    select
        c.id,
        c.rank,
        c.device,
        c.stream,
        c.role,
        c.name,
        c.start_ns,
        c.dur_ns,
        c.end_ns,
        c.correlation,
        c.class,
        c.category,
        iif(
            c.class = 'comm',
            coalesce(traceq_collective_type(coalesce(c.collective, lp.collective)), nullif(lp.annotation, 'Other'),
                     c.rule_collective, 'Other'),
            null
        ) as collective_type
    from _traceq_classified as c
    left join launch_params as lp using (id)
)

select * from final
