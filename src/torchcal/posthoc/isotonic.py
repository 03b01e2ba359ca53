"""One-vs-rest isotonic regression (Zadrozny & Elkan 2002), renormalised."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._checks import check_n_classes, float_list
from ._layout import row_chunks, work_dtype
from ._toplabel import keep_top_label, log_proba, top_label_rows
from .base import Calibrator

__all__ = ["IsotonicCalibration"]


def _check_top_label(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"Expected `top_label` to be a bool, got {value!r}")
    return value


def _interp_rows(x: torch.Tensor, knots_x: torch.Tensor, knots_y: torch.Tensor,
                 sizes: torch.Tensor) -> torch.Tensor:
    """Column k of ``x`` (N, K) mapped through the piecewise-linear function with the first
    ``sizes[k]`` knots of row k of ``knots_x`` / ``knots_y`` (K, M), clipped to its range;
    vectorised over classes (one batched ``searchsorted``)."""
    k, m = knots_x.shape
    last = (sizes - 1).unsqueeze(1)
    pos = torch.arange(m, device=x.device).unsqueeze(0)
    # pad every row beyond its last knot with increasing abscissae and a flat value, so that
    # all rows share one (K, M + 1) table and values at or past the end read the last knot
    lo_x = knots_x[:, :1]
    hi_x = knots_x.gather(1, last)
    hi_y = knots_y.gather(1, last)
    pad = pos > last
    kx = torch.where(pad, hi_x + (pos - last), knots_x)
    ky = torch.where(pad, hi_y, knots_y)
    kx = torch.cat([kx, kx[:, -1:] + 1], dim=1)
    ky = torch.cat([ky, ky[:, -1:]], dim=1)
    xt = torch.minimum(torch.maximum(x.T, lo_x), hi_x).contiguous()  # (K, N), clipped
    j = torch.searchsorted(kx, xt, right=True).clamp_(1, m)
    x0, x1 = kx.gather(1, j - 1), kx.gather(1, j)
    y0, y1 = ky.gather(1, j - 1), ky.gather(1, j)
    slope = (y1 - y0) / (x1 - x0)
    return (y0 + slope * (xt - x0)).T


class IsotonicCalibration(Calibrator):
    """One-vs-rest isotonic regression on the class probabilities, renormalised.

    Fit: for every class k, scikit-learn's ``IsotonicRegression(out_of_bounds="clip")`` maps
    the validation probabilities ``p_ik = softmax(z_i)_k`` to the indicators ``[y_i = k]``
    (a non-decreasing, piecewise-linear map ``g_k``).  Predict: ``q_ik = g_k(p_ik) /
    sum_j g_j(p_ij)``, or the uniform ``1 / C`` where every ``g_j`` is 0.  With two classes
    only class 1 is fitted and ``q_0 = 1 - q_1``.  This is scikit-learn's
    ``CalibratedClassifierCV(method="isotonic")`` applied to fixed probabilities, with the
    same numbers (to float rounding); the maps are kept as their knots and evaluated by one
    batched interpolation over all classes.

    Isotonic regression is non-parametric: it needs a large validation set, and its steps give
    ties among the calibrated probabilities.  The one-vs-rest form renormalises C separate
    maps, so by design it can change the arg-max (and the accuracy; ``changes_argmax``).

    ``top_label=True`` is the top-label form instead: one isotonic map ``g`` from the top-1
    confidence to whether the prediction is right; the predicted class gets ``g(p_top)`` and
    keeps its arg-max (the other classes share the rest,
    :func:`~torchcal.posthoc._toplabel.keep_top_label`), for any number of classes.  Its knots
    are ``knots_x_[0]`` / ``knots_y_[0]``.  ``sample_weight`` goes to scikit-learn's fit.

    Args:
        top_label: False (default, one-vs-rest) or True (top label).

    Attributes:
        knots_x_ (list[torch.Tensor]): per class, the increasing float64 abscissae of ``g_k``
            (class 0 is empty for a binary problem).
        knots_y_ (list[torch.Tensor]): per class, the values of ``g_k`` at those abscissae.
        n_classes_ (int): C.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
        >>> iso = IsotonicCalibration().fit(z, torch.tensor([0, 1, 1, 1]))
        >>> iso.predict_proba(z)[:, 1]
        tensor([0., 1., 1., 1.])
    """

    _fitted_attr = "knots_x_"

    def __init__(self, top_label: bool = False) -> None:
        _check_top_label(top_label)
        self.top_label = top_label

    @property
    def changes_argmax(self) -> bool:  # type: ignore[override]
        """One-vs-rest renormalisation may change the arg-max; the top-label form never."""
        return not self.top_label

    @staticmethod
    def _probs(z: torch.Tensor) -> torch.Tensor:
        return torch.softmax(z.to(torch.float64), dim=1)

    @staticmethod
    def _columns(z: torch.Tensor) -> np.ndarray:
        """Float64 probabilities (M, C) as NumPy (the map's abscissae), softmax computed
        chunk by chunk (float64 only one chunk at a time)."""
        chunks = row_chunks(z.shape[0], z.shape[1])
        if len(chunks) == 1:
            return torch.softmax(z.to(torch.float64), dim=1).cpu().numpy()
        out = np.empty(tuple(z.shape), dtype=np.float64)
        for sl in chunks:
            out[sl] = torch.softmax(z[sl].to(torch.float64), dim=1).cpu().numpy()
        return out

    def _fit_top(self, z: torch.Tensor, y: torch.Tensor, w: Any) -> None:
        confs, hits = [], []
        for sl in row_chunks(z.shape[0], z.shape[1]):
            lp, pred, _ = top_label_rows(z[sl])
            confs.append(lp.gather(1, pred.unsqueeze(1)).squeeze(1).exp())
            hits.append(pred.eq(y[sl]).to(torch.float64))
        # deferred: scikit-learn's import (2 s of CPU) only where isotonic regression is fitted
        from sklearn.isotonic import IsotonicRegression

        iso = IsotonicRegression(out_of_bounds="clip").fit(
            torch.cat(confs).cpu().numpy(), torch.cat(hits).cpu().numpy(), sample_weight=w)
        self.knots_x_ = [torch.from_numpy(np.asarray(iso.X_thresholds_, dtype=np.float64))]
        self.knots_y_ = [torch.from_numpy(np.asarray(iso.y_thresholds_, dtype=np.float64))]
        self.n_classes_ = None

    def _fit(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None) -> None:
        """Fit one isotonic map per class (or, top-label, one map) on validated rows."""
        wn = None if w is None else w.cpu().numpy()
        if _check_top_label(self.top_label):
            self._fit_top(z, y, wn)
            return
        yn = y.cpu().numpy()
        c = z.shape[1]
        # one class's column at a time: a dense input is never a float64 (M, C) array
        chunks = row_chunks(z.shape[0], c)
        p = self._columns(z) if len(chunks) == 1 else None
        knots_x, knots_y = [], []
        # deferred: scikit-learn's import (2 s of CPU) only where isotonic regression is fitted
        from sklearn.isotonic import IsotonicRegression

        for k in range(c):  # one scikit-learn fit per class (not per sample)
            if c == 2 and k == 0:
                knots_x.append(torch.zeros(0, dtype=torch.float64))
                knots_y.append(torch.zeros(0, dtype=torch.float64))
                continue
            col = p[:, k] if p is not None else np.concatenate([
                torch.softmax(z[sl].to(torch.float64), dim=1)[:, k].cpu().numpy()
                for sl in chunks])
            iso = IsotonicRegression(out_of_bounds="clip").fit(col, (yn == k).astype(float),
                                                               sample_weight=wn)
            knots_x.append(torch.from_numpy(np.asarray(iso.X_thresholds_, dtype=np.float64)))
            knots_y.append(torch.from_numpy(np.asarray(iso.y_thresholds_, dtype=np.float64)))
        self.knots_x_ = knots_x
        self.knots_y_ = knots_y
        self.n_classes_ = c

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        fitted = [k for k in range(self.n_classes_) if self.knots_x_[k].numel()]
        sizes = torch.tensor([self.knots_x_[k].numel() for k in fitted])
        m = int(sizes.max())
        kx = torch.zeros(len(fitted), m, dtype=torch.float64)
        ky = torch.zeros(len(fitted), m, dtype=torch.float64)
        for row, k in enumerate(fitted):  # C rows of knots (not samples)
            kx[row, : sizes[row]] = self.knots_x_[k]
            ky[row, : sizes[row]] = self.knots_y_[k]
        return kx.to(device), ky.to(device), sizes.to(device)

    def _predict_proba(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated probabilities (N, C) in the logits' dtype (float64 inside)."""
        if self.top_label:
            lp, pred, _ = top_label_rows(z)
            p = lp.exp()
            kx, ky = self.knots_x_[0].to(z.device), self.knots_y_[0].to(z.device)
            sizes = torch.tensor([kx.numel()], device=z.device)
            h = _interp_rows(p.gather(1, pred.unsqueeze(1)), kx[None], ky[None], sizes)[:, 0]
            return keep_top_label(p, pred, h, z.dtype)
        check_n_classes(z, self.n_classes_)
        p = self._probs(z)
        kx, ky, sizes = self._tables(z.device)
        if self.n_classes_ == 2:
            q1 = _interp_rows(p[:, 1:], kx, ky, sizes)
            q = torch.cat([1 - q1, q1], dim=1)
        else:
            g = _interp_rows(p, kx, ky, sizes)
            total = g.sum(dim=1, keepdim=True)
            q = torch.where(total > 0, g / total.clamp(min=torch.finfo(torch.float64).tiny),
                            1.0 / self.n_classes_)
        return q.to(work_dtype(z.dtype)).to(z.dtype)

    def _transform(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated "logits" ``log q`` (clamped at the dtype's smallest normal number)."""
        return log_proba(self._predict_proba(z))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (the knots of every class's map)."""
        self._check_fitted()
        return {
            **self._header(),
            "knots_x": [t.tolist() for t in self.knots_x_],
            "knots_y": [t.tolist() for t in self.knots_y_],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IsotonicCalibration:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("knots_x", "knots_y"))
        kx, ky = d["knots_x"], d["knots_y"]
        top = d.get("top_label", False)
        if top is True and isinstance(kx, list) and isinstance(ky, list) and len(kx) == len(ky) == 1:
            pass
        elif not (isinstance(kx, list) and isinstance(ky, list) and len(kx) == len(ky) >= 2):
            raise ValueError("Expected `d['knots_x']` and `d['knots_y']` to be lists of one "
                             "list of knots per class (at least 2 classes)")
        top = d.get("top_label", False)
        obj = cls(top_label=top)
        xs, ys = [], []
        for k, (a, b) in enumerate(zip(kx, ky, strict=True)):
            xa = float_list(a, f"d['knots_x'][{k}]", bounds=(0.0, 1.0))  # probabilities
            yb = float_list(b, f"d['knots_y'][{k}]", length=len(xa), bounds=(0.0, 1.0))
            if any(v < u for u, v in zip(xa, xa[1:], strict=False)):
                raise ValueError(f"Expected `d['knots_x'][{k}]` to be sorted")
            xs.append(torch.tensor(xa, dtype=torch.float64))
            ys.append(torch.tensor(yb, dtype=torch.float64))
        obj.knots_x_, obj.knots_y_, obj.n_classes_ = xs, ys, (None if top else len(xs))
        empty = [k for k in range(len(xs)) if not xs[k].numel()]
        if empty != ([0] if len(xs) == 2 else []):
            raise ValueError("Expected knots for every class (for 2 classes: class 1 only)")
        return obj
