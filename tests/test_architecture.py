"""One direction of dependencies: the import graph of traceq, walked with ast, module- and function-level
imports alike (a function-level import must not hide an upward import or a cycle)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "traceq"
COLLECTORS = ROOT / "collectors"
# lower first; a module may import its own layer and the layers below, never one above
LAYERS = (
    ("leaf", ("traceq.errors", "traceq.terminal", "traceq.catalog", "traceq.kineto", "traceq.intervals", "traceq.query", "traceq.classify", "traceq.interrupts",
              "traceq.scratch", "traceq.kernel_names", "traceq.nccl_kernels", "traceq.identity", "traceq.peaks")),
    ("store", ("traceq.store",)),
    ("ingest", ("traceq.ingest",)),
    ("report", ("traceq.report",)),
    ("perfetto", ("traceq.perfetto",)),
    ("cli", ("traceq.cli", "traceq.console", "traceq.mcp_server")),
)
HEAVY = {"torch", "plotly", "pyarrow", "numpy", "polars", "duckdb", "distributed", "dask", "pynvml", "msgspec"}


def _module_name(path: Path, root: Path, package: str) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    name = ".".join((package, *parts))
    return name.removesuffix(".__init__")


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import of ``path``, wherever it stands; ``from a import b`` gives
    a.b when a.b is a module of the package, else a."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            for alias in node.names:
                found.append((f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base, node.lineno))
    return found


def _is_module(name: str) -> bool:
    if not name.startswith("traceq."):
        return False
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _graph() -> dict[str, list[tuple[str, int]]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path, PACKAGE, "traceq")
        graph[module] = [(m, line) for m, line in _imports(path, module) if m.startswith("traceq.") or m == "traceq"]
    return graph


def _layer(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} belongs to no layer of tests/test_architecture.py: put it in one")


def test_every_module_belongs_to_a_layer_and_imports_none_above_it() -> None:
    upward = []
    for module, imports in _graph().items():
        if module == "traceq":
            continue  # the package's lazy public names (traceq.__getattr__), no import statement
        for target, line in imports:
            if target == "traceq" or target.startswith("traceq.collectors"):
                continue
            if _layer(target) > _layer(module):
                upward.append(f"{module}:{line} imports {target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_import_graph_has_no_cycle() -> None:
    graph = {m: sorted({t for t, _ in imports if t in _graph_modules()}) for m, imports in _graph().items()}
    seen: dict[str, int] = {}  # 1 on the path, 2 done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in graph.get(node, []):
            if seen.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in seen:
                visit(nxt, [*path, nxt])
        seen[node] = 2

    for module in graph:
        if module not in seen:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _graph_modules() -> set[str]:
    return {_module_name(p, PACKAGE, "traceq") for p in PACKAGE.rglob("*.py")} - {"traceq"}


def test_the_interval_algebra_imports_only_numpy_and_the_standard_library() -> None:
    imported = {m.split(".")[0] for m, _ in _imports(PACKAGE / "intervals.py", "traceq.intervals")}
    assert imported <= {"numpy", "__future__", "dataclasses", "typing", "math"}, imported


def test_the_collectors_import_neither_traceq_nor_its_dependencies() -> None:
    for path in COLLECTORS.rglob("*.py"):
        module = _module_name(path, COLLECTORS, "traceq.collectors")
        for target, line in _imports(path, module):
            top = target.split(".")[0]
            assert not (target.startswith("traceq.") and not target.startswith("traceq.collectors")), f"{path}:{line}"
            assert top not in {"duckdb", "polars", "plotly", "pyarrow", "msgspec"}, f"{path}:{line} imports {target}"


def test_the_command_line_is_thin_commands_over_the_library() -> None:
    """traceq/cli: no SQL and no DuckDB, no reading of an error's words, no os._exit, and one place that
    catches traceq's errors (the command group); each command a short body over library calls."""
    found, handlers, long = [], [], []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "execute", "sql", "_exit", "fetchall", "fetchone"):
                found.append(f"{where} calls .{node.func.attr}")
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                if any(n.split(".")[0] == "duckdb" for n in names):
                    found.append(f"{where} imports duckdb")
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and re.search(r"\bselect\b.*\bfrom\b", node.value, re.IGNORECASE | re.DOTALL)):
                found.append(f"{where} holds SQL")
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(
                    isinstance(c, ast.Call) and getattr(c.func, "id", None) == "str" for c in node.comparators):
                found.append(f"{where} reads an error's words")
            if isinstance(node, ast.ExceptHandler):
                handlers.append(f"{path.name}: except {ast.unparse(node.type) if node.type else ''}")
            if isinstance(node, ast.FunctionDef) and any(
                    "command" in ast.unparse(d) for d in node.decorator_list):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                lines = body[-1].end_lineno - body[0].lineno + 1
                if lines > 35:
                    long.append(f"{path.name}: {node.name} has {lines} lines")
    assert not found, "\n".join(found)
    assert sorted(handlers) == ["__init__.py: except BaseException", "__init__.py: except SystemExit",
                                "base.py: except TraceqError"], handlers
    assert not long, "\n".join(long)


