-- Write one parsed batch (_rows: the rows of sql/read_events.sql, held in memory) as rows of trace $trace_id.
-- Statements run in order, traceq.ingest.native passes each the parameters it names.
-- $fill_rank: the file's rank from distributedInfo, for rows whose event names none (null: filled later).

-- 1. what the batch holds (traceq.ingest.native.BatchCounts), odd: the batch goes to traceq.ingest.decode instead
select
    count(*) as events,
    count(*) filter (where kind > 0 and span and valid) as gpu,
    count(*) filter (where kind = 0 and span and valid) as host,
    count(*) filter (where (span and not valid) or no_phase) as dropped,
    count(*) filter (where plain_op and not span) as skipped_ops,
    count(*) filter (where ((span and valid) or meta) and rank is null) as rows_without_rank,
    count(*) filter (where span and valid and rank is not null) as rows_with_rank,
    coalesce(list(distinct unsure_file) filter (where unsure_file is not null), []) as unsure_files,
    coalesce(bool_or(odd), false) as odd
from _rows;

-- 2. names not seen yet in this trace get the next ids ($next_name_id on)
insert into names (trace_id, name_id, name)
select $trace_id, $next_name_id + row_number() over (order by name) - 1, name
from (
    select distinct e.name
    from _rows as e
    where e.span and e.valid
        and not exists (select 1 from names as n where n.trace_id = $trace_id and n.name = e.name)
);

-- 3. kernels, memcpys, memsets
insert into gpu_events (trace_id, rank, device, stream, kind, name_id, start_ns, dur_ns, correlation, external_id,
    collective, pg_name, pg_desc, pg_ranks, group_size, in_nelems, out_nelems, dtype, seq)
select $trace_id, coalesce(e.rank, $fill_rank), coalesce(e.device, e.pid), coalesce(e.stream, e.tid), e.kind,
    n.name_id, e.start_ns, e.dur_ns, e.correlation, e.external_id, e.collective, e.pg_name, e.pg_desc,
    e.pg_ranks, e.group_size, e.in_nelems, e.out_nelems, e.dtype, e.seq
from _rows as e
inner join names as n on n.trace_id = $trace_id and n.name = e.name
where e.kind > 0 and e.span and e.valid;

-- 4. host spans (device-side annotations without args.device take the trace viewer's pid, as on ROCm)
insert into host_events (trace_id, rank, cat, name_id, pid, tid, start_ns, dur_ns, correlation, external_id, device,
    collective, pg_name, pg_desc, pg_ranks, group_size, in_nelems, out_nelems, dtype, seq)
select $trace_id, coalesce(e.rank, $fill_rank), e.cat, n.name_id, e.pid, e.tid, e.start_ns, e.dur_ns, e.correlation,
    e.external_id, case when e.device is null and list_contains($device_annotation_cats, e.cat) then e.pid else e.device end,
    e.collective, e.pg_name, e.pg_desc, e.pg_ranks, e.group_size, e.in_nelems, e.out_nelems, e.dtype, e.seq
from _rows as e
inner join names as n on n.trace_id = $trace_id and n.name = e.name
where e.kind = 0 and e.span and e.valid;

-- 5. process and thread names
insert into trace_threads (trace_id, rank, pid, tid, key, value)
select $trace_id, coalesce(e.rank, $fill_rank), e.pid, e.tid, e.name, e.meta_value
from _rows as e
where e.meta;
