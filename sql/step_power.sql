-- inputs: selected_steps
-- step_power: one row per selected (trace_id, rank, step) with the NVML power and energy of the GPUs
-- in that rank's power log over the step's wall-clock window (step_wall_times: the step's CPU span).
--   power_source   nvml | unavailable (log says NVML was absent) | null (no power log)
--   power_gpu_count  GPUs in the log (1 unless the collector sampled every GPU of the node; the collectors'
--                  power_gpus setting, own or all, chose them)
--   power_w        W, summed over those GPUs: time-weighted mean of the sampled power, each sample held
--                  until the next one or the log's end record, for at most max(2 intervals, 1 s): NVML's
--                  reading is itself a ~1 s average, and a longer gap is not bridged by a guess;
--                  null unless samples cover the whole window for every GPU
--   energy_j       J: energy counter at the start of step N+1 minus at the start of step N, summed over
--                  the GPUs (energy_source 'energy counter'); else power_w × window (energy_source
--                  'power integral'); else null
--   window_s       s, length of the wall-clock window
-- NVML power is a ~1 s moving average on A100/H100 (power_logs.note): steps much shorter than 1 s
-- smear into each other; the energy counter is the better source for joules.
with windows as (
    select w.trace_id, w.rank, w.step, w.start_wall_ns, w.end_wall_ns
    from step_wall_times as w
    semi join selected_steps as s on s.trace_id = w.trace_id and s.rank = w.rank and s.step = w.step
),

logs as (
    select
        trace_id,
        rank,
        source,
        end_wall_ns,
        greatest(coalesce(interval_ms, 100.0), 1.0) as interval_ms,
        json_array_length(gpus) as n_gpus
    from power_logs
),

held as (
    select
        p.trace_id,
        p.rank,
        p.gpu,
        p.power_w,
        p.wall_ns as from_ns,
        least(
            coalesce(lead(p.wall_ns) over (partition by p.trace_id, p.rank, p.gpu order by p.wall_ns),
                     l.end_wall_ns),
            p.wall_ns + (greatest(2 * l.interval_ms, 1000.0) * 1e6)::bigint
        ) as to_ns
    from power_samples as p
    inner join logs as l on l.trace_id = p.trace_id and l.rank is not distinct from p.rank
    where p.kind = 'power' and p.power_w is not null
),

gpu_power as (
    select
        w.trace_id,
        w.rank,
        w.step,
        h.gpu,
        any_value(w.end_wall_ns - w.start_wall_ns) as window_ns,
        sum(least(h.to_ns, w.end_wall_ns) - greatest(h.from_ns, w.start_wall_ns)) as covered_ns,
        sum(h.power_w * (least(h.to_ns, w.end_wall_ns) - greatest(h.from_ns, w.start_wall_ns))) as power_ns_w
    from windows as w
    inner join held as h
        on h.trace_id = w.trace_id and h.rank = w.rank
        and h.from_ns < w.end_wall_ns and h.to_ns > w.start_wall_ns
    group by all
),

step_gpu_power as (
    select
        trace_id, rank, step,
        count(*) filter (where covered_ns >= window_ns) as gpus_covered,
        sum(power_ns_w / covered_ns) as power_sum_w
    from gpu_power
    group by all
),

energy_marks as (
    select trace_id, rank, gpu, step, arg_min(energy_mj, wall_ns) as energy_mj
    from power_samples
    where kind = 'energy' and energy_mj is not null
    group by all
),

gpu_energy as (
    select w.trace_id, w.rank, w.step, e0.gpu, (e1.energy_mj - e0.energy_mj) / 1000.0 as energy_j
    from windows as w
    inner join energy_marks as e0 on e0.trace_id = w.trace_id and e0.rank = w.rank and e0.step = w.step
    inner join energy_marks as e1
        on e1.trace_id = w.trace_id and e1.rank = w.rank and e1.gpu = e0.gpu and e1.step = w.step + 1
    where e1.energy_mj >= e0.energy_mj
),

step_energy as (
    select trace_id, rank, step, count(*) as gpus_with_energy, sum(energy_j) as counter_energy_j
    from gpu_energy
    group by all
),

per_step as (
    select
        w.trace_id,
        w.rank,
        w.step,
        l.source as power_source,
        l.n_gpus as power_gpu_count,
        (w.end_wall_ns - w.start_wall_ns) / 1e9 as window_s,
        coalesce(p.gpus_covered, 0) as gpus_covered,
        p.power_sum_w,
        coalesce(e.gpus_with_energy, 0) as gpus_with_energy,
        e.counter_energy_j
    from windows as w
    left join logs as l on l.trace_id = w.trace_id and l.rank is not distinct from w.rank
    left join step_gpu_power as p on p.trace_id = w.trace_id and p.rank = w.rank and p.step = w.step
    left join step_energy as e on e.trace_id = w.trace_id and e.rank = w.rank and e.step = w.step
),

final as (
    select
        trace_id,
        rank,
        step,
        power_source,
        power_gpu_count,
        window_s,
        case when power_source = 'nvml' and power_gpu_count > 0 and gpus_covered = power_gpu_count and window_s > 0
            then power_sum_w end as power_w,
        case
            when power_source = 'nvml' and power_gpu_count > 0 and gpus_with_energy = power_gpu_count then counter_energy_j
            when power_source = 'nvml' and power_gpu_count > 0 and gpus_covered = power_gpu_count and window_s > 0
                then power_sum_w * window_s
        end as energy_j,
        case
            when power_source = 'nvml' and power_gpu_count > 0 and gpus_with_energy = power_gpu_count then 'energy counter'
            when power_source = 'nvml' and power_gpu_count > 0 and gpus_covered = power_gpu_count and window_s > 0
                then 'power integral'
        end as energy_source
    from per_step
)

select * from final
