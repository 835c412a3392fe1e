"""Across ranks (docs/explanation/across-ranks.md): collectives matched over the ranks of a run, wait vs transfer inside
each kernel, stragglers and bus bandwidth, on hand-made multi-rank traces worked out by hand, on the corpus'
multi-rank inputs, on random runs against a brute-force matcher written apart from the SQL
(tests/comm_reference.py), and on Parquet exports."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests import comm_reference, step_reference
from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.report import crossrank
from traceq.report.collectives import collective_scaling, collectives_report, instances_report, stragglers_report
from traceq.report.metrics import compute_metric, step_metrics
from traceq.report.selection import StepSelection
from traceq.store.warehouse import connect

US = 1000
MS = 1000 * US
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SEND = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "ampere_sgemm_128x64_nn"
EVERY_STEP = StepSelection(skip_steps=0, include_last=True, drop_incomplete=False)
SPLIT = ("comm_wait_us", "comm_transfer_us", "exposed_comm_wait_us", "exposed_comm_transfer_us")


def collective_args(kind: str = "allreduce", ranks: tuple[int, ...] = (0, 1, 2), nelems: int = 750, **more) -> dict:
    """record_param_comms-style args of one collective kernel in process group '0'."""
    out_nelems = nelems * len(ranks) if kind == "allgather" else nelems
    return {"Collective name": kind, "Process Group Name": "0", "Process Group Description": "default_pg",
            "Process Group Ranks": json.dumps(list(ranks)), "Group size": len(ranks), "In msg nelems": nelems,
            "Out msg nelems": out_nelems, "dtype": "Float", **more}


def write_run(root: Path, builders: dict[int, TraceBuilder], world_size: int | None = None) -> list[Path]:
    world = world_size or len(builders)
    return [b.write(root / f"rank{r}.json", distributedInfo={"backend": "nccl", "rank": r, "world_size": world})
            for r, b in builders.items()]


def late_rank_run(offset_ns: dict[int, int] | None = None) -> dict[int, TraceBuilder]:
    """Three ranks, one AllReduce each in step 1, ending together at 50 us: rank 0 [40,50) us, rank 1
    [43,50), rank 2 [47,50). Compute (gemm) [30,44) on rank 0, [30,45) on rank 1, [30,48) on rank 2.

    Transfer = the shortest kernel = 3 us; waits 7, 4, 0 us; rank 2 arrived last and made the others wait
    7 + 4 = 11 us. Each window is [30,50) us (first launched activity to the last end).
      rank 0: wait part [40,47), transfer [47,50); exposed = [44,50): wait [44,47) 3, transfer 3
      rank 1: wait part [43,47), transfer [47,50); exposed = [45,50): wait [45,47) 2, transfer 3
      rank 2: no wait, transfer [47,50); exposed = [48,50): transfer 2
    ``offset_ns``: shift one rank's clock (every timestamp of that rank) by that much.
    """
    starts = {0: 40, 1: 43, 2: 47}
    gemm_ends = {0: 44, 1: 45, 2: 48}
    out = {}
    for r in (0, 1, 2):
        shift = (offset_ns or {}).get(r, 0)
        t = TraceBuilder(rank=r)
        t.step(1, shift, 100 * US + shift)
        t.kernel(GEMM, 30 * US + shift, gemm_ends[r] * US + shift, launch_ns=5 * US + shift)
        t.kernel(ALL_REDUCE, starts[r] * US + shift, 50 * US + shift, stream=20, launch_ns=10 * US + shift,
                 **collective_args())
        out[r] = t
    return out


EXPECTED_SPLIT = {  # rank -> us, worked out in late_rank_run's docstring
    0: dict(comm_us=10, comm_wait_us=7, comm_transfer_us=3, exposed_comm_us=6, exposed_comm_wait_us=3,
            exposed_comm_transfer_us=3, arrived_last_count=0, wait_caused_us=0),
    1: dict(comm_us=7, comm_wait_us=4, comm_transfer_us=3, exposed_comm_us=5, exposed_comm_wait_us=2,
            exposed_comm_transfer_us=3, arrived_last_count=0, wait_caused_us=0),
    2: dict(comm_us=3, comm_wait_us=0, comm_transfer_us=3, exposed_comm_us=2, exposed_comm_wait_us=0,
            exposed_comm_transfer_us=2, arrived_last_count=1, wait_caused_us=11),
}


def ingest(tmp_path: Path, builders: dict[int, TraceBuilder], name: str = "job", world_size: int | None = None) -> Path:
    db = tmp_path / f"{name}.duckdb"
    assert ingest_traces(write_run(tmp_path / name, builders, world_size), db, threads=1).ok
    return db


def split_by_rank(db: Path) -> dict[int, dict]:
    with connect(db, read_only=True) as con:
        rows = step_metrics(con, selection=EVERY_STEP, cross_rank=True)
    keys = [*EXPECTED_SPLIT[0]]
    return {r["rank"]: {k: r[k] for k in keys} for r in rows.iter_rows(named=True)}


@pytest.mark.slow
@pytest.mark.parametrize("offset", [None, {1: 1 * MS}, {0: -3 * MS, 2: 250 * MS}], ids=["same clock", "rank 1 +1 ms",
                                                                                         "ranks 0 and 2 shifted"])
def test_one_late_rank_splits_comm_into_wait_and_transfer_as_worked_by_hand(tmp_path: Path, offset) -> None:
    db = ingest(tmp_path, late_rank_run(offset))
    assert split_by_rank(db) == EXPECTED_SPLIT  # a clock offset between ranks changes nothing
    rows = instances_report(db).table.sort("rank")
    assert rows["instance"].to_list() == [1, 1, 1]
    assert rows["wait_us"].to_list() == [7, 4, 0] and rows["transfer_us"].to_list() == [3, 3, 3]
    assert rows["arrived_last"].to_list() == [False, False, True]


@pytest.mark.slow
def test_collective_args_on_the_launching_record_param_comms_op_match_the_same(tmp_path: Path) -> None:
    """Most traces put the collective's arguments (Seq included) on the CPU op record_param_comms that
    launched the kernel, not on the kernel: the same run written that way gives the same answer."""
    builders = late_rank_run()
    for r, b in builders.items():
        for e in b.events:
            if e["name"] == ALL_REDUCE:
                args = {k: e["args"].pop(k) for k in list(e["args"]) if k in collective_args()}
                op = b._span("cpu_op", "record_param_comms", 9 * US, 12 * US, None)  # around the launch at 10 us
                op["args"].update(args, Seq=7)
                b.events.append(op)
    db = ingest(tmp_path, builders)
    assert split_by_rank(db) == EXPECTED_SPLIT
    rows = instances_report(db).table.sort("rank")
    assert rows["seq"].to_list() == [7, 7, 7] and rows["wait_us"].to_list() == [7, 4, 0]


def test_the_matched_kernels_are_a_relation_of_their_own(tmp_path: Path) -> None:
    import traceq

    with traceq.connect(ingest(tmp_path, late_rank_run()), read_only=True) as con:
        rows = traceq.relation(con, "comm_instances").order("rank").fetchall()
        names = traceq.relation(con, "comm_instances").columns
    waits = [dict(zip(names, r))["wait_ns"] for r in rows]
    assert waits == [7 * US, 4 * US, 0]


def test_stragglers_name_the_late_rank_and_the_wait_it_caused(tmp_path: Path) -> None:
    report = stragglers_report(ingest(tmp_path, late_rank_run()), selection=EVERY_STEP)
    table, notes = report.table, report.notes
    assert table["rank"].to_list() == [2, 0, 1]  # the rank that caused the most waiting first
    first = table.row(0, named=True)
    assert (first["arrived_last_count"], first["arrived_last_share"], first["wait_caused_us"]) == (1, 1.0, 11)
    assert table["matched_count"].to_list() == [1, 1, 1]
    assert "run job: 3 of 3 communication kernels matched, 1 collective instances over 3 ranks" in notes


def test_bus_bandwidth_follows_nccl_tests(tmp_path: Path) -> None:
    """750 floats = 3,000 bytes moved in 3 us: algbw 1 GB/s; AllReduce over 3 ranks: busbw = 2(3−1)/3 = 4/3."""
    table = collectives_report(ingest(tmp_path, late_rank_run()), selection=EVERY_STEP).table
    row = table.row(0, named=True)
    assert (row["collective_type"], row["count"], row["size_bytes"], row["size_bucket"]) == ("AllReduce", 1, 3000, "2 KiB-4 KiB")
    assert (row["transfer_us"], row["wait_us"], row["group_size"], row["basis"]) == (3, 11 / 3, 3, "matched")
    assert row["algbw_gbps"] == pytest.approx(1.0) and row["busbw_gbps"] == pytest.approx(4 / 3)


# nccl-tests: busbw = algbw x factor (doc/PERFORMANCE.md; AllToAll: AlltoAllGetBw in src/alltoall.cu)
NCCL_TESTS_FACTORS = {
    "AllReduce": {2: 1.0, 4: 1.5, 8: 1.75, 16: 1.875},
    "ReduceScatter": {2: 0.5, 4: 0.75, 8: 0.875, 16: 0.9375},
    "AllGather": {2: 0.5, 4: 0.75, 8: 0.875, 16: 0.9375},
    "AllToAll": {2: 0.5, 4: 0.75, 8: 0.875, 16: 0.9375},
    "Broadcast": {2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0},
    "Reduce": {2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0},
    "SendRecv": {2: 1.0},
}


def test_busbw_factors_are_the_nccl_tests_table(tmp_path: Path) -> None:
    with connect(tmp_path / "w.duckdb") as con:
        for kind, by_n in NCCL_TESTS_FACTORS.items():
            for n, factor in by_n.items():
                assert con.execute("select busbw_factor(?, ?)", [kind, n]).fetchall()[0][0] == pytest.approx(factor), (kind, n)
        assert con.execute("select busbw_factor('Other', 8)").fetchall()[0][0] is None


def test_ranks_that_saw_different_numbers_of_a_collective_are_not_matched(tmp_path: Path) -> None:
    """Ranks 0 and 2 ran two AllGathers, rank 1 one: order cannot pair them, so none is matched; the
    AllReduce still is."""
    builders = late_rank_run()
    for r, b in builders.items():
        for k in range(1 if r == 1 else 2):
            b.kernel(ALL_GATHER, (60 + 10 * k) * US, (65 + 10 * k) * US, stream=20, launch_ns=20 * US,
                     **collective_args("allgather"))
    rows = instances_report(ingest(tmp_path, builders)).table
    gathers = rows.filter(pl.col("collective_type") == "AllGather")
    assert gathers.height == 5 and not gathers["matched"].any()
    assert set(gathers["reason"]) == {"ranks saw different numbers of kernels"}
    assert gathers["wait_us"].to_list() == [0] * 5 and gathers["transfer_us"].to_list() == [5] * 5
    assert rows.filter(pl.col("collective_type") == "AllReduce")["matched"].all()


def test_seq_matches_collectives_that_order_would_pair_wrongly(tmp_path: Path) -> None:
    """Two AllReduces, Seq 1 and 2, on two ranks. Rank 1 runs Seq 2 on another stream and starts it first:
    in time order it would pair rank 0's Seq 1 with rank 1's Seq 2. By Seq: instance 1 = rank 0 [10,30) us
    (20) + rank 1 [25,30) (5): transfer 5, rank 0 waited 15; instance 2 = rank 0 [40,44) (4) + rank 1
    [12,20) (8): transfer 4, rank 1 waited 4."""
    spans = {0: {1: (10, 30), 2: (40, 44)}, 1: {1: (25, 30), 2: (12, 20)}}
    builders = {}
    for r, by_seq in spans.items():
        t = TraceBuilder(rank=r)
        t.step(1, 0, 100 * US)
        for seq, (a, b) in by_seq.items():
            t.kernel(ALL_REDUCE, a * US, b * US, stream=20 + seq, launch_ns=2 * US,
                     **collective_args(ranks=(0, 1), Seq=seq))
        builders[r] = t
    rows = instances_report(ingest(tmp_path, builders)).table.sort("seq", "rank")
    assert rows["seq"].to_list() == [1, 1, 2, 2] and rows["matched"].all()
    assert rows["transfer_us"].to_list() == [5, 5, 4, 4]
    assert rows["wait_us"].to_list() == [15, 0, 0, 4]
    assert rows["arrived_last"].to_list() == [False, True, True, False]


def test_a_group_the_run_holds_only_part_of_is_not_matched_and_says_why(tmp_path: Path) -> None:
    builders = late_rank_run()
    for b in builders.values():  # the kernels name a group of 4 ranks; the run holds 3 of them
        for e in b.events:
            if e["name"] == ALL_REDUCE:
                e["args"].update({"Process Group Ranks": "[0, 1, 2, 3]", "Group size": 4})
        b.kernel(SEND, 60 * US, 70 * US, stream=30, launch_ns=20 * US, **collective_args("send"))
    db = ingest(tmp_path, builders, world_size=4)
    rows = instances_report(db).table
    reasons = dict(rows.group_by("collective_type").agg(pl.col("reason").unique()).iter_rows())
    assert reasons == {"AllReduce": ["the run holds 3 of the group's 4 ranks"], "Send": ["point-to-point"]}
    split = split_by_rank(db)
    for r in (0, 1, 2):  # unmatched: all transfer
        assert split[r]["comm_wait_us"] == 0 and split[r]["comm_transfer_us"] == split[r]["comm_us"]
    report = collectives_report(db, selection=EVERY_STEP)
    table, notes = report.table, report.notes
    assert set(table["basis"]) == {"kernel duration (lower bound)"} and table["wait_us"].is_null().all()
    assert any("0 of 6 communication kernels matched" in n and "3 the run holds 3 of the group's 4 ranks" in n
               and "3 point-to-point (Send)" in n for n in notes)


def _one_allreduce_per_rank(ranks_args: dict[int, dict], durations_us: dict[int, int] | None = None) -> dict[int, TraceBuilder]:
    """One AllReduce per rank in step 1, ending at 50 us, lasting durations_us[r] (default 10 - r), with
    the given args on each rank's kernel."""
    out = {}
    for r, args in ranks_args.items():
        dur = (durations_us or {}).get(r, 10 - r)
        t = TraceBuilder(rank=r)
        t.step(1, 0, 100 * US)
        t.kernel(ALL_REDUCE, (50 - dur) * US, 50 * US, stream=20, launch_ns=10 * US, **args)
        out[r] = t
    return out


