-- marker_spans: the steps of the traces $first_trace..$last_trace as their step markers name them, one row per
-- (trace_id, side, rank, device, step): side cpu, the CPU spans (device null); side device, the device-side
-- copies the profiler writes (gpu_user_annotation, $device_annotation_cats), per device. A span is an event whose
-- name matches the step marker ($step_marker, a regular expression; $step_marker_prefix: literal text every match
-- starts with, a cheap first test). When the marker's first group captures an integer on every span of a
-- (trace_id, side, rank, device), that integer numbers the step and the spans of one number are one step
-- (ProfilerStep#N); otherwise they are steps 1, 2, ... in time order.
-- Columns: trace_id, side, rank, device, step, start_ns, end_ns (trace clock, ns).
with matched as (
    select
        h.trace_id,
        case when list_contains($device_annotation_cats, h.cat) then 'device' else 'cpu' end as side,
        h.rank,
        case when list_contains($device_annotation_cats, h.cat) then h.device end as device,
        try_cast(regexp_extract(n.name, $step_marker, 1) as bigint) as number,
        h.start_ns,
        h.start_ns + h.dur_ns as end_ns
    from host_events as h
    inner join names as n on n.trace_id = h.trace_id and n.name_id = h.name_id
    where h.trace_id between $first_trace and $last_trace
        and starts_with(n.name, $step_marker_prefix)
        and regexp_matches(n.name, $step_marker)
),

numbered as (
    select
        trace_id,
        side,
        rank,
        device,
        case
            when count(*) filter (where number is null) over (partition by trace_id, side, rank, device) = 0 then number
            else row_number() over (partition by trace_id, side, rank, device order by start_ns, end_ns)
        end as step,
        start_ns,
        end_ns
    from matched
),

final as (
    select trace_id, side, rank, device, step, min(start_ns) as start_ns, max(end_ns) as end_ns
    from numbered
    group by all
)

select * from final
