-- inputs: device_activity
-- device_windows: one row per (trace_id, rank, device, step), every step of the rank: the step's window
-- on that device (README: device windows, steps). Windows of one device tile its timeline and never overlap.
-- On a device: f = the first start of the activity launched by the step (sql/step_attribution.sql);
-- a step that launched nothing there takes the f of the next one that did (an empty window where the
-- next starts), or the device's end. start_ns = the running maximum of f over the steps in order (the
-- windows never go back; clamped: f had to move); end_ns = the next step's start_ns, the last step's:
-- the end of all activity launched by the steps (device_end_ns). Every interval metric of a step
-- measures all activity inside its window, whichever step launched it, clipped at the edges.
-- Traces without device activity (CPU, gloo): the steps' CPU spans, device -1, kept monotonic likewise.
-- Columns: start_ns, end_ns (trace clock, ns), clamped, n_launched (events the step launched there).
with launched as (
    select a.trace_id, a.rank, a.device, a.step, min(a.start_ns) as first_ns, max(a.end_ns) as last_end_ns,
           count(*) as n_launched
    from device_activity as a
    semi join steps as s on s.trace_id = a.trace_id and s.rank = a.rank and s.step = a.step
    group by all
),

devices as (
    select trace_id, rank, device, max(last_end_ns) as device_end_ns
    from launched
    group by all
),

grid as (
    select d.trace_id, d.rank, d.device, s.step, d.device_end_ns, l.first_ns, coalesce(l.n_launched, 0) as n_launched
    from devices as d
    inner join steps as s on s.trace_id = d.trace_id and s.rank = d.rank
    left join launched as l on l.trace_id = d.trace_id and l.rank = d.rank and l.device = d.device and l.step = s.step
),

wanted as (
    select
        *,
        coalesce(
            first_ns,
            min(first_ns) over (partition by trace_id, rank, device order by step rows between current row and unbounded following),
            device_end_ns
        ) as wanted_ns
    from grid
),

tiled as (
    select
        *,
        max(wanted_ns) over (partition by trace_id, rank, device order by step rows between unbounded preceding and current row) as start_ns
    from wanted
),

gpu_windows as (
    select
        trace_id,
        rank,
        device,
        step,
        start_ns,
        coalesce(lead(start_ns) over (partition by trace_id, rank, device order by step), device_end_ns) as end_ns,
        wanted_ns < start_ns as clamped,
        n_launched
    from tiled
),

cpu_steps as (
    select
        s.trace_id,
        s.rank,
        s.step,
        s.start_ns as wanted_ns,
        max(s.start_ns) over (partition by s.trace_id, s.rank order by s.step rows between unbounded preceding and current row) as start_ns,
        s.end_ns
    from steps as s
    semi join traces as t on t.trace_id = s.trace_id and t.n_gpu_events = 0
),

cpu_windows as (
    select
        trace_id,
        rank,
        -1::bigint as device,
        step,
        start_ns,
        greatest(start_ns, least(end_ns, coalesce(lead(start_ns) over (partition by trace_id, rank order by step), end_ns))) as end_ns,
        wanted_ns < start_ns as clamped,
        null::bigint as n_launched
    from cpu_steps
),

final as (
    select * from gpu_windows
    union all
    select * from cpu_windows
)

select * from final
