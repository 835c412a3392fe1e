"""What an ingest says about each file (:class:`FileResult`) and about all of them (:class:`IngestSummary`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


Progress = Callable[[str, dict[str, Any]], None]


@dataclass
class FileResult:
    """What happened to one input file."""

    path: str
    status: str  # ingested | skipped | failed
    message: str = ""
    trace_id: int | None = None
    run: str | None = None
    ranks: list[int] = field(default_factory=list)
    events: int = 0
    gpu_events: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what a user should know, e.g. a rank assigned


@dataclass
class IngestSummary:
    """Per-file results of one :func:`ingest_traces` call."""

    files: list[FileResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the inputs: entries of a directory passed over

    def by_status(self, status: str) -> list[FileResult]:
        return [f for f in self.files if f.status == status]

    @property
    def ok(self) -> bool:
        return not self.by_status("failed")


def skipped(path: Path, held: tuple[str, str], name: str | None) -> FileResult:
    """The result of ``path``, whose content the warehouse holds already (``held``: as which file, in
    which run); ``name``: the run --name gave, which went unused."""
    where, run = held
    into = f" into run {name}" if name is not None and name != run else ""
    return FileResult(str(path), "skipped", f"{path}: already ingested (as {where}, run {run}); "
                      f"--force reads it again{into}", run=run)
