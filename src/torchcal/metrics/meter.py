"""Streaming accumulator of every calibration and scoring metric, synced under DDP."""

from __future__ import annotations

from typing import Any

import torch

from .._validation import as_tensor, check_positive_int
from ._common import check_unit_interval, prepare, top1
from .binning import (
    binned_sums,
    calibration_from_sums,
    classwise_sums,
    equal_mass_bin_index,
    equal_width_bin_index,
)
from .distributed import all_gather_uneven, world_size
from .layout import IGNORE_INDEX, check_ignore_index, flatten_inputs
from .scoring import (
    brier_per_sample,
    confident_mask,
    nll_per_sample,
    ranking_scores,
    topk_hits,
)
from .tasks import (
    binary_inputs,
    check_task,
    label_binned_sums,
    multilabel_inputs,
    warn_two_columns,
)

__all__ = ["CalibrationMeter", "METER_KEYS"]

#: Every key :meth:`CalibrationMeter.compute` can return, in its order.
METER_KEYS = ("ece", "adaptive_ece", "classwise_ece", "mce", "rmsce", "nll", "brier", "error",
              "topk_error", "s99_share", "s99_accuracy")

# The running sums of the scalar part of the state, in the order they are stored, and which
# of them each metric needs (the count "n" is always kept).
_SCALARS = ("n", "nll", "brier", "correct", "topk", "s99_n", "s99_correct")
_SCALAR_NEEDS = {"nll": ("nll",), "brier": ("brier",), "error": ("correct",),
                 "topk_error": ("topk",), "s99_share": ("s99_n",),
                 "s99_accuracy": ("s99_n", "s99_correct")}
_BIN_KEYS = ("ece", "mce", "rmsce")


def _check_metrics(metrics: Any) -> tuple[str, ...]:
    """``metrics`` checked: None (every key) or a non-empty collection of :data:`METER_KEYS`."""
    if metrics is None:
        return METER_KEYS
    names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    bad = [m for m in names if m not in METER_KEYS]
    if bad or not names:
        raise ValueError(f"Expected `metrics` to be None or a non-empty collection of "
                         f"{METER_KEYS}, got {metrics!r}")
    return tuple(k for k in METER_KEYS if k in names)


