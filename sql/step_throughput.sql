-- inputs: selected_steps, step_power, run_metadata
-- step_throughput: one row per selected (trace_id, rank, step) with throughput, FLOPs and energy metrics.
-- The clock is the step's CPU span (step_time_ns; a rank without steps: its whole trace).
--   run, world_size, tokens_per_step (global), flops_per_step (global), flops_source, peak_tflops, peak_tflops_source,
--   peak_gpu (the peak table's name for the run's GPU)
--   step_time_ns          ns
--   tokens_per_s          tokens/s of one GPU: tokens_per_step / world_size / step time (the study's WPS per device)
--   global_tokens_per_s   tokens/s of the whole run: tokens_per_step / step time
--   tflops                model TFLOP/s of one GPU: flops_per_step / world_size / step time / 1e12
--   mfu                   tflops / peak_tflops (ratio, 0..1)
--   power_source, power_gpu_count, power_w (W), energy_j (J), energy_source   from step_power
--   tokens_per_j          tokens of the GPUs in the power log / energy_j (null at 0 J)
--   power_tokens          those tokens (tokens_per_step × power_gpu_count / world_size), where energy_j is known:
--                         a run's tokens_per_j is Σ power_tokens / Σ energy_j (a step whose counter did not
--                         tick still counts its tokens)
with base as (
    select
        s.trace_id,
        s.rank,
        s.step,
        t.run,
        st.step_time_ns,
        nullif(st.step_time_ns, 0) / 1e9 as step_s,
        m.world_size,
        m.tokens_per_step,
        m.flops_per_step,
        m.flops_source,
        m.peak_tflops,
        m.peak_tflops_source,
        m.peak_gpu
    from selected_steps as s
    inner join steps as st on st.trace_id = s.trace_id and st.rank = s.rank and st.step = s.step
    inner join traces as t on t.trace_id = s.trace_id
    left join run_metadata as m on m.run = t.run
),

final as (
    select
        b.trace_id,
        b.rank,
        b.step,
        b.run,
        b.world_size,
        b.tokens_per_step,
        b.flops_per_step,
        b.flops_source,
        b.peak_tflops,
        b.peak_tflops_source,
        b.peak_gpu,
        b.step_time_ns,
        b.tokens_per_step / b.world_size / b.step_s as tokens_per_s,
        b.tokens_per_step / b.step_s as global_tokens_per_s,
        b.flops_per_step / b.world_size / b.step_s / 1e12 as tflops,
        b.flops_per_step / b.world_size / b.step_s / 1e12 / b.peak_tflops as mfu,
        p.power_source,
        p.power_gpu_count,
        p.power_w,
        p.energy_j,
        p.energy_source,
        b.tokens_per_step * p.power_gpu_count / b.world_size / nullif(p.energy_j, 0) as tokens_per_j,
        case when p.energy_j is not null then b.tokens_per_step * p.power_gpu_count / b.world_size end as power_tokens
    from base as b
    left join step_power as p on p.trace_id = b.trace_id and p.rank = b.rank and p.step = b.step
)

select * from final
