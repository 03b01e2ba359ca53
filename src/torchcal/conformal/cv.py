"""CV+ and jackknife+ prediction intervals (Barber, Candès, Ramdas & Tibshirani 2021) for a
regression model refitted on every fold through a user callable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._validation import check_alpha, check_positive_int
from ..regression.predictive import as_float, like
from .core import conformal_quantile, conformal_rank

__all__ = ["cv_plus", "kfold_labels"]

#: (test points x training points) elements of one chunk of the interval computation.
_CHUNK = 1 << 22


def kfold_labels(n: int, n_folds: int, random_state: Any = None) -> torch.Tensor:
    """(n,) fold labels 0..K-1: scikit-learn's ``KFold(n_folds)`` folds (contiguous, the first
    ``n % K`` folds one point larger) of the points in order (``random_state=None``) or of a
    seeded permutation (an int).

    >>> kfold_labels(7, 3).tolist()
    [0, 0, 0, 1, 1, 2, 2]
    """
    sizes = torch.full((n_folds,), n // n_folds, dtype=torch.int64)
    sizes[: n % n_folds] += 1
    labels = torch.repeat_interleave(torch.arange(n_folds), sizes)
    if random_state is None:
        return labels
    gen = torch.Generator().manual_seed(int(random_state))
    out = torch.empty_like(labels)
    out[torch.randperm(n, generator=gen)] = labels
    return out


def _take(x: Any, idx: torch.Tensor) -> Any:
    return x[idx] if isinstance(x, torch.Tensor) else x[idx.numpy()]


def _cat(a: Any, b: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.cat([a, torch.as_tensor(b, dtype=a.dtype, device=a.device)])
    return np.concatenate([a, np.asarray(b)])


def _check_xy(X: Any, y: Any, X_test: Any) -> tuple[int, int]:
    for name, v in (("X", X), ("X_test", X_test)):
        if not isinstance(v, (torch.Tensor, np.ndarray)):
            raise TypeError(f"Expected `{name}` to be a torch.Tensor or numpy.ndarray (indexed "
                            f"by rows), got {type(v).__name__}")
    if type(X) is not type(X_test):
        raise TypeError("Expected `X` and `X_test` of the same kind (both tensors or both "
                        "arrays)")
    n = int(X.shape[0])
    yt = as_float(y, "y")
    if yt.ndim != 1 or yt.shape[0] != n:
        raise ValueError(f"Expected `y` of shape ({n},) (one target per row of X), got "
                         f"{tuple(yt.shape)}")
    if not bool(torch.isfinite(yt).all()):
        raise ValueError("Expected `y` to be finite (no NaN/Inf)")
    return n, int(X_test.shape[0])


def _predict(fit_predict: Callable, X_tr: Any, y_tr: Any, X_ev: Any, m_ev: int,
             fold: int) -> torch.Tensor:
    out = as_float(fit_predict(X_tr, y_tr, X_ev), "fit_predict(...)")
    if out.shape != (m_ev,):
        raise ValueError(f"Expected `fit_predict` to return {m_ev} predictions (one per row of "
                         f"X_eval) for fold {fold}, got shape {tuple(out.shape)}")
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"Expected `fit_predict` to return finite predictions, fold {fold} "
                         "gave NaN/Inf")
    return out


def cv_plus(fit_predict: Callable[[Any, Any, Any], Any], X: Any, y: Any, X_test: Any, *,
            alpha: float = 0.1, n_folds: int | str = 10, folds: Any = None,
            random_state: Any = None) -> tuple[Any, Any]:
    r"""CV+ (K folds) or jackknife+ (``n_folds="jackknife"``: n folds of one point) intervals.

    For each fold k the model is refitted on the other folds, ``mu_{-k} = fit(X_{-k},
    y_{-k})``, giving each training point its out-of-fold residual ``R_i = |y_i -
    mu_{-k(i)}(x_i)|`` and each test point the K predictions ``mu_{-k}(x)``.  The interval is

    ``[ q^-_alpha {mu_{-k(i)}(x) - R_i},  q^+_{1-alpha} {mu_{-k(i)}(x) + R_i} ]``

    over i = 1..n: the ``k``-th largest of the lower values and the ``k``-th smallest of the
    upper values, ``k = ceil((n + 1)(1 - alpha))`` (:func:`~torchcal.conformal.conformal_quantile`;
    ``+-inf`` with a warning when ``k > n``).  This is MAPIE's ``CrossConformalRegressor``
    with ``method="plus"`` (its quantile at the level ``ceil((1 - alpha)(n + 1)) / n`` with
    NumPy's ``method="lower"`` on the negated lower values and on the upper values).

    **Guarantee** (Barber et al. 2021, Thms. 1 and 4): if the n training points and the test
    point are exchangeable and the fitting algorithm treats its training points symmetrically,
    the interval covers the test target with probability at least ``1 - 2 alpha`` (jackknife+),
    and at least ``1 - 2 alpha - min(2 (1 - 1/K) / (n / K + 1), (1 - K / n) / (K + 1))`` (CV+
    with K folds of n / K points); in practice the coverage is close to ``1 - alpha``.

    Args:
        fit_predict: ``fit_predict(X_train, y_train, X_eval) -> predictions`` on the rows of
            ``X_eval`` (a fresh model per call); ``X_*`` of the kind of ``X`` (rows of a tensor
            or an array), ``y_train`` of the kind of ``y``.  Called once per fold, with
            ``X_eval`` the held-out rows followed by ``X_test``.
        X: (n, ...) training inputs (a tensor or an array).
        y: (n,) training targets.
        X_test: (m, ...) test inputs, of the kind of ``X``.
        alpha: the miscoverage level in (0, 1).
        n_folds: K >= 2 folds, or ``"jackknife"`` (leave-one-out, K = n).
        folds: optional (n,) integer fold labels 0..K-1 (overrides ``n_folds``).
        random_state: None (scikit-learn ``KFold`` folds of the points in order) or an int
            (the folds of a seeded permutation).

    Returns:
        ``(lower, upper)`` of shape (m,) (NumPy when ``y`` is NumPy).

    >>> X = torch.arange(20.0).reshape(-1, 1); y = 2 * X[:, 0] + torch.tensor([0.5, -0.5] * 10)
    >>> def fit_predict(Xt, yt, Xe):  # the training mean plus the true slope
    ...     return (yt - 2 * Xt[:, 0]).mean() + 2 * Xe[:, 0]
    >>> lo, hi = cv_plus(fit_predict, X, y, torch.tensor([[30.0]]), alpha=0.2, n_folds=5)
    >>> lo.tolist(), hi.tolist()
    ([59.5], [60.5])
    """
    a = check_alpha(alpha)
    n, m = _check_xy(X, y, X_test)
    fold = _fold_labels(n, n_folds, folds, random_state)
    n_k = int(fold.max()) + 1
    yt = as_float(y, "y")
    residual = torch.empty(n, dtype=torch.float64)
    mu_test = torch.empty((n_k, m), dtype=torch.float64)
    for k in range(n_k):
        held = (fold == k).nonzero().flatten()
        train = (fold != k).nonzero().flatten()
        out = _predict(fit_predict, _take(X, train), _take(y, train),
                       _cat(_take(X, held), X_test), held.numel() + m, k).cpu().double()
        residual[held] = (yt[held].cpu().double() - out[: held.numel()]).abs()
        mu_test[k] = out[held.numel():]
    if conformal_rank(n, a) > n:
        inf = conformal_quantile(residual, a, where="cv_plus")
        lo, hi = torch.full((m,), -float(inf)), torch.full((m,), float(inf))
    else:
        lo, hi = _plus_bounds(mu_test, fold, residual, a)
    dtype = yt.dtype if yt.dtype == torch.float64 else torch.float32
    return like(lo.to(dtype), y), like(hi.to(dtype), y)


def _fold_labels(n: int, n_folds: Any, folds: Any, random_state: Any) -> torch.Tensor:
    if folds is not None:
        f = torch.as_tensor(np.asarray(folds) if not isinstance(folds, torch.Tensor) else folds)
        if f.shape != (n,) or f.is_floating_point() or f.dtype == torch.bool:
            raise ValueError(f"Expected `folds` to be ({n},) integer fold labels, got "
                             f"{f.dtype} {tuple(f.shape)}")
        f = f.to(torch.int64).cpu()
        if bool((f < 0).any()) or torch.unique(f).numel() != int(f.max()) + 1 or \
                torch.unique(f).numel() < 2:
            raise ValueError("Expected `folds` to use every label 0..K-1 with K >= 2, got "
                             f"{torch.unique(f)[:10].tolist()}")
        return f
    if n_folds == "jackknife":
        return torch.arange(n)
    k = check_positive_int(n_folds, "n_folds")
    if not 2 <= k <= n:
        raise ValueError(f"Expected `n_folds` in [2, n = {n}] or 'jackknife', got {n_folds!r}")
    return kfold_labels(n, k, random_state)


def _plus_bounds(mu_test: torch.Tensor, fold: torch.Tensor, residual: torch.Tensor,
                 alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The CV+ bounds of every test point, ``chunk`` test points at a time: (m, n) matrices of
    ``mu_{-k(i)}(x) -+ R_i`` reduced by one ``kthvalue`` each."""
    n, m = residual.numel(), mu_test.shape[1]
    per = max(1, _CHUNK // max(n, 1))
    lows, highs = [], []
    for a in range(0, m, per):
        mu = mu_test[:, a:a + per][fold].T  # (chunk, n): mu_{-k(i)}(x_j)
        lows.append(-conformal_quantile(residual - mu, alpha, dim=1, where="cv_plus"))
        highs.append(conformal_quantile(mu + residual, alpha, dim=1, where="cv_plus"))
    empty = torch.empty(0, dtype=torch.float64)
    return (torch.cat(lows) if lows else empty), (torch.cat(highs) if highs else empty)
