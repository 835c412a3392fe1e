-- inputs: gpu_classified, cpu_activity
-- device_activity: one row per interval that interval metrics count: the device events of traces with
-- device activity (sync class left out: a stream waiting is not work), and the CPU spans of traces
-- without (sql/cpu_activity.sql, device -1).
-- Columns: trace_id, rank, device, step (the step that launched it; null when none did), start_ns,
-- end_ns, dur_ns (ns), class (comm | compute | memcpy | memset), wait_ns (0 here: a communication
-- kernel's wait for its last peer comes from matching, sql/split_activity.sql).
with final as (
    select trace_id, rank, coalesce(device, -1) as device, step, start_ns, end_ns, dur_ns, class, 0::bigint as wait_ns
    from gpu_classified
    where class <> 'sync'
    union all
    select trace_id, rank, device, step, start_ns, end_ns, dur_ns, class, 0::bigint
    from cpu_activity
)

select * from final
