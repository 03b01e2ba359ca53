"""Full linear maps of the logits or log-probabilities: matrix scaling (Guo et al. 2017) and
Dirichlet calibration (Kull et al. 2019), with the ODIR regulariser."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from .._validation import check_nonneg_finite, check_positive_int
from ._common import (
    GRAD_TOL,
    CalibrationError,
    Calibrator,
    MemorizedValidationWarning,
    absent_classes,
    backtrack,
    check_choice,
    check_n_classes,
    float_list,
    prepare_fit,
)
from .temperature import _fit_nll
from .vector import absent_hint

__all__ = ["MatrixScaling", "DirichletCalibration"]

_REGS = ("odir", "none")
# Up to this many classes the fit uses Newton's method with the exact Hessian (its
# (C (C + 1))^2 entries cost N C^4 to build: ~2 s for C = 20, N = 5000); above it, truncated
# Newton (Newton-CG: Hessian-vector products, N C^2 each, nothing of size C^4 stored).
NEWTON_MAX_CLASSES = 20
# Both Newton fits stop at this largest |gradient| (or when no step decreases the objective
# any more, i.e. at machine precision); a fit that stops above GRAD_TOL raises.
NEWTON_GRAD_STOP = 1e-10
# A fit with more parameters than validation samples whose validation NLL ends below this
# fraction of temperature scaling's (where it starts) has memorised the labels: warned.
MEMORIZED_NLL_FRACTION = 0.5
# Newton-CG's preconditioner: the Hessian's (D, D) diagonal blocks up to this many numbers
# (K D^2, 8 bytes each: 400 MB), else its diagonal.
BLOCK_PRECONDITIONER_MAX = 50_000_000


def _objective(x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor, pen: torch.Tensor
               ) -> float:
    return float(F.cross_entropy(x @ theta.T, y) + (pen * theta * theta).sum())


def newton_softmax_fit(x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor,
                       pen: torch.Tensor, *, max_iter: int, name: str, hint: str = ""
                       ) -> torch.Tensor:
    """Minimise ``CE(x theta^T, y) + sum(pen * theta^2)`` over theta (K, D) by damped Newton.

    The Hessian of the mean cross-entropy is ``(1/N) sum_i (diag q_i - q_i q_i^T) (x) x_i
    x_i^T``; the step solves it by an eigen-decomposition that drops the directions the
    objective is flat along (adding one vector to every row of theta changes no softmax), and
    a backtracking line search keeps every step a descent.  Stops at a gradient of 1e-10, or
    when no step decreases the objective any more (machine precision); raises
    :class:`CalibrationError` if ``max_iter`` steps leave the gradient above ``GRAD_TOL``.
    """
    n, d = x.shape
    k = theta.shape[0]
    onehot = F.one_hot(y, k).to(torch.float64)
    f = _objective(x, y, theta, pen)
    grad = torch.full_like(theta, math.inf)
    for _ in range(max_iter):
        q = torch.softmax(x @ theta.T, dim=1)
        grad = (q - onehot).T @ x / n + 2 * pen * theta
        if float(grad.abs().max()) <= NEWTON_GRAD_STOP:
            break
        m = (q.unsqueeze(2) * x.unsqueeze(1)).reshape(n, k * d)
        hess = -(m.T @ m) / n
        blocks = (q.T.unsqueeze(2) * x).transpose(1, 2) @ x / n  # (K, D, D), K N D memory
        hv = hess.view(k, d, k, d)
        idx = torch.arange(k, device=x.device)
        hv[idx, :, idx, :] += blocks
        hess.diagonal().add_(2 * pen.reshape(-1))
        evals, evecs = torch.linalg.eigh(hess)
        keep = evals > evals.max() * 1e-12
        g = grad.reshape(-1)
        step = (evecs[:, keep] @ ((evecs[:, keep].T @ g) / evals[keep])).view(k, d)
        moved = backtrack(lambda th: _objective(x, y, th, pen), theta, f, step,
                          float(g @ step.reshape(-1)))
        if moved is None:
            break
        theta, f = moved
    else:
        q = torch.softmax(x @ theta.T, dim=1)
        grad = (q - onehot).T @ x / n + 2 * pen * theta
    _check_newton_result(f, float(grad.abs().max()), max_iter, name, hint)
    return theta


def _softmax_grad(x: torch.Tensor, onehot: torch.Tensor, theta: torch.Tensor,
                  pen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities (N, K) and the gradient (K, D) of the penalised mean cross-entropy."""
    q = torch.softmax(x @ theta.T, dim=1)
    return q, (q - onehot).T @ x / x.shape[0] + 2 * pen * theta


