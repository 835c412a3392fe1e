"""Scratch directories that outlive no process: each holds a lock file its process keeps locked, so
that whatever kills the process (SIGKILL, the OOM killer), the next traceq command can tell and
remove what it left. Standard library only: every command runs :func:`remove_stale_scratch_everywhere`
before it imports anything heavy."""

from __future__ import annotations

import atexit
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import IO

from traceq.errors import ConfigError

SHM = "/dev/shm"
ENV_VAR = "TRACEQ_SCRATCH"  # a directory of the user's choosing, over SHM and the temp directory


def scratch_base(room: int) -> str:
    """Where scratch files go: ``$TRACEQ_SCRATCH`` where it is set, else in memory (``/dev/shm``) where
    the machine has one with ``room`` bytes free (containers often give it 64 MB), else the temp
    directory."""
    if chosen := os.environ.get(ENV_VAR):
        if not (os.path.isdir(chosen) and os.access(chosen, os.W_OK | os.X_OK)):
            raise ConfigError(f"{ENV_VAR}={chosen}: no directory traceq can write; make it, or unset "
                              f"{ENV_VAR} to use {SHM} or the temp directory")
        return chosen
    try:
        st = os.statvfs(SHM)
        if os.access(SHM, os.W_OK) and st.f_bavail * st.f_frsize >= room:
            return SHM
    except OSError:
        pass
    return tempfile.gettempdir()


def remove_stale_scratch_everywhere() -> None:
    """:func:`remove_stale_scratch` wherever scratch directories may be (any traceq command runs it
    first: a killed ingest's files go as soon as its owner is gone)."""
    for base in {SHM, tempfile.gettempdir(), os.environ.get(ENV_VAR) or SHM}:
        remove_stale_scratch(base)


_AT_EXIT: list[ScratchDir] = []  # directories that live as long as the process
_AT_EXIT_LOCK = threading.Lock()


def remove_at_exit(directory: ScratchDir) -> ScratchDir:
    """Keep ``directory`` until the process ends (:func:`remove_process_scratch`, run at exit)."""
    with _AT_EXIT_LOCK:
        if not _AT_EXIT:
            atexit.register(remove_process_scratch)
        _AT_EXIT.append(directory)
    return directory


def remove_process_scratch() -> None:
    """Remove the directories given to :func:`remove_at_exit`: at exit, and before it where the process
    may end without exit handlers (:func:`traceq.interrupts.end_process`, which ends a statement that heeds
    no Ctrl-C with ``os._exit``; the CLI's ``main``, before its exit)."""
    with _AT_EXIT_LOCK:
        while _AT_EXIT:
            _AT_EXIT.pop().cleanup()


def scratch_dir(base: str) -> ScratchDir:
    """A private directory in ``base`` (:class:`ScratchDir`), after removing what killed ingests left there."""
    _remove_stale_scratch_once(base)
    return ScratchDir(prefix=f"traceq-{os.getpid()}-", dir=base)


_OWNER_LOCK = "owner.lock"


class ScratchDir:
    """A private directory (``name``) with a lock file that this process holds locked (``flock``)
    until :meth:`cleanup`, which removes both; a context manager that cleans up on exit.

    Nothing is left to the garbage collector: whoever makes one removes it. The kernel drops the lock
    when the process dies, however it dies, so the next traceq command can tell a killed ingest's
    directory and remove it (:func:`remove_stale_scratch`)."""

    def __init__(self, prefix: str, dir: str) -> None:
        self.name = tempfile.mkdtemp(prefix=prefix, dir=dir)
        self._lock_fd: int | None = None
        try:
            import fcntl
        except ImportError:  # no flock: stale directories then go by process id and age alone
            return
        try:
            # made under another name and locked before it takes its own: a remover that finds
            # owner.lock unlocked must never be looking at one whose owner has not locked it yet
            pending = os.path.join(self.name, f".{_OWNER_LOCK}.new")
            fd = os.open(pending, os.O_RDWR | os.O_CREAT, 0o600)
            self._lock_fd = fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(pending, os.path.join(self.name, _OWNER_LOCK))
        except BaseException:
            self.cleanup()
            raise

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the directory and release its lock (again: nothing)."""
        try:
            shutil.rmtree(self.name, ignore_errors=True)
        finally:
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                os.close(fd)


@cache
def _remove_stale_scratch_once(base: str) -> None:
    """:func:`remove_stale_scratch`, once per process (not once per file: ``base`` may be a large /tmp)."""
    remove_stale_scratch(base)


_SCRATCH_NAME = re.compile(r"traceq-(\d+)-\w+")
# A directory without an owner lock (traceq before 0.2): a live ingest adds and removes batch files
# every few seconds, which touches its directory.
STALE_SCRATCH_S = 600


def remove_stale_scratch(base: str) -> None:
    """Remove the scratch directories in ``base`` left by ingests that were killed (SIGKILL, the OOM
    killer): up to a few batches of JSON each, in memory under ``/dev/shm``. A directory goes when
    its owner lock can be taken (its process is gone: the kernel dropped the lock, in any PID
    namespace); one without a lock file when its process is gone and it has not changed for
    :data:`STALE_SCRATCH_S`."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        m = _SCRATCH_NAME.fullmatch(entry.name)
        if m is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        owner = _owner_gone(entry.path)
        if owner is None:  # no lock file
            owner = now - st.st_mtime >= STALE_SCRATCH_S and not _process_alive(int(m.group(1)))
        if owner:
            shutil.rmtree(entry.path, ignore_errors=True)


def _owner_gone(directory: str) -> bool | None:
    """Whether the process that made ``directory`` has released its owner lock; None without one."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(os.path.join(directory, _OWNER_LOCK), os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


# ------------------------------------------------------------------ files written whole


@contextmanager
def atomic_file(target: Path) -> Iterator[IO[bytes]]:
    """A file that becomes ``target`` when the block ends without an error; otherwise it is removed.
    It is written as ``.<name>.<pid>.<random>.tmp`` beside ``target``; those of processes that are gone
    (a killed export) are removed first."""
    _remove_stale(target)
    temp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise ConfigError(f"{target}: cannot write there ({exc.strerror}); write it elsewhere") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


# what atomic_file names its temporary files: .<name>.<pid>.<8 hex digits>.tmp
_ATOMIC_TEMP = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.tmp$")


def _remove_stale(target: Path) -> None:
    """Remove the temporary files that processes no longer running (killed mid-write: SIGKILL, SIGTERM)
    left beside ``target``: its own, and those of any other output written to that folder (a killed
    ``export --perfetto a.pftrace`` is cleaned by the next command that writes there, whatever its file)."""
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return  # (the folder cannot be listed: opening the temporary file says why)
    for entry in entries:
        m = _ATOMIC_TEMP.match(entry.name)
        if m and entry.is_file(follow_symlinks=False) and not _process_alive(int(m.group(1))):
            Path(entry.path).unlink(missing_ok=True)

