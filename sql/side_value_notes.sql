-- side_value_notes: what ingest says of the side files of traces $first..$last: one row per collector
-- side file holding values left out, as check_side_values finds them (the same rules), in the words of a
-- note: a run.json field of a numeric run key that is not such a number (not used), power log records
-- without a GPU or a wall-clock time (not stored) or whose power_w or energy_mj is not a number (null).
-- Parameters: $first, $last (trace ids); $run_keys, $run_key_kinds (int | float): the catalogue's
-- numeric run keys.
-- Columns: trace_id, path (the side file), rank, count (values left out), note. `traceq check`'s
-- side_values finding reads it (check_side_values.sql): one rule and one wording for both.
with numeric_keys as (
    select unnest($run_keys) as key, unnest($run_key_kinds) as kind
),

run_values as (
    select
        f.trace_id,
        f.path,
        f.rank,
        k.key,
        k.kind,
        json_extract(f.metadata, '$."' || k.key || '"') as value
    from run_files as f
    cross join numeric_keys as k
    where f.trace_id between $first and $last
),

run_notes as (
    select
        trace_id,
        path,
        rank,
        count(*)::bigint as count,
        path || ': '
        || string_agg(
            key || '=' || left(value::varchar, 40) || ' is not '
            || case when kind = 'int' then 'an integer' else 'a number' end,
            ', ' order by key
        )
        || ', left out (fix the file and ingest it again with --force, or set them: traceq runs set)' as note
    from run_values
    where value is not null
        and json_type(value) <> 'NULL'
        and (
            json_type(value) not in ('BIGINT', 'UBIGINT', 'DOUBLE')
            or (kind = 'int' and json_type(value) = 'DOUBLE')
        )
    group by trace_id, path, rank
),

stored as (
    select
        trace_id,
        count(*) as n,
        count(*) filter (where kind = 'power' and power_w is null) as no_power,
        count(*) filter (where kind = 'energy' and energy_mj is null) as no_energy
    from power_samples
    where trace_id between $first and $last
    group by trace_id
),

power_notes as (
    select
        p.trace_id,
        p.path,
        p.rank,
        (p.n_samples + p.n_energy - coalesce(s.n, 0) + coalesce(s.no_power, 0) + coalesce(s.no_energy, 0))::bigint as count,
        p.path || ': '
        || concat_ws(', ',
            case when p.n_samples + p.n_energy > coalesce(s.n, 0)
                then (p.n_samples + p.n_energy - coalesce(s.n, 0)) || ' records without a gpu or wall_ns (not stored)' end,
            case when coalesce(s.no_power, 0) > 0 then s.no_power || ' whose power_w is not a number' end,
            case when coalesce(s.no_energy, 0) > 0 then s.no_energy || ' whose energy_mj is not an integer' end)
        || ', left out of the power figures' as note
    from power_logs as p
    left join stored as s using (trace_id)
    where p.trace_id between $first and $last
        and (p.n_samples + p.n_energy > coalesce(s.n, 0) or coalesce(s.no_power, 0) > 0 or coalesce(s.no_energy, 0) > 0)
),

final as (
    select * from run_notes
    union all
    select * from power_notes
)

select trace_id, path, rank, count, note from final order by trace_id, path
