-- batch_host_events: the rows of the host_events table of the parsed batches $parts (_rows), written as in
-- sql/batch_gpu_events.sql (device-side annotations without args.device take the trace viewer's pid, as on ROCm:
-- $device_annotation_cats). A batch's keep_plain_ops false leaves out the CPU operators it was parsed with (all_ops)
-- once its trace showed device activity (traceq.ingest.writer.Writer). Columns by name, as the table's.
select
    p.trace_id,
    coalesce(e.rank, p.fill_rank) as rank,
    e.cat,
    n.name_id,
    e.pid,
    e.tid,
    e.start_ns,
    e.dur_ns,
    e.correlation,
    e.external_id,
    case when e.device is null and list_contains($device_annotation_cats, e.cat) then e.pid else e.device end as device,
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
where e.kind = 0 and e.span and e.valid and (p.keep_plain_ops or not e.plain_op)
