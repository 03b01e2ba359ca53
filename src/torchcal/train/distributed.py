"""Distributed data parallel from the environment (``torchrun`` sets RANK / WORLD_SIZE / LOCAL_RANK).

Sharding follows :class:`torch.utils.data.DistributedSampler`: the (shuffled) index list is padded
by wrapping around to a multiple of the world size and rank ``r`` takes positions ``r::W``.  The
order of an epoch depends only on ``(seed, epoch)``, never on consumed RNG state, so a resumed run
sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = [
    "DistEnv",
    "setup_distributed",
    "cleanup_distributed",
    "epoch_seed",
    "epoch_permutation",
    "shard_indices",
    "gather_padded",
]


@dataclass(frozen=True)
class DistEnv:
    """Rank information of this process (``world_size == 1`` without DDP)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup_distributed(device_type: str) -> DistEnv:
    """Initialise the default process group when launched by ``torchrun`` (WORLD_SIZE > 1).

    Backend: NCCL for CUDA, gloo otherwise.  Returns the rank information; without the
    environment variables (a plain ``python`` launch) nothing is initialised.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistEnv()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_available() and dist.is_initialized():
        return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, False)
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, True)


def cleanup_distributed(env: DistEnv) -> None:
    if env.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def epoch_seed(seed: int, epoch: int, stream: int = 0) -> int:
    """A 63-bit seed derived from ``(seed, epoch, stream)`` (independent of any RNG state).

    >>> epoch_seed(0, 0) == epoch_seed(0, 0), epoch_seed(0, 0) != epoch_seed(0, 1)
    (True, True)
    """
    # splitmix64-style mixing of the three integers
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(epoch) * 0xBF58476D1CE4E5B9
         + int(stream) * 0x94D049BB133111EB + 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    return x & 0x7FFFFFFFFFFFFFFF


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The shuffled order of ``n`` training indices for ``epoch`` (CPU int64)."""
    g = torch.Generator()
    g.manual_seed(epoch_seed(seed, epoch, stream=1))
    return torch.randperm(n, generator=g)


def shard_indices(indices: torch.Tensor, rank: int, world_size: int) -> tuple[torch.Tensor, int]:
    """This rank's share of ``indices`` padded DistributedSampler-style.

    Returns ``(shard, n_valid)`` where the first ``n_valid`` entries of ``shard`` are positions
    ``< len(indices)`` of the unpadded list (the rest repeat samples from the start).

    >>> shard_indices(torch.arange(5), 1, 2)
    (tensor([1, 3, 0]), 2)
    """
    n = int(indices.numel())
    if world_size <= 1:
        return indices, n
    per = -(-n // world_size)
    total = per * world_size
    if total > n:
        reps = -(-total // max(n, 1))
        padded = indices.repeat(reps)[:total] if n else indices
    else:
        padded = indices
    shard = padded[rank:total:world_size]
    positions = torch.arange(rank, total, world_size)
    n_valid = int((positions < n).sum())
    return shard, n_valid


def gather_padded(local: torch.Tensor, n: int, env: DistEnv) -> torch.Tensor:
    """Gather per-rank results of :func:`shard_indices` over ``arange(n)`` back into order.

    ``local`` holds this rank's rows for its (padded) shard; every rank has the same number of
    rows.  Returns the ``n`` rows in the original order on every rank (padding dropped).
    """
    if not env.enabled:
        return local[:n]
    parts = [torch.empty_like(local) for _ in range(env.world_size)]
    dist.all_gather(parts, local.contiguous())
    stacked = torch.stack(parts, dim=1)  # (per, W, ...): row i of rank r is position i*W + r
    return stacked.reshape(-1, *local.shape[1:])[:n]
