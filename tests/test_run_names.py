"""Which run a trace is in (docs/explanation/metrics.md, "Trace identity"): the name its collector's run.json gives,
else its folder's name as the user gave the path (a link is not followed for the name; the side files are the link's
folder's); --name wins over both. And a GPU model given by hand that names several rows of the peak table needs the
peak with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_step_windows import lagging_trace
from traceq.peaks import gpu_peaks, peak_candidates, peak_for
from traceq.cli import app
from traceq.errors import ConfigError
from traceq.ingest import ingest_traces
from traceq.ingest.identity import run_name_of
from traceq.store.run_metadata import set_run_metadata
from traceq.store.warehouse import opened

POWER_HEADER = {"kind": "header", "source": "unavailable", "reason": "test: no NVML", "gpus": []}


def _rows(db: Path, sql: str) -> list[tuple]:
    with opened(db) as con:
        return con.execute(sql).fetchall()


def _run_folder(folder: Path, run_json: dict | None = None, power: bool = False) -> Path:
    """A tiny one-rank trace in ``folder``, with the collector's side files when asked."""
    path = lagging_trace().write(folder / "rank0.trace.json")
    if run_json is not None:
        (folder / "rank0.run.json").write_text(json.dumps(run_json))
    if power:
        (folder / "rank0.power.jsonl").write_text(json.dumps(POWER_HEADER) + "\n")
    return path


def test_the_run_json_names_the_run_and_name_wins_over_it(tmp_path: Path) -> None:
    path = _run_folder(tmp_path / "y", {"run": "x", "rank": 0, "world_size": 1, "warmup_steps": 1})
    db = tmp_path / "w.duckdb"
    summary = ingest_traces([tmp_path / "y"], db, threads=1)
    assert summary.ok and [f.run for f in summary.files] == ["x"]
    assert _rows(db, "select run from runs") == [("x",)]
    assert _rows(db, "select run, rank from run_files") == [("x", 0)]
    assert run_name_of(path, None) == "x" and run_name_of(path, "z") == "z"
    named = tmp_path / "n.duckdb"
    assert [f.run for f in ingest_traces([path], named, name="z", threads=1).files] == ["z"]
    assert _rows(named, "select run from runs") == [("z",)]


def test_re_ingesting_a_run_named_by_its_run_json_changes_nothing(tmp_path: Path) -> None:
    _run_folder(tmp_path / "y", {"run": "x", "rank": 0, "world_size": 1})
    db = tmp_path / "w.duckdb"
    assert ingest_traces([tmp_path / "y"], db, threads=1).ok
    tables = ("runs", "traces", "steps", "gpu_events", "run_files")
    before = {t: _rows(db, f"select * from {t} order by all") for t in tables}
    again = ingest_traces([tmp_path / "y"], db, threads=1)
    assert [f.status for f in again.files] == ["skipped"] and "run x" in again.files[0].message
    forced = ingest_traces([tmp_path / "y"], db, threads=1, force=True)
    assert forced.ok and [f.run for f in forced.files] == ["x"]
    after = {t: _rows(db, f"select * from {t} order by all") for t in tables}
    assert after["runs"] == before["runs"] and len(after["traces"]) == 1
    assert len(after["gpu_events"]) == len(before["gpu_events"]) and len(after["run_files"]) == 1


def test_a_run_json_without_a_run_or_one_that_cannot_be_read_leaves_the_folder_name(tmp_path: Path) -> None:
    path = _run_folder(tmp_path / "y", {"rank": 0, "world_size": 1})
    assert run_name_of(path, None) == "y"
    (tmp_path / "y" / "rank0.run.json").write_text("[1, 2]")  # not a run.json: its load says so, not the name
    assert run_name_of(path, None) == "y"
    failed = ingest_traces([path], tmp_path / "w.duckdb", threads=1).files[0]
    assert failed.status == "failed" and "run.json must hold one JSON object" in failed.message


def test_a_run_json_run_that_is_no_run_name_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = _run_folder(tmp_path / "y", {"run": "a\x1b[2Jb", "rank": 0})
    with pytest.raises(ConfigError, match=r'rank0\.run\.json: its "run" is no run name .*give the run a name'):
        run_name_of(path, None)
    failed = ingest_traces([path], tmp_path / "w.duckdb", threads=1).files[0]
    assert failed.status == "failed" and "rank0.run.json" in failed.message


