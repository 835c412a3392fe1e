-- cpu_activity: one row per CPU span of the traces with no device events (training on CPU with the
-- gloo backend), shaped like gpu_classified for sql/device_activity.sql (device -1, step null):
--   comm:    gloo:* spans: the collective itself, run by a pt_gloo_runloop thread (collective_type from
--            the name: gloo:all_reduce -> AllReduce)
--   compute: operator spans ($op_cats) on every other thread, except c10d::* ops, which only enqueue a
--            collective, and the step markers themselves ($step_marker)
-- Also: tid (the span's thread) and name_id (its name in names).
-- On CPU, "exposed" communication is gloo time during which no op runs on the other threads. A main
-- thread that waits for a collective outside any op is idle; one that blocks inside an op looks busy.
with cpu_traces as (
    select trace_id, coalesce(step_marker, $step_marker) as step_marker from traces where n_gpu_events = 0
),

-- the step markers (matched on the trace's few distinct names, not on every span)
marker_names as (
    select n.trace_id, n.name_id
    from names as n
    inner join cpu_traces as t using (trace_id)
    where regexp_matches(n.name, t.step_marker)
),

spans as (
    select
        h.trace_id,
        h.rank,
        h.tid,
        h.name_id,
        h.start_ns,
        h.start_ns + h.dur_ns as end_ns,
        h.dur_ns,
        case when n.name like 'gloo:%' then 'comm' else 'compute' end as class,
        case when n.name like 'gloo:%' then collective_type(n.name[6:]) end as collective_type
    from host_events as h
    inner join names as n on n.trace_id = h.trace_id and n.name_id = h.name_id
    semi join cpu_traces as t on t.trace_id = h.trace_id
    anti join marker_names as m on m.trace_id = h.trace_id and m.name_id = h.name_id
    where n.name like 'gloo:%' or (list_contains($op_cats, h.cat) and n.name not like 'c10d::%')
),

comm_threads as (
    select distinct trace_id, rank, tid from spans where class = 'comm'
),

final as (
    select s.trace_id, s.rank, -1::bigint as device, null::bigint as step, s.start_ns, s.end_ns, s.dur_ns, s.class,
           s.collective_type, s.tid, s.name_id
    from spans as s
    anti join comm_threads as c
        on s.class = 'compute' and c.trace_id = s.trace_id and c.rank = s.rank and c.tid = s.tid
)

select * from final
