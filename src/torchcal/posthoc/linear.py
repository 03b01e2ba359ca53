"""Full linear maps of the logits or log-probabilities: matrix scaling (Guo et al. 2017) and
Dirichlet calibration (Kull et al. 2019), with the ODIR regulariser."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from .._validation import check_nonneg_finite, check_positive_int
from ..errors import CalibrationFitError, MemorizedValidationWarning
from ._checks import PARAMETER_BOUNDS, absent_classes, check_choice, check_n_classes, float_list
from ._fitting import GRAD_TOL, backtrack, cv_folds
from ._layout import CHUNK_ELEMENTS, row_chunks
from .base import Calibrator
from .temperature import fit_nll
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


class _Rows:
    """The rows of a linear fit: features ``x_i = [phi(z_i), 1]`` (float64, D = C + 1),
    labels and optional weights, visited chunk by chunk (``CHUNK_ELEMENTS`` numbers of x):
    a dense input is never turned into a float64 copy as a whole.  One chunk (small inputs)
    keeps x in memory and uses the unchunked arithmetic."""

    def __init__(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None,
                 log_probs: bool) -> None:
        self.z, self.y, self.w, self.log_probs = z, y, w, log_probs
        self.n, self.d = z.shape[0], z.shape[1] + 1
        self.chunks = row_chunks(self.n, self.d)
        self.total = float(self.n) if w is None else float(w.sum())
        self._x = self._features(z) if len(self.chunks) == 1 else None

    def _features(self, z: torch.Tensor) -> torch.Tensor:
        z64 = z.to(torch.float64)
        f = torch.log_softmax(z64, dim=1) if self.log_probs else z64
        return torch.cat([f, f.new_ones(f.shape[0], 1)], 1)

    @property
    def single(self) -> bool:
        return self._x is not None and self.w is None

    def subset(self, idx: torch.Tensor) -> _Rows:
        return _Rows(self.z[idx], self.y[idx], None if self.w is None else self.w[idx],
                     self.log_probs)

    def parts(self) -> Any:
        """``(x, y, w or None)`` per chunk."""
        for sl in self.chunks:
            x = self._x if self._x is not None else self._features(self.z[sl])
            yield x, self.y[sl], None if self.w is None else self.w[sl]

    def x_all(self) -> torch.Tensor:
        """Every row's features (one chunk: kept in memory)."""
        return self._x if self._x is not None else self._features(self.z)

    def ce_sum(self, theta: torch.Tensor) -> float:
        """``sum_i w_i CE(x_i theta^T, y_i)`` (weights 1 when None)."""
        tot = 0.0
        for x, y, w in self.parts():
            ce = F.cross_entropy(x @ theta.T, y, reduction="none")
            tot += float(ce.sum() if w is None else (ce * w).sum())
        return tot

    def objective(self, theta: torch.Tensor, pen: torch.Tensor) -> float:
        if self.single:
            assert self._x is not None
            return float(F.cross_entropy(self._x @ theta.T, self.y) + (pen * theta * theta).sum())
        return self.ce_sum(theta) / self.total + float((pen * theta * theta).sum())

    def grad(self, theta: torch.Tensor, pen: torch.Tensor) -> torch.Tensor:
        """The gradient (K, D) of the penalised (weighted) mean cross-entropy."""
        k = theta.shape[0]
        acc = torch.zeros_like(theta)
        for x, y, w in self.parts():
            r = torch.softmax(x @ theta.T, dim=1) - F.one_hot(y, k).to(torch.float64)
            if w is not None:
                r = r * w.unsqueeze(1)
            if self.single:
                return r.T @ x / self.n + 2 * pen * theta
            acc += r.T @ x
        return acc / self.total + 2 * pen * theta

    def hessian(self, theta: torch.Tensor) -> torch.Tensor:
        """The cross-entropy's Hessian (K D, K D) ``(1/W) sum_i w_i (diag q_i - q_i q_i^T) (x)
        x_i x_i^T`` (rows of ``m = q (x) x`` in chunks of about ``CHUNK_ELEMENTS``)."""
        k, d = theta.shape
        if self.single:  # the unchunked arithmetic of small inputs
            assert self._x is not None
            x, n = self._x, self.n
            q = torch.softmax(x @ theta.T, dim=1)
            m = (q.unsqueeze(2) * x.unsqueeze(1)).reshape(n, k * d)
            hess = -(m.T @ m) / n
            blocks = (q.T.unsqueeze(2) * x).transpose(1, 2) @ x / n
        else:
            hess = torch.zeros(k * d, k * d, dtype=torch.float64, device=theta.device)
            blocks = torch.zeros(k, d, d, dtype=torch.float64, device=theta.device)
            step = max(1, CHUNK_ELEMENTS // (k * d))
            for x, _, w in self.parts():
                for a in range(0, x.shape[0], step):
                    xs = x[a:a + step]
                    q = torch.softmax(xs @ theta.T, dim=1)
                    q_w = q if w is None else q * w[a:a + step].unsqueeze(1)
                    m = (q.unsqueeze(2) * xs.unsqueeze(1)).reshape(xs.shape[0], k * d)
                    mw = (q_w.unsqueeze(2) * xs.unsqueeze(1)).reshape(xs.shape[0], k * d)
                    hess -= mw.T @ m
                    blocks += (q_w.T.unsqueeze(2) * xs).transpose(1, 2) @ xs
            hess /= self.total
            blocks /= self.total
        hv = hess.view(k, d, k, d)
        idx = torch.arange(k, device=theta.device)
        hv[idx, :, idx, :] += blocks
        return hess

    def hvp(self, theta: torch.Tensor, q_single: torch.Tensor | None, v: torch.Tensor
            ) -> torch.Tensor:
        """``H[V] = (1/W) sum_i w_i (q_i * s_i - q_i (q_i . s_i)) x_i^T`` (``s = x V^T``); q
        recomputed per chunk unless ``q_single`` (one chunk) is given."""
        acc = torch.zeros_like(v)
        for x, _, w in self.parts():
            q = q_single if q_single is not None else torch.softmax(x @ theta.T, dim=1)
            s = x @ v.T
            r = q * (s - (q * s).sum(1, keepdim=True))
            if w is not None:
                r = r * w.unsqueeze(1)
            if self.single:
                return r.T @ x / self.n
            acc += r.T @ x
        return acc / self.total

    def curvature(self, theta: torch.Tensor, kd2_max: int) -> tuple[str, torch.Tensor]:
        """The Hessian's (K, D, D) diagonal blocks ``(1/W) sum_i w_i q_ik (1 - q_ik) x_i
        x_i^T`` (``("blocks", ...)``), or its (K, D) diagonal when ``K D^2 > kd2_max``."""
        k, d = theta.shape
        diag = k * d * d > kd2_max
        acc = torch.zeros((k, d) if diag else (k, d, d), dtype=torch.float64,
                          device=theta.device)
        for x, _, w in self.parts():
            q = torch.softmax(x @ theta.T, dim=1)
            wq = q * (1 - q)
            if w is not None:
                wq = wq * w.unsqueeze(1)
            if diag:
                acc += wq.T @ (x * x)
                continue
            n = x.shape[0]
            chunk = max(1, (1 << 24) // (n * d)) if self.single else max(
                1, CHUNK_ELEMENTS // (n * d))
            acc += torch.cat([(wq.T[a:a + chunk].unsqueeze(2) * x).transpose(1, 2) @ x
                              for a in range(0, k, chunk)])
        return ("diag" if diag else "blocks"), acc / (self.n if self.single else self.total)


def newton_softmax_fit(rows: _Rows, theta: torch.Tensor,
                       pen: torch.Tensor, *, max_iter: int, name: str, hint: str = "",
                       grad_stop: float = NEWTON_GRAD_STOP) -> torch.Tensor:
    """Minimise ``CE(x theta^T, y) + sum(pen * theta^2)`` over theta (K, D) by damped Newton.

    The Hessian of the (weighted) mean cross-entropy is ``(1/W) sum_i w_i (diag q_i - q_i
    q_i^T) (x) x_i x_i^T`` (:meth:`_Rows.hessian`); the step solves it by an
    eigen-decomposition that drops the directions the objective is flat along (adding one
    vector to every row of theta changes no softmax), and a backtracking line search keeps
    every step a descent.  Stops at a gradient of ``grad_stop`` (default 1e-10; the
    cross-validation's fits stop at ``GRAD_TOL``), or when no step decreases the objective
    any more (machine precision); raises :class:`CalibrationFitError` if ``max_iter`` steps
    leave the gradient above ``GRAD_TOL``.  (The stop at 1e-10 is below the acceptance
    ``GRAD_TOL``, unlike L-BFGS's before issue 43: Newton converges quadratically, so the
    last decades cost one or two steps.)
    """
    f = rows.objective(theta, pen)
    grad = torch.full_like(theta, math.inf)
    for _ in range(max_iter):
        grad = rows.grad(theta, pen)
        if float(grad.abs().max()) <= grad_stop:
            break
        hess = rows.hessian(theta)
        # flat: relative to the cross-entropy's curvature (its largest diagonal entry), not to
        # the penalised Hessian's: a large penalty (lam = 1e8) would drop real directions
        flat = float(hess.diagonal().max()) * 1e-12
        hess.diagonal().add_(2 * pen.reshape(-1))
        evals, evecs = torch.linalg.eigh(hess)
        keep = evals > flat
        g = grad.reshape(-1)
        step = (evecs[:, keep] @ ((evecs[:, keep].T @ g) / evals[keep])).view(theta.shape)
        moved = backtrack(lambda th: rows.objective(th, pen), theta, f, step,
                          float(g @ step.reshape(-1)))
        if moved is None:
            break
        theta, f = moved
    else:
        grad = rows.grad(theta, pen)
    _check_newton_result(f, float(grad.abs().max()), max_iter, name, hint)
    return theta


def _block_preconditioner(rows: _Rows, theta: torch.Tensor, pen: torch.Tensor) -> Any:
    """``r -> M^{-1} r`` with M the Hessian's K diagonal (D, D) blocks
    ``(1/W) sum_i w_i q_ik (1 - q_ik) x_i x_i^T + 2 diag(pen_k)`` (Cholesky factors, K D^2
    memory, built in chunks); the Hessian's diagonal alone when K D^2 exceeds
    ``BLOCK_PRECONDITIONER_MAX``."""
    kind, acc = rows.curvature(theta, BLOCK_PRECONDITIONER_MAX)
    if kind == "diag":
        diag = acc + 2 * pen + 1e-12
        return lambda r: r / diag
    acc.diagonal(dim1=1, dim2=2).add_(2 * pen + 1e-10)
    factor = torch.linalg.cholesky(acc)
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


def newton_cg_softmax_fit(rows: _Rows, theta: torch.Tensor,
                          pen: torch.Tensor, *, max_iter: int, name: str, hint: str = "",
                          memorised_below: float = -math.inf,
                          grad_stop: float = NEWTON_GRAD_STOP) -> torch.Tensor:
    """:func:`newton_softmax_fit` without the Hessian: truncated Newton.

    Each step solves ``H p = g`` by conjugate gradients with Hessian-vector products
    ``H[V] = (1/N) ((q * s - q (q . s))^T x) + 2 pen * V`` (``s = x V^T``; ``N K D`` each;
    chunk by chunk for a large input, q recomputed per chunk) and the Hessian's diagonal
    blocks as preconditioner, to a residual ``min(0.5, sqrt|g|) |g|`` (super-linear
    convergence), then the same backtracking line search.  Stops at a gradient of
    ``NEWTON_GRAD_STOP`` or when no step decreases the objective; raises
    :class:`CalibrationFitError` if ``max_iter`` steps leave the gradient above ``GRAD_TOL``.

    A fit that memorises its labels (the objective below ``memorised_below``, which the caller
    sets when there are more parameters than samples) stops at ``GRAD_TOL``: its minimum lies
    at ever larger weights (the labels separated, only a vanishing penalty holding them), each
    further decade of the gradient costs more Newton steps than the last (C = 1,000, N = 5,000:
    minutes each), and the result is useless anyway (the caller warns).
    """
    f = rows.objective(theta, pen)
    for _ in range(max_iter):
        grad = rows.grad(theta, pen)
        g_max = float(grad.abs().max())
        if g_max <= grad_stop or (f < memorised_below and g_max <= GRAD_TOL):
            break
        q1 = torch.softmax(rows.x_all() @ theta.T, dim=1) if rows.single else None

        def hvp(v: torch.Tensor, theta: torch.Tensor = theta,
                q1: torch.Tensor | None = q1) -> torch.Tensor:
            return rows.hvp(theta, q1, v) + 2 * pen * v

        precond = _block_preconditioner(rows, theta, pen)
        g_norm = float(grad.norm())
        step = _pcg(hvp, grad, precond, min(0.5, math.sqrt(g_norm)) * g_norm,
                    max_steps=max(50, min(500, grad.numel())))
        moved = backtrack(lambda th: rows.objective(th, pen), theta, f, step,
                          float((grad * step).sum()))
        if moved is None:
            break
        theta, f = moved
    grad = rows.grad(theta, pen)
    _check_newton_result(f, float(grad.abs().max()), max_iter, name, hint)
    return theta


def _check_newton_result(f: float, g_max: float, max_iter: int, name: str, hint: str) -> None:
    if not math.isfinite(f):
        raise CalibrationFitError(f"{name} failed: Newton's method reached a non-finite "
                               f"validation objective ({f!r})")
    if not g_max <= GRAD_TOL:
        raise CalibrationFitError(
            f"{name} failed: Newton's method stopped after at most {max_iter} steps with the "
            f"validation objective's gradient still {g_max:.3g} (> {GRAD_TOL:g}){hint}; "
            "increase `max_iter` or regularise more (`reg='odir'`, larger `lam` / `mu`)"
        )


#: The values ``lam="cv"`` / ``mu="cv"`` search: one per decade from 1e-2 to 1e8 (Kull et
#: al. 2019 choose both by cross-validation on a log grid; at C = 50 and 1,500 samples the
#: best ``lam`` lies at 1e5-1e6, so the grid reaches two decades beyond).
CV_GRID = tuple(10.0 ** k for k in range(-2, 9))
#: The grid search stops once this many consecutive values (from the largest down) score worse
#: than the best so far: the held-out NLL is unimodal in the penalty, and the small penalties
#: left out are the slow, memorising fits.
CV_PATIENCE = 2


def _penalty(c: int, reg: str, lam: float, mu: float, device: Any) -> torch.Tensor:
    """ODIR's per-parameter weights of ``theta = [W | b]`` (C, C + 1): ``lam / (C (C - 1))``
    off the diagonal, 0 on it, ``mu / C`` on the bias (all 0 with ``reg="none"``)."""
    pen = torch.zeros(c, c + 1, dtype=torch.float64, device=device)
    if reg == "odir":
        pen[:, :c] = lam / (c * (c - 1))
        pen[:, :c].fill_diagonal_(0.0)
        pen[:, c] = mu / c
    return pen


def _solve(rows: _Rows, theta: torch.Tensor, pen: torch.Tensor, *,
           max_iter: int, name: str, hint: str, memorised_below: float,
           grad_stop: float = NEWTON_GRAD_STOP) -> torch.Tensor:
    """The penalised softmax fit from ``theta``: exact Newton up to ``NEWTON_MAX_CLASSES``
    classes, truncated Newton above."""
    if theta.shape[0] <= NEWTON_MAX_CLASSES:
        return newton_softmax_fit(rows, theta, pen, max_iter=max_iter, name=name, hint=hint,
                                  grad_stop=grad_stop)
    return newton_cg_softmax_fit(rows, theta, pen, max_iter=max_iter, name=name, hint=hint,
                                 memorised_below=memorised_below, grad_stop=grad_stop)


def _ts_start(rows: _Rows) -> tuple[torch.Tensor, float]:
    """Temperature scaling's solution ``W = I / T``, ``b = 0`` (softmax(log p / T) =
    softmax(z / T), so the same T serves both maps; no ODIR penalty there) and its NLL."""
    z = rows.z
    c = z.shape[1]
    theta = torch.zeros(c, c + 1, dtype=torch.float64, device=z.device)
    theta[:, :c] = torch.eye(c, dtype=torch.float64, device=z.device) / fit_nll(z, rows.y,
                                                                                rows.w)
    return theta, rows.objective(theta, torch.zeros_like(theta))


class _LinearCalibrator(Calibrator):
    """``q = softmax(W phi(z) + b)`` with W (C, C) and b (C,) fitted by regularised NLL."""

    _fitted_attr = "weight_"
    changes_argmax = True  # a full linear map (and its bias) moves the decision boundaries
    _log_probs: bool = False  # phi = log_softmax (Dirichlet) or the identity (matrix scaling)

    def __init__(self, reg: str, lam: float | str, mu: float | str, max_iter: int,
                 cv: int) -> None:
        self.reg = reg
        self.lam = lam
        self.mu = mu
        self.max_iter = max_iter
        self.cv = cv
        self._settings()

    def _settings(self) -> tuple[str, float | str, float | str, int, int]:
        """The settings, checked (at construction, and at fit: ``set_params`` does not)."""
        def penalty(v: Any, name: str) -> float | str:
            return "cv" if isinstance(v, str) and v == "cv" else check_nonneg_finite(v, name)
        cv = check_positive_int(self.cv, "cv")
        if cv < 2:
            raise ValueError(f"Expected `cv` (cross-validation folds) to be >= 2, got {cv}")
        return (check_choice(self.reg, "reg", _REGS), penalty(self.lam, "lam"),
                penalty(self.mu, "mu"), check_positive_int(self.max_iter, "max_iter"), cv)

    def _fit(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None) -> None:
        """Fit W and b on validated rows ``z`` (M, C), ``y`` (M,) and weights (or None).

        ``lam="cv"`` / ``mu="cv"`` are first chosen by ``cv``-fold cross-validation
        (see the class docstring); the chosen values are ``lam_`` / ``mu_``."""
        reg, lam, mu, max_iter, cv = self._settings()
        c = z.shape[1]
        # features with a column of ones: theta = [W | b], shape (C, C + 1)
        rows = _Rows(z, y, w, self._log_probs)
        self.cv_scores_ = None
        if reg == "odir" and "cv" in (lam, mu):
            with warnings.catch_warnings():  # the folds' fits: the final fit warns for them
                warnings.simplefilter("ignore")
                lam, mu = self._cross_validate(rows, lam, mu, cv, max_iter)
        lam, mu = (0.0, 0.0) if reg == "none" else (float(lam), float(mu))
        theta, nll_ts = _ts_start(rows)
        name = type(self).__name__
        hint = absent_hint(absent_classes(y, c)) if (reg == "none" or mu == 0) else ""
        n_params = c * (c + 1)
        memorised = n_params > z.shape[0]
        theta = _solve(rows, theta, _penalty(c, reg, lam, mu, z.device), max_iter=max_iter,
                       name=name, hint=hint,
                       memorised_below=MEMORIZED_NLL_FRACTION * nll_ts if memorised else -math.inf)
        self.weight_ = theta[:, :c].cpu()
        self.bias_ = theta[:, c].cpu()
        self.n_classes_ = c
        self.lam_, self.mu_ = lam, mu
        nll = self._nll_vs_identity(z, y, "validation", w)
        if memorised and nll < MEMORIZED_NLL_FRACTION * nll_ts:
            warnings.warn(
                f"{name}: {n_params:,} parameters fitted on {z.shape[0]:,} validation samples "
                f"reach a validation NLL of {nll:.3g}, below half of temperature scaling's "
                f"({nll_ts:.3g}): the map has memorised the validation labels (the ODIR "
                f"penalty per off-diagonal weight is lam / (C (C - 1)) = "
                f"{lam / (c * (c - 1)):.2g} here), and on other data it will likely be "
                "worse than no calibration; choose `lam` and `mu` by cross-validation "
                "(lam='cv', mu='cv', the default), fit on more samples, or use "
                "TemperatureScaling / VectorScaling", MemorizedValidationWarning, stacklevel=3)

    def _cross_validate(self, rows: _Rows, lam: float | str, mu: float | str, cv: int,
                        max_iter: int) -> tuple[float, float]:
        """Choose the ``"cv"`` penalties by ``cv``-fold cross-validation of the NLL.

        The folds are :func:`~torchcal.posthoc.cv_folds`'s.  Each value of ``CV_GRID`` is
        tried from the largest down, every fold's fit starting from its fit at the previous
        value and stopping at a gradient of ``GRAD_TOL`` (1e-6: the held-out NLLs compared
        differ far more than such a fit from the exact optimum); the search stops after ``CV_PATIENCE`` values worse
        than the best.  With both ``"cv"``, ``lam = mu`` is searched first, then ``mu`` with
        that ``lam``.  Sets ``cv_scores_`` (``{(lam, mu): held-out NLL}``); returns the best
        ``(lam, mu)`` (ties: the larger penalty)."""
        z = rows.z
        n = z.shape[0]
        if n < 2 * cv:
            raise ValueError(f"Expected at least 2 * cv = {2 * cv} validation samples to choose "
                             f"`lam`/`mu` by {cv}-fold cross-validation, got {n}; pass fixed "
                             "values (e.g. lam=0.01, mu=0.01)")
        folds = cv_folds(n, cv, z.device)
        trains = [torch.cat(folds[:i] + folds[i + 1:]) for i in range(cv)]
        thetas = [_ts_start(rows.subset(t))[0] for t in trains]
        scores: dict[tuple[float, float], float] = {}
        name = f"{type(self).__name__} (cross-validation)"

        def held_out(pair: tuple[float, float]) -> float:
            total = 0.0
            for i, (tr, te) in enumerate(zip(trains, folds, strict=True)):
                try:
                    thetas[i] = _solve(rows.subset(tr), thetas[i], _penalty(
                        z.shape[1], "odir", *pair, z.device), max_iter=max_iter, name=name,
                        hint="", memorised_below=-math.inf, grad_stop=GRAD_TOL)
                except CalibrationFitError:
                    return math.inf
                total += rows.subset(te).ce_sum(thetas[i])
            return total / rows.total

        def sweep(pairs: list[tuple[float, float]]) -> tuple[float, float]:
            """Score ``pairs`` in order until ``CV_PATIENCE`` in a row are worse than the best
            of this sweep; returns that best."""
            best: tuple[float, float] | None = None
            worse = 0
            for pair in pairs:
                if pair not in scores:
                    scores[pair] = held_out(pair)
                if best is None or scores[pair] < scores[best]:  # ties: the larger penalty
                    best, worse = pair, 0
                else:
                    worse += 1
                    if worse >= CV_PATIENCE:
                        break
            assert best is not None
            return best

        grid = sorted(CV_GRID, reverse=True)
        if lam == "cv" and mu == "cv":
            lam, _ = sweep([(g, g) for g in grid])
            self._restart(thetas, trains, rows)
            sweep([(lam, g) for g in grid])
        elif lam == "cv":
            sweep([(g, float(mu)) for g in grid])
        else:
            sweep([(float(lam), g) for g in grid])
        self.cv_scores_ = scores
        # the smallest held-out NLL of every pair tried (ties: the larger penalties)
        return min(scores, key=lambda p: (scores[p], -p[0], -p[1]))

    @staticmethod
    def _restart(thetas: list[torch.Tensor], trains: list[torch.Tensor], rows: _Rows) -> None:
        """Every fold's start back at temperature scaling (a new sweep from a large penalty)."""
        for i, t in enumerate(trains):
            thetas[i] = _ts_start(rows.subset(t))[0]

    def _transform(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated logits ``phi(z) W^T + b`` (float64 inside, the logits' dtype out)."""
        check_n_classes(z, self.n_classes_)
        w = self.weight_.to(z.device)
        b = self.bias_.to(z.device)
        z64 = z.to(torch.float64)
        phi = torch.log_softmax(z64, dim=1) if self._log_probs else z64
        return (phi @ w.T + b).to(z.dtype)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings, the penalties used, W and b)."""
        self._check_fitted()
        return {**self._header(), "lam_": self.lam_, "mu_": self.mu_,
                "weight": self.weight_.tolist(), "bias": self.bias_.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _LinearCalibrator:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output (every weight and bias
        checked: finite, of magnitude at most ``MAX_PARAMETER``)."""
        cls._check_dict(d, ("reg", "lam", "mu", "max_iter", "weight", "bias"))
        obj = cls(reg=d["reg"], lam=d["lam"], mu=d["mu"], max_iter=d["max_iter"],
                  cv=d.get("cv", 5))
        bias = float_list(d["bias"], "d['bias']", bounds=PARAMETER_BOUNDS)
        c = len(bias)
        if c < 2 or not isinstance(d["weight"], list) or len(d["weight"]) != c:
            raise ValueError(
                f"Expected `d['weight']` to be a {c} x {c} list of lists matching `d['bias']`"
            )
        rows = [float_list(r, f"d['weight'][{i}]", length=c, bounds=PARAMETER_BOUNDS)
                for i, r in enumerate(d["weight"])]
        obj.weight_ = torch.tensor(rows, dtype=torch.float64)
        obj.bias_ = torch.tensor(bias, dtype=torch.float64)
        obj.n_classes_ = c
        obj.lam_ = check_nonneg_finite(d.get("lam_", 0.0 if d["lam"] == "cv" else d["lam"]),
                                       "d['lam_']")
        obj.mu_ = check_nonneg_finite(d.get("mu_", 0.0 if d["mu"] == "cv" else d["mu"]),
                                      "d['mu_']")
        obj.cv_scores_ = None
        return obj


class MatrixScaling(_LinearCalibrator):
    """Matrix scaling: calibrated logits ``z' = W z + b`` with a full (C, C) matrix.

    Fitted on the float64 validation NLL like :class:`DirichletCalibration` (same arguments,
    attributes, optimiser and defaults): Kull et al.'s ODIR regulariser (``reg="odir"``, the
    paper's "MS-ODIR") with ``lam`` and ``mu`` chosen by cross-validation; ``reg="none"`` is
    Guo et al.'s unregularised matrix scaling.  It contains vector scaling (diagonal W) and
    temperature scaling (``W = I / T``, where the fit starts), so its validation NLL is never
    above theirs; with ``C^2 + C`` parameters it over-fits small validation sets unless
    regularised (unregularised at C = 50 and 1,500 samples its held-out NLL is 4.45 where no
    calibration gives 3.52; the cross-validated default gives 2.98).  The bias (and
    off-diagonal terms) can change the arg-max, so accuracy can change.

    Example:
        >>> z = torch.tensor([[2.0, 0.0]] * 4 + [[0.0, 2.0]] * 4)
        >>> ms = MatrixScaling(lam=0.01, mu=0.01).fit(z, torch.tensor([0, 0, 0, 1, 1, 1, 1, 0]))
        >>> ms.predict_proba(z[[0, 4]]).round(decimals=4)  # the label frequencies, 3/4 each
        tensor([[0.7500, 0.2500],
                [0.2500, 0.7500]])
    """

    def __init__(self, reg: str = "odir", lam: float | str = "cv", mu: float | str = "cv",
                 max_iter: int = 1000, cv: int = 5) -> None:
        super().__init__(reg=reg, lam=lam, mu=mu, max_iter=max_iter, cv=cv)


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
    logits, so no clipping of ``p`` is needed.  Up to 20 classes the fit is Newton's method
    with the exact Hessian (to machine precision in a few steps; its ``(C (C + 1))^2`` entries
    cost ``N C^4``), above that truncated Newton (conjugate gradients on Hessian-vector
    products, preconditioned by the Hessian's per-class blocks up to about 368 classes, by its
    diagonal above).

    **lam and mu by cross-validation (the default).**  ``lam="cv"`` / ``mu="cv"`` choose them
    as Kull et al. 2019 do: ``cv``-fold cross-validation of the NLL (5 folds, a fixed
    permutation) over the log grid ``CV_GRID`` = 1e-2, 1e-1, ..., 1e8 (one value per decade),
    searched from the largest value down (each fold's fit starting from its fit at the value
    before) and stopped after two values worse than the best; with both ``"cv"``, ``lam = mu``
    is searched first, then ``mu`` with that ``lam``; ties go to the larger penalty.  The
    chosen values are ``lam_`` and ``mu_``, the held-out NLL of every pair tried
    ``cv_scores_``.  The grid reaches far: the penalty per off-diagonal weight is
    ``lam / (C (C - 1))``, so many classes and few samples need a large ``lam`` (C = 50 and
    1,500 samples: 1e5; C = 100: 1e8, W then diagonal).  There, with ``C (C + 1)``
    parameters, the former fixed default ``lam = mu = 0.01`` memorised the labels and was
    worse than no calibration on held-out data (held-out NLL 4.41 where none gives 3.52 and
    the cross-validated default 2.98; ``benchmarks/bench_linear_cv.py``,
    ``benchmarks/results/linear_cv.md``: better than no calibration on 5 of 5 seeds at
    C = 50 and C = 100, within 1.3 % of temperature scaling).  The search costs about 10 to 30
    fits (C = 50, N = 1,500: 3.5 s instead of 0.4 s; C = 100: 20 s instead of 4 s; 1 thread).
    Fixed values (``lam=0.01``) fit once, as before.

    With a fixed small ``lam`` and more parameters than samples, a fit whose validation NLL
    ends below half of temperature scaling's has memorised the labels and warns
    (:class:`~torchcal.posthoc.MemorizedValidationWarning`); such a fit stops at the gradient
    every fit must reach (1e-6) rather than 1e-10, as its minimum lies at ever larger weights.
    Measured with ``lam = mu = 0.01`` (one fit; ``benchmarks/bench_dirichlet_many_classes.py``,
    1 thread): C = 21 and N = 2,000 in 0.1 s, equal to dirichletcal's fit (held-out NLL within
    1e-12); C = 100 and N = 5,000 in 12 s; C = 1,000 and N = 5,000 (memorised) in 731 s on 2
    threads.

    Args:
        reg: ``"odir"`` (default) or ``"none"`` (no penalty: ``lam`` and ``mu`` unused).
        lam: weight of the off-diagonal entries of W: ``"cv"`` (default) or a number >= 0.
        mu: weight of the bias: ``"cv"`` (default) or a number >= 0.
        max_iter: Newton steps; running out with the gradient above 1e-6 raises
            :class:`~torchcal.posthoc.CalibrationFitError` with the reason.
        cv: folds of the cross-validation (>= 2; it needs at least ``2 * cv`` samples).

    Attributes:
        weight_ (torch.Tensor): (C, C) float64 W.
        bias_ (torch.Tensor): (C,) float64 b.
        n_classes_ (int): C.
        lam_ (float): the ``lam`` used (chosen by cross-validation for ``"cv"``).
        mu_ (float): the ``mu`` used.
        cv_scores_ (dict | None): ``{(lam, mu): held-out NLL}`` of the pairs cross-validated
            (None when nothing was).

    Example:
        >>> z = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]] * 4)
        >>> y = torch.tensor([0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1])  # right half the time
        >>> dc = DirichletCalibration(lam=0.01, mu=0.01).fit(z, y)
        >>> dc.predict_proba(z[:2]).round(decimals=4)
        tensor([[0.5000, 0.2500, 0.2500],
                [0.2500, 0.5000, 0.2500]])
        >>> dc.weight_.round(decimals=4)  # ODIR keeps W diagonal: a temperature here
        tensor([[0.3466, 0.0000, 0.0000],
                [0.0000, 0.3466, 0.0000],
                [0.0000, 0.0000, 0.3466]], dtype=torch.float64)
    """

    _log_probs = True

    def __init__(self, reg: str = "odir", lam: float | str = "cv", mu: float | str = "cv",
                 max_iter: int = 1000, cv: int = 5) -> None:
        super().__init__(reg=reg, lam=lam, mu=mu, max_iter=max_iter, cv=cv)
