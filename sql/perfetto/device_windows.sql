-- traceq_device_windows: one row per (rank, device, step), every step of the rank: the step's window
-- on that device (README: device windows; they tile the device's timeline and never overlap). The twin of
-- sql/device_windows.sql (device events only: the Perfetto engine reads GPU traces).
-- On a device: f = the first start of the activity launched by the step; a step that launched nothing
-- there takes the f of the next one that did, or the device's end. start_ns = the running maximum of f
-- over the steps in order (clamped: f had to move); end_ns = the next step's start_ns, the last
-- step's: the end of all activity launched by the steps.
-- Columns: rank, device, step, start_ns, end_ns, clamped, n_launched.
include perfetto module traceq.step_attribution;

create perfetto table traceq_device_windows as
with activity as (
    select d.rank, coalesce(d.device, -1) as device, a.step, d.start_ns, d.end_ns
    from traceq_device_events as d
    inner join traceq_step_attribution as a using (id)
    where d.class <> 'sync'
),

launched as (
    select a.rank, a.device, a.step, min(a.start_ns) as first_ns, max(a.end_ns) as last_end_ns, count(*) as n_launched
    from activity as a
    where exists (select 1 from traceq_steps as s where s.rank = a.rank and s.step = a.step)
    group by a.rank, a.device, a.step
),

devices as (
    select rank, device, max(last_end_ns) as device_end_ns from launched group by rank, device
),

grid as (
    select d.rank, d.device, s.step, d.device_end_ns, l.first_ns, coalesce(l.n_launched, 0) as n_launched
    from devices as d
    inner join traceq_steps as s on s.rank = d.rank
    left join launched as l on l.rank = d.rank and l.device = d.device and l.step = s.step
),

wanted as (
    select
        *,
        coalesce(
            first_ns,
            min(first_ns) over (partition by rank, device order by step rows between current row and unbounded following),
            device_end_ns
        ) as wanted_ns
    from grid
),

tiled as (
    select
        *,
        max(wanted_ns) over (partition by rank, device order by step rows between unbounded preceding and current row) as start_ns
    from wanted
),

final as (
    select
        rank,
        device,
        step,
        start_ns,
        coalesce(lead(start_ns) over (partition by rank, device order by step), device_end_ns) as end_ns,
        wanted_ns < start_ns as clamped,
        n_launched
    from tiled
)

select * from final
