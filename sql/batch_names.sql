-- batch_names: the rows of the names table for the names of the parsed batches $parts (_rows; one batch per trace,
-- traceq.ingest.native.write_parts) not seen yet in their trace: the next ids, from the trace's next_name_id on.
-- $first_trace..$last_trace: the traces written. Columns by name, as the table's.
select trace_id, next_name_id + row_number() over (partition by trace_id order by name) - 1 as name_id, name
from (
    select distinct p.trace_id, p.next_name_id, e.name
    from _rows as e
    inner join batch_parts($parts, $trace_ids, $next_name_ids, $fill_ranks, $keep_plain_ops) as p on p.part = e.part
    where e.span and e.valid
        and not exists (
            select 1 from names as n
            where n.trace_id between $first_trace and $last_trace and n.trace_id = p.trace_id and n.name = e.name
        )
)
