"""The README documents every command and every metric (fails when one is added without docs)."""

from __future__ import annotations

from tests.conftest import ROOT
from traceq.catalog import METRICS
from traceq.cli import app

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_command_is_in_the_readme() -> None:
    names = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    missing = [n for n in names if f"traceq {n}" not in README]
    assert not missing, f"document these commands in README.md: {missing}"


def test_every_metric_is_in_the_readme() -> None:
    missing = [m.name for m in METRICS if f"`{m.name}`" not in README]
    assert not missing, f"document these metrics in README.md: {missing}"


def test_no_text_points_outside_the_repository() -> None:
    """Docstrings and SQL comments cite the README, never a file users do not get (the project's
    design notes live beside the checkout, not in it)."""
    outside = []
    for folder in ("traceq", "sql", "collectors"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".sql", ".csv") and path.is_file():
                text = path.read_text(encoding="utf-8")
                outside += [f"{path.relative_to(ROOT)}: {word}" for word in ("DESIGN", "../shared", "STYLE.md") if word in text]
    assert not outside, outside
