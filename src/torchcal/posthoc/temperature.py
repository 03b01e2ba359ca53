"""Temperature scaling: ``p = softmax(z / T)`` with T chosen on validation logits.

Four ways to choose T (REFERENCE §3):

``"grid_ece"``
    T in a grid (default ``0.1, 0.2, ..., 10.0`` as exact decimals) with the lowest validation
    ECE (``n_bins`` equal-width bins), as the focal-calibration papers do.
``"grid_adaece"``
    The same on the equal-mass ECE (AdaECE / ECE_EM), as AdaFocal's tables.
``"grid_nll"``
    The same on the validation NLL (the papers' ``--cverror nll``).
``"nll"``
    Minimise the validation NLL over T (Guo et al. 2017) in ``[0.01, 100]`` on float64 logits:
    the NLL is convex in ``1/T``, so a safeguarded Newton search on ``1/T`` finds the
    stationary point to machine precision in a few passes.  If every validation prediction
    is correct the NLL keeps falling as T -> 0: the lower bound 0.01 is returned with a
    ``RuntimeWarning`` (likewise a warning when the optimum is at the upper bound).

On grid ties the smallest T wins.  The grid search is vectorised over temperatures: chunks of
temperatures are scaled, soft-maxed and binned at once (``(n_T, N, C)`` blocks of at most
``2**24`` elements bound the memory), and the per-temperature bin sums come from one
``bincount`` over (temperature, bin) keys.  It uses the shared bin conventions of
:mod:`torchcal.metrics.binning` and the metrics' float64 per-bin sums, so the ECE it reports at
each T is exactly (bit for bit, on CPU) ``torchcal.metrics.ece(logits=z / T, labels=y)`` for
float32 and float64 logits (and ``adaptive_ece`` likewise).  Half-precision logits are
up-cast to float32 first.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .._validation import check_positive_int
from ..metrics import IGNORE_INDEX
from ..metrics.binning import bin_index, equal_mass_edges, equal_width_bin_index
from ._checks import MAX_PARAMETER, check_grid, finite_float, prepare_fit_weighted
from ._fitting import weighted_equal_mass_edges
from ._layout import row_chunks, work_dtype
from .base import Calibrator

__all__ = [
    "TemperatureScaling",
    "fit_temperatures",
    "temperature_grid_scores",
    "METHODS",
    "CRITERIA",
    "fit_nll",
]

#: The values of ``TemperatureScaling(method=...)``.
METHODS = ("nll", "grid_ece", "grid_adaece", "grid_nll")
#: The criteria :func:`temperature_grid_scores` can score a grid by.
CRITERIA = ("ece", "adaptive_ece", "nll")
_METHOD_CRITERION = {"grid_ece": "ece", "grid_adaece": "adaptive_ece", "grid_nll": "nll"}

# Elements of one (n_T, N, C) block of scaled logits (and of its softmax): 2 MiB in float32
# (all 100 temperatures at once up to N C = 5,242); above it fewer temperatures per block, and
# one at a time from N C = 2^18 (two (N, C) buffers in the logits' dtype: the grid search of a
# segmentation batch never holds more than twice its kept rows).  The chunking changes no
# result (each temperature's row is computed alone).
_CHUNK_ELEMENTS = 1 << 19
# Bounds of the NLL search (temperatures) and its iteration limit.
NLL_BOUNDS = (1e-2, 1e2)
_NLL_MAX_ITER = 200


def _check_scaled_finite(z: torch.Tensor, t_min: float, dtype: torch.dtype) -> None:
    """Raise if ``z / t_min`` overflows ``dtype`` (finite logits, tiny temperature)."""
    amax = float(z.detach().abs().max())
    if amax / t_min > torch.finfo(dtype).max:
        raise ValueError(
            f"Expected `logits / T` to be finite for every temperature, but max |logit| "
            f"{amax:.6g} / T = {t_min!r} overflows {dtype}"
        )


def _binned_ece_rows(
    idx: torch.Tensor, conf64: torch.Tensor, corr64: torch.Tensor, n_bins: int, n: float
) -> torch.Tensor:
    """ECE of each row of (k, N) bin indices / confidences / correctness, float64 (k,).

    One ``bincount`` over the keys ``row * B + bin``; each (row, bin) sum adds the same
    float64 numbers in the same (sample) order as the per-row metric, so the results agree
    bit for bit with ``torchcal.metrics.ece``'s ``sum_b |A_b - S_b| / N``.
    """
    k = idx.shape[0]
    keys = idx + (torch.arange(k, device=idx.device) * n_bins).unsqueeze(1)
    keys = keys.reshape(-1)
    size = k * n_bins
    conf_sum = torch.bincount(keys, weights=conf64.reshape(-1), minlength=size).view(k, n_bins)
    acc_sum = torch.bincount(keys, weights=corr64.reshape(-1), minlength=size).view(k, n_bins)
    n_t = torch.tensor(float(n), dtype=torch.float64, device=idx.device)
    return (acc_sum - conf_sum).abs().sum(dim=1) / n_t


def _softmax_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(x, dim=-1)`` written into ``out`` (the same kernel, ``aten::_softmax``)."""
    try:
        return torch._softmax(x, -1, False, out=out)
    except (AttributeError, TypeError, RuntimeError):  # pragma: no cover - other torch builds
        return torch.softmax(x, dim=-1)