def _reasons(db: Path) -> dict[int, str | None]:
    return dict(instances_report(db).table.select("rank", "reason").iter_rows())


def test_a_group_whose_ranks_describe_it_differently_is_counted_once(tmp_path: Path) -> None:
    args = {r: collective_args(ranks=(0, 1)) for r in (0, 1)}
    args[1]["Process Group Description"] = "undefined"
    db = ingest(tmp_path, _one_allreduce_per_rank(args))
    rows = instances_report(db).table
    assert rows.height == 2 and rows["matched"].all() and rows["wait_us"].sort().to_list() == [0, 1]
    table = stragglers_report(db, selection=EVERY_STEP).table
    assert table["matched_count"].to_list() == [1, 1] and table["wait_caused_us"].to_list() == [1, 0]
    assert collectives_report(db, selection=EVERY_STEP).table.height == 1


@pytest.mark.slow
def test_ranks_that_cannot_be_the_group_are_not_matched(tmp_path: Path) -> None:
    """Never guessed: files without a rank; ranks outside the member list; ranks that disagree on the
    list; two groups of one name without member lists; a kernel of zero length."""
    unknown = tmp_path / "unknown"
    files = [b.write(unknown / f"part{r}.json") for r, b in _one_allreduce_per_rank(
        {r: collective_args(ranks=(0, 1)) for r in (0, 1)}).items()]
    for f in files:  # no rank anywhere: ingest gives them ranks -1 and -2 of their own
        doc = json.loads(f.read_text())
        doc.pop("distributedInfo")
        f.write_text(json.dumps(doc))
    db = tmp_path / "unknown.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    assert set(_reasons(db).values()) == {"rank unknown"}

    outside = {0: collective_args(ranks=(0, 1)), 2: collective_args(ranks=(0, 1))}
    db = ingest(tmp_path, _one_allreduce_per_rank(outside), "outside", world_size=3)
    assert set(_reasons(db).values()) == {"ranks outside the group's member list hold it"}

    disagree = {0: collective_args(ranks=(0, 1)), 1: collective_args(ranks=(0, 1, 2))}
    db = ingest(tmp_path, _one_allreduce_per_rank(disagree), "disagree", world_size=3)
    assert set(_reasons(db).values()) == {"ranks disagree on the group's member list"}

    nameless = {}
    for r in range(4):  # TP groups {0, 1} and {2, 3}, both named "1", without member lists
        nameless[r] = collective_args(ranks=(0, 1))
        nameless[r].pop("Process Group Ranks")
        nameless[r]["Process Group Name"] = "1"
    db = ingest(tmp_path, _one_allreduce_per_rank(nameless, {r: 5 + r for r in range(4)}), "nameless")
    assert set(_reasons(db).values()) == {"4 ranks hold a group of 2: groups of one name, without member lists"}

    zero = {r: collective_args(ranks=(0, 1)) for r in (0, 1)}
    db = ingest(tmp_path, _one_allreduce_per_rank(zero, {0: 10, 1: 0}), "zero")
    assert set(_reasons(db).values()) == {"a kernel of the instance has zero length"}


