"""`traceq export --perfetto` (docs/how-to/perfetto.md, "See it on the timeline"): the written file decoded with the
perfetto package's own protos, against answers worked out by hand (kernels overlapping on one stream, a rank whose
clock runs 700 us ahead, a power log), against the warehouse and `traceq report` on real corpus traces, through
Perfetto's own importer where its trace processor is at hand (../shared/bin), from a Parquet export, and through the
CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT, corpus_path, require_module, skip_or_fail
from tests.test_power_ingest import BASE, META, header, power, write_rank
from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.errors import ConfigError, EmptySelection
from traceq.ingest import ingest_traces
from traceq.perfetto import pftrace, timeline
from traceq.report.check import check_warehouse
from traceq.report.metrics import compute_metric
from traceq.report.selection import StepSelection, relation
from traceq.perfetto.timeline import export_perfetto, parse_ranks
from traceq.store.export import export_parquet
from traceq.store.warehouse import connect

pb = require_module("perfetto.protos.perfetto.trace.perfetto_trace_pb2",
                    "the perfetto package writes and reads the trace (pip install 'traceq[perfetto]')")

TRACE_PROCESSOR = ROOT.parent / "shared" / "bin" / "trace_processor_shell"
US = 1000
MS = 1000 * US
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "ampere_sgemm_128x64_nn"
COUNTERS = ("exposed_comm", "overlapped_comm", "idle", "exposed_comm_wait", "exposed_comm_transfer")


# --------------------------------------------------------------------------------------------------
# reading the file back, with the package's protos only


@dataclass
class Decoded:
    """A Perfetto trace file as tracks, slices (begin/end pairs), counter values and metadata."""

    tracks: dict[int, Any] = field(default_factory=dict)  # uuid -> TrackDescriptor
    slices: dict[int, list[tuple[int, int, str, str, dict[str, Any]]]] = field(default_factory=lambda: defaultdict(list))
    counters: dict[int, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    metadata: dict[str, Any] = field(default_factory=dict)

    def process(self, name: str) -> Any:
        found = [d for d in self.tracks.values() if d.HasField("process") and d.process.process_name == name]
        assert len(found) == 1, (name, self.process_names())
        return found[0]

    def process_names(self) -> list[str]:
        return [d.process.process_name for d in self.tracks.values() if d.HasField("process")]

    def children(self, process: str) -> dict[str, int]:
        """Track name -> uuid of the tracks of one process."""
        parent = self.process(process).uuid
        return {d.name: u for u, d in self.tracks.items() if d.parent_uuid == parent}

    def track_slices(self, process: str, track: str) -> list[tuple[int, int, str]]:
        return [(ts, end, name) for ts, end, name, _, _ in self.slices[self.children(process)[track]]]

    def track_counters(self, process: str, track: str) -> list[tuple[int, float]]:
        return self.counters[self.children(process)[track]]


def decode(path: Path) -> Decoded:
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    interned: dict[str, dict[int, str]] = defaultdict(dict)
    out = Decoded()
    open_slices: dict[int, list[tuple[int, str, str, dict[str, Any]]]] = defaultdict(list)
    for packet in trace.packet:
        for kind in ("event_names", "event_categories", "debug_annotation_names", "debug_annotation_string_values"):
            for entry in getattr(packet.interned_data, kind):
                interned[kind][entry.iid] = entry.str.decode() if kind.endswith("values") else entry.name
        if packet.HasField("track_descriptor"):
            out.tracks[packet.track_descriptor.uuid] = packet.track_descriptor
        for entry in packet.chrome_events.metadata:
            out.metadata[entry.name] = json.loads(entry.json_value)
        if not packet.HasField("track_event"):
            continue
        event = packet.track_event
        assert event.track_uuid in out.tracks, "an event before its track's descriptor"
        if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            args = {}
            for a in event.debug_annotations:
                kind = a.WhichOneof("value")
                args[interned["debug_annotation_names"][a.name_iid]] = (
                    interned["debug_annotation_string_values"][a.string_value_iid] if kind == "string_value_iid"
                    else getattr(a, kind))
            categories = [interned["event_categories"][c] for c in event.category_iids]
            open_slices[event.track_uuid].append(
                (packet.timestamp, interned["event_names"][event.name_iid], categories[0], args))
        elif event.type == pb.TrackEvent.TYPE_SLICE_END:
            ts, name, category, args = open_slices[event.track_uuid].pop()
            out.slices[event.track_uuid].append((ts, packet.timestamp, name, category, args))
        elif event.type == pb.TrackEvent.TYPE_COUNTER:
            value = event.double_counter_value if event.HasField("double_counter_value") else event.counter_value
            out.counters[event.track_uuid].append((packet.timestamp, value))
    assert not any(open_slices.values()), "a slice without its end"
    return out


def assert_no_overlap_on_any_track(decoded: Decoded) -> None:
    """Perfetto's importer drops slices that overlap on one track: none may."""
    for uuid, slices in decoded.slices.items():
        ordered = sorted((ts, end) for ts, end, *_ in slices)
        for (_, end), (ts, _) in zip(ordered, ordered[1:]):
            assert ts >= end, (decoded.tracks[uuid].name, ts, end)


