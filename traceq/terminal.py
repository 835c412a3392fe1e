"""Text on its way to a terminal: control characters shown, never obeyed.

A kernel, run or file name can hold any character, ESC and newline included. Printed raw, ``ESC]0;...BEL``
retitles the terminal, ``ESC[2J`` clears it, and a newline in a run name forges whole lines (an ``error:``
that traceq never wrote). Every line the CLI prints goes through :func:`visible`.
"""

from __future__ import annotations

import re

# C0 controls, DEL and the C1 controls (U+0080-U+009F, which some terminals obey as ESC sequences)
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]


def escape(char: str) -> str:
    """One control character as text: ``\\n``, ``\\t``, ``\\r``, else ``\\xNN``."""
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char, f"\\x{ord(char):02x}")


ESCAPES = [escape(c) for c in CONTROLS]


def visible(text: str) -> str:
    """``text`` with every control character written out (``ESC`` -> ``\\x1b``, newline -> ``\\n``)."""
    return CONTROL.sub(lambda m: escape(m.group()), text) if CONTROL.search(text) else text
