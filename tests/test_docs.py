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
