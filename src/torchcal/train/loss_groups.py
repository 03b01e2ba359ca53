"""The losses of a pack's lanes evaluated with one call per loss configuration.

A pack (:mod:`torchcal.train.packed`) holds M runs, each with its own loss object (AdaFocal's
per-bin γ, a temperature-aware loss' T, ...).  Calling M loss modules one after the other
launches every small operation of every loss M times per step; :class:`LossGroups` instead
groups the lanes whose losses share a class and its hyperparameters (their reduction and
``ignore_index`` included) and evaluates each group with one ``torch.func.vmap`` over
``functional_call(template, stacked_buffers, (logits, labels))``: the lanes' buffers (the
state in which they differ) are stacked along a leading lane dimension, the Python state they
share (the epoch of a scheduled loss) is that of a template copy of the first lane's loss.
The cost of a step's losses then grows with the number of loss configurations, not of lanes.
A group of one lane calls its loss directly (``functional_call`` without ``vmap``: vmap's
fixed cost, about 0.5 ms a call on a CPU, bought nothing there), and a loss whose vmapped call
rounds otherwise than a single call (``vmap_rounds_alike = False``: MMCE) is a group of one in
every pack, so that on the CPU every packed run equals its separate run bit for bit.

The state stacks are refreshed from the lanes' own modules by :meth:`LossGroups.refresh`,
which the engine calls after every hook that may change them (``set_epoch``, ``on_validation``,
a checkpoint loaded): the lanes' modules stay the objects that checkpoints, logs and hooks
see.  A loss that cannot be batched (:meth:`~torchcal.losses.base.CalibrationLoss.vmap_problem`:
trainable parameters, state outside its buffers, a calibrator object; a loss that is not a
``CalibrationLoss``) is called on its own lane's rows; :attr:`LossGroups.unbatched` says
why, and a :class:`PackedLossWarning` says so once per pack.  With one lane (M = 1, a run
alone) the call is that lane's own loss module, called as it is.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from ..errors import PackedLossWarning
from ..losses.base import CalibrationLoss

__all__ = ["LossGroups", "loss_vmap_problem", "PackedLossWarning"]


def loss_vmap_problem(loss: nn.Module) -> str | None:
    """Why ``loss`` cannot join a vmapped group (None: it can)."""
    if not isinstance(loss, CalibrationLoss):
        return f"{type(loss).__name__} is not a torchcal CalibrationLoss (its state is unknown)"
    return loss.vmap_problem()


def _buffers(loss: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in loss.named_buffers() if b is not None}


def _key(loss: CalibrationLoss, m: int) -> tuple[Any, ...]:
    """What lanes of one group share: class, hyperparameters, reduction, ignore_index, and
    the names, shapes and dtypes of the buffers they hold (None buffers left out); a loss
    whose vmapped call rounds otherwise (``vmap_rounds_alike = False``) is a group of its own
    (lane ``m``)."""
    bufs = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in _buffers(loss).items())
    hyper = tuple((k, repr(v)) for k, v in loss.hyperparameters.items())
    alone = None if getattr(loss, "vmap_rounds_alike", True) else m
    return (type(loss), hyper, loss.reduction, loss.ignore_index, bufs, alone)


class _Group:
    """Lanes ``index`` (positions in the pack) sharing one loss configuration."""

    def __init__(self, index: list[int], losses: list[CalibrationLoss], device: torch.device):
        self.index = index
        self.losses = losses
        self.idx = torch.tensor(index, dtype=torch.long, device=device)
        self.template: nn.Module | None = None
        self.state: dict[str, torch.Tensor] = {}
        self.refresh()

    def refresh(self) -> None:
        """Stack the lanes' buffers (a buffer equal in every lane, such as AdaFocal's bin
        edges, is passed once, unbatched); the template takes the first lane's Python
        state."""
        first = self.losses[0]
        self.template = copy.deepcopy(first)
        self.template.validate_args = False  # the labels were checked when the data loaded
        old = getattr(self, "state", {})
        self.state, self.shared = {}, {}
        for n, b in _buffers(first).items():
            each = [_buffers(ls)[n] for ls in self.losses]
            if all(torch.equal(b, e) for e in each[1:]):
                self.shared[n] = b
                continue
            stacked = torch.stack(each)
            kept = old.get(n)
            if kept is not None and kept.shape == stacked.shape and kept.dtype == stacked.dtype:
                # the same tensor, updated in place: a compiled step's static buffer
                stacked = kept.copy_(stacked)
            self.state[n] = stacked

    def _one(self, state: dict[str, torch.Tensor], shared: dict[str, torch.Tensor],
             z: torch.Tensor, y: torch.Tensor):
        return functional_call(self.template, {**state, **shared}, (z, y))

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if len(self.index) == 1:  # one lane: its loss called as a separate run calls it
            return self._one(self.state, self.shared, logits[0], labels[0]).reshape(1)
        return vmap(self._one, in_dims=(0, None, 0, 0), randomness="error")(
            self.state, self.shared, logits, labels)


class LossGroups:
    """The losses of M lanes as one callable: ``groups(logits (M, B, C), labels (M, B))``
    gives the M lanes' reduced losses (M,).

    Args:
        losses: the lanes' loss modules, in pack order.
        device: where the logits are.

    Attributes:
        unbatched: ``{lane position: why its loss is called on its own}``.
    """

    def __init__(self, losses: Sequence[nn.Module], device: torch.device) -> None:
        self.losses = list(losses)
        self.device = torch.device(device)
        self.unbatched: dict[int, str] = {}
        #: (M,) bool on the device: the lanes whose loss is a mean over the batch (built
        #: once: a tensor from a host list is a synchronising copy on an accelerator)
        self.mean_rows = torch.tensor([r == "mean" for r in self.reductions()],
                                      device=self.device)
        self._build()
        if self.unbatched:  # slower, not wrong: said once, with the reason
            why = "; ".join(sorted(set(self.unbatched.values())))
            warnings.warn(f"{len(self.unbatched)} packed run(s) call their loss on their own "
                          f"rows, once per step each ({why})", PackedLossWarning, stacklevel=2)

    def _build(self) -> None:
        by_key: dict[tuple[Any, ...], list[int]] = {}
        self.unbatched = {}
        self._single = len(self.losses) == 1  # a run alone: its own loss, called as it is
        if self._single:
            self.groups, self._whole = [], False
            return
        for m, loss in enumerate(self.losses):
            why = loss_vmap_problem(loss)
            if why is not None:
                self.unbatched[m] = why
            else:
                by_key.setdefault(_key(loss, m), []).append(m)
        self.groups = [_Group(ix, [self.losses[m] for m in ix], self.device)
                       for ix in by_key.values()]
        order = [m for g in self.groups for m in g.index] + sorted(self.unbatched)
        self._whole = order == list(range(len(self.losses))) and not self.unbatched \
            and len(self.groups) == 1
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
        self._inverse = inverse.to(self.device)

    def refresh(self) -> None:
        """Re-read every lane's state after a hook changed it (regrouping when the lanes'
        buffers no longer share names and shapes, e.g. a buffer set by a first validation)."""
        if self._single:
            return
        keys = {m: _key(ls, m) for m, ls in enumerate(self.losses) if m not in self.unbatched}
        grouped = {m: _key(g.losses[0], g.index[0]) for g in self.groups for m in g.index}
        if keys != grouped:
            self._build()
            return
        for g in self.groups:
            g.refresh()

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self._single:
            return self.losses[0](logits[0], labels[0]).reshape(1)
        if self._whole:  # one configuration for every lane, in order
            return self.groups[0](logits, labels)
        parts = [g(logits.index_select(0, g.idx), labels.index_select(0, g.idx))
                 for g in self.groups]
        parts += [self.losses[m](logits[m], labels[m]).reshape(())
                  for m in sorted(self.unbatched)]
        return torch.cat([p.reshape(-1) for p in parts]).index_select(0, self._inverse)

    def reductions(self) -> list[str]:
        """Each lane's reduction (``"mean"`` unless the loss says otherwise)."""
        return [str(getattr(ls, "reduction", "mean")) for ls in self.losses]

    def __len__(self) -> int:
        return 1 if self._single else len(self.groups) + len(self.unbatched)
