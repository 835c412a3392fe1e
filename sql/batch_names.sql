-- batch_names: the rows of the names table for the names of one parsed batch (_rows) not seen yet in trace
-- $trace_id: the next ids, from $next_name_id on. Columns by name, as the table's.
select $trace_id as trace_id, $next_name_id + row_number() over (order by name) - 1 as name_id, name
from (
    select distinct e.name
    from _rows as e
    where e.span and e.valid
        and not exists (select 1 from names as n where n.trace_id = $trace_id and n.name = e.name)
)
