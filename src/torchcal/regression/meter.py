"""Streaming accumulator of the regression metrics, fixed-size state, synced under DDP."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._validation import check_alpha, check_positive_int
from ..metrics.distributed import world_size
from ._scores import (
    PREDICTION_KINDS,
    area_between,
    calibration_grid,
    calibration_hits,
    check_std_range,
    crps_elements,
    ence_from_sums,
    interval_bounds,
    interval_elements,
    kind_of,
    pinball_elements,
    std_bin_sums,
    uce_from_sums,
    width_bin_index,
)
from .predictive import Quantiles, kept_rows

__all__ = ["RegressionMeter", "REGRESSION_METER_KEYS"]

#: Every key :meth:`RegressionMeter.compute` can return, in its order.
REGRESSION_METER_KEYS = ("nll", "crps", "mae", "rmse", "pinball", "sharpness", "picp", "mpiw",
                         "interval_score", "ence", "uce", "qce", "qce_quantile",
                         "miscalibration_area")

_SCALARS = ("n", "nll", "crps", "abs", "sq", "var", "covered", "width", "score", "pinball")
_KEYS_OF = {
    "point": ("crps", "mae", "rmse"),
    "gaussian": ("nll", "crps", "mae", "rmse", "sharpness", "picp", "mpiw", "interval_score",
                 "ence", "uce", "qce", "qce_quantile", "miscalibration_area"),
    "samples": ("crps", "mae", "rmse", "sharpness", "picp", "mpiw", "interval_score", "ence",
                "uce", "qce", "qce_quantile", "miscalibration_area"),
    "quantiles": ("crps", "pinball", "picp", "mpiw", "interval_score", "qce", "qce_quantile",
                  "miscalibration_area"),
}
_LOG_2PI = math.log(2 * math.pi)


class RegressionMeter:
    """Accumulate regression predictions batch by batch; compute the metrics at the end.

    ``update(pred, target, mask=..., ignore_value=...)`` per batch (any layout
    :func:`~torchcal.regression.predictive.kept_rows` takes: (N,), (N, d1, ...), (N, T));
    ``compute()`` returns a dict of 0-d float64 tensors, equal (up to float64 summation order)
    to the functions of :mod:`torchcal.regression.metrics` over all the kept elements seen:

    * ``"nll"`` (:func:`~torchcal.regression.gaussian_nll`, Gaussian only),
      ``"crps"`` (:func:`~torchcal.regression.crps`), ``"mae"`` / ``"rmse"`` of the
      mean (or the point prediction), ``"pinball"`` (quantiles),
      ``"sharpness"`` (:func:`~torchcal.regression.sharpness`);
    * ``"picp"`` / ``"mpiw"`` / ``"interval_score"`` of the central ``1 - alpha`` interval
      (for quantiles only when ``alpha/2`` and ``1 - alpha/2`` are levels);
    * ``"ence"`` / ``"uce"`` (Gaussian, or moment-matched samples) with **fixed** bins:
      ``n_bins`` equal-width bins of ``log std`` over ``std_range`` (stds outside the range
      fall in the end bins), i.e. :func:`~torchcal.regression.ence` and
      :func:`~torchcal.regression.uce` with ``std_range=``; the functions' default
      data-dependent bins (equal-mass, or equal-width over the observed variance range) would
      need every prediction, which a fixed-size state cannot keep;
    * ``"qce"`` (interval), ``"qce_quantile"`` and ``"miscalibration_area"`` (interval) of
      :func:`~torchcal.regression.quantile_calibration_error` on a fixed grid of
      expected proportions (``levels``), counted per level.

    State (float64, fixed size: 10 running sums, 3 x ``n_bins`` bin sums and one count per
    grid level, whatever the number of samples) is additive, so under ``torch.distributed``
    (initialised with more than one process, and ``sync_dist``) :meth:`compute` all-reduces
    it and every rank gets the numbers of all the data.  Every rank must call
    :meth:`compute`; with NCCL pass ``device=``.

    Args:
        kind: the prediction kind, ``"gaussian"``, ``"samples"``, ``"quantiles"`` or
            ``"point"`` (fixes the state's layout before any batch).
        levels: the calibration grid: expected proportions in [0, 1] (default
            uncertainty-toolbox's ``linspace(0, 1, 100)``); for ``kind="quantiles"``, the
            predicted levels (required; every batch must have them).
        alpha: the miscoverage of the interval metrics.
        n_bins: bins of ENCE / UCE.
        std_range: ``(lo, hi)``, the std range of the log-spaced ENCE / UCE bins.
        device: device of the state (default: that of the first batch, else CPU).
        sync_dist: all-reduce under ``torch.distributed`` in :meth:`compute`.
        process_group: the process group to sync over (default: the world).

    Example:
        >>> from torchcal.regression import Gaussian
        >>> meter = RegressionMeter("gaussian", alpha=0.5)
        >>> meter.update(Gaussian([0.0, 1.0], [1.0, 1.0]), [0.5, 3.0])
        >>> meter.update(Gaussian([2.0], [4.0]), [2.0])
        >>> out = meter.compute()
        >>> float(out["mae"]), float(out["picp"])
        (0.8333333333333334, 0.6666666666666666)
    """

    def __init__(self, kind: str = "gaussian", *, levels: Any = None, alpha: float = 0.1,
                 n_bins: int = 10, std_range: Any = (1e-3, 1e3),
                 device: torch.device | str | None = None, sync_dist: bool = True,
                 process_group: Any = None) -> None:
        if kind not in PREDICTION_KINDS:
            raise ValueError(f"Expected `kind` to be one of {PREDICTION_KINDS}, got {kind!r}")
        self.kind = kind
        self.alpha = check_alpha(alpha)
        self.n_bins = check_positive_int(n_bins, "n_bins")
        self.std_range = check_std_range(std_range)
        self.levels = levels
        self.device = torch.device(device) if device is not None else None
        self.sync_dist = bool(sync_dist)
        self.process_group = process_group
        self._grids()
        self.reset()

    def _grids(self) -> None:
        """The fixed expected-proportion grids (interval, quantile) and the interval levels."""
        self._pred_levels = None
        self._has_interval = self.kind != "point"
        if self.kind == "quantiles":
            if self.levels is None:
                raise ValueError("Expected `levels` (the predicted quantile levels) for "
                                 "kind='quantiles', got None")
            ref = Quantiles(torch.zeros(1, len(self.levels), dtype=torch.float64), self.levels)
            self._pred_levels = ref.levels
            self._grid_q = calibration_grid(ref, None, "quantile")
            try:
                self._grid_i = calibration_grid(ref, None, "interval")
            except ValueError:
                self._grid_i = torch.zeros(0, dtype=torch.float64)
            lv = ref.levels
            self._has_interval = all(bool(((lv - t).abs() <= 1e-9).any())
                                     for t in (self.alpha / 2, 1 - self.alpha / 2))
        elif self.kind == "point":
            self._grid_i = self._grid_q = torch.zeros(0, dtype=torch.float64)
        else:
            self._grid_i = self._grid_q = calibration_grid(None, self.levels, "interval")

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys :meth:`compute` returns for this meter's kind (and levels)."""
        keys = _KEYS_OF[self.kind]
        if not self._has_interval:
            keys = tuple(k for k in keys if k not in ("picp", "mpiw", "interval_score"))
        if self._grid_i.numel() == 0:
            keys = tuple(k for k in keys if k not in ("qce", "miscalibration_area"))
        return keys

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every sample seen."""
        self._state: torch.Tensor | None = None

    @property
    def state_size(self) -> int:
        """The number of float64 entries of the state."""
        return len(_SCALARS) + 3 * self.n_bins + self._grid_i.numel() + self._grid_q.numel()

    @property
    def state(self) -> torch.Tensor | None:
        """The additive float64 state (None before the first batch)."""
        return self._state

    def _ensure_state(self, device: torch.device) -> torch.Tensor:
        if self._state is None:
            dev = self.device if self.device is not None else device
            self._state = torch.zeros(self.state_size, dtype=torch.float64, device=dev)
        return self._state

    def _split(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Views: scalars (10,), bins (3, B), interval hits, quantile hits."""
        s, b, li = len(_SCALARS), 3 * self.n_bins, self._grid_i.numel()
        return (state[:s], state[s:s + b].view(3, self.n_bins), state[s + b:s + b + li],
                state[s + b + li:])

    @property
    def num_samples(self) -> int:
        """Kept target elements seen by this process (not synced)."""
        return 0 if self._state is None else int(self._state[0])

    # ----------------------------------------------------------------- update
    @torch.no_grad()
    def update(self, pred: Any, target: Any, *, mask: Any = None,
               ignore_value: Any = None) -> None:
        """Add a batch: ``pred`` of this meter's kind for ``target``, with missing targets
        dropped by ``mask`` / ``ignore_value`` (a batch with every target missing adds
        nothing)."""
        if kind_of(pred) != self.kind:
            raise TypeError(f"Expected `pred` of kind {self.kind!r} for this meter, got "
                            f"{type(pred).__name__}")
        if self._pred_levels is not None and (
                pred.levels.numel() != self._pred_levels.numel()
                or not torch.allclose(pred.levels.double().cpu(), self._pred_levels, atol=1e-9)):
            raise ValueError(f"Expected the meter's levels {self._pred_levels.tolist()}, got "
                             f"{pred.levels.tolist()}")
        try:
            rows, y, _ = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
        except ValueError as err:
            if "drop every element" in str(err):
                return
            raise
        y = y.double()
        state = self._ensure_state(y.device)
        y = y.to(state.device)
        scalars, bins, hits_i, hits_q = self._split(state)
        scalars += self._scalar_sums(rows, y)
        if self.kind in ("gaussian", "samples"):
            g = rows if self.kind == "gaussian" else rows.to_gaussian()
            var = g.var.double().to(state.device)
            lo, hi = (math.log(v) for v in self.std_range)
            idx = width_bin_index(0.5 * var.clamp_min(1e-300).log(), lo, hi, self.n_bins)
            bins += std_bin_sums(idx, var, (y - g.mean.double().to(state.device)) ** 2,
                                 self.n_bins)
        if hits_i.numel():
            hits_i += calibration_hits(rows, y, self._grid_i.to(state.device), "interval")
        if hits_q.numel():
            hits_q += calibration_hits(rows, y, self._grid_q.to(state.device), "quantile")

    def _scalar_sums(self, rows: Any, y: torch.Tensor) -> torch.Tensor:
        """The batch's running sums in :data:`_SCALARS` order."""
        out = torch.zeros(len(_SCALARS), dtype=torch.float64, device=y.device)
        put = {name: i for i, name in enumerate(_SCALARS)}
        out[put["n"]] = y.numel()
        out[put["crps"]] = crps_elements(rows, y).sum().to(y.device)
        if self.kind == "quantiles":
            out[put["pinball"]] = pinball_elements(rows, y).mean(1).sum().to(y.device)
        else:
            center = rows if self.kind == "point" else rows.mean
            err = y - center.double().to(y.device)
            out[put["abs"]], out[put["sq"]] = err.abs().sum(), err.square().sum()
        if self.kind in ("gaussian", "samples"):
            var = rows.var.double().to(y.device)
            out[put["var"]] = var.sum()
            if self.kind == "gaussian":
                if bool((var <= 0).any()):
                    raise ValueError(f"Expected `var` > 0 for the meter's NLL and ENCE, found "
                                     f"{int((var <= 0).sum())} zero variance(s)")
                out[put["nll"]] = (0.5 * (var.log() + err.square() / var)).sum()
        if self._has_interval:
            lo, hi = interval_bounds(rows, self.alpha)
            parts = interval_elements(lo.to(y.device), hi.to(y.device), y, self.alpha)
            out[put["covered"]] = parts["covered"].sum()
            out[put["width"]] = parts["width"].sum()
            out[put["score"]] = parts["score"].sum()
        return out

    # ---------------------------------------------------------------- compute
    @torch.no_grad()
    def compute(self) -> dict[str, torch.Tensor]:
        """Every metric of :attr:`keys` over all the data seen (by all ranks under DDP)."""
        dev = self.device if self.device is not None else torch.device("cpu")
        state = self._ensure_state(dev).clone()
        if self.sync_dist and world_size(self.process_group) > 1:
            torch.distributed.all_reduce(state, group=self.process_group)
        scalars, bins, hits_i, hits_q = self._split(state)
        s = dict(zip(_SCALARS, scalars, strict=True))
        n = s["n"]
        if not bool(n > 0):
            raise ValueError("Expected at least one observed target before compute(), got none")
        gi, gq = self._grid_i.to(state.device), self._grid_q.to(state.device)
        obs_i, obs_q = hits_i / n, hits_q / n
        values = {
            "nll": lambda: s["nll"] / n + 0.5 * _LOG_2PI, "crps": lambda: s["crps"] / n,
            "mae": lambda: s["abs"] / n, "rmse": lambda: (s["sq"] / n).sqrt(),
            "pinball": lambda: s["pinball"] / n, "sharpness": lambda: (s["var"] / n).sqrt(),
            "picp": lambda: s["covered"] / n, "mpiw": lambda: s["width"] / n,
            "interval_score": lambda: s["score"] / n,
            "ence": lambda: ence_from_sums(bins), "uce": lambda: uce_from_sums(bins),
            "qce": lambda: (obs_i - gi).abs().mean(),
            "qce_quantile": lambda: (obs_q - gq).abs().mean(),
            "miscalibration_area": lambda: area_between(gi, obs_i),
        }
        return {k: values[k]() for k in self.keys}