def stream_counts(decoded: Decoded) -> dict[tuple[str, str], int]:
    """(process, 'GPU d stream s') -> slices on that stream's tracks, overlap tracks included."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    names = {d.uuid: d.process.process_name for d in decoded.tracks.values() if d.HasField("process")}
    for uuid, d in decoded.tracks.items():
        if d.parent_uuid in names and " stream " in d.name:
            counts[(names[d.parent_uuid], d.name.split(" (overlap")[0])] += len(decoded.slices[uuid])
    return dict(counts)


# --------------------------------------------------------------------------------------------------
# hand-made runs


def overlap_rank() -> TraceBuilder:
    """One rank, step 1 over [0, 100] us. Stream 7 (all launched at 5 us): A [10,40], B [20,30], C [25,50],
    D [40,45], E [60,60] (zero length), F [60,70]; stream 20: an AllReduce [30,55] of 1024 floats, in a
    group of 2 whose other rank is not in the run.

    Lanes, kernels in start order (ties: shorter first): A lane 0 (free from 40); B starts at 20 < 40:
    lane 1 (free from 30); C at 25 finds neither free: lane 2; D at 40 takes lane 0 (A ended at 40); E and
    F at 60 take lane 0. So 'stream 7' holds A, D, E, F; '(overlap 1)' B; '(overlap 2)' C.
    The step's window is [10, 70] us. Compute = [10,50] + [60,70] = 50 us; comm [30,55] overlaps compute
    over [30,50] = 20 us, exposed [50,55] = 5 us; busy = [10,55] + [60,70] = 55 us, idle 60 - 55 = 5 us.
    The AllReduce is not matched (its group's other rank is absent), so its 5 us exposed are transfer.
    """
    t = TraceBuilder(rank=0)
    t.step(1, 0, 100 * US)
    for name, lo, hi in (("A", 10, 40), ("B", 20, 30), ("C", 25, 50), ("D", 40, 45), ("E", 60, 60), ("F", 60, 70)):
        t.kernel(f"kernel_{name}", lo * US, hi * US, launch_ns=5 * US)
    t.kernel(ALL_REDUCE, 30 * US, 55 * US, stream=20, launch_ns=6 * US, **{
        "Collective name": "allreduce", "Process Group Name": "0", "Group size": 2, "In msg nelems": 1024,
        "Out msg nelems": 1024, "dtype": "Float"})
    return t


def skewed_rank(rank: int, shift_ns: int) -> TraceBuilder:
    """Per 100 us step (2 steps): GEMM [10,30] us on stream 7, AllReduce [40,60] us (Seq = step) on stream
    20; every time of the rank moved by ``shift_ns`` (its clock runs that much ahead)."""
    t = TraceBuilder(rank=rank)
    for i in range(2):
        base = shift_ns + i * 100 * US
        t.step(i + 1, base, base + 100 * US)
        t.kernel(GEMM, base + 10 * US, base + 30 * US, launch_ns=base + 5 * US)
        t.kernel(ALL_REDUCE, base + 40 * US, base + 60 * US, stream=20, launch_ns=base + 35 * US, **{
            "Collective name": "allreduce", "Process Group Name": "0", "Group size": 2, "Seq": i + 1})
    return t


def cycle_trace(first_step: int, base_ns: int) -> TraceBuilder:
    """Rank 0, two 100 us steps from ``base_ns`` (numbered from ``first_step``), each with a GEMM [10,30] us
    and an AllReduce [40,60] us that nothing overlaps: 20 us of exposed comm per step."""
    t = TraceBuilder(rank=0)
    for i in range(2):
        base = base_ns + i * 100 * US
        t.step(first_step + i, base, base + 100 * US)
        t.kernel(GEMM, base + 10 * US, base + 30 * US, launch_ns=base + 5 * US)
        t.kernel(ALL_REDUCE, base + 40 * US, base + 60 * US, stream=20, launch_ns=base + 35 * US)
    return t


@pytest.fixture(scope="module")
def handmade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs 'overlap' (1 rank), 'skewed' (ranks 0 and 1, rank 1's clock 700 us ahead), 'power' (1 rank
    with an NVML log: 200 W over step 1 [0, 100] ms, 400 W over step 2 [100, 300] ms) and 'cycles' (two
    profiling cycles of rank 0 in two files: steps 1-2 from 0 us, steps 3-4 from 1000 us)."""
    root = tmp_path_factory.mktemp("timeline")
    files = [overlap_rank().write(root / "overlap" / "rank0.json"),
             skewed_rank(0, 0).write(root / "skewed" / "rank0.json"),
             skewed_rank(1, 700 * US).write(root / "skewed" / "rank1.json")]
    lines = [header(), power(-50, 200, 0), power(50, 200, 1), power(100, 400, 2), power(200, 400, 2),
             {"kind": "end", "wall_ns": BASE + 320 * MS, "step": 3, "samples": 4, "errors": 0}]
    files.append(write_rank(root / "power", 0, lines, META))
    files += [cycle_trace(1, 0).write(root / "cycles" / "rank0.a.json"),
              cycle_trace(3, 1000 * US).write(root / "cycles" / "rank0.b.json")]
    db = root / "w.duckdb"
    summary = ingest_traces(files, db, threads=1)
    assert summary.ok, [f.message for f in summary.files]
    return db


@pytest.fixture(scope="module")
def handmade_trace(handmade: Path) -> tuple[Decoded, timeline.TimelineSummary]:
    out = handmade.parent / "all.pftrace"
    summary = export_perfetto(handmade, out, selection=StepSelection(include_last=True))  # every step
    return decode(out), summary


@pytest.mark.slow
def test_kernels_overlapping_on_one_stream_go_on_extra_tracks_and_none_is_lost(handmade_trace) -> None:
    decoded, summary = handmade_trace
    tracks = decoded.children("overlap rank 0")
    assert decoded.track_slices("overlap rank 0", "GPU 0 stream 7") == [
        (10 * US, 40 * US, "kernel_A"), (40 * US, 45 * US, "kernel_D"), (60 * US, 60 * US, "kernel_E"),
        (60 * US, 70 * US, "kernel_F")]
    assert decoded.track_slices("overlap rank 0", "GPU 0 stream 7 (overlap 1)") == [(20 * US, 30 * US, "kernel_B")]
    assert decoded.track_slices("overlap rank 0", "GPU 0 stream 7 (overlap 2)") == [(25 * US, 50 * US, "kernel_C")]
    assert "GPU 0 stream 7 (overlap 3)" not in tracks
    assert_no_overlap_on_any_track(decoded)
    assert summary.overlap_tracks == 2
    assert any("(overlap N)" in n and "run overlap rank 0: 2" in n for n in summary.notes), summary.notes


def test_each_kernel_is_named_and_classified_with_its_collective_in_the_args(handmade_trace) -> None:
    decoded, _ = handmade_trace
    [(ts, end, name, category, args)] = decoded.slices[decoded.children("overlap rank 0")["GPU 0 stream 20"]]
    assert (ts, end, name, category) == (30 * US, 55 * US, ALL_REDUCE, "comm")
    assert args == {"class": "comm", "category": "nccl", "collective_type": "AllReduce", "process_group": "0",
                    "group_size": 2, "size_bytes": 4096, "matched": False, "wait_ns": 0, "transfer_ns": 25 * US}
    gemm = decoded.slices[decoded.children("overlap rank 0")["GPU 0 stream 7"]][0]
    assert gemm[3] == "compute" and gemm[4]["class"] == "compute" and "collective_type" not in gemm[4]


def test_steps_windows_and_counters_are_the_hand_computed_figures(handmade_trace) -> None:
    decoded, _ = handmade_trace
    process = "overlap rank 0"
    assert decoded.track_slices(process, "CPU steps") == [(0, 100 * US, "step 1")]
    assert decoded.track_slices(process, "GPU 0 steps (device windows)") == [(10 * US, 70 * US, "step 1")]
    expected = {"exposed_comm": 5 * US, "overlapped_comm": 20 * US, "idle": 5 * US, "exposed_comm_wait": 0,
                "exposed_comm_transfer": 5 * US}
    for name, value in expected.items():  # from the window's start, back to 0 at its end
        assert decoded.track_counters(process, f"GPU 0 {name} per step") == [(10 * US, value), (70 * US, 0)], name


def test_a_rank_whose_clock_is_ahead_is_moved_back_onto_the_reference_clock(handmade: Path, handmade_trace) -> None:
    decoded, summary = handmade_trace
    with connect(handmade, read_only=True) as con:
        starts = dict(con.sql("select rank, min(start_ns) from gpu_events join traces using (trace_id) "
                              "where run = 'skewed' group by rank").fetchall())
    assert starts[1] - starts[0] == 700 * US  # in the warehouse rank 1 runs 700 us late
    for track in ("GPU 0 stream 7", "GPU 0 stream 20", "CPU steps", "GPU 0 steps (device windows)"):
        assert decoded.track_slices("skewed rank 1", track) == decoded.track_slices("skewed rank 0", track), track
    assert decoded.track_slices("skewed rank 0", "GPU 0 stream 20")[0][:2] == (40 * US, 60 * US)
    clock = {(c.run, c.rank): c for c in summary.clocks}
    assert clock[("skewed", 1)].skew_ns == 700 * US and clock[("skewed", 1)].offset_ns == -700 * US
    assert clock[("skewed", 1)].n_matched == 2 and clock[("skewed", 0)].status == "reference"
    ranks = decoded.metadata["traceq"]["runs"]["skewed"]["ranks"]
    assert ranks["1"]["offset_ns"] == -700 * US and ranks["1"]["skew_ns"] == 700 * US
    assert ranks["0"] == {"offset_ns": 0, "status": "reference", "reason": None, "skew_ns": None, "collectives": 0}
    assert "clock: offset -700.000 us onto rank 0's clock" in decoded.process("skewed rank 1").process.process_labels[1]
    # the same sign as `traceq check`: rank 1's clock is ahead, and the offset takes it back
    [detail] = check_warehouse(handmade).table.filter(run="skewed", check="clock_skew")["detail"].to_list()
    assert "is 700.0 us ahead of rank 0" in detail


def test_a_rank_without_a_clock_estimate_says_so(handmade_trace) -> None:
    decoded, summary = handmade_trace
    entry = decoded.metadata["traceq"]["runs"]["overlap"]["ranks"]["0"]
    assert entry == {"offset_ns": 0, "status": "no estimate", "reason": "the run holds one rank", "skew_ns": None,
                     "collectives": 0}
    assert decoded.process("overlap rank 0").process.process_labels[1].startswith("clock: no estimate (the run holds one rank)")
    assert "3 run(s) of one rank, with no other clock to align to: cycles, overlap, power" in summary.notes


def test_power_per_step_and_the_nvml_samples_are_counters_in_watts(handmade: Path, handmade_trace) -> None:
    decoded, _ = handmade_trace
    process = "power rank 0"
    # the run's time 0 is its first step's start, BASE on the wall clock
    assert decoded.metadata["traceq"]["runs"]["power"]["origin_wall_ns"] == BASE
    assert decoded.track_counters(process, "power_w per step (W)") == [(0, 200.0), (100 * MS, 400.0), (300 * MS, 0.0)]
    # samples inside the steps' CPU spans [0, 300] ms (the one at -50 ms is outside)
    assert decoded.track_counters(process, "GPU 0 power, NVML samples (W)") == [
        (50 * MS, 200.0), (100 * MS, 400.0), (200 * MS, 400.0)]
    report = compute_metric(handmade, "power_w", by="run,rank,step", runs=["power"], selection=StepSelection(include_last=True))
    assert report["power_w"].to_list() == [200.0, 400.0]
    assert "power_w per step (W)" not in decoded.children("overlap rank 0")  # no power log, no power track


def test_two_traces_of_one_rank_share_its_process_and_counters_drop_to_0_between_them(handmade_trace) -> None:
    decoded, _ = handmade_trace
    process = "cycles rank 0"
    assert [name for *_, name in decoded.track_slices(process, "CPU steps")] == ["step 1", "step 2", "step 3", "step 4"]
    # windows: [10, 110], [110, 160] (the last: to the end of its activity), then [1010, 1110], [1110, 1160] us
    assert decoded.track_counters(process, "GPU 0 exposed_comm per step") == [
        (10 * US, 20 * US), (110 * US, 20 * US), (160 * US, 0), (1010 * US, 20 * US), (1110 * US, 20 * US), (1160 * US, 0)]
    assert len(decoded.track_slices(process, "GPU 0 stream 20")) == 4
    assert decoded.process_names().count(process) == 1


def test_profiling_cycles_with_clocks_of_their_own_are_paired_in_wall_clock_order(tmp_path: Path) -> None:
    """Two ranks, two profiling cycles each, every file on a clock of its own (baseTimeNanoseconds + relative
    ts, as the collectors write them), no Seq; rank 1's clock runs 300 us ahead. Cycle a: 3 steps from
    wall 1 ms; cycle b: 4 steps from wall 10 ms (rank 0's file b starts its ts at 0, rank 1's at 5.3 ms
    on a base 5 ms later). In trace time rank 1's cycles interleave with rank 0's; in wall time they do
    not, so the k-th all-reduce of each rank is the same collective, and the skew is 300 us."""
    base = 1_700_000_000_000_000_000

    def cycle(rank: int, rel: int, first: int, n: int) -> TraceBuilder:
        t = TraceBuilder(rank=rank)
        for i in range(n):
            lo = rel + i * 100 * US
            t.step(first + i, lo, lo + 100 * US)
            t.kernel(GEMM, lo + 10 * US, lo + 30 * US, launch_ns=lo + 5 * US)
            t.kernel(ALL_REDUCE, lo + (40 + 2 * rank) * US, lo + 60 * US, stream=20, launch_ns=lo + 35 * US,
                     **{"Collective name": "allreduce", "Process Group Name": "0", "Group size": 2})
        return t

    job = tmp_path / "job"
    cycle(0, 1 * MS, 1, 3).write(job / "rank0.a.json", baseTimeNanoseconds=base)
    cycle(0, 0, 11, 4).write(job / "rank0.b.json", baseTimeNanoseconds=base + 10 * MS)
    cycle(1, 1 * MS + 300 * US, 1, 3).write(job / "rank1.a.json", baseTimeNanoseconds=base)
    cycle(1, 5 * MS + 300 * US, 11, 4).write(job / "rank1.b.json", baseTimeNanoseconds=base + 5 * MS)
    db = tmp_path / "w.duckdb"
    assert ingest_traces([job], db, threads=1).ok
    with connect(db, read_only=True) as con:
        skew = relation(con, "clock_skew").select("rank, skew_ns, n_matched").fetchall()
        waits = relation(con, "comm_instances").order("rank, ordinal").select("rank, wait_ns").fetchall()
    assert skew == [(1, 300 * US, 7)]
    # every instance pairs rank 0's kernel (20 us) with rank 1's (18 us, arriving last): 2 us of waiting
    assert [w for r, w in waits if r == 0] == [2 * US] * 7 and [w for r, w in waits if r == 1] == [0] * 7


def test_gloo_collectives_give_cpu_only_ranks_their_clock_offset(tmp_path: Path) -> None:
    """CPU-only ranks (gloo): each step's all-reduce span ends at the same instant on both ranks, rank 1's
    clock runs 500 us ahead, rank 0 arrives late (waits less): skew 500 us from 3 collectives."""
    for rank in (0, 1):
        t = TraceBuilder(rank=rank)
        shift = 500 * US * rank
        for n in (1, 2, 3):
            lo = n * MS + shift
            t.step(n, lo, lo + MS)
            t.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 1,
                             "ts": (lo + 10 * US) / US, "dur": 50.0})
            t.events.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 100, "tid": 2,
                             "ts": (lo + (100 + 50 * (1 - rank)) * US) / US, "dur": (200 - 50 * (1 - rank)) * 1.0})
        t.write(tmp_path / "gloo" / f"rank{rank}.json")
    db = tmp_path / "w.duckdb"
    assert ingest_traces([tmp_path / "gloo"], db, threads=1).ok
    with connect(db, read_only=True) as con:
        assert relation(con, "clock_skew").select("rank, skew_ns, n_matched").fetchall() == [(1, 500 * US, 3)]
    summary = export_perfetto(db, tmp_path / "gloo.pftrace")
    assert [(c.rank, c.status, c.offset_ns) for c in summary.clocks] == [(0, "reference", 0), (1, "estimated", -500 * US)]


