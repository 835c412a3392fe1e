"""Ctrl-C as one stop, wherever it lands: in Python, in a DuckDB statement, or in a library that
swallows it (the ingest's and the command line's handling of SIGINT)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# set by the SIGINT handler of noting_interrupts() while an ingest runs on the main thread
INTERRUPTED = threading.Event()


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` comes of Ctrl-C: any error once SIGINT came while :func:`noting_interrupts` ran
    (the ingest and every command do: DuckDB ends a statement that SIGINT stopped with a plain
    RuntimeError, which says so only in its words), or DuckDB's InterruptException (``interrupt()``)."""
    import duckdb

    return INTERRUPTED.is_set() or isinstance(exc, KeyboardInterrupt | duckdb.InterruptException)


@contextmanager
def noting_interrupts(knock_s: float | None = None, knocks: int = 5,
                      stuck: Callable[[], None] | None = None) -> Iterator[None]:
    """Note SIGINT in :data:`INTERRUPTED` while the block runs, then raise KeyboardInterrupt as Python does;
    an error that ends the block once SIGINT came (DuckDB's for a statement it stopped) comes out of it
    as KeyboardInterrupt too.

    KeyboardInterrupt is raised in whatever Python code the main thread runs when the signal is
    handled. Inside a DuckDB statement that may be DuckDB's own look-up of a Python variable
    (``inspect.currentframe``), and DuckDB reports it as an error of its own: neither
    KeyboardInterrupt nor "Query interrupted". Without the note, such an error sent the file to the
    decoder and the ingest went on (1 Ctrl-C in 60 at random times; a suite run beside a CPU hog).

    ``knock_s``: once SIGINT came, send it again every ``knock_s`` seconds until the block ends, a
    Ctrl-C that a library swallowed being taken the next time; after ``knocks`` of them, call
    ``stuck`` (a command line ends its process there: a statement polars takes over DuckDB's Arrow
    stream interface, which it had started before the signal was handled, heeds no signal and ran on
    for hours, 7 times in 40). For a process's own command line only: a library sends no signals to
    the program that imports it.
    Only on the main thread, where a Python handler is in force. A program's own handler stays: SIGINT is
    noted only where it raises (it stops the program's work, as Python's own does); SIGINT ignored, or its
    default action, is left alone."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler):
        yield
        return
    ended = threading.Event()

    def knock() -> None:
        for _ in range(knocks):
            if ended.wait(knock_s):
                return
            os.kill(os.getpid(), signal.SIGINT)
        if not ended.wait(knock_s) and stuck is not None:
            stuck()

    def note(signum: int, frame: Any) -> None:
        if knock_s is not None and not INTERRUPTED.is_set():
            threading.Thread(target=knock, name="traceq-interrupt", daemon=True).start()
        INTERRUPTED.set()
        signal.default_int_handler(signum, frame)

    def noted(signum: int, frame: Any) -> None:  # a program's own handler: called, and noted where it raises
        try:
            handler(signum, frame)
        except BaseException:
            INTERRUPTED.set()
            raise

    INTERRUPTED.clear()
    signal.signal(signal.SIGINT, note if handler is signal.default_int_handler else noted)
    try:
        yield
    except Exception:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt from None
        raise
    finally:
        ended.set()
        signal.signal(signal.SIGINT, handler)
        INTERRUPTED.clear()


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C during the block comes out of it as KeyboardInterrupt, whatever it was taken for on the
    way: DuckDB's error of an interrupted statement, or a file's error after which the block went on."""
    with noting_interrupts():
        try:
            yield
        except BaseException as exc:
            if is_interrupt(exc) and isinstance(exc, Exception):
                raise KeyboardInterrupt from None
            raise
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt


def end_process(code: int = 130) -> None:
    """End the process at once, its scratch files removed: what Ctrl-C does to a statement that heeds no
    signal (it holds the main thread, so no exception can reach the command; DuckDB undoes its writes,
    a transaction)."""
    from traceq.scratch import remove_process_scratch

    remove_process_scratch()
    os._exit(code)