def test_no_module_is_over_400_lines() -> None:
    long = []
    for path in sorted([*PACKAGE.rglob("*.py"), *COLLECTORS.rglob("*.py")]):
        if path.is_relative_to(PACKAGE / "sql") or path.is_relative_to(PACKAGE / "collectors"):
            continue  # links to sql/ and collectors/, walked as they are
        where = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > 400:
            long.append(f"{where}: {lines} lines")
    assert not long, "modules over 400 lines (split them by job):\n" + "\n".join(long)


def _sources() -> list[tuple[str, ast.Module]]:
    """(module name, tree) of every module of traceq (its collectors folder aside: shipped, not imported)."""
    return [(_module_name(path, PACKAGE, "traceq"), ast.parse(path.read_text(encoding="utf-8")))
            for path in sorted(PACKAGE.rglob("*.py")) if "collectors" not in path.relative_to(PACKAGE).parts]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_privates(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, assigned names and attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if _private(n)}


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def test_no_module_uses_another_modules_private_names() -> None:
    """No ``from traceq.x import _y``, no ``x._y`` where ``x`` is a traceq module, and no ``obj._y`` where
    ``_y`` is a private name this module does not define but another traceq module does (a method or an
    attribute of another module's object: ``loader._finish_file(...)``). Private: one leading underscore."""
    sources = _sources()
    defined = {module: _defined_privates(tree) for module, tree in sources}
    wrong = []
    for module, tree in sources:
        package = module if module in {m for m, _ in sources if (PACKAGE / "/".join(m.split(".")[1:])).is_dir()} \
            else module.rpartition(".")[0]
        modules: dict[str, str] = {}  # local name -> traceq module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                if not base.startswith("traceq"):
                    continue
                for alias in node.names:
                    if _private(alias.name):
                        wrong.append(f"{module}:{node.lineno} imports {base}.{alias.name}")
                    if _is_module(f"{base}.{alias.name}"):
                        modules[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("traceq"):
                        modules[alias.asname or alias.name] = alias.name
        own = defined[module]
        others = set().union(*(names for m, names in defined.items() if m != module))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            base = _dotted(node.value)
            target = modules.get(base or "") or (base if base and _is_module(base) else None)
            if target is not None and target != module:
                wrong.append(f"{module}:{node.lineno} uses {target}.{node.attr}")
            elif base not in ("self", "cls") and node.attr not in own and node.attr in others:
                wrong.append(f"{module}:{node.lineno} uses {ast.unparse(node)}, another module's private name")
    assert wrong == [], "\n".join(wrong)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _collaborators(sources: list[tuple[str, ast.Module]]) -> set[str]:
    """The traceq classes with behaviour (a public method; not a dataclass, exception, enum or named
    tuple: plain data), by the names a parameter holding one takes: the class's snake-case name and
    its last word (``ReadAhead``: ``read_ahead``, ``ahead``)."""
    names = set()
    for _, tree in sources:
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            data = any("dataclass" in ast.unparse(d) for d in node.decorator_list) or any(
                re.search(r"Exception|Error|Enum|NamedTuple|TypedDict|Protocol|Warning", ast.unparse(b))
                for b in node.bases)
            methods = [f for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")]
            if not data and methods:
                snake = _snake(node.name)
                names |= {snake, snake.rpartition("_")[2]}
    return names


def test_no_collaborator_is_typed_any() -> None:
    """No parameter or attribute annotated ``Any`` is named after a traceq class with behaviour
    (:func:`_collaborators`: ``loader``, ``writer``, ``parser``, ``read_ahead``/``ahead``), nor is a
    DuckDB cursor or the ingest's executor: a collaborator whose interface the type hides
    (``loader: Any`` calling its private methods). DuckDB's ``con`` and Dask's ``client`` are library
    objects, not checked."""
    sources = _sources()
    named = _collaborators(sources) | {"cursor", "executor", "loader"}

    def is_any(annotation: ast.expr | None) -> bool:
        return annotation is not None and ast.unparse(annotation) in ("Any", "typing.Any", "'Any'")

    wrong = []
    for module, tree in sources:
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg in named and is_any(node.annotation):
                wrong.append(f"{module}:{node.lineno} {node.arg}: Any")
            elif isinstance(node, ast.AnnAssign) and is_any(node.annotation):
                target = node.target.attr if isinstance(node.target, ast.Attribute) else _dotted(node.target)
                if target in named:
                    wrong.append(f"{module}:{node.lineno} {target}: Any")
    assert wrong == [], "\n".join(wrong)


def test_one_small_file_walks_through_at_most_8_modules_and_12_returns() -> None:
    """The reader's walk (``benchmarks/walk.py``, ../shared/STYLE.md): one small file through
    ``traceq.ingest.ingest_traces`` enters at most 8 of its modules on each thread and comes back to one it
    left at most 12 times; a path that returns again and again is one object spread over modules."""
    import subprocess
    import sys

    from tests.conftest import corpus_path

    small = corpus_path("hta/trace_filter/sampled_rank-0.json.gz")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "walk.py"), "--quiet", str(small)],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    counts = {m.group(1): (int(m.group(2)), int(m.group(3)))
              for m in re.finditer(r"^(\S+): \d+ stays in (\d+) modules, (\d+) returns", out, re.MULTILINE)}
    assert {"MainThread", "traceq-reader"} <= set(counts), out
    for thread in ("MainThread", "traceq-reader"):
        modules, returns = counts[thread]
        assert modules <= 8 and returns <= 12, f"{thread}: {modules} modules, {returns} returns\n{out}"
