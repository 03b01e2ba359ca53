"""Focal-family losses: focal, inverse focal, signed (AdaFocal's), sample-dependent (FLSD), γ*.

Per-sample terms (``lp = log p_y`` from ``log_softmax``, ``q = 1 - p_y`` computed as
``-expm1(lp)``, so it is exact near ``p_y = 1``):

* focal ``FL_γ = -(1 - p_y)^γ log p_y`` (γ >= 0; the weight is **not** detached);
* inverse focal ``-(1 + p_y)^γ log p_y``;
* signed focal (AdaFocal): focal with γ for γ >= 0, inverse focal with |γ| for γ < 0.

Numerics.  Plain autograd through ``log_softmax`` and the per-sample terms (the N×C work is
that of ``F.cross_entropy``: one ``log_softmax`` forward and backward plus a gather), with
``q = -expm1(log p_y)`` exact near ``p_y = 1`` and the weight taken by
:func:`~torchcal.functional._common.safe_pow`: autograd through ``(1 - p)^γ`` would multiply
``γ (1-p)^(γ-1) = ∞`` by ``log p = 0`` at ``p_y = 1`` when ``0 < γ < 1`` and return NaN;
``safe_pow`` gives the true limit there (the derivative is ``w → 0``), and for γ >= 1 it is
the plain power.  Nothing is clamped: values are exact everywhere.  γ itself gets no gradient
(it is a hyperparameter or, for FLSD and AdaFocal, picked without gradient).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._common import as_gamma, check_hyper, no_autocast, safe_pow
from ._loss_utils import check_loss_args, reduce_loss, target_log_probs

__all__ = [
    "check_schedule",
    "signed_focal_loss",
    "focal_loss",
    "inverse_focal_loss",
    "sample_dependent_gamma",
    "sample_dependent_focal_loss",
    "flsd53_loss",
    "flsd532_loss",
    "focal_gamma_star",
    "FLSD53",
    "FLSD532",
]

#: (thresholds, gammas) of FLSD-53: γ=5 for p_y < 0.2, 3 for 0.2 <= p_y < 0.5, 3 for p_y >= 0.5.
FLSD53: tuple[tuple[float, ...], tuple[float, ...]] = ((0.2, 0.5), (5.0, 3.0, 3.0))
#: (thresholds, gammas) of FLSD-532: as FLSD-53 but γ=2 for p_y >= 0.5.
FLSD532: tuple[tuple[float, ...], tuple[float, ...]] = ((0.2, 0.5), (5.0, 3.0, 2.0))


def signed_focal_terms(lp: torch.Tensor, gamma: torch.Tensor | float) -> torch.Tensor:
    """Per-entry signed focal loss from ``lp = log p_y`` (differentiable through ``lp``).

    ``-w·lp`` with ``w = (1-p_y)^γ`` where γ >= 0 and ``(1+p_y)^|γ|`` where γ < 0; ``gamma``
    is a float or a detached tensor broadcastable to ``lp`` (one γ per entry).

    Example:
        >>> lp = torch.tensor([0.5, 0.5]).log()
        >>> signed_focal_terms(lp, torch.tensor([1.0, -1.0]))  # 0.5·log 2, 1.5·log 2
        tensor([0.3466, 1.0397])
    """
    if not isinstance(gamma, torch.Tensor):
        if gamma >= 0:
            w = safe_pow(torch.expm1(lp).neg(), gamma)
        else:
            w = lp.exp().add(1.0).pow(-gamma)
    else:
        base = torch.where(gamma >= 0, torch.expm1(lp).neg(), lp.exp().add(1.0))
        w = safe_pow(base, gamma.abs())
    return torch.mul(w, lp).neg()


def _signed_focal(
    input: torch.Tensor, target: torch.Tensor, gamma: Any, *, reduction: str, ignore_index: int,
    allow_negative: bool, sign: float = 1.0, validate_args: bool = True,
) -> torch.Tensor:
    check_loss_args(input, target, reduction)
    with no_autocast(input):
        _, lp, _, valid = target_log_probs(input, target, ignore_index,
                                           validate_args=validate_args)
        g = as_gamma(gamma, lp, allow_negative=allow_negative, validate_args=validate_args)
        if sign < 0:
            g = -g
        return reduce_loss(signed_focal_terms(lp, g), valid, reduction)


def signed_focal_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float | torch.Tensor, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Focal loss for γ >= 0 and inverse focal loss with |γ| for γ < 0 (AdaFocal's per-bin loss).

    .. math::
        \ell_i = \begin{cases} -(1-p_{y_i})^{\gamma_i} \log p_{y_i} & \gamma_i \ge 0 \\
                 -(1+p_{y_i})^{|\gamma_i|} \log p_{y_i} & \gamma_i < 0 \end{cases}

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        gamma: a finite number, or a tensor of ``target``'s shape with one γ per sample (any
            sign; no gradient flows into it).
        reduction: ``"mean"`` (over entries not equal to ``ignore_index``), ``"sum"`` or ``"none"``.
        ignore_index: target value whose entries contribute 0 and are left out of the mean.
        validate_args: check the target range (free in eager mode on the CPU: see
            :func:`~torchcal.functional._loss_utils.target_log_probs`) and the values of a γ
            tensor (one host sync); set False in hot loops.

    Returns:
        The reduced loss in float32 (float64 for float64 input), or per-entry losses of
        ``target``'s shape for ``reduction="none"``.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
        >>> signed_focal_loss(x, torch.tensor([0, 1]), torch.tensor([1.0, -1.0]), reduction="none")
        tensor([0.3466, 1.0397])
    """
    return _signed_focal(input, target, gamma, reduction=reduction, ignore_index=ignore_index,
                         allow_negative=True, validate_args=validate_args)


