"""Conformal risk control (Angelopoulos et al. 2022) and Learn-then-Test (Angelopoulos et al.
2021) on a loss matrix over a grid of parameters ``lambda``.

Both take the calibration losses as an ``(n, L)`` matrix, ``losses[i, j] = L_i(lambda_j)``
(any leading batch dimensions ``(..., n, L)`` are independent problems, e.g. random splits),
so every risk with a finite grid of settings plugs in: the false-negative rate of multi-label
sets and segmentation masks, the token miscoverage of (N, T, C) sets
(:mod:`torchcal.conformal.losses`), a selective classifier's error among answered items, an
LLM's abstention rule.

* **CRC** (:func:`crc_index`, :class:`ConformalRiskControl`): for losses non-increasing in
  ``lambda`` and bounded above by ``B``, ``lambda_hat = inf{lambda : n/(n+1) R_n(lambda) +
  B/(n+1) <= alpha}`` gives ``E[L_{n+1}(lambda_hat)] <= alpha`` when the n calibration samples
  and the test sample are exchangeable (and the test loss at the grid's largest lambda is at
  most ``alpha``).  The guarantee is in expectation over calibration and test data.
* **LTT** (:func:`ltt_valid`, :class:`LearnThenTest`): for losses in [0, 1], monotone or not,
  one p-value per ``lambda`` for ``H_j : R(lambda_j) > alpha`` (Hoeffding-Bentkus or
  Hoeffding, from the empirical risk of n independent samples) and a family-wise error rate
  procedure (fixed-sequence, Bonferroni or Holm) return a set of lambdas with ``P(every
  returned lambda has R(lambda) <= alpha) >= 1 - delta`` over the calibration data.
* **Selective classification** (:class:`SelectiveRiskControl`): LTT on the conditional error
  among answered items.
* **Multi-label sets and masks** (:class:`MultiLabelRiskControl`): CRC for the false-negative
  rate (recall), LTT for the false-discovery rate (precision), thresholds as MAPIE's.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import numpy as np
import torch

from .._validation import as_tensor, check_alpha
from ..errors import InfiniteIntervalWarning
from ..posthoc import Estimator
from .losses import check_thresholds, false_discovery_rate, false_negative_rate

__all__ = ["crc_index", "binom_cdf", "check_choice", "like_input", "hb_p_values", "hoeffding_p_values", "fwer_reject",
           "ltt_valid", "ConformalRiskControl", "LearnThenTest", "MultiLabelRiskControl",
           "SelectiveRiskControl", "FWER_METHODS", "P_VALUES"]

#: The family-wise error rate procedures of :func:`fwer_reject`.
FWER_METHODS = ("fixed_sequence", "bonferroni", "holm")
#: The p-values of :func:`ltt_valid`: Hoeffding-Bentkus and Hoeffding.
P_VALUES = ("hb", "hoeffding")


def _losses(x: Any, name: str = "losses") -> torch.Tensor:
    t = as_tensor(x, name)
    if t.is_complex():
        raise TypeError(f"Expected `{name}` to be real, got dtype {t.dtype}")
    if t.ndim < 2 or t.shape[-1] == 0 or t.shape[-2] == 0:
        raise ValueError(f"Expected `{name}` of shape (..., n, L) with n, L >= 1 (samples by "
                         f"lambdas), got {tuple(t.shape)}")
    t = t.to(torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"Expected `{name}` to be finite (no NaN/Inf)")
    return t


def check_choice(value: Any, name: str, choices: tuple) -> str:
    """``value`` if it is one of ``choices``, else ValueError naming ``name``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"Expected `{name}` to be one of {list(choices)}, got {value!r}")
    return value


def like_input(out: torch.Tensor, ref: Any) -> Any:
    """``out`` as a NumPy array when ``ref`` was one (NumPy in, NumPy out)."""
    if isinstance(ref, np.ndarray):
        return out.detach().cpu().numpy()
    return out


