"""mkdocs hook: the CLI and metrics references, written from the code at every build.

``reference/cli.md`` is each command's ``--help`` as the command itself prints it (the Typer app walked
as click commands, groups and their subcommands included), ``reference/metrics.md`` the metric
catalogue (:data:`traceq.catalog.METRICS`). Neither is a file in ``docs/``: a command or metric added
to the code is in the next build, and one whose help changed can never be shown stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100  # help text wrapped as on a 100-column terminal, the same at every build


def command_helps() -> list[tuple[str, str]]:
    """(``traceq CMD [SUB]``, its --help text) for the application and every visible command, in the
    order ``traceq --help`` lists them."""
    import typer

    from traceq.cli import app

    # typer's own click (typer._click in recent typer, click itself before): take the classes of its app
    root = typer.main.get_command(app)
    Context = type(root.make_context("traceq", ["--help"], resilient_parsing=True))

    def walk(command, ctx) -> list[tuple[str, str]]:
        out = [(ctx.command_path, command.get_help(ctx))]
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    out += walk(sub, Context(sub, info_name=name, parent=ctx, terminal_width=WIDTH, max_content_width=WIDTH))
        return out

    return walk(root, Context(root, info_name="traceq", terminal_width=WIDTH, max_content_width=WIDTH))


def cli_page() -> str:
    helps = command_helps()
    lines = [
        "# CLI reference",
        "",
        "Every command's `--help`, as the installed `traceq` prints it (this page is written from the commands",
        "themselves when the site is built). The [tutorial](../tutorial.md) shows them at work.",
        "",
    ]
    for path, text in helps:
        lines += [f"## `{path}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def metrics_page() -> str:
    from traceq.catalog import METRICS

    lines = [
        "# Metrics reference",
        "",
        "Every metric traceq computes, with its unit and definition: the catalogue `traceq.catalog.METRICS`",
        "that `traceq metrics` prints, the CLI's `--metric` and the Python API's `metric=` read (this page is",
        "written from it when the site is built). Per (run, rank, device, step), over the step's device",
        "window; U is the union of intervals over all streams of one GPU, each clipped to the window.",
        "[What the metrics measure](../explanation/metrics.md) explains windows, steps and aggregation.",
        "",
        "A name may drop its unit suffix on the command line (`--metric exposed_comm` is `exposed_comm_us`).",
        "",
        "| metric | unit | definition |",
        "|---|---|---|",
    ]
    for m in METRICS:
        definition = m.definition.replace("|", "\\|")
        lines.append(f"| `{m.name}` | {m.unit} | {definition} |")
    return "\n".join(lines) + "\n"


def on_config(config):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the traceq of this checkout, installed or not
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    for uri, content in (("reference/cli.md", cli_page()), ("reference/metrics.md", metrics_page())):
        files.append(File.generated(config, uri, content=content))
    return files
