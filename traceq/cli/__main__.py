"""``python -m traceq.cli``: the console script."""

from traceq.cli import main

main()
