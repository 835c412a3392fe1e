"""Every corpus trace: ingested faithfully (events, exact ns), comm kernels found, identity holds."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import CORPUS, corpus_files
from traceq import intervals
from traceq.report.metrics import step_metrics
from traceq.report.selection import relation
from traceq.store.warehouse import connect

# Communication kernels per file, from the corpus README's table (columns "nccl/rccl" + "other comm"),
# which its authors counted from kernel names: the classifier must find exactly these.
README_COMM_KERNELS = {
    "amd_hpctraining/fused_traces/merged_all_events.json.gz": 84,
    "deepseek_profile_data/train.json": 32,
    "hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz": 1,
    "hta/nccl_parser_config/nccl_data.json.gz": 21,
    "hta/trace_diff/control/control.json.gz": 60,
    "hta/trace_filter/sampled_rank-0.json.gz": 10,
    "hta/trace_filter/sampled_rank-1.json.gz": 10,
    "tracelens/b200/eager_trace.json.gz": 74,
    "tracelens/mi300/resnet_act_checkpoint.json.gz": 17,
}
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "mtia_ccp_events"}


def load_json(path: Path):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        doc = json.load(f, parse_float=Decimal)
    return doc if isinstance(doc, list) else doc["traceEvents"]


def exact_ns(value) -> int:
    return int(Decimal(value) * 1000)


def trace_ids(db: Path) -> dict[str, int]:
    with connect(db, read_only=True) as con:
        rows = con.sql("select path, trace_id from traces").fetchall()
    return {str(Path(p).relative_to(CORPUS.resolve())): t for p, t in rows}


@pytest.mark.slow
@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: str(p.relative_to(CORPUS)))
def test_gpu_events_are_stored_to_the_exact_nanosecond(corpus_db: Path, path: Path) -> None:
    events = load_json(path)
    expected = Counter(
        (exact_ns(e["ts"]), exact_ns(e["dur"]))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    )
    tid = trace_ids(corpus_db)[str(path.relative_to(CORPUS))]
    with connect(corpus_db, read_only=True) as con:
        stored = Counter(con.sql("select start_ns, dur_ns from gpu_events where trace_id = ?", params=[tid]).fetchall())
        n_events = con.sql("select n_events from traces where trace_id = ?", params=[tid]).fetchall()[0][0]
    assert stored == expected
    assert n_events == len(events)


def test_comm_kernels_match_the_corpus_readme(corpus_db: Path) -> None:
    ids = trace_ids(corpus_db)
    with connect(corpus_db, read_only=True) as con:
        gpu_activity = relation(con, "gpu_activity")  # noqa: F841 (the SQL reads it by name)
        counts = dict(
            con.sql("select trace_id, count(*) from gpu_activity where class = 'comm' group by all").fetchall()
        )
    found = {rel: counts.get(tid, 0) for rel, tid in ids.items()}
    for rel, n in README_COMM_KERNELS.items():
        assert found[rel] == n, rel
    assert all(found[rel] == 0 for rel in found if rel not in README_COMM_KERNELS)


def test_collective_types_come_from_args_for_rccl_generic_kernels(corpus_db: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        gpu_activity = relation(con, "gpu_activity")  # noqa: F841 (the SQL reads it by name)
        rows = con.sql(
            """
            select a.rank, a.collective_type, count(*)
            from gpu_activity a join traces t using (trace_id)
            where t.path like '%merged_all_events%' and a.class = 'comm'
            group by all order by all
            """
        ).fetchall()
    # README: each of the 4 ranks has 15 all-reduce + 6 broadcast ncclDevKernel_Generic kernels
    assert rows == [(r, c, n) for r in range(4) for c, n in (("AllReduce", 15), ("Broadcast", 6))]


def test_process_groups_and_deepep_and_symmetric_memory_are_classified(corpus_db: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        gpu_activity = relation(con, "gpu_activity")  # noqa: F841 (the SQL reads it by name)
        cats = dict(con.sql("select category, count(*) from gpu_activity where class = 'comm' group by all").fetchall())
        pg = con.sql(
            "select distinct pg_desc from gpu_activity a join traces t using (trace_id) "
            "where t.path like '%nccl_data%' and class = 'comm'"
        ).fetchall()
    assert cats["deepep"] == 32
    assert cats["symm_mem"] == 73
    assert pg == [("default_pg",)]


def test_merged_file_yields_four_ranks(corpus_db: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        ranks = con.sql(
            "select distinct g.rank from gpu_events g join traces t using (trace_id) "
            "where t.path like '%merged_all_events%' order by 1"
        ).fetchall()
    assert [r for (r,) in ranks] == [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("whole_trace", [False, True], ids=["steps", "trace"])
def test_identity_holds_to_the_nanosecond_on_every_corpus_gpu(corpus_db: Path, whole_trace: bool) -> None:
    with connect(corpus_db, read_only=True) as con:
        rows = step_metrics(con, whole_trace=whole_trace)
    assert rows.height > 0
    lhs = rows["compute_ns"] + rows["exposed_comm_ns"] + rows["exposed_memcpy_ns"] + rows["idle_ns"]
    assert (lhs == rows["window_ns"]).all()
    assert (rows["overlapped_comm_ns"] + rows["exposed_comm_ns"] == rows["comm_ns"]).all()


@pytest.mark.slow
def test_sql_metrics_agree_with_the_interval_api_on_every_corpus_gpu(corpus_db: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        gpu_activity = relation(con, "gpu_activity")  # noqa: F841 (the SQL reads it by name)
        sql = step_metrics(con, whole_trace=True).filter(pl.col("activity") == "gpu")
        activity = con.sql(
            "select trace_id, rank, coalesce(device, -1) as device, class, start_ns, end_ns from gpu_activity"
        ).pl()
    checked = 0
    for key, group in activity.group_by(["trace_id", "rank", "device"]):
        def pair(*classes: str) -> tuple[np.ndarray, np.ndarray]:
            g = group.filter(pl.col("class").is_in(classes))
            return g["start_ns"].to_numpy(), g["end_ns"].to_numpy()

        expected = intervals.breakdown(pair("comm"), pair("compute"), pair("memcpy", "memset")).as_dict()
        row = sql.filter(
            (pl.col("trace_id") == key[0]) & (pl.col("rank") == key[1]) & (pl.col("device") == key[2])
        ).row(0, named=True)
        for name in ("comm_ns", "compute_ns", "overlapped_comm_ns", "exposed_comm_ns", "exposed_memcpy_ns",
                     "busy_ns", "window_ns", "idle_ns"):
            assert row[name] == expected[name], (key, name)
        checked += 1
    assert checked == sql.height
