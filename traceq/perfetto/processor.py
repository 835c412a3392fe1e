"""Perfetto's trace processor, as the Perfetto engine runs it: found (``--trace-processor``, then
$TRACEQ_TRACE_PROCESSOR, then the perfetto package's download), started on one trace with traceq's
PerfettoSQL modules (``sql/perfetto/``) and input tables (the classification rules, event categories,
step marker and the file's rank), and tied to traceq's life: a killed traceq leaves none running.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from importlib.resources import as_file, files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceq.catalog import StepMarker, event_categories
from traceq.errors import ConfigError, TraceqError

if TYPE_CHECKING:
    import polars as pl

ENV_VAR = "TRACEQ_TRACE_PROCESSOR"
GET_IT = (
    f"pass --trace-processor PATH or set {ENV_VAR} to a trace_processor_shell binary "
    "(from https://get.perfetto.dev/trace_processor, or built from Perfetto's source)"
)


class EngineError(TraceqError):
    """The trace processor cannot be found, started, or fails on a trace; the message says what to do."""


def trace_processor_binary(option: Path | None = None) -> Path | None:
    """The trace processor to run: ``option`` (--trace-processor), else ``$TRACEQ_TRACE_PROCESSOR``,
    else None (the perfetto package's own download). EngineError when the one named is not an
    executable file."""
    for path, source in ((option, "--trace-processor"), (os.environ.get(ENV_VAR) or None, ENV_VAR)):
        if path is None:
            continue
        path = Path(path).expanduser().absolute()  # a bare name is a file here, never one found on PATH
        if not path.is_file() or not os.access(path, os.X_OK):
            raise EngineError(f"{source} {path}: not an executable file; {GET_IT}")
        return path
    return None


# what Perfetto's regular expressions (C++ std::regex, ECMAScript) lack of Python's and DuckDB's (RE2):
# an unknown construct aborts the trace processor, so they are refused before they reach it
_UNSUPPORTED = (
    (re.compile(r"\(\?P?<"), "named groups and look-behind"),
    (re.compile(r"\(\?[a-zA-Z]"), "inline flags other than a leading (?i)"),
    (re.compile(r"\{,"), "a repetition {,n} without its lower bound"),
)


def perfetto_pattern(pattern: str, what: str) -> tuple[str, bool]:
    """(pattern, case-insensitive) for Perfetto's regexp, which has no inline flags: a leading (?i)
    becomes a match on the lower-cased name, with the pattern's letters lowered (not those of an
    escape like \\D). ConfigError naming ``what`` for a construct Perfetto's regular expressions lack."""
    ci = pattern.startswith("(?i)")
    body = pattern[4:] if ci else pattern
    for construct, words in _UNSUPPORTED:
        if construct.search(body):
            raise ConfigError(f"{what} {pattern!r}: Perfetto's regular expressions (ECMAScript) have no {words}; "
                              "use --engine duckdb for it")
    if ci:
        body = re.sub(r"\\.|[A-Z]", lambda m: m.group(0) if len(m.group(0)) == 2 else m.group(0).lower(), body)
    return body, ci


