"""The HTML report: one self-contained file that renders in real headless Chromium (Debian's `chromium`):
a non-blank screenshot, the expected plot elements in the DOM, no script errors."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_scaling import make_run
from tests.test_throughput import collective_trace
from traceq.cli import app
from traceq.ingest import ingest_traces
from traceq.report.html import write_html_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (apt-get install -y chromium; CI installs it)"
)
WIDTH, HEIGHT = 1000, 2600


@pytest.fixture(scope="module")
def report_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPU runs at world size 1 and 2 with power logs, plus one run with collectives of two kinds."""
    root = tmp_path_factory.mktemp("html")
    files = make_run(root, "a1", 1, 1000, 100, "A", 200.0) + make_run(root, "a2", 2, 2000, 125, "A", 210.0)
    files.append(collective_trace().write(root / "coll" / "rank0.json"))
    db = root / "w.duckdb"
    assert ingest_traces(files, db, threads=1).ok
    return db


def chromium(page: Path, out: Path) -> tuple[str, str, Path]:
    """Load `page` in headless Chromium with networking blocked: (dumped DOM, log, screenshot path)."""
    shot = out / f"{page.stem}.png"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--host-resolver-rules=MAP * ~NOTFOUND",
         f"--user-data-dir={out / 'profile'}", "--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
         "--dump-dom", f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=10000", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr, shot


def script_errors(log: str) -> list[str]:
    """Console messages that report an error (Chromium logs them as INFO:CONSOLE lines)."""
    return [line for line in log.splitlines() if "CONSOLE" in line and re.search(r"error|uncaught|failed", line, re.I)]