def test_runs_ranks_and_steps_limit_what_is_written(handmade: Path, tmp_path: Path) -> None:
    out = tmp_path / "one.pftrace"
    summary = export_perfetto(handmade, out, runs=["skewed"], ranks="1", selection=StepSelection(step_min=2, step_max=2, include_last=True))
    decoded = decode(out)
    assert decoded.process_names() == ["skewed rank 1"] and summary.runs == ("skewed",)
    assert decoded.track_slices("skewed rank 1", "CPU steps") == [(0, 100 * US, "step 2")]  # step 2 is time 0 now
    assert [name for _, _, name in decoded.track_slices("skewed rank 1", "GPU 0 stream 20")] == [ALL_REDUCE]
    assert summary.slices == 2


def test_parse_ranks_reads_ranges_and_lists() -> None:
    assert parse_ranks("0-3,8") == (0, 1, 2, 3, 8)
    assert parse_ranks(" 5 , 2 ") == (2, 5)
    assert parse_ranks([3, 1, 3]) == (1, 3)
    assert parse_ranks(None) is None
    for bad in ("3-1", "a", "0-", ""):
        with pytest.raises(ConfigError) as exc:
            parse_ranks(bad)
        assert exc.value.param == "ranks"
    assert len(parse_ranks("0-1048575")) == 1 << 20
    for huge in ("0-30000000", "0-1048575,2000000"):  # refused before a list of that size is built
        with pytest.raises(ConfigError, match="no run has that many"):
            parse_ranks(huge)


