"""The scaling report on hand-made runs (tracegen traces + run.json + power logs) whose answers are worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.tracegen import TraceBuilder
from traceq.cli import app
from traceq.report.selection import StepSelection
from traceq.errors import EmptySelection
from traceq.ingest import ingest_traces
from traceq.report.scaling import scaling_report

MS = 1_000_000
BASE = 1_700_000_000_000_000_000


def make_run(root: Path, name: str, world: int, tokens: int, step_ms: int, model: str, watts: float | None) -> list[Path]:
    """`world` rank files, each 2 steps of `step_ms`; optional constant power sampled every 50 ms."""
    files = []
    for rank in range(world):
        t = TraceBuilder(rank=rank)
        for n in (1, 2):
            start = (n - 1) * step_ms * MS
            t.step(n, start, start + step_ms * MS)
            t.kernel("void gemm_kernel()", start + 10_000, start + 50_000, launch_ns=start + 1_000)
        files.append(t.write(root / name / f"rank{rank}.trace.json", baseTimeNanoseconds=BASE))
        meta = {"rank": rank, "world_size": world, "tokens_per_step": tokens, "warmup_steps": 0, "model": model,
                "model_flops_per_token": 1e9, "peak_tflops": 100.0, "peak_tflops_source": "user"}
        (root / name / f"rank{rank}.run.json").write_text(json.dumps(meta))
        if watts is not None:
            lines = [{"kind": "header", "source": "nvml", "interval_ms": 50.0, "gpus": [{"gpu": rank}]}]
            lines += [{"kind": "power", "wall_ns": BASE + (t_ms - 10) * MS, "step": 1, "gpu": rank, "power_w": watts}
                      for t_ms in range(0, 2 * step_ms + 60, 50)]
            (root / name / f"rank{rank}.power.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return files


@pytest.fixture(scope="module")
def scaling_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Model A, weak scaling (1000 tokens per GPU per step): world 1, 2, 4 with steps of 100, 125, 160 ms
    and 200 W per GPU. Model B, strong scaling (4000 tokens per step): world 2, 4 with 200, 125 ms."""
    root = tmp_path_factory.mktemp("scaling")
    files = (make_run(root, "a1", 1, 1000, 100, "A", 200.0) + make_run(root, "a2", 2, 2000, 125, "A", 200.0)
             + make_run(root, "a4", 4, 4000, 160, "A", 200.0) + make_run(root, "b2", 2, 4000, 200, "B", None)
             + make_run(root, "b4", 4, 4000, 125, "B", None))
    db = root / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    return db


def test_weak_scaling_table_by_hand(scaling_db: Path) -> None:
    report = scaling_report(scaling_db, by=["model"], runs=["a1", "a2", "a4"])
    table, notes = report.table, report.notes
    rows = table.to_dicts()
    assert [r["world_size"] for r in rows] == [1, 2, 4]
    # global tokens/s = tokens_per_step / step time: 1000 / 0.1, 2000 / 0.125, 4000 / 0.16
    assert [r["global_tokens_per_s"] for r in rows] == pytest.approx([10_000, 16_000, 25_000])
    # ideal: 10,000 x world size; efficiency = measured / ideal
    assert [r["ideal_tokens_per_s"] for r in rows] == pytest.approx([10_000, 20_000, 40_000])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 0.8, 0.625])
    # marginal: (16,000 - 10,000) / 1 GPU, (25,000 - 16,000) / 2 GPUs
    assert rows[0]["marginal_tokens_per_s_per_gpu"] is None
    assert [r["marginal_tokens_per_s_per_gpu"] for r in rows[1:]] == pytest.approx([6_000, 4_500])
    assert [r["tokens_per_s"] for r in rows] == pytest.approx([10_000, 8_000, 6_250])
    # 1e9 FLOPs per token x 1000 tokens per GPU / step time / 1e12 = 10, 8, 6.25 TFLOP/s; / 100 peak
    assert [r["tflops"] for r in rows] == pytest.approx([10.0, 8.0, 6.25])
    assert [r["mfu"] for r in rows] == pytest.approx([0.1, 0.08, 0.0625])
    # 200 W per GPU: 1000 tokens per GPU per step / (200 W x step time)
    assert [r["power_w"] for r in rows] == pytest.approx([200.0, 200.0, 200.0])
    assert [r["tokens_per_j"] for r in rows] == pytest.approx([50.0, 40.0, 31.25])
    assert [r["scaling"] for r in rows] == ["base", "weak", "weak"]
    assert [r["ranks"] for r in rows] == [1, 2, 4]
    assert any("ideal_tokens_per_s" in n for n in notes)


def test_strong_scaling_is_a_separate_series_by_model(scaling_db: Path) -> None:
    table = scaling_report(scaling_db, by=["model"]).table
    b = table.filter(table["model"] == "B").to_dicts()
    # 4000 tokens per step over 0.2 s and 0.125 s: 20,000 and 32,000 tokens/s; ideal 20,000 x 4 / 2
    assert [r["global_tokens_per_s"] for r in b] == pytest.approx([20_000, 32_000])
    assert [r["ideal_tokens_per_s"] for r in b] == pytest.approx([20_000, 40_000])
    assert b[1]["efficiency"] == pytest.approx(0.8) and b[1]["marginal_tokens_per_s_per_gpu"] == pytest.approx(6_000)
    assert [r["scaling"] for r in b] == ["base", "strong"]
    assert b[0]["power_w"] is None and b[0]["tokens_per_j"] is None  # no power log: empty, not zero


def test_scaling_from_the_cli(scaling_db: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["scaling", "--by", "model", "--format", "json", "--db", str(scaling_db)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["model"], r["world_size"]) for r in rows] == [("A", 1), ("A", 2), ("A", 4), ("B", 2), ("B", 4)]
    assert "note: ideal_tokens_per_s" in result.stderr
    bad = runner.invoke(app, ["scaling", "--by", "world_size", "--db", str(scaling_db)])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: --by world_size: unknown column(s) ['world_size']")
    assert "use any of nodes, gpus_per_node" in bad.stderr  # world_size is the x axis, not a series


def test_scaling_of_an_empty_selection_says_what_to_do(scaling_db: Path) -> None:
    with pytest.raises(EmptySelection, match="no run 'absent' in the warehouse; it holds a1, a2, a4, b2, b4"):
        scaling_report(scaling_db, runs=["absent"])
    with pytest.raises(EmptySelection, match=r"no step is selected \(steps 900..999"):
        scaling_report(scaling_db, selection=StepSelection.parse("900:999"))