def png_pixels(path: Path) -> tuple[int, int, int, bytes]:
    """A tiny PNG reader for 8-bit RGB/RGBA, non-interlaced (what Chromium writes): width, height, bpp, pixels."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    width, height, depth, color, _, _, interlace = ihdr
    assert depth == 8 and color in (2, 6) and interlace == 0, ihdr
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    prev, out = bytearray(stride), bytearray()
    for y in range(height):
        kind, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(bpp, stride):
                row[i] = (row[i] + row[i - bpp]) & 255
        elif kind == 2:
            row = bytearray((a + b) & 255 for a, b in zip(row, prev))
        elif kind == 3:
            for i in range(stride):
                row[i] = (row[i] + ((row[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
        elif kind == 4:
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += row
        prev = row
    return width, height, bpp, bytes(out)


def pixel_variance(path: Path) -> float:
    width, height, bpp, pixels = png_pixels(path)
    grey = pixels[::bpp]  # red channel is enough to tell a blank page from a drawn one
    mean = sum(grey) / len(grey)
    return sum((v - mean) ** 2 for v in grey[:: 7]) / len(grey[:: 7])


@pytest.mark.slow
def test_png_reader_and_error_detection_work_on_known_pages(tmp_path: Path) -> None:
    """The checks below would catch a blank page and a script error (so they are worth their names)."""
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium; CI installs it)")
    blank = tmp_path / "blank.html"
    blank.write_text("<html><body style='background:#fff'></body></html>")
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><p>x</p><script>notDefinedAnywhere();</script></body></html>")
    _, log, shot = chromium(blank, tmp_path)
    assert pixel_variance(shot) == 0.0 and not script_errors(log)
    _, log, _ = chromium(broken, tmp_path)
    assert any("notDefinedAnywhere" in line for line in script_errors(log))


@pytest.mark.slow
@needs_chromium
def test_html_report_renders_offline_in_headless_chromium(report_db: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    runner = CliRunner()
    result = runner.invoke(app, ["report", "--metric", "exposed_comm", "--db", str(report_db), "--html", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    # self-contained: no external script or stylesheet (Chromium below also runs with DNS blocked)
    assert not re.findall(r"<script[^>]*\bsrc=|<link[^>]*\bhref=", text)
    assert "Plotly.newPlot" in text and len(text) > 1_000_000  # plotly.js is inline
    dom, log, shot = chromium(page, tmp_path)
    assert not script_errors(log), script_errors(log)
    # four plotly figures rendered: per-step stack, collectives, scaling, power
    assert dom.count('class="plot-container plotly"') == 4
    for div in ("steps", "collectives", "scaling", "power"):
        assert f'id="{div}"' in dom
    legend = set(re.findall(r'class="legendtext"[^>]*>([^<]+)<', dom))
    assert {"compute", "overlapped comm", "exposed comm", "exposed memcpy", "idle"} <= legend
    assert {"measured", "ideal (linear)"} <= legend
    assert {"a1 r0 gpu0", "a2 r1 gpu1"} <= legend
    assert "AllReduce" in dom and "AllGather" in dom  # collective axis labels
    assert "can sum to more than exposed_comm_us" in dom
    assert pixel_variance(shot) > 100.0


def test_report_without_power_says_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    files = make_run(root, "cpu1", 1, 1000, 100, "A", None)
    run_dir = root / "cpu1"
    (run_dir / "rank0.power.jsonl").write_text(json.dumps(
        {"kind": "header", "source": "unavailable", "reason": "NVMLError_LibraryNotFound", "gpus": []}) + "\n")
    db = tmp_path / "w.duckdb"
    ingest_traces(files, db, threads=1)
    text = write_html_report(db, tmp_path / "r.html").read_text()
    assert "Power unavailable for 1 of 1 run(s)" in text
    assert "run cpu1: power unavailable (NVMLError_LibraryNotFound)" in text
    assert 'id="power"' not in text and "scaling curves need runs at two or more world sizes" in text


@pytest.mark.slow
def test_html_report_errors_name_the_fix(tmp_path: Path, report_db: Path) -> None:
    result = CliRunner().invoke(app, ["report", "--db", str(report_db), "--html", str(tmp_path / "no" / "dir" / "r.html")])
    assert result.exit_code == 1 and "r.html: cannot write there (No such file or directory)" in result.stderr


@pytest.mark.slow
@needs_chromium
def test_html_report_shows_waiting_and_bus_bandwidth_across_ranks(tmp_path: Path) -> None:
    """Three ranks, one AllReduce that rank 2 arrives last at (tests/test_cross_rank.py, worked by hand):
    a heatmap of waiting (ranks 0 and 1 waited 7 and 4 us) and busbw against message size."""
    from tests.test_cross_rank import late_rank_run, write_run

    db = tmp_path / "w.duckdb"
    assert ingest_traces(write_run(tmp_path / "job", late_rank_run()), db, threads=1).ok
    page = write_html_report(db, tmp_path / "cross.html")
    dom, log, shot = chromium(page, tmp_path)
    assert not script_errors(log), script_errors(log)
    for div in ("waits", "busbw"):
        assert f'id="{div}"' in dom
    assert "Waiting for the last rank at collectives" in dom and "Bus bandwidth against message size" in dom
    assert 'class="hm"' in dom  # plotly drew the heatmap's layer
    assert "AllReduce (job)" in set(re.findall(r'class="legendtext"[^>]*>([^<]+)<', dom))
    assert "run job: 3 of 3 communication kernels matched, 1 collective instances over 3 ranks" in dom
    assert pixel_variance(shot) > 100.0
    text = page.read_text()
    assert re.search(r'"z":\[\[7\.0\],\[4\.0\],\[0\.0\]\]', text), "waits per rank 0, 1, 2 in step 1: 7, 4, 0 us"


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    ["report", "--metric", "idle"], ["critical-path", "--include-last"], ["scaling"],
], ids=lambda c: c[0])
def test_a_full_disk_leaves_the_earlier_page_whole_and_no_part_of_the_new_one(
        tmp_path: Path, report_db: Path, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages are written to a temporary file beside their path and renamed at the end: a write that fails
    (ENOSPC after 64 KiB) leaves the earlier page as it was and no temporary file."""
    import errno
    import os

    import traceq.scratch as scratch

    page = tmp_path / "page.html"
    page.write_text("<html>the earlier report</html>")
    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.n += len(data)
            if self.n > 65536:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

    monkeypatch.setattr(scratch.os, "fdopen", lambda fd, mode: Full(real(fd, mode)))
    args = [*command, "--db", str(report_db), "--html", str(page)]
    if command[0] == "critical-path":
        args += ["--run", "coll"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "page.html: cannot write the HTML page (No space left on device)" in result.stderr
    assert page.read_text() == "<html>the earlier report</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]
