-- batch_counts: what each parsed batch holds (_rows: the rows of sql/read_events.sql, held in memory, of one or
-- more batches, each row with its batch's `part`), one row per batch (traceq.ingest.native.BatchCounts). odd: the
-- batch goes to traceq.ingest.decode instead. A file's elements are those between its two bounds (their ordinality,
-- `bound`; a row of the trace's that looks like a bound is an element too); an element without a row was dropped.
with files as (
    select part, max(bound) - min(bound) - 1 as elements, count(*) - 2 as lookalikes
    from _rows
    where bound is not null
    group by part, file_no
),

elements as (
    select part, sum(elements) as events, sum(lookalikes) as lookalikes from files group by part
),

rows_ as (
    select
        part,
        count(*) filter (where bound is null) as with_row,
        count(*) filter (where kind > 0 and span and valid) as gpu,
        count(*) filter (where kind = 0 and span and valid) as host,
        -- of those, CPU operators kept only because $all_ops: left out when written after the switch
        count(*) filter (where kind = 0 and span and valid and plain_op) as host_plain_ops,
        -- CPU operators without a valid time, parsed because $all_ops: not counted on a trace with GPU activity
        count(*) filter (where span and not valid) as dropped_plain_ops,
        count(*) filter (where plain_op and not span) as skipped_ops,
        count(*) filter (where ((span and valid) or meta) and rank is null) as rows_without_rank,
        count(*) filter (where span and valid and rank is not null) as rows_with_rank,
        coalesce(list(distinct unsure_file) filter (where unsure_file is not null), []) as unsure_files,
        coalesce(bool_or(odd), false) as odd
    from _rows
    group by part
)

select
    part,
    e.events,
    r.gpu,
    r.host,
    r.host_plain_ops,
    e.events - r.with_row - e.lookalikes + r.dropped_plain_ops as dropped,
    r.dropped_plain_ops,
    r.skipped_ops,
    r.rows_without_rank,
    r.rows_with_rank,
    r.unsure_files,
    r.odd
from rows_ as r
inner join elements as e using (part)
