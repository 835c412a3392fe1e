"""A tiny transformer language model trained on CPU with 2 ranks, instrumented by TraceCollector.

    torchrun --standalone --nproc-per-node 2 examples/train.py --parallel ddp --run-name demo-ddp
    torchrun --standalone --nproc-per-node 2 examples/train.py --parallel fsdp --run-name demo-fsdp

Data parallel over the gloo backend: DDP (`--parallel ddp`) or FSDP2 (`--parallel fsdp`,
`torch.distributed.fsdp.fully_shard` on every block and on the root). The tokens are synthetic
but learnable (each sequence counts up by a random stride modulo the vocabulary), the seed is fixed,
so the loss falls and two runs do the same work. Files land in `<out-dir>/<run>/rank<r>.*`.

The functions are importable (benchmarks/collector_overhead.py reuses them).
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from traceq.collectors import TraceCollector, count_non_embedding_params


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d_model, dim=-1)
        shape = (batch, seq, self.n_heads, d_model // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, d_model))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Token + position embeddings, `n_layers` blocks, a final norm and an untied LM head."""

    def __init__(self, vocab: int = 256, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, seq_len: int = 64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_batch(gen: torch.Generator, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """`batch` sequences of `seq_len + 1` tokens: start + i * stride (mod vocab)."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 8, (batch, 1), generator=gen)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def build(parallel: str, args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model wrapped for `parallel` ("ddp", "fsdp" or "none") and its AdamW optimizer."""
    torch.manual_seed(0)  # same initial weights on every rank
    model = TinyLM(args.vocab, args.d_model, args.n_heads, args.n_layers, args.seq_len)
    if parallel == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> torch.Tensor:
    """One forward, backward and optimizer step on next-token prediction; returns the loss."""
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--out-dir", default="examples/out")
    p.add_argument("--run-name", default=None, help="run name (default: demo-<parallel>)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: wait+warmup+active+1)")
    p.add_argument("--wait", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps (not recorded)")
    p.add_argument("--active", type=int, default=12, help="recorded steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="recorded steps that reports skip")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--overwrite", action="store_true", help="replace this run's files")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = build(args.parallel, args)
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
    started = time.perf_counter()
    with TraceCollector(
        out_dir=args.out_dir,
        run=args.run_name or f"demo-{args.parallel}",
        wait=args.wait, warmup=args.warmup, active=args.active, warmup_steps=args.warmup_steps,
        tokens_per_step=args.batch_size * args.seq_len * world,
        global_batch_size=args.batch_size * world, micro_batch_size=args.batch_size,
        model=f"TinyLM-{args.n_layers}L-{args.d_model}d", seq_len=args.seq_len,
        n_params_non_embedding=count_non_embedding_params(model),
        n_layers=args.n_layers, n_heads=args.n_heads, head_dim=args.d_model // args.n_heads,
        extra={"parallel": args.parallel, "example": "examples/train.py"},
        overwrite=args.overwrite,
    ) as tc:
        for step in range(steps):
            loss = train_step(model, opt, make_batch(gen, args.batch_size, args.seq_len, args.vocab))
            tc.step()
            if rank == 0 and (step % 5 == 0 or step == steps - 1):
                print(f"step {step:3d}  loss {loss.item():.3f}  (uniform: {math.log(args.vocab):.3f})", flush=True)
    if rank == 0:
        print(f"{steps} steps in {time.perf_counter() - started:.1f} s; files in {tc.run_dir}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
