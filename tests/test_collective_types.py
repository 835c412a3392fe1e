"""Collective types (DESIGN §9): the collective's own metadata, then the `nccl:<op>` annotation around
the launch, then the kernel name. NCCL runs all-to-all (and, in these traces, all-reduce and all-gather)
as SendRecv kernels; on real traces the annotations, read here straight from the JSON, say what each is."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import corpus_path
from traceq.ingest import ingest_traces
from traceq.report.selection import relation
from traceq.store.warehouse import connect

BY_HAND = {"nccl:all_to_all": "AllToAll", "nccl:all_reduce": "AllReduce", "nccl:_all_gather_base": "AllGather",
           "nccl:broadcast": "Broadcast"}


def annotated_types(path: Path) -> Counter:
    """(kernel name prefix, type) of every comm kernel without a "Collective name", by the innermost
    nccl:* annotation on its launching thread around its launch, from the raw JSON."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "Runtime") and "correlation" in e.get("args", {})}
    notes = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    out: Counter = Counter()
    for k in events:
        if k.get("cat") != "kernel" or not k["name"].startswith("ncclKernel_SendRecv"):
            continue
        launch = launches[k["args"]["correlation"]]
        around = [a for a in notes if a["tid"] == launch["tid"] and a["pid"] == launch["pid"]
                  and a["ts"] <= launch["ts"] <= a["ts"] + a["dur"]]
        inner = max(around, key=lambda a: a["ts"])
        out[BY_HAND[inner["name"]]] += 1
    return out


@pytest.mark.slow
@pytest.mark.parametrize("relative", ["hta/trace_diff/control/control.json.gz", "hta/trace_filter/sampled_rank-0.json.gz",
                                      "hta/trace_filter/sampled_rank-1.json.gz"])
def test_sendrecv_kernels_take_the_type_of_the_annotation_around_their_launch(tmp_path: Path, relative: str) -> None:
    path = corpus_path(relative)
    expected = annotated_types(path)
    assert sum(expected.values()) >= 10 and len(expected) >= 1
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    with connect(db, read_only=True) as con:
        gpu_activity = relation(con, "gpu_activity")  # noqa: F841 (the SQL reads it by name)
        got = Counter(dict(con.sql(
            "select collective_type, count(*) from gpu_activity where name like 'ncclKernel_SendRecv%' group by all"
        ).fetchall()))
    assert got == expected
    assert "SendRecv" not in got


def test_the_corpus_figures_by_hand() -> None:
    """What the annotations say, counted once by hand from the files: control's 42 SendRecv kernels are
    all-to-alls; each trace_filter rank has 4 all-to-all, 4 all-reduce and 2 all-gather."""
    assert annotated_types(corpus_path("hta/trace_diff/control/control.json.gz")) == Counter(AllToAll=42)
    for rank in (0, 1):
        assert annotated_types(corpus_path(f"hta/trace_filter/sampled_rank-{rank}.json.gz")) == Counter(
            AllToAll=4, AllReduce=4, AllGather=2)


# --- rooted collectives (DESIGN §9): the root's kernel ends first, so the shortest kernel is not the last
# to arrive. The merged 4-rank RCCL file has every rank on one host's clock: arrival by start time.

MERGED = "amd_hpctraining/fused_traces/merged_all_events.json.gz"


def broadcasts_by_hand(path: Path) -> list[dict[int, tuple[int, int]]]:
    """Per Broadcast instance (the k-th broadcast kernel of each rank in time order): rank -> (start_ns,
    dur_ns), exact, from the raw JSON."""
    from decimal import Decimal

    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    per_rank: dict[int, list[tuple[int, int]]] = {}
    for e in doc["traceEvents"]:
        args = e.get("args", {})
        if e.get("cat") == "kernel" and args.get("Collective name") == "broadcast":
            per_rank.setdefault(args["rank"], []).append((int(e["ts"] * 1000), int(e["dur"] * 1000)))
    lists = [sorted(v) for _, v in sorted(per_rank.items())]
    assert len(lists) == 4 and len({len(v) for v in lists}) == 1
    return [{r: lists[r][k] for r in range(4)} for k in range(len(lists[0]))]


@pytest.mark.slow
def test_rooted_collectives_on_one_clock_are_placed_by_start_time(tmp_path: Path) -> None:
    path = corpus_path(MERGED)
    instances = broadcasts_by_hand(path)
    assert len(instances) == 6
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    from traceq.report.crossrank import matched

    with connect(db, read_only=True) as con, matched(con, None) as table:
        rows = con.sql(f"select rank, start_ns, wait_ns, transfer_ns, arrived_last, wait_caused_ns, arrival "
                       f"from {table} where collective_type = 'Broadcast' order by start_ns").fetchall()
    got = {(rank, start): (wait, transfer, last, caused, arrival) for rank, start, wait, transfer, last, caused, arrival in rows}
    shortest_was_root = 0
    for inst in instances:
        last = max(inst, key=lambda r: (inst[r][0], -r))
        assert last == 3  # the corpus README: rank 3 arrives last (by start, at every broadcast)
        waits = {r: min(d, max(0, inst[last][0] - s)) for r, (s, d) in inst.items()}
        for r, (s, d) in inst.items():
            wait, transfer, arrived_last, caused, arrival = got[(r, s)]
            assert (wait, transfer, arrived_last, arrival) == (waits[r], d - waits[r], r == last, "start time")
            assert caused == (sum(waits.values()) - waits[r] if r == last else 0)
        shortest_was_root += min(inst, key=lambda r: (inst[r][1], r)) == 0
    assert shortest_was_root >= 4  # what the shortest-kernel rule would have blamed: the root, rank 0


