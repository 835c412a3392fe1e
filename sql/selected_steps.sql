-- selected_steps: the steps a report uses, one row per (trace_id, rank, step).
-- Steps are numbered by their order within the trace and rank (ordinal 1, 2, ...).
-- $skip_steps: leading steps to skip (warm-up); null = the run's warmup_steps metadata, else 0.
-- $step_min/$step_max: step numbers to keep (inclusive; null = no bound).
-- The last step of a rank of a trace with device activity is left out unless $include_last: its device
-- window is open (no next step's first activity closes it, so it ends with the GPU's drain: README, device
-- windows); a CPU-only trace's windows are its steps' CPU spans, closed. A rank whose only step is the last
-- keeps it (reports say so), unless $drop_last, which drops the last step always (what HTA does).
-- $drop_incomplete: with $include_last, still drop a last step that the end of the trace cut.
-- A rank without steps (its one window is the whole trace, step -1) is kept unless a step range is given.
with ordered as (
    select
        s.trace_id,
        s.rank,
        s.step,
        s.source,
        s.launches_without_gpu_work,
        row_number() over (partition by s.trace_id, s.rank order by s.step) as ordinal,
        count(*) over (partition by s.trace_id, s.rank) as n_steps,
        coalesce($skip_steps, try_cast(json_extract_string(r.metadata, '$.warmup_steps') as bigint), 0) as skip,
        t.n_gpu_events > 0 as open_last
    from steps as s
    inner join traces as t on t.trace_id = s.trace_id
    inner join runs as r on r.run = t.run
),

final as (
    select trace_id, rank, step, ordinal, source
    from ordered
    where case
        when source = 'whole_trace' then $step_min is null and $step_max is null
        else ordinal > skip
            and ($step_min is null or step >= $step_min)
            and ($step_max is null or step <= $step_max)
            and not (ordinal = n_steps and $drop_last)
            and not (ordinal = n_steps and n_steps > 1 and open_last and not $include_last)
            and not (ordinal = n_steps and $drop_incomplete and launches_without_gpu_work > 0)
    end
)

select * from final
