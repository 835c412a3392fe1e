"""Kernel names classified by the rules in force: each name once, by the whole rule set at a time.

A kernel's class is that of the first rule, in the order rules win (lower priority first, a user rule
before a builtin one of the same priority, then by pattern), whose RE2 pattern matches its name
(``sql/gpu_classified.sql`` turns the class into the event's). Matching each name against each rule
costs a regular expression compiled per pair: 100k rules and 10k names ran past 600 s. Here a
pattern is compiled once per query, and many rules go into one: the rules are tried
:data:`CHUNK` at a time as one alternation, and only the names it matches are narrowed down to their
first rule, halving the chunk until few (name, rule) pairs are left to test one by one. 41 builtin
rules and 744 names: one query for the chunk and a handful to narrow.

The result is kept per connection, in the temporary table :data:`TABLE` (a read-only warehouse may
hold temporary tables), with a digest of the rules it was made with: :func:`ensure` reclassifies
everything when the rules changed, and otherwise only the names of traces it has not read (ingested
since, or of runs a statement selects for the first time), so changed rules apply to data already
ingested, a report's queries classify nothing twice, and a report of one run reads only its traces.

Beside it, made at the same time for the same traces, :data:`OPTIMIZER_TABLE` holds the launches that
lie inside an optimizer step (``sql/optimizer_launches.sql``): the context that makes a kernel
``optimizer`` whatever its name (context before name). One interval join of the traces' runtime launches against
their few ``Optimizer.step`` spans, once per trace and connection, so the queries that read
``sql/gpu_classified.sql`` join a small table rather than look up every kernel's launch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceq.catalog import data_text, event_categories

if TYPE_CHECKING:
    from collections.abc import Sequence

    import duckdb

TABLE = "traceq_kernel_classes"  # name, class, category, rule_collective (null where no rule matches)
OPTIMIZER_TABLE = "traceq_optimizer_launches"  # trace_id, rank, correlation: launched inside an optimizer step
_DIGEST_TABLE = "traceq_kernel_classes_rules"
_TRACES_TABLE = "traceq_kernel_classes_traces"  # trace_id, content_digest: the traces whose names are in
CHUNK = 256  # rules tried together in one pattern
PAIRS = 2048  # at most this many (name, rule) pairs left: each is tested alone

ORDER = "priority, source = 'builtin', pattern, class, category, collective"  # the first wins
_DIGEST = f"select hash(list((priority, pattern, class, category, collective, source) order by {ORDER})) from kernel_rules"
_NEW_TRACES = f"""
select trace_id, content_digest from traces
where ($runs is null or list_contains($runs, run))
  and (trace_id, content_digest) not in (select (trace_id, content_digest) from {_TRACES_TABLE})
"""
_ALL_KERNEL_NAMES = """
select distinct n.name
from names as n
semi join gpu_events as g on g.trace_id = n.trace_id and g.name_id = n.name_id and g.kind = 1
where n.trace_id in (select unnest($trace_ids))"""
_KERNEL_NAMES = _ALL_KERNEL_NAMES + f" and n.name not in (select name from {TABLE})"
# :func:`inline`'s classes: a parameter of this type, unnested into the columns of TABLE
_CLASSES_PARAM = "kernel_class_rows"
_CLASSES_TYPE = "struct(name varchar, class varchar, category varchar, rule_collective varchar)[]"


def ensure(con: duckdb.DuckDBPyConnection, runs: Sequence[str] | None = None) -> None:
    """Make :data:`TABLE` on ``con`` hold every kernel name of the traces of ``runs`` (None: every run)
    with its class, and :data:`OPTIMIZER_TABLE` their launches inside an optimizer step. The traces
    they hold are kept beside them: each trace is read once."""
    digest = con.execute(_DIGEST).fetchone()[0]
    held = con.execute(
        "select count(*) from duckdb_tables() where temporary and table_name = ?", [_DIGEST_TABLE]
    ).fetchone()[0]
    if not held or con.execute(f"select digest from {_DIGEST_TABLE}").fetchone() != (digest,):
        con.execute(f"create or replace temp table {TABLE} "
                    "(name varchar, class varchar, category varchar, rule_collective varchar)")
        con.execute(f"create or replace temp table {_TRACES_TABLE} (trace_id integer, content_digest varchar)")
        con.execute(f"create or replace temp table {OPTIMIZER_TABLE} (trace_id integer, rank bigint, correlation bigint)")
        con.execute(f"create or replace temp table {_DIGEST_TABLE} as select ?::ubigint as digest", [digest])
    new = con.execute(_NEW_TRACES, {"runs": list(runs) if runs else None}).fetchall()
    if not new:
        return
    trace_ids = [trace_id for trace_id, _ in new]
    names = [name for (name,) in con.execute(_KERNEL_NAMES, {"trace_ids": trace_ids}).fetchall()]
    if names:
        _classify(con, names)
    cats = event_categories()
    # one row per launch, or sql/gpu_classified.sql would count a kernel twice
    con.execute(f"delete from {OPTIMIZER_TABLE} where trace_id in (select unnest($1))", [trace_ids])
    con.execute(f"insert into {OPTIMIZER_TABLE} select * from ({data_text('optimizer_launches.sql')})", {
        "trace_ids": trace_ids, "runtime_cats": list(cats.cats("runtime")),
        "device_annotation_cats": list(cats.cats("device_annotation")),
    })
    con.execute(f"insert into {_TRACES_TABLE} select unnest($1), unnest($2)", [trace_ids, [d for _, d in new]])


def inline(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, str], dict[str, object]]:
    """The kernel classes and optimizer launches of every trace on ``con`` as inputs of a statement that
    leave nothing on the connection: no temporary table, unlike :func:`ensure` (for a user's connection,
    :func:`traceq.report.selection.relation`). Returns the bindings of ``kernel_classes`` and
    ``optimizer_launches`` for :func:`traceq.query.compose` and the parameters they name: the classes,
    computed here as :func:`ensure` computes them, go in as one parameter; the launches are
    ``sql/optimizer_launches.sql`` itself, a common table expression of the statement."""
    trace_ids = [t for (t,) in con.execute("select trace_id from traces order by trace_id").fetchall()]
    names = sorted(name for (name,) in con.execute(_ALL_KERNEL_NAMES, {"trace_ids": trace_ids}).fetchall())
    columns = ("name", "class", "category", "rule_collective")
    cats = event_categories()
    bind = {"kernel_classes": f"(select unnest(${_CLASSES_PARAM}::{_CLASSES_TYPE}, recursive := true))",
            "optimizer_launches": "optimizer_launches"}
    return bind, {_CLASSES_PARAM: [dict(zip(columns, row)) for row in _classes(con, names)], "trace_ids": trace_ids,
                  "runtime_cats": list(cats.cats("runtime")), "device_annotation_cats": list(cats.cats("device_annotation"))}


def _classify(con: duckdb.DuckDBPyConnection, names: list[str]) -> None:
    """Insert ``names`` with their class into :data:`TABLE`."""
    rows = _classes(con, names)
    con.execute(f"insert into {TABLE} select unnest($1), unnest($2), unnest($3), unnest($4)",
                [list(column) for column in zip(*rows)])


def _classes(con: duckdb.DuckDBPyConnection, names: list[str]) -> list[tuple[str, str | None, str | None, str | None]]:
    """(name, class, category, rule_collective) of each of ``names``: its first rule's, nulls where none matches."""
    rules = con.execute(f"select pattern, class, category, collective from kernel_rules order by {ORDER}").fetchall()
    winners = first_rules(con, names, [pattern for pattern, *_ in rules])
    return [(name, *(rules[winners[name]][1:] if name in winners else (None, None, None))) for name in names]


