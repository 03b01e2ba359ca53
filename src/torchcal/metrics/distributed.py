"""The collectives that metrics and losses share under ``torch.distributed``.

Every helper is a no-op outside an initialised process group (or in a group of one), so code
calling it runs unchanged in a single process.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["world_size", "all_gather_uneven"]


def world_size(group: Any = None) -> int:
    """Processes in ``group`` (default: the whole world) of an initialised process group, else 1.

    >>> world_size()  # no process group here
    1
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def all_gather_uneven(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Concatenate ``tensor`` of every rank of ``group`` along dim 0, in rank order, when the
    ranks' lengths differ (the other dims must agree).

    Two ``all_gather`` calls: the lengths, then the tensors padded to the longest; the padding
    is cut off again, so the result is exactly the ranks' tensors one after another.  Every rank
    of the group must call it (a rank with nothing to add passes a tensor of length 0).  Outside
    a process group of size > 1 the tensor itself is returned.

    >>> all_gather_uneven(torch.tensor([1.0, 2.0]))  # one process
    tensor([1., 2.])
    """
    world = world_size(group)
    if world <= 1:
        return tensor
    n_local = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
    sizes = [torch.zeros_like(n_local) for _ in range(world)]
    dist.all_gather(sizes, n_local, group=group)
    sizes_host = [int(s) for s in torch.cat(sizes).cpu().tolist()]
    padded = tensor.new_zeros((max(sizes_host), *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes_host, strict=True)])