def test_bad_input_is_refused_with_what_exists(handmade: Path, tmp_path: Path) -> None:
    with pytest.raises(EmptySelection, match="no run 'nope' in the warehouse; it holds cycles, overlap, power, skewed"):
        export_perfetto(handmade, tmp_path / "a.pftrace", runs=["nope"])
    with pytest.raises(EmptySelection, match="run skewed: 0-1"):
        export_perfetto(handmade, tmp_path / "a.pftrace", runs=["skewed"], ranks="5-7")
    with pytest.raises(EmptySelection, match=r"no step is selected \(steps 9..9"):
        export_perfetto(handmade, tmp_path / "a.pftrace", selection=StepSelection(step_min=9, step_max=9))
    with pytest.raises(ConfigError, match="is a directory"):
        export_perfetto(handmade, tmp_path)
    with pytest.raises(ConfigError, match="is the warehouse"):
        export_perfetto(handmade, handmade, overwrite=True)
    (tmp_path / "old.pftrace").write_bytes(b"keep")
    with pytest.raises(ConfigError, match="exists; overwrite it"):
        export_perfetto(handmade, tmp_path / "old.pftrace")
    assert (tmp_path / "old.pftrace").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.pftrace"]


def test_a_failed_export_leaves_nothing_half_written(handmade: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "run.pftrace"
    target.write_bytes(b"the earlier trace")
    written = []

    def failing_counter(self, track, ts, value):  # fail half-way, after packets were flushed to the file
        self.flush()
        written.append(ts)
        if len(written) == 5:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(pftrace.TraceWriter, "counter", failing_counter)
    with pytest.raises(OSError):
        export_perfetto(handmade, target, overwrite=True)
    assert target.read_bytes() == b"the earlier trace"
    assert [p.name for p in tmp_path.iterdir()] == ["run.pftrace"]


def test_an_export_removes_what_a_killed_one_left_and_nothing_else(handmade: Path, tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".run.pftrace.{int(gone.stdout)}.0a1b2c3d.tmp"  # a process that has ended
    alive = tmp_path / f".run.pftrace.{os.getppid()}.0a1b2c3d.tmp"  # one still running (this one's parent)
    other = tmp_path / f".other.pftrace.{int(gone.stdout)}.0a1b2c3d.tmp"  # another output's, its writer gone too
    mine = tmp_path / ".notes.1.tmp"  # a name traceq does not make
    for path in (stale, alive, other, mine):
        path.write_bytes(b"half")
    export_perfetto(handmade, tmp_path / "run.pftrace")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, mine.name, "run.pftrace"])


