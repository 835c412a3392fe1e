"""`traceq kernels`: the kernel table on a hand-made trace worked out by hand, and on a corpus trace
against a plain-Python count (each kernel in the step whose CPU span holds its launch)."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import corpus_path
from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.errors import ConfigError
from traceq.ingest import ingest_traces
from traceq.report.kernels import kernel_report
from traceq.report.selection import StepSelection

US = 1_000
ALL = StepSelection(skip_steps=0, include_last=True, drop_incomplete=False)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Step 1 launches two GEMMs (20 + 10 us) and an all-reduce (30 us); step 2 one GEMM (40 us) and a
    kernel no rule knows (my_custom_op, 20 us) that runs beside it."""
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100 * US)
    t.step(2, 100 * US, 200 * US)
    t.kernel("ampere_sgemm_128x64_tn", 10 * US, 30 * US, launch_ns=1 * US)
    t.kernel("ampere_sgemm_128x64_tn", 30 * US, 40 * US, launch_ns=2 * US)
    t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40 * US, 70 * US, stream=20, launch_ns=3 * US)
    t.kernel("ampere_sgemm_128x64_tn", 110 * US, 150 * US, launch_ns=101 * US)
    t.kernel("my_custom_op", 120 * US, 140 * US, stream=9, launch_ns=102 * US)
    path = tmp_path / "w.duckdb"
    assert ingest_traces([t.write(tmp_path / "job" / "rank0.json")], path, threads=1).ok
    return path


@pytest.mark.slow
def test_kernels_by_hand(db: Path) -> None:
    table = kernel_report(db, selection=ALL).table
    # 120 us of kernels in all (the 20 us beside the GEMM count too)
    assert table.select("name", "count", "total_ms", "share_pct", "mean_us", "min_us", "max_us").rows() == [
        ("ampere_sgemm_128x64_tn", 3, pytest.approx(0.07), pytest.approx(70 / 120 * 100), pytest.approx(70 / 3), 10.0, 40.0),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1, pytest.approx(0.03), pytest.approx(25.0), 30.0, 30.0, 30.0),
        ("my_custom_op", 1, pytest.approx(0.02), pytest.approx(20 / 120 * 100), 20.0, 20.0, 20.0),
    ]
    assert table["category"].to_list() == ["gemm", "nccl", "other"]
    per_step = kernel_report(db, by="run,step", level="category", selection=ALL).table
    assert per_step.select("step", "category", "total_ms", "share_pct").rows() == [
        (1, "nccl", pytest.approx(0.03), 50.0), (1, "gemm", pytest.approx(0.03), 50.0),  # a tie: by class, then category
        (2, "gemm", pytest.approx(0.04), pytest.approx(200 / 3)), (2, "other", pytest.approx(0.02), pytest.approx(100 / 3)),
    ]
    assert kernel_report(db, top=1, selection=ALL).table["name"].to_list() == ["ampere_sgemm_128x64_tn"]
    unknown = kernel_report(db, unclassified=True, selection=ALL).table
    assert unknown["name"].to_list() == ["my_custom_op"]
    assert unknown["share_pct"].to_list() == [pytest.approx(20 / 120 * 100)]  # of all kernel time, not of the unknown
    assert kernel_report(db, selection=StepSelection(step_min=2, step_max=2, include_last=True)).table["count"].to_list() == [1, 1]


def test_bad_arguments(db: Path) -> None:
    with pytest.raises(ConfigError, match="one of kernel, category"):
        kernel_report(db, level="kernels")
    with pytest.raises(ConfigError, match="did you mean step"):
        kernel_report(db, by="run,stpe")
    done = CliRunner().invoke(app, ["kernels", "--db", str(db), "--top", "0"])
    assert done.exit_code == 1 and done.stderr.startswith("error: --top 0: must be 1 or more")


@pytest.mark.slow
def test_kernels_on_a_corpus_trace_against_a_plain_count(tmp_path: Path) -> None:
    path = corpus_path("hta/nccl_parser_config/nccl_data.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in events
             if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")]
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    expected: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "kernel":
            continue
        launched = launches.get(e["args"].get("correlation"))
        step = next((n for lo, hi, n in steps if launched is not None and lo <= launched <= hi), None)
        if step is not None:
            expected[e["name"]][0] += 1
            expected[e["name"]][1] += e["dur"]
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db).ok
    table = kernel_report(db, top=None, selection=ALL).table
    got = {r["name"]: (r["count"], r["total_ms"] * 1000) for r in table.iter_rows(named=True)
           if r["class"] not in ("memcpy", "memset")}
    assert set(got) == set(expected)
    for name, (count, total_us) in expected.items():
        assert got[name][0] == count, name
        assert got[name][1] == pytest.approx(total_us, abs=1e-6), name
    assert sum(c for c, _ in expected.values()) > 1000
