#!/usr/bin/env bash
# Train the tiny LM for 14 steps on CPU with 2 gloo ranks and write examples/out/demo-<parallel>/
# (2 x rank<r>.trace.json.gz, rank<r>.run.json, rank<r>.power.jsonl). About 10 s on 2 cores.
#
#   examples/make_demo.sh            # DDP  -> examples/out/demo-ddp
#   examples/make_demo.sh fsdp       # FSDP2 -> examples/out/demo-fsdp
#   PYTHON=/path/to/python examples/make_demo.sh
set -euo pipefail
parallel="${1:-ddp}"
python="${PYTHON:-python}"
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/out"
rm -rf "$out/demo-$parallel"   # a run name is written once; start the demo afresh
export OMP_NUM_THREADS=1
"$python" -m torch.distributed.run --standalone --nproc-per-node 2 \
    "$here/train.py" --parallel "$parallel" --out-dir "$out" --run-name "demo-$parallel" \
    --wait 0 --warmup 1 --active 12 --warmup-steps 2 --steps 14