@pytest.mark.slow
def test_batches_of_any_size_write_the_same_file(handmade: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    export_perfetto(handmade, tmp_path / "default.pftrace")
    monkeypatch.setattr(timeline, "FETCH_ROWS", 2)
    monkeypatch.setattr(pftrace, "BATCH_PACKETS", 3)
    export_perfetto(handmade, tmp_path / "small.pftrace")
    assert (tmp_path / "small.pftrace").read_bytes() == (tmp_path / "default.pftrace").read_bytes()


@pytest.mark.slow
def test_a_parquet_export_gives_the_same_trace(handmade: Path, tmp_path: Path) -> None:
    export_parquet(handmade, tmp_path / "pq")
    export_perfetto(handmade, tmp_path / "from_duckdb.pftrace")
    export_perfetto(tmp_path / "pq", tmp_path / "from_parquet.pftrace")
    assert (tmp_path / "from_parquet.pftrace").read_bytes() == (tmp_path / "from_duckdb.pftrace").read_bytes()


def test_importing_traceq_and_its_cli_does_not_import_perfetto() -> None:
    code = "import sys, traceq, traceq.cli, traceq.perfetto.timeline; assert 'perfetto' not in sys.modules, 'perfetto'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --------------------------------------------------------------------------------------------------
# real traces


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Decoded, timeline.TimelineSummary]:
    """The merged 4-rank RCCL job, the MI300X DDP rank and the B200 vLLM rank (no step marker: one window
    over its whole trace; kernels that overlap on one stream), exported with the default step selection."""
    files = [corpus_path("amd_hpctraining/fused_traces/merged_all_events.json.gz"),
             corpus_path("tracelens/mi300/resnet_act_checkpoint.json.gz"),
             corpus_path("tracelens/b200/eager_trace.json.gz")]
    root = tmp_path_factory.mktemp("corpus_timeline")
    db = root / "w.duckdb"
    assert ingest_traces(files, db).ok
    summary = export_perfetto(db, root / "corpus.pftrace")
    return db, decode(root / "corpus.pftrace"), summary


