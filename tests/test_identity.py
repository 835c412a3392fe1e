"""Trace identity over rows (traceq.identity), on hand-made (run, rank, step) rows: which file is refused for a
step its run already holds, in which words, and which rank a file that names none gets. Then the same two
files through every path that stores or reports traces (ingest, import-parquet, the Perfetto engine,
ingest-cluster): the same refusal, word for word."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_module, skip_or_fail
from traceq.errors import ConfigError
from traceq.identity import Claim, held_steps, next_rankless, overlaps, rankless_ranks, refuse_overlap


def claims(trace: int, path: str, run: str, rank: int, steps: list[int]) -> list[Claim]:
    return [Claim(trace, path, run, rank, s) for s in steps]


def test_a_file_holding_steps_its_run_holds_of_the_same_rank_is_refused_in_one_wording() -> None:
    held = claims(1, "/w/a.json", "job", 0, [1, 2, 3])
    refused = overlaps(held, claims(2, "/w/b.json", "job", 0, [2, 3, 4]))
    assert len(refused) == 1
    o = refused[0]
    assert (o.trace, o.path, o.other, o.run, o.rank, o.steps) == (2, "/w/b.json", "/w/a.json", "job", 0, (2, 3))
    assert o.message() == ("/w/b.json: run job already holds steps 2..3 of rank 0 from /w/a.json; the same trace "
                           "twice, or traces of two jobs in one run? Give it another run (--name NAME)")
    assert o.import_message("/x/pq") == (
        "/w/b.json: run job already holds steps 2..3 of rank 0 from /w/a.json; the same trace twice, or traces of "
        "two jobs in one run? Nothing of /x/pq was imported; import it into another warehouse (--db)")
    with pytest.raises(ConfigError) as caught:
        refuse_overlap(held, claims(2, "/w/b.json", "job", 0, [2, 3, 4]))
    assert caught.value.message == o.message()


def test_a_rank_the_user_or_the_file_name_gave_is_named_as_a_fix() -> None:
    refused = overlaps(claims(1, "a", "job", 0, [1]), claims(2, "rank0.json", "job", 0, [1]), rank_given=[2])
    assert refused[0].message().endswith("Give it another run (--name NAME) or another rank (--rank N)")


def test_the_steps_held_are_said_as_one_step_a_range_a_count_or_the_whole_timeline() -> None:
    assert held_steps([7]) == "step 7"
    assert held_steps([-1]) == "the whole timeline (no steps)"
    assert held_steps([3, 4, 5]) == "steps 3..5"
    assert held_steps([3, 5, 9]) == "3 steps in 3..9"


def test_other_steps_other_ranks_and_other_runs_are_accepted() -> None:
    held = claims(1, "a", "job", 0, [1, 2])
    assert overlaps(held, claims(2, "cycle2", "job", 0, [11, 12])) == []  # a later profiling cycle of rank 0
    assert overlaps(held, claims(3, "rank1", "job", 1, [1, 2])) == []  # another rank
    assert overlaps(held, claims(4, "other", "other_job", 0, [1, 2])) == []  # another run
    refuse_overlap(held, claims(2, "cycle2", "job", 0, [11, 12]))  # nothing raised


def test_new_files_are_checked_in_order_against_held_then_each_other_and_a_refused_one_holds_nothing() -> None:
    held = claims(1, "a", "job", 0, [1])
    new = [*claims(2, "b", "job", 0, [5, 6]), *claims(3, "c", "job", 0, [1, 6]), *claims(4, "d", "job", 0, [1]),
           *claims(5, "e", "job", 1, [6, 5])]
    refused = overlaps(held, new)
    # c clashes with a (step 1, the lowest) and b (step 6): the lowest step's holder is named, with its steps only
    assert [(o.path, o.other, o.rank, o.steps) for o in refused] == [("c", "a", 0, (1,)), ("d", "a", 0, (1,))]
    # c was refused: its step 6 holds nothing, so a file after it with step 6 of rank 0 is taken
    assert overlaps([], [*claims(3, "c", "job", 0, [1]), *claims(6, "f", "job", 0, [6])]) == []
    # the lowest rank in clash is named
    two = overlaps(claims(1, "a", "job", 0, [1]) + claims(1, "a", "job", 3, [1]),
                   claims(2, "b", "job", 3, [1]) + claims(2, "b", "job", 0, [1]))
    assert (two[0].rank, two[0].steps) == (0, (1,))


def test_a_file_named_again_by_its_trace_is_not_its_own_clash() -> None:
    """Rows of one trace given as held and new (a caller's gather that includes it) are no overlap."""
    assert overlaps(claims(2, "b", "job", 0, [1]), claims(2, "b", "job", 0, [1])) == []


def test_rankless_files_are_numbered_per_run_below_what_the_run_holds() -> None:
    assert next_rankless([]) == -1
    assert next_rankless([0, 3, -1, -4]) == -5
    assert next_rankless([2]) == -1  # ranks a file names do not count: -1 is free
    # two runs of their own get -1 each; a job's two rank-less files -1, -2; a named file gets None
    assert rankless_ranks(["job/a", "job/b", None, "job", "job"]) == [-1, -1, None, -1, -2]
    # below what each run holds already, whatever other runs hold
    held = {"job": [0, 1, -1, -2], "other": [-7]}
    assert rankless_ranks(["job", "new", "job", "other"], held) == [-3, -1, -4, -8]


# ---------------------------------------------------------------------------------------------
# every path that stores or reports traces: the same conflict in the same words


@pytest.fixture(scope="module")
def two_copies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """a.json and b.json: rank 0 of run job (distributedInfo), steps 1 and 2 each, other bytes; and the words
    every path says b.json's refusal in (a.json first)."""
    from tests.test_parquet import rank_trace

    root = tmp_path_factory.mktemp("identity").resolve()
    a = rank_trace(0).write(root / "job" / "a.json")
    b = rank_trace(0).write(root / "job" / "b.json", traceName="again")
    return a, b, (f"{b}: run job already holds steps 1..2 of rank 0 from {a}; the same trace twice, or traces of "
                  "two jobs in one run?")


FIX = "Give it another run (--name NAME)"


def test_ingest_refuses_the_second_copy_in_the_one_wording(two_copies: tuple[Path, Path, str], tmp_path: Path) -> None:
    from traceq.ingest import ingest_traces

    a, b, statement = two_copies
    summary = ingest_traces([a, b], tmp_path / "w.duckdb", threads=1)
    assert [f.status for f in summary.files] == ["ingested", "failed"]
    assert summary.files[1].message == f"{statement} {FIX}"


def test_import_parquet_refuses_an_export_holding_the_copy_in_the_one_wording(
    two_copies: tuple[Path, Path, str], tmp_path: Path
) -> None:
    from traceq.ingest import ingest_traces
    from traceq.store.export import export_parquet, import_parquet

    a, b, statement = two_copies
    assert ingest_traces([a], tmp_path / "first.duckdb", threads=1).ok
    assert ingest_traces([b], tmp_path / "second.duckdb", threads=1).ok
    export_parquet(tmp_path / "second.duckdb", tmp_path / "pq")
    with pytest.raises(ConfigError) as refused:
        import_parquet(tmp_path / "pq", tmp_path / "first.duckdb")
    assert refused.value.message == f"{statement} Nothing of {tmp_path / 'pq'} was imported; import it into another warehouse (--db)"


def test_the_perfetto_engine_refuses_the_second_copy_in_the_one_wording(two_copies: tuple[Path, Path, str]) -> None:
    from tests.test_perfetto_engine import BINARY
    from traceq.perfetto.engine import perfetto_report

    if not BINARY.is_file():
        skip_or_fail(f"{BINARY} is absent: Perfetto's trace processor, built for this machine (../shared/bin)")
    a, b, statement = two_copies
    with pytest.raises(ConfigError) as refused:
        perfetto_report([a, b], "exposed_comm", binary=BINARY)
    assert refused.value.message == f"{statement} {FIX}"


def test_ingest_cluster_refuses_the_second_copy_in_the_one_wording(two_copies: tuple[Path, Path, str], tmp_path: Path) -> None:
    require_module("distributed", 'Dask is optional: pip install "traceq[dask]" to run the cluster tests')
    from distributed import Client, LocalCluster

    from traceq.ingest.cluster import ingest_with_dask

    a, b, statement = two_copies
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        summary = ingest_with_dask([a, b], tmp_path / "pq", client=client)
    assert [f.status for f in summary.files] == ["ingested", "failed"]
    assert summary.files[1].message == f"{statement} {FIX}"
