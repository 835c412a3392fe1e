-- batch_gpu_events: the rows of the gpu_events table (kernels, memcpys, memsets) of the parsed batches $parts (_rows:
-- the rows of sql/read_events.sql, which may hold other batches too), each batch written as its trace, with the
-- trace's fill_rank for events that name no rank (the file's rank from distributedInfo; null: filled later), as the
-- lists of traceq.ingest.native.write_parts say (batch_parts: sql/macros.sql). $first_trace..$last_trace: the traces
-- written. Columns by name, as the table's (sql/schema.sql).
select
    p.trace_id,
    coalesce(e.rank, p.fill_rank) as rank,
    coalesce(e.device, e.pid) as device,
    coalesce(e.stream, e.tid) as stream,
    e.kind,
    n.name_id,
    e.start_ns,
    e.dur_ns,
    e.correlation,
    e.external_id,
    e.collective,
    e.pg_name,
    e.pg_desc,
    e.pg_ranks,
    e.group_size,
    e.in_nelems,
    e.out_nelems,
    e.dtype,
    e.seq
from _rows as e
inner join batch_parts($parts, $trace_ids, $next_name_ids, $fill_ranks, $keep_plain_ops) as p on p.part = e.part
inner join names as n on n.trace_id between $first_trace and $last_trace and n.trace_id = p.trace_id and n.name = e.name
where e.kind > 0 and e.span and e.valid