def exported_events(db: Path) -> dict[tuple[str, str], list[int]]:
    """(process, 'GPU d stream s') -> the warehouse start_ns of the device events an export of the default
    steps writes: those with time inside the span of the rank's selected step windows on the device (and
    those of zero length in it)."""
    with connect(db, read_only=True) as con:
        spans = relation(con, "selected_windows").aggregate(
            "trace_id, rank, device, min(start_ns) as lo, max(end_ns) as hi", "trace_id, rank, device").set_alias("s")
        events = con.table("gpu_events").set_alias("g").join(con.table("traces").set_alias("t"), "g.trace_id = t.trace_id")
        rows = events.join(spans, "s.trace_id = g.trace_id and s.rank = g.rank and s.device = coalesce(g.device, -1) "
                                  "and ((g.start_ns < s.hi and g.start_ns + g.dur_ns > s.lo) "
                                  "or (g.dur_ns = 0 and g.start_ns between s.lo and s.hi))").select(
            "t.run, g.rank, coalesce(g.device, -1) as device, g.stream, g.start_ns").fetchall()
    out: dict[tuple[str, str], list[int]] = defaultdict(list)
    for run, rank, device, stream, start in rows:
        out[(f"{run} rank {rank}", f"GPU {device} stream {stream}")].append(start)
    return {key: sorted(starts) for key, starts in out.items()}


@pytest.mark.slow
def test_corpus_slice_counts_per_stream_equal_the_warehouse(corpus_runs) -> None:
    db, decoded, summary = corpus_runs
    expected = {key: len(starts) for key, starts in exported_events(db).items()}
    assert stream_counts(decoded) == expected
    assert summary.slices == sum(expected.values()) > 10_000
    assert_no_overlap_on_any_track(decoded)
    assert sorted(decoded.process_names()) == ["b200 rank 0", *(f"fused_traces rank {r}" for r in range(4)), "mi300 rank 0"]
    # `traceq check` finds kernels overlapping on one stream of the B200 trace: they are on extra tracks
    overlapping = [name for name in decoded.children("b200 rank 0") if "(overlap" in name]
    assert overlapping and summary.overlap_tracks == len(overlapping)
    assert check_warehouse(db).table.filter(run="b200", check="overlapping_kernels").height == 1


def test_corpus_counters_equal_traceq_report_to_the_ns(corpus_runs) -> None:
    db, decoded, _ = corpus_runs
    report = compute_metric(db, ",".join(COUNTERS), by="run,rank,device,step")
    # fused_traces: steps 9 and 10 of 4 ranks (11, the last, open); mi300: 15 and 16 (17 open); b200: its whole trace
    assert report.height == 8 + 2 + 1
    checked = 0
    for (run, rank, device), rows in report.sort("step").group_by("run", "rank", "device", maintain_order=True):
        process = f"{run} rank {rank}"
        windows = decoded.track_slices(process, f"GPU {device} steps (device windows)")
        assert [name for *_, name in windows] == [f"step {s}" if s >= 0 else "whole trace" for s in rows["step"]]
        for name in COUNTERS:
            values = [round(v * 1000) for v in rows[f"{name}_us"]]
            expected = []  # each window's value from its start; 0 where a window ends and no other starts
            for i, ((start, end, _), value) in enumerate(zip(windows, values)):
                expected.append((start, value))
                if i + 1 == len(windows) or windows[i + 1][0] > end:
                    expected.append((end, 0))
            assert decoded.track_counters(process, f"GPU {device} {name} per step") == expected, (process, name)
            checked += len(values)
    assert checked == 11 * len(COUNTERS)


