-- batch_threads: the rows of the trace_threads table (process and thread names) of the parsed batches $parts (_rows),
-- written as in sql/batch_gpu_events.sql. Columns by name, as the table's.
select
    p.trace_id,
    coalesce(e.rank, p.fill_rank) as rank,
    e.pid,
    e.tid,
    e.name as key,
    e.meta_value as value
from _rows as e
inner join batch_parts($parts, $trace_ids, $next_name_ids, $fill_ranks, $keep_plain_ops) as p on p.part = e.part
where e.meta
