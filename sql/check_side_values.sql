-- check_side_values: one row per collector side file holding values traceq left out (unused, not
-- guessed): a run.json field of a numeric run key (world_size, tokens_per_step, ...) that is not such a
-- number, and power log records without a GPU or a wall-clock time (not stored) or whose power_w or
-- energy_mj is not a number (stored as null).
-- Parameters: $run_keys, $run_key_kinds (int | float): the catalogue's numeric run keys.
-- Columns: run, path (the side file), rank, check, severity, count (values left out), detail.
with numeric_keys as (
    select unnest($run_keys) as key, unnest($run_key_kinds) as kind
),

run_values as (
    select
        t.run,
        f.path,
        f.rank,
        k.key,
        k.kind,
        json_extract(f.metadata, '$."' || k.key || '"') as value
    from run_files as f
    inner join traces as t using (trace_id)
    cross join numeric_keys as k
),

bad_run_values as (
    select
        run,
        path,
        rank,
        key,
        value
    from run_values
    where value is not null
        and json_type(value) <> 'NULL'
        and (
            json_type(value) not in ('BIGINT', 'UBIGINT', 'DOUBLE')
            or (kind = 'int' and json_type(value) = 'DOUBLE')
        )
),

run_findings as (
    select
        run,
        path,
        rank,
        'side_values' as "check",
        'warning' as severity,
        count(*)::bigint as count,
        'run.json fields left out, not numbers of their kind (integers but for peak_tflops and the FLOPs): '
        || string_agg(key || ' = ' || left(value::varchar, 40), ', ' order by key)
        || '; fix the file and ingest it again with --force, or set them: traceq runs set' as detail
    from bad_run_values
    group by run, path, rank
),

stored as (
    select
        trace_id,
        count(*) as n,
        count(*) filter (where kind = 'power' and power_w is null) as no_power,
        count(*) filter (where kind = 'energy' and energy_mj is null) as no_energy
    from power_samples
    group by trace_id
),

power_findings as (
    select
        t.run,
        p.path,
        p.rank,
        'side_values' as "check",
        'warning' as severity,
        (p.n_samples + p.n_energy - coalesce(s.n, 0) + coalesce(s.no_power, 0) + coalesce(s.no_energy, 0))::bigint as count,
        'power log records left out: '
        || concat_ws(', ',
            case when p.n_samples + p.n_energy > coalesce(s.n, 0)
                then (p.n_samples + p.n_energy - coalesce(s.n, 0)) || ' without a gpu or wall_ns (not stored)' end,
            case when coalesce(s.no_power, 0) > 0 then s.no_power || ' whose power_w is not a number' end,
            case when coalesce(s.no_energy, 0) > 0 then s.no_energy || ' whose energy_mj is not an integer' end)
        || '; power figures leave them out' as detail
    from power_logs as p
    inner join traces as t using (trace_id)
    left join stored as s using (trace_id)
    where p.n_samples + p.n_energy > coalesce(s.n, 0) or coalesce(s.no_power, 0) > 0 or coalesce(s.no_energy, 0) > 0
),

final as (
    select * from run_findings
    union all
    select * from power_findings
)

select * from final
