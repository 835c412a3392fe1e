-- cpu_activity / cpu_activity_whole: the CPU-side activity of traces with no GPU events (training
-- on CPU with the gloo backend), shaped like gpu_classified for sql/interval_breakdown.sql (device -1).
--   comm:    gloo:* spans: the collective itself, run by a pt_gloo_runloop thread
--   compute: cpu_op spans on every other thread, except c10d::* ops, which only enqueue a collective
-- cpu_activity has one row per span and step it overlaps, clipped to the step's CPU span;
-- cpu_activity_whole has every span once, unclipped (step null), for --window trace.
-- On CPU, "exposed" communication is gloo time during which no op runs on the other threads. A main
-- thread that waits for a collective outside any op is idle; one that blocks inside an op looks busy.
create or replace temp view cpu_activity_whole as
with spans as (
    select
        h.trace_id,
        h.rank,
        h.tid,
        h.start_ns,
        h.start_ns + h.dur_ns as end_ns,
        h.dur_ns,
        case when n.name like 'gloo:%' then 'comm' else 'compute' end as class,
        n.name
    from host_events as h
    inner join names as n on n.trace_id = h.trace_id and n.name_id = h.name_id
    inner join traces as t on t.trace_id = h.trace_id and t.n_gpu_events = 0
    where n.name like 'gloo:%'
        or (h.cat in ('cpu_op', 'Operator') and n.name not like 'c10d::%' and n.name not like 'ProfilerStep#%')
),

comm_threads as (
    select distinct trace_id, rank, tid from spans where class = 'comm'
),

final as (
    select s.trace_id, s.rank, -1::bigint as device, null::bigint as step, s.start_ns, s.end_ns, s.dur_ns, s.class
    from spans as s
    anti join comm_threads as c
        on s.class = 'compute' and c.trace_id = s.trace_id and c.rank = s.rank and c.tid = s.tid
)

select * from final;

create or replace temp view cpu_activity as
with clipped as (
    select
        a.trace_id,
        a.rank,
        a.device,
        st.step,
        greatest(a.start_ns, st.start_ns) as start_ns,
        least(a.end_ns, st.end_ns) as end_ns,
        a.class
    from cpu_activity_whole as a
    inner join steps as st
        on st.trace_id = a.trace_id and st.rank = a.rank and a.start_ns < st.end_ns and st.start_ns < a.end_ns
)

select trace_id, rank, device, step, start_ns, end_ns, end_ns - start_ns as dur_ns, class from clipped;
