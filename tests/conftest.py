"""Shared fixtures: the real corpus (skipped with a reason when absent) and tiny hand-made traces."""

from __future__ import annotations

import gzip
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
# In CI (CI=true, set by .ci/run) what a test needs must be there: a missing corpus or test dependency
# fails the test instead of skipping it.
IN_CI = os.environ.get("CI", "").lower() == "true"


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` for a command a test sends SIGINT: the signal's default disposition, as a command
    typed at a terminal has it. A suite started in the background (``nohup ... &``, a non-interactive
    shell's ``&``) has SIGINT ignored from its start, and every child inherits that."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def python_sigint():
    """SIGINT as a fresh Python process at a terminal has it (Python's handler, not blocked): these
    tests are about traceq's handling of KeyboardInterrupt. A suite started in the background
    (``nohup ... &``) has SIGINT ignored from its start: there a Ctrl-C sent here raised nothing."""
    import signal

    handler = signal.getsignal(signal.SIGINT)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, handler if handler is not None else signal.SIG_DFL)
    if signal.SIGINT in blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason`` on a developer's machine; fail in CI, where nothing may be missing."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: it must be present)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, reason: str) -> ModuleType:
    """The module ``name``, or a skip (a failure in CI) saying why it is needed and how to get it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        skip_or_fail(reason)
        raise


def corpus_files() -> list[Path]:
    """Every trace file of ../shared/corpus as ``traceq ingest`` sees the folder (empty when the corpus is
    absent): the collectors' side files beside a trace (``rank0.run.json``, ``rank0.power.jsonl``) are
    side files, not traces."""
    if not CORPUS.is_dir():
        return []
    from traceq.ingest.plan import expand_inputs

    return expand_inputs([CORPUS])


def corpus_path(relative: str) -> Path:
    path = CORPUS / relative
    if not path.exists():
        skip_or_fail(f"../shared/corpus/{relative} is absent (the shared corpus is beside the checkout in CI)")
    return path


@pytest.fixture(scope="session")
def corpus_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse holding the whole corpus, ingested once per test session."""
    files = corpus_files()
    if not files:
        skip_or_fail("../shared/corpus is absent (the shared corpus is beside the checkout in CI)")
    from traceq.ingest import ingest_traces

    db = tmp_path_factory.mktemp("corpus") / "corpus.duckdb"
    summary = ingest_traces(files, db)
    assert summary.ok, [f.message for f in summary.by_status("failed")]
    return db


@pytest.fixture(scope="session")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """(An uncompressed trace of a corpus trace's events repeated, its number of events), of about
    three ingest batches: seconds of ingest on one core, long enough to stop in the middle. The reader
    cuts a batch ahead of the parse, so the file offset it shows moves a batch at a time
    (traceq.ingest.native.BATCH_BYTES)."""
    from traceq.ingest.native import BATCH_BYTES

    doc = json.loads(gzip.decompress(corpus_path("hta/trace_filter/sampled_rank-0.json.gz").read_bytes()))
    events = json.dumps(doc["traceEvents"])[1:-1].encode()
    copies = int(3.2 * BATCH_BYTES / len(events)) + 1
    path = tmp_path_factory.mktemp("long") / "rank0.json"
    with open(path, "wb") as f:
        f.write(b'{"distributedInfo": {"rank": 0, "world_size": 2, "backend": "nccl"}, "traceEvents": [')
        for n in range(copies):
            f.write(b", " + events if n else events)
        f.write(b"]}")
    return path, len(doc["traceEvents"]) * copies


@pytest.fixture(scope="session", params=["ddp", "fsdp"])
def gloo_run(request, tmp_path_factory):
    """Run examples/train.py under torchrun with 2 gloo ranks: 6 steps, 4 recorded, 1 skipped."""
    out = tmp_path_factory.mktemp(f"gloo-{request.param}")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "train.py"), "--parallel", request.param, "--out-dir", str(out),
           "--run-name", "t", "--active", "4", "--warmup-steps", "1", "--steps", "6"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return request.param, out / "t"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The hostile-input suite's tally (tests/test_hostile.py), when it ran."""
    import sys

    hostile = sys.modules.get("tests.test_hostile")
    if hostile is not None and hostile.TALLY["tried"]:
        t = hostile.TALLY
        terminalreporter.write_line(
            f"hostile inputs: {t['tried']} tried: {t['one_line']} clear one-line errors, {t['noted']} passed over "
            f"with a note, {t['kept whole']} kills and races with the data kept whole; "
            f"{t['traceback']} tracebacks, {t['hang']} hangs, {t['loss']} losses"
        )


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables fit the terminal when COLUMNS is set (traceq.cli._terminal_width), and pytest or a CI
    shell may set it: tests that read a table set it themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding examples/ and what `examples/make_demo.sh ddp` wrote (the tutorial's training run)."""
    from tests.docs_examples import FIXTURE_COMMANDS

    require_module("torch", "torch is not installed (the test extra has it): the demo run trains under the collector")
    root = tmp_path_factory.mktemp("demo")
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("out"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    for command in FIXTURE_COMMANDS:
        proc = subprocess.run(["bash", *command.split()], cwd=root, capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return root
