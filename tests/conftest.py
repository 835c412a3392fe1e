"""Shared fixtures: the real corpus (skipped with a reason when absent) and tiny hand-made traces."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"


def corpus_files() -> list[Path]:
    """Every trace file of ../shared/corpus (empty when the corpus is absent)."""
    if not CORPUS.is_dir():
        return []
    return sorted(p for p in CORPUS.rglob("*") if p.name.endswith((".json", ".json.gz")))


def corpus_path(relative: str) -> Path:
    path = CORPUS / relative
    if not path.exists():
        pytest.skip(f"../shared/corpus/{relative} is absent (the shared corpus is beside the checkout in CI)")
    return path


@pytest.fixture(scope="session")
def corpus_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse holding the whole corpus, ingested once per test session."""
    files = corpus_files()
    if not files:
        pytest.skip("../shared/corpus is absent (the shared corpus is beside the checkout in CI)")
    from traceq.ingest import ingest_traces

    db = tmp_path_factory.mktemp("corpus") / "corpus.duckdb"
    summary = ingest_traces(files, db)
    assert summary.ok, [f.message for f in summary.by_status("failed")]
    return db
