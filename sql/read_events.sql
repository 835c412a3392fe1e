-- Batches of event chunks ($files: JSON arrays of whole events, cut from traces' traceEvents by traceq.ingest.reader),
-- parsed by DuckDB's JSON reader into a materialized relation, one row per element that is not dropped (_rows in
-- sql/batch_*.sql). Dropped (no "ph", or a complete event without a valid time or duration that is no CPU operator) is
-- no row: traceq.ingest.native writes each file between two bounds ({"ph": $bound_ph}), whose rows say the file's
-- (`file_no`) elements by their ordinality (`bound`), and sql/batch_counts.sql counts those without a row as dropped.
-- part: the number of the row's batch ($file_parts, of each file; traceq.ingest.native.BatchFiles.part), which tells
-- its rows from those of the other batches parsed and written in the same statements (traceq.ingest.native).
-- Rows that become warehouse rows (`keep`) get the columns of traceq.ingest.decode's tables, with the name as
-- text (sql/batch_names.sql interns it: an id per name and trace), the others only count.
--   kind: 1 kernel, 2 memcpy, 3 memset ($kernel_cats, $memcpy_cats, $memset_cats: sql/event_categories.csv),
--     0 other complete (X) event, null for any other phase
--   plain_op: a CPU operator that no GPU-trace metric reads (cat in $op_cats, no collective args,
--     not a step marker: $step_marker, $step_marker_prefix), kept only when its batch is parsed with all_ops
--     ($file_all_ops, of each file; CPU-only traces: they are the compute)
--   valid: ts and dur are JSON numbers within +-2**62 ns and dur >= 0 (else the span is dropped and
--     counted). The JSON reader is lenient where traceq is strict (a string "12.5" passes for a
--     number), so ph, cat, name, ts and dur are read as JSON text and typed here.
--   unsure_file: 2021 traces spell the key "external id" on some events, which one struct type cannot
--     hold beside "External id": the batch file of a row whose args lack "External id" is searched for it.
--   odd: a kept row that traceq.ingest.decode would read differently: a name or cat that is not a string,
--     an id or a collective's size or sequence number with a fraction (json_int rounds it, decode reads
--     none), a time float64 may not hold to the ns (|ts| >= 2**43 us written with a fraction or exponent:
--     epoch microseconds with ns). A batch with an odd row goes to traceq.ingest.decode instead.
with raw as (
    -- the files by a few scans side by side, each of a run of them (traceq.ingest.pipeline.read_events repeats this
    -- one for each, `$files[1:]` its files): one scan of them all numbers its elements on one thread (1.7x the time),
    -- and each scan holds a buffer of 32 MB or more (traceq.ingest.pipeline.PARSE_SCANS)
    select *, list_position($files, filename) as file_no
    from read_json(
        $files[1:],
        format = 'array',
        filename = true,
        maximum_object_size = $max_object_bytes,
        columns = {
            ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', ts: 'JSON', dur: 'JSON',
            args: 'STRUCT("External id" VARCHAR, correlation VARCHAR, device VARCHAR, stream VARCHAR, rank VARCHAR,
                "Collective name" VARCHAR, "Process Group Name" VARCHAR, "Process Group Description" VARCHAR,
                "Process Group Ranks" VARCHAR, "Group size" VARCHAR, "In msg nelems" VARCHAR,
                "Out msg nelems" VARCHAR, dtype VARCHAR, "Seq" VARCHAR, name VARCHAR, labels VARCHAR)'
        }
    ) with ordinality
),

classified as (
    select
        *,
        case
            when ph is distinct from 'X' then null
            when list_contains($kernel_cats, cat) then 1
            when list_contains($memcpy_cats, cat) then 2
            when list_contains($memset_cats, cat) then 3
            else 0
        end as kind,
        ph = 'M' and name in ('process_name', 'thread_name', 'process_labels') and args is not null as meta
    from raw
),

flagged as (
    select
        *,
        coalesce(kind = 0 and list_contains($op_cats, cat) and args."Collective name" is null
            and not coalesce(starts_with(name, $step_marker_prefix) and regexp_matches(name, $step_marker), false), false)
            as plain_op
    from classified
),

spans as (
    select
        *,
        coalesce(kind > 0 or (kind = 0 and ($file_all_ops[file_no] or not plain_op)), false) as span,
        case when span then json_number(ts) end as ts_us,
        case when span then json_number(dur) end as dur_us
    from flagged
),

final as (
    select
        $file_parts[file_no]::integer as part,
        case when ph = $bound_ph then file_no end as file_no,
        case when ph = $bound_ph then ordinality end as bound,
        kind,
        plain_op,
        meta,
        span,
        case when span or meta then coalesce(name, '') end as name,
        case when span then cat end as cat,
        case when span or meta then json_int(args.rank) end as rank,
        case when span or meta then json_int(pid) end as pid,
        case when span or meta then json_int(tid) end as tid,
        case when span then json_int(args.device) end as device,
        case when span then json_int(args.stream) end as stream,
        case when span then json_int(args.correlation) end as correlation,
        case when span then json_int(args."External id") end as external_id,
        case when span then args."Collective name" end as collective,
        case when span and collective is not null then args."Process Group Name" end as pg_name,
        case when span and collective is not null then args."Process Group Description" end as pg_desc,
        case when span and collective is not null then args."Process Group Ranks" end as pg_ranks,
        case when span and collective is not null then json_int(args."Group size") end as group_size,
        case when span and collective is not null then json_int(args."In msg nelems") end as in_nelems,
        case when span and collective is not null then json_int(args."Out msg nelems") end as out_nelems,
        case when span and collective is not null then args.dtype end as dtype,
        case when span and collective is not null then json_int(args."Seq") end as seq,
        case when meta then coalesce(args.name, args.labels) end as meta_value,
        case when span and args is not null and args."External id" is null then filename end as unsure_file,
        case when span then
            coalesce(isfinite(ts_us) and abs(ts_us) < 4.611686018427388e15 and isfinite(dur_us)
                and abs(dur_us) < 4.611686018427388e15 and dur_us >= 0, false)
        end as valid,
        -- integer ns: floor + rounded fraction, exact while |ts| < 2**43 us (traceq.ingest.decode._time_ns)
        case when valid then floor(ts_us)::bigint * 1000 + round((ts_us - floor(ts_us)) * 1000)::bigint end as start_ns,
        case when valid then floor(dur_us)::bigint * 1000 + round((dur_us - floor(dur_us)) * 1000)::bigint end as dur_ns,
        case when span then
            -- written with a fraction or an exponent ('[.eE]': three contains cost 0.1 CPU s less per 500 MB than a regexp)
            coalesce(valid and abs(ts_us) >= 8796093022208 and (contains(ts, '.') or contains(ts, 'e') or contains(ts, 'E')), false)
            or contains(args.correlation, '.') or contains(args."External id", '.')
            or contains(args.stream, '.') or contains(args.device, '.') or contains(args.rank, '.')
            or contains(args."Group size", '.') or contains(args."In msg nelems", '.')
            or contains(args."Out msg nelems", '.') or contains(args."Seq", '.')
        end as odd,
        -- dropped: counted (between the bounds), never a row: a gzip of `{}` by the hundred million stays flat
        coalesce(ph is null or (span and not valid and not plain_op), false) as dropped
    from spans
)

select * exclude (dropped) from final
where not dropped
