-- inputs: clock_skew
-- check_clock_skew: one row per (run, rank) whose clock differs from the run's reference rank (its
-- lowest known rank) by more than $threshold_ns (the estimate: sql/clock_skew.sql).
-- Columns: run, path (the rank's trace), rank, check, severity, count (matched collectives), detail
-- (skew in us: + means this rank's clock is ahead of the reference).
select
    run,
    path,
    rank,
    'clock_skew' as "check",
    'warning' as severity,
    n_matched as count,
    format(
        'the clock of rank {} is {} us {} rank {} (median end-time difference over {} matched collectives); '
        || 'cross-rank timelines are shifted by that much: sync clocks (NTP/PTP) on the nodes',
        rank, round(abs(skew_ns) / 1000, 3), case when skew_ns > 0 then 'ahead of' else 'behind' end,
        ref_rank, n_matched
    ) as detail
from clock_skew
where abs(skew_ns) > $threshold_ns
