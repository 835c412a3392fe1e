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


@pytest.mark.parametrize("relative", ["hta/trace_diff/control/control.json.gz", "hta/trace_filter/sampled_rank-0.json.gz",
                                      "hta/trace_filter/sampled_rank-1.json.gz"])
def test_sendrecv_kernels_take_the_type_of_the_annotation_around_their_launch(tmp_path: Path, relative: str) -> None:
    path = corpus_path(relative)
    expected = annotated_types(path)
    assert sum(expected.values()) >= 10 and len(expected) >= 1
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, workers=0).ok
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
