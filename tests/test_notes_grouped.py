"""Notes that do not drown the table: a terminal shows each kind of note
about runs once, naming the runs (or some of them and how many more), and CSV/JSON keep every note whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceq.cli import app
from traceq.report.result import RunNote, grouped_notes
from traceq.report.summary import summary

LAST = "the last step of each rank is left out"


def test_a_kind_is_one_line_at_its_first_place_and_a_lone_note_stays_whole() -> None:
    notes = ["a plain note", *(RunNote(LAST, f"run r{i} (step {i})") for i in range(8)), RunNote("power unavailable", "run x"),
             "another plain note", RunNote(LAST, "run r0 (step 0)")]  # a repeat is said once
    assert grouped_notes(notes, shown=3) == [
        "a plain note",
        f"{LAST}: run r0 (step 0); run r1 (step 1); run r2 (step 2); and 5 more (--format csv or json says each)",
        "run x: power unavailable",
        "another plain note",
    ]
    assert grouped_notes([RunNote(LAST, "run a (step 3)", "run a: whole text")]) == ["run a: whole text"]
    assert str(notes[1]) == f"run r0 (step 0): {LAST}" and notes[1] == f"run r0 (step 0): {LAST}"  # a note is its text


@pytest.mark.slow
def test_the_corpus_summary_prints_at_most_12_note_lines_and_json_every_note(corpus_db: Path) -> None:
    """The whole corpus: 30 runs, most with a note of each of several kinds (the last step left out, no step
    marker, no power log, FLOPs unknown, ...): 109 notes, shown as at most 12 lines, each kind once."""
    report = summary(corpus_db)
    kinds = [n.kind for n in report.notes if isinstance(n, RunNote)]
    assert len(report.notes) > 50 and len(set(kinds)) >= 6
    out = CliRunner().invoke(app, ["summary", "--db", str(corpus_db)])
    assert out.exit_code == 0, out.output
    lines = [line for line in out.stderr.splitlines() if line.startswith("note: ")]
    assert len(lines) <= 12, lines
    for kind in set(kinds):  # no two lines of one kind
        assert sum(line.startswith(f"note: {kind}") or line.endswith(kind) for line in lines) <= 1, kind
    out = CliRunner().invoke(app, ["summary", "--db", str(corpus_db), "--format", "json"])
    assert out.exit_code == 0, out.output
    whole = [line[len("note: "):] for line in out.stderr.splitlines() if line.startswith("note: ")]
    assert whole == [str(n) for n in report.notes]
