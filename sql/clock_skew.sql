-- inputs: gpu_activity, cpu_activity, wall_offsets
-- clock_skew: one row per (run, rank) of a run with more than one known rank, other than the run's
-- reference rank (its lowest known rank), that shares a collective with the reference rank.
-- Columns: run, rank, path (the rank's trace; the first by name when it has several), ref_rank,
-- skew_ns (this rank's clock minus the reference rank's: + means this rank's clock is ahead; the rank's
-- times minus skew_ns are on the reference rank's clock), n_matched (collectives it was estimated from).
-- A collective ends at (nearly) the same instant on every rank, so the skew is the median difference
-- of the end times of the same collective. Collectives are matched across ranks by (process group,
-- collective type, Seq) where every kernel of that group/type has Seq, else by order of occurrence.
-- Times are wall clock (sql/wall_offsets.sql). Communication kernels, or gloo spans on CPU-only traces,
-- of the runs a statement selects (traceq.query.selecting_runs).
with comm as (
    select
        a.trace_id,
        a.rank,
        a.device,
        a.stream,
        a.start_ns,
        a.end_ns,
        a.correlation,
        coalesce(a.pg_name, '') as pg,
        a.collective_type
    from gpu_activity as a
    where a.class = 'comm' and a.rank >= 0
    union all
    -- the gloo spans of CPU-only traces (sql/cpu_activity.sql): a collective ends together there too
    select c.trace_id, c.rank, c.device, null, c.start_ns, c.end_ns, null, '', c.collective_type
    from cpu_activity as c
    where c.class = 'comm' and c.rank >= 0
),

seqs as (
    select trace_id, rank, device, stream, start_ns, correlation, min(seq) as seq
    from gpu_events
    where seq is not null
    group by all
),

kernels as (
    select
        t.run,
        c.rank,
        t.path,
        c.pg,
        c.collective_type,
        c.end_ns + o.offset_ns as end_wall_ns,
        s.seq,
        -- in wall-clock order: a rank's trace files (profiling cycles) each have a clock of their own
        row_number() over (partition by t.run, c.rank, c.pg, c.collective_type order by c.start_ns + o.offset_ns) as occurrence
    from comm as c
    inner join traces as t using (trace_id)
    inner join wall_offsets as o using (trace_id)
    left join seqs as s
        on s.trace_id = c.trace_id and s.rank = c.rank and s.start_ns = c.start_ns
        and s.device is not distinct from c.device and s.stream is not distinct from c.stream
        and s.correlation is not distinct from c.correlation
),

keyed as (
    select
        *,
        case
            when bool_and(seq is not null) over (partition by run, pg, collective_type) then seq
            else occurrence
        end as match_key
    from kernels
),

reference as (
    select run, min(rank) as ref_rank
    from keyed
    group by all
    having count(distinct rank) > 1
),

pairs as (
    select k.run, k.rank, k.path, r.ref_rank, k.end_wall_ns - ref.end_wall_ns as diff_ns
    from keyed as k
    inner join reference as r on r.run = k.run and k.rank <> r.ref_rank
    inner join keyed as ref
        on ref.run = k.run and ref.rank = r.ref_rank and ref.pg = k.pg
        and ref.collective_type = k.collective_type and ref.match_key = k.match_key
),

final as (
    select run, rank, min(path) as path, any_value(ref_rank) as ref_rank, median(diff_ns) as skew_ns,
           count(*) as n_matched
    from pairs
    group by all
)

select * from final
