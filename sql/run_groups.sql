-- inputs: run_metadata
-- run_groups: the run metadata a report's rows carry for grouping (traceq.catalog.META_COLUMNS, README:
-- Aggregation), one row per run, from sql/run_metadata.sql: run, world_size, nodes, gpus_per_node, tp, pp,
-- cp, dp, model, seq_len, gpu_model, tokens_per_step
with final as (
    select run, world_size, nodes, gpus_per_node, tp, pp, cp, dp, model, seq_len, gpu_model, tokens_per_step
    from run_metadata
)

select * from final
