"""Text on its way to a terminal: control characters shown, never obeyed.

A kernel, run or file name can hold any character, ESC and newline included. Printed raw, ``ESC]0;...BEL``
retitles the terminal, ``ESC[2J`` clears it, and a newline in a run name forges whole lines (an ``error:``
that traceq never wrote). Every line the CLI prints goes through :func:`visible`.
"""

from __future__ import annotations

import re

# C0 controls, DEL, the C1 controls (U+0080-U+009F, which some terminals obey as ESC sequences), and the
# characters that reorder or break a line without showing (bidi overrides and isolates, line separators)
CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), 0x200E, 0x200F, *range(0x202A, 0x202F),
                             *range(0x2066, 0x206A), 0x2028, 0x2029)]
CONTROL = re.compile("[" + "".join(re.escape(c) for c in CONTROLS) + "]")


def escape(char: str) -> str:
    """One control character as text: ``\\n``, ``\\t``, ``\\r``, ``\\xNN``, else ``\\uNNNN``."""
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char)
    return named or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


ESCAPES = [escape(c) for c in CONTROLS]


def visible(text: str) -> str:
    """``text`` with every control character written out (``ESC`` -> ``\\x1b``, newline -> ``\\n``)."""
    return CONTROL.sub(lambda m: escape(m.group()), text) if CONTROL.search(text) else text
