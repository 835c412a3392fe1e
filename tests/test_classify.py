"""Kernel names classified by whole rule sets (traceq.classify) give the rule a per-pair match gives.

The reference is the plain definition, written here apart from the code: each name against each rule,
one RE2 match per pair (DuckDB's regexp_matches, as rules are checked when added), the first rule in
the order rules win."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pytest

from tests.tracegen import TraceBuilder
from traceq import classify, query
from traceq.ingest import ingest_traces
from traceq.report.selection import query_params, relation
from traceq.store.schema import add_rules, builtin_rules
from traceq.store.warehouse import connect


def per_pair(names: list[str], patterns: list[str]) -> dict[str, int]:
    con = duckdb.connect()
    rows = con.execute(
        "select n, min(i) from unnest($1) as t(n), (select unnest($2) as p, unnest(range(len($2))) as i) "
        "where regexp_matches(n, p) group by n", [names, patterns]).fetchall()
    return dict(rows)


def corpus_kernel_names(db: Path) -> list[str]:
    with connect(db, read_only=True) as con:
        return sorted(name for (name,) in con.sql(
            "select distinct n.name from names n semi join gpu_events g on g.trace_id = n.trace_id and g.name_id = n.name_id and g.kind = 1"
        ).fetchall())


def generated_patterns(names: list[str], count: int, seed: int) -> list[str]:
    """Patterns of the kinds users write, most matching a few corpus names: anchored prefixes and
    suffixes of real names, fragments quoted with \\Q..\\E (some left open to the end),
    case-insensitive words, patterns that match nothing; and a catch-all in the second half."""
    rng = random.Random(seed)
    words = sorted({w for name in names for w in name.replace("<", " ").replace("(", " ").split() if len(w) > 3})

    def escaped(text: str) -> str:
        return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in text)

    patterns = []
    for _ in range(count):
        name, word = rng.choice(names), rng.choice(words)
        cut = word[: rng.randint(4, min(16, len(word)))]
        kind = rng.randrange(6)
        if kind == 0:
            patterns.append("^" + escaped(name[: rng.randint(8, 40)]))
        elif kind == 1:
            patterns.append(escaped(name[-rng.randint(6, 30):]) + "$")
        elif kind == 2:
            patterns.append(f"\\Q{cut}\\E")
        elif kind == 3:
            patterns.append(f"\\Q{cut}")  # quoted to the end: matched alone, never inside a chunk
        elif kind == 4:
            patterns.append("(?i)" + "".join(c.upper() for c in cut if c.isalnum()))
        else:
            patterns.append("xyz_never_" + str(rng.randrange(10**6)))
    patterns.insert(rng.randrange(count // 2, count + 1), ".")  # matches every name left from where it stands
    return patterns


@pytest.mark.slow
@pytest.mark.parametrize("count", [5, 300, 900])
def test_first_rules_equal_the_per_pair_match_on_corpus_kernel_names(corpus_db: Path, count: int) -> None:
    names = corpus_kernel_names(corpus_db)
    assert len(names) > 500
    patterns = generated_patterns(names, count, seed=count) + [p for _, p, *_ in builtin_rules()]
    with duckdb.connect() as con:
        got = classify.first_rules(con, names, patterns)
    want = per_pair(names, patterns)
    assert got == want
    assert len(set(want.values())) >= (4 if count < 20 else 30)  # many rules win, not one catch-all


@pytest.mark.slow
def test_a_chunk_too_large_to_compile_as_one_pattern_is_split() -> None:
    # each pattern compiles alone; a chunk of them in one alternation exceeds RE2's memory for one program
    patterns = [f"x{i}y(?i)[a-z]{{200}}\\w{{200}}" for i in range(300)]
    with duckdb.connect() as con:
        con.execute("select regexp_matches('', ?)", [patterns[0]])
        with pytest.raises(duckdb.InvalidInputException, match="too large"):
            con.execute("select regexp_matches('', ?)", ["|".join(f"(?:{p})" for p in patterns[:classify.CHUNK])])
        names = [f"x{i}y" + "aB" * 200 for i in range(0, 300, 7)] + [f"x{i}y" + "a" * 399 for i in range(5)]
        got = classify.first_rules(con, names, patterns)
    assert got == per_pair(names, patterns)
    assert sorted(got.values()) == list(range(0, 300, 7))  # each long name its own rule; the short ones none


def ingested(folder: Path, rank: int, *kernels: str, db: Path) -> Path:
    """``db`` with a trace of one step in which ``kernels`` run one after another, ingested."""
    trace = TraceBuilder(rank=rank)
    trace.step(1, 0, 100_000)
    for n, name in enumerate(kernels):
        trace.kernel(name, 10_000 + 20_000 * n, 20_000 + 20_000 * n, launch_ns=1_000 + n)
    assert ingest_traces([trace.write(folder / f"rank{rank}.json")], db, threads=1).ok
    return db


def test_the_classes_follow_rules_added_and_names_ingested_on_the_same_connection(tmp_path: Path) -> None:
    db = ingested(tmp_path / "a", 0, "my_custom_allreduce_kernel", db=tmp_path / "w.duckdb")

    def classes(con: duckdb.DuckDBPyConnection) -> dict[str, tuple]:
        # the reports' statements keep the classes on the connection and bring them up to date (classify.ensure);
        # traceq.relation classifies for its statement and keeps nothing: the two agree
        kept = query.run(con, "gpu_classified", query_params()).select("name, class, category").fetchall()
        gpu_classified = relation(con, "gpu_classified")  # noqa: F841 (the SQL reads it by name)
        fresh = con.sql("select name, class, category from gpu_classified").fetchall()
        assert sorted(fresh) == sorted(kept)
        return {n: (c, cat) for n, c, cat in kept}

    with connect(db) as con:
        assert classes(con) == {"my_custom_allreduce_kernel": ("compute", "reduction")}  # a builtin rule
        rules = tmp_path / "rules.csv"
        rules.write_text("priority,pattern,class,category,collective\n5,^my_custom_allreduce,comm,custom,AllReduce\n")
        add_rules(con, rules)
        assert classes(con) == {"my_custom_allreduce_kernel": ("comm", "custom")}

        ingested(tmp_path / "b", 1, "my_custom_allreduce_v2", "ncclDevKernel_AllGather_RING_LL", db=db)
        assert classes(con) == {
            "my_custom_allreduce_kernel": ("comm", "custom"),
            "my_custom_allreduce_v2": ("comm", "custom"),
            "ncclDevKernel_AllGather_RING_LL": ("comm", "nccl"),
        }
        held = con.sql(f"select name from {classify.TABLE} order by name").fetchall()
        assert held == [("my_custom_allreduce_kernel",), ("my_custom_allreduce_v2",), ("ncclDevKernel_AllGather_RING_LL",)]


def test_a_user_rule_wins_over_a_builtin_one_of_the_same_priority(tmp_path: Path) -> None:
    db = ingested(tmp_path / "a", 0, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", db=tmp_path / "w.duckdb")
    priority = next(p for p, pattern, *_ in builtin_rules() if pattern.startswith("^nccl(Dev)?Kernel_AllReduce"))
    rules = tmp_path / "rules.csv"
    rules.write_text(f"priority,pattern,class,category,collective\n{priority},AllReduce_Sum,comm,mine,AllReduce\n")
    with connect(db) as con:
        add_rules(con, rules)
        gpu_classified = relation(con, "gpu_classified")  # noqa: F841 (the SQL reads it by name)
        assert con.sql("select category from gpu_classified").fetchall() == [("mine",)]


def test_a_statement_over_one_run_classifies_only_its_traces_names(tmp_path: Path) -> None:
    db = ingested(tmp_path / "a", 0, "my_gemm_a", db=tmp_path / "w.duckdb")
    ingested(tmp_path / "b", 0, "ncclDevKernel_AllReduce_b", db=db)
    with connect(db, read_only=True) as con:
        def held() -> set[str]:
            return {name for (name,) in con.sql(f"select name from {classify.TABLE}").fetchall()}

        classify.ensure(con, ["a"])
        assert held() == {"my_gemm_a"}
        classify.ensure(con, ["a"])  # again: the same
        assert held() == {"my_gemm_a"}
        classify.ensure(con)
        assert held() == {"my_gemm_a", "ncclDevKernel_AllReduce_b"}
        assert con.sql(f"select class from {classify.TABLE} where name = 'ncclDevKernel_AllReduce_b'").fetchall() == [("comm",)]
