-- batch_gpu_events: the rows of the gpu_events table (kernels, memcpys, memsets) of one parsed batch (_rows) of
-- trace $trace_id; $fill_rank: the file's rank from distributedInfo, for events that name none (null: filled
-- later). Columns by name, as the table's (sql/schema.sql).
select
    $trace_id as trace_id,
    coalesce(e.rank, $fill_rank) as rank,
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
inner join names as n on n.trace_id = $trace_id and n.name = e.name
where e.kind > 0 and e.span and e.valid
