"""The docs: the site builds with warnings as errors, every command and metric is in it, and every
command and Python example of its pages runs and prints what the page shows (tests/docs_examples.py
says how a page marks them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CORPUS, ROOT, require_module, skip_or_fail
from tests.docs_examples import Runner, parse, rewrite, shims
from traceq.catalog import METRICS
from traceq.cli import app

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if p.parent.name != "images") + [ROOT / "README.md"]
EXAMPLE_PAGES = [p for p in PAGES if parse(p).context is not None]
NOT_RUN: list[str] = []


def command_names() -> list[str]:
    return [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands] + \
           [g.name for g in app.registered_groups]


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `mkdocs build --strict` writes it (any warning fails the build)."""
    require_module("mkdocs", "the docs extra is not installed (pip install -e '.[docs]'; the test extra has it)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    pages = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for page in ("index.html", "tutorial/index.html", "reference/cli/index.html", "reference/metrics/index.html",
                 "reference/python/index.html", "explanation/comparison/index.html"):
        assert page in pages, sorted(pages)


def test_the_cli_reference_holds_every_commands_help(site: Path) -> None:
    """Written from the commands at build time: each command's heading and its own --help text."""
    html = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    missing = [n for n in command_names() if f"traceq {n}</code>" not in html]
    assert not missing, missing
    assert "Trace files, globs or directories, at paths every worker can" in html  # ingest-cluster's argument help
    assert "Usage: traceq runs rename" in html


def test_the_metrics_reference_holds_every_metric(site: Path) -> None:
    html = (site / "reference" / "metrics" / "index.html").read_text(encoding="utf-8")
    missing = [m.name for m in METRICS if f"<code>{m.name}</code>" not in html]
    assert not missing, missing


def test_the_python_reference_is_written_from_the_docstrings(site: Path) -> None:
    html = (site / "reference" / "python" / "index.html").read_text(encoding="utf-8")
    from traceq.report.metrics import compute_metric

    first_line = compute_metric.__doc__.strip().splitlines()[0]
    assert first_line.split("``")[0].strip() in html


def test_every_command_is_taught_by_a_page() -> None:
    """Beyond its reference: a tutorial, how-to or explanation uses each command (`traceq NAME`)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    missing = [n for n in command_names() if f"traceq {n}" not in text]
    assert not missing, f"teach these commands in a page of docs/: {missing}"


def test_no_text_points_outside_the_repository() -> None:
    """Docstrings and SQL comments cite the docs, never a file users do not get (the project's
    design notes live beside the checkout, not in it)."""
    outside = []
    for folder in ("traceq", "sql", "collectors"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".sql", ".csv") and path.is_file():
                text = path.read_text(encoding="utf-8")
                outside += [f"{path.relative_to(ROOT)}: {word}" for word in ("DESIGN", "../shared", "STYLE.md") if word in text]
    assert not outside, outside


@pytest.mark.slow  # the demo run trains for ~20 s; corpus pages ingest real traces
@pytest.mark.parametrize("path", EXAMPLE_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_examples_of_a_page_print_what_it_shows(path: Path, request: pytest.FixtureRequest,
                                                     tmp_path: Path) -> None:
    page = parse(path)
    folder = tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PATH=f"{shims(tmp_path / 'bin')}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HOME=str(tmp_path / "home"), NO_COLOR="1")
    (tmp_path / "home").mkdir()
    if page.context == "demo":
        shutil.copytree(request.getfixturevalue("demo_run"), folder)
    elif page.context == "corpus":
        if not CORPUS.is_dir():
            skip_or_fail("../shared/corpus is absent (the shared corpus is beside the checkout in CI)")
        folder.mkdir()
        (folder / "corpus").symlink_to(CORPUS)
    else:  # clone-parent: a clone of traceq named traceq, and no PYTHONPATH that would hide the trap
        folder.mkdir()
        (folder / "traceq").symlink_to(ROOT)
        del env["PYTHONPATH"]
    trace_processor = CORPUS.parent / "bin" / "trace_processor_shell"
    if trace_processor.is_file():  # where the Perfetto page says to put one
        (tmp_path / "home" / "bin").mkdir()
        (tmp_path / "home" / "bin" / "trace_processor_shell").symlink_to(trace_processor)
    elif "TRACEQ_TRACE_PROCESSOR" in path.read_text(encoding="utf-8"):
        skip_or_fail("../shared/bin/trace_processor_shell is absent (Perfetto's trace processor; CI has it)")
    runner = Runner(page, folder, env, update=os.environ.get("TRACEQ_DOCS_UPDATE") == "1")
    runner.run()
    NOT_RUN.extend(runner.not_run)
    if runner.rewrites:
        rewrite(path, runner.rewrites)
    assert not runner.rewrites and not runner.stale, (
        f"{len(runner.rewrites)} output(s) rewritten in {path.name} (TRACEQ_DOCS_UPDATE=1: check the diff); "
        f"{len(runner.stale)} to fix by hand:\n" + "\n\n".join(runner.stale))


def test_the_examples_that_are_not_run_say_why() -> None:
    """Only commands that need the network or a cluster are shown without running, each with its reason."""
    shown = [f"{p.name}:{b.line}: {f}" for p in PAGES for b in parse(p).blocks for f in b.flags if f.startswith("not run")]
    assert all(len(s.split("not run", 1)[1].strip(" :")) > 10 for s in shown), shown
    assert len(shown) <= 6, shown