def _block_preconditioner(x: torch.Tensor, q: torch.Tensor, pen: torch.Tensor) -> Any:
    """``r -> M^{-1} r`` with M the Hessian's K diagonal (D, D) blocks
    ``(1/N) sum_i q_ik (1 - q_ik) x_i x_i^T + 2 diag(pen_k)`` (Cholesky factors, K D^2
    memory, built class by class in chunks of about 2^24 numbers); the Hessian's diagonal
    alone when K D^2 exceeds ``BLOCK_PRECONDITIONER_MAX``."""
    n, d = x.shape
    k = q.shape[1]
    w = q * (1 - q)
    if k * d * d > BLOCK_PRECONDITIONER_MAX:
        diag = (w.T @ (x * x)) / n + 2 * pen + 1e-12
        return lambda r: r / diag
    chunk = max(1, (1 << 24) // (n * d))
    blocks = torch.cat([(w.T[a:a + chunk].unsqueeze(2) * x).transpose(1, 2) @ x / n
                        for a in range(0, k, chunk)])
    blocks.diagonal(dim1=1, dim2=2).add_(2 * pen + 1e-10)
    factor = torch.linalg.cholesky(blocks)
    return lambda r: torch.cholesky_solve(r.unsqueeze(2), factor).squeeze(2)


def _pcg(hvp: Any, g: torch.Tensor, precond: Any, tol: float, max_steps: int
         ) -> torch.Tensor:
    """Preconditioned conjugate gradients for ``H p = g`` (H positive semi-definite, given by
    ``hvp``; ``precond(r)`` applies the preconditioner's inverse), stopped at a residual norm
    ``<= tol`` or on a direction of no curvature."""
    p = torch.zeros_like(g)
    r = g.clone()
    zr = precond(r)
    d = zr.clone()
    rz = float((r * zr).sum())
    for _ in range(max_steps):
        hd = hvp(d)
        curv = float((d * hd).sum())
        if curv <= 0.0:  # a flat direction (the rows' common shift): stop here
            break
        a = rz / curv
        p = p + a * d
        r = r - a * hd
        if float(r.norm()) <= tol:
            break
        zr = precond(r)
        rz_new = float((r * zr).sum())
        d = zr + (rz_new / rz) * d
        rz = rz_new
    return p if bool(p.abs().sum() > 0) else precond(g)


def newton_cg_softmax_fit(x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor,
                          pen: torch.Tensor, *, max_iter: int, name: str, hint: str = "",
                          memorised_below: float = -math.inf) -> torch.Tensor:
    """:func:`newton_softmax_fit` without the Hessian: truncated Newton.

    Each step solves ``H p = g`` by conjugate gradients with Hessian-vector products
    ``H[V] = (1/N) ((q * s - q (q . s))^T x) + 2 pen * V`` (``s = x V^T``; ``N K D`` each)
    and the Hessian's diagonal blocks as preconditioner, to a residual ``min(0.5, sqrt|g|) |g|``
    (super-linear convergence), then the same backtracking line search.  Stops at a gradient
    of ``NEWTON_GRAD_STOP`` or when no step decreases the objective; raises
    :class:`CalibrationError` if ``max_iter`` steps leave the gradient above ``GRAD_TOL``.

    A fit that memorises its labels (the objective below ``memorised_below``, which the caller
    sets when there are more parameters than samples) stops at ``GRAD_TOL``: its minimum lies
    at ever larger weights (the labels separated, only a vanishing penalty holding them), each
    further decade of the gradient costs more Newton steps than the last (C = 1,000, N = 5,000:
    minutes each), and the result is useless anyway (the caller warns).
    """
    n = x.shape[0]
    onehot = F.one_hot(y, theta.shape[0]).to(torch.float64)
    f = _objective(x, y, theta, pen)
    for _ in range(max_iter):
        q, grad = _softmax_grad(x, onehot, theta, pen)
        g_max = float(grad.abs().max())
        if g_max <= NEWTON_GRAD_STOP or (f < memorised_below and g_max <= GRAD_TOL):
            break

        def hvp(v: torch.Tensor, q: torch.Tensor = q) -> torch.Tensor:
            s = x @ v.T
            return (q * (s - (q * s).sum(1, keepdim=True))).T @ x / n + 2 * pen * v

        precond = _block_preconditioner(x, q, pen)
        g_norm = float(grad.norm())
        step = _pcg(hvp, grad, precond, min(0.5, math.sqrt(g_norm)) * g_norm,
                    max_steps=max(50, min(500, grad.numel())))
        moved = backtrack(lambda th: _objective(x, y, th, pen), theta, f, step,
                          float((grad * step).sum()))
        if moved is None:
            break
        theta, f = moved
    _, grad = _softmax_grad(x, onehot, theta, pen)
    _check_newton_result(f, float(grad.abs().max()), max_iter, name, hint)
    return theta


def _check_newton_result(f: float, g_max: float, max_iter: int, name: str, hint: str) -> None:
    if not math.isfinite(f):
        raise CalibrationError(f"{name} failed: Newton's method reached a non-finite "
                               f"validation objective ({f!r})")
    if not g_max <= GRAD_TOL:
        raise CalibrationError(
            f"{name} failed: Newton's method stopped after at most {max_iter} steps with the "
            f"validation objective's gradient still {g_max:.3g} (> {GRAD_TOL:g}){hint}; "
            "increase `max_iter` or regularise more (`reg='odir'`, larger `lam` / `mu`)"
        )


class _LinearCalibrator(Calibrator):
    """``q = softmax(W phi(z) + b)`` with W (C, C) and b (C,) fitted by regularised NLL."""

    _fitted_attr = "weight_"
    _log_probs: bool = False  # phi = log_softmax (Dirichlet) or the identity (matrix scaling)

    def __init__(self, reg: str, lam: float, mu: float, max_iter: int) -> None:
        self.reg = reg
        self.lam = lam
        self.mu = mu
        self.max_iter = max_iter
        self._settings()

    def _settings(self) -> tuple[str, float, float, int]:
        """The settings, checked (at construction, and at fit: ``set_params`` does not)."""
        return (check_choice(self.reg, "reg", _REGS), check_nonneg_finite(self.lam, "lam"),
                check_nonneg_finite(self.mu, "mu"), check_positive_int(self.max_iter, "max_iter"))

    def _features(self, z: torch.Tensor) -> torch.Tensor:
        z64 = z.to(torch.float64)
        return torch.log_softmax(z64, dim=1) if self._log_probs else z64

    def fit(self, logits: Any, labels: Any) -> _LinearCalibrator:
        """Fit W and b on validation ``logits`` (N, C) and ``labels`` (N,); returns ``self``."""
        reg, lam, mu, max_iter = self._settings()
        z, y = prepare_fit(logits, labels)
        c = z.shape[1]
        # features with a column of ones: theta = [W | b], shape (C, C + 1)
        x = torch.cat([self._features(z), z.new_ones(z.shape[0], 1, dtype=torch.float64)], 1)
        pen = torch.zeros(c, c + 1, dtype=torch.float64, device=z.device)
        if reg == "odir":
            pen[:, :c] = lam / (c * (c - 1))
            pen[:, :c].fill_diagonal_(0.0)
            pen[:, c] = mu / c
        # start at temperature scaling's solution W = I / T, b = 0 (softmax(log p / T) =
        # softmax(z / T), so the same T serves both maps): no ODIR penalty there
        theta = torch.zeros(c, c + 1, dtype=torch.float64, device=z.device)
        theta[:, :c] = torch.eye(c, dtype=torch.float64, device=z.device) / _fit_nll(z, y)
        nll_ts = float(F.cross_entropy(x @ theta.T, y))
        absent = absent_classes(y, c)
        hint = absent_hint(absent) if (reg == "none" or mu == 0) else ""
        name = type(self).__name__
        n_params = c * (c + 1)
        if c <= NEWTON_MAX_CLASSES:
            theta = newton_softmax_fit(x, y, theta, pen, max_iter=max_iter, name=name, hint=hint)
        else:
            theta = newton_cg_softmax_fit(
                x, y, theta, pen, max_iter=max_iter, name=name, hint=hint,
                memorised_below=(MEMORIZED_NLL_FRACTION * nll_ts if n_params > z.shape[0]
                                 else -math.inf))
        self.weight_ = theta[:, :c].cpu()
        self.bias_ = theta[:, c].cpu()
        self.n_classes_ = c
        nll = self._nll_vs_identity(z, y, "validation")
        if n_params > z.shape[0] and nll < MEMORIZED_NLL_FRACTION * nll_ts:
            warnings.warn(
                f"{name}: {n_params:,} parameters fitted on {z.shape[0]:,} validation samples "
                f"reach a validation NLL of {nll:.3g}, below half of temperature scaling's "
                f"({nll_ts:.3g}): the map has memorised the validation labels (the ODIR "
                f"penalty per off-diagonal weight is lam / (C (C - 1)) = "
                f"{self.lam / (c * (c - 1)):.2g} here), and on other data it will likely be "
                "worse than no calibration; choose `lam` and `mu` by cross-validation "
                "(GridSearchCV maximises score()), fit on more samples, or use "
                "TemperatureScaling / VectorScaling", MemorizedValidationWarning, stacklevel=2)
        return self

    def _transform(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated logits ``phi(z) W^T + b`` (float64 inside, the logits' dtype out)."""
        check_n_classes(z, self.n_classes_)
        w = self.weight_.to(z.device)
        b = self.bias_.to(z.device)
        return (self._features(z) @ w.T + b).to(z.dtype)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings, W and b)."""
        self._check_fitted()
        return {**self._header(), "weight": self.weight_.tolist(), "bias": self.bias_.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _LinearCalibrator:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("reg", "lam", "mu", "max_iter", "weight", "bias"))
        obj = cls(reg=d["reg"], lam=d["lam"], mu=d["mu"], max_iter=d["max_iter"])
        bias = float_list(d["bias"], "d['bias']")
        c = len(bias)
        if c < 2 or not isinstance(d["weight"], list) or len(d["weight"]) != c:
            raise ValueError(
                f"Expected `d['weight']` to be a {c} x {c} list of lists matching `d['bias']`"
            )
        rows = [float_list(r, f"d['weight'][{i}]", length=c) for i, r in enumerate(d["weight"])]
        obj.weight_ = torch.tensor(rows, dtype=torch.float64)
        obj.bias_ = torch.tensor(bias, dtype=torch.float64)
        obj.n_classes_ = c
        return obj


class MatrixScaling(_LinearCalibrator):
    """Matrix scaling: calibrated logits ``z' = W z + b`` with a full (C, C) matrix.

    Fitted on the float64 validation NLL like :class:`DirichletCalibration` (same arguments,
    attributes and optimiser), optionally with Kull et al.'s ODIR regulariser
    (``reg="odir"``, the paper's "MS-ODIR"); ``reg`` defaults to ``"none"``, Guo et al.'s
    matrix scaling.  It contains vector scaling (diagonal W) and temperature scaling
    (``W = I / T``, where the fit starts), so its validation NLL is never above theirs; with
    ``C^2 + C`` parameters it over-fits small validation sets unless regularised.  The bias
    (and off-diagonal terms) can change the arg-max, so accuracy can change.

    Example:
        >>> z = torch.tensor([[2.0, 0.0]] * 4 + [[0.0, 2.0]] * 4)
        >>> ms = MatrixScaling().fit(z, torch.tensor([0, 0, 0, 1, 1, 1, 1, 0]))
        >>> ms.predict_proba(z[[0, 4]]).round(decimals=4)  # the label frequencies, 3/4 each
        tensor([[0.7500, 0.2500],
                [0.2500, 0.7500]])
    """

    def __init__(self, reg: str = "none", lam: float = 0.01, mu: float = 0.01,
                 max_iter: int = 1000) -> None:
        super().__init__(reg=reg, lam=lam, mu=mu, max_iter=max_iter)


class DirichletCalibration(_LinearCalibrator):
    """Dirichlet calibration (Kull et al. 2019): ``q = softmax(W log p + b)``, ``p = softmax(z)``.

    A linear map of the log-probabilities (the log of a Dirichlet likelihood ratio), fitted on
    the float64 validation objective

    ``L(W, b) = -(1/N) sum_i log q_{i, y_i} + lam / (C (C - 1)) sum_{j != k} W_jk^2
    + mu / C sum_k b_k^2``

    with ``reg="odir"`` (Off-Diagonal and Intercept Regularisation, the paper's choice for
    neural networks; the normalisation is the authors' ``reg_norm=True``), or the NLL alone
    with ``reg="none"``.  The diagonal of W is not penalised, so temperature scaling
    (``W = I / T``, ``b = 0``, where the fit starts) costs no penalty and the fitted validation
    NLL is never above temperature scaling's.  Every row of W has its own parameters (no
    reference row), as in the paper's formula; ``log p`` comes from ``log_softmax`` of the
    logits, so no clipping of ``p`` is needed.  ``lam`` and ``mu`` are the knobs to tune by
    cross-validation (e.g. with scikit-learn's ``GridSearchCV``, which maximises
    :meth:`score`).  Up to 20 classes the fit is Newton's method with the exact Hessian
    (to machine precision in a few steps; its ``(C (C + 1))^2`` entries cost ``N C^4``),
    above that truncated Newton (conjugate gradients on Hessian-vector products, preconditioned
    by the Hessian's per-class blocks up to about 368 classes, by its diagonal above).

    With ``C (C + 1)`` parameters it needs many validation samples: when it has more parameters
    than samples and its validation NLL ends below half of temperature scaling's, it has
    memorised the labels and warns (:class:`~torchcal.posthoc.MemorizedValidationWarning`);
    such a fit stops at the gradient every fit must reach (1e-6) rather than 1e-10, as its
    minimum lies at ever larger weights.  The ODIR penalty per off-diagonal weight,
    ``lam / (C (C - 1))``, vanishes at many classes, so choose ``lam`` and ``mu`` by
    cross-validation there.  Measured with the defaults
    (``benchmarks/bench_dirichlet_many_classes.py``, 1 thread): C = 21 and N = 2,000 in 0.1 s,
    equal to dirichletcal's fit (held-out NLL within 1e-12); C = 100 and N = 5,000 in 12 s;
    C = 1,000 and N = 5,000 (memorised) in 731 s on 2 threads.

    Args:
        reg: ``"odir"`` (default) or ``"none"``.
        lam: weight of the off-diagonal entries of W.
        mu: weight of the bias.
        max_iter: Newton steps; running out with the gradient above 1e-6 raises
            :class:`~torchcal.posthoc.CalibrationError` with the reason.

    Attributes:
        weight_ (torch.Tensor): (C, C) float64 W.
        bias_ (torch.Tensor): (C,) float64 b.
        n_classes_ (int): C.

    Example:
        >>> z = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]] * 4)
        >>> y = torch.tensor([0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1])  # right half the time
        >>> dc = DirichletCalibration().fit(z, y)
        >>> dc.predict_proba(z[:2]).round(decimals=4)
        tensor([[0.5000, 0.2500, 0.2500],
                [0.2500, 0.5000, 0.2500]])
        >>> dc.weight_.round(decimals=4)  # ODIR keeps W diagonal: a temperature here
        tensor([[0.3466, 0.0000, 0.0000],
                [0.0000, 0.3466, 0.0000],
                [0.0000, 0.0000, 0.3466]], dtype=torch.float64)
    """

    _log_probs = True

    def __init__(self, reg: str = "odir", lam: float = 0.01, mu: float = 0.01,
                 max_iter: int = 1000) -> None:
        super().__init__(reg=reg, lam=lam, mu=mu, max_iter=max_iter)
