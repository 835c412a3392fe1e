"""Regenerate the docs' screenshots: `python docs/make_images.py` (or `make docs-images`).

Trains the demo run (examples/make_demo.sh ddp) unless examples/out/demo-ddp is there, ingests it into
a scratch warehouse, writes the HTML report and the critical-path page, and photographs them with
headless Chromium (as tests/test_html_report.py drives it: no network, a fixed window) into
docs/images/. The Perfetto UI is a web app served from ui.perfetto.dev, out of reach of an offline
machine, so its view is not photographed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
SHOTS = {  # image name: (traceq command writing page.html, window width, height)
    "report": (["report", "--metric", "exposed_comm", "--by", "run,rank,step"], 1100, 1500),
    "critical-path": (["critical-path", "--steps", "10:11"], 1100, 1100),
}


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        sys.exit("error: headless Chromium is not installed (apt-get install -y chromium)")
    return found


def main() -> None:
    browser = chromium()
    run = ROOT / "examples" / "out" / "demo-ddp"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    if not (run / "rank1.trace.json.gz").is_file():
        subprocess.run(["bash", str(ROOT / "examples" / "make_demo.sh"), "ddp"], check=True, env=env)
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="traceq-images-") as tmp:
        db = Path(tmp) / "demo.duckdb"
        cli = [sys.executable, "-m", "traceq.cli"]
        subprocess.run([*cli, "ingest", str(run), "--db", str(db)], check=True, env=env, capture_output=True)
        for name, (command, width, height) in SHOTS.items():
            page = Path(tmp) / f"{name}.html"
            subprocess.run([*cli, *command, "--db", str(db), "--html", str(page)], check=True, env=env,
                           capture_output=True)
            shot = IMAGES / f"{name}.png"
            subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                 "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={Path(tmp) / 'profile'}",
                 f"--screenshot={shot}", f"--window-size={width},{height}", "--virtual-time-budget=10000",
                 page.as_uri()],
                check=True, capture_output=True, timeout=120,
            )
            print(f"wrote {shot.relative_to(ROOT)}: {shot.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
