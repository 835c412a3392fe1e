"""NCCL's algorithm and protocol from a collective kernel's name (traceq/nccl_kernels.py) and their columns in
``traceq collectives``: hand-written names in NCCL's real formats with values written by hand, a hand-made
run whose two AllReduces name different algorithms, and every NCCL kernel name of the corpus against a
regular expression written here, apart from the module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_cross_rank import EVERY_STEP, collective_args, ingest
from tests.tracegen import TraceBuilder
from traceq.nccl_kernels import NOTE, algorithm_protocol, named_algorithm_protocol
from traceq.report.collectives import collectives_report
from traceq.store.warehouse import connect

US = 1000
ARGS_219 = "(ncclDevKernelArgsStorage<4096ul>)"
ARGS_218 = "(ncclDevComm*, unsigned long, ncclWork*)"

# name -> (what the name says, what it establishes NCCL ran); worked out from NVIDIA/nccl's source (module
# docstring): up to 2.18 every protocol runs in the algorithm's _LL kernel; from 2.19 RING_LL stands for every
# algorithm but Tree; a name no stand-in has comes from a build with exact kernel names.
NAMES = {
    # NCCL <= 2.18
    "ncclKernel_AllReduce_RING_LL_Sum_float" + ARGS_218: (("RING", "LL"), ("RING", None)),
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": (("RING", "LL"), ("RING", None)),
    "ncclKernel_AllReduce_TREE_LL_Sum_half" + ARGS_218: (("TREE", "LL"), ("TREE", None)),
    "ncclKernel_AllReduce_COLLNET_DIRECT_LL_Sum_float" + ARGS_218: (("COLLNET_DIRECT", "LL"), ("COLLNET_DIRECT", None)),
    "ncclKernel_AllReduce_COLLNET_CHAIN_LL_Sum_bfloat16" + ARGS_218: (("COLLNET_CHAIN", "LL"), ("COLLNET_CHAIN", None)),
    "ncclKernel_AllReduce_COLLNET_LL_Sum_float" + ARGS_218: (("COLLNET", "LL"), ("COLLNET", None)),
    "ncclKernel_AllReduce_NVLS_LL_Sum_float" + ARGS_218: (("NVLS", "LL"), ("NVLS", None)),
    "ncclKernel_AllReduce_NVLS_TREE_LL_Sum_float" + ARGS_218: (("NVLS_TREE", "LL"), ("NVLS_TREE", None)),
    "ncclKernel_Broadcast_RING_LL_Sum_int8_t" + ARGS_218: (("RING", "LL"), ("RING", None)),
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t" + ARGS_218: (("RING", "SIMPLE"), (None, None)),
    "ncclKernel_AllReduce": ((None, None), (None, None)),
    # NCCL 2.19+ (the stand-ins)
    "ncclDevKernel_AllGather_RING_LL" + ARGS_219: (("RING", "LL"), (None, None)),
    "ncclDevKernel_Broadcast_RING_LL" + ARGS_219: (("RING", "LL"), (None, None)),
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL" + ARGS_219: (("RING", "LL"), (None, None)),
    "ncclDevKernel_ReduceScatter_Sum_bf16_TREE_LL" + ARGS_219: (("TREE", "LL"), ("TREE", None)),
    "void ncclDevKernel_AllReduce_Sum_u32_TREE_LL" + ARGS_219: (("TREE", "LL"), ("TREE", None)),
    # NCCL 2.19+ built with exact kernel names
    "ncclDevKernel_AllReduce_Sum_bf16_NVLS_SIMPLE" + ARGS_219: (("NVLS", "SIMPLE"), ("NVLS", "SIMPLE")),
    "ncclDevKernel_AllReduce_Sum_f16_NVLS_TREE_SIMPLE" + ARGS_219: (("NVLS_TREE", "SIMPLE"), ("NVLS_TREE", "SIMPLE")),
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL128" + ARGS_219: (("RING", "LL128"), ("RING", "LL128")),
    "ncclDevKernel_AllReduce_Sum_f32_TREE_LL128" + ARGS_219: (("TREE", "LL128"), ("TREE", "LL128")),
    "ncclDevKernel_AllGather_PAT_SIMPLE" + ARGS_219: (("PAT", "SIMPLE"), ("PAT", "SIMPLE")),
    "ncclDevKernel_ReduceScatter_Sum_f32_COLLNET_DIRECT_SIMPLE": (("COLLNET_DIRECT", "SIMPLE"), ("COLLNET_DIRECT", "SIMPLE")),
    "ncclDevKernel_AllReduce_Sum_f32_COLLNET_CHAIN_SIMPLE": (("COLLNET_CHAIN", "SIMPLE"), ("COLLNET_CHAIN", "SIMPLE")),
    # no algorithm or protocol in the name
    "ncclDevKernel_Generic" + ARGS_219: ((None, None), (None, None)),
    "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)": ((None, None), (None, None)),  # RCCL
    "ncclDevKernel_SendRecv" + ARGS_219: ((None, None), (None, None)),
    "gloo:all_reduce": ((None, None), (None, None)),
    "void dpsk::ep::internode::dispatch<8, 4>(int4*, float*)": ((None, None), (None, None)),
    "multimem_all_reduce_kernel": ((None, None), (None, None)),
    "RING_LL": ((None, None), (None, None)),
    "": ((None, None), (None, None)),
}


@pytest.mark.parametrize("name", NAMES)
def test_a_kernel_name_gives_the_algorithm_and_protocol_it_establishes(name: str) -> None:
    named, established = NAMES[name]
    assert named_algorithm_protocol(name) == named
    assert algorithm_protocol(name) == established


def two_algorithm_run() -> dict[int, TraceBuilder]:
    """Two ranks, two AllReduces of 750 floats (3,000 bytes) in step 1: the first in a RING kernel, rank 0
    [10,20) us and rank 1 [14,20) (transfer 6 us, waits 4 and 0), the second in a TREE kernel, rank 0 [30,34)
    and rank 1 [30,40) (transfer 4 us, waits 0 and 6). Per instance: RING algbw 3000 B / 6 us = 0.5 GB/s,
    TREE 0.75 GB/s; AllReduce over 2 ranks: busbw = algbw x 2(2-1)/2 = algbw; mean wait per rank 2 and 3 us."""
    ring = "ncclKernel_AllReduce_RING_LL_Sum_float" + ARGS_218
    tree = "ncclKernel_AllReduce_TREE_LL_Sum_float" + ARGS_218
    spans = {0: ((10, 20), (30, 34)), 1: ((14, 20), (30, 40))}
    out = {}
    for r, ((a0, a1), (b0, b1)) in spans.items():
        t = TraceBuilder(rank=r)
        t.step(1, 0, 100 * US)
        t.kernel(ring, a0 * US, a1 * US, stream=20, launch_ns=2 * US, **collective_args(ranks=(0, 1)))
        t.kernel(tree, b0 * US, b1 * US, stream=20, launch_ns=3 * US, **collective_args(ranks=(0, 1)))
        out[r] = t
    return out


def test_collectives_has_a_row_per_algorithm_of_a_collective_type(tmp_path: Path) -> None:
    report = collectives_report(ingest(tmp_path, two_algorithm_run()), selection=EVERY_STEP)
    table = report.table
    assert table.columns[:4] == ["run", "collective_type", "nccl_algo", "nccl_proto"]
    got = [(r["nccl_algo"], r["nccl_proto"], r["count"], r["transfer_us"], r["wait_us"], r["basis"])
           for r in table.iter_rows(named=True)]
    assert got == [("RING", None, 1, 6, 2, "matched"), ("TREE", None, 1, 4, 3, "matched")]
    assert table["algbw_gbps"].to_list() == pytest.approx([0.5, 0.75])
    assert table["busbw_gbps"].to_list() == pytest.approx([0.5, 0.75])
    assert NOTE in report.notes
    # without the split, one AllReduce row: 2 instances, transfer (6 + 4) / 2, wait (4 + 6) / 4 ranks' kernels
    whole = collectives_report(tmp_path / "job.duckdb", selection=EVERY_STEP, nccl=False).table
    assert "nccl_algo" not in whole.columns
    assert whole.select("count", "transfer_us", "wait_us").row(0) == (2, 5, 2.5)
    assert whole["algbw_gbps"].to_list() == pytest.approx([6000 / 10_000])
    assert NOTE not in collectives_report(tmp_path / "job.duckdb", selection=EVERY_STEP, nccl=False).notes


# written apart from traceq/nccl_kernels.py: the algorithm and protocol words of a name, where it has them
SEPARATE = re.compile(
    r"(?:void )?nccl(?:Dev)?Kernel_[A-Za-z]+(?:_[A-Za-z0-9]+)*?"
    r"_(TREE|RING|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)(?:_\w+)?(?:\(.*\))?"
)
CORPUS_EXPECTED = {  # the corpus' NCCL kernel names (without parameters), by hand
    "ncclKernel_AllReduce_RING_LL_Sum_float": ("RING", None),
    "ncclKernel_Broadcast_RING_LL_Sum_int8_t": ("RING", None),
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t": (None, None),
    "ncclDevKernel_AllGather_RING_LL": (None, None),
    "ncclDevKernel_Generic": (None, None),
    "ncclKernel_AllReduce": (None, None),
}


def test_every_corpus_nccl_kernel_name_parses_as_a_separate_regex_reads_it(corpus_db: Path) -> None:
    with connect(corpus_db, read_only=True) as con:
        names = [n for (n,) in con.execute(
            "select distinct n.name from names as n semi join gpu_events as g "
            "on g.trace_id = n.trace_id and g.name_id = n.name_id and g.kind = 1 "
            "where n.name like 'nccl%Kernel%' order by 1").fetchall()]
    assert len(names) >= 8, names  # 9 distinct names in the corpus, parameter lists apart
    seen = set()
    for name in names:
        m = SEPARATE.fullmatch(name)
        assert named_algorithm_protocol(name) == (m.groups() if m else (None, None)), name
        if "Generic" in name:
            assert m is None and algorithm_protocol(name) == (None, None), name
        stem = name.split("(")[0]
        if stem in CORPUS_EXPECTED:
            assert algorithm_protocol(name) == CORPUS_EXPECTED[stem], name
            seen.add(stem)
    assert seen == set(CORPUS_EXPECTED)


def test_corpus_collectives_show_the_columns_and_keep_their_figures(corpus_db: Path) -> None:
    report = collectives_report(corpus_db, whole_trace=True)
    table = report.table
    assert table.columns[1:4] == ["collective_type", "nccl_algo", "nccl_proto"] and NOTE in report.notes
    by_run = {run: set(zip(rows["nccl_algo"], rows["nccl_proto"]))
              for (run,), rows in table.partition_by("run", as_dict=True).items()}
    assert by_run["nccl_parser_config"] == {("RING", None)}  # ncclKernel_{AllReduce,Broadcast}_RING_LL
    assert by_run["fused_traces"] == {(None, None)}  # RCCL's ncclDevKernel_Generic
    assert by_run["control"] == {("RING", None), (None, None)}  # AllReduce RING_LL; AllToAll in SendRecv
    # the corpus' collectives of one type, group and size name one algorithm: the figures are the ones
    # collectives gives without the split (as before the columns)
    for whole_trace in (True, False):
        split = collectives_report(corpus_db, whole_trace=whole_trace).table
        plain = collectives_report(corpus_db, whole_trace=whole_trace, nccl=False).table
        assert split.drop("nccl_algo", "nccl_proto").equals(plain)


def test_the_busbw_figure_draws_a_line_per_algorithm(tmp_path: Path) -> None:
    from traceq.report.plots import busbw_figure

    table = collectives_report(ingest(tmp_path, two_algorithm_run()), selection=EVERY_STEP).table
    lines = {d.name: list(d.y) for d in busbw_figure(table).data}
    assert lines == {"AllReduce RING (job)": pytest.approx([0.5]), "AllReduce TREE (job)": pytest.approx([0.75])}