def test_a_rank_list_cut_short_names_no_members(tmp_path: Path) -> None:
    """Kineto cuts long lists: "[0, 1, ...]". With a group size the group still matches; without one,
    its size is unknown (not 3, counting the cut)."""
    cut = {r: {**collective_args(ranks=(0, 1)), "Process Group Ranks": "[0, 1, ...]"} for r in (0, 1)}
    db = ingest(tmp_path, _one_allreduce_per_rank(cut), "sized")
    assert instances_report(db).table["matched"].all()
    for args in cut.values():
        args.pop("Group size")
    db = ingest(tmp_path, _one_allreduce_per_rank(cut), "unsized")
    assert set(_reasons(db).values()) == {"no group size"}


@pytest.mark.slow
def test_cross_rank_tables_compare_ranks_over_the_steps_they_all_have(corpus_db: Path) -> None:
    """In the merged 4-rank file the last step was cut on ranks 1-3 only, so with --include-last step 11 is
    rank 0's alone: stragglers leave it out and say so, and the waiting caused equals the waiting done. By
    default step 11, every rank's last, is left out anyway."""
    for selection in (StepSelection(), StepSelection(include_last=True)):
        report = stragglers_report(corpus_db, runs=["fused_traces"], selection=selection)
        table, notes = report.table, report.notes
        assert table["matched_count"].to_list() == [14] * 4
        assert table["wait_caused_us"].sum() == pytest.approx(table["wait_us"].sum(), abs=1e-6)
        left_out = "run fused_traces: ranks are compared over the steps every rank has; left out: step 11 (1 of 4 ranks)"
        assert (left_out in notes) == selection.include_last


