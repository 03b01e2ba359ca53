"""Top-label histogram binning (Zadrozny & Elkan 2001; Gupta & Ramdas 2022's top-label form)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._validation import check_positive_int
from ..metrics.binning import (
    bin_index,
    equal_mass_bin_index,
    equal_width_bin_index,
    equal_width_edges,
)
from ._checks import float_list
from ._fitting import weighted_equal_mass_edges
from ._layout import row_chunks, work_dtype
from ._toplabel import keep_top_label, log_proba
from .base import Calibrator

__all__ = ["HistogramBinning"]

_BINNINGS = ("equal_mass", "equal_width")


def _check_binning(binning: Any) -> str:
    if binning not in _BINNINGS:
        raise ValueError(f"Expected `binning` to be one of {_BINNINGS}, got {binning!r}")
    return binning


class HistogramBinning(Calibrator):
    """Top-label histogram binning: the top-1 confidence is replaced by its bin's accuracy.

    Fit: bin the validation top-1 confidences ``conf_i = max_c softmax(z_i)_c`` into
    ``n_bins`` bins (``"equal_mass"``, default, or ``"equal_width"``; the conventions of
    :mod:`torchcal.metrics.binning`; with ``sample_weight``, weighted counts and weighted
    equal-mass edges) and store each bin's accuracy ``h_b``.  Predict: the predicted class
    (arg-max of the logits) gets probability ``h_b`` of its bin, and **the prediction never
    changes**: the other classes share ``1 - h_b`` in proportion to their original
    probabilities, mixed with an equal share just enough that none reaches ``h_b``
    (``keep_top_label``; a bin accuracy below about ``1 / C``, which no top-1 probability can
    be, is raised to that bound).  Before issue 39 the other classes shared ``1 - h_b`` in
    proportion alone, so a small ``h_b`` handed the arg-max to another class: at 36 %
    accuracy 52-55 % of the predictions changed.  A bin that was empty at fit time leaves the
    confidence unchanged.  The calibrated confidence is the bin's validation accuracy, so the
    top-label ECE on the validation set (same bins) is 0; as a histogram method it is not
    monotone in the confidence.

    Args:
        n_bins: number of bins B.
        binning: ``"equal_mass"`` or ``"equal_width"``.

    Attributes:
        edges_ (torch.Tensor): (B - 1,) float64 interior bin edges.
        bin_values_ (torch.Tensor): (B,) float64 calibrated confidence per bin (NaN: empty).

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 3.0]])
        >>> hb = HistogramBinning(n_bins=2).fit(z, torch.tensor([0, 0, 0, 1]))
        >>> hb.bin_values_
        tensor([0.5000, 1.0000], dtype=torch.float64)
        >>> hb.predict_proba(z)  # the arg-max kept (0.5 + 1e-6 against 0.5 - 1e-6)
        tensor([[0.5000, 0.5000],
                [0.5000, 0.5000],
                [1.0000, 0.0000],
                [0.0000, 1.0000]])
        >>> hb.predict_proba(z).argmax(dim=1)
        tensor([0, 1, 0, 1])
    """

    _fitted_attr = "bin_values_"

    def __init__(self, n_bins: int = 15, binning: str = "equal_mass") -> None:
        check_positive_int(n_bins, "n_bins")
        _check_binning(binning)
        self.n_bins = n_bins
        self.binning = binning

    @staticmethod
    def _top1(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p = torch.softmax(z.to(work_dtype(z.dtype)), dim=1)
        conf, pred = p.max(dim=1)
        return p, conf, pred

    def _fit(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None) -> None:
        """Fit the bin accuracies on validated rows ``z`` (M, C), ``y`` (M,), weights or None
        (the top-1 confidences computed chunk by chunk)."""
        n_bins = check_positive_int(self.n_bins, "n_bins")
        binning = _check_binning(self.binning)
        parts = [self._top1(z[sl])[1:] for sl in row_chunks(z.shape[0], z.shape[1])]
        conf = torch.cat([c for c, _ in parts]) if len(parts) > 1 else parts[0][0]
        pred = torch.cat([p for _, p in parts]) if len(parts) > 1 else parts[0][1]
        if binning == "equal_mass":
            if w is None:
                idx, edges = equal_mass_bin_index(conf, n_bins)
            else:
                edges = weighted_equal_mass_edges(conf, w, n_bins)
                idx = bin_index(conf, edges)
        else:
            idx = equal_width_bin_index(conf, n_bins)
            edges = equal_width_edges(n_bins, dtype=conf.dtype, device=conf.device)[1:-1]
        correct = pred.eq(y).to(torch.float64)
        counts = torch.bincount(idx, weights=w, minlength=n_bins).to(torch.float64)
        hits = torch.bincount(idx, weights=correct if w is None else correct * w,
                              minlength=n_bins)
        values = torch.where(counts > 0, hits / counts.clamp(min=1e-300), float("nan"))
        self.edges_ = edges.to(torch.float64).cpu()
        self.bin_values_ = values.cpu()
        self.n_classes_ = z.shape[1]

    def _predict_proba(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated probabilities (N, C) in the logits' dtype (at least float32 inside); the
        arg-max of the logits is kept (:func:`keep_top_label`)."""
        p, conf, pred = self._top1(z)
        if self.binning == "equal_mass":
            idx = bin_index(conf, self.edges_)
        else:
            idx = equal_width_bin_index(conf, self.edges_.shape[0] + 1)
        h = self.bin_values_.to(conf.device)[idx]
        h = torch.where(torch.isnan(h), conf.to(torch.float64), h)
        return keep_top_label(p, pred, h, z.dtype)

    def _transform(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated "logits" ``log q`` (``q`` = :meth:`predict_proba`, clamped at the dtype's
        smallest normal number so they stay finite); ``softmax`` of them gives back ``q``."""
        return log_proba(self._predict_proba(z))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings, edges and bin values; ``None`` for empty bins)."""
        self._check_fitted()
        values = [None if math.isnan(v) else v for v in self.bin_values_.tolist()]
        return {
            "type": type(self).__name__,
            "version": 1,
            "n_bins": self.n_bins,
            "binning": self.binning,
            "edges": self.edges_.tolist(),
            "values": values,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HistogramBinning:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("n_bins", "binning", "edges", "values"))
        obj = cls(n_bins=d["n_bins"], binning=d["binning"])
        edges = float_list(d["edges"], "d['edges']", length=obj.n_bins - 1, bounds=(0.0, 1.0))
        values = float_list(d["values"], "d['values']", length=obj.n_bins, allow_none=True,
                            bounds=(0.0, 1.0))
        if any(b < a for a, b in zip(edges, edges[1:], strict=False)):
            raise ValueError("Expected `d['edges']` to be sorted in increasing order")
        if any(v is not None and not 0.0 <= v <= 1.0 for v in values):
            raise ValueError("Expected `d['values']` to lie in [0, 1]")
        obj.edges_ = torch.tensor(edges, dtype=torch.float64)
        obj.bin_values_ = torch.tensor(
            [float("nan") if v is None else v for v in values], dtype=torch.float64
        )
        obj.n_classes_ = None
        return obj
