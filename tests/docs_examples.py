"""The examples of the docs site, as a test runs them (tests/test_docs.py).

A page says where its examples run in an HTML comment (invisible on the site) before its first one:

    <!-- docs-test: demo -->     a copy of the demo run (examples/make_demo.sh ddp) in examples/out/demo-ddp
    <!-- docs-test: corpus -->   an empty folder with the shared corpus at ./corpus
    <!-- docs-test: clone-parent -->  the folder above a clone named traceq (no PYTHONPATH)

and runs them in order, in one folder of its own. Blocks:

- ```console: each `$ COMMAND` line runs in bash (a line ending in `\\` goes on); the lines after it, up
  to the next `$`, are its output (stdout and stderr together), compared line by line. `...` alone on a
  line stands for any lines, `...` inside a line for any text. `$ export NAME=VALUE` sets NAME for the
  page's later commands. A command must exit 0 unless its output ends with `[exit N]`.
- ```pycon: doctest, with ELLIPSIS and NORMALIZE_WHITESPACE; ```python: run (stdout not compared).
  Both share one namespace per page and run in the page's folder.

A comment right before a block changes it: `docs-test: numbers vary` (before comparing, every number
becomes `#` and runs of spaces or table rules one: the demo is timed on the machine it runs on),
`docs-test: file NAME` (a ```python block written to NAME instead of run), `docs-test: fixture` (a
command the demo fixture runs: FIXTURE_COMMANDS), `docs-test: not run: REASON` (shown, never run:
it needs the network or a cluster; tests/test_docs.py lists them).

After a command's output changed on purpose, `TRACEQ_DOCS_UPDATE=1 pytest tests/test_docs.py -k examples`
writes what the commands print into the pages, where an output shows no `...` and no number varies
(the test still fails, naming the outputs it rewrote and those left to fix by hand).
"""

from __future__ import annotations

import doctest
import io
import os
import re
import subprocess
import sys
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(.+?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)")  # indented inside a list item, too
RUN_LANGS = ("console", "pycon", "python")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
RULES = re.compile(r"[ ]+|[━─]+")
# what the demo fixture runs, as the tutorial shows it (`make demo` runs the same)
FIXTURE_COMMANDS = ("examples/make_demo.sh ddp",)


@contextmanager
def chdir(folder: Path) -> Iterator[None]:
    """contextlib.chdir, which Python 3.10 lacks."""
    here = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


@dataclass
class Block:
    lang: str
    text: str
    line: int  # 1-based line of the opening fence
    flags: list[str] = field(default_factory=list)


@dataclass
class Page:
    path: Path
    context: str | None
    blocks: list[Block]


def parse(path: Path) -> Page:
    """A docs page's context and its fenced blocks, each with the directives just before it."""
    context, blocks, pending, fence, indent = None, [], [], None, ""
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if fence is not None:
            if line.strip().startswith("```"):
                blocks.append(fence)
                fence = None
            else:
                fence.text += line.removeprefix(indent) + "\n"
            continue
        if m := DIRECTIVE.match(line):
            word = m.group(1)
            if word in ("demo", "corpus", "clone-parent"):
                context = word
            else:
                pending.append(word)
        elif m := FENCE.match(line):
            indent, fence = m.group(1), Block(m.group(2), "", n, pending)
            pending = []
        elif line.strip():
            pending = []
    return Page(path, context, blocks)


def commands(block: Block) -> list[tuple[str, list[str], int]]:
    """A console block's (command, expected output lines, index of the first of them in the block)."""
    out: list[tuple[str, list[str], int]] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            raise AssertionError(f"line {block.line + 1 + i}: a console block starts with `$ `: {line!r}")
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + "\n" + lines[i]
        expected, first = [], i + 1
        while i + 1 < len(lines) and not lines[i + 1].startswith("$ "):
            i += 1
            expected.append(lines[i])
        out.append((command, expected, first))
        i += 1
    return out


def normalise(text: str) -> str:
    return RULES.sub(lambda m: " " if m.group(0)[0] == " " else "━", NUMBER.sub("#", text))


def matches(expected: list[str], actual: str, numbers_vary: bool) -> bool:
    """Whether ``actual`` (a command's output) is what ``expected`` shows, `...` standing for any text."""
    exp = [line.rstrip() for line in expected]
    while exp and not exp[-1]:
        exp.pop()
    act = "\n".join(line.rstrip() for line in actual.rstrip("\n").splitlines())
    if numbers_vary:
        exp, act = [normalise(line) for line in exp], normalise(act)
    parts = []
    for line in exp:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*".join(re.escape(p) for p in line.split("...")) + r"\n")
    return re.fullmatch("".join(parts), act + "\n") is not None


