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
