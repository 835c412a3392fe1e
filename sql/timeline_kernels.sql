-- inputs: gpu_activity, comm_instances
-- timeline_kernels: one row per device event (kernel, memcpy, memset) that `traceq export --perfetto`
-- writes: those of each span of $spans, a list of {proc, trace_id, rank, device, lo_ns, hi_ns, shift_ns}
-- (a rank's selected step windows on one device, README: device windows; an event is written when part
-- of it lies inside [lo_ns, hi_ns), or it has zero length and lies in [lo_ns, hi_ns]), with what the
-- timeline shows of it.
-- Columns: proc (the span's process), device (-1: none named), stream (null: none named), ts_ns (start on
-- the timeline's clock: start_ns + the span's shift_ns), dur_ns, name, class (comm | compute | memcpy |
-- memset | sync), category; for communication: collective_type, process_group, group_size, seq,
-- size_bytes (message bytes: AllGather output, others input), and from the matching across ranks
-- (sql/comm_instances.sql) matched, wait_ns (its first part, waiting for the last peer) and transfer_ns.
with spans as (
    select unnest($spans, recursive := true)
),

-- one row per kernel (a trace that holds a kernel twice gets the same figures for both)
instances as (
    select trace_id, rank, device, stream, start_ns, dur_ns, process_group, group_size, size_bytes, matched,
           wait_ns, transfer_ns
    from comm_instances
    qualify row_number() over (partition by trace_id, rank, device, stream, start_ns, dur_ns order by wait_ns) = 1
),

events as (
    select
        s.proc,
        coalesce(a.device, -1) as device,
        a.stream,
        a.start_ns + s.shift_ns as ts_ns,
        a.dur_ns,
        a.name,
        a.class,
        a.category,
        a.collective_type,
        a.seq,
        a.trace_id,
        a.rank,
        a.start_ns,
        case when a.collective_type = 'AllGather' then a.out_nelems else a.in_nelems end * dtype_bytes(a.dtype)
            as bytes,
        a.pg_name,
        a.group_size as group_size_arg
    from gpu_activity as a
    inner join spans as s
        on s.trace_id = a.trace_id and s.rank = a.rank and s.device = coalesce(a.device, -1)
        and ((a.start_ns < s.hi_ns and a.end_ns > s.lo_ns) or (a.dur_ns = 0 and a.start_ns between s.lo_ns and s.hi_ns))
),

final as (
    select
        e.proc,
        e.device,
        e.stream,
        e.ts_ns,
        e.dur_ns,
        e.name,
        e.class,
        e.category,
        e.collective_type,
        coalesce(i.process_group, e.pg_name) as process_group,
        coalesce(i.group_size, e.group_size_arg) as group_size,
        e.seq,
        coalesce(i.size_bytes, e.bytes) as size_bytes,
        i.matched,
        i.wait_ns,
        i.transfer_ns
    from events as e
    left join instances as i
        on e.class = 'comm' and i.trace_id = e.trace_id and i.rank = e.rank and i.device = e.device
        and i.stream is not distinct from e.stream and i.start_ns = e.start_ns and i.dur_ns = e.dur_ns
)

select * from final
