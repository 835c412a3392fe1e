-- inputs: exposed_comm_by_collective, run_groups
-- breakdown_metrics: the rows of a breakdown report (exposed_comm_by_collective_us, exposed_comm_by_pg_us),
-- one per window of `windows` and key of the dimension $dimension seen on its device
-- (sql/exposed_comm_by_collective.sql):
--   trace_id, rank, device, step
--   key                            the collective type ($dimension 'collective') or process group ('process_group')
--   comm_ns, exposed_comm_ns       |U(comm of key)|, |U(comm of key) − U(compute)| in the window, ns
--   run
--   step_time_ns                   the step's CPU span, ns (null over the whole trace, step -1)
--   world_size .. tokens_per_step  the run's metadata for grouping (sql/run_groups.sql)
with final as (
    select
        b.trace_id,
        b.rank,
        b.device,
        b.step,
        b.key,
        b.comm_ns,
        b.exposed_comm_ns,
        t.run,
        s.step_time_ns,
        m.* exclude (run)
    from exposed_comm_by_collective as b
    left join traces as t on t.trace_id = b.trace_id
    left join steps as s on s.trace_id = b.trace_id and s.rank = b.rank and s.step = b.step
    left join run_groups as m on m.run = t.run
    where b.dimension = $dimension
)

select * from final
