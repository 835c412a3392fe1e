"""Weak scaling on CPU: the tiny LM of examples/train.py at world size 1, 2 and 4 (gloo, torchrun),
then `traceq scaling` and an HTML report. Separate from the short demo (examples/make_demo.sh).

    python examples/make_scaling.py                      # DDP at 1, 2, 4 ranks (about 1-2 min on 2 cores)
    python examples/make_scaling.py --sizes 1 2 --parallel fsdp

Writes examples/out/scaling-<parallel>-ws<N>/rank<r>.* for each size, ingests them into
examples/out/scaling.duckdb, prints the scaling table and writes examples/out/scaling.html.
Every rank keeps 8 sequences of 64 tokens per step, so tokens_per_step grows with the world size
(weak scaling). On a machine with fewer cores than ranks the ranks share cores: the table then shows
that, too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_size(out: Path, parallel: str, size: int, steps: int, active: int, warmup_steps: int) -> Path:
    """Train at world size `size`; returns the run directory."""
    name = f"scaling-{parallel}-ws{size}"
    shutil.rmtree(out / name, ignore_errors=True)  # a run name is written once: start afresh
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(size),
           str(HERE / "train.py"), "--parallel", parallel, "--out-dir", str(out), "--run-name", name,
           "--wait", "0", "--warmup", "1", "--active", str(active), "--warmup-steps", str(warmup_steps),
           "--steps", str(steps)]
    print(f"$ torchrun --nproc-per-node {size} examples/train.py --parallel {parallel} --run-name {name}", flush=True)
    subprocess.run(cmd, check=True, env=env)
    return out / name


def traceq(*args: str) -> None:
    """Run the traceq CLI of this interpreter, echoing the command."""
    print(f"$ traceq {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "traceq.cli", *args], check=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4], help="world sizes to run")
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--out", type=Path, default=HERE / "out")
    p.add_argument("--active", type=int, default=12, help="recorded steps per run")
    p.add_argument("--warmup-steps", type=int, default=2, help="recorded steps that reports skip")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dirs = [run_size(args.out, args.parallel, n, args.active + 2, args.active, args.warmup_steps) for n in args.sizes]
    db = args.out / "scaling.duckdb"
    db.unlink(missing_ok=True)
    traceq("ingest", *map(str, dirs), "--db", str(db), "--quiet")
    traceq("scaling", "--db", str(db), "--html", str(args.out / "scaling.html"))


if __name__ == "__main__":
    main()
