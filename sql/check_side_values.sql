-- check_side_values: one row per collector side file holding values traceq left out (unused, not
-- guessed), as ingest notes them (side_value_notes.sql, over every trace): a run.json field of a numeric
-- run key that is not such a number, power log records without a GPU or a wall-clock time (not stored)
-- or whose power_w or energy_mj is not a number (stored as null).
-- inputs: side_value_notes
-- Parameters: $run_keys, $run_key_kinds (int | float): the catalogue's numeric run keys; $first, $last:
-- the trace ids to look at (check: all of them).
-- Columns: run, path (the side file), rank, check, severity, count (values left out), detail.
select
    t.run,
    n.path,
    n.rank,
    'side_values' as "check",
    'warning' as severity,
    n.count,
    n.note as detail
from side_value_notes as n
inner join traces as t using (trace_id)
