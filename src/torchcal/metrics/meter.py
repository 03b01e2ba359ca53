"""Streaming accumulator of every calibration and scoring metric, synced under DDP."""

from __future__ import annotations

from typing import Any

import torch

from .._validation import as_tensor, check_positive_int
from ._common import (
    binned_sums,
    calibration_from_sums,
    check_unit_interval,
    classwise_sums,
    prepare,
    top1,
)
from .binning import equal_mass_bin_index, equal_width_bin_index
from .distributed import all_gather_uneven, world_size
from .layout import IGNORE_INDEX, check_ignore_index, flatten_inputs
from .scoring import (
    brier_per_sample,
    confident_mask,
    nll_per_sample,
    ranking_scores,
    topk_hits,
)

__all__ = ["CalibrationMeter"]

# Layout of the scalar part of the state.
_N, _NLL, _BRIER, _CORRECT, _TOPK, _S99_N, _S99_CORRECT = range(7)
_N_SCALARS = 7


class CalibrationMeter:
    """Accumulate predictions batch by batch and compute every metric at the end.

    ``update(logits=... or probs=..., labels=...)`` per batch, ``compute()`` returns a dict of
    0-d float64 tensors keyed ``"ece"``, ``"adaptive_ece"``, ``"classwise_ece"``, ``"mce"``,
    ``"rmsce"``, ``"nll"``, ``"brier"``, ``"error"``, ``"topk_error"``, ``"s99_share"``,
    ``"s99_accuracy"`` with the same definitions and bin conventions as the functions of
    :mod:`torchcal.metrics` over all the data seen (equal up to float64 rounding).

    State: per equal-width bin the count, confidence sum and correct count (3 x B); per (class,
    bin) the sum of ``p_ik - [y_i = k]`` (C x B, for Classwise-ECE); seven running sums (count,
    NLL, Brier, correct, top-k hits, and the count and correct count with confidence >=
    ``threshold``) - all float64, fixed size whatever the number of samples.  The one
    exception is AdaECE: its equal-mass edges depend on all the confidences, so with
    ``adaptive=True`` the meter keeps every top-1 confidence and correctness, **O(N) memory**
    (16 bytes per sample); ``adaptive=False`` drops them and reports ``adaptive_ece`` as NaN.

    Distributed: if ``torch.distributed`` is initialised with more than one process (and
    ``sync_dist``), ``compute()`` all-reduces the fixed-size state and all-gathers the
    variable-length confidences (any number per rank, zero included), so every rank gets the
    numbers one process would get over all the data.  Every rank must call ``compute()``.
    With the NCCL backend pass ``device=`` (the rank's CUDA device) so that a rank that saw
    no batch still holds its state on the right device.

    Args:
        num_classes: C, the number of classes.
        n_bins: number of bins B for every binned metric.
        adaptive: keep the confidences for AdaECE (O(N) state).
        topk: k of ``topk_error``; when k > C the key holds NaN.
        threshold: confidence threshold of the S99 statistics.
        device: device of the state (default: the device of the first batch, else CPU).
        sync_dist: all-reduce / all-gather under ``torch.distributed`` in ``compute()``.
        process_group: the process group to sync over (default: the world).
        ignore_index: label of the entries :meth:`update` leaves out (``None``: keep all).

    Example:
        >>> meter = CalibrationMeter(num_classes=3, n_bins=2)
        >>> meter.update(probs=torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05]]),
        ...              labels=torch.tensor([1, 0]))
        >>> meter.update(probs=torch.tensor([[0.3, 0.3, 0.4], [0.1, 0.8, 0.1]]),
        ...              labels=torch.tensor([0, 2]))
        >>> out = meter.compute()
        >>> out["ece"], out["error"]
        (tensor(0.2000, dtype=torch.float64), tensor(0.5000, dtype=torch.float64))
    """

    def __init__(
        self,
        num_classes: int,
        n_bins: int = 15,
        adaptive: bool = True,
        topk: int = 5,
        *,
        threshold: float = 0.99,
        device: torch.device | str | None = None,
        sync_dist: bool = True,
        process_group: Any = None,
        ignore_index: int | None = IGNORE_INDEX,
    ) -> None:
        self.num_classes = check_positive_int(num_classes, "num_classes")
        if self.num_classes < 2:
            raise ValueError(f"Expected `num_classes` to be at least 2, got {num_classes!r}")
        self.n_bins = check_positive_int(n_bins, "n_bins")
        self.adaptive = bool(adaptive)
        self.topk = check_positive_int(topk, "topk")
        self.threshold = check_unit_interval(threshold, "threshold")
        self.device = torch.device(device) if device is not None else None
        self.sync_dist = bool(sync_dist)
        self.process_group = process_group
        self.ignore_index = check_ignore_index(ignore_index)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every sample seen."""
        self._state: torch.Tensor | None = None
        self._conf: list[torch.Tensor] = []
        self._correct: list[torch.Tensor] = []

    def _state_size(self) -> int:
        return 3 * self.n_bins + self.num_classes * self.n_bins + _N_SCALARS

    @property
    def state_size(self) -> int:
        """The number of float64 entries of the fixed-size state: ``(3 + C) B + 7``."""
        return self._state_size()

    @property
    def state(self) -> torch.Tensor | None:
        """The fixed-size float64 state (None before the first batch): per-bin sums, per
        (class, bin) sums and the running sums, all additive, so that the state of several
        meters (ranks, shards) is their sum.  With ``adaptive=False`` it is everything the meter
        holds; a framework that syncs metric states by summing (torchmetrics) can own it.
        Setting it replaces the state (a float64 tensor of :attr:`state_size` entries, used
        as is: :meth:`update` adds to it in place)."""
        return self._state

    @state.setter
    def state(self, value: torch.Tensor) -> None:
        if (not isinstance(value, torch.Tensor) or value.dtype != torch.float64
                or tuple(value.shape) != (self.state_size,)):
            got = (f"{value.dtype} of shape {tuple(value.shape)}"
                   if isinstance(value, torch.Tensor) else type(value).__name__)
            raise ValueError(f"Expected `state` to be a float64 tensor of shape "
                             f"({self.state_size},), got {got}")
        self._state = value

    def _ensure_state(self, device: torch.device) -> torch.Tensor:
        if self._state is None:
            dev = self.device if self.device is not None else device
            self._state = torch.zeros(self._state_size(), dtype=torch.float64, device=dev)
        return self._state

    def _split(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, c = self.n_bins, self.num_classes
        return state[: 3 * b].view(3, b), state[3 * b : 3 * b + c * b], state[3 * b + c * b :]

    @property
    def num_samples(self) -> int:
        """Samples seen by this process (not synced)."""
        return 0 if self._state is None else int(self._split(self._state)[2][_N])

    # ----------------------------------------------------------------- update
    @torch.no_grad()
    def update(
        self, *, logits: Any = None, probs: Any = None, labels: Any, validate_args: bool = True
    ) -> None:
        """Add a batch: exactly one of ``logits`` / ``probs`` (N, C) and ``labels`` (N,), or
        (N, C, d1, ...) predictions with (N, d1, ...) labels, flattened by
        :func:`~torchcal.metrics.flatten_valid` (entries labelled ``ignore_index`` left out)."""
        n_in = as_tensor(labels, "labels").numel()
        logits, probs, labels = flatten_inputs(logits, probs, labels, self.ignore_index,
                                               all_ignored_ok=True)
        if n_in and as_tensor(labels, "labels").numel() == 0:
            return  # every entry of the batch is ignore_index (padding): nothing to add
        p, y = prepare(logits, probs, labels, validate_args=validate_args)
        if p.shape[1] != self.num_classes:
            name = "logits" if logits is not None else "probs"
            raise ValueError(
                f"Expected `{name}` to have num_classes={self.num_classes} columns, "
                f"got {p.shape[1]}"
            )
        state = self._ensure_state(p.device)
        if p.device != state.device:
            p, y = p.to(state.device), y.to(state.device)
        bins, cw, scalars = self._split(state)
        conf, correct = top1(p, y)
        idx = equal_width_bin_index(conf, self.n_bins)
        bins += binned_sums(idx, conf, correct, self.n_bins)
        cw += classwise_sums(p, y, self.n_bins)
        confident = confident_mask(conf, self.threshold)
        hits = (
            topk_hits(ranking_scores(logits, p), y, self.topk)
            if self.topk <= self.num_classes
            else torch.zeros_like(correct)
        )
        logits_dev = None if logits is None else torch.as_tensor(logits).to(p.device)
        scalars += torch.stack([
            torch.tensor(float(p.shape[0]), dtype=torch.float64, device=p.device),
            nll_per_sample(logits_dev, p, y).sum(),
            brier_per_sample(p, y).sum(),
            correct.sum().to(torch.float64),
            hits.sum().to(torch.float64),
            confident.sum().to(torch.float64),
            (confident & correct).sum().to(torch.float64),
        ])
        if self.adaptive:
            self._conf.append(conf.to(torch.float64))
            self._correct.append(correct)

    # ---------------------------------------------------------------- compute
    def _world(self) -> int:
        return world_size(self.process_group) if self.sync_dist else 1

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        """All-gather a (2, n_rank) float64 tensor whose length differs by rank."""
        return all_gather_uneven(local.T.contiguous(), self.process_group).T

    @torch.no_grad()
    def compute(self) -> dict[str, torch.Tensor]:
        """Every metric over all the data seen (by all ranks under DDP)."""
        dev = self.device if self.device is not None else torch.device("cpu")
        state = self._ensure_state(dev).clone()
        if self.adaptive and self._conf:
            local = torch.stack([torch.cat(self._conf), torch.cat(self._correct).to(torch.float64)])
        else:
            local = torch.zeros(2, 0, dtype=torch.float64, device=state.device)
        if self._world() > 1:
            torch.distributed.all_reduce(state, group=self.process_group)
            if self.adaptive:
                local = self._gather(local)
        bins, cw, scalars = self._split(state)
        n = scalars[_N]
        if not bool(n > 0):
            raise ValueError("Expected at least one sample before `compute()`, got none")
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=state.device)
        if self.adaptive:
            conf, correct = local[0], local[1].bool()
            idx, _ = equal_mass_bin_index(conf, self.n_bins)
            ada = calibration_from_sums(binned_sums(idx, conf, correct, self.n_bins), "l1")
        else:
            ada = nan
        topk_error = 1.0 - scalars[_TOPK] / n if self.topk <= self.num_classes else nan
        return {
            "ece": calibration_from_sums(bins, "l1"),
            "adaptive_ece": ada,
            "classwise_ece": cw.abs().sum() / (n * self.num_classes),
            "mce": calibration_from_sums(bins, "max"),
            "rmsce": calibration_from_sums(bins, "l2"),
            "nll": scalars[_NLL] / n,
            "brier": scalars[_BRIER] / n,
            "error": 1.0 - scalars[_CORRECT] / n,
            "topk_error": topk_error,
            "s99_share": scalars[_S99_N] / n,
            "s99_accuracy": scalars[_S99_CORRECT] / scalars[_S99_N],
        }