class CalibrationMeter:
    """Accumulate predictions batch by batch and compute every metric at the end.

    ``update(logits=... or probs=..., labels=...)`` per batch, ``compute()`` returns a dict of
    0-d float64 tensors keyed ``"ece"``, ``"adaptive_ece"``, ``"classwise_ece"``, ``"mce"``,
    ``"rmsce"``, ``"nll"``, ``"brier"``, ``"error"``, ``"topk_error"``, ``"s99_share"``,
    ``"s99_accuracy"`` (:data:`METER_KEYS`; only those of ``metrics`` when given) with the
    same definitions and bin conventions as the functions of :mod:`torchcal.metrics` over all
    the data seen (equal up to float64 rounding).

    State: per equal-width bin the count, confidence sum and correct count (3 x B); per (class,
    bin) the sum of ``p_ik - [y_i = k]`` (C x B, for Classwise-ECE); seven running sums (count,
    NLL, Brier, correct, top-k hits, and the count and correct count with confidence >=
    ``threshold``) - all float64, fixed size whatever the number of samples.  The one
    exception is AdaECE: its equal-mass edges depend on all the confidences, so with
    ``adaptive=True`` the meter keeps every top-1 confidence (float64) and correctness (bool),
    **O(N) memory, 9 bytes per sample**; ``adaptive=False`` drops them and reports
    ``adaptive_ece`` as NaN.

    ``metrics=`` keeps only the state those metrics need, and computes only that in
    :meth:`update`: ``("ece",)`` keeps the 3 B bin sums and the count, no classwise sums
    (the O(N C) part of an update), no confidences, no NLL.  ``ece`` / ``mce`` / ``rmsce``
    share the bin sums; ``classwise_ece`` needs the C B sums; ``adaptive_ece`` the
    confidences; each scoring metric its running sums.  The default (None) is every metric.

    Tasks (``task=``, :mod:`torchcal.metrics.tasks`): ``"multiclass"`` (default) as above;
    ``"binary"``: (N,) / (N, d1, ...) logits (sigmoid) or class-1 probabilities ``p`` with 0/1
    labels; the bins hold ``p`` against the positives (torchmetrics' ``BinaryCalibrationError``),
    ``classwise_ece`` is that of ``[1 - p, p]``, ``nll`` the binary cross-entropy, ``brier``
    the binary Brier score ``(p - y)^2`` (half the 2-class multiclass one), ``error`` that of
    ``p > 1/2``, the S99 confidence ``max(p, 1 - p)``, ``topk_error`` NaN; ``num_classes``
    may be omitted.  ``"multilabel"``: ``num_classes`` = L labels, (N, L, ...) inputs with 0/1
    labels (``ignore_index`` per entry); each label has its own bins and ``ece`` / ``mce`` /
    ``rmsce`` / ``adaptive_ece`` are the mean over labels of the binary metric
    (``classwise_ece`` equals ``ece``); the scoring metrics are means over every kept
    (sample, label) entry.

    Distributed: if ``torch.distributed`` is initialised with more than one process (and
    ``sync_dist``), ``compute()`` all-reduces the fixed-size state and all-gathers the
    variable-length confidences (any number per rank, zero included), so every rank gets the
    numbers one process would get over all the data.  Every rank must call ``compute()``.
    With the NCCL backend pass ``device=`` (the rank's CUDA device) so that a rank that saw
    no batch still holds its state on the right device.

    Args:
        num_classes: C, the number of classes (L, the number of labels, for
            ``task="multilabel"``; optional for ``"binary"``).
        n_bins: number of bins B for every binned metric.
        adaptive: keep the confidences for AdaECE (O(N) state).
        topk: k of ``topk_error``; when k > C the key holds NaN.
        threshold: confidence threshold of the S99 statistics.
        device: device of the state (default: the device of the first batch, else CPU).
        sync_dist: all-reduce / all-gather under ``torch.distributed`` in ``compute()``.
        process_group: the process group to sync over (default: the world).
        ignore_index: label of the entries :meth:`update` leaves out (``None``: keep all).
        task: ``"multiclass"``, ``"binary"`` or ``"multilabel"``.
        metrics: the keys to compute (None: all of :data:`METER_KEYS`).

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
        num_classes: int | None = None,
        n_bins: int = 15,
        adaptive: bool = True,
        topk: int = 5,
        *,
        threshold: float = 0.99,
        device: torch.device | str | None = None,
        sync_dist: bool = True,
        process_group: Any = None,
        ignore_index: int | None = IGNORE_INDEX,
        task: str = "multiclass",
        metrics: Any = None,
    ) -> None:
        self.task = check_task(task)
        self.num_classes = self._check_num_classes(num_classes)
        self.n_bins = check_positive_int(n_bins, "n_bins")
        self.adaptive = bool(adaptive)
        self.topk = check_positive_int(topk, "topk")
        self.threshold = check_unit_interval(threshold, "threshold")
        self.device = torch.device(device) if device is not None else None
        self.sync_dist = bool(sync_dist)
        self.process_group = process_group
        self.ignore_index = check_ignore_index(ignore_index)
        self.metrics = _check_metrics(metrics)
        if metrics is not None and "adaptive_ece" in self.metrics and not self.adaptive:
            raise ValueError("Expected adaptive=True with 'adaptive_ece' in `metrics` (AdaECE "
                             "needs every confidence)")
        self._layout()
        self.reset()

    def _check_num_classes(self, num_classes: Any) -> int:
        if self.task == "binary":
            if num_classes not in (None, 2):
                raise ValueError(f"Expected `num_classes` to be None or 2 for task='binary', "
                                 f"got {num_classes!r}")
            return 2
        if num_classes is None:
            raise ValueError(f"Expected `num_classes` (the number of "
                             f"{'labels' if self.task == 'multilabel' else 'classes'}) for "
                             f"task={self.task!r}, got None")
        n = check_positive_int(num_classes, "num_classes")
        if self.task == "multiclass" and n < 2:
            raise ValueError(f"Expected `num_classes` to be at least 2, got {num_classes!r}")
        return n

    def _layout(self) -> None:
        """Which parts of the state the requested metrics need, and their sizes."""
        want = set(self.metrics)
        self._groups = self.num_classes if self.task == "multilabel" else 1
        self._n_bin_sums = (3 * self._groups * self.n_bins
                            if want & set(_BIN_KEYS) or (self.task == "multilabel"
                                                         and "classwise_ece" in want) else 0)
        self._n_cw = (self.num_classes * self.n_bins
                      if "classwise_ece" in want and self.task != "multilabel" else 0)
        needed = {"n"}.union(*(_SCALAR_NEEDS.get(k, ()) for k in want))
        if self.task != "multiclass":
            needed.discard("topk")
        self._scalars = tuple(k for k in _SCALARS if k in needed)
        self._keep_conf = self.adaptive and "adaptive_ece" in want

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every sample seen."""
        self._state: torch.Tensor | None = None
        self._conf: list[torch.Tensor] = []
        self._correct: list[torch.Tensor] = []

    def _state_size(self) -> int:
        return self._n_bin_sums + self._n_cw + len(self._scalars)

    @property
    def state_size(self) -> int:
        """The number of float64 entries of the fixed-size state: ``(3 + C) B + 7`` with every
        metric (fewer with ``metrics=``; ``3 L B + ...`` for ``task="multilabel"``)."""
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
        """Views of the bin sums (3, B) or (3, L, B), the classwise sums and the scalars."""
        nb, ncw = self._n_bin_sums, self._n_cw
        bins = state[:nb].view(3, self._groups, self.n_bins) if nb else state[:0]
        if nb and self.task != "multilabel":
            bins = bins[:, 0]
        return bins, state[nb:nb + ncw], state[nb + ncw:]

    def _scalar(self, scalars: torch.Tensor, name: str) -> torch.Tensor:
        return scalars[self._scalars.index(name)]

    @property
    def num_samples(self) -> int:
        """Samples (multilabel: kept entries) seen by this process (not synced)."""
        return 0 if self._state is None else int(self._scalar(self._split(self._state)[2], "n"))

    # ----------------------------------------------------------------- update
    @torch.no_grad()
    def update(
        self, *, logits: Any = None, probs: Any = None, labels: Any, validate_args: bool = True
    ) -> None:
        """Add a batch: exactly one of ``logits`` / ``probs`` (N, C) and ``labels`` (N,), or
        (N, C, d1, ...) predictions with (N, d1, ...) labels, flattened by
        :func:`~torchcal.metrics.flatten_valid` (entries labelled ``ignore_index`` left out);
        the layouts of ``task="binary"`` / ``"multilabel"`` as in the class docstring."""
        if self.task != "multiclass":
            self._update_binary(logits, probs, labels, validate_args)
            return
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
        warn_two_columns(p.shape[1])
        state = self._ensure_state(p.device)
        if p.device != state.device:
            p, y = p.to(state.device), y.to(state.device)
        bins, cw, scalars = self._split(state)
        conf, correct = top1(p, y)
        if self._n_bin_sums:
            bins += binned_sums(equal_width_bin_index(conf, self.n_bins), conf, correct,
                                self.n_bins)
        if self._n_cw:
            cw += classwise_sums(p, y, self.n_bins)
        logits_dev = None if logits is None else torch.as_tensor(logits).to(p.device)
        parts = {
            "nll": lambda: nll_per_sample(logits_dev, p, y).sum(),
            "brier": lambda: brier_per_sample(p, y).sum(),
            "topk": lambda: (topk_hits(ranking_scores(logits, p), y, self.topk).sum()
                             if self.topk <= self.num_classes else correct.new_zeros(())),
        }
        self._add_scalars(scalars, p.shape[0], conf, correct, parts)
        if self._keep_conf:
            self._conf.append(conf.to(torch.float64))
            self._correct.append(correct)

    def _add_scalars(self, scalars: torch.Tensor, n: int, conf: torch.Tensor,
                     correct: torch.Tensor, parts: dict[str, Any]) -> None:
        """Add the running sums the requested metrics need (one stacked in-place add)."""
        confident = confident_mask(conf, self.threshold) if "s99_n" in self._scalars else None
        values = []
        for name in self._scalars:
            if name == "n":
                v = torch.tensor(float(n), dtype=torch.float64, device=scalars.device)
            elif name == "correct":
                v = correct.sum()
            elif name == "s99_n":
                v = confident.sum()
            elif name == "s99_correct":
                v = (confident & correct).sum()
            else:
                v = parts[name]()
            values.append(v.to(torch.float64))
        scalars += torch.stack(values)

    def _update_binary(self, logits: Any, probs: Any, labels: Any, validate_args: bool) -> None:
        """:meth:`update` of ``task="binary"`` and ``"multilabel"``."""
        if self.task == "binary":
            p, y, z = binary_inputs(logits, probs, labels, self.ignore_index, validate_args,
                                    all_ignored_ok=True)
            keep = None
        else:
            p, y, keep, z = multilabel_inputs(logits, probs, labels, self.ignore_index,
                                              validate_args, num_labels=self.num_classes,
                                              all_ignored_ok=True)
            if not bool(keep.any()):
                return
        if p.numel() == 0:
            return
        state = self._ensure_state(p.device)
        if p.device != state.device:
            p, y = p.to(state.device), y.to(state.device)
            z = None if z is None else z.to(state.device)
            keep = None if keep is None else keep.to(state.device)
        bins, cw, scalars = self._split(state)
        if self._n_bin_sums:
            bins += (binned_sums(equal_width_bin_index(p, self.n_bins), p, y, self.n_bins)
                     if keep is None else label_binned_sums(p, y, keep, self.n_bins))
        if self._n_cw:
            cw += classwise_sums(torch.stack([1 - p, p], dim=1), y.long(), self.n_bins)
        if self._keep_conf:
            self._conf.append(p.to(torch.float64) if keep is None
                              else p.to(torch.float64).masked_fill(~keep, float("nan")))
            self._correct.append(y)
        if keep is not None:
            p, y, z = p[keep], y[keep], (None if z is None else z[keep])
        pred = p.to(torch.float64) > 0.5
        conf = torch.maximum(p, 1 - p)
        parts = {
            "nll": lambda: _bce(z, p, y).sum(),
            "brier": lambda: (p.to(torch.float64) - y.to(torch.float64)).square().sum(),
        }
        self._add_scalars(scalars, p.shape[0], conf, pred == y, parts)

    # ---------------------------------------------------------------- compute
    def _world(self) -> int:
        return world_size(self.process_group) if self.sync_dist else 1

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        """All-gather an (R, n_rank) float64 tensor whose length differs by rank."""
        return all_gather_uneven(local.T.contiguous(), self.process_group).T

    def _local_confidences(self, device: torch.device) -> torch.Tensor:
        """The kept confidences and correctness as one float64 (2, n) tensor ((2 L, n) for
        multilabel: the probabilities, NaN where ignored, then the labels)."""
        rows = 2 * self._groups
        if not self._conf:
            return torch.zeros(rows, 0, dtype=torch.float64, device=device)
        conf = torch.cat(self._conf).reshape(-1, self._groups).T
        correct = torch.cat(self._correct).reshape(-1, self._groups).T.to(torch.float64)
        return torch.cat([conf, correct])

    def _adaptive(self, local: torch.Tensor) -> torch.Tensor:
        """AdaECE from the (2 G, n) confidences: one set of equal-mass bins per label."""
        values = []
        for j in range(self._groups):
            conf, correct = local[j], local[self._groups + j].bool()
            kept = ~torch.isnan(conf)
            conf, correct = conf[kept], correct[kept]
            if conf.numel():
                idx, _ = equal_mass_bin_index(conf, self.n_bins)
                values.append(calibration_from_sums(
                    binned_sums(idx, conf, correct, self.n_bins), "l1"))
        return torch.stack(values).mean()

    @torch.no_grad()
    def compute(self) -> dict[str, torch.Tensor]:
        """Every requested metric over all the data seen (by all ranks under DDP)."""
        dev = self.device if self.device is not None else torch.device("cpu")
        state = self._ensure_state(dev).clone()
        local = (self._local_confidences(state.device) if self._keep_conf else None)
        if self._world() > 1:
            torch.distributed.all_reduce(state, group=self.process_group)
            if local is not None:
                local = self._gather(local)
        bins, cw, scalars = self._split(state)
        n = self._scalar(scalars, "n")
        if not bool(n > 0):
            raise ValueError("Expected at least one sample before `compute()`, got none")
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=state.device)
        out = {}
        for key in self.metrics:
            out[key] = self._value(key, bins, cw, scalars, local, n, nan)
        return out

    def _value(self, key: str, bins: torch.Tensor, cw: torch.Tensor, scalars: torch.Tensor,
               local: torch.Tensor | None, n: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
        """One metric of :meth:`compute` from the (synced) state."""
        if key == "classwise_ece" and self.task == "multilabel":
            key = "ece"
        if key in _BIN_KEYS:
            norm = {"ece": "l1", "mce": "max", "rmsce": "l2"}[key]
            value = calibration_from_sums(bins, norm)
            if self.task == "multilabel":
                counts = bins[0].sum(dim=-1)
                value = value[counts > 0].mean()
            return value
        if key == "adaptive_ece":
            return self._adaptive(local) if local is not None else nan
        if key == "classwise_ece":
            return cw.abs().sum() / (n * self.num_classes)
        if key == "topk_error":
            return (1.0 - self._scalar(scalars, "topk") / n
                    if "topk" in self._scalars and self.topk <= self.num_classes else nan)
        if key == "s99_accuracy":
            return self._scalar(scalars, "s99_correct") / self._scalar(scalars, "s99_n")
        name = {"nll": "nll", "brier": "brier", "error": "correct", "s99_share": "s99_n"}[key]
        value = self._scalar(scalars, name) / n
        return 1.0 - value if key == "error" else value


def _bce(z: torch.Tensor | None, p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy per entry in float64: ``softplus(z) - y z`` from the logits (no
    log of a rounded probability), else ``-log p`` / ``-log(1 - p)``."""
    yf = y.to(torch.float64)
    if z is not None:
        z = z.to(torch.float64)
        return torch.nn.functional.softplus(z) - yf * z
    q = p.to(torch.float64)
    return -torch.where(y, q.log(), torch.log1p(-q))
