-- optimizer_launches: one row per (trace_id, rank, correlation) of a device launch (a runtime event, cat in
-- $runtime_cats) of the traces $trace_ids that lies inside an optimizer step: a CPU span named
-- `Optimizer.step#<Class>.step` (torch.optim's record_function), `optimizer.step#...`, `Optimizer.step` or
-- `optimizer.step`, on the same thread (pid, tid), start <= launch < end. The device work of such a launch
-- is the optimizer's whatever its kernel's name (context before name: foreach multi_tensor_apply
-- Lerp/Sqrt kernels are AdamW's); sql/gpu_classified.sql reads it. The device-side copies of annotations
-- ($device_annotation_cats) are not CPU spans and are left out. traceq/classify.py runs it once per trace and
-- connection, into a temporary table. Spans are what the warehouse keeps: in a
-- trace with device activity that is annotations (user_annotation), not plain CPU operators, so a 2021
-- trace whose Optimizer.step is an `Operator` event shows no optimizer context.
with step_names as (
    select trace_id, name_id
    from names
    where trace_id in (select unnest($trace_ids)) and regexp_matches(name, '^[Oo]ptimizer\.step(#|$)')
),

spans as (
    select h.trace_id, h.rank, h.pid, h.tid, h.start_ns, h.start_ns + h.dur_ns as end_ns
    from host_events as h
    semi join step_names as s on s.trace_id = h.trace_id and s.name_id = h.name_id
    where h.trace_id in (select unnest($trace_ids)) and not list_contains($device_annotation_cats, h.cat)
),

launches as (
    select h.trace_id, h.rank, h.pid, h.tid, h.start_ns, h.correlation
    from host_events as h
    where h.trace_id in (select trace_id from spans) and list_contains($runtime_cats, h.cat)
        and h.correlation is not null
),

final as (
    select distinct l.trace_id, l.rank, l.correlation
    from launches as l
    inner join spans as s
        on s.trace_id = l.trace_id and s.rank = l.rank and s.pid = l.pid and s.tid = l.tid
        and l.start_ns >= s.start_ns and l.start_ns < s.end_ns
)

select * from final