def test_rooted_collectives_on_clocks_of_their_own_are_not_inferable(tmp_path: Path) -> None:
    from tests.tracegen import TraceBuilder
    from traceq.report.crossrank import matched, matching_notes

    files = []
    for rank, (start, end) in enumerate([(10_000, 12_000), (10_000, 30_000)]):  # the root (rank 0) ends first
        t = TraceBuilder(rank=rank)
        t.step(1, 0, 50_000)
        t.kernel("ncclDevKernel_Generic(ncclDevComm*)", start, end, launch_ns=1_000, **{
            "Collective name": "broadcast", "Group size": 2, "Process Group Name": "0",
            "Process Group Ranks": "[0, 1]", "In msg nelems": 1024, "dtype": "Float"})
        files.append(t.write(tmp_path / "job" / f"rank{rank}.json"))
    db = tmp_path / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    with connect(db, read_only=True) as con:
        with matched(con, None) as table:
            rows = con.sql(f"select rank, matched, arrival, wait_ns, transfer_ns, arrived_last, wait_caused_ns "
                           f"from {table} order by rank").fetchall()
        notes = matching_notes(con)
    assert rows == [(0, True, "not inferable", 0, 2_000, False, 0), (1, True, "not inferable", 0, 20_000, False, 0)]
    assert any("2 kernels of rooted collectives on clocks of their own: arrival not inferable" in n for n in notes)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one file", "a file per rank"])
def test_rooted_collectives_agree_with_the_brute_force_reference(tmp_path: Path, layout: str) -> None:
    """A Broadcast then a Reduce over 3 ranks (tests/comm_reference.py, written apart from the SQL): in one
    file (one clock) placed by start time, a file per rank not inferable; per kernel, per step window and
    over the whole trace."""
    from tests import comm_reference as reference
    from tests.tracegen import TraceBuilder
    from traceq.report import crossrank
    from traceq.report.metrics import step_metrics
    from traceq.report.selection import StepSelection

    us = 1000
    timings = {0: ((10, 14), (40, 50)), 1: ((12, 30), (45, 60)), 2: ((20, 30), (45, 55))}

    def collectives(t: TraceBuilder, rank: int, rank_arg: int | None) -> None:
        t.step(1, 0, 100 * us, rank=rank_arg)
        for name, (start, end) in zip(("broadcast", "reduce"), timings[rank]):
            t.kernel(reference.AR, start * us, end * us, launch_ns=1 * us, rank=rank_arg, **reference._args(name))

    if layout == "one file":
        merged = TraceBuilder(rank=None)
        for rank in range(3):
            collectives(merged, rank, rank)
        files = [merged.write(tmp_path / "m" / "merged.json")]
    else:
        files = []
        for rank in range(3):
            t = TraceBuilder(rank=rank)
            collectives(t, rank, None)
            files.append(t.write(tmp_path / "s" / f"rank{rank}.json",
                                 distributedInfo={"backend": "nccl", "rank": rank, "world_size": 3}))
    db = tmp_path / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    expected = {(k["rank"], k["start_ns"]): (k["matched"], k["reason"], k["wait_ns"], k["transfer_ns"], k["arrived_last"])
                for k in reference.instances(files)}
    with connect(db, read_only=True) as con, crossrank.matched(con) as table:
        got = {(r[0], r[1]): tuple(r[2:]) for r in con.execute(
            f"select rank, start_ns, matched, reason, wait_ns, transfer_ns, arrived_last from {table}").fetchall()}
        rows = step_metrics(con, selection=StepSelection(skip_steps=0, include_last=True), cross_rank=True)
        whole = step_metrics(con, whole_trace=True, cross_rank=True)
    assert got == expected
    assert any(v[4] for v in got.values()) == (layout == "one file")
    keys = (*reference.SPLIT_KEYS, *reference.STRAGGLER_KEYS)
    want = {(w["rank"], w["step"]): {k: w[k] for k in keys} for w in reference.window_metrics(files)}
    have = {(r["rank"], r["step"]): {k: r[k] for k in keys} for r in rows.iter_rows(named=True)
            if r["device"] is not None and r["device"] >= 0}
    assert have == want
    want = {w["rank"]: {k: w[k] for k in keys} for w in reference.whole_trace_metrics(files)}
    have = {r["rank"]: {k: r[k] for k in keys} for r in whole.iter_rows(named=True) if r["device"] >= 0}
    assert have == want