class Runner:
    """Runs one page's blocks in order in ``folder``, with ``env`` (``traceq`` and ``python`` on PATH)."""

    def __init__(self, page: Page, folder: Path, env: dict[str, str], update: bool = False):
        self.page, self.folder, self.env, self.update = page, folder, env, update
        self.globs: dict = {"__name__": "__docs__"}
        self.not_run: list[str] = []
        self.rewrites: list[tuple[int, int, list[str]]] = []  # (file line of the first output line, count, new lines)
        self.stale: list[str] = []  # outputs that differ and cannot be rewritten (they hold `...` or vary)

    def where(self, block: Block) -> str:
        return f"{self.page.path.name}:{block.line}"

    def run(self) -> None:
        for block in self.page.blocks:
            reason = next((f for f in block.flags if f.startswith("not run")), None)
            if block.lang not in RUN_LANGS:
                if re.search(r"^(\$ |traceq |>>> )", block.text, re.M) and reason is None:
                    raise AssertionError(f"{self.where(block)}: a ```{block.lang} block with commands: make it console, pycon or python")
                continue
            if reason is not None:
                self.not_run.append(f"{self.where(block)}: {reason}")
                continue
            if self.page.context is None:
                raise AssertionError(f"{self.page.path.name}: examples but no <!-- docs-test: demo|corpus|clone-parent -->")
            getattr(self, block.lang)(block)

    def console(self, block: Block) -> None:
        for command, expected, first in commands(block):
            if "fixture" in block.flags:
                assert command in FIXTURE_COMMANDS, f"{self.where(block)}: {command!r} is no command the demo fixture runs"
                continue
            if m := re.fullmatch(r"export (\w+)=(.*)", command):
                value = subprocess.run(["bash", "-c", f"printf %s {m.group(2)}"], capture_output=True, text=True,
                                       env=self.env, cwd=self.folder, check=True).stdout
                self.env[m.group(1)] = value
                continue
            code = 0
            if expected and (m := re.fullmatch(r"\[exit (\d+)\]", expected[-1].strip())):
                code, expected = int(m.group(1)), expected[:-1]
            proc = subprocess.run(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=self.env, cwd=self.folder, timeout=300)
            shown = f"{self.where(block)}: $ {command}\n--- printed ---\n{proc.stdout}--- the docs show ---\n" + "\n".join(expected)
            assert proc.returncode == code, f"exit {proc.returncode}, not {code}\n{shown}"
            if expected and not matches(expected, proc.stdout, "numbers vary" in block.flags):
                if not self.update:
                    raise AssertionError(shown)
                if "numbers vary" in block.flags or any("..." in line for line in expected):
                    self.stale.append(shown)
                else:
                    printed = [line.rstrip() for line in proc.stdout.rstrip("\n").splitlines()]
                    self.rewrites.append((block.line + 1 + first, len(expected), printed))

    def python(self, block: Block) -> None:
        name = next((f.split(None, 1)[1] for f in block.flags if f.startswith("file ")), None)
        if name is not None:
            (self.folder / name).write_text(block.text, encoding="utf-8")
            return
        with chdir(self.folder), redirect_stdout(io.StringIO()):
            exec(compile(block.text, self.where(block), "exec"), self.globs)

    def pycon(self, block: Block) -> None:
        test = doctest.DocTestParser().get_doctest(block.text, self.globs, self.where(block), str(self.page.path), block.line)
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        out = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=flags)
        with chdir(self.folder):
            runner.run(test, out=out.write, clear_globs=False)
        self.globs.update(test.globs)  # a DocTest runs on a copy: the page's next blocks see its names
        assert runner.failures == 0, out.getvalue()


def shims(folder: Path) -> Path:
    """A bin folder with ``traceq`` and ``python`` as this test session runs them (this checkout's traceq)."""
    folder.mkdir(parents=True, exist_ok=True)
    # the console script as pip writes it: its own folder first on sys.path, never the working directory
    # (and its main guard: Dask's local cluster spawns workers that import the main module again)
    (folder / "traceq").write_text(f"#!{sys.executable}\nimport sys\nfrom traceq.console import main\n"
                                   "if __name__ == '__main__':\n    sys.exit(main())\n")
    (folder / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in ("traceq", "python"):
        os.chmod(folder / f, 0o755)
    return folder


def rewrite(path: Path, rewrites: list[tuple[int, int, list[str]]]) -> None:
    """Put what the commands printed in place of the outputs a page shows (``TRACEQ_DOCS_UPDATE=1``),
    keeping each block's indent; the page is written whole or not at all."""
    lines = path.read_text(encoding="utf-8").split("\n")
    for line, count, printed in sorted(rewrites, reverse=True):
        indent = re.match(r"\s*", lines[line - 1]).group(0) if count else ""
        lines[line - 1:line - 1 + count] = [indent + p if p else p for p in printed]
    scratch = path.with_name(path.name + ".new")
    scratch.write_text("\n".join(lines), encoding="utf-8")
    scratch.replace(path)
