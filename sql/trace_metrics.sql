-- inputs: window_metrics, run_groups
-- trace_metrics: the rows of a whole-trace report, one per (trace_id, rank, device) over its whole timeline
-- and every kernel (step -1; `windows` bound to sql/trace_windows.sql), shaped as sql/step_metrics.sql's:
--   trace_id, rank, device, step .. wait_ns   the window's figures (sql/window_metrics.sql: ns, counts, activity)
--   run
--   tokens_per_s .. peak_gpu, step_time_ns    null: measured over a step's CPU span, they have no whole-trace value
--   world_size .. tokens_per_step             the run's metadata for grouping (sql/run_groups.sql)
with final as (
    select
        w.*,
        t.run,
        null as tokens_per_s,
        null as global_tokens_per_s,
        null as tflops,
        null as mfu,
        null as power_w,
        null as energy_j,
        null as tokens_per_j,
        null as power_tokens,
        null as power_source,
        null as power_gpu_count,
        null as energy_source,
        null as flops_per_step,
        null as flops_source,
        null as peak_tflops,
        null as peak_tflops_source,
        null as peak_gpu,
        null as step_time_ns,
        m.* exclude (run)
    from window_metrics as w
    inner join traces as t on t.trace_id = w.trace_id
    left join run_groups as m on m.run = t.run
)

select * from final
