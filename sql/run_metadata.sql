-- run_metadata: one row per run, its metadata (runs.metadata: the collector's run.json merged with
-- `traceq runs set` values) as typed columns.
--   world_size          ranks: metadata, else distributedInfo world_size, else ranks seen in steps (a run of one
--                       file that names no rank is one rank)
--   nodes, gpus_per_node, tp, pp, cp, dp, model, seq_len (tokens)
--   gpu_model           GPU model: metadata gpu_model, else the device name in the traces'
--                       deviceProperties (the most common over the run's traces)
--   device_type         cuda | cpu (run.json device_type; `device` in files of traceq 0.1)
--   tokens_per_step     global tokens per optimizer step (all ranks together)
--   model_flops_per_token  model FLOPs per token: set by the user, else 6·N + 12·L·H·Q·T
--                       (PaLM appendix B; N non-embedding params, L layers, H heads, Q head dim, T seq_len)
--   flops_per_step      global model FLOPs per step: flops_per_step if set, else model_flops_per_token × tokens_per_step
--   flops_source        flops_per_step | model_flops_per_token | 6N+12LHQT | null (unknown)
--   peak_tflops         peak dense BF16 TFLOP/s of one GPU: set by the user, else the peak table's row for
--                       gpu_model ($gpu_peaks: sql/gpu_peaks.csv, first match), else what the collector wrote;
--                       peak_tflops_source: user | table | collector | null; peak_gpu: the table's name for it
--   warmup_steps        recorded steps that reports skip by default
with traced as (
    select
        t.run,
        max(t.world_size) as trace_world_size,
        mode(t.gpu_model) as trace_gpu,
        (select count(distinct s.rank) from steps as s
         inner join traces as t2 using (trace_id) where t2.run = t.run) as ranks_seen
    from traces as t
    group by t.run
),

raw as (
    select
        r.run,
        try_cast(json_extract_string(r.metadata, '$.world_size') as bigint) as meta_world_size,
        try_cast(json_extract_string(r.metadata, '$.nodes') as bigint) as nodes,
        try_cast(json_extract_string(r.metadata, '$.gpus_per_node') as bigint) as gpus_per_node,
        try_cast(json_extract_string(r.metadata, '$.tp') as bigint) as tp,
        try_cast(json_extract_string(r.metadata, '$.pp') as bigint) as pp,
        try_cast(json_extract_string(r.metadata, '$.cp') as bigint) as cp,
        try_cast(json_extract_string(r.metadata, '$.dp') as bigint) as dp,
        json_extract_string(r.metadata, '$.model') as model,
        try_cast(json_extract_string(r.metadata, '$.seq_len') as bigint) as seq_len,
        json_extract_string(r.metadata, '$.gpu_model') as meta_gpu,
        coalesce(json_extract_string(r.metadata, '$.device_type'), json_extract_string(r.metadata, '$.device')) as device_type,
        try_cast(json_extract_string(r.metadata, '$.tokens_per_step') as bigint) as tokens_per_step,
        try_cast(json_extract_string(r.metadata, '$.n_params_non_embedding') as double) as n_params_non_embedding,
        try_cast(json_extract_string(r.metadata, '$.n_layers') as double) as n_layers,
        try_cast(json_extract_string(r.metadata, '$.n_heads') as double) as n_heads,
        try_cast(json_extract_string(r.metadata, '$.head_dim') as double) as head_dim,
        try_cast(json_extract_string(r.metadata, '$.model_flops_per_token') as double) as user_flops_per_token,
        try_cast(json_extract_string(r.metadata, '$.flops_per_step') as double) as user_flops_per_step,
        try_cast(json_extract_string(r.metadata, '$.peak_tflops') as double) as meta_peak_tflops,
        json_extract_string(r.metadata, '$.peak_tflops_source') as meta_peak_source,
        try_cast(json_extract_string(r.metadata, '$.warmup_steps') as bigint) as warmup_steps
    from runs as r
),

flops as (
    select
        *,
        coalesce(
            user_flops_per_token,
            6 * n_params_non_embedding + 12 * n_layers * n_heads * head_dim * seq_len
        ) as model_flops_per_token
    from raw
),

peaks as (
    select unnest($gpu_peaks, recursive := true)
),

with_gpu as (
    select
        f.*,
        coalesce(f.meta_gpu, tr.trace_gpu) as gpu_model,
        -- a peak without a source was set by hand (before sources were recorded)
        f.meta_peak_tflops is not null and coalesce(f.meta_peak_source, 'user') = 'user' as peak_by_hand
    from flops as f
    left join traced as tr using (run)
),

table_peaks as (
    select g.run, arg_min(p.peak_tflops, p.position) as peak_tflops, arg_min(p.gpu, p.position) as peak_gpu
    from with_gpu as g
    inner join peaks as p on regexp_matches(g.gpu_model, '(?i)' || p.pattern)
    group by g.run
),

final as (
    select
        f.run,
        coalesce(f.meta_world_size, tr.trace_world_size, nullif(tr.ranks_seen, 0)) as world_size,
        f.nodes,
        f.gpus_per_node,
        f.tp,
        f.pp,
        f.cp,
        f.dp,
        f.model,
        f.seq_len,
        f.gpu_model,
        f.device_type,
        f.tokens_per_step,
        f.model_flops_per_token,
        coalesce(f.user_flops_per_step, f.model_flops_per_token * f.tokens_per_step) as flops_per_step,
        case
            when f.user_flops_per_step is not null then 'flops_per_step'
            when f.user_flops_per_token is not null and f.tokens_per_step is not null then 'model_flops_per_token'
            when f.model_flops_per_token is not null and f.tokens_per_step is not null then '6N+12LHQT'
        end as flops_source,
        case when f.peak_by_hand then f.meta_peak_tflops else coalesce(p.peak_tflops, f.meta_peak_tflops) end as peak_tflops,
        case
            when f.peak_by_hand then 'user'
            when p.peak_tflops is not null then 'table'
            when f.meta_peak_tflops is not null then 'collector'
        end as peak_tflops_source,
        case when not f.peak_by_hand then p.peak_gpu end as peak_gpu,
        f.warmup_steps
    from with_gpu as f
    left join traced as tr using (run)
    left join table_peaks as p using (run)
)

select * from final