def test_cli_reports_collectives_stragglers_and_split_metrics(tmp_path: Path) -> None:
    db = str(ingest(tmp_path, late_rank_run()))
    runner = CliRunner()
    out = runner.invoke(app, ["report", "--db", db, "--metric", "exposed_comm,exposed_comm_wait,exposed_comm_transfer",
                              "--by", "run,rank", "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["rank"]: r for r in json.loads(out.stdout)}
    for r, expected in EXPECTED_SPLIT.items():
        assert rows[r]["exposed_comm_wait_us"] == expected["exposed_comm_wait_us"]
        assert rows[r]["exposed_comm_wait_us"] + rows[r]["exposed_comm_transfer_us"] == rows[r]["exposed_comm_us"]
    out = runner.invoke(app, ["collectives", "--db", db, "--format", "csv"])
    assert out.exit_code == 0, out.output
    header, line = out.stdout.strip().splitlines()
    assert header.split(",")[:6] == ["run", "collective_type", "nccl_algo", "nccl_proto", "process_group", "size_bucket"]
    assert line.split(",")[:4] == ["job", "AllReduce", "", ""]  # ncclDevKernel_..._RING_LL names no algorithm
    assert "busbw_gbps" in header
    out = runner.invoke(app, ["stragglers", "--db", db])
    assert out.exit_code == 0 and "wait_caused_us" in out.stdout
    assert "3 of 3 communication kernels matched" in out.stderr
    out = runner.invoke(app, ["collectives", "--db", db, "--instances", "--format", "json"])
    assert sorted(r["wait_us"] for r in json.loads(out.stdout)) == [0, 4, 7]
    out = runner.invoke(app, ["scaling", "--db", db, "--metric", "busbw_gbps", "--format", "json"])
    assert out.exit_code == 0, out.output
    assert [r["busbw_gbps"] for r in json.loads(out.stdout)] == [pytest.approx(4 / 3)]
    out = runner.invoke(app, ["scaling", "--db", db, "--metric", "busbw"])
    assert out.exit_code == 1 and "busbw_gbps" in out.output
    out = runner.invoke(app, ["scaling", "--db", db, "--metric", "busbw_gbps", "--html", str(Path(db).with_suffix(".html"))])
    assert out.exit_code == 1 and "--html" in out.output and not Path(db).with_suffix(".html").exists()
    out = runner.invoke(app, ["stragglers", "--db", db, "--steps", "50:60"])
    assert out.exit_code == 1 and "no step is selected" in out.output


def test_collective_scaling_orders_runs_by_world_size(tmp_path: Path) -> None:
    """Two runs of the same job at 2 and 3 ranks: one row per (type, run), smaller world first."""
    two = {r: b for r, b in late_rank_run().items() if r < 2}
    for b in two.values():
        for e in b.events:
            if e["name"] == ALL_REDUCE:
                e["args"].update({"Process Group Ranks": "[0, 1]", "Group size": 2})
    files = write_run(tmp_path / "small", two) + write_run(tmp_path / "big", late_rank_run())
    db = tmp_path / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    table = collective_scaling(db, "transfer_us", selection=EVERY_STEP).table
    assert table.select("run", "world_size", "transfer_us").rows() == [("small", 2, 7.0), ("big", 3, 3.0)]


# ----------------------------------------------------------------------------------------- corpus


def test_the_merged_four_rank_rccl_file_matches_every_collective(corpus_db: Path) -> None:
    rows = instances_report(corpus_db, runs=["fused_traces"]).table
    assert rows.height == 84 and rows["matched"].all()
    assert rows["instance"].n_unique() == 21
    assert rows.group_by("instance").agg(pl.col("rank").n_unique())["rank"].to_list() == [4] * 21
    per = rows.group_by("instance").agg(pl.col("collective_type").first(), pl.col("transfer_us").first(),
                                        pl.col("dur_us").min(), pl.col("arrived_last").sum())
    assert (per["arrived_last"] == 1).all()
    # all-reduces: transfer = the shortest kernel; broadcasts (rooted, one clock) by start time: see
    # tests/test_collective_types.py
    reduce = per.filter(pl.col("collective_type") == "AllReduce")
    assert reduce.height == 15 and (reduce["transfer_us"] == reduce["dur_us"]).all()
    assert set(rows.filter(pl.col("collective_type") == "Broadcast", pl.col("arrived_last"))["rank"]) == {3}


def test_the_trace_filter_pair_says_why_nothing_matches(corpus_db: Path) -> None:
    rows = instances_report(corpus_db, runs=["trace_filter"]).table
    assert rows.height == 20 and not rows["matched"].any()
    # SendRecv kernels, typed by the nccl:* annotations around their launches (tests/test_collective_types.py)
    assert set(rows["reason"]) == {"no process group"}
    assert set(rows["collective_type"]) == {"AllGather", "AllReduce", "AllToAll"}
    notes = collectives_report(corpus_db, runs=["trace_filter"]).notes
    assert ("run trace_filter: 0 of 20 communication kernels matched; unmatched (counted as transfer): 20 no process "
            "group (AllGather, AllReduce, AllToAll); the run holds 2 of its 128 ranks") in notes


@pytest.mark.slow
def test_exposed_wait_and_transfer_sum_to_exposed_comm_on_every_corpus_trace(corpus_db: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        for whole in (False, True):
            rows = step_metrics(con, whole_trace=whole, selection=EVERY_STEP, cross_rank=True)
            rows = rows.filter(pl.col("device").is_not_null())
            assert rows.height >= 30  # every corpus trace's windows (30 whole-trace ones)
            for part, total in (("exposed_comm", "exposed_comm_ns"), ("comm", "comm_ns")):
                bad = rows.filter(pl.col(f"{part}_wait_ns") + pl.col(f"{part}_transfer_ns") != pl.col(total))
                assert bad.height == 0, bad.select("run", "rank", "step", f"{part}_wait_ns", f"{part}_transfer_ns", total)
    wait = compute_metric(corpus_db, "exposed_comm_wait_us", runs=["fused_traces"])
    assert wait.filter(pl.col("rank") != 3)["exposed_comm_wait_us"].min() > 5000  # ranks 0-2 wait for rank 3


@pytest.mark.slow
def test_reports_on_a_parquet_export_equal_the_warehouse(tmp_path: Path) -> None:
    db = ingest(tmp_path, late_rank_run())
    out = tmp_path / "pq"
    result = CliRunner().invoke(app, ["export", "--db", str(db), "--parquet", str(out)])
    assert result.exit_code == 0, result.output
    assert collectives_report(out, selection=EVERY_STEP).table.equals(collectives_report(db, selection=EVERY_STEP).table)
    assert stragglers_report(out, selection=EVERY_STEP).table.equals(stragglers_report(db, selection=EVERY_STEP).table)
    assert compute_metric(out, list(SPLIT)).equals(compute_metric(db, list(SPLIT)))


# ------------------------------------------------------------------ random runs vs the brute-force matcher

STEP_NS = 200 * US
GROUPS = {"0": None, "1": (0, 1)}  # process group name -> its ranks (None: every rank of the run)


@st.composite
def random_run(draw) -> dict[int, TraceBuilder]:
    """2-4 ranks, 1-3 steps, up to 6 collectives in one or two process groups (with or without Seq), each
    rank arriving at its own time and finishing at about the same time; random compute beside them; each
    rank's clock offset at random; sometimes one rank misses a collective."""
    n = draw(st.integers(2, 4))
    steps = draw(st.integers(1, 3))
    with_seq = draw(st.booleans())
    plan = draw(st.lists(st.tuples(st.sampled_from(["allreduce", "allgather", "reducescatter", "broadcast"]),
                                   st.sampled_from(sorted(GROUPS))), min_size=1, max_size=6))
    missing = draw(st.none() | st.tuples(st.integers(0, n - 1), st.integers(0, len(plan) - 1)))
    builders = {}
    for r in range(n):
        shift = draw(st.integers(-10**6, 10**6))
        t = TraceBuilder(rank=r)
        for s in range(steps):
            t.step(s + 1, s * STEP_NS + shift, (s + 1) * STEP_NS + shift)
            for _ in range(draw(st.integers(0, 2))):
                a = draw(st.integers(0, 190 * US))
                b = draw(st.integers(a + 1, 200 * US))
                t.kernel(GEMM, s * STEP_NS + a + shift, s * STEP_NS + b + shift, launch_ns=s * STEP_NS + 500 + shift)
        seq = dict.fromkeys(GROUPS, 0)
        for i, (kind, pg) in enumerate(plan):
            ranks = GROUPS[pg] or tuple(range(n))
            seq[pg] += 1
            if r not in ranks or missing == (r, i):
                continue
            s = i % steps
            base = s * STEP_NS + 10 * US + (i // steps) * 30 * US + shift
            start = base + draw(st.integers(0, 20 * US))
            end = base + 22 * US + draw(st.integers(0, 3 * US))
            extra = {"Seq": seq[pg]} if with_seq else {}
            args = collective_args(kind, ranks, nelems=draw(st.integers(1, 10**6)), **extra)
            args["Process Group Name"] = pg
            t.kernel(ALL_GATHER if kind == "allgather" else ALL_REDUCE, start, end, stream=20 + int(pg),
                     launch_ns=s * STEP_NS + 500 + shift, **args)
        builders[r] = t
    return builders


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=random_run())
def test_random_runs_agree_with_the_brute_force_matcher(tmp_path_factory: pytest.TempPathFactory, run) -> None:
    root = tmp_path_factory.mktemp("random")
    files = write_run(root / "job", run)
    db = root / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    kernels = comm_reference.instances(files)
    sizes: dict = {}  # a matched instance's size: the largest of its kernels'
    for k in kernels:
        if k["matched"] and k["size_bytes"] is not None:
            sizes[k["instance"]] = max(sizes.get(k["instance"], 0), k["size_bytes"])
    expected = {(k["rank"], k["start_ns"], k["end_ns"]): (k["matched"], k["reason"], k["wait_ns"], k["transfer_ns"],
                                                         k["arrived_last"], sizes.get(k["instance"], k["size_bytes"]))
                for k in kernels}
    with connect(db, read_only=True) as con, crossrank.matched(con) as table:
        got = {(r[0], r[1], r[2]): tuple(r[3:]) for r in con.execute(
            f"select rank, start_ns, end_ns, matched, reason, wait_ns, transfer_ns, arrived_last, size_bytes from {table}"
        ).fetchall()}
        rows = step_metrics(con, selection=EVERY_STEP, cross_rank=True)
        whole = step_metrics(con, whole_trace=True, cross_rank=True)
    assert {k: v for k, v in got.items() if expected.get(k) != v} == {k: v for k, v in expected.items() if got.get(k) != v}
    keys = (*comm_reference.SPLIT_KEYS, *comm_reference.STRAGGLER_KEYS)
    launched = {(w["rank"], w["device"], w["step"]): w["launched"] for f in files for w in step_reference.step_windows(f)}
    want = {(w["rank"], w["device"], w["step"]): {k: w[k] for k in keys}
            for w in comm_reference.window_metrics(files) if launched[(w["rank"], w["device"], w["step"])]}
    have = {(r["rank"], r["device"], r["step"]): {k: r[k] for k in keys} for r in rows.iter_rows(named=True)
            if r["device"] is not None and r["device"] >= 0}  # not a rank left without device activity
    assert have == want
    want = {(w["rank"], w["device"]): {k: w[k] for k in keys} for w in comm_reference.whole_trace_metrics(files)}
    have = {(r["rank"], r["device"]): {k: r[k] for k in keys} for r in whole.iter_rows(named=True) if r["device"] >= 0}
    assert have == want


@pytest.mark.slow
def test_reports_hold_duckdb_to_the_memory_limit_and_say_so_for_a_bad_one(tmp_path: Path, monkeypatch) -> None:
    db = ingest(tmp_path, late_rank_run())
    with connect(db, read_only=True) as con:
        assert con.execute("select current_setting('memory_limit')").fetchall()[0][0] == "1.8 GiB"  # 2GB
    monkeypatch.setenv("TRACEQ_MEMORY_LIMIT", "512MB")
    with connect(db, read_only=True) as con:
        assert con.execute("select current_setting('memory_limit')").fetchall()[0][0] == "488.2 MiB"
    out = tmp_path / "pq"
    assert CliRunner().invoke(app, ["export", "--db", str(db), "--parquet", str(out)]).exit_code == 0
    with connect(out, read_only=True) as con:  # an in-memory database spills to a traceq scratch directory
        spill = con.execute("select current_setting('temp_directory')").fetchall()[0][0]
        assert Path(spill).parent.name.startswith("traceq-") and (Path(spill).parent / "owner.lock").exists()
    monkeypatch.setenv("TRACEQ_MEMORY_LIMIT", "lots")
    result = CliRunner().invoke(app, ["stragglers", "--db", str(db)])
    assert result.exit_code == 1 and "TRACEQ_MEMORY_LIMIT='lots': give a size such as 2GB or 512MB" in result.output
