"""No run leaves a report silently (DESIGN §3): under a step selection that leaves some runs with no
step (--skip-steps, --drop-last, --steps), every report command shows each run in its table or names it
in a note, on a warehouse of the whole corpus (runs with 1 to 17 steps, and runs without step markers)."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from traceq.cli import app

# each command, and the runs it reports when every step is selected (the baseline)
COMMANDS = {
    "report": ["report", "--metric", "exposed_comm"],
    "summary": ["summary"],
    "kernels": ["kernels", "--top", "1"],
    "collectives": ["collectives"],
    "stragglers": ["stragglers"],
    "critical-path": ["critical-path"],
    "explain": ["explain"],
}
SELECTIONS = (["--skip-steps", "5"], ["--drop-last"], ["--steps", "9:552"])
_LEFT = re.compile(r"run ([^:;\n]+?): no step left by the selection")


def _runs(db: Path, command: list[str], selection: list[str]) -> tuple[set[str], set[str]]:
    """(runs in the table, runs a note names as left out) of ``command`` under ``selection``."""
    out = CliRunner().invoke(app, [*command, *selection, "--db", str(db), "--format", "csv"])
    if out.exit_code == 1 and "no step is selected" in out.stderr:  # nothing left at all: an error naming the runs
        return set(), set(re.findall(r"run ([^:;]+): steps", out.stderr))
    if out.exit_code == 1 and out.stderr.startswith("error: no co"):  # nothing to report: the error names the runs
        return set(), set(_LEFT.findall(out.stderr))
    assert out.exit_code == 0, (command, selection, out.output)
    table = pl.read_csv(out.stdout.encode(), infer_schema=False) if out.stdout.strip() else pl.DataFrame()
    return set(table["run"].to_list()) if "run" in table.columns else set(), set(_LEFT.findall(out.stderr))


# one command in the fast loop (make test-fast), every command in the whole suite
@pytest.mark.parametrize("name", [n if n == "kernels" else pytest.param(n, marks=pytest.mark.slow) for n in COMMANDS])
def test_every_run_is_in_the_table_or_named_under_each_selection(corpus_db: Path, name: str) -> None:
    command = COMMANDS[name]
    baseline, _ = _runs(corpus_db, command, ["--skip-steps", "0", "--include-last"])
    assert baseline, name
    for selection in SELECTIONS:
        shown, named = _runs(corpus_db, command, selection)
        assert not shown & named, (name, selection, shown & named)
        missing = baseline - shown - named
        assert not missing, (name, selection, sorted(missing))
        if selection[0] == "--skip-steps":  # the corpus has runs of fewer than 6 steps: some are left out
            assert named, (name, selection)
