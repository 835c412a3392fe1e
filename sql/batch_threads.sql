-- batch_threads: the rows of the trace_threads table (process and thread names) of one parsed batch (_rows) of
-- trace $trace_id; $fill_rank as in sql/batch_gpu_events.sql. Columns by name, as the table's.
select
    $trace_id as trace_id,
    coalesce(e.rank, $fill_rank) as rank,
    e.pid,
    e.tid,
    e.name as key,
    e.meta_value as value
from _rows as e
where e.meta