def test_a_symlinked_folder_names_the_run_after_the_link_with_the_links_side_files(tmp_path: Path) -> None:
    """The link ``runs/job-a`` points at ``store/0017``; ``runs/job-a`` holds its own run.json (a copy of the
    trace beside it links back to the stored one): the run is job-a, its metadata and power log the link
    folder's. A folder link without a run.json: the link's name too."""
    stored = tmp_path / "store" / "0017"
    _run_folder(stored, {"rank": 0, "world_size": 1, "warmup_steps": 0, "model": "target"})
    link = tmp_path / "runs" / "job-a"
    link.parent.mkdir()
    link.symlink_to(stored, target_is_directory=True)
    db = tmp_path / "w.duckdb"
    summary = ingest_traces([link / "rank0.trace.json"], db, threads=1)
    assert summary.ok and [f.run for f in summary.files] == ["job-a"], [f.message for f in summary.files]
    assert _rows(db, "select run, json_extract_string(metadata, '$.model') from runs") == [("job-a", "target")]

    # a folder of its own whose trace is a link into another folder: the side files beside the link
    mine = tmp_path / "runs" / "job-b"
    mine.mkdir()
    (mine / "rank0.trace.json").symlink_to(stored / "rank0.trace.json")
    (mine / "rank0.run.json").write_text(json.dumps({"rank": 0, "world_size": 1, "model": "mine"}))
    (mine / "rank0.power.jsonl").write_text(json.dumps(POWER_HEADER) + "\n")
    db2 = tmp_path / "w2.duckdb"
    summary = ingest_traces([mine / "rank0.trace.json"], db2, threads=1)
    assert summary.ok and [f.run for f in summary.files] == ["job-b"], [f.message for f in summary.files]
    assert _rows(db2, "select run, json_extract_string(metadata, '$.model') from runs") == [("job-b", "mine")]
    assert _rows(db2, "select run, path from run_files") == [("job-b", str((mine / "rank0.run.json").resolve()))]
    assert _rows(db2, "select source, path from power_logs") == [("unavailable", str((mine / "rank0.power.jsonl").resolve()))]


def test_a_file_of_its_own_is_named_after_its_folder_as_given(tmp_path: Path) -> None:
    t = lagging_trace()
    t.rank = None  # no rank, no job: a run of its own, folder/file
    t.write(tmp_path / "store" / "worker0.json")
    (tmp_path / "resnet").symlink_to(tmp_path / "store", target_is_directory=True)
    summary = ingest_traces([tmp_path / "resnet" / "worker0.json"], tmp_path / "w.duckdb", threads=1)
    assert summary.ok and [f.run for f in summary.files] == ["resnet/worker0"]


def test_the_cli_names_the_run_from_the_run_json(tmp_path: Path) -> None:
    shutil.copytree(_run_folder(tmp_path / "src", {"run": "x", "rank": 0}).parent, tmp_path / "y")
    result = CliRunner().invoke(app, ["ingest", str(tmp_path / "y"), "--db", str(tmp_path / "w.duckdb")])
    assert result.exit_code == 0 and ": run x, rank 0" in result.stdout, result.output


# ---------------------------------------------------------------------------------------------
# the peak of a GPU model given by hand


def test_every_gpu_of_the_peak_table_is_found_by_its_own_name() -> None:
    for peak in gpu_peaks():
        assert peak_for(peak.gpu) == peak, peak.gpu
        assert peak_candidates(peak.gpu) == (peak,), peak.gpu


@pytest.mark.parametrize(("name", "gpus"), [
    ("H100", ["H100 NVL", "H100 PCIe", "H100 SXM"]), ("nvidia h100", ["H100 NVL", "H100 PCIe", "H100 SXM"]),
    ("H800", ["H800 PCIe", "H800 SXM"]), ("V100", ["V100 PCIe", "V100 SXM2"]),
    ("H100 SXM", ["H100 SXM"]), ("H100 PCIe", ["H100 PCIe"]), ("NVIDIA H100 80GB HBM3", ["H100 SXM"]),
    ("H200", ["H200"]), ("A100", ["A100"]), ("NVIDIA A100-SXM4-80GB", ["A100"]), ("B200", ["B200"]),
    ("MI300X", ["MI300X"]), ("Tesla V100-PCIE-16GB", ["V100 PCIe"]), ("Mystery 9000", []),
])
def test_a_name_means_the_rows_it_could_be(name: str, gpus: list[str]) -> None:
    assert [p.gpu for p in peak_candidates(name)] == gpus


def test_an_ambiguous_gpu_model_needs_the_peak_and_names_the_candidates(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    _run_folder(tmp_path / "job", {"rank": 0, "world_size": 1})
    assert ingest_traces([tmp_path / "job"], db, threads=1).ok
    with pytest.raises(ConfigError) as refused:
        set_run_metadata(db, "job", {"gpu_model": "H100"})
    message = str(refused.value)
    assert message.startswith("gpu_model='H100': names 3 GPUs of the peak table (H100 NVL 835, H100 PCIe 756, H100 SXM 989")
    assert "give its dense BF16 peak (peak_tflops) with it, or the full model: 'H100 NVL' or 'H100 PCIe' or 'H100 SXM'" in message
    assert _rows(db, "select count(*) from run_settings") == [(0,)]  # refused: nothing set

    result = CliRunner().invoke(app, ["runs", "set", "job", "--gpu-model", "H100", "--db", str(db)])
    assert result.exit_code == 1 and result.stderr.startswith("error: --gpu-model H100: names 3 GPUs") and \
        "peak_tflops" in result.stderr, result.output
    # with the peak, or by its full name: set, and the peak is the one asked for
    assert set_run_metadata(db, "job", {"gpu_model": "H100 PCIe"})["gpu_model"] == "H100 PCIe"
    assert _rows(db, "select json_extract_string(metadata, '$.gpu_model') from runs") == [("H100 PCIe",)]
    merged = set_run_metadata(db, "job", {"gpu_model": "H100", "peak_tflops": 756})
    assert (merged["gpu_model"], merged["peak_tflops"], merged["peak_tflops_source"]) == ("H100", 756.0, "user")
