-- Temporary macros, created on every connection (nothing is stored in the database file).

-- AllReduce | AllGather | ReduceScatter | Broadcast | Reduce | AllToAll | SendRecv | Send | Recv | Other
-- from a "Collective name" argument ("allreduce", "_allgather_base", "reduce_scatter_tensor_coalesced").
create or replace temp macro collective_type(s) as (
    case
        when s is null then null
        when regexp_matches(lower(replace(s, '_', '')), 'allreduce') then 'AllReduce'
        when regexp_matches(lower(replace(s, '_', '')), 'reducescatter') then 'ReduceScatter'
        when regexp_matches(lower(replace(s, '_', '')), 'allgather') then 'AllGather'
        when regexp_matches(lower(replace(s, '_', '')), 'alltoall') then 'AllToAll'
        when regexp_matches(lower(replace(s, '_', '')), 'broadcast|bcast') then 'Broadcast'
        when regexp_matches(lower(replace(s, '_', '')), 'sendrecv') then 'SendRecv'
        when regexp_matches(lower(replace(s, '_', '')), '^send|send$') then 'Send'
        when regexp_matches(lower(replace(s, '_', '')), '^recv|recv$') then 'Recv'
        when lower(replace(s, '_', '')) = 'reduce' then 'Reduce'
        else 'Other'
    end
);

-- An int64 from a JSON scalar read as text by DuckDB's JSON reader (traceq.ingest.decode.to_int):
-- 7, "7", 7.0, "0x1f", "stream 7" (older Kineto stream ids) -> the integer; true, "abc", an int beyond
-- int64 -> null. (A fraction would be rounded: sql/read_events.sql sends such ids to traceq.ingest.decode.)
-- The plain cast first: coalesce evaluates the "stream " branch only for the rows it left null (on
-- 2M events, 0.04 s less CPU than testing every value for the prefix first).
create or replace temp macro json_int(s) as
    coalesce(try_cast(s as bigint), case when starts_with(s, 'stream ') then try_cast(s[8:] as bigint) end);
-- A JSON value as JSON text -> the number it holds; null for a string ("12.5"), boolean, list, object:
-- as text these start with '"', 't', 'f', '[' or '{', which no cast from text to double accepts. (Cast
-- as text: the cast from JSON reads true as 1 and "12.5" as 12.5.)
create or replace temp macro json_number(j) as try_cast(j::varchar as double);

-- Bytes per element of a record_param_comms dtype ("Float", "BFloat16", "Float8_e4m3fn", ...); null if unknown.
create or replace temp macro dtype_bytes(d) as (
    case
        when d in ('Float', 'Int', 'UInt32', 'Float32', 'Int32') then 4
        when d in ('Half', 'BFloat16', 'Short', 'UInt16', 'Float16', 'Int16') then 2
        when d in ('Double', 'Long', 'UInt64', 'ComplexFloat', 'Float64', 'Int64') then 8
        when d = 'ComplexDouble' then 16
        when d in ('Char', 'Byte', 'Bool', 'Int8', 'UInt8') or starts_with(d, 'Float8') then 1
    end
);

-- nccl-tests' bus bandwidth factor of a collective type over n ranks (busbw = algbw x factor).
create or replace temp macro busbw_factor(collective_type, n) as (
    case
        when collective_type = 'AllReduce' then 2.0 * (n - 1) / n
        when collective_type in ('AllGather', 'ReduceScatter', 'AllToAll') then (n - 1)::double / n
        when collective_type in ('Broadcast', 'Reduce', 'SendRecv', 'Send', 'Recv') then 1.0
    end
);

-- How each batch written in one statement is written (traceq.ingest.native.write_parts): one row per batch `part`
-- (sql/read_events.sql), the lists aligned.
create or replace temp macro batch_parts(parts, trace_ids, next_name_ids, fill_ranks, keep_plain_ops) as table
    select
        unnest(parts) as part,
        unnest(trace_ids) as trace_id,
        unnest(next_name_ids) as next_name_id,
        unnest(fill_ranks) as fill_rank,
        unnest(keep_plain_ops) as keep_plain_ops;
