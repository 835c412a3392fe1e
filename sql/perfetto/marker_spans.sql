-- traceq_marker_spans: the steps as the step marker names them (traceq_params.step_marker, a regular
-- expression), one row per (side, rank, device, step): side cpu, the CPU spans (device null); side
-- device, the device-side copies (role device_annotation), per device. When the marker's first group
-- captures an integer on every span of a (side, rank, device), that integer numbers the step and the
-- spans of one number are one step (ProfilerStep#N); otherwise they are steps 1, 2, ... in time
-- order. The twin of sql/marker_spans.sql.
-- Columns: side, rank, device, step, start_ns, end_ns.
include perfetto module traceq.events;

-- The pattern is matched on the distinct names, not on every slice. Tables that a join reads are
-- tables of their own here (_traceq_*), not common table expressions: SQLite may run a CTE again for
-- every row of the other side (1.0 s against 0.01 on a 35 MB trace).
-- marker_ci: the marker started with (?i) (matched on the lower-cased name); marker_has_group: it has a
-- group, the step number (the only capturing one: later groups were made non-capturing)
create perfetto table _traceq_marker_names as
select n.name, iif(p.marker_has_group, regexp_extract(iif(p.marker_ci, lower(n.name), n.name), p.step_marker), null) as captured
from (select distinct name from traceq_events where coalesce(role, '') not in ('kernel', 'memcpy', 'memset')) as n
cross join traceq_params as p
where iif(p.marker_ci, lower(n.name) regexp p.step_marker, n.name regexp p.step_marker);

create perfetto table traceq_marker_spans as
with matched as (
    select
        iif(e.role = 'device_annotation', 'device', 'cpu') as side,
        e.rank,
        iif(e.role = 'device_annotation', coalesce(extract_arg(e.arg_set_id, 'args.device'), pr.pid), null) as device,
        m.captured,
        e.start_ns,
        e.end_ns
    from traceq_events as e
    inner join _traceq_marker_names as m using (name)
    left join thread as th using (utid)
    left join process as pr using (upid)
    where coalesce(e.role, '') not in ('kernel', 'memcpy', 'memset')
        and e.dur_ns > 0  -- a thread-scoped instant event comes as a zero-length slice: no step
),

-- an integer, or null (SQLite's cast would read 'abc' as 0)
with_numbers as (
    select
        *,
        iif(ltrim(captured, '-') <> '' and ltrim(captured, '-') not glob '*[^0-9]*', cast(captured as int), null) as number
    from matched
),

numbered as (
    select
        side,
        rank,
        device,
        iif(
            sum(number is null) over (partition by side, rank, device) = 0,
            number,
            row_number() over (partition by side, rank, device order by start_ns, end_ns)
        ) as step,
        start_ns,
        end_ns
    from with_numbers
),

final as (
    select side, rank, device, step, min(start_ns) as start_ns, max(end_ns) as end_ns
    from numbered
    group by side, rank, device, step
)

select * from final
