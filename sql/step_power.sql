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
--   energy_j       J: the energy counter interpolated linearly to the step's start and to the next step's
--                  start (the last step: its end), the difference summed over the GPUs (energy_source
--                  'energy counter'); else power_w × window (energy_source 'power integral'); else null.
--                  The counter is read at step boundaries but ticks only about every 100 ms (H100/H200):
--                  a step between two ticks reads the same value at both ends. So the counter is the line
--                  through the reads where it shows a new value (the first read of each value: by then it
--                  had reached it), evaluated between the two such reads around each boundary; a boundary
--                  outside them has no counter value. Boundaries are shared by consecutive steps, so the
--                  sum over steps a..b is the interpolated counter's difference from a's start to b+1's.
--   window_s       s, length of the wall-clock window
-- NVML power is a ~1 s moving average on A100/H100 (power_logs.note): steps much shorter than 1 s
-- smear into each other; the energy counter is the better source for joules.
with all_windows as (
    select
        trace_id, rank, step, start_wall_ns, end_wall_ns,
        lead(start_wall_ns) over (partition by trace_id, rank order by step) as next_start_wall_ns
    from step_wall_times
),

windows as (
    select w.trace_id, w.rank, w.step, w.start_wall_ns, w.end_wall_ns,
           coalesce(w.next_start_wall_ns, w.end_wall_ns) as energy_end_wall_ns
    from all_windows as w
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

energy_reads as (
    select
        trace_id, rank, gpu, wall_ns, energy_mj,
        lag(energy_mj) over (partition by trace_id, rank, gpu order by wall_ns) as previous_mj
    from power_samples
    where kind = 'energy' and energy_mj is not null
),

-- the reads where the counter shows a new value, each with the next such read: the segments of the line
knots as (
    select
        trace_id, rank, gpu, wall_ns, energy_mj,
        lead(wall_ns) over (partition by trace_id, rank, gpu order by wall_ns) as next_ns,
        lead(energy_mj) over (partition by trace_id, rank, gpu order by wall_ns) as next_mj
    from energy_reads
    where previous_mj is distinct from energy_mj
),

boundaries as (
    select w.trace_id, w.rank, w.step, g.gpu, w.start_wall_ns as at_ns, false as is_end
    from windows as w
    inner join (select distinct trace_id, rank, gpu from knots) as g on g.trace_id = w.trace_id and g.rank = w.rank
    union all
    select w.trace_id, w.rank, w.step, g.gpu, w.energy_end_wall_ns, true
    from windows as w
    inner join (select distinct trace_id, rank, gpu from knots) as g on g.trace_id = w.trace_id and g.rank = w.rank
),

-- the counter at each boundary (mJ), on the segment that holds it; none before the first knot, after
-- the last, or on a segment where the counter went down (reset)
counter_at as (
    select
        b.trace_id, b.rank, b.step, b.gpu, b.is_end,
        case
            when b.at_ns = k.wall_ns then k.energy_mj::double
            else k.energy_mj + (k.next_mj - k.energy_mj) * ((b.at_ns - k.wall_ns) / (k.next_ns - k.wall_ns)::double)
        end as energy_mj
    from boundaries as b
    asof inner join knots as k
        on k.trace_id = b.trace_id and k.rank = b.rank and k.gpu = b.gpu and b.at_ns >= k.wall_ns
    where b.at_ns = k.wall_ns or (b.at_ns <= k.next_ns and k.next_mj >= k.energy_mj)
),

gpu_energy as (
    select e0.trace_id, e0.rank, e0.step, e0.gpu, (e1.energy_mj - e0.energy_mj) / 1000.0 as energy_j
    from counter_at as e0
    inner join counter_at as e1
        on e1.trace_id = e0.trace_id and e1.rank = e0.rank and e1.step = e0.step and e1.gpu = e0.gpu and e1.is_end
    where not e0.is_end and e1.energy_mj >= e0.energy_mj
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
