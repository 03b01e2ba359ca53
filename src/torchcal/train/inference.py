"""From a model to logits: batches of a data set on the device (:class:`BatchSource`) and
:func:`predict_logits`, which runs a model over a data set in order; under DDP every rank
predicts its shard and the shards are gathered with the padding a distributed sampler adds
dropped, so every sample counts exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..data.augment import normalize, random_crop_flip
from .device import autocast
from .distributed import DistEnv, gather_padded, shard_indices

__all__ = ["BatchSource", "predict_logits"]


def _is_array_dataset(ds: Any) -> bool:
    return isinstance(getattr(ds, "data", None), torch.Tensor) and isinstance(
        getattr(ds, "labels", None), torch.Tensor)


class BatchSource:
    """Fetches normalised batches of a data set by index, on the device.

    In-memory ``ArrayDataset``: the tensors are moved to the device once and batches are index
    gathers (no DataLoader, no workers); uint8 images are (optionally augmented and) normalised
    on the device.  Other ``Dataset`` s (the ImageNet folder) go through a DataLoader over the
    given indices.
    """

    def __init__(self, dataset: Any, device: torch.device, *, mean: Any = None, std: Any = None,
                 channels_last: bool = False, num_workers: int = 0, padding: int = 4) -> None:
        self.dataset = dataset
        self.padding = int(padding)
        self.device = device
        self.array = _is_array_dataset(dataset)
        self.mean, self.std = mean, std
        self.channels_last = channels_last and device.type == "cuda"
        self.num_workers = num_workers
        if self.array:
            self.data = dataset.data.to(device)
            self.labels = dataset.labels.to(device)
            self.n = int(self.labels.shape[0])
        else:
            self.n = len(dataset)

    def _prepare(self, x: torch.Tensor, augment: bool, generator: torch.Generator | None):
        if x.dtype == torch.uint8:
            if augment:
                x = random_crop_flip(x, padding=self.padding, generator=generator)
            if self.mean is None or self.std is None:
                x = x.float() / 255.0
            else:
                x = normalize(x, self.mean, self.std)
        elif not x.is_floating_point():
            x = x.float()
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised samples and labels at ``index`` (any shape, on the device) of an
        in-memory data set, in one gather: ``x`` of shape ``index.shape + sample shape``
        (no augmentation: that draws per run, :meth:`batches`)."""
        if not self.array:
            raise TypeError("BatchSource.take needs an in-memory ArrayDataset")
        flat = index.reshape(-1)
        x = self._prepare(self.data[flat], False, None)
        return x.reshape(*index.shape, *x.shape[1:]), self.labels[flat].reshape(index.shape)

    def batches(self, indices: torch.Tensor, batch_size: int, *, augment: bool = False,
                generator: torch.Generator | None = None, drop_singleton: bool = False,
                with_index: bool = False) -> Iterator[tuple[torch.Tensor, ...]]:
        """Yield ``(x, y)`` on the device for ``indices`` in order, ``batch_size`` at a time
        (``with_index``: ``(x, y, i)``, ``i`` the batch's indices on the device).

        ``drop_singleton`` drops a final batch of one sample (BatchNorm cannot train on it).
        """
        n = int(indices.numel())
        stop = n - 1 if (drop_singleton and n % batch_size == 1 and n > 1) else n
        idx_dev = indices.to(self.device)
        if self.array:
            for s in range(0, stop, batch_size):
                i = idx_dev[s:min(s + batch_size, stop)]
                x, y = self._prepare(self.data[i], augment, generator), self.labels[i]
                yield (x, y, i) if with_index else (x, y)
            return

        loader = DataLoader(self.dataset, batch_size=batch_size,
                            sampler=indices[:stop].tolist(), num_workers=self.num_workers,
                            pin_memory=self.device.type == "cuda",
                            persistent_workers=False)
        for s, (x, y) in zip(range(0, stop, batch_size), loader, strict=True):
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True).long()
            x = self._prepare(x, False, None)
            yield (x, y, idx_dev[s:s + batch_size]) if with_index else (x, y)


@torch.no_grad()
def _predict_indices(model: nn.Module, source: BatchSource, indices: torch.Tensor,
                     batch_size: int, amp: str = "off", features: bool = False):
    outs, labels = [], []
    for x, y in source.batches(indices, batch_size):
        with autocast(source.device, amp):
            out = model.forward_features(x) if features else model(x)
        outs.append(out.float())
        labels.append(y)
    if not outs:
        raise ValueError("Expected a non-empty data set to predict on")
    return torch.cat(outs), torch.cat(labels)


def predict_logits(model: nn.Module, dataset: Any, device: str | torch.device = "cpu",
                   batch_size: int = 256, *, mean: Any = None, std: Any = None,
                   amp: str = "off", env: DistEnv | None = None, source: BatchSource | None = None,
                   return_local: bool = False):
    """Logits of ``model`` on every sample of ``dataset``, in order.

    Args:
        model: a classifier (put in eval mode here; a DDP wrapper is unwrapped).
        dataset: an ``ArrayDataset`` (uint8 images normalised with ``mean``/``std``, or float
            features) or any ``Dataset`` yielding ``(x, y)``.
        device: where to run.
        batch_size: prediction batch size (per process).
        env: under DDP (``env.world_size > 1``) each rank predicts its shard; the shards are
            gathered and the samples the distributed sampler pads in are dropped.

    Returns:
        ``(logits float32 (N, C), labels int64 (N,))`` on ``device`` (every rank gets all N).
        With ``return_local=True`` also this rank's unpadded share ``(logits, labels)``.

    Example:
        >>> from torchcal.data import ArrayDataset
        >>> ds = ArrayDataset(torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]),
        ...                   torch.tensor([0, 1, 1]))
        >>> z, y = predict_logits(nn.Identity(), ds, batch_size=2)
        >>> z.tolist(), y.tolist()
        ([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]], [0, 1, 1])
    """
    env = env or DistEnv()
    device = torch.device(device)
    module = getattr(model, "module", model)
    was_training = module.training
    module.eval()
    src = source or BatchSource(dataset, device, mean=mean, std=std)
    n = src.n
    shard, n_valid = shard_indices(torch.arange(n), env.rank, env.world_size)
    try:
        local_z, local_y = _predict_indices(module, src, shard, batch_size, amp)
    finally:
        module.train(was_training)
    z = gather_padded(local_z, n, env)
    y = gather_padded(local_y, n, env)
    if return_local:
        return z, y, (local_z[:n_valid], local_y[:n_valid])
    return z, y
