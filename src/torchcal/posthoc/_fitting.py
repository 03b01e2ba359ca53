"""The numerical fits of the post-hoc calibrators: L-BFGS on a validation objective
(:func:`lbfgs_fit`), Armijo backtracking for the damped Newton fits (:func:`backtrack`), the
fixed cross-validation folds (:func:`cv_folds`) and weighted equal-mass bin edges.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import CalibrationFitError

__all__ = [
    "GRAD_TOL",
    "lbfgs_fit",
    "backtrack",
    "CV_SEED",
    "cv_folds",
    "weighted_equal_mass_edges",
]


# Largest |gradient| of a validation objective accepted when L-BFGS stops on its budget.
GRAD_TOL = 1e-6


def lbfgs_fit(params: list[torch.Tensor], objective: Any, *, max_iter: int, name: str,
              hint: str = "") -> tuple[float, float]:
    """Minimise ``objective`` (a 0-d float64 tensor of ``params``) with L-BFGS (strong Wolfe
    line search) and return its ``(start, end)`` values.

    ``objective(backward)`` returns the objective's value (detached) and, when ``backward``
    is true, adds its gradient to the parameters' ``.grad`` (so a large objective can be
    summed and differentiated chunk by chunk).  L-BFGS stops once the largest |gradient| is
    at most ``GRAD_TOL`` (the tolerance the result is accepted at: running on past it costs
    evaluations and changes the fit by rounding only; issue 43).  Raises
    :class:`CalibrationFitError` with the reason if the objective becomes non-finite, or if
    L-BFGS uses up its budget (``max_iter`` iterations or ``1.25 * max_iter`` evaluations) with
    the gradient still above ``GRAD_TOL``; ``hint`` (e.g. why the objective may have no finite
    minimiser) is added to that message.
    """
    opt = torch.optim.LBFGS(
        params, lr=1.0, max_iter=max_iter, tolerance_grad=GRAD_TOL, tolerance_change=1e-14,
        history_size=20, line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        return objective(True)

    with torch.enable_grad():
        with torch.no_grad():
            start = float(objective(False))
        opt.step(closure)
        state = opt.state[opt.param_groups[0]["params"][0]]
        n_iter, n_eval = state.get("n_iter", 0), state.get("func_evals", 0)
        opt.zero_grad(set_to_none=False)
        loss = objective(True)
        grads = [p.grad for p in params]
    end = float(loss.detach())
    if not math.isfinite(end):
        raise CalibrationFitError(
            f"{name} failed: L-BFGS reached a non-finite validation objective ({end!r}) after "
            f"{n_iter} iterations"
        )
    grad = max(float(g.abs().max()) for g in grads)
    max_eval = opt.param_groups[0]["max_eval"]
    if (n_iter >= max_iter or n_eval >= max_eval) and not grad <= GRAD_TOL:
        raise CalibrationFitError(
            f"{name} failed: L-BFGS used its budget ({n_iter} iterations, {n_eval} function "
            f"evaluations; max_iter={max_iter}) with the validation NLL gradient still "
            f"{grad:.3g} (> {GRAD_TOL:g}){hint}; increase `max_iter`"
        )
    return start, end


def backtrack(objective: Any, theta: torch.Tensor, f: float, step: torch.Tensor, slope: float
              ) -> tuple[torch.Tensor, float] | None:
    """Armijo backtracking along ``-step`` from ``theta`` (objective value ``f``; ``slope`` the
    directional derivative ``<grad, step>``) for the damped Newton fits.

    Returns the first ``(theta - t step, value)`` with ``t = 1, 1/2, ...`` that decreases
    ``objective`` strictly and by at least ``1e-4 t slope``, or ``None`` when no ``t`` down to
    ``1e-12`` does: the minimum is then reached to rounding (a non-strict test would accept
    equal values forever).
    """
    t = 1.0
    while t > 1e-12:
        cand = theta - t * step
        f_new = objective(cand)
        if f_new < f and f_new <= f - 1e-4 * t * slope:
            return cand, f_new
        t /= 2
    return None


#: Seed of :func:`cv_folds`'s permutation (the same data give the same folds).
CV_SEED = 0


def cv_folds(n: int, k: int, device: Any = None) -> list[torch.Tensor]:
    """``k`` disjoint index sets covering ``range(n)``: a fixed permutation (seed ``CV_SEED``)
    dealt round-robin, so fold sizes differ by at most one.  The folds of the calibrators'
    cross-validation (``lam="cv"``) and of ``torchcal calibrate``'s held-out numbers.

    >>> [f.tolist() for f in cv_folds(5, 2)]
    [[4, 1, 2], [0, 3]]
    """
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(CV_SEED))
    return [perm[i::k].to(device) for i in range(k)]


def weighted_equal_mass_edges(values: torch.Tensor, w: torch.Tensor, n_bins: int
                              ) -> torch.Tensor:
    """Interior equal-mass edges of ``values`` (..., N) under sample weights ``w`` (N,):
    :func:`torchcal.metrics.binning.equal_mass_edges` of the values each repeated ``w_i``
    times for integer weights (``e_k = s_j`` at the repeated position
    ``max(floor(k W / B) - 1, 0)``, ``W = sum w``), the same rule for any weights.

    >>> weighted_equal_mass_edges(torch.tensor([0.9, 0.1, 0.3]), torch.tensor([1.0, 1, 2]), 2)
    tensor([0.3000])
    """
    s, order = torch.sort(values, dim=-1)
    cw = torch.cumsum(w.to(torch.float64)[order], dim=-1)
    total = cw[..., -1:]
    k = torch.arange(1, n_bins, device=values.device, dtype=torch.float64)
    pos = torch.clamp(torch.div(k * total, n_bins, rounding_mode="floor") - 1, min=0)
    j = torch.searchsorted(cw.contiguous(), pos.contiguous(), right=True)
    return s.gather(-1, j.clamp(max=values.shape[-1] - 1))
