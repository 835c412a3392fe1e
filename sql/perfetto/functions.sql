-- traceq_collective_type: AllReduce | AllGather | ReduceScatter | Broadcast | Reduce | AllToAll |
-- SendRecv | Send | Recv | Other from a "Collective name" argument ("allreduce", "_allgather_base",
-- "reduce_scatter_tensor_coalesced"); null for null. The twin of the collective_type macro of
-- sql/macros.sql.
create perfetto function traceq_collective_type(s STRING) returns STRING as
select case
    when $s is null then null
    when lower(replace($s, '_', '')) regexp 'allreduce' then 'AllReduce'
    when lower(replace($s, '_', '')) regexp 'reducescatter' then 'ReduceScatter'
    when lower(replace($s, '_', '')) regexp 'allgather' then 'AllGather'
    when lower(replace($s, '_', '')) regexp 'alltoall' then 'AllToAll'
    when lower(replace($s, '_', '')) regexp 'broadcast|bcast' then 'Broadcast'
    when lower(replace($s, '_', '')) regexp 'sendrecv' then 'SendRecv'
    when lower(replace($s, '_', '')) regexp '^send|send$' then 'Send'
    when lower(replace($s, '_', '')) regexp '^recv|recv$' then 'Recv'
    when lower(replace($s, '_', '')) = 'reduce' then 'Reduce'
    else 'Other'
end
