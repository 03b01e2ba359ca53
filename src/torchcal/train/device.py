"""Where a run computes: the device of ``--device`` (``auto``, ``cpu``, ``cuda[:i]``) under DDP,
and the autocast context of ``--amp``."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from .distributed import DistEnv

__all__ = ["resolve_device", "autocast", "is_cuda"]


def is_cuda(device: str) -> bool:
    """Whether a run on ``device`` trains on a GPU (``"auto"`` where this process sees one): the
    one answer for the trainer's process group and a sweep's pack sizes and resources."""
    device = str(device)
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def resolve_device(device: str, env: DistEnv | None = None) -> torch.device:
    """``"auto"`` -> ``cuda:LOCAL_RANK`` when CUDA is available, else CPU."""
    env = env or DistEnv()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"Expected `device` to be a valid torch device, got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"Expected `device` to be an available device, got {device!r}, but "
                             "CUDA is not available here (use --device cpu or auto)")
        if dev.index is None:
            dev = torch.device("cuda", env.local_rank if env.enabled else torch.cuda.current_device())
    return dev


def autocast(device: torch.device, amp: str):
    """The autocast context of ``amp`` (``off``, ``bf16``, ``fp16``) on CUDA; none elsewhere."""
    if device.type != "cuda" or amp == "off":
        return nullcontext()
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16 if amp == "bf16" else torch.float16)