def _grid_scores(
    z: torch.Tensor, y: torch.Tensor, temps: Sequence[float], n_bins: int,
    criteria: Sequence[str], w: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Validated inputs -> ``{criterion: float64 tensor (n_T,)}`` on ``z``'s device
    (``w``: optional float64 sample weights, each criterion their weighted mean)."""
    wd = work_dtype(z.dtype)
    zw = z.to(wd)
    _check_scaled_finite(zw, min(temps), wd)
    n, c = zw.shape
    device = zw.device
    n_t = len(temps)
    total = float(n) if w is None else float(w.sum())
    temps_t = torch.tensor(temps, dtype=wd, device=device)
    out = {name: torch.empty(n_t, dtype=torch.float64, device=device) for name in criteria}
    want_ece = "ece" in criteria
    want_ada = "adaptive_ece" in criteria
    want_nll = "nll" in criteria
    tiny = torch.finfo(wd).tiny
    step = min(n_t, max(1, _CHUNK_ELEMENTS // (n * c)))
    # Two (step, N, C) buffers reused by every chunk: fresh large allocations cost page
    # faults that take longer than the arithmetic itself.
    buf_scaled = zw.new_empty((step, n, c))
    buf_p = zw.new_empty((step, n, c))
    for start in range(0, n_t, step):
        tc = temps_t[start : start + step]
        k = tc.numel()
        sl = slice(start, start + k)
        # Same arithmetic as the metric on z / T: division in the logits' dtype, then softmax.
        scaled = torch.div(zw.unsqueeze(0), tc.view(-1, 1, 1), out=buf_scaled[:k])
        p = _softmax_into(scaled, buf_p[:k])
        if want_ece or want_ada:
            conf, pred = p.max(dim=-1)
            conf64 = conf.to(torch.float64)
            corr64 = pred.eq(y).to(torch.float64)
            if w is not None:
                conf64, corr64 = conf64 * w, corr64 * w
            if want_ece:
                idx = equal_width_bin_index(conf, n_bins)
                out["ece"][sl] = _binned_ece_rows(idx, conf64, corr64, n_bins, total)
            if want_ada:
                # One set of equal-mass edges per temperature (row), batched.
                edges = (equal_mass_edges(conf, n_bins) if w is None
                         else weighted_equal_mass_edges(conf, w, n_bins))
                idx = bin_index(conf, edges)
                out["adaptive_ece"][sl] = _binned_ece_rows(idx, conf64, corr64, n_bins, total)
        if want_nll:
            p_y = p.gather(-1, y.view(1, -1, 1).expand(k, -1, 1)).squeeze(-1)
            nll = -torch.log(p_y.to(torch.float64))
            # Where p_y underflows, use the log-softmax of those rows (exact in log space).
            bad = p_y < tiny
            if bool(bad.any()):
                tb, ib = bad.nonzero(as_tuple=True)
                ls = torch.log_softmax(scaled[tb, ib], dim=-1)
                nll[tb, ib] = -ls.gather(1, y[ib].unsqueeze(1)).squeeze(1).to(torch.float64)
            out["nll"][sl] = (nll.sum(dim=1) if w is None else (nll * w).sum(dim=1)) / total
    return out


def temperature_grid_scores(
    logits: Any, labels: Any, *, grid: Sequence[float] | None = None, n_bins: int = 15,
    criteria: Sequence[str] = CRITERIA,
) -> dict[str, torch.Tensor]:
    """Validation score of every temperature of a grid, vectorised over temperatures.

    For each ``T`` in ``grid`` (default ``0.1, ..., 10.0``) and each criterion:

    * ``"ece"``: ``sum_b |A_b - S_b| / N`` with ``n_bins`` equal-width bins on the top-1
      confidence of ``softmax(z / T)``, exactly ``torchcal.metrics.ece(logits=z / T, ...)``
      computed in float64 (the metric returns it cast to the logits' dtype);
    * ``"adaptive_ece"``: the same with equal-mass bins (``torchcal.metrics.adaptive_ece``);
    * ``"nll"``: ``-(1/N) sum_i log softmax(z_i / T)_{y_i}``.

    Args:
        logits: (N, C) validation logits (torch or NumPy, any float dtype, any device).
        labels: (N,) integer class indices in [0, C).
        grid: positive temperatures (any order).
        n_bins: bins of the ECE criteria.
        criteria: subset of ``("ece", "adaptive_ece", "nll")``.

    Returns:
        ``{criterion: float64 tensor of shape (len(grid),)}`` on the logits' device.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
        >>> s = temperature_grid_scores(z, torch.tensor([0, 1, 0, 0]), grid=[1.0, 2.0])
        >>> [round(v, 4) for v in s["ece"].tolist()]
        [0.1308, 0.0189]
    """
    z, y, _, _ = prepare_fit_weighted(logits, labels, one_class_ok=True)  # scores, not a fit
    temps = check_grid(grid)
    n_bins = check_positive_int(n_bins, "n_bins")
    if isinstance(criteria, str):
        criteria = (criteria,)
    criteria = tuple(criteria)
    bad = [c for c in criteria if c not in CRITERIA]
    if bad or not criteria:
        raise ValueError(
            f"Expected `criteria` to be a non-empty subset of {CRITERIA}, got {criteria!r}"
        )
    return _grid_scores(z, y, temps, n_bins, criteria)


def _argmin_smallest(scores: torch.Tensor, temps: Sequence[float], what: str) -> float:
    """The smallest temperature among those with the lowest score (exact float comparison)."""
    vals = scores.tolist()
    if any(math.isnan(v) for v in vals):
        raise RuntimeError(f"The validation {what} is NaN at some grid temperature")
    best = min(vals)
    return min(t for t, v in zip(temps, vals, strict=True) if v == best)


def warn_if_on_grid_edge(t: float, temps: Sequence[float], method: str,
                         stacklevel: int = 3) -> None:
    """``RuntimeWarning`` when a grid search chose the smallest or largest temperature of a
    grid of more than one: the criterion may keep falling beyond it."""
    lo, hi = min(temps), max(temps)
    if len(set(temps)) > 1 and t in (lo, hi):
        side = "smallest" if t == lo else "largest"
        warnings.warn(
            f"TemperatureScaling(method={method!r}): the fitted temperature T = {t:g} is the "
            f"{side} entry of the grid [{lo:g}, {hi:g}], so the best temperature may lie "
            "outside it; pass a wider `grid`.",
            RuntimeWarning,
            stacklevel=stacklevel,
        )


def _nll_derivatives(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None
                     ) -> tuple[bool, Any]:
    """``(every label is the strict arg-max, grad_hess)`` of :func:`fit_nll`: ``grad_hess(beta)``
    gives ``f'(beta)`` and ``f''(beta)`` of the (weighted) mean NLL, one float64 pass over the
    rows chunk by chunk (one chunk, the float64 copy kept, for small inputs)."""
    n, c = z.shape
    chunks = row_chunks(n, c)
    single = len(chunks) == 1
    z64_single = z.to(torch.float64) if single else None

    def rows64(sl: slice) -> torch.Tensor:
        return z64_single if z64_single is not None else z[sl].to(torch.float64)

    total = float(n) if w is None else float(w.sum())
    zy_sum, all_correct = 0.0, True
    for sl in chunks:
        zc, yc = rows64(sl), y[sl].unsqueeze(1)
        zy = zc.gather(1, yc)
        zy_sum += float(zy.sum() if w is None else (zy.squeeze(1) * w[sl]).sum())
        all_correct = all_correct and bool((zy > zc.scatter(1, yc, -math.inf)).all())
    zy_mean = zy_sum / total
    z2_single = z64_single * z64_single if z64_single is not None else None

    def grad_hess(beta: float) -> tuple[float, float]:
        g_sum = h_sum = 0.0
        for sl in chunks:
            zc = rows64(sl)
            z2 = z2_single if z2_single is not None else zc * zc
            p = torch.softmax(zc * beta, dim=1)
            ez = (p * zc).sum(dim=1)
            ez2 = (p * z2).sum(dim=1)
            var = (ez2 - ez * ez).clamp(min=0)
            if w is None:
                g_sum += float(ez.sum())
                h_sum += float(var.sum())
            else:
                g_sum += float((ez * w[sl]).sum())
                h_sum += float((var * w[sl]).sum())
        return g_sum / total - zy_mean, h_sum / total

    return all_correct, grad_hess


def fit_nll(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None,
            stacklevel: int = 3) -> float:
    """Minimise the float64 validation NLL over T (safeguarded Newton on ``beta = 1/T``).

    ``f(beta) = (1/N) sum_i [logsumexp(beta z_i) - beta z_{i,y_i}]`` is convex in ``beta``
    with ``f' = (1/N) sum_i (E_{p_i}[z_i] - z_{i,y_i})`` and ``f'' = (1/N) sum_i Var_{p_i}[z_i]``
    (``p_i = softmax(beta z_i)``), so its minimiser is the root of the increasing ``f'``.
    Newton steps are kept inside a bracket ``[1/100, 1/0.01]`` that shrinks with the sign of
    ``f'``; a step leaving it is replaced by geometric bisection (rtsafe).  Each iteration is
    one float64 pass over the logits, chunk by chunk (``CHUNK_ELEMENTS``: a large input is
    never copied to float64 as a whole); a few iterations reach machine precision.  ``w``:
    optional sample weights (the means become weighted means).
    """
    all_correct, grad_hess = _nll_derivatives(z, y, w)
    if all_correct:
        # Every label is the strict arg-max: the NLL decreases all the way to T -> 0 (and
        # underflows to a flat 0 in float64 before the bound), so the bound is the answer.
        warnings.warn(
            f"Every validation prediction is correct, so the validation NLL decreases towards "
            f"T -> 0; returning the search bound T = {NLL_BOUNDS[0]}.",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
        return NLL_BOUNDS[0]
    b_lo, b_hi = 1.0 / NLL_BOUNDS[1], 1.0 / NLL_BOUNDS[0]
    beta, g = 1.0, math.nan
    for _ in range(_NLL_MAX_ITER):
        g, h = grad_hess(beta)
        if not (math.isfinite(g) and math.isfinite(h)):
            raise RuntimeError(
                f"Temperature scaling by NLL failed: non-finite NLL gradient ({g!r}) at "
                f"T = {1 / beta!r}"
            )
        if g == 0.0:
            break
        if g > 0:
            b_hi = beta
        else:
            b_lo = beta
        new = beta - g / h if h > 0 else math.nan
        if not b_lo < new < b_hi:
            new = math.sqrt(b_lo * b_hi)
        done = abs(new - beta) <= 1e-12 * beta or b_hi - b_lo <= 1e-12 * beta
        beta = new
        if done:
            break
    else:
        raise RuntimeError(
            f"Temperature scaling by NLL failed: the safeguarded Newton search did not converge "
            f"in {_NLL_MAX_ITER} iterations (T in [{1 / b_hi:.6g}, {1 / b_lo:.6g}], NLL "
            f"gradient {g:.3g})"
        )
    t = 1.0 / beta
    if t < NLL_BOUNDS[0] * (1 + 1e-9):
        warnings.warn(
            f"The validation NLL is minimised at the search bound T = {NLL_BOUNDS[0]}.",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
        t = NLL_BOUNDS[0]
    elif t > NLL_BOUNDS[1] * (1 - 1e-9):
        warnings.warn(
            f"The validation NLL is minimised at the search bound T = {NLL_BOUNDS[1]}: the "
            "logits carry almost no (or inverted) information about the labels.",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
        t = NLL_BOUNDS[1]
    return t


def _check_method(method: Any) -> str:
    if method not in METHODS:
        raise ValueError(f"Expected `method` to be one of {METHODS}, got {method!r}")
    return method


class TemperatureScaling(Calibrator):
    """Temperature scaling ``p = softmax(z / T)`` with T fitted on validation logits.

    scikit-learn's contract: the constructor stores settings, :meth:`fit` returns ``self`` and
    sets ``temperature_``, :meth:`transform` returns ``z / T``, :meth:`predict_proba` returns
    ``softmax(z / T)``.  Dividing by ``T > 0`` never changes the arg-max, so accuracy is
    unchanged.

    Args:
        method: ``"nll"`` (default: Guo et al., minimise the validation NLL over T in
            ``[0.01, 100]``; REFERENCE §3 names L-BFGS on ``log T``, this uses a bounded,
            safeguarded Newton search on ``1/T``, which has the same minimiser and reaches it
            to machine precision; a failure raises ``RuntimeError`` with the reason),
            ``"grid_ece"`` (lowest validation ECE over the grid, the focal-calibration
            papers), ``"grid_adaece"`` (lowest equal-mass ECE, AdaFocal) or ``"grid_nll"``.
        grid: temperatures searched by the grid methods (default ``0.1, 0.2, ..., 10.0``,
            exact decimals ``k / 10``).  Ties go to the smallest T.  A fitted temperature at
            the smallest or largest grid entry gives a ``RuntimeWarning``: the optimum may lie
            outside the grid.
        n_bins: bins of the ECE criteria.

    Attributes:
        temperature_ (float): the fitted temperature (a grid entry, exactly, for grid methods).
        grid_scores_ (list[float] | None): the validation score of each grid temperature
            (float64), ``None`` for ``"nll"``.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
        >>> y = torch.tensor([0, 1, 0, 0])
        >>> TemperatureScaling(method="grid_ece").fit(z, y).temperature_
        1.8
        >>> ts = TemperatureScaling().fit(z, y)  # NLL: optimum T = 2 / log(3)
        >>> round(ts.temperature_, 6)
        1.820478
        >>> ts.predict_proba(z)[0]
        tensor([0.7500, 0.2500])
    """

    _fitted_attr = "temperature_"

    def __init__(
        self, method: str = "nll", grid: Sequence[float] | None = None, n_bins: int = 15
    ) -> None:
        _check_method(method)
        check_grid(grid)
        check_positive_int(n_bins, "n_bins")
        self.method = method
        self.grid = grid
        self.n_bins = n_bins

    def _fit(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None) -> None:
        """Fit T on validated rows ``z`` (M, C), ``y`` (M,) and weights ``w`` (or None)."""
        method = _check_method(self.method)
        n_bins = check_positive_int(self.n_bins, "n_bins")
        if method == "nll":
            self.grid_scores_ = None
            self.temperature_ = fit_nll(z, y, w, stacklevel=4)
            return
        temps = check_grid(self.grid)
        crit = _METHOD_CRITERION[method]
        scores = _grid_scores(z, y, temps, n_bins, (crit,), w)[crit]
        self.grid_scores_ = scores.tolist()
        self.temperature_ = _argmin_smallest(scores, temps, crit)
        warn_if_on_grid_edge(self.temperature_, temps, method, stacklevel=4)

    def _transform(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated logits ``z / T`` (same dtype and device)."""
        return z / self.temperature_

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings and the fitted temperature)."""
        self._check_fitted()
        return {
            "type": type(self).__name__,
            "version": 1,
            "method": self.method,
            "grid": None if self.grid is None else list(check_grid(self.grid)),
            "n_bins": self.n_bins,
            "temperature": float(self.temperature_),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TemperatureScaling:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("method", "grid", "n_bins", "temperature"))
        grid = None if d["grid"] is None else check_grid(d["grid"])
        obj = cls(method=d["method"], grid=grid, n_bins=d["n_bins"])
        t = finite_float(d["temperature"], "d['temperature']")
        if not 1 / MAX_PARAMETER <= t <= MAX_PARAMETER:  # 1e-300 would overflow z / T
            raise ValueError(f"Expected `d['temperature']` to be a positive temperature in "
                             f"[{1 / MAX_PARAMETER:g}, {MAX_PARAMETER:g}], got {t!r}")
        obj.temperature_ = t
        obj.grid_scores_ = None
        return obj


def fit_temperatures(
    logits: Any, labels: Any, n_bins: int = 15, *, grid: Sequence[float] | None = None,
    sample_weight: Any = None, ignore_index: Any = IGNORE_INDEX,
) -> dict[str, float]:
    """Every method's temperature on the same validation logits, sharing the grid pass.

    Returns ``{"grid_ece": T, "grid_adaece": T, "grid_nll": T, "nll": T}`` (Python floats),
    identical to ``TemperatureScaling(method=m, grid=grid, n_bins=n_bins).fit(...)``
    for each method ``m``.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
        >>> t = fit_temperatures(z, torch.tensor([0, 1, 0, 0]))
        >>> t["grid_ece"], t["grid_adaece"], t["grid_nll"], round(t["nll"], 4)
        (1.8, 1.8, 1.8, 1.8205)
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    temps = check_grid(grid)
    z, y, w, _ = prepare_fit_weighted(logits, labels, ignore_index=ignore_index,
                                      sample_weight=sample_weight)
    scores = _grid_scores(z, y, temps, n_bins, CRITERIA, w)
    out = {
        m: _argmin_smallest(scores[c], temps, c) for m, c in _METHOD_CRITERION.items()
    }
    for m, t in out.items():
        warn_if_on_grid_edge(t, temps, m)
    out["nll"] = fit_nll(z, y, w)
    return {m: out[m] for m in METHODS[1:] + METHODS[:1]}
