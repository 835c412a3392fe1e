-- traceq_events: one row per complete slice of the trace (Kineto's "X" events; dur >= 0), as
-- Perfetto's JSON importer read it, with the role of its category (traceq_categories: the rows of
-- sql/event_categories.csv, passed in) and its rank: args.rank where the event names one (a file that
-- merges ranks), else the file's (traceq_params.file_rank). Global and process instant events ("i"),
-- which Perfetto keeps as zero-length slices on instant tracks, are left out; thread-scoped ones land
-- on the thread's track, where nothing tells them from a zero-length "X" event: the step markers and
-- timelines (sql/perfetto/marker_spans.sql, steps.sql) leave out zero-length CPU slices.
-- Columns: id (slice id), rank, role (kernel | memcpy | memset | runtime | operator |
-- device_annotation; null for other categories), cat, name, start_ns, dur_ns, end_ns (ns, the trace's
-- clock), arg_set_id, utid (the thread of the slice's track: the JSON pid/tid).
create perfetto table traceq_events as
select
    s.id,
    coalesce(extract_arg(s.arg_set_id, 'args.rank'), p.file_rank) as rank,
    c.role,
    s.category as cat,
    s.name,
    s.ts as start_ns,
    s.dur as dur_ns,
    s.ts + s.dur as end_ns,
    s.arg_set_id,
    extract_arg(t.dimension_arg_set_id, 'utid') as utid
from slice as s
inner join track as t on t.id = s.track_id
left join traceq_categories as c on c.cat = s.category
cross join traceq_params as p
where s.dur >= 0 and t.type not glob '*instant*'