def _positive(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not (0 < x < math.inf):
        raise ValueError(f"Expected `{name}` to be a finite number > 0, got {x!r}")
    return float(x)


def crc_index(losses: Any, alpha: Any, *, B: float = 1.0, monotonize: bool = False,
              where: str = "conformal risk control") -> torch.Tensor:
    """The conformal-risk-control choice: the first column ``j`` of the loss matrix with
    ``(sum_i losses[i, j] + B) / (n + 1) <= alpha``, i.e. ``lambda_hat = inf{lambda : n/(n+1)
    R_n(lambda) + B/(n+1) <= alpha}`` on a grid sorted by increasing ``lambda``.

    Guarantee (Angelopoulos et al. 2022, Thm. 1): if the n calibration samples and a test
    sample are exchangeable, every ``L_i`` is non-increasing in ``lambda`` with ``L_i <= B``,
    and the test loss at the grid's last lambda is at most ``alpha``, then ``E[L_{n+1}(
    lambda_hat)] <= alpha``.

    Args:
        losses: (..., n, L) losses ``L_i(lambda_j)``; leading dimensions are independent
            problems (one index each, in one vectorised pass).
        alpha: the risk level in (0, 1).
        B: the losses' upper bound (1 for rates).
        monotonize: a loss that increases along the grid is refused (ValueError) unless True:
            then each row is replaced by its running maximum from the right, ``max_{j' >= j}
            L_i(lambda_j')``, a non-increasing upper bound (the guarantee holds, conservatively).
        where: the caller's name in the warning.

    Returns the (...) column indices (int64).  When no column qualifies, the last (the most
    conservative) with :class:`~torchcal.errors.InfiniteIntervalWarning`, as
    :func:`~torchcal.conformal.conformal_quantile` returns ``+inf``: too few samples (``n + 1 <
    B / alpha``) or a risk above ``alpha`` everywhere on the grid.  With the 0-1 loss
    ``1{s_i > lambda}`` this is split conformal's quantile.

    >>> crc_index(torch.tensor([[1.0, 0.5, 0.0], [1.0, 0.0, 0.0]] * 5), 0.3)  # (5+1)/11 > .3
    tensor(2)
    """
    a = check_alpha(alpha)
    b = _positive(B, "B")
    x = _losses(losses)
    if bool((x > b).any()):
        raise ValueError(f"Expected `losses` to be at most B = {b:g}, got a maximum of "
                         f"{float(x.max()):g}")
    up = x[..., 1:] > x[..., :-1]
    if bool(up.any()):
        if not monotonize:
            raise ValueError(
                "Expected `losses` to be non-increasing along the lambda grid (last axis), as "
                f"conformal risk control requires; {int(up.sum())} step(s) increase. Sort the "
                "grid by increasing lambda, use LearnThenTest for a non-monotone loss, or pass "
                "monotonize=True to control the running maximum max_{lambda' >= lambda} L")
        x = x.flip(-1).cummax(-1).values.flip(-1)
    n = x.shape[-2]
    total = x.sum(-2) + b  # (..., L)
    ok = total <= a * (n + 1) * (1 + 1e-12)  # exact (n+1) alpha counts as reached
    idx = torch.where(ok.any(-1), ok.to(torch.int8).argmax(-1),
                      torch.full(ok.shape[:-1], x.shape[-1] - 1, dtype=torch.long))
    bad = ~ok.any(-1)
    if bool(bad.any()):
        lowest = float((total.amin(-1) / (n + 1))[bad].min())
        warnings.warn(
            f"{where}: no lambda of the grid qualifies in {int(bad.sum())} of {bad.numel()} "
            f"problem(s): n = {n}, B = {b:g}, alpha = {a}; the smallest bound n/(n+1) R_n + "
            f"B/(n+1) is {lowest:.4g} > alpha (at least {math.ceil(b / a) - 1} samples are "
            "needed even at zero risk). lambda_hat is the grid's most conservative lambda, "
            "whose risk is guaranteed only if its loss is <= alpha", InfiniteIntervalWarning,
            stacklevel=3)
    return idx


def binom_cdf(k: torch.Tensor, n: torch.Tensor, p: float) -> torch.Tensor:
    """``P(Binomial(n, p) <= k)`` elementwise for integer-valued tensors ``k`` and ``n``
    (float64), exact (log-space sums of the probability mass, one table per distinct ``n``).

    >>> binom_cdf(torch.tensor([1.0]), torch.tensor([3.0]), 0.5)  # (1 + 3) / 8
    tensor([0.5000], dtype=torch.float64)
    """
    k, n = torch.broadcast_tensors(k.to(torch.float64), n.to(torch.float64))
    u, inv = torch.unique(n.reshape(-1), return_inverse=True)
    top = int(u.max()) if u.numel() else 0
    j = torch.arange(top + 1, dtype=torch.float64)
    uu = u.unsqueeze(1)
    inside = j <= uu
    nj = torch.where(inside, uu - j, torch.zeros_like(uu - j))
    logpmf = (torch.lgamma(uu + 1) - torch.lgamma(j + 1) - torch.lgamma(nj + 1)
              + torch.xlogy(j, torch.tensor(p, dtype=torch.float64))
              + torch.xlogy(nj, torch.tensor(1 - p, dtype=torch.float64)))
    logcdf = torch.logcumsumexp(torch.where(inside, logpmf, -math.inf), 1)
    kk = k.reshape(-1).clamp(0, top).long()
    out = logcdf[inv, kk].exp().clamp(max=1.0).reshape(k.shape)
    out = torch.where(k < 0, torch.zeros_like(out), out)
    return torch.where(k >= n, torch.ones_like(out), out)


def _h1(r: torch.Tensor, a: float) -> torch.Tensor:
    """``h1(r, a) = r log(r/a) + (1-r) log((1-r)/(1-a))`` (Hoeffding's exponent), r <= a < 1."""
    return torch.xlogy(r, r / a) + torch.xlogy(1 - r, (1 - r) / (1 - a))


def hoeffding_p_values(risk_hat: torch.Tensor, n: Any, alpha: Any) -> torch.Tensor:
    """Hoeffding's p-value for ``H : R > alpha`` from the mean ``risk_hat`` of ``n``
    independent losses in [0, 1]: ``exp(-n h1(min(risk_hat, alpha), alpha))`` (the
    Kullback-Leibler form of Hoeffding 1963, tighter than ``exp(-2 n (alpha - risk_hat)^2)``);
    1 where ``n = 0``.  Valid: ``P(p <= u) <= u`` under ``H``.

    >>> round(float(hoeffding_p_values(torch.tensor(0.0), 10, 0.5)), 6)  # exp(10 log .5)
    0.000977
    """
    a = check_alpha(alpha)
    r = torch.as_tensor(risk_hat, dtype=torch.float64)
    nn = torch.as_tensor(n, dtype=torch.float64)
    return torch.exp(-nn * _h1(r.clamp(0, a), a)).clamp(max=1.0)


def hb_p_values(risk_hat: torch.Tensor, n: Any, alpha: Any, *, binary: bool = False,
                loss_sum: torch.Tensor | None = None) -> torch.Tensor:
    """The Hoeffding-Bentkus p-value of Learn-then-Test (Angelopoulos et al. 2021, Prop. 3)
    for ``H : R > alpha`` from the mean ``risk_hat`` of ``n`` independent losses in [0, 1]:
    ``min(exp(-n h1(min(risk_hat, alpha), alpha)), e * P(Bin(n, alpha) <= ceil(n risk_hat)))``.

    ``binary=True`` (losses in {0, 1}) drops the factor ``e`` (the exact binomial tail, as
    MAPIE's ``binary``).  ``loss_sum`` (``n * risk_hat`` computed as a sum) avoids rounding
    ``n * mean`` up past an integer.  ``n`` may vary per entry (conditional risks: the
    number of samples that count at each lambda); entries with ``n = 0`` get 1.

    >>> float(hb_p_values(torch.tensor(0.0), 10, 0.5, binary=True))  # P(Bin(10,.5) = 0)
    0.0009765625
    """
    a = check_alpha(alpha)
    r = torch.as_tensor(risk_hat, dtype=torch.float64)
    nn = torch.as_tensor(n, dtype=torch.float64).expand_as(r)
    s = nn * r if loss_sum is None else torch.as_tensor(loss_sum, dtype=torch.float64)
    k = torch.ceil(s - 1e-9 * s.abs().clamp(min=1.0))
    bentkus = (1.0 if binary else math.e) * binom_cdf(k, nn, a)
    p = torch.minimum(hoeffding_p_values(r, nn, a), bentkus).clamp(max=1.0)
    return torch.where(nn > 0, p, torch.ones_like(p))


def fwer_reject(p_values: torch.Tensor, delta: Any, method: str = "fixed_sequence"
                ) -> torch.Tensor:
    """Which null hypotheses ``H_j`` (last axis) a family-wise error rate procedure rejects,
    with ``P(any true H_j rejected) <= delta`` when each p-value is valid:

    * ``"fixed_sequence"``: in the given order, reject while ``p_j <= delta``; stop at the
      first that is not (valid whatever the dependence between the p-values; powerful when
      the order goes from the safest lambda to the riskiest);
    * ``"bonferroni"``: ``p_j <= delta / L``;
    * ``"holm"``: Holm's step-down (sorted p-values against ``delta / (L - rank)``; rejects
      at least what Bonferroni does).

    >>> fwer_reject(torch.tensor([0.01, 0.2, 0.01]), 0.1)
    tensor([ True, False, False])
    """
    d = check_alpha(delta, "delta")
    check_choice(method, "method", FWER_METHODS)
    p = torch.as_tensor(p_values, dtype=torch.float64)
    n_l = p.shape[-1]
    if method == "bonferroni":
        return p <= d / n_l
    if method == "fixed_sequence":
        return torch.cumprod((p <= d).to(torch.int8), -1).bool()
    ps, order = torch.sort(p, dim=-1, stable=True)
    level = d / (n_l - torch.arange(n_l, dtype=torch.float64))
    keep = torch.cumprod((ps <= level).to(torch.int8), -1).bool()
    return torch.zeros_like(keep).scatter(-1, order, keep)


def ltt_valid(losses: Any, alpha: Any, delta: Any, *, method: str = "fixed_sequence",
              p_value: str = "hb", binary: bool = False, mask: Any = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Learn-then-Test on a loss matrix: ``(valid, p_values)``, both (..., L).

    Guarantee (Angelopoulos et al. 2021, Thm. 1): if the calibration samples are independent
    and identically distributed and ``losses`` lie in [0, 1], then ``P(R(lambda_j) <= alpha
    for every valid j) >= 1 - delta``, with ``R`` the expected loss; no monotonicity needed.

    Args:
        losses: (..., n, L) losses in [0, 1]; leading dimensions are independent problems.
        alpha: the risk level; ``delta``: the error probability, both in (0, 1).
        method: ``"fixed_sequence"`` (in the grid's order), ``"bonferroni"`` or ``"holm"``.
        p_value: ``"hb"`` (Hoeffding-Bentkus) or ``"hoeffding"``.
        binary: the losses are 0/1 (checked): HB's binomial term loses its factor ``e``.
        mask: optional (..., n, L) boolean, broadcastable: which samples count at each lambda,
            for a *conditional* risk ``R(lambda) = E[L | mask]`` (the error among answered
            items).  Given the number ``n_j`` of samples that count, these are ``n_j``
            independent draws from the conditional law, so the p-value from ``n_j`` is valid.

    >>> valid, p = ltt_valid(torch.zeros(50, 2), 0.1, 0.1)
    >>> valid
    tensor([True, True])
    """
    check_alpha(alpha)
    check_alpha(delta, "delta")
    check_choice(method, "method", FWER_METHODS)
    check_choice(p_value, "p_value", P_VALUES)
    x = _losses(losses)
    if bool(((x < 0) | (x > 1)).any()):
        raise ValueError("Expected `losses` in [0, 1] for Learn-then-Test's p-values")
    if binary and not bool(((x == 0) | (x == 1)).all()):
        raise ValueError("Expected `losses` to be 0/1 with binary=True")
    if mask is None:
        m = torch.ones((), dtype=torch.float64)
    else:
        m = as_tensor(mask, "mask").to(torch.float64)
        if m.ndim < 2 or not bool(((m == 0) | (m == 1)).all()):
            raise ValueError("Expected `mask` to be a boolean (..., n, L) tensor")
    s = (x * m).sum(-2)
    cnt = torch.broadcast_to(m, torch.broadcast_shapes(m.shape, x.shape)).sum(-2)
    r = s / cnt.clamp(min=1)
    if p_value == "hb":
        p = hb_p_values(r, cnt, alpha, binary=binary, loss_sum=s)
    else:
        p = torch.where(cnt > 0, hoeffding_p_values(r, cnt, alpha), torch.ones_like(r))
    return fwer_reject(p, delta, method), p


def _last_true(valid: torch.Tensor) -> torch.Tensor:
    """Index of the last True along the last axis, -1 where none."""
    n_l = valid.shape[-1]
    last = n_l - 1 - valid.flip(-1).to(torch.int8).argmax(-1)
    return torch.where(valid.any(-1), last, torch.full_like(last, -1))


def _grid(lambdas: Any, n_l: int, name: str = "lambdas") -> torch.Tensor:
    if lambdas is None:
        return torch.arange(n_l, dtype=torch.float64)
    g = check_thresholds(lambdas, name)
    if g.numel() != n_l:
        raise ValueError(f"Expected `{name}` to have one value per loss column ({n_l}), got "
                         f"{g.numel()}")
    return g


def _float_or_none(v: float) -> float | None:
    return None if not math.isfinite(v) else float(v)


class ConformalRiskControl(Estimator):
    """Conformal risk control (Angelopoulos, Bates, Fisch, Lei & Schuster 2022) on a loss
    matrix over a grid of ``lambda``.

    Guarantee: if the calibration samples and the test sample are exchangeable, each loss
    ``L_i(lambda)`` is non-increasing in ``lambda`` and at most ``B``, and the test loss at the
    grid's largest lambda is at most ``alpha``, then ``E[L_{n+1}(lambda_hat_)] <= alpha`` (in
    expectation over calibration and test data, not with high probability: for that use
    :class:`LearnThenTest`).

    Args:
        alpha: the risk level in (0, 1).
        lambdas: the grid, strictly increasing (``None``: the column indices 0..L-1).
        B: the losses' upper bound.
        monotonize: control the running maximum of a non-monotone loss instead of refusing it
            (see :func:`crc_index`).

    Fitted attributes: ``lambda_hat_``, ``index_``, ``lambdas_``, ``risk_bound_`` (the
    bound ``n/(n+1) R_n + B/(n+1)`` at ``lambda_hat_``), ``n_calib_``.

    >>> losses = torch.tensor([[1.0, 1.0, 0.0, 0.0]] * 10 + [[1.0, 0.0, 0.0, 0.0]] * 10)
    >>> ConformalRiskControl(0.2, lambdas=[0.1, 0.2, 0.3, 0.4]).fit(losses).lambda_hat_
    0.3
    """

    _fitted_attr = "lambda_hat_"

    def __init__(self, alpha: float = 0.1, lambdas: Any = None, B: float = 1.0,
                 monotonize: bool = False) -> None:
        check_alpha(alpha)
        _positive(B, "B")
        if lambdas is not None:
            g = check_thresholds(lambdas, "lambdas")
            if bool((g[1:] <= g[:-1]).any()):
                raise ValueError("Expected `lambdas` to be strictly increasing")
        self.alpha = alpha
        self.lambdas = lambdas
        self.B = B
        self.monotonize = monotonize

    def fit(self, losses: Any) -> ConformalRiskControl:
        """Choose ``lambda_hat_`` from the (n, L) calibration losses; returns ``self``."""
        type(self)(self.alpha, self.lambdas, self.B, self.monotonize)
        x = _losses(losses)
        if x.ndim != 2:
            raise ValueError(f"Expected `losses` of shape (n, L), got {tuple(x.shape)} (use "
                             "crc_index for batched problems)")
        grid = _grid(self.lambdas, x.shape[1])
        idx = int(crc_index(x, self.alpha, B=self.B, monotonize=self.monotonize,
                            where=type(self).__name__))
        n = x.shape[0]
        col = x[:, idx] if not self.monotonize else x[:, idx:].amax(1)
        self.lambdas_ = grid
        self.index_ = idx
        self.n_calib_ = n
        self.risk_bound_ = float((col.sum() + self.B) / (n + 1))
        self.lambda_hat_ = float(grid[idx])
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings and the fitted choice)."""
        self._check_fitted()
        d = self._header()
        if d["lambdas"] is not None:
            d["lambdas"] = self.lambdas_.tolist()
        return {**d, "lambda_hat": self.lambda_hat_, "index": self.index_,
                "risk_bound": self.risk_bound_, "n_calib": self.n_calib_}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConformalRiskControl:
        """Rebuild a fitted object from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("alpha", "lambdas", "B", "lambda_hat", "index", "n_calib"))
        obj = cls(d["alpha"], d["lambdas"], d["B"], d.get("monotonize", False))
        obj.lambdas_ = None if d["lambdas"] is None else torch.tensor(d["lambdas"],
                                                                      dtype=torch.float64)
        obj.index_, obj.n_calib_ = int(d["index"]), int(d["n_calib"])
        obj.risk_bound_ = float(d["risk_bound"])
        obj.lambda_hat_ = float(d["lambda_hat"])
        return obj


class LearnThenTest(Estimator):
    """Learn-then-Test (Angelopoulos, Bates, Candès, Jordan & Lei 2021): the lambdas of a grid
    whose risk is certified ``<= alpha``, monotone loss or not.

    Guarantee: if the n calibration samples are independent draws from the test distribution
    and the losses lie in [0, 1], then with probability at least ``1 - delta`` over the
    calibration data every lambda in ``valid_lambdas_`` (hence ``lambda_hat_``) has risk
    ``R(lambda) = E[L(lambda)] <= alpha``.  Each p-value tests ``H_j : R(lambda_j) > alpha``
    (Hoeffding-Bentkus by default); the family-wise error rate is controlled by
    ``method``: ``"fixed_sequence"`` tests the grid in the order given (put the safest lambda
    first), ``"bonferroni"`` and ``"holm"`` in any order.

    Args:
        alpha: the risk level; delta: the error probability, both in (0, 1).
        lambdas: the grid in the order to test (``None``: column indices).  It must be fixed
            before looking at the calibration data.
        method: see :func:`fwer_reject`; p_value: ``"hb"`` or ``"hoeffding"``.
        binary: the losses are 0/1 (a tighter Bentkus term).

    Fitted: ``valid_`` (bool per lambda), ``valid_lambdas_``, ``p_values_``, ``risk_hat_``,
    ``n_effective_``, and ``lambda_hat_`` / ``index_``: the valid lambda latest in the
    grid's order (the most aggressive when the grid goes from safe to aggressive), ``nan`` /
    -1 with :class:`~torchcal.errors.InfiniteIntervalWarning` when none is certified.

    >>> ltt = LearnThenTest(0.2, 0.1, lambdas=[3.0, 2.0, 1.0])
    >>> ltt.fit(torch.tensor([[0.0, 0.0, 1.0]] * 40)).lambda_hat_
    2.0
    """

    _fitted_attr = "lambda_hat_"

    def __init__(self, alpha: float = 0.1, delta: float = 0.1, lambdas: Any = None,
                 method: str = "fixed_sequence", p_value: str = "hb",
                 binary: bool = False) -> None:
        check_alpha(alpha)
        check_alpha(delta, "delta")
        check_choice(method, "method", FWER_METHODS)
        check_choice(p_value, "p_value", P_VALUES)
        if lambdas is not None:
            check_thresholds(lambdas, "lambdas")
        self.alpha = alpha
        self.delta = delta
        self.lambdas = lambdas
        self.method = method
        self.p_value = p_value
        self.binary = binary

    def fit(self, losses: Any, mask: Any = None) -> LearnThenTest:
        """Test every lambda on the (n, L) calibration losses (``mask``: see
        :func:`ltt_valid`, for a conditional risk); returns ``self``."""
        type(self)(self.alpha, self.delta, self.lambdas, self.method, self.p_value, self.binary)
        x = _losses(losses)
        if x.ndim != 2:
            raise ValueError(f"Expected `losses` of shape (n, L), got {tuple(x.shape)}")
        grid = _grid(self.lambdas, x.shape[1])
        valid, p = ltt_valid(x, self.alpha, self.delta, method=self.method,
                             p_value=self.p_value, binary=self.binary, mask=mask)
        m = torch.ones_like(x) if mask is None else torch.broadcast_to(
            as_tensor(mask, "mask").to(torch.float64), x.shape)
        self.n_effective_ = m.sum(0)
        self.risk_hat_ = (x * m).sum(0) / self.n_effective_.clamp(min=1)
        self.p_values_, self.valid_, self.lambdas_ = p, valid, grid
        self.valid_lambdas_ = grid[valid]
        self.index_ = int(_last_true(valid))
        if self.index_ < 0:
            warnings.warn(
                f"{type(self).__name__}: no lambda is certified at alpha = {self.alpha}, "
                f"delta = {self.delta} with n = {x.shape[0]} (smallest p-value "
                f"{float(p.min()):.3g}); lambda_hat_ is nan: abstain, or use more data",
                InfiniteIntervalWarning, stacklevel=2)
        self.lambda_hat_ = math.nan if self.index_ < 0 else float(grid[self.index_])
        return self


class MultiLabelRiskControl(Estimator):
    """Multi-label prediction sets and segmentation masks ``{k : p_k > threshold_}`` with a
    controlled recall (CRC) or precision (LTT), thresholds as MAPIE's
    ``MultiLabelClassificationController``.

    * ``risk="recall"``: conformal risk control of the false-negative rate
      (:func:`~torchcal.conformal.losses.false_negative_rate`): the largest grid threshold
      ``t`` with ``n/(n+1) FNR_n(t) + 1/(n+1) <= alpha``.  Guarantee: if calibration and test
      samples are exchangeable, ``E[FNR_{n+1}] <= alpha`` (in expectation), provided the
      smallest threshold's sets contain every positive.
    * ``risk="precision"``: Learn-then-Test on the false-discovery rate ``1 - precision``
      (an empty set counts 1), HB p-values and ``method`` (``"holm"``, MAPIE's default,
      ``"bonferroni"``, or ``"fixed_sequence"`` from the largest threshold down); the
      smallest certified threshold.  Guarantee: with independent calibration samples,
      ``P(E[1 - precision] <= alpha) >= 1 - delta``.

    A sample is a row of (N, C) probabilities or a whole image of (N, C, H, W) / (N, 1, H,
    W) / (N, H, W) probabilities (its loss pools all its pixels): the losses over the whole
    grid are computed in one vectorised pass (:func:`~torchcal.conformal.losses.counts_above`).

    Args:
        alpha: the risk level (``1 - alpha`` is MAPIE's ``target_level``).
        risk: ``"recall"`` or ``"precision"``.
        delta: LTT's error probability (precision only; ``1 - delta`` is MAPIE's
            ``confidence_level``).
        thresholds: the grid (default MAPIE's ``0.00, 0.01, ..., 0.99``).
        method: LTT's family-wise procedure (precision only; default ``"holm"``).

    >>> p = torch.tensor([[0.9, 0.65, 0.2]] * 30); y = torch.tensor([[1, 1, 0]] * 30)
    >>> MultiLabelRiskControl(0.1).fit(p, y).threshold_
    0.64
    """

    _fitted_attr = "threshold_"

    def __init__(self, alpha: float = 0.1, risk: str = "recall", delta: float | None = None,
                 thresholds: Any = None, method: str | None = None) -> None:
        check_alpha(alpha)
        check_choice(risk, "risk", ("recall", "precision"))
        if risk == "precision":
            check_alpha(delta, "delta")
            check_choice("holm" if method is None else method, "method", FWER_METHODS)
        elif delta is not None or method is not None:
            raise ValueError("Expected `delta` and `method` to be None with risk='recall' "
                             "(conformal risk control has neither)")
        if thresholds is not None:
            check_thresholds(thresholds)
        self.alpha = alpha
        self.risk = risk
        self.delta = delta
        self.thresholds = thresholds
        self.method = method

    def _grid(self) -> torch.Tensor:
        if self.thresholds is None:
            return torch.arange(100, dtype=torch.float64) * 0.01
        return check_thresholds(self.thresholds)

    def fit(self, probs: Any, labels: Any) -> MultiLabelRiskControl:
        """Choose ``threshold_`` on calibration probabilities and binary labels / masks."""
        type(self)(self.alpha, self.risk, self.delta, self.thresholds, self.method)
        t = torch.sort(self._grid(), descending=True).values  # safest for recall last
        if self.risk == "recall":
            losses = false_negative_rate(probs, labels, t)
            idx = int(crc_index(losses, self.alpha, where=type(self).__name__))
            self.valid_thresholds_ = None
        else:
            losses = false_discovery_rate(probs, labels, t)
            valid, _ = ltt_valid(losses, self.alpha, self.delta,
                                 method=self.method or "holm")
            idx = int(_last_true(valid))
            self.valid_thresholds_ = t[valid].flip(0)
            if idx < 0:
                warnings.warn(
                    f"{type(self).__name__}: no threshold certifies precision >= 1 - "
                    f"{self.alpha} at delta = {self.delta} with n = {losses.shape[0]}; "
                    "threshold_ is +inf (empty sets)", InfiniteIntervalWarning, stacklevel=2)
        self.risk_hat_ = float(losses[:, idx].mean()) if idx >= 0 else math.nan
        self.n_calib_ = losses.shape[0]
        self.threshold_ = math.inf if idx < 0 else float(t[idx])
        return self

    def predict(self, probs: Any) -> Any:
        """Boolean sets / masks ``probs > threshold_`` of ``probs``' shape (NumPy in, NumPy
        out)."""
        self._check_fitted()
        p = as_tensor(probs, "probs")
        return like_input(p > self.threshold_, probs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings and the fitted threshold; +inf as None)."""
        self._check_fitted()
        d = self._header()
        if d["thresholds"] is not None:
            d["thresholds"] = self._grid().tolist()
        return {**d, "threshold": _float_or_none(self.threshold_), "n_calib": self.n_calib_}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MultiLabelRiskControl:
        """Rebuild a fitted object from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("alpha", "risk", "delta", "thresholds", "method", "threshold"))
        obj = cls(d["alpha"], d["risk"], d["delta"], d["thresholds"], d["method"])
        obj.threshold_ = math.inf if d["threshold"] is None else float(d["threshold"])
        obj.n_calib_ = int(d.get("n_calib", 0))
        return obj


class SelectiveRiskControl(Estimator):
    """Selective classification with a certified error among answered items: answer when the
    confidence is at least ``threshold_``, with ``P(R_sel(threshold_) <= eps) >= 1 - delta``,
    where ``R_sel(t) = P(wrong | confidence >= t)`` is the selective (conditional) risk.

    How the conditional risk is handled: for a threshold ``t`` let ``n_t`` be the number of
    answered calibration items and ``k_t`` how many of them are wrong.  Given ``n_t``, the
    answered items are ``n_t`` independent draws from the law of an item given ``confidence >=
    t``, so ``k_t ~ Binomial(n_t, R_sel(t))`` and the Hoeffding-Bentkus p-value for ``H_t :
    R_sel(t) > eps`` computed from ``(k_t / n_t, n_t)`` is valid conditionally on ``n_t``,
    hence unconditionally (``n_t = 0`` gives p = 1).  This bounds the selective risk itself,
    not the joint ``P(wrong and answered)`` of Angelopoulos et al.'s simpler variant.  The
    thresholds are tested with Holm's step-down procedure (FWER ``delta``; or fixed-sequence
    testing from the highest down, each at level ``delta``, or Bonferroni), and ``threshold_``
    is the lowest certified one: the most answers.  Holm by default: fixed-sequence testing
    stops at the first threshold it cannot certify, and the default grid starts at 1.00, where
    almost nothing is answered (so it certifies nothing unless the grid starts lower).

    Assumptions: calibration and test items are independent draws from one distribution, and
    the threshold grid is chosen without the calibration data.

    Args:
        eps: the tolerated error among answered items; delta: the error probability.
        thresholds: the grid (default ``1.00, 0.99, ..., 0.00`` for confidences in [0, 1]);
            any order (tested from the highest).
        method: ``"holm"`` (default), ``"fixed_sequence"`` or ``"bonferroni"``.
        p_value: ``"hb"`` (Hoeffding-Bentkus, binary form) or ``"hoeffding"``.

    Fitted: ``threshold_`` (``+inf`` when no threshold is certified: abstain on everything,
    with :class:`~torchcal.errors.InfiniteIntervalWarning`), ``answered_fraction_`` and
    ``selective_risk_`` on the calibration data, ``thresholds_`` (highest first),
    ``p_values_``, ``valid_``.

    >>> conf = torch.linspace(0, 1, 1000); correct = conf > 0.3
    >>> grid = [k / 10 for k in range(9, -1, -1)]  # 0.9, 0.8, ..., 0.0
    >>> sel = SelectiveRiskControl(eps=0.05, delta=0.1, thresholds=grid).fit(conf, correct)
    >>> sel.threshold_, sel.answered_fraction_
    (0.3, 0.7)
    """

    _fitted_attr = "threshold_"

    def __init__(self, eps: float = 0.1, delta: float = 0.1, thresholds: Any = None,
                 method: str = "holm", p_value: str = "hb") -> None:
        check_alpha(eps, "eps")
        check_alpha(delta, "delta")
        check_choice(method, "method", FWER_METHODS)
        check_choice(p_value, "p_value", P_VALUES)
        if thresholds is not None:
            check_thresholds(thresholds)
        self.eps = eps
        self.delta = delta
        self.thresholds = thresholds
        self.method = method
        self.p_value = p_value

    def _grid(self) -> torch.Tensor:
        if self.thresholds is None:
            return torch.arange(100, -1, -1, dtype=torch.float64) / 100
        return torch.sort(check_thresholds(self.thresholds), descending=True).values

    def fit(self, confidences: Any, correct: Any) -> SelectiveRiskControl:
        """Choose ``threshold_`` from calibration confidences (N,) and correctness (N,)."""
        type(self)(self.eps, self.delta, self.thresholds, self.method, self.p_value)
        c = as_tensor(confidences, "confidences").to(torch.float64).cpu()
        ok = as_tensor(correct, "correct").cpu()
        if c.ndim != 1 or c.numel() == 0 or tuple(ok.shape) != tuple(c.shape):
            raise ValueError(f"Expected `confidences` (N,) with N >= 1 and `correct` of the "
                             f"same shape, got {tuple(c.shape)} and {tuple(ok.shape)}")
        if not bool(torch.isfinite(c).all()):
            raise ValueError("Expected `confidences` to be finite (no NaN)")
        if not bool(((ok == 0) | (ok == 1)).all()):
            raise ValueError("Expected `correct` to be boolean (or 0/1)")
        t = self._grid()
        answered = c.unsqueeze(1) >= t  # (N, L)
        wrong = (ok == 0).to(torch.float64).unsqueeze(1)
        valid, p = ltt_valid(wrong, self.eps, self.delta, method=self.method,
                             p_value=self.p_value, binary=True, mask=answered)
        idx = int(_last_true(valid))
        self.thresholds_, self.p_values_, self.valid_ = t, p, valid
        if idx < 0:
            warnings.warn(
                f"{type(self).__name__}: no threshold certifies an error <= {self.eps} among "
                f"answered items at delta = {self.delta} with n = {c.numel()} (the highest "
                f"threshold answers {int(answered[:, 0].sum())}); threshold_ is +inf (abstain "
                "on everything)", InfiniteIntervalWarning, stacklevel=2)
            self.threshold_, self.answered_fraction_, self.selective_risk_ = math.inf, 0.0, 0.0
            return self
        a = answered[:, idx]
        self.threshold_ = float(t[idx])
        self.answered_fraction_ = float(a.double().mean())
        self.selective_risk_ = float(wrong[a].mean())
        return self

    def predict(self, confidences: Any) -> Any:
        """Boolean mask of the items to answer, ``confidences >= threshold_``."""
        self._check_fitted()
        c = as_tensor(confidences, "confidences")
        return like_input(c >= self.threshold_, confidences)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (+inf threshold as None)."""
        self._check_fitted()
        d = self._header()
        if d["thresholds"] is not None:
            d["thresholds"] = self._grid().tolist()
        return {**d, "threshold": _float_or_none(self.threshold_),
                "answered_fraction": self.answered_fraction_,
                "selective_risk": self.selective_risk_}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SelectiveRiskControl:
        """Rebuild a fitted object from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("eps", "delta", "thresholds", "method", "p_value", "threshold"))
        obj = cls(d["eps"], d["delta"], d["thresholds"], d["method"], d["p_value"])
        obj.threshold_ = math.inf if d["threshold"] is None else float(d["threshold"])
        obj.answered_fraction_ = float(d.get("answered_fraction", math.nan))
        obj.selective_risk_ = float(d.get("selective_risk", math.nan))
        return obj

