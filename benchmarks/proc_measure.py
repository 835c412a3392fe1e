"""Run a command in a fresh process and measure it: wall and CPU seconds, peak memory of its process
tree. Shared by bench_ingest.py and bench_scale.py (Linux: reads /proc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The command runs under a small wrapper process that reports getrusage(RUSAGE_CHILDREN): a process
# forked directly from the (possibly large) benchmark process would inherit its RSS high-water mark
# in ru_maxrss (Linux keeps it across fork and exec), and RUSAGE_CHILDREN of the benchmark process
# itself is the maximum over every command it has run so far.
WRAPPER = r"""
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.call(sys.argv[2:])
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as fh:
    json.dump({"rc": rc, "wall": wall, "maxrss_kb": ru.ru_maxrss, "cpu_s": ru.ru_utime + ru.ru_stime}, fh)
"""


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        return out
    for k in kids:
        out.append(k)
        out.extend(_descendants(k))
    return out


def tree_memory(pid: int) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) in bytes over the descendants of ``pid`` (``pid`` itself excluded)."""
    rss = pss = 0
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return rss, pss


def measure(cmd: list[str], cwd: Path | None = None, env: dict | None = None, sample_s: float | None = 0.05) -> dict:
    """Run ``cmd``; its exit code, wall and CPU seconds, peak tree RSS and PSS (sampled every
    ``sample_s``; the RSS peak is at least ru_maxrss), stdout and the tail of stderr.

    ``sample_s=None`` samples nothing (peak RSS is then ru_maxrss, PSS 0): for timing. Sampling is
    not free: reading ``smaps_rollup`` walks the page tables of every process of the tree, which
    on a 2-core machine made a 3.2 s ingest take 3.45 s (medians of 4, sampling every 50 ms).
    """
    # files, not pipes: a pipe nobody reads while we sample would block a talkative command
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f, \
            tempfile.TemporaryDirectory(prefix="bench_rusage_") as tmp:
        report = Path(tmp) / "rusage.json"
        proc = subprocess.Popen([sys.executable, "-S", "-c", WRAPPER, str(report), *cmd], cwd=cwd, env=env,
                                stdout=out_f, stderr=err_f)
        peak_rss = peak_pss = 0
        while sample_s is not None and proc.poll() is None:
            rss, pss = tree_memory(proc.pid)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            time.sleep(sample_s)
        proc.wait()
        try:
            ru = json.loads(report.read_text())
        except (OSError, json.JSONDecodeError):
            ru = {"rc": proc.returncode if proc.returncode else -1, "wall": float("nan"), "maxrss_kb": 0,
                  "cpu_s": float("nan")}
        out_f.seek(0)
        err_f.seek(0)
        stdout = out_f.read().decode(errors="replace")
        stderr = err_f.read().decode(errors="replace")
    maxrss_mb = ru["maxrss_kb"] / 1024  # Linux: KiB
    return {
        "rc": ru["rc"],
        "seconds": ru["wall"],
        "cpu_s": ru["cpu_s"],
        "loadavg_after": os.getloadavg()[0],
        "peak_rss_mb": max(peak_rss / 2**20, maxrss_mb),
        "peak_pss_mb": peak_pss / 2**20,
        "maxrss_mb": maxrss_mb,
        "stdout": stdout,
        "stderr_tail": stderr[-2000:],
    }