def first_group_only(pattern: str) -> str:
    """``pattern`` with every capturing group after the first made non-capturing: the step number is
    group 1 (as DuckDB's regexp_extract(name, marker, 1) reads it), and Perfetto's regexp_extract
    refuses a pattern of several groups."""
    out, groups, i, in_class = [], 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(" and not pattern.startswith("?", i + 1):
            groups += 1
            if groups > 1:
                c = "(?:"
        out.append(c)
        i += 1
    return "".join(out)


def _literal(value: object) -> str:
    """A value as a PerfettoSQL literal (the trace processor takes no query parameters)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    text = str(value)
    if "\x00" in text:
        raise ConfigError(f"{text!r}: a NUL character cannot go into a Perfetto query")
    return "'" + text.replace("'", "''") + "'"


def _table(name: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``create perfetto table name`` holding ``rows`` (the engine's inputs)."""
    if not rows:
        cols = ", ".join(f"null as {c}" for c in columns)
        return f"create perfetto table {name} as select {cols} where 0"
    values = ",\n".join("(" + ", ".join(_literal(v) for v in row) + ")" for row in rows)
    cols = ", ".join(f"column{i + 1} as {c}" for i, c in enumerate(columns))
    return f"create perfetto table {name} as select {cols} from (values\n{values})"


def input_tables(file_rank: int, marker: StepMarker = StepMarker()) -> list[str]:
    """The statements that give the PerfettoSQL modules their inputs: the kernel rules
    (``sql/kernel_rules.csv``), the event categories and launch patterns
    (``sql/event_categories.csv``), the step marker and the file's rank."""
    from traceq.store.schema import builtin_rules

    categories = event_categories()
    rules = []
    for position, (priority, pattern, cls, category, collective) in enumerate(builtin_rules()):
        translated, ci = perfetto_pattern(pattern, "kernel rule")
        rules.append((priority, translated, ci, cls, category, collective, True, position))
    launches = [(cat, *perfetto_pattern(p, "launch pattern")) for cat, p in sorted(categories.launch_patterns.items())]
    marker_pattern, marker_ci = perfetto_pattern(first_group_only(marker.pattern), "step marker")
    has_group = re.compile(marker.pattern).groups > 0
    return [
        _table("traceq_kernel_rules", ("priority", "pattern", "ci", "class", "category", "collective", "builtin", "position"), rules),
        _table("traceq_categories", ("cat", "role"),
               [(cat, role) for role, cats in categories.by_role.items() for cat in cats]),
        _table("traceq_launch_patterns", ("cat", "pattern", "ci"), launches),
        _table("traceq_params", ("file_rank", "step_marker", "marker_ci", "marker_has_group"),
               [(file_rank, marker_pattern, marker_ci, has_group)]),
    ]


@contextmanager
def _modules_dir() -> Iterator[Path]:
    with as_file(files("traceq.sql").joinpath("perfetto")) as path:
        yield Path(path)


@dataclass
class PerfettoTrace:
    """One trace loaded in a trace processor, with traceq's modules loaded on demand."""

    path: Path
    processor: Any

    def query(self, sql: str) -> pl.DataFrame:
        """The rows of ``sql`` (PerfettoSQL) as a polars DataFrame; EngineError naming the trace."""
        import polars as pl

        try:
            result = self.processor.query(sql)
        except Exception as exc:  # the package raises its own exception type for query errors
            raise EngineError(f"{self.path}: the trace processor refused a query: {_message(exc)}") from None
        if not result.column_names:
            return pl.DataFrame()
        twice = sorted({c for c in result.column_names if result.column_names.count(c) > 1})
        if twice:
            raise EngineError(f"{self.path}: the query gives two columns named {', '.join(twice)}; name them apart (AS)")
        return pl.DataFrame(
            {name: list(result.cells[i::len(result.column_names)]) for i, name in enumerate(result.column_names)},
            strict=False,
        )

    def execute(self, sql: str) -> None:
        self.query(sql)

    def load(self, module: str) -> None:
        """``include perfetto module traceq.<module>`` (and the modules it includes)."""
        self.execute(f"include perfetto module traceq.{module}")


# How long the trace processor may take to load a trace: a floor for starting it, and time per MB of JSON
# (a .json.gz counted as 15x its size: the corpus' h200-ddp rank0 is 6.3 MB of gzip, 91 MB of JSON). That
# trace loaded, queried and closed in 19.6 s on 2 cores shared with other work (~5 MB/s); a constant 60 s
# failed 6 loads of a full test run on a loaded machine, so the allowance is 5x that pace: 1 s a MB.
LOAD_FLOOR_S = 60
LOAD_S_PER_MB = 1.0
GZIP_RATIO = 15


def load_timeout_s(path: Path) -> int:
    """Seconds the trace processor may take to load ``path``: :data:`LOAD_FLOOR_S` plus
    :data:`LOAD_S_PER_MB` per MB of its JSON (a gzip file counted at :data:`GZIP_RATIO` times its size)."""
    size_mb = Path(path).stat().st_size / 1e6
    if Path(path).name.endswith(".gz"):
        size_mb *= GZIP_RATIO
    return LOAD_FLOOR_S + math.ceil(LOAD_S_PER_MB * size_mb)  # (the package takes whole seconds)


@contextmanager
def open_trace(path: Path, binary: Path | None, file_rank: int, marker: StepMarker = StepMarker()) -> Iterator[PerfettoTrace]:
    """``path`` loaded in a trace processor (``binary``, else the perfetto package's download), with
    traceq's inputs in place and its modules ready to include (``trace.load('interval_breakdown')``)."""
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
        from perfetto.trace_processor.api import SqlPackage
    except ImportError:
        raise EngineError('the Perfetto engine needs the perfetto package: pip install "traceq[perfetto]"') from None
    statements = input_tables(file_rank, marker)
    if not path.is_file():
        raise EngineError(f"{path}: no such file")
    with ExitStack() as stack:
        modules = stack.enter_context(_modules_dir())
        config = TraceProcessorConfig(
            bin_path=_tied(binary or _package_binary(), stack),
            add_sql_packages=[SqlPackage(str(modules), "traceq")],
            load_timeout=load_timeout_s(path),
        )
        try:
            processor = TraceProcessor(trace=str(path), config=config)
        except Exception as exc:
            where = f"the trace processor {binary}" if binary else "the perfetto package's trace processor"
            raise EngineError(f"{path}: {where} did not load it ({_message(exc)})") from None
        stack.callback(processor.close)
        trace = PerfettoTrace(path, processor)
        for statement in statements:
            trace.execute(statement)
        yield trace


# The trace processor serves the trace on a localhost port to anyone there: it must not outlive traceq. The
# perfetto package starts it in a session of its own (so closing it ends its whole tree) but nothing ends it
# when traceq is killed. It runs under this watchdog (the package's own download too), which ends it within
# half a second of traceq's end.
_TIED = """#!/bin/sh
# traceq: run the trace processor only while the traceq process that started it lives
parent=$PPID
{binary} "$@" &
child=$!
trap 'kill -KILL "$child" 2>/dev/null; exit 143' TERM INT HUP
while kill -0 "$child" 2>/dev/null; do
    kill -0 "$parent" 2>/dev/null || {{ kill -KILL "$child" 2>/dev/null; exit 1; }}
    sleep 0.5
done
wait "$child"
"""


def _package_binary() -> Path:
    """The perfetto package's own trace processor, downloaded on first use (tied as any other)."""
    from perfetto.trace_processor.api import PLATFORM_DELEGATE

    with _caught_output() as caught:  # the package's "Downloading ..." (stdout) and curl's error (stderr)
        try:
            return Path(PLATFORM_DELEGATE().get_shell_path(None))
        except subprocess.CalledProcessError as exc:  # the package's download (curl) failed
            tool = Path(str(exc.cmd[0])).name
            said = _last_line(caught)
            raise EngineError(f"no trace processor given, and the perfetto package could not download its own ({tool} "
                              f"exit status {exc.returncode}{': ' + said if said else ''}); {GET_IT}") from None


@contextmanager
def _caught_output() -> Iterator[Any]:
    """File descriptors 1 and 2 into a temporary file while the block runs (what a child process such as
    curl writes there too), so that the command's first line on stderr is traceq's own."""
    import sys
    import tempfile

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    with tempfile.TemporaryFile("w+b") as caught:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(caught.fileno(), 1)
            os.dup2(caught.fileno(), 2)
            yield caught
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def _last_line(caught: Any) -> str:
    caught.seek(0)
    lines = [line.strip() for line in caught.read()[-4096:].decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _tied(binary: Path, stack: ExitStack) -> str:
    """A launcher of ``binary`` that ends it when this process ends, in a temporary folder of ``stack``."""
    import shlex
    import tempfile

    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="traceq-tp-")))
    if os.statvfs(folder).f_flag & os.ST_NOEXEC:  # the launcher there would fail with a bare "Permission denied"
        raise EngineError(f"TMPDIR {tempfile.gettempdir()}: on a file system mounted noexec, where the trace processor's "
                          "launcher cannot run; set TMPDIR to a folder that may hold programs (e.g. TMPDIR=~/.cache/tmp)")
    launcher = folder / "trace_processor_shell"
    launcher.write_text(_TIED.format(binary=shlex.quote(str(Path(binary).resolve()))))
    launcher.chmod(0o700)
    return str(launcher)


def _message(exc: BaseException) -> str:
    """What went wrong, in one line: the trace processor's errors come as a traceback of the SQL
    (lines 'Traceback ...', 'File ...', the statement, a caret) ending in the message itself."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    meant = [line for line in lines if not line.startswith(("Traceback", "File ")) and set(line) - set("^~ ")]
    return (meant[-1] if meant else type(exc).__name__)[:300]
