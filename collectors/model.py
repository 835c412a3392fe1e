"""Model dimensions for run metadata, read off an `nn.Module` (duck-typed: torch is not imported)."""

from __future__ import annotations

from typing import Any


def count_non_embedding_params(module: Any) -> int:
    """Parameters of `module` outside its embedding tables (N in the 6N + 12LHQT FLOPs convention).

    Embeddings are the weights of `nn.Embedding` / `nn.EmbeddingBag` submodules. Sharded parameters
    (FSDP2 / DTensor) count with their full size; parameters shared between modules count once.
    """
    embedding = set()
    for sub in module.modules():
        if type(sub).__name__ in ("Embedding", "EmbeddingBag"):
            embedding.update(id(p) for p in sub.parameters(recurse=False))
    return sum(p.numel() for p in module.parameters() if id(p) not in embedding)
