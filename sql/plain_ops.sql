-- plain_ops: the rowids of the CPU operators of trace $trace_id (a trace with device activity) that were read
-- before ingest switched to leaving them out, one row each: the rows traceq.ingest.decode._is_plain_op and the
-- plain_op column of sql/read_events.sql leave out (cat in $op_cats, no collective args, not a step marker).
select h.rowid as rid
from host_events as h
where h.trace_id = $trace_id
    and list_contains($op_cats, h.cat)
    and h.collective is null
    and h.name_id not in (
        select name_id from names
        where trace_id = $trace_id and starts_with(name, $step_marker_prefix) and regexp_matches(name, $step_marker)
    )
