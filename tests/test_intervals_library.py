"""traceq.intervals as a library for other profilers: fed HTA's own trace DataFrame, it gives HTA's
figure; fed Kineto's own event list (the trace's JSON events as dicts), it gives traceq's."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import tempfile
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from tests import hta_reference as hta
from tests.conftest import corpus_path, require_module
from traceq import intervals
from traceq.ingest import ingest_traces
from traceq.report.metrics import step_metrics
from traceq.store.warehouse import connect

HTA_CASES = ["hta/nccl_parser_config/nccl_data.json.gz", "hta/trace_diff/control/control.json.gz",
             "tracelens/mi300/resnet_act_checkpoint.json.gz"]


def _hta_trace_frame(path: Path):
    """HTA's TraceAnalysis of one file: (its trace DataFrame of the rank, its symbol table, its overlap %)."""
    require_module("hta", "holistictraceanalysis is a test dependency: pip install -e '.[test]'")
    from hta.trace_analysis import TraceAnalysis

    hta._hta_pandas_compat()
    logging.getLogger("hta").setLevel(logging.ERROR)
    rank = hta.trace_rank(path) or 0
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(path, Path(tmp) / f"rank-{rank}.json.gz")
        analysis = TraceAnalysis(trace_files={rank: str(Path(tmp) / f"rank-{rank}.json.gz")}, trace_dir=tmp)
        frame = analysis.t.get_trace(rank)
        symbols = analysis.t.symbol_table.get_sym_table()
        pctg = float(analysis.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"].iloc[0])
    return frame, symbols, pctg


@pytest.mark.slow
@pytest.mark.parametrize("relative", HTA_CASES)
def test_hta_dataframe_through_the_interval_api_gives_htas_overlap(relative: str) -> None:
    """HTA's kernels (its step filter, already applied to the DataFrame it loaded), its name rules and its
    whole-microsecond times: the interval API's overlap ratio is HTA's comp_comm_overlap_pctg."""
    frame, symbols, expected = _hta_trace_frame(corpus_path(relative))
    kernels = frame[frame["stream"] != -1]
    kinds = kernels["name"].map(lambda i: hta.hta_kernel_type(symbols[i]))

    def spans(rows):
        starts = rows["ts"].to_numpy().astype(np.int64)
        # HTA's rounding can leave a kernel inside one microsecond with end < ts: an empty interval
        return starts, np.maximum(starts, (rows["ts"] + rows["dur"]).to_numpy().astype(np.int64))

    split = intervals.overlap_split(spans(kernels[kinds == "COMMUNICATION"]), spans(kernels[kinds == "COMPUTATION"]))
    assert round(100 * split.overlap_ratio, 2) == expected


_COMM = re.compile(r"^nccl|rccl|dpsk::ep::(internode|intranode)::|multimem_all_reduce")  # the corpus README's comm kernels


@pytest.mark.slow
@pytest.mark.parametrize("relative", ["hta/nccl_parser_config/nccl_data.json.gz", "deepseek_profile_data/train.json"])
def test_kineto_event_list_through_the_interval_api_gives_traceqs_whole_trace(relative: str, tmp_path: Path) -> None:
    """The trace's own JSON events, as Kineto wrote them: exact ns from the text, kernels by category,
    communication by name or "Collective name"; intervals.breakdown per device equals traceq's whole-trace
    figures."""
    path = corpus_path(relative)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    sets: dict[int, dict[str, list[tuple[int, int]]]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        start = int(Decimal(e["ts"]) * 1000)
        end = start + int(Decimal(e["dur"]) * 1000)
        args = e.get("args") or {}
        kind = ("memcpy" if e["cat"] != "kernel"
                else "comm" if _COMM.search(e["name"]) or "Collective name" in args else "compute")
        sets.setdefault(int(args.get("device", e["pid"])), {"comm": [], "compute": [], "memcpy": []})[kind].append((start, end))
    db = tmp_path / "w.duckdb"
    assert ingest_traces([path], db, threads=1).ok
    with connect(db, read_only=True) as con:
        rows = {r["device"]: r for r in step_metrics(con, whole_trace=True).iter_rows(named=True)}
    assert set(rows) == set(sets)
    for device, by_kind in sets.items():
        pairs = {k: (np.array([s for s, _ in v], np.int64), np.array([e for _, e in v], np.int64)) for k, v in by_kind.items()}
        expected = intervals.breakdown(pairs["comm"], pairs["compute"], pairs["memcpy"]).as_dict()
        assert {k: rows[device][k] for k in expected} == expected


def test_a_nullable_integer_column_with_na_is_refused_as_missing_not_as_float() -> None:
    """pandas Int64 with NA arrives as float64 with NaN: it was refused as "dtype float64 is not an
    integer type", which sent users to convert a column that is integer already."""
    pd = require_module("pandas", "pandas comes with HTA, a test dependency")
    starts = pd.Series([0, None, 30], dtype="Int64")
    ends = pd.Series([10, 20, 40], dtype="Int64")
    with pytest.raises(intervals.IntervalError, match=r"value 1 is missing \(NA or NaN\), 1 in all; drop or fill"):
        intervals.total_length((starts, ends))
    assert intervals.total_length((starts.dropna(), ends[starts.notna()])) == 20
