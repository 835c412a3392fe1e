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

-- ProfilerStep#12 -> 12
create or replace temp macro profiler_step(name) as try_cast(regexp_extract(name, '^ProfilerStep#(\d+)$', 1) as bigint);

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
