"""Calibration errors without bins: smooth ECE (with its smoothed reliability curve) and the
Kolmogorov-Smirnov calibration error.

Both measure the top-label calibration of ``conf_i = max_c p_ic`` against the correctness
``a_i = [argmax_c p_ic = y_i]`` (first index on ties), like :func:`torchcal.metrics.ece`, and
take the same inputs: exactly one of ``logits=`` / ``probs=`` (N, C) and ``labels=`` (N,).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ._common import keyword_inputs, prepare, result_dtype, top1
from .layout import IGNORE_INDEX, flatten_inputs
from .tasks import binary_columns, check_task, warn_two_columns

__all__ = ["smooth_ece", "smooth_reliability_curve", "SmoothReliabilityCurve", "ks_error"]

# relplot's constants (config.smECE_mesh_pts, config.plot_mesh_pts, BaseKernelMixin.smooth's
# eps, smECE's eps and search_param's refine).
_SMECE_MESH = 200
_PLOT_MESH = 200
_DENSITY_EPS = 1e-4
_SIGMA_EPS = 1e-3
_REFINE = 10


def _grid_size(sigma: float) -> int:
    """Points of the grid the kernel sums are computed on (relplot's ``GaussianKernel.apply``)."""
    return max(2000, round(20 / sigma)) // 2 + 1


def _round_to_grid(f: torch.Tensor, weights: list[torch.Tensor | None], m: int
                   ) -> torch.Tensor:
    """Spread each weight over the two nearest points of the grid ``j / (m - 1)`` by linear
    interpolation, one row per weight vector (``None``: all ones); returns (K, m) float64."""
    x = f * (m - 1)
    lo = x.long().clamp_(0, m - 2)
    frac = x.sub_(lo)
    hi = lo + 1
    rest = 1 - frac
    out = torch.zeros(len(weights), m, dtype=torch.float64, device=f.device)
    for row, w in zip(out, weights, strict=True):  # K <= 2 rows
        row.index_add_(0, lo, rest if w is None else w * rest)
        row.index_add_(0, hi, frac if w is None else w * frac)
    return out


def _reflected_convolve(values: torch.Tensor, sigma: float) -> torch.Tensor:
    """Convolve grid values (K, m) with a Gaussian of width ``sigma`` (in units of the [0, 1]
    grid), reflecting the values at 0 and 1; by FFT, float64."""
    m = values.shape[1]
    t = torch.linspace(0, 1, m, dtype=torch.float64, device=values.device)
    ker = torch.exp(-(t - 0.5) ** 2 / (2 * sigma * sigma)) / (math.sqrt(2 * math.pi) * sigma)
    ext = torch.cat([values.flip(1)[:, :-1], values, values.flip(1)[:, 1:]], dim=1)
    size = 1 << (ext.shape[1] + m - 2).bit_length()  # >= the full length; a power of 2
    full = torch.fft.irfft(torch.fft.rfft(ext, n=size) * torch.fft.rfft(ker, n=size), n=size)
    start = m - 1 + m // 2  # the 'valid' part starts at m - 1; relplot keeps [m//2, m//2 + m)
    return full[:, start:start + m]


def _interpolate(t: torch.Tensor, grid_values: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation of (K, m) values at ``j / (m - 1)``, evaluated at ``t``."""
    m = grid_values.shape[1]
    idx = (t * (m - 1)).long().clamp_(0, m - 2)
    step = 1.0 / (m - 1)
    r = (t - idx.to(t.dtype) * step) / step
    return grid_values[:, idx] * (1 - r) + grid_values[:, idx + 1] * r


def _kernel_apply(grid: torch.Tensor, t: torch.Tensor, sigma: float) -> torch.Tensor:
    """``sum_i w_i K_sigma(t - f_i)`` (reflected Gaussian) at the points ``t`` from the weights
    rounded onto the grid of :func:`_grid_size` points (relplot's discretisation)."""
    return _interpolate(t, _reflected_convolve(grid, sigma))


def _smooth(grid: torch.Tensor, t: torch.Tensor, sigma: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Nadaraya-Watson smoothing at ``t`` from the grid rows (values, ones): ``(sum_i K(t -
    f_i) r_i / (dens + eps), dens + eps)`` with ``dens = sum_i K(t - f_i)``."""
    both = _kernel_apply(grid, t, sigma)
    dens = both[1] + _DENSITY_EPS
    return both[0] / dens, dens


class _Residuals:
    """Confidences and residuals ``conf - a`` with their grids cached by grid size (every
    bandwidth >= 0.01 uses the same 1001-point grid, so the search rounds once or twice)."""

    def __init__(self, f: torch.Tensor, r: torch.Tensor) -> None:
        self.f, self.r = f, r
        self._grids: dict[int, torch.Tensor] = {}

    def grid(self, sigma: float) -> torch.Tensor:
        m = _grid_size(sigma)
        if m not in self._grids:
            self._grids[m] = _round_to_grid(self.f, [self.r, None], m)
        return self._grids[m]

    def smece(self, sigma: float) -> torch.Tensor:
        """Smooth ECE at a fixed bandwidth (0-d float64)."""
        t = torch.linspace(0, 1, max(round(10 / sigma), _SMECE_MESH), dtype=torch.float64,
                           device=self.f.device)
        rs, dens = _smooth(self.grid(sigma), t, sigma)
        return (rs.abs() * dens).sum() / dens.sum()

    def auto(self) -> tuple[torch.Tensor, float]:
        """Smooth ECE with the bandwidth fixed point ``sigma* = smECE_sigma*``, found by
        bisection on [0, 1] as relplot does; returns ``(smece, sigma)``."""
        cache: dict[float, torch.Tensor] = {}

        def too_small(sigma: float) -> bool:  # relplot's predicate
            if sigma < _SIGMA_EPS:
                return True
            cache[sigma] = self.smece(sigma)
            return sigma < float(cache[sigma])

        sigma = 1.0
        if not too_small(sigma):
            lo, hi = 0.0, 1.0
            for _ in range(_REFINE):
                mid = (lo + hi) / 2
                if too_small(mid):
                    lo = mid
                else:
                    hi = mid
            sigma = hi
        return cache[sigma], sigma


def _check_sigma(sigma: Any) -> float | None:
    if sigma is None:
        return None
    try:
        s = float(sigma)
    except (TypeError, ValueError):
        s = float("nan")
    if isinstance(sigma, bool) or not (math.isfinite(s) and 0 < s <= 1):
        raise ValueError(f"Expected `sigma` to be None or a number in (0, 1], got {sigma!r}")
    return s


def _top_label_f64(logits: Any, probs: Any, labels: Any, validate_args: bool,
                   ignore_index: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p, y = prepare(logits, probs, labels, validate_args=validate_args)
    warn_two_columns(p.shape[1])
    conf, correct = top1(p, y)
    return conf.to(torch.float64), correct.to(torch.float64), result_dtype(p.dtype)


def _pairs_f64(task: str, logits: Any, probs: Any, labels: Any, validate_args: bool,
               ignore_index: int | None
               ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.dtype]:
    """The (value, outcome) float64 pairs a bin-free metric is computed on, one per problem:
    the top-1 confidence and correctness (multiclass), the class-1 probability and label
    (binary), or those of each label (multilabel; the metric is then their mean)."""
    if check_task(task) == "multiclass":
        f, a, out = _top_label_f64(logits, probs, labels, validate_args, ignore_index)
        return [(f, a)], out
    pairs, out = binary_columns(task, logits, probs, labels, ignore_index, validate_args)
    return [(p.to(torch.float64), y.to(torch.float64)) for p, y in pairs], out


@keyword_inputs
def smooth_ece(
    *, logits: Any = None, probs: Any = None, labels: Any, sigma: float | None = None,
    validate_args: bool = True, ignore_index: int | None = IGNORE_INDEX,
    task: str = "multiclass",
) -> torch.Tensor:
    """Smooth ECE (Błasiok & Nakkiran 2023): the calibration error of a kernel-smoothed
    reliability curve, with no bins to choose.

    With residuals ``r_i = conf_i - a_i`` and a Gaussian kernel ``K_sigma`` reflected at 0 and
    1, the smoothed residual and density at ``t`` are ``rbar(t) = sum_i K(t - conf_i) r_i /
    dens(t)`` and ``dens(t) = sum_i K(t - conf_i)``, and
    ``smECE_sigma = integral |rbar(t)| dens(t) dt / integral dens(t) dt``.  With ``sigma=None``
    the bandwidth is the fixed point ``sigma* = smECE_{sigma*}`` (the paper's choice, which
    makes smECE a consistent calibration measure), found by ten bisection steps on [0, 1].

    The numbers are those of the reference implementation, ``relplot.smECE`` (default
    reflected-Gaussian kernel), to float rounding: the same discretisation (weights spread
    linearly onto a grid of ``max(2000, round(20 / sigma)) // 2 + 1`` points, a
    ``max(200, round(10 / sigma))``-point evaluation mesh, ``1e-4`` added to the density) and
    the same bisection.  The convolution is done by FFT, so each bandwidth costs O(N) plus
    O(M log M) for the grid of M points.

    Args:
        logits: (N, C) logits; exactly one of ``logits`` / ``probs``.
        probs: (N, C) probabilities.
        labels: (N,) integer class indices.
        sigma: kernel bandwidth in (0, 1]; ``None`` (default) chooses it automatically (use
            :func:`smooth_reliability_curve` to see the value chosen).
        validate_args: check the inputs for NaN/Inf, range and row sums.
        ignore_index: label of the entries left out (see :func:`torchcal.metrics.ece`).
        task: ``"multiclass"`` (top-1 confidence), ``"binary"`` (the class-1 probability
            against the label: ``relplot.smECE(p, y)``) or ``"multilabel"`` (the mean over
            labels), as :func:`torchcal.metrics.ece` takes it.

    Returns:
        0-d tensor on the input's device (a fraction in [0, 1]).

    Example:
        >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
        >>> labels = torch.tensor([0, 1, 1, 0])
        >>> smooth_ece(probs=probs, labels=labels).round(decimals=4)
        tensor(0.1377)
    """
    s = _check_sigma(sigma)
    pairs, out = _pairs_f64(task, logits, probs, labels, validate_args, ignore_index)
    values = []
    for f, a in pairs:
        res = _Residuals(f, f - a)
        values.append(res.auto()[0] if s is None else res.smece(s))
    return torch.stack(values).mean().to(out)


class SmoothReliabilityCurve(NamedTuple):
    """A kernel-smoothed reliability curve on an evenly spaced mesh of [0, 1].

    Attributes:
        mesh: (M,) float64 points ``t`` in [0, 1].
        accuracies: (M,) smoothed accuracy ``E[a | conf = t]`` (kernel regression).
        density: (M,) kernel density of the confidences (integrates to about 1).
        sigma: the kernel bandwidth used (float).
        smooth_ece: the smooth ECE at that bandwidth (0-d tensor).
    """

    mesh: torch.Tensor
    accuracies: torch.Tensor
    density: torch.Tensor
    sigma: float
    smooth_ece: torch.Tensor


@keyword_inputs
def smooth_reliability_curve(
    *, logits: Any = None, probs: Any = None, labels: Any, sigma: float | None = None,
    n_points: int = _PLOT_MESH, validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX, task: str = "multiclass",
) -> SmoothReliabilityCurve:
    """The smoothed reliability diagram behind :func:`smooth_ece`.

    At each mesh point ``t`` the curve is the Nadaraya-Watson estimate ``sum_i K(t - conf_i)
    a_i / (sum_i K(t - conf_i) + 1e-4)`` and the density is ``(1/N) sum_i K(t - conf_i)``,
    with the reflected Gaussian kernel of bandwidth ``sigma`` (by default the smooth ECE's own
    automatic bandwidth).  These are the ``mu`` and ``density`` that
    ``relplot.prepare_rel_diagram`` draws (without its bootstrap band).  Plot ``accuracies``
    against ``mesh`` with the diagonal; the density shows where the confidences lie.
    ``task="binary"`` smooths the class-1 probability against the label (see
    :func:`torchcal.metrics.ece`).

    Example:
        >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
        >>> curve = smooth_reliability_curve(probs=probs, labels=torch.tensor([0, 1, 1, 0]))
        >>> curve.mesh.shape, round(curve.sigma, 4)
        (torch.Size([200]), 0.1387)
    """
    s = _check_sigma(sigma)
    if isinstance(n_points, bool) or not isinstance(n_points, int) or n_points < 2:
        raise ValueError(f"Expected `n_points` to be an integer >= 2, got {n_points!r}")
    if task == "multilabel":
        raise ValueError("Expected task='multiclass' or 'binary' for one smooth reliability "
                         "curve; for a multi-label problem pass each label's column with "
                         "task='binary'")
    [(f, a)], out = _pairs_f64(task, logits, probs, labels, validate_args, ignore_index)
    res = _Residuals(f, f - a)
    if s is None:
        value, s = res.auto()
    else:
        value = res.smece(s)
    t = torch.linspace(0, 1, n_points, dtype=torch.float64, device=f.device)
    grid = _round_to_grid(f, [a, None], _grid_size(s))
    mu, _ = _smooth(grid, t, s)
    density = _kernel_apply(grid[1:], t, s)[0] / f.shape[0]
    return SmoothReliabilityCurve(mesh=t, accuracies=mu, density=density, sigma=s,
                                  smooth_ece=value.to(out))


@keyword_inputs
def ks_error(
    *, logits: Any = None, probs: Any = None, labels: Any, validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX, task: str = "multiclass",
) -> torch.Tensor:
    """Kolmogorov-Smirnov calibration error (Gupta et al. 2021), no bins.

    With the cumulative accuracy and confidence below a threshold,
    ``h(s) = (1/N) sum_{i : conf_i <= s} a_i`` and ``h~(s) = (1/N) sum_{i : conf_i <= s}
    conf_i``, ``KS = max_s |h(s) - h~(s)|``: the largest gap between the two cumulative
    curves, evaluated at every distinct confidence.  A calibrated model has ``h = h~``.

    Tied confidences enter together (the curves are functions of the threshold ``s``), so
    the result does not depend on sample order.  The paper's code takes the maximum over
    every prefix of the sorted samples, which agrees whenever the confidences are distinct
    and otherwise depends on how the sort orders ties.  Sort plus a float64 cumulative sum:
    O(N log N).  ``task=`` as :func:`torchcal.metrics.ece` (binary: the class-1 probability
    against the label; multilabel: the mean over labels).

    Example:
        >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
        >>> ks_error(probs=probs, labels=torch.tensor([0, 1, 1, 0]))  # |0.6 + 0.7 - 1 - 1| / 4
        tensor(0.1750)
    """
    pairs, out = _pairs_f64(task, logits, probs, labels, validate_args, ignore_index)
    return torch.stack([_ks(f, a) for f, a in pairs]).mean().to(out)


def _ks(f: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """KS error of float64 values ``f`` against outcomes ``a`` (ties enter together)."""
    s, order = torch.sort(f)
    gap = torch.cumsum(a[order] - s, dim=0)
    # the last sample of each run of equal confidences closes that threshold
    last = torch.ones_like(s, dtype=torch.bool)
    last[:-1] = s[1:] != s[:-1]
    return gap[last].abs().max() / f.shape[0]
