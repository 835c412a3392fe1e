-- wall_offsets: one row per trace: offset_ns, the wall-clock ns of the trace's time 0 (wall ns = trace ns
-- + offset_ns), and where it comes from (offset_source): the clock mapping ingest stored for the trace's
-- steps (step_wall_times: baseTimeNanoseconds or the collector's run.json), else baseTimeNanoseconds,
-- else none (the trace's own clock, offset 0).
with step_offsets as (
    select trace_id, max(offset_ns) as offset_ns, max(offset_source) as offset_source
    from step_wall_times
    group by all
),

final as (
    select
        t.trace_id,
        coalesce(w.offset_ns, t.base_time_ns, 0) as offset_ns,
        coalesce(w.offset_source, case when t.base_time_ns is not null then 'baseTimeNanoseconds' end, 'none')
            as offset_source
    from traces as t
    left join step_offsets as w using (trace_id)
)

select * from final
