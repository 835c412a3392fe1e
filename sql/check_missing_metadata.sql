-- check_missing_metadata: one row per trace without distributedInfo (world size, backend) and one
-- per run without run metadata (model, tokens per step, GPU: set by the collectors).
-- Columns: run, path (null for the run row), rank (null), check, severity, count (1), detail.
with traces_without as (
    select
        run,
        path,
        null::bigint as rank,
        'missing_metadata' as "check",
        'info' as severity,
        1::bigint as count,
        'no distributedInfo world_size/backend: the run''s size is unknown (normal for single-GPU traces)' as detail
    from traces
    where world_size is null
),

runs_without as (
    select
        run,
        null::varchar as path,
        null::bigint as rank,
        'missing_metadata' as "check",
        'info' as severity,
        1::bigint as count,
        'no run metadata (model, tokens per step, GPU model): tokens_per_s and MFU cannot be computed; '
        || 'record the run with traceq.collectors' as detail
    from runs
    where metadata is null and run in (select run from traces)
),

final as (
    select * from traces_without
    union all
    select * from runs_without
)

select * from final