def test_corpus_comm_kernels_carry_their_collective_and_wait_vs_transfer(corpus_runs) -> None:
    db, decoded, _ = corpus_runs
    names = {d.uuid: d.process.process_name for d in decoded.tracks.values() if d.HasField("process")}
    comm: dict[str, list] = defaultdict(list)  # run -> its comm slices
    for uuid, slices in decoded.slices.items():
        if " stream " in decoded.tracks[uuid].name:
            run = names[decoded.tracks[uuid].parent_uuid].split(" rank ")[0]
            comm[run] += [s for s in slices if s[3] == "comm"]
    assert {s[4]["collective_type"] for s in comm["fused_traces"]} == {"AllReduce", "Broadcast"}
    fused = comm["fused_traces"]
    assert len(fused) == 4 * 14  # steps 9 and 10 of each rank; step 11, the last, is left out
    assert all(s[4]["matched"] and s[4]["size_bytes"] > 0 for s in fused)
    assert all(s[4]["wait_ns"] + s[4]["transfer_ns"] == s[1] - s[0] for s in fused)
    # each kernel's wait is the one `traceq collectives --instances` gives it
    import traceq

    instances = traceq.instances_report(db).table.filter(pl.col("run") == "fused_traces").sort("rank", "start_us")
    checked = 0
    for (rank,), rows in instances.group_by("rank", maintain_order=True):
        exported = sorted((ts, end - ts, args["wait_ns"]) for uuid, slices in decoded.slices.items()
                          if names.get(decoded.tracks[uuid].parent_uuid) == f"fused_traces rank {rank}"
                          for ts, end, _, category, args in slices if category == "comm")
        # the steps exported are the trace's first: its kernels in time order, the first of the table's
        expected = [(round(d * 1000), round(w * 1000)) for d, w in rows.select("dur_us", "wait_us").iter_rows()]
        assert [(dur, wait) for _, dur, wait in exported] == expected[:len(exported)]
        checked += len(exported)
    assert checked == len(fused) and sum(s[4]["wait_ns"] > 0 for s in fused) > 30
    # a kernel of a group whose other ranks are not in the run is not matched: all of it is transfer
    assert comm["mi300"] and all(not s[4]["matched"] and s[4]["transfer_ns"] == s[1] - s[0] for s in comm["mi300"])


def test_corpus_each_rank_is_shifted_by_exactly_its_clock_offset(corpus_runs) -> None:
    """On the timeline every slice of a rank sits at its warehouse time + one constant: the trace's wall
    offset + the rank's clock offset - the run's origin. The four ranks share one trace (one wall offset),
    so their constants differ by their clock offsets: -skew of `traceq check`'s estimate."""
    db, decoded, summary = corpus_runs
    offsets = {c.rank: c.offset_ns for c in summary.clocks if c.run == "fused_traces"}
    assert offsets[0] == 0 and [c.status for c in summary.clocks if c.run == "fused_traces"] == [
        "reference", "estimated", "estimated", "estimated"]
    with connect(db, read_only=True) as con:
        skew = dict(relation(con, "clock_skew").filter("run = 'fused_traces'").select("rank, skew_ns").fetchall())
    shifts: dict[int, set[int]] = defaultdict(set)
    for (process, stream), starts in exported_events(db).items():
        if process.startswith("fused_traces"):
            placed = sorted(s[0] for s in decoded.slices[decoded.children(process)[stream]])
            placed += [s[0] for name, uuid in decoded.children(process).items() if name.startswith(f"{stream} (overlap")
                       for s in decoded.slices[uuid]]
            shifts[int(process.rsplit(" ", 1)[1])] |= {p - s for p, s in zip(sorted(placed), starts)}
    assert all(len(s) == 1 for s in shifts.values()), shifts
    for rank in (1, 2, 3):
        assert offsets[rank] == -round(skew[rank]) != 0
        assert min(shifts[rank]) - min(shifts[0]) == offsets[rank]


# --------------------------------------------------------------------------------------------------
# Perfetto's own importer (the one the UI runs), where its trace processor is at hand: the export does
# not need it, this check does


