"""The state the end of a stack's epochs keeps: built once per stack, updated without a
per-lane copy on the training thread.

* :func:`mean_rows`: which lanes' losses are means, on the device, built once per pack (it
  was a ``torch.tensor`` of a Python list, a synchronising copy, at every epoch).
* :class:`StateRows`: a pack's stacked tensors (parameters, buffers, SGD momentum) found by
  their storage, so that a lane's state dict names its tensors as *rows* of them
  (:class:`Row`).  :meth:`StateRows.capture` turns a lane's state into that form (a tensor
  that is no row, such as a loss' state, is cloned); :meth:`StateRows.host` copies the stacked
  tensors to the host, one copy per stacked tensor whatever the lanes; the writer thread
  (:class:`~torchcal.train.pack_commit.EpochWriter`) resolves the rows from that copy
  (:func:`resolve`).
* :class:`DeviceBest`: every lane's best-epoch weights as stacked tensors on the device, and
  the best value of each lane; a lane improves where its validation metric is finite and
  below its best, and the stacks take the improved lanes' rows with one ``torch.where``
  per stacked tensor.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .loss_groups import LossGroups
from .stacks import Stack

__all__ = ["mean_rows", "Row", "StateRows", "DeviceBest", "resolve"]


def mean_rows(groups: LossGroups) -> torch.Tensor:
    """(M,) bool on the device: the lanes whose loss reduces by its mean
    (:attr:`LossGroups.mean_rows <torchcal.train.loss_groups.LossGroups>`, built once with
    ``groups``: the reductions never change)."""
    return groups.mean_rows


class Row:
    """Row ``m`` of stacked tensor ``key``, from the host copy ``src`` (``"cur"``: this epoch's
    weights, ``"best"``: the best-epoch stacks)."""

    __slots__ = ("key", "m", "src")

    def __init__(self, key: str, m: int, src: str = "cur") -> None:
        self.key, self.m, self.src = key, m, src


class StateRows:
    """The stacked tensors of ``stack`` (its :meth:`~torchcal.train.stacks.Stack.stacked_state`:
    none for a :class:`~torchcal.train.stacks.SoloModel`) by storage."""

    def __init__(self, stack: Stack) -> None:
        self.stacks: dict[str, torch.Tensor] = dict(stack.stacked_state())
        self._by_storage = {v.untyped_storage().data_ptr(): k for k, v in self.stacks.items()}

    def model_keys(self) -> list[str]:
        """The keys of the model's stacks (parameters and buffers: what ``best.pt`` holds)."""
        return [k for k in self.stacks if k[:2] in ("p.", "b.")]

    def row(self, t: torch.Tensor) -> Row | None:
        """``t`` as a row of a stacked tensor (None: it is none)."""
        key = self._by_storage.get(t.untyped_storage().data_ptr())
        if key is None:
            return None
        s = self.stacks[key]
        step, off = s.stride(0), t.storage_offset() - s.storage_offset()
        if (t.dtype != s.dtype or tuple(t.shape) != tuple(s.shape[1:])
                or t.stride() != s.stride()[1:] or step <= 0 or off % step):
            return None
        m = off // step
        return Row(key, m) if 0 <= m < s.shape[0] else None

    def capture(self, obj: Any) -> Any:
        """``obj`` (a state dict's nesting of dicts and lists) with every tensor that is a row
        of a stack replaced by its :class:`Row` and every other tensor cloned (dicts, their
        types kept, and lists copied)."""
        if isinstance(obj, torch.Tensor):
            row = self.row(obj) if self._by_storage else None
            if row is not None:
                return row
            return (obj.detach() if obj.requires_grad else obj).clone()
        if isinstance(obj, dict):
            c = {k: self.capture(v) for k, v in obj.items()}
            return c if type(obj) is dict else type(obj)(c)  # keep Counter/OrderedDict
        if isinstance(obj, list):
            return [self.capture(x) if isinstance(x, (torch.Tensor, dict, list)) else x
                    for x in obj]
        return obj

    @torch.no_grad()
    def host(self, tensors: dict[str, torch.Tensor], keys: set[str]) -> dict[str, torch.Tensor]:
        """The host copy of ``tensors``' entries ``keys``: one copy each (from a GPU without
        waiting: the writer synchronises on the epoch's event first)."""
        return {k: tensors[k].to("cpu", copy=True, non_blocking=tensors[k].is_cuda)
                for k in keys}


def resolve(obj: Any, host: dict[str, dict[str, torch.Tensor]]) -> Any:
    """``obj`` with every :class:`Row` replaced by its own tensor, cloned from the host copy
    (a view would save the whole stack); run by the writer."""
    if isinstance(obj, Row):
        return host[obj.src][obj.key][obj.m].clone()
    if isinstance(obj, dict):
        c = {k: resolve(v, host) for k, v in obj.items()}
        return c if type(obj) is dict else type(obj)(c)
    if isinstance(obj, list):
        return [resolve(x, host) for x in obj]
    return obj


def rows_of(obj: Any) -> list[Row]:
    """Every :class:`Row` in ``obj``."""
    if isinstance(obj, Row):
        return [obj]
    if isinstance(obj, dict):
        return [r for v in obj.values() for r in rows_of(v)]
    if isinstance(obj, list):
        return [r for v in obj for r in rows_of(v)]
    return []


class DeviceBest:
    """The lanes' best validation values (M,) float64 on the device and, for a pack, their
    best-epoch weights as stacked tensors (built at the first improvement)."""

    def __init__(self, rows: StateRows, best: list[dict[str, Any]], device: torch.device) -> None:
        self.rows = rows
        self.value = torch.tensor([float(b.get("value", math.inf)) for b in best],
                                  dtype=torch.float64, device=device)
        self.stacks: dict[str, torch.Tensor] | None = None

    def improved(self, v: torch.Tensor) -> torch.Tensor:
        """(M,) bool: the lanes whose metric ``v`` (M,) float64 is finite and below their
        best (by the validation ``select_best_by`` metric)."""
        return torch.isfinite(v) & (v < self.value)

    @torch.no_grad()
    def update(self, improved: torch.Tensor, v: torch.Tensor) -> None:
        """The improved lanes' values and weights (one ``where`` per stacked tensor)."""
        self.value = torch.where(improved, v, self.value)
        keys = self.rows.model_keys()
        if not keys:
            return
        if self.stacks is None:  # rows of lanes that never improved are never read
            self.stacks = {k: self.rows.stacks[k].detach().clone() for k in keys}
            return
        views: dict[int, torch.Tensor] = {}
        for k in keys:
            cur = self.rows.stacks[k]
            mask = views.get(cur.ndim)
            if mask is None:
                mask = views[cur.ndim] = improved.view(-1, *([1] * (cur.ndim - 1)))
            self.stacks[k] = torch.where(mask, cur, self.stacks[k])