def first_rules(con: duckdb.DuckDBPyConnection, names: Sequence[str], patterns: Sequence[str]) -> dict[str, int]:
    """name -> the index of the first pattern of ``patterns`` that matches it (RE2, anywhere in the
    name), for the names some pattern matches."""
    found: dict[str, int] = {}
    left = list(names)
    for lo in range(0, len(patterns), CHUNK):
        if not left:
            break
        hi = min(lo + CHUNK, len(patterns))
        hits = _matching(con, left, patterns, lo, hi)
        if hits:
            _narrow(con, [name for name in left if name in hits], patterns, lo, hi, found)
            left = [name for name in left if name not in hits]
    return found


def _narrow(con: duckdb.DuckDBPyConnection, names: list[str], patterns: Sequence[str], lo: int, hi: int,
            found: dict[str, int]) -> None:
    """Put in ``found`` the first rule of ``patterns[lo:hi]`` of each of ``names``, all of which match one."""
    if len(names) * (hi - lo) <= PAIRS:
        pairs = con.execute(
            "select n, min(i) from unnest($1) as t(n), (select unnest($2) as p, unnest($3) as i) "
            "where regexp_matches(n, p) group by n",
            [names, list(patterns[lo:hi]), list(range(lo, hi))],
        ).fetchall()
        found.update(pairs)
        return
    mid = (lo + hi) // 2
    first = _matching(con, names, patterns, lo, mid)
    if first:
        _narrow(con, [name for name in names if name in first], patterns, lo, mid, found)
    rest = [name for name in names if name not in first]
    if rest:
        _narrow(con, rest, patterns, mid, hi, found)


def _matching(con: duckdb.DuckDBPyConnection, names: list[str], patterns: Sequence[str], lo: int, hi: int) -> set[str]:
    """The names that some pattern of ``patterns[lo:hi]`` matches, with one compiled pattern where it can.

    Each pattern is wrapped in a group of its own, which keeps its flags and anchors to itself; a
    quoted span (``\\Q...``) could run past its group, so a pattern holding one is matched alone, as is
    any chunk RE2 will not compile as one (too large)."""
    chunk = patterns[lo:hi]
    if len(chunk) == 1:
        alternation = chunk[0]
    elif any("\\Q" in p for p in chunk):
        return _split(con, names, patterns, lo, hi)
    else:
        alternation = "|".join(f"(?:{p})" for p in chunk)
    import duckdb

    try:
        rows = con.execute("select n from unnest($1) as t(n) where regexp_matches(n, $2)", [names, alternation]).fetchall()
    except duckdb.InvalidInputException:  # RE2's "pattern too large"; each rule compiled alone when added
        if len(chunk) == 1:
            raise
        return _split(con, names, patterns, lo, hi)
    return {name for (name,) in rows}


def _split(con: duckdb.DuckDBPyConnection, names: list[str], patterns: Sequence[str], lo: int, hi: int) -> set[str]:
    mid = (lo + hi) // 2
    return _matching(con, names, patterns, lo, mid) | _matching(con, names, patterns, mid, hi)
