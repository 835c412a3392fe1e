-- batch_counts: what each parsed batch holds (_rows: the rows of sql/read_events.sql, held in memory, of one or
-- more batches, each row with its batch's `part`), one row per batch (traceq.ingest.native.BatchCounts). odd: the
-- batch goes to traceq.ingest.decode instead.
select
    part,
    count(*) as events,
    count(*) filter (where kind > 0 and span and valid) as gpu,
    count(*) filter (where kind = 0 and span and valid) as host,
    -- of those, CPU operators kept only because $all_ops: left out when written after the switch
    count(*) filter (where kind = 0 and span and valid and plain_op) as host_plain_ops,
    count(*) filter (where (span and not valid) or no_phase) as dropped,
    -- of those, CPU operators kept only because $all_ops: not counted on a trace with GPU activity
    count(*) filter (where span and not valid and plain_op) as dropped_plain_ops,
    count(*) filter (where plain_op and not span) as skipped_ops,
    count(*) filter (where ((span and valid) or meta) and rank is null) as rows_without_rank,
    count(*) filter (where span and valid and rank is not null) as rows_with_rank,
    coalesce(list(distinct unsure_file) filter (where unsure_file is not null), []) as unsure_files,
    coalesce(bool_or(odd), false) as odd
from _rows
group by part
