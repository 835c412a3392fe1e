"""``traceq mcp``: the MCP server driven by the SDK's own client over stdio (``mcp.client.stdio``), as a coding
agent drives it, on a warehouse of the whole corpus: every tool is listed, each gives what the Python API
gives (the same rows and notes), the SQL tool writes nothing and reads nothing but the warehouse, and a bad
argument is an error result naming the fix, after which the server answers the next call.

One server for the module (started once, a second or two): the calls go to it through an anyio portal.
"""

from __future__ import annotations

import decimal
import hashlib
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import traceq
from tests.conftest import ROOT, require_module
from traceq.cli import app
from traceq.report.runs import runs_report
from traceq.report.selection import StepSelection

RUN = "fused_traces"  # 4 ranks (RCCL) in one merged file: collectives matched, a critical path across ranks
TOOLS = {"runs", "metrics", "report", "summary", "kernels", "collectives", "stragglers", "critical_path", "explain", "diff", "sql"}


class Session:
    """Synchronous calls to one MCP client session (running in the portal's event loop)."""

    def __init__(self, portal: Any, session: Any, process_log: Path) -> None:
        self.portal, self.session, self.log = portal, session, process_log

    def tools(self) -> list[Any]:
        return self.portal.call(self.session.list_tools).tools

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return self.portal.call(self.session.call_tool, name, arguments or {})

    def answer(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """The structured result of a call that must succeed."""
        result = self.call(name, arguments)
        assert not result.is_error, (name, arguments, result.content, self.log.read_text()[-3000:])
        return result.structured_content


@contextmanager
def serving(db: Path, log: Path) -> Iterator[Session]:
    """``traceq mcp --db DB`` spawned by the SDK's stdio client, initialised, for the block."""
    require_module("mcp", "the MCP SDK runs traceq mcp and its client (pip install 'traceq[mcp]')")
    from anyio.from_thread import start_blocking_portal
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "traceq.cli", "mcp", "--db", str(db)],
                                   env={"PYTHONPATH": str(ROOT)}, cwd=str(log.parent))

    @asynccontextmanager
    async def session() -> AsyncIterator[Any]:
        with open(log, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                yield s

    with start_blocking_portal() as portal, portal.wrap_async_context_manager(session()) as s:
        yield Session(portal, s, log)


@pytest.fixture(scope="module")
def server(corpus_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    with serving(corpus_db, tmp_path_factory.mktemp("mcp") / "server.stderr") as s:
        yield s


def plain(value: Any) -> Any:
    """A cell as compared: numbers as floats (JSON keeps an integer or a double exactly), NaN as None."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float | decimal.Decimal):
        number = float(value)
        return None if math.isnan(number) else number
    return value


def same_report(given: dict[str, Any], report: traceq.Report, max_rows: int = 100) -> None:
    """The tool's result is ``report``: its title, columns, first ``max_rows`` rows and notes, and the row
    count with a note saying how to get the rest where rows were left out."""
    table = report.table
    assert given["title"] == report.title
    assert given["columns"] == table.columns
    assert given["row_count"] == table.height
    expect = [{k: plain(v) for k, v in row.items()} for row in table.head(max_rows).to_dicts()]
    assert [{k: plain(v) for k, v in row.items()} for row in given["rows"]] == expect
    notes = [str(n) for n in report.notes]
    if table.height > max_rows:
        assert given["notes"][:-1] == notes
        assert given["notes"][-1].startswith(f"{table.height:,} rows: the first {max_rows:,} are given"), given["notes"][-1]
    else:
        assert given["notes"] == notes


def test_import_traceq_and_its_command_line_loads_no_mcp() -> None:
    code = "import sys, traceq, traceq.cli; print(sorted(m for m in ('mcp', 'pydantic') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_tool_is_listed_read_only_with_its_output_schema(server: Session) -> None:
    tools = {t.name: t for t in server.tools()}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.annotations.read_only_hint and not tool.annotations.open_world_hint, tool.name
        assert set(tool.output_schema["properties"]) == {"title", "columns", "rows", "row_count", "notes"}, tool.name
        assert tool.description, tool.name


def calls(db: Path) -> list[tuple[str, dict[str, Any], Callable[[], traceq.Report]]]:
    """(tool, arguments, the Python API's report for them)."""
    every = StepSelection()
    return [
        ("runs", {}, lambda: runs_report(db)),
        ("runs", {"traces": True, "run": [RUN]}, lambda: runs_report(db, traces=True, runs=[RUN])),
        ("metrics", {}, lambda: traceq.Report(traceq.list_metrics(), title="metrics")),
        ("report", {"metric": "exposed_comm,idle", "run": [RUN]},
         lambda: traceq.metric_report(db, "exposed_comm,idle", by="run,rank", runs=[RUN])),
        ("report", {"metric": "step_time", "by": "run"}, lambda: traceq.metric_report(db, "step_time", by="run")),
        ("summary", {"by": "run,rank,step", "run": [RUN], "steps": "10:11"},
         lambda: traceq.summary(db, by="run,rank,step", runs=[RUN], selection=StepSelection.parse("10:11"))),
        ("kernels", {"by": "run,rank", "level": "category", "run": [RUN]},
         lambda: traceq.kernel_report(db, by="run,rank", level="category", runs=[RUN])),
        ("collectives", {"run": [RUN]}, lambda: traceq.collectives_report(db, runs=[RUN])),
        ("collectives", {"instances": True, "run": [RUN]}, lambda: traceq.instances_report(db, runs=[RUN])),
        ("stragglers", {"by_step": True, "run": RUN, "include_last": True},  # one run: its name alone
         lambda: traceq.stragglers_report(db, by_step=True, runs=[RUN], selection=StepSelection(include_last=True))),
        ("critical_path", {"run": [RUN]}, lambda: traceq.critical_path(db, runs=[RUN], selection=every).report("steps")),
        ("critical_path", {"run": [RUN], "view": "segments"},
         lambda: traceq.critical_path(db, runs=[RUN], segments=True).report("segments")),
        ("diff", {"a": f"{RUN},rank=0", "b": f"{RUN},rank=3"}, lambda: traceq.diff(db, f"{RUN},rank=0", f"{RUN},rank=3")),
        ("explain", {"run": [RUN]}, lambda: traceq.explain(db, runs=[RUN], selection=every)),
        ("sql", {"query": "select class, count(*) as n, sum(dur_ns) as dur_ns from gpu_activity group by class order by class"},
         lambda: traceq.warehouse_sql("select class, count(*) as n, sum(dur_ns) as dur_ns from gpu_activity group by class "
                                      "order by class", db)),
    ]


@pytest.mark.slow
def test_every_tool_gives_what_the_python_api_gives(server: Session, corpus_db: Path) -> None:
    called = set()
    for tool, arguments, api in calls(corpus_db):
        given = server.answer(tool, arguments)
        same_report(given, api())
        called.add(tool)
    assert called == TOOLS
    # the segments are thousands of rows: the first 100 came, and asked for, all of them come
    segments = server.answer("critical_path", {"run": [RUN], "view": "segments"})
    assert segments["row_count"] > 100 and len(segments["rows"]) == 100
    assert f"call critical_path again with max_rows={segments['row_count']}" in segments["notes"][-1]
    every = server.answer("critical_path", {"run": [RUN], "view": "segments", "max_rows": segments["row_count"]})
    same_report(every, traceq.critical_path(corpus_db, runs=[RUN], segments=True).report("segments"), segments["row_count"])
    assert len(every["rows"]) == segments["row_count"]


def test_the_sql_tool_counts_its_rows_up_to_ten_thousand(server: Session, corpus_db: Path) -> None:
    some = server.answer("sql", {"query": "select i from range(250) t(i)", "max_rows": 100})
    assert (some["row_count"], [r["i"] for r in some["rows"]]) == (250, list(range(100)))
    assert some["notes"] == ["250 rows: the first 100 are given (max_rows=100); call sql again with max_rows=250 for all of them"]
    assert [r["i"] for r in server.answer("sql", {"query": "select i from range(250) t(i)", "max_rows": 250})["rows"]] == list(range(250))
    many = server.answer("sql", {"query": "select i from range(20000) t(i)"})
    assert (many["row_count"], len(many["rows"])) == (10_000, 100)
    assert many["notes"] == [*traceq.warehouse_sql("select i from range(20000) t(i)", corpus_db, max_rows=10_000).notes,
                             "at least 10,000 rows: the first 100 are given (max_rows=100); narrow the selection, or run "
                             "`traceq sql --format csv` for all of them"]


def test_calls_at_once_are_each_answered_as_alone(server: Session) -> None:
    """The SDK runs each call in a thread; the SQL console's connection closes DuckDB's database (shared by
    the connections open at once) to settings, so the calls take turns."""
    asked = [("sql", {"query": "select count(*) as n from gpu_activity"}), ("summary", {"run": RUN}),
             ("sql", {"query": "select count(*) as n from steps"}), ("kernels", {"run": RUN})]
    alone = [server.answer(tool, arguments) for tool, arguments in asked]
    futures = [server.portal.start_task_soon(server.session.call_tool, tool, arguments) for tool, arguments in asked]
    together = [f.result() for f in futures]
    assert [r.structured_content for r in together] == alone, [r.content for r in together if r.is_error]


def _files(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``folder``: (size, blake2 digest of its bytes)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, hashlib.blake2b(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_sql_tool_writes_nothing_and_reads_nothing_but_the_warehouse(server: Session, corpus_db: Path) -> None:
    folder = corpus_db.parent
    before = _files(folder)
    outside = [
        f"copy (select 1 as i) to '{folder}/out.csv'",
        f"copy gpu_events to '{folder}/events.parquet' (format parquet)",
        f"export database '{folder}/exported'",
        f"attach '{folder}/other.duckdb' as other",
        "select * from read_csv('/etc/passwd')",
        "select * from read_text('/etc/hostname')",
        "select * from glob('/etc/*')",
        f"select * from read_parquet('{folder}/*.parquet')",
        "create table mine as select 1 as i",
        "insert into steps select * from steps",
        "delete from gpu_events",
        "drop table gpu_events",
        "install httpfs",
        "load httpfs",
        "set enable_external_access = true",
        "pragma enable_profiling='json'",
    ]
    for query in outside:
        result = server.call("sql", {"query": query})
        assert result.is_error, query
        text = result.content[0].text
        assert "the sql tool reads the warehouse and nothing else: give one SELECT" in text, text
        assert "root:" not in text, text  # nothing of /etc/passwd came back
        assert server.answer("sql", {"query": "select 42 as answer"})["rows"] == [{"answer": 42}]
    assert not (folder / "out.csv").exists() and not (folder / "other.duckdb").exists()
    assert _files(folder) == before  # no file made, none changed (the warehouse's bytes included)


def test_a_bad_argument_is_an_error_result_naming_the_fix_and_the_server_goes_on(server: Session) -> None:
    bad = [
        ("report", {"run": ["nope"]}, "no run 'nope' in the warehouse; it holds"),
        ("summary", {"run": ["nope"]}, "no run 'nope'"),
        ("report", {"metric": "speed"}, "metric="),
        ("report", {"steps": "x"}, "steps='x': expected a:b with step numbers, e.g. 11:60"),
        ("kernels", {"steps": "9:3"}, "steps='9:3': the end is before the start"),
        ("report", {"drop_last": True, "include_last": True}, "give one of them"),
        ("kernels", {"level": "colour"}, "level="),
        ("diff", {"a": "nope", "b": RUN}, "no run 'nope'"),
        ("critical_path", {"view": "paths"}, "Input should be 'steps', 'segments', 'ranks' or 'kernels'"),
        ("report", {"max_rows": 0}, "max_rows"),
        ("report", {"skip_steps": -1}, "skip_steps"),
        ("sql", {"query": "select * from no_such_table"}, "no_such_table"),
        ("sql", {"query": "create table t as select 1"}, "give one SELECT"),
        ("no_such_tool", {}, "no_such_tool"),
    ]
    for tool, arguments, fix in bad:
        result = server.call(tool, arguments)
        assert result.is_error, (tool, arguments)
        assert fix in result.content[0].text, (fix, result.content[0].text)
        assert server.answer("runs", {"run": RUN})["rows"][0]["run"] == RUN  # the next call is answered


def test_traceq_mcp_refuses_a_missing_warehouse_in_one_line(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["mcp", "--db", str(tmp_path / "none.duckdb")])
    assert done.exit_code == 1
    assert "none.duckdb: no warehouse here; ingest traces into it first" in done.output
    assert not (tmp_path / "none.duckdb").exists()


def test_traceq_mcp_without_the_sdk_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else real(name, *a))
    done = CliRunner().invoke(app, ["mcp", "--db", str(tmp_path / "none.duckdb")])
    assert done.exit_code == 1
    assert "the MCP server needs the mcp package: pip install 'traceq[mcp]'" in done.output


def test_a_warehouse_damaged_between_calls_is_an_error_result_and_the_server_goes_on(tmp_path: Path) -> None:
    from tests.test_metrics_given_expect import one_step_trace

    db = tmp_path / "w.duckdb"
    assert traceq.ingest_traces([one_step_trace().write(tmp_path / "job" / "rank0.json")], db).ok
    good = db.read_bytes()
    with serving(db, tmp_path / "server.stderr") as server:
        assert server.answer("runs")["rows"][0]["run"] == "job"
        for damaged, fix in ((good[:len(good) // 3], "the warehouse file is damaged or cut short: copy it again"),
                             (b"not a warehouse" * 1000, "is not a traceq warehouse (not a DuckDB database)")):
            db.write_bytes(damaged)  # DuckDB's IO error (the machine's, said as the command line says it), traceq's
            result = server.call("runs")
            assert result.is_error and str(db) in result.content[0].text and fix in result.content[0].text, result.content
        db.write_bytes(good)
        assert server.answer("runs")["rows"][0]["run"] == "job"
