"""The random logits and targets the loss tests share (imported by the test modules, which
bind their own defaults with ``functools.partial``)."""

from __future__ import annotations

import torch


def logits_targets(n: int = 10, c: int = 4, seed: int = 0, scale: float = 2.0,
                   dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale``·N(0, 1) logits of shape (n, c) and uniform class targets, from one seeded
    generator (logits drawn first, so a given seed gives the same data in every module)."""
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(n, c, generator=g, dtype=dtype),
            torch.randint(0, c, (n,), generator=g))
