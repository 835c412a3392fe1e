-- The traceq warehouse. Times are integer nanoseconds on the trace's own clock (Kineto ts x 1000);
-- wall-clock ns = start_ns + traces.base_time_ns where the trace has baseTimeNanoseconds.
-- A negative rank means unknown: a file that names no rank gets -1, -2, ... in its run, one of its own
-- (see traces.rank_source).

create sequence if not exists trace_ids start 1;

create table if not exists runs (
    run varchar primary key,           -- run name (ingest --name, else the parent directory's name)
    metadata json,                     -- collector metadata or values set with `traceq runs set`
    created_at timestamp default current_timestamp
);

create table if not exists traces (
    trace_id integer primary key,
    run varchar not null,
    path varchar not null,             -- as given on the command line, resolved
    content_digest varchar not null unique, -- 'blake3:<hex>' of the file as stored ('sha256:<hex>' before)
    size_bytes bigint not null,
    rank_source varchar not null,      -- distributedInfo | event args | option | file name | unknown
    file_rank bigint,                  -- rank of the whole file, when known
    world_size bigint,
    backend varchar,
    schema_version integer,
    base_time_ns bigint,               -- baseTimeNanoseconds: wall-clock ns of trace time 0
    display_time_unit varchar,
    trace_name varchar,
    header json,                       -- every top-level field except traceEvents
    step_marker varchar,               -- regular expression its steps were read by (catalog.StepMarker)
    devices json,                      -- deviceProperties as [{"id", "name"}] (every device the trace lists)
    gpu_model varchar,                 -- name of the device(s) its activity ran on, from deviceProperties
    n_events bigint not null,          -- events read
    n_gpu_events bigint not null,
    n_host_events bigint not null,
    n_dropped bigint not null,         -- X events without usable ts/dur (or dur < 0), not counting the CPU operators a trace with GPU activity leaves out
    parse_seconds double,
    ingested_at timestamp default current_timestamp
);

create table if not exists names (
    trace_id integer not null,
    name_id integer not null,
    name varchar not null
);

-- Kernels, memcpys and memsets. kind: 1 kernel, 2 memcpy, 3 memset.
create table if not exists gpu_events (
    trace_id integer not null,
    rank bigint,                       -- filled with the file rank (or -1) when the event has none
    device bigint,
    stream bigint,
    kind tinyint not null,
    name_id integer not null,
    start_ns bigint not null,
    dur_ns bigint not null,
    correlation bigint,
    external_id bigint,
    collective varchar,                -- "Collective name" arg, when the kernel carries it
    pg_name varchar,
    pg_desc varchar,
    pg_ranks varchar,
    group_size bigint,
    in_nelems bigint,
    out_nelems bigint,
    dtype varchar,
    seq bigint,
    step bigint,                       -- the step that launched it (README: device windows, steps), null when none did
    step_source varchar                -- launch | device_annotation | time | whole_trace
);

-- CPU-side spans: annotations (ProfilerStep#N), runtime/driver calls, GPU annotations, operators.
-- Traces with GPU activity keep only the operators that carry collective args (record_param_comms)
-- or are a ProfilerStep#N; CPU-only traces keep every operator (traceq.ingest.decode.events_to_rows).
create table if not exists host_events (
    trace_id integer not null,
    rank bigint,                       -- filled with the file rank (or -1) when the event has none
    cat varchar,
    name_id integer not null,
    pid bigint,
    tid bigint,
    start_ns bigint not null,
    dur_ns bigint not null,
    correlation bigint,
    external_id bigint,
    device bigint,
    collective varchar,
    pg_name varchar,
    pg_desc varchar,
    pg_ranks varchar,
    group_size bigint,
    in_nelems bigint,
    out_nelems bigint,
    dtype varchar,
    seq bigint
);

-- Step CPU spans per rank (sql/steps.sql): ProfilerStep#N, or the step marker given at ingest. A rank
-- with no step marker has one step, -1, spanning its whole trace (source 'whole_trace').
create table if not exists steps (
    trace_id integer not null,
    rank bigint,                       -- filled with the file rank (or -1) when the event has none
    step bigint not null,
    start_ns bigint not null,
    end_ns bigint not null,
    step_time_ns bigint not null,
    launches_without_gpu_work bigint not null,  -- > 0: the trace was cut inside this step
    source varchar                     -- marker | whole_trace
);

-- Process and thread names from metadata events (e.g. the pt_gloo_runloop thread).
create table if not exists trace_threads (
    trace_id integer not null,
    rank bigint,                       -- filled with the file rank (or -1) when the event has none
    pid bigint,
    tid bigint,
    key varchar,
    value varchar
);

-- Kernel classification rules (see sql/kernel_rules.csv); lower priority wins.
create table if not exists kernel_rules (
    priority integer not null,
    pattern varchar not null,          -- RE2 regular expression matched against the kernel name
    class varchar not null,            -- comm | compute | memcpy | sync (not activity)
    category varchar not null,
    collective varchar,                -- collective type implied by the name, if any
    source varchar not null            -- builtin | user
);

-- Run metadata as each rank's collector wrote it (rank<r>.run.json beside the trace); the run-level
-- values are also merged into runs.metadata.
create table if not exists run_files (
    trace_id integer not null,
    run varchar not null,
    rank bigint,                       -- the file's "rank"
    path varchar not null,             -- the run.json file, resolved
    metadata json not null             -- the whole file
);

-- Values given with `traceq runs set` (they win over the collector's and survive later ingests).
create table if not exists run_settings (
    run varchar not null,
    key varchar not null,              -- a runs.metadata key, e.g. tokens_per_step
    value json,
    set_at timestamp default current_timestamp,
    primary key (run, key)
);

-- Wall-clock times of every step's CPU span (its start and end), for power: wall_ns = trace ns + offset_ns
-- (traceq/ingest/sidecar.py says where the offset comes from). step_windows until schema 2.
create table if not exists step_wall_times (
    trace_id integer not null,
    rank bigint,
    step bigint not null,
    start_wall_ns bigint not null,     -- ns since the Unix epoch
    end_wall_ns bigint not null,
    offset_ns bigint not null,
    offset_source varchar not null     -- baseTimeNanoseconds | run.json | none (trace ts taken as epoch us)
);

-- One row per power log (rank<r>.power.jsonl) loaded with a trace.
create table if not exists power_logs (
    trace_id integer not null,
    rank bigint,
    path varchar not null,
    source varchar not null,           -- nvml | unavailable
    reason varchar,                    -- why there are no numbers (source unavailable)
    interval_ms double,                -- sampling interval
    gpus json,                         -- [{"gpu", "name", "uuid"}]
    note varchar,                      -- what NVML's numbers mean (smoothing)
    end_wall_ns bigint,                -- the "end" record; null when the log was cut short
    n_samples bigint not null,         -- power records
    n_energy bigint not null,          -- energy records
    n_errors bigint not null           -- error records
);

-- NVML readings of a power log: kind power (power_w) or energy (energy_mj at the start of step).
create table if not exists power_samples (
    trace_id integer not null,
    rank bigint,
    gpu bigint not null,               -- NVML device index
    kind varchar not null,             -- power | energy
    wall_ns bigint not null,           -- ns since the Unix epoch
    step bigint,                       -- step in progress (power) or starting (energy)
    power_w double,
    energy_mj bigint                   -- cumulative counter, millijoules
);

-- Facts about the warehouse itself: schema_version (traceq.store.schema.SCHEMA_VERSION).
create table if not exists warehouse_info (
    key varchar primary key,
    value varchar
);
