-- check_dropped_events: one row per trace with events that ingest could not use (traces.n_dropped).
-- Columns: run, path, rank (the file's rank; null for a file of several ranks), check, severity, count (events dropped), detail.
-- Dropped: array elements that are not objects, events without "ph", and complete ("X") events whose
-- ts/dur is missing, not a number, a negative duration or beyond +-2**62 ns.
with final as (
    select
        run,
        path,
        file_rank as rank,
        'dropped_events' as "check",
        'warning' as severity,
        n_dropped as count,
        format(
            '{} of {} events dropped by ingest (not an object, no "ph", or ts/dur missing, not a number, '
            || 'negative or out of range); metrics leave them out: check how the trace was written or edited',
            n_dropped, n_events
        ) as detail
    from traces
    where n_dropped > 0
)

select * from final