def focal_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float | torch.Tensor = 3.0, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Focal loss (Lin et al. 2017; Mukhoti et al. 2020): ``-(1 - p_y)^γ log p_y``.

    The weight is not detached.  ``gamma=0`` is cross-entropy.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        gamma: a finite number >= 0 (default 3, the paper's best fixed value), or a tensor of
            ``target``'s shape with one γ >= 0 per sample (no gradient flows into it).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (as ``F.cross_entropy``).
        ignore_index: target value to ignore.
        validate_args: check target range and γ values.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> focal_loss(x, torch.tensor([0]), gamma=1.0)  # 0.5 * log 2
        tensor(0.3466)
    """
    return _signed_focal(input, target, gamma, reduction=reduction, ignore_index=ignore_index,
                         allow_negative=False, validate_args=validate_args)


def inverse_focal_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float | torch.Tensor = 3.0, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Inverse focal loss ``-(1 + p_y)^γ log p_y`` (pushes confidence up; used by AdaFocal).

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        gamma: a finite number >= 0 (default 3) or a tensor of ``target``'s shape of values >= 0.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check target range and γ values.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> inverse_focal_loss(x, torch.tensor([0]), gamma=1.0)  # 1.5 * log 2
        tensor(1.0397)
    """
    return _signed_focal(input, target, gamma, reduction=reduction, ignore_index=ignore_index,
                         allow_negative=False, sign=-1.0, validate_args=validate_args)


def check_schedule(
    thresholds: Sequence[float], gammas: Sequence[float], names: tuple[str, str] = (
        "thresholds", "gammas"),
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Validate a γ schedule: strictly increasing ``thresholds`` (finite numbers) and one more
    ``gammas`` (numbers >= 0); returns both as tuples of floats.  ``names`` are the arguments'
    names for the messages (``("milestones", "gammas")`` for an epoch schedule).

    >>> check_schedule([0.2, 0.5], [5, 3, 3])
    ((0.2, 0.5), (5.0, 3.0, 3.0))
    """
    tn, gn = names
    try:
        thr = tuple(float(check_hyper(t, tn, allow_negative=True)) for t in thresholds)
        gam = tuple(float(check_hyper(g, gn)) for g in gammas)
    except TypeError as e:  # not iterable
        raise ValueError(f"Expected `{tn}` and `{gn}` to be sequences of numbers") from e
    if any(b <= a for a, b in zip(thr, thr[1:], strict=False)):
        raise ValueError(f"Expected `{tn}` to be strictly increasing, got {list(thresholds)}")
    if len(gam) != len(thr) + 1:
        raise ValueError(
            f"Expected `{gn}` to have len(`{tn}`) + 1 = {len(thr) + 1} entries, got {len(gam)}"
        )
    return thr, gam


def sample_dependent_gamma(
    p_y: torch.Tensor, thresholds: Sequence[float] = FLSD53[0],
    gammas: Sequence[float] = FLSD53[1],
) -> torch.Tensor:
    """Per-sample γ of sample-dependent focal loss: ``gammas[k]`` for ``thresholds[k-1] <= p_y <
    thresholds[k]`` (``gammas[0]`` below the first threshold, ``gammas[-1]`` at or above the last).

    Example:
        >>> sample_dependent_gamma(torch.tensor([0.1, 0.2, 0.3, 0.5, 0.9]))
        tensor([5., 3., 3., 3., 3.])
        >>> sample_dependent_gamma(torch.tensor([0.1, 0.2, 0.3, 0.5, 0.9]), *FLSD532)
        tensor([5., 3., 3., 2., 2.])
    """
    thr, gam = check_schedule(thresholds, gammas)
    p = p_y.detach()
    t = torch.tensor(thr, dtype=p.dtype, device=p.device)
    g = torch.tensor(gam, dtype=p.dtype, device=p.device)
    return g[torch.bucketize(p, t, right=True)]


def sample_dependent_focal_loss(
    input: torch.Tensor, target: torch.Tensor, thresholds: Sequence[float] = FLSD53[0],
    gammas: Sequence[float] = FLSD53[1], *, reduction: str = "mean", ignore_index: int = -100,
    validate_args: bool = True,
) -> torch.Tensor:
    r"""Sample-dependent focal loss (FLSD, Mukhoti et al. 2020): focal loss whose γ is picked per
    sample from its own ``p_y`` (without gradient) by a threshold schedule.

    ``γ_i = gammas[k]`` where ``k = #{j : thresholds[j] <= p_{y_i}}``; the default is FLSD-53
    (γ=5 for p_y < 0.2, 3 for 0.2 <= p_y < 0.5, 3 for p_y >= 0.5, as the published code).
    The threshold comparison uses ``p_y = exp(log_softmax(input))`` in the computation dtype.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        thresholds: strictly increasing probabilities.
        gammas: ``len(thresholds) + 1`` values >= 0.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check target range.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])  # p_y = 0.5 -> γ = 3
        >>> sample_dependent_focal_loss(x, torch.tensor([0]))  # 0.5**3 * log 2
        tensor(0.0866)
    """
    check_loss_args(input, target, reduction)
    thr, gam = check_schedule(thresholds, gammas)
    with no_autocast(input):
        _, lp, _, valid = target_log_probs(input, target, ignore_index,
                                           validate_args=validate_args)
        return reduce_loss(_scheduled_focal_terms(lp, thr, gam), valid, reduction)


def _scheduled_focal_terms(lp: torch.Tensor, thr: tuple[float, ...], gam: tuple[float, ...]
                           ) -> torch.Tensor:
    """``-q^γ_i·lp`` with γ_i picked from ``p_y`` by the schedule: one power per distinct γ,
    chosen by ``where`` from the top interval down (no γ tensor, no bucketize).  After the step
    for threshold ``k`` every entry with ``p_y < thr[k]`` holds ``q^gam[k]``; equal neighbours
    (FLSD-53's γ = 3 on both sides of 0.5) need no step."""
    q = torch.expm1(lp).neg()
    p = lp.detach().exp()
    w = safe_pow(q, gam[-1])
    for k in range(len(thr) - 1, -1, -1):
        if gam[k] != gam[k + 1]:
            w = torch.where(p < thr[k], safe_pow(q, gam[k]), w)
    return torch.mul(w, lp).neg()


def flsd53_loss(input: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean",
                ignore_index: int = -100, validate_args: bool = True) -> torch.Tensor:
    """FLSD-53: γ = 5 for p_y < 0.2, else 3 (see :func:`sample_dependent_focal_loss`)."""
    return sample_dependent_focal_loss(input, target, *FLSD53, reduction=reduction,
                                       ignore_index=ignore_index, validate_args=validate_args)


def flsd532_loss(input: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> torch.Tensor:
    """FLSD-532: γ = 5 for p_y < 0.2, 3 for 0.2 <= p_y < 0.5, 2 for p_y >= 0.5."""
    return sample_dependent_focal_loss(input, target, *FLSD532, reduction=reduction,
                                       ignore_index=ignore_index, validate_args=validate_args)


def _gamma_star_np(p0: np.ndarray) -> np.ndarray:
    """γ*(p0) in float64 (see :func:`focal_gamma_star` for the method)."""
    # deferred: scipy is slow to import: only when it is used (start-up time)
    from scipy.special import lambertw

    p = np.asarray(p0, dtype=np.float64)
    if not np.all(np.isfinite(p)) or np.any(p <= 0) or np.any(p >= 1):
        bad = p[~(np.isfinite(p) & (p > 0) & (p < 1))].ravel()[0]
        raise ValueError(f"Expected `p0` to be in the open interval (0, 1), got {bad!r}")
    out = np.zeros_like(p)
    m = p < 0.5
    if not np.any(m):
        return out
    pm = p[m]
    # g(p0, γ) = 1  <=>  log1p(c γ) = L γ  with  L = -ln(1-p0),  c = -p0 ln p0 / (1-p0);
    # in s = c γ and r = L / c (in (0, 1) for p0 < 0.5):  F(s) = log1p(s) - r s = 0, s > 0.
    lg = -np.log1p(-pm)
    c = -pm * np.log(pm) / (1.0 - pm)
    r = lg / c
    eps = (c - lg) / c  # 1 - r, without the rounding of r (it is tiny near p0 = 0.5)
    pos = eps > 0  # eps <= 0 only by rounding, within ~1e-16 of 0.5, where γ* ~ 1e-16
    r, eps, c = r[pos], eps[pos], c[pos]
    with np.errstate(all="ignore"):
        # Closed form: 1 + s = e^{r s}  <=>  s = -W_{-1}(-r e^{-r}) / r - 1 (the same root as the
        # published a/b + W_{-1}(·)/ln a, which loses it near p0 = 0.5 and underflows for tiny p0)
        w = lambertw(-r * np.exp(-r), k=-1)
        s_w = -w.real / r - 1.0
        # ln(1+s) <= s/sqrt(1+s) gives the upper bound s <= 1/r² - 1; F is concave with its
        # peak at 1/r - 1, so Newton from any start past the peak converges (monotonically
        # once right of the root)
        s_ub = eps * (1.0 + r) / (r * r)
        ok = np.isfinite(s_w) & (np.abs(w.imag) < 1e-9) & (s_w > eps / r) & (s_w <= s_ub)
        s = np.where(ok, s_w, s_ub)
        for _ in range(100):  # usually 0-3 steps from the closed form
            f = (np.log1p(s) - s) + eps * s
            step = f / (eps - s / (1.0 + s))
            s = s - step
            if np.all(np.abs(step) <= 1e-13 * s):
                break
        g = s / c  # inf only if γ* exceeds float64's range
    res = np.zeros_like(pm)
    res[pos] = np.where(np.isnan(g), np.inf, np.maximum(g, 0.0))
    out[m] = res
    return out


def focal_gamma_star(p0: Any) -> Any:
    r"""γ*(p0) of Proposition 2 (Mukhoti et al. 2020), via Lambert W (branch -1).

    The smallest γ with ``g(p, γ) <= 1`` for every ``p >= p0``, where
    ``g(p,γ) = (1-p)^γ - γ p (1-p)^(γ-1) ln p`` is the ratio of focal's to CE's last-layer
    gradient norm.  With ``a = 1-p0`` and ``b = p0 ln p0``:

    .. math:: \gamma^* = \frac{a}{b} + \frac{W_{-1}\left(-a^{1-a/b} \ln(a)/b\right)}{\ln a}

    Exactly 0 for ``p0 >= 0.5``; grows without bound as ``p0 -> 0`` (finite for every float64
    ``p0``: about 8.7e300 at 1e-300).

    Numerics.  The same root is computed in the variable ``s = cγ``, ``c = -p0 ln p0/(1-p0)``:
    ``g = 1`` is ``log1p(s) = r s`` with ``r = -ln(1-p0)/c``, whose closed form is
    ``s = -W_{-1}(-r e^{-r})/r - 1`` (scipy's ``lambertw``), polished by a few vectorised Newton
    steps on ``log1p(s) - r s`` (with ``1 - r`` formed without cancellation).  This agrees with a
    50-digit evaluation of the formula above to about 1e-15 relative for p0 in [1e-300, 0.49]
    and 1e-9 up to 0.49999999.  The published code evaluates the formula directly and adds
    ``1e-12`` inside W: that is 2x too small from p0 ≈ 0.49999 on (the 1e-12 dominates near W's
    branch point) and infinite below p0 ≈ 1e-15 (``a^{1-a/b}`` rounds to 1).

    Args:
        p0: a number, NumPy array (or list) or tensor of values in the open interval (0, 1).

    Returns:
        The same kind as ``p0``: a float, a float64 array (also for a list), or a tensor of
        ``p0``'s floating dtype (float32 for integer tensors) and device.  Computed in float64
        with scipy.

    Raises:
        ValueError: if any value is outside (0, 1) or not finite.

    Example:
        >>> round(focal_gamma_star(0.2), 4), focal_gamma_star(0.5)
        (4.8506, 0.0)
    """
    if isinstance(p0, torch.Tensor):
        out = _gamma_star_np(p0.detach().cpu().double().numpy())
        dtype = p0.dtype if p0.is_floating_point() else torch.float32
        return torch.from_numpy(out).to(device=p0.device, dtype=dtype)
    if isinstance(p0, (np.ndarray, list, tuple)):
        try:
            arr = np.asarray(p0, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Expected `p0` to hold numbers in (0, 1), got {p0!r}") from e
        return _gamma_star_np(arr)
    if isinstance(p0, bool) or not isinstance(p0, (int, float, np.number)):
        raise ValueError(
            f"Expected `p0` to be a number, numpy array or tensor in (0, 1), got {p0!r}"
        )
    return float(_gamma_star_np(np.asarray(float(p0)))[()])

