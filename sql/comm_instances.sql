-- inputs: gpu_activity, cpu_activity, wall_offsets
-- comm_instances: one row per communication kernel (a gloo span on CPU-only traces; step: the step that
-- launched it, as in sql/device_activity.sql), matched across the
-- ranks of its run into collective instances (README: Across ranks). A kernel's duration = waiting for
-- the last peer + moving data; durations carry the result, not start times, so clock skew between ranks
-- does not bias it.
--   process group   the kernel's (pg_name, member ranks), else the one group of its trace's
--                   distributedInfo.pg_config; group_size n = "Group size", else the members counted, else
--                   pg_size. group_id identifies it (with its run).
--   instance        with Seq on every kernel of the group: (group, Seq, k-th kernel of that Seq on the
--                   rank); else (group, collective type, k-th kernel of that type on the rank) = ordinal
--   matched         the instance holds a kernel of each of the group's n ranks; else `reason` says why:
--                   no process group | no group size | point-to-point | rank unknown (a file without
--                   one) | ranks outside the group's member list hold it | ranks disagree on the group's
--                   member list | the run holds k of the group's n ranks | k ranks hold a group of n
--                   (groups of one name, without member lists) | ranks saw different numbers of kernels |
--                   missing on some ranks | a kernel of the instance has zero length (its time is unknown)
--   transfer_ns     the shortest duration over the instance's ranks (the rank that arrived last waited least)
--   wait_ns         dur_ns - transfer_ns: the first part of the kernel
--   arrived_last    the kernel of the shortest duration (ties: the lowest rank) arrived last: the straggler
--   arrival         how arrival was inferred: duration (the rule above) | start time | not inferable.
--                   Rooted collectives (Broadcast, Reduce): the root's kernel can end long before the
--                   receivers', so the shortest kernel is not the last to arrive (README: Across ranks). Where every
--                   kernel of the instance is in one trace file (one host's clock) the last to start
--                   arrived last and a kernel waits from its start to that start (transfer: the rest);
--                   otherwise arrival is not inferable: no straggler, no wait, the kernel counts as transfer
--   wait_caused_ns  on the straggler's row, the wait of every other rank of the instance; else 0
--   size_bytes      message bytes (AllGather: output elements, others input elements, x dtype bytes);
--                   matched: the largest over the instance's kernels
--   name_id, correlation   the kernel's name (names) and launch correlation (the critical path reads them)
-- An unmatched kernel has wait_ns 0 and transfer_ns = dur_ns (its bandwidth is a lower bound).
-- Process group arguments (long rank lists at scale) are resolved once per distinct value, and instances
-- are aggregated, not windowed: 10M kernels stay within memory.
with single_pg as (
    select
        trace_id,
        json_extract_string(header, '$.distributedInfo.pg_config[0].pg_name') as pg_name,
        json_extract_string(header, '$.distributedInfo.pg_config[0].pg_desc') as pg_desc,
        json_extract(header, '$.distributedInfo.pg_config[0].ranks')::varchar as pg_ranks,
        try_cast(json_extract_string(header, '$.distributedInfo.pg_config[0].pg_size') as bigint) as pg_size
    from traces
    where json_array_length(header, '$.distributedInfo.pg_config') = 1
),

kernels as (
    select
        a.trace_id, a.rank, coalesce(a.device, -1) as device, a.stream, a.step, a.start_ns, a.end_ns, a.dur_ns,
        a.collective_type, a.pg_name, a.pg_desc, a.pg_ranks, a.group_size, a.seq, a.name_id, a.correlation,
        case when a.collective_type = 'AllGather' then a.out_nelems else a.in_nelems end * dtype_bytes(a.dtype) as bytes
    from gpu_activity as a
    where a.class = 'comm'
    union all
    select
        c.trace_id, c.rank, c.device, null, c.step, c.start_ns, c.end_ns, c.dur_ns, coalesce(c.collective_type, 'Other'),
        null, null, null, null, null, c.name_id, null, null
    from cpu_activity as c
    where c.class = 'comm'
),

-- each distinct set of process group arguments of a trace, resolved once
group_args as (
    select distinct trace_id, pg_name, pg_desc, pg_ranks, group_size from kernels
),

resolved as (
    select
        a.*,
        coalesce(a.pg_name, p.pg_name) as group_name,
        case when a.pg_name is not null then a.pg_desc else p.pg_desc end as group_desc,
        try_cast(case when a.pg_name is not null then a.pg_ranks else p.pg_ranks end as bigint[]) as rank_list,
        case when a.pg_name is not null then case when a.group_size > 0 then a.group_size end else p.pg_size end as size_arg
    from group_args as a
    left join single_pg as p on a.pg_name is null and p.trace_id = a.trace_id
),

-- a rank list that is empty, or cut short ("[0, 1, ..., 29, ...]": a null in it), names no members
listed as (
    select
        * exclude (rank_list),
        case when len(rank_list) > 0 and len(list_filter(rank_list, lambda x: x is null)) = 0 then list_sort(rank_list) end
            as members
    from resolved
),

groups as (
    select
        r.trace_id, r.pg_name, r.pg_desc, r.pg_ranks, r.group_size,
        t.run,
        r.group_name,
        r.members,
        hash(t.run, r.group_name, array_to_string(r.members, ',')) as group_id,
        coalesce(r.group_desc || ' (' || r.group_name || ')', r.group_name, r.group_desc, 'unknown') as process_group,
        coalesce(r.size_arg, len(r.members)) as n,
        case
            when r.group_name is null then 'no process group'
            when coalesce(r.size_arg, len(r.members)) is null then 'no group size'
        end as group_reason
    from listed as r
    inner join traces as t using (trace_id)
),

candidates as (
    select
        k.trace_id, k.rank, k.device, k.stream, k.step, k.start_ns, k.end_ns, k.dur_ns, k.collective_type, k.seq,
        k.name_id, k.correlation, k.bytes, g.group_id, g.n,
        coalesce(
            g.group_reason,
            case when k.collective_type in ('Send', 'Recv', 'SendRecv') then 'point-to-point' end,
            case when k.rank < 0 then 'rank unknown' end
        ) as reason0
    from kernels as k
    inner join groups as g
        on g.trace_id = k.trace_id and g.pg_name is not distinct from k.pg_name
        and g.pg_desc is not distinct from k.pg_desc and g.pg_ranks is not distinct from k.pg_ranks
        and g.group_size is not distinct from k.group_size
),

group_seq as (
    select group_id, bool_and(seq is not null) as by_seq
    from candidates
    where reason0 is null
    group by all
),

-- which ranks hold which group (ranks x groups: few rows), and what a group's ranks say of it
group_ranks as (
    select distinct group_id, rank from candidates where reason0 is null
),

group_defs as (
    select distinct run, group_id, group_name, members from groups
),

-- a rank of a group's member list that holds a group of the same name with another member list
disagreeing as (
    select distinct d.group_id
    from (select group_id, run, group_name, unnest(members) as member from group_defs) as d
    inner join group_ranks as gr on gr.rank = d.member
    inner join group_defs as o on o.group_id = gr.group_id
    where o.run = d.run and o.group_name = d.group_name and o.group_id <> d.group_id
),

group_facts as (
    select
        r.group_id,
        count(*) as present,
        any_value(s.by_seq) as by_seq,
        case
            when bool_or(d.members is not null and not list_contains(d.members, r.rank))
                then 'ranks outside the group''s member list hold it'
            when any_value(x.group_id) is not null then 'ranks disagree on the group''s member list'
        end as members_reason
    from group_ranks as r
    inner join group_seq as s using (group_id)
    inner join group_defs as d using (group_id)
    left join disagreeing as x using (group_id)
    group by all
),

-- the k-th kernel of the rank in its group: by Seq, else by collective type
ordered as (
    select
        c.* exclude (reason0),
        f.present,
        f.members_reason,
        case when f.by_seq then c.seq else -1 end as key_seq,
        case when f.by_seq then '' else c.collective_type end as key_type,
        c.start_ns + o.offset_ns as wall_start_ns,
        -- in wall-clock order: a rank's trace files (profiling cycles) each have a clock of their own
        row_number() over (
            partition by c.group_id, c.rank, key_seq, key_type
            order by c.start_ns + o.offset_ns, c.end_ns, c.device, c.stream
        ) as ordinal
    from candidates as c
    inner join group_facts as f using (group_id)
    inner join wall_offsets as o using (trace_id)
    where c.reason0 is null
),

-- without Seq, every rank of the group must have seen as many kernels of a type
type_counts as (
    select group_id, key_type, count(*) < any_value(present) or min(n_rank) <> max(n_rank) as differ
    from (select group_id, key_type, rank, count(*) as n_rank, any_value(present) as present
          from ordered where key_type <> '' group by all)
    group by all
),

instances as (
    select
        group_id, key_seq, key_type, ordinal,
        count(*) as n_kernels,
        min(dur_ns) as transfer_ns,
        sum(dur_ns) as sum_dur_ns,
        max(bytes) as max_bytes,
        arg_min(rank, (dur_ns, rank)) as last_rank,
        bool_or(collective_type in ('Broadcast', 'Reduce')) as rooted,
        count(distinct trace_id) = 1 as one_clock,
        max(wall_start_ns) as last_start_ns,
        arg_max(rank, (wall_start_ns, -rank)) as last_start_rank
    from ordered
    group by all
),

-- rooted instances on one clock: each kernel waits from its start to the last rank's start
start_waits as (
    select o.group_id, o.key_seq, o.key_type, o.ordinal,
           sum(least(o.dur_ns, greatest(0, i.last_start_ns - o.wall_start_ns))) as start_wait_sum_ns
    from ordered as o
    inner join instances as i using (group_id, key_seq, key_type, ordinal)
    where i.rooted and i.one_clock
    group by all
),

matched as (
    select
        o.*,
        i.transfer_ns as instance_transfer_ns,
        i.sum_dur_ns,
        i.max_bytes,
        case when i.rooted and i.one_clock then i.last_start_rank else i.last_rank end as last_rank,
        case when not i.rooted then 'duration' when i.one_clock then 'start time' else 'not inferable' end as arrival,
        case when i.rooted and i.one_clock then least(o.dur_ns, greatest(0, i.last_start_ns - o.wall_start_ns)) end
            as start_wait_ns,
        sw.start_wait_sum_ns,
        case
            when o.members_reason is not null then o.members_reason
            when o.present < o.n then format('the run holds {} of the group''s {} ranks', o.present, o.n)
            when o.present > o.n then format('{} ranks hold a group of {}: groups of one name, without member lists',
                                             o.present, o.n)
            when tc.differ then 'ranks saw different numbers of kernels'
            when i.n_kernels <> o.n then 'missing on some ranks'
            when i.transfer_ns = 0 then 'a kernel of the instance has zero length'
        end as reason
    from ordered as o
    inner join instances as i using (group_id, key_seq, key_type, ordinal)
    left join type_counts as tc on o.key_type <> '' and tc.group_id = o.group_id and tc.key_type = o.key_type
    left join start_waits as sw using (group_id, key_seq, key_type, ordinal)
),

-- names and labels join the rows last: the sorts above carry integers
labels as (
    select group_id, min(process_group) as process_group from groups group by all
),

final as (
    select
        trace_id, rank, device, stream, step, start_ns, end_ns, dur_ns, collective_type, group_id,
        n as group_size, seq, name_id, correlation, ordinal,
        reason is null as matched,
        reason,
        case when reason is null then arrival end as arrival,
        case when reason is null then hash(group_id, key_seq, key_type, ordinal) end as instance_id,
        case
            when reason is not null or arrival = 'not inferable' then 0
            when arrival = 'start time' then start_wait_ns
            else dur_ns - instance_transfer_ns
        end as wait_ns,
        case
            when reason is not null or arrival = 'not inferable' then dur_ns
            when arrival = 'start time' then dur_ns - start_wait_ns
            else instance_transfer_ns
        end as transfer_ns,
        reason is null and arrival <> 'not inferable' and rank = last_rank as arrived_last,
        case
            when reason is not null or arrival = 'not inferable' or rank <> last_rank then 0
            when arrival = 'start time' then start_wait_sum_ns - start_wait_ns
            else sum_dur_ns - n * instance_transfer_ns
        end as wait_caused_ns,
        case when reason is null then max_bytes else bytes end as size_bytes
    from matched
    union all by name
    select
        trace_id, rank, device, stream, step, start_ns, end_ns, dur_ns, collective_type, group_id,
        n as group_size, seq, name_id, correlation, null as ordinal, false as matched, reason0 as reason, null as arrival, null as instance_id,
        0 as wait_ns, dur_ns as transfer_ns, false as arrived_last, 0 as wait_caused_ns, bytes as size_bytes
    from candidates
    where reason0 is not null
)

select t.run, f.*, l.process_group
from final as f
inner join traces as t using (trace_id)
inner join labels as l using (group_id)
