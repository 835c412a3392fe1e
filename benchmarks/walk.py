"""The reader's walk: follow one small file through ``traceq.ingest.ingest_traces`` and count the modules
it enters and the times it comes back to one it left (../shared/STYLE.md, "Walk it before you call it simple").

    python benchmarks/walk.py                      # the default file, traceq.ingest's modules, each thread
    python benchmarks/walk.py FILE --scope traceq  # every traceq module
    python benchmarks/walk.py --base /tmp/base     # the same walk in another tree (PYTHONPATH picks it)

How it counts: every function of the scope is taken once on each thread, at its first call there (``sys.setprofile`` on each
thread), in the order the calls happen, as someone reading the code meets it (a lambda counts where it
is written: a callback is a return to its module; a comprehension is the code around it). A *stay* is a run of consecutive functions in one module; a *return* is a
stay in a module the walk stayed in before. Going back up the stack moves nothing: a natural path goes
down and out, and one that comes back to a module again and again is a state machine spread thin.
Printed per thread: stays, modules, returns, then the stays with their functions.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMALL = REPO.parent / "shared" / "corpus" / "hta" / "trace_filter" / "sampled_rank-0.json.gz"

WALK = r'''
import sys, tempfile, threading
from pathlib import Path
import traceq.ingest  # before the walk: imports are not the path
scope, order, seen = sys.argv[2], [], set()
def hook(frame, event, arg):
    if event != "call":
        return
    module = frame.f_globals.get("__name__", "")
    if module != scope and not module.startswith(scope + "."):
        return
    code = frame.f_code
    if code.co_name in ("<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"):  # inline code (no frame of its own from Python 3.12)
        return
    key = (threading.current_thread().name, module, code.co_name, code.co_firstlineno)  # each thread read apart
    if key not in seen:
        seen.add(key)
        order.append((threading.current_thread().name, module, code.co_name))
db = Path(tempfile.mkdtemp()) / "walk.duckdb"
threading.setprofile(hook)
sys.setprofile(hook)
traceq.ingest.ingest_traces([sys.argv[1]], db)
sys.setprofile(None)
threading.setprofile(None)
for thread, module, name in order:
    print(thread, module, name, sep="\t")
'''


def walk(path: Path, scope: str, tree: Path) -> list[tuple[str, str, str]]:
    """(thread, module, function) of each function of ``scope`` at its first call, in order."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as cwd:  # the tree's own traceq, not one beside the caller
        out = subprocess.run([sys.executable, "-c", WALK, str(path), scope], env=env, cwd=cwd, check=True,
                             capture_output=True, text=True).stdout
    return [tuple(line.split("\t")) for line in out.splitlines() if line.count("\t") == 2]  # type: ignore[misc]


def stays(functions: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """Consecutive functions of one module, as (module, functions)."""
    out: list[tuple[str, list[str]]] = []
    for module, name in functions:
        if out and out[-1][0] == module:
            out[-1][1].append(name)
        else:
            out.append((module, [name]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", nargs="?", type=Path, default=SMALL, help="a small trace (default: %(default)s)")
    ap.add_argument("--scope", default="traceq.ingest", help="the package whose modules count (default: %(default)s)")
    ap.add_argument("--base", type=Path, default=REPO, help="the tree to walk (default: this one)")
    ap.add_argument("--quiet", action="store_true", help="the counts only")
    args = ap.parse_args()
    order = walk(args.file, args.scope, args.base)
    threads = list(dict.fromkeys(thread for thread, _, _ in order))
    for thread in threads:
        s = stays([(m, f) for t, m, f in order if t == thread])
        modules = [m for m, _ in s]
        returns = sum(1 for i, m in enumerate(modules) if m in modules[:i])
        print(f"{thread}: {len(s)} stays in {len(set(modules))} modules, {returns} returns to a module already left")
        if not args.quiet:
            for module, names in s:
                print(f"    {module.removeprefix(args.scope + '.')}: {', '.join(names)}")
    print(f"{len(order)} functions of {args.scope} in {len({m for _, m, _ in order})} modules on {len(threads)} threads")


if __name__ == "__main__":
    main()
