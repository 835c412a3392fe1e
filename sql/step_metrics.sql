-- inputs: step_throughput, window_metrics, run_groups
-- step_metrics: the step rows of a report, one per (trace_id, rank, device, step) of the selected steps
-- (sql/selected_steps.sql; `windows` bound to sql/selected_windows.sql). A selected step that launched
-- nothing on any device has one row, its device and window figures null.
--   trace_id, rank, step, run
--   step_time_ns .. peak_gpu       throughput, FLOPs and power of the step (sql/step_throughput.sql: ns,
--                                  tokens/s, TFLOP/s, W, J, tokens/J, and where each comes from)
--   device .. wait_ns              the figures of its window on that device (sql/window_metrics.sql: ns,
--                                  counts, activity)
--   world_size .. tokens_per_step  the run's metadata for grouping (sql/run_groups.sql)
with final as (
    select
        t.trace_id,
        t.rank,
        t.step,
        t.run,
        t.step_time_ns,
        t.tokens_per_s,
        t.global_tokens_per_s,
        t.tflops,
        t.mfu,
        t.power_w,
        t.energy_j,
        t.tokens_per_j,
        t.power_tokens,
        t.power_source,
        t.power_gpu_count,
        t.energy_source,
        t.flops_per_step,
        t.flops_source,
        t.peak_tflops,
        t.peak_tflops_source,
        t.peak_gpu,
        w.* exclude (trace_id, rank, step),
        m.* exclude (run)
    from step_throughput as t
    left join window_metrics as w on w.trace_id = t.trace_id and w.rank = t.rank and w.step = t.step
    left join run_groups as m on m.run = t.run
)

select * from final
