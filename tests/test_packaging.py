"""The wheel ships sql/ and collectors/; the CLI installed from it runs and ingests."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_metrics_given_expect import one_step_trace


@pytest.mark.slow
def test_wheel_installs_and_runs_ingest(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    # no 25-line "Package would be ignored" or 12-line license-table warnings in every install
    assert "would be ignored" not in built.stderr + built.stdout and "project.license" not in built.stderr + built.stdout
    wheel = next(dist.glob("traceq-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "traceq/sql/interval_breakdown.sql" in names and "traceq/sql/kernel_rules.csv" in names
    assert "traceq/sql/perfetto/device_events.sql" in names
    assert "traceq/collectors/__init__.py" in names
    # every module of the package (a package left out of pyproject's list was missing from the wheel)
    modules = {f"traceq/{path.relative_to(ROOT / 'traceq').as_posix()}" for path in (ROOT / "traceq").rglob("*.py")}
    assert modules - set(names) == set()

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target", str(target), str(wheel)],
        check=True, capture_output=True, text=True,
    )
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-c", "from traceq.cli import main; main()"]
    helped = subprocess.run([*cli, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert helped.returncode == 0 and "ingest" in helped.stdout
    trace = one_step_trace().write(tmp_path / "job" / "rank0.json")
    ran = subprocess.run([*cli, "ingest", str(trace), "--db", str(tmp_path / "w.duckdb")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    located = subprocess.run([sys.executable, "-c", "import traceq.sql, traceq; print(traceq.__file__)"],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
    assert located.stdout.startswith(str(target))


def test_import_traceq_is_light() -> None:
    code = "import sys, traceq; print(sorted(m for m in ('torch', 'plotly', 'duckdb', 'polars') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_dir_of_traceq_is_its_public_api_and_every_name_resolves() -> None:
    """`dir(traceq)` listed `Any` and `import_module` and none of the functions imported on first use."""
    import traceq

    names = dir(traceq)
    assert "critical_path" in names and "ingest_traces" in names and "compute_metric" in names
    assert not {"Any", "import_module", "annotations"} & set(names)
    missing = [name for name in names if getattr(traceq, name, None) is None]
    assert not missing