def perfetto_import(path: Path) -> dict[str, Any]:
    """What Perfetto's trace processor makes of the file: slices and counters per (process, track)."""
    if not TRACE_PROCESSOR.is_file():
        skip_or_fail(f"{TRACE_PROCESSOR} is absent: Perfetto's trace processor, built for this machine (../shared/bin)")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=str(TRACE_PROCESSOR)))
    try:
        def rows(sql: str) -> list[dict[str, Any]]:
            return [r.__dict__ for r in tp.query(sql)]

        slices: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
        for r in rows("select p.name as process, t.name as track, s.ts, s.dur, s.name, s.depth from slice as s "
                      "join track as t on t.id = s.track_id join process as p on p.upid = extract_arg(t.dimension_arg_set_id, 'upid') "
                      "order by s.ts, s.id"):
            assert r["depth"] == 0, r
            slices[(r["process"], r["track"])].append((r["ts"], r["ts"] + r["dur"], r["name"]))
        counters: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
        for r in rows("select p.name as process, t.name as track, c.ts, c.value from counter as c "
                      "join counter_track as t on t.id = c.track_id join process as p on p.upid = extract_arg(t.dimension_arg_set_id, 'upid') "
                      "order by c.ts, c.id"):
            counters[(r["process"], r["track"])].append((r["ts"], r["value"]))
        problems = rows("select name, value from stats where value > 0 and severity in ('error', 'data_loss')")
        [meta] = rows("select str_value from metadata where name = 'cr-traceq'")
        return {"slices": dict(slices), "counters": dict(counters), "problems": problems,
                "metadata": json.loads(meta["str_value"])}
    finally:
        tp.close()


def by_track(decoded: Decoded) -> tuple[dict, dict]:
    """The decoded slices and counters keyed like :func:`perfetto_import`'s."""
    names = {d.uuid: d.process.process_name for d in decoded.tracks.values() if d.HasField("process")}
    slices, counters = {}, {}
    for uuid, d in decoded.tracks.items():
        key = (names.get(d.parent_uuid), d.name)
        if decoded.slices.get(uuid):
            slices[key] = sorted((ts, end, name) for ts, end, name, _, _ in decoded.slices[uuid])
        if decoded.counters.get(uuid):
            counters[key] = sorted(decoded.counters[uuid])
    return slices, counters


@pytest.mark.slow
@pytest.mark.parametrize("which", ["handmade", "corpus"])
def test_perfettos_importer_keeps_every_slice_and_counter(which: str, handmade_trace, request) -> None:
    if which == "handmade":
        decoded, summary = handmade_trace
    else:
        _, decoded, summary = request.getfixturevalue("corpus_runs")
    imported = perfetto_import(summary.path)
    assert imported["problems"] == []
    slices, counters = by_track(decoded)
    assert {k: sorted(v) for k, v in imported["slices"].items()} == slices
    assert {k: sorted(v) for k, v in imported["counters"].items()} == counters
    assert sum(len(v) for k, v in slices.items() if " stream " in k[1]) == summary.slices
    assert imported["metadata"] == decoded.metadata["traceq"]


# --------------------------------------------------------------------------------------------------
# the command line


def test_cli_writes_the_trace_and_says_what_it_holds(handmade: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.pftrace"
    result = CliRunner().invoke(app, ["export", "--perfetto", str(out), "--db", str(handmade), "--run", "skewed",
                                      "--steps", "1:1", "--ranks", "0-1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out}: ") and "1 run(s), 2 rank(s), 4 GPU events" in result.stdout
    assert "ui.perfetto.dev" in result.stdout
    assert "note: steps used: run skewed: steps 1..1, 2 rank-steps over 2 rank(s)" in result.stderr
    assert "note: run skewed: 1 rank(s) placed on rank 0's clock" in result.stderr
    assert decode(out).process_names() == ["skewed rank 0", "skewed rank 1"]


@pytest.mark.parametrize(("args", "text"), [
    ([], "give one of --parquet DIR (the warehouse as Parquet) and --perfetto FILE"),
    (["--perfetto", "{out}", "--parquet", "{tmp}/pq"], "give one of --parquet DIR"),
    (["--parquet", "{tmp}/pq", "--ranks", "0", "--steps", "1:2"], "--steps, --ranks: only with --perfetto"),
    (["--perfetto", "{out}", "--run", "nope"], "no run 'nope' in the warehouse; it holds cycles, overlap, power, skewed"),
    (["--perfetto", "{out}", "--ranks", "x"], "--ranks x: expected rank numbers and ranges"),
    (["--perfetto", "{out}", "--ranks", "7"], "--ranks 7: no selected step on these ranks"),
    (["--perfetto", "{out}", "--steps", "5:1"], "--steps 5:1: the end is before the start"),
    (["--perfetto", "{tmp}"], "is a directory; give the trace a file name"),
    (["--perfetto", "{tmp}/no/such/dir/run.pftrace"], "no directory"),
])
def test_cli_bad_input_gives_one_line(handmade: Path, tmp_path: Path, args: list[str], text: str) -> None:
    out = tmp_path / "run.pftrace"
    args = [a.format(out=out, tmp=tmp_path) for a in args]
    result = CliRunner().invoke(app, ["export", *args, "--db", str(handmade)])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: ") and text in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "pq").exists()


def test_cli_replaces_a_trace_only_with_overwrite(handmade: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.pftrace"
    out.write_bytes(b"earlier")
    refused = CliRunner().invoke(app, ["export", "--perfetto", str(out), "--db", str(handmade)])
    assert refused.exit_code == 1 and "exists; overwrite it (--overwrite)" in refused.stderr
    assert out.read_bytes() == b"earlier"
    done = CliRunner().invoke(app, ["export", "--perfetto", str(out), "--db", str(handmade), "--overwrite"])
    assert done.exit_code == 0, done.output
    assert sorted(decode(out).process_names()) == ["cycles rank 0", "overlap rank 0", "power rank 0", "skewed rank 0",
                                                   "skewed rank 1"]
