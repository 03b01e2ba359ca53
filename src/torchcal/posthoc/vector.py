"""Vector scaling (Guo et al. 2017): per-class scale and bias, ``z'_c = w_c z_c + b_c``."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F

from .._validation import check_positive_int
from ._checks import (
    PARAMETER_BOUNDS,
    absent_classes,
    check_n_classes,
    describe_classes,
    float_list,
)
from ._fitting import lbfgs_fit
from ._layout import row_chunks
from .base import Calibrator
from .temperature import fit_nll

__all__ = ["VectorScaling"]


def absent_hint(absent: list[int]) -> str:
    """The reason L-BFGS may not converge when some classes never occur in validation."""
    if not absent:
        return ""
    return (f": {len(absent)} class(es) never occur in the validation labels "
            f"({describe_classes(absent)}), so the NLL has no finite minimiser (their "
            "biases fall without bound); use more validation data, or temperature scaling")


def weighted_ce(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, logits_of: Any
                ) -> Any:
    """``objective(backward)`` for :func:`~torchcal.posthoc._fitting.lbfgs_fit`: the (weighted)
    mean cross-entropy of ``logits_of(z64)`` (float64), summed and differentiated over chunks
    of rows (``CHUNK_ELEMENTS``) so a dense input is never copied to float64 as a whole; one
    chunk without weights is ``F.cross_entropy``'s mean itself."""
    n, c = z.shape
    chunks = row_chunks(n, c)
    z64 = z.to(torch.float64) if len(chunks) == 1 else None
    total = float(n) if w is None else float(w.sum())

    def objective(backward: bool) -> torch.Tensor:
        if z64 is not None and w is None:
            loss = F.cross_entropy(logits_of(z64), y)
            if backward:
                loss.backward()
            return loss.detach()
        acc = torch.zeros((), dtype=torch.float64, device=z.device)
        for sl in chunks:
            zc = z64 if z64 is not None else z[sl].to(torch.float64)
            ce = F.cross_entropy(logits_of(zc), y[sl], reduction="none")
            part = (ce.sum() if w is None else (ce * w[sl]).sum()) / total
            if backward:
                part.backward()
            acc = acc + part.detach()
        return acc

    return objective


class VectorScaling(Calibrator):
    """Vector scaling: calibrated logits ``z'_ic = w_c z_ic + b_c`` fitted by validation NLL.

    The weights start at temperature scaling's solution (``w = 1 / T_nll``, ``b = 0``) and are
    refined by L-BFGS (strong Wolfe line search) on the float64 validation NLL
    ``-(1/N) sum_i log softmax(w * z_i + b)_{y_i}``, which is convex in ``(w, b)``, until the
    largest |gradient| is 1e-6, the tolerance the fit is accepted at (before issue 43 it ran on
    towards 1e-10, to its evaluation budget: 5x the CPU time for a validation NLL within 1e-9,
    ``benchmarks/bench_lbfgs_tolerance.py``).  With ``sample_weight`` the means are weighted;
    dense input is summed and differentiated over chunks of rows.  Temperature
    scaling is the special case ``w_c = 1/T, b_c = 0`` and the fit never ends above its
    starting point, so the validation NLL is at most temperature scaling's.  Unlike temperature
    scaling, the bias can change the arg-max (and so the accuracy).

    A class that never occurs among the validation labels has no finite optimum (its bias
    falls towards ``-inf``): :meth:`fit` warns (``RuntimeWarning``) and names such classes.
    If L-BFGS uses up its budget (``max_iter`` iterations or ``1.25 * max_iter`` evaluations)
    with the NLL gradient still above ``1e-6``, :meth:`fit` raises
    :class:`~torchcal.posthoc.CalibrationFitError` (a :class:`~torchcal.errors.TorchcalError`
    and ``RuntimeError``) giving that reason and, when classes are absent, naming them.

    Args:
        max_iter: L-BFGS iterations.

    Attributes:
        weight_ (torch.Tensor): (C,) float64 scales.
        bias_ (torch.Tensor): (C,) float64 biases.
        n_classes_ (int): C.

    Example:
        >>> a, b = [2.0, 0.0], [0.0, 2.0]
        >>> z = torch.tensor([a, a, a, b, b, b, b])
        >>> y = torch.tensor([0, 0, 1, 1, 1, 1, 0])  # right 2/3 on a, 3/4 on b
        >>> vs = VectorScaling().fit(z, y)
        >>> vs.predict_proba(torch.tensor([a, b])).round(decimals=4)
        tensor([[0.6667, 0.3333],
                [0.2500, 0.7500]])
    """

    _fitted_attr = "weight_"
    changes_argmax = True  # the per-class bias (and scale) moves the decision boundaries

    def __init__(self, max_iter: int = 500) -> None:
        check_positive_int(max_iter, "max_iter")
        self.max_iter = max_iter

    def _fit(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None) -> None:
        """Fit ``w`` and ``b`` on validated rows ``z`` (M, C), ``y`` (M,), weights or None."""
        max_iter = check_positive_int(self.max_iter, "max_iter")
        c = z.shape[1]
        absent = absent_classes(y, c)
        if absent:
            warnings.warn(
                f"VectorScaling: {len(absent)} class(es) never occur in the validation labels "
                f"({describe_classes(absent)}); their biases have no finite optimum and are "
                "pushed towards -inf, so those classes get almost no probability",
                RuntimeWarning,
                stacklevel=3,
            )
        t0 = fit_nll(z, y, w, stacklevel=4)
        w0 = torch.full((c,), 1.0 / t0, dtype=torch.float64, device=z.device)
        b0 = torch.zeros(c, dtype=torch.float64, device=z.device)
        scale = w0.clone().requires_grad_(True)
        b = b0.clone().requires_grad_(True)
        start, end = lbfgs_fit([scale, b], weighted_ce(z, y, w, lambda zc: zc * scale + b),
                               max_iter=max_iter, name="VectorScaling",
                               hint=absent_hint(absent))
        if end > start:  # cannot happen with a descent line search; keep the guarantee anyway
            scale, b = w0, b0
        self.weight_ = scale.detach().cpu()
        self.bias_ = b.detach().cpu()
        self.n_classes_ = c

    def _transform(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated logits ``w * z + b`` in the logits' dtype and device."""
        check_n_classes(z, self.n_classes_)
        w = self.weight_.to(device=z.device)
        b = self.bias_.to(device=z.device)
        if z.dtype == torch.float64:
            return z * w + b
        return (z.to(torch.float32) * w.float() + b.float()).to(z.dtype)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings, weights and biases)."""
        self._check_fitted()
        return {
            "type": type(self).__name__,
            "version": 1,
            "max_iter": self.max_iter,
            "weight": self.weight_.tolist(),
            "bias": self.bias_.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VectorScaling:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("max_iter", "weight", "bias"))
        obj = cls(max_iter=d["max_iter"])
        w = float_list(d["weight"], "d['weight']", bounds=PARAMETER_BOUNDS)
        b = float_list(d["bias"], "d['bias']", length=len(w), bounds=PARAMETER_BOUNDS)
        if len(w) < 2:
            raise ValueError(f"Expected `d['weight']` to have at least 2 entries, got {len(w)}")
        obj.weight_ = torch.tensor(w, dtype=torch.float64)
        obj.bias_ = torch.tensor(b, dtype=torch.float64)
        obj.n_classes_ = len(w)
        return obj
