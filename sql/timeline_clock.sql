-- inputs: wall_offsets, clock_skew
-- timeline_clock: one row per (trace_id, rank) that has steps: where `traceq export --perfetto` puts its
-- times on the one clock of its run (README: See it on the timeline).
-- Columns: trace_id, run, rank, offset_ns and offset_source (trace ns + offset_ns = the rank's wall-clock
-- ns, sql/wall_offsets.sql), ref_rank (the run's reference rank, its lowest known rank with a collective
-- matched to another rank's; null: none), skew_ns (sql/clock_skew.sql rounded to the ns: + means this
-- rank's clock is ahead of the reference's; null: no estimate, or the reference itself), n_matched
-- (collectives behind the estimate), run_ranks (ranks of the run, unknown ones included), shift_ns = offset_ns - skew_ns
-- (skew 0 where unknown): trace ns + shift_ns = the time on the reference rank's wall clock.
with ranks as (
    select distinct trace_id, rank from steps
),

refs as (
    select run, min(ref_rank) as ref_rank from clock_skew group by all
),

final as (
    select
        r.trace_id,
        t.run,
        r.rank,
        o.offset_ns,
        o.offset_source,
        f.ref_rank,
        round(c.skew_ns)::bigint as skew_ns,
        c.n_matched,
        count(distinct r.rank) over (partition by t.run) as run_ranks,
        o.offset_ns - coalesce(round(c.skew_ns)::bigint, 0) as shift_ns
    from ranks as r
    inner join traces as t using (trace_id)
    inner join wall_offsets as o using (trace_id)
    left join refs as f on f.run = t.run
    left join clock_skew as c on c.run = t.run and c.rank = r.rank
)

select * from final
