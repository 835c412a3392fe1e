"""What every report returns: :class:`Report`, a table with the notes to read beside it.

The command line, the HTML pages and the Python API show a report the same way: its ``title`` says
what the table is and over which steps, the ``table`` holds the figures, the ``notes`` say what a
reader needs beside them (steps used, conventions, what is missing). ``rows`` are the finer rows the
table aggregates, where the report has them (one per rank and step), for a caller that shows them again.
``names`` are the columns that hold kernel names: a terminal table shows them short and an HTML table
short with the full name on hover (:mod:`traceq.kernel_names`); the data, CSV and JSON keep them whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class Report:
    """A report: ``table`` (a polars DataFrame), ``notes`` (lines to read beside it), ``title`` (what the
    table is, e.g. 'exposed_comm_us by run,rank (...)'), ``rows`` (what the table aggregates, or None),
    ``narrow``: the columns a terminal too narrow for the table leaves out first, the least important
    first (the rest follow the command line's general order), and ``names``: the columns that hold
    kernel names, shown short in terminal and HTML tables (:func:`with_short_names`)."""

    table: pl.DataFrame
    notes: tuple[str, ...] = ()
    title: str = ""
    rows: pl.DataFrame | None = field(default=None, repr=False)
    narrow: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", tuple(self.notes))  # a list given is kept as it was when made
        object.__setattr__(self, "narrow", tuple(self.narrow))
        object.__setattr__(self, "names", tuple(self.names))

    @classmethod
    def of_query(cls, rows: pl.DataFrame, notes: Sequence[str] = (), max_rows: int | None = None) -> Report:
        """The rows of an ad-hoc query as a report: at most ``max_rows`` of them (None: all), and a note
        when there were more (``rows`` holding one more than ``max_rows`` is enough to tell)."""
        if max_rows is not None and rows.height > max_rows:
            notes = [*notes, f"the query gives more than {max_rows:,} rows: the first {max_rows:,} are shown (--max-rows)"]
            rows = rows.head(max_rows)
        return cls(rows, notes)

    def html(self) -> str:
        """The table and its notes as an HTML fragment (what the pages put in a section)."""
        return html_table(self.table, self.names) + html_notes(self.notes)

    def _repr_html_(self) -> str:  # a notebook shows the report as the pages do
        return (f"<p><b>{escape(self.title)}</b></p>" if self.title else "") + self.html()

    def __str__(self) -> str:  # every row and column, names whole: what the command line prints, as text
        import polars as pl

        with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=10_000, tbl_width_chars=60_000):
            table = str(self.table)
        return "\n".join([*([self.title] if self.title else []), table, *(f"note: {n}" for n in self.notes)])


def html_table(frame: pl.DataFrame, names: Sequence[str] = ()) -> str:
    """``frame`` as an HTML table in a box that scrolls sideways where the page is narrower; the kernel
    names of the columns ``names`` short (:mod:`traceq.kernel_names`), the full name on hover."""
    head = "".join(f"<th>{escape(c)}</th>" for c in frame.columns)
    short = _short_names(frame, names)
    shown = [i for i, c in enumerate(frame.columns) if c in names]

    def cell(i: int, v: object) -> str:
        if i in shown and isinstance(v, str) and short.get(v, v) != v:
            return f"<td title=\"{escape(v)}\">{escape(short[v])}</td>"
        return f"<td>{escape(_cell(v))}</td>"

    body = "".join("<tr>" + "".join(cell(i, v) for i, v in enumerate(row)) + "</tr>" for row in frame.iter_rows())
    return f"<div class=\"scroll\"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def with_short_names(frame: pl.DataFrame, names: Sequence[str]) -> pl.DataFrame:
    """``frame`` with the kernel names of its columns ``names`` short: at most 60 characters, unique
    within the table (:func:`traceq.kernel_names.short_names`); what a terminal table shows."""
    import polars as pl

    short = _short_names(frame, names)
    if not short:
        return frame
    return frame.with_columns(pl.col(c).replace(short) for c in names if c in frame.columns)


def _short_names(frame: pl.DataFrame, names: Sequence[str]) -> dict[str, str]:
    """{full name: short name} for the distinct names in the columns ``names`` of ``frame``, unique
    across them all."""
    from traceq.kernel_names import short_names

    full = list(dict.fromkeys(v for c in names if c in frame.columns for v in frame[c].to_list() if isinstance(v, str)))
    return dict(zip(full, short_names(full)))


class RunNote(str):
    """A note about one run of a kind that several runs share. It is its whole text (what ``str`` gives,
    what the API, CSV and JSON keep), and ``kind`` (the sentence every note of the kind says) with
    ``detail`` (this run's part, naming it), by which a terminal shows each kind once
    (:func:`grouped_notes`)."""

    kind: str
    detail: str

    def __new__(cls, kind: str, detail: str, text: str | None = None) -> RunNote:
        note = super().__new__(cls, text if text is not None else f"{detail}: {kind}")
        note.kind, note.detail = kind, detail
        return note

    def __reduce__(self) -> tuple:  # kept whole through pickling (a Dask worker's report)
        return (RunNote, (self.kind, self.detail, str(self)))


GROUP_SHOWN = 6  # runs a grouped note names before 'and N more'


def grouped_notes(notes: Sequence[str], shown: int = GROUP_SHOWN) -> list[str]:
    """``notes`` with the :class:`RunNote` of each kind as one line at the place of its first, 'KIND:
    DETAIL; DETAIL; ... and N more', or whole where a kind has one; other notes as they are. What a
    terminal shows; ``--format csv`` and ``json`` keep every note whole."""
    kinds: dict[str, list[RunNote]] = {}
    for note in notes:
        if isinstance(note, RunNote):
            kinds.setdefault(note.kind, []).append(note)
    out: list[str] = []
    done: set[str] = set()
    for note in notes:
        if not isinstance(note, RunNote):
            out.append(note)
            continue
        if note.kind in done:
            continue
        done.add(note.kind)
        group = list(dict.fromkeys(kinds[note.kind]))
        if len(group) == 1:
            out.append(group[0])
            continue
        details = "; ".join(n.detail for n in group[:shown])
        more = len(group) - shown
        out.append(f"{note.kind}: {details}" + (f"; and {more} more (--format csv or json says each)" if more > 0 else ""))
    return out


def html_notes(lines: Sequence[str]) -> str:
    """``lines`` as the list of notes under a table ('' for none)."""
    if not lines:
        return ""
    return "<ul class=\"notes\">" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"


def _cell(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)
