"""Bootstrap confidence intervals for the metrics (Mukhoti et al. App. G: 1000 resamples, 90%
percentile interval).

Resample ``r`` draws N row indices with replacement from a ``torch.Generator`` seeded with
``seed`` (on the CPU, so the index sets are the same on every device), in batches of
resamples so that memory stays bounded (~4M indices at a time) whatever N and R are.
Classwise-ECE additionally holds the (C * B, N) sparse matrix of per-sample contributions
(N * C non-zeros).  The interval is the
percentile interval: the ``(1 - level)/2`` and ``(1 + level)/2`` quantiles (linear
interpolation, as ``numpy.percentile``) of the R resampled values.

Vectorised over resamples for ``ece``, ``mce``, ``rmsce``, ``ace``, ``adaptive_ece`` and
``classwise_ece``: the equal-width bin of a sample does not change under resampling, so a batch
of resamples is one offset ``bincount`` (or, for Classwise-ECE, one sparse matrix product of
the resample multiplicities with the per-sample (class, bin) contributions); AdaECE sorts each
resample once and bins it against its own equal-mass edges, batched.  Any other metric (a
function of this package or any callable taking ``probs=``/``logits=`` and ``labels=``) is
evaluated resample by resample.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .._validation import as_tensor, check_positive_int
from . import calibration, scoring
from ._common import prepare, top1
from .binning import (
    bin_index,
    binned_sums,
    calibration_from_sums,
    equal_mass_edges,
    equal_width_bin_index,
)
from .layout import IGNORE_INDEX, flatten_inputs

__all__ = ["bootstrap_ci", "BootstrapResult"]

# Bound on (resamples in a batch) x N index elements, to keep temporaries ~32 MiB.
_BATCH_ELEMENTS = 1 << 22

_METRICS: dict[str, Callable[..., torch.Tensor]] = {
    "ece": calibration.ece,
    "mce": calibration.mce,
    "rmsce": calibration.rmsce,
    "ace": calibration.ace,
    "adaptive_ece": calibration.adaptive_ece,
    "classwise_ece": calibration.classwise_ece,
    "nll": scoring.nll,
    "brier": scoring.brier,
    "error": scoring.error,
    "topk_error": scoring.topk_error,
}
_NORMS = {calibration.ece: "l1", calibration.mce: "max", calibration.rmsce: "l2",
          calibration.ace: "mean"}


class BootstrapResult(NamedTuple):
    """Point estimate on the full data and the percentile interval ``[low, high]``."""

    estimate: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor


def resample_indices(
    n: int, n_resamples: int, seed: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """The (R, N) int64 row indices of the bootstrap resamples (drawn on the CPU).

    The same index sets that :func:`bootstrap_ci` uses with this ``seed`` (it draws them batch
    by batch from one generator, which yields the same stream).
    """
    return torch.cat([idx for _, _, idx in _index_batches(n, n_resamples, seed, device)])


def _index_batches(n: int, n_resamples: int, seed: int, device: torch.device | str | None):
    """Yield ``(start, stop, indices (stop - start, N))`` so that at most ~_BATCH_ELEMENTS
    indices exist at a time, whatever R and N are."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    step = max(1, _BATCH_ELEMENTS // max(n, 1))
    for start in range(0, n_resamples, step):
        stop = min(n_resamples, start + step)
        yield start, stop, torch.randint(0, n, (stop - start, n), generator=g).to(device)


def _top_label_stats(
    p: torch.Tensor, y: torch.Tensor, batches, n_bins: int, norm: str, equal_mass: bool,
) -> torch.Tensor:
    conf, correct = top1(p, y)
    fixed_bins = None if equal_mass else equal_width_bin_index(conf, n_bins)
    out = []
    for _, _, idx in batches:
        r = idx.shape[0]
        c_r = conf[idx]
        if equal_mass:
            bins = bin_index(c_r, equal_mass_edges(c_r, n_bins))
        else:
            bins = fixed_bins[idx]
        offsets = torch.arange(r, device=idx.device)[:, None] * n_bins
        sums = binned_sums((bins + offsets).view(-1), c_r.view(-1), correct[idx].view(-1),
                           r * n_bins)
        out.append(calibration_from_sums(sums.view(3, r, n_bins), norm))
    return torch.cat(out)


def _multiplicities(idx: torch.Tensor, n: int) -> torch.Tensor:
    """(r, N) int64: how often each row appears in each of the r resamples."""
    r = idx.shape[0]
    offsets = torch.arange(r, device=idx.device)[:, None] * n
    return torch.bincount((idx + offsets).view(-1), minlength=r * n).view(r, n)


def _mean_stats(per_sample: torch.Tensor, batches) -> torch.Tensor:
    """Resample means of a per-sample quantity: ``mult @ v / N`` in float64."""
    v = per_sample.to(torch.float64)
    n = v.shape[0]
    return torch.cat([_multiplicities(idx, n).to(torch.float64) @ v / n
                      for _, _, idx in batches])


def _classwise_stats(p: torch.Tensor, y: torch.Tensor, batches, n_bins: int) -> torch.Tensor:
    n, c = p.shape
    key = equal_width_bin_index(p, n_bins) + torch.arange(c, device=p.device) * n_bins
    val = p.to(torch.float64, copy=True)
    val[torch.arange(n, device=p.device), y] -= 1.0
    rows = torch.arange(n, device=p.device).repeat_interleave(c)
    vt = torch.sparse_coo_tensor(
        torch.stack([key.view(-1), rows]), val.view(-1), (c * n_bins, n), check_invariants=False
    ).coalesce()
    if vt.device.type == "cpu":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vt = vt.to_sparse_csr()
    out = []
    for _, _, idx in batches:
        mult = _multiplicities(idx, n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cell = torch.sparse.mm(vt, mult.to(torch.float64).T.contiguous())  # (C*B, r)
        out.append(cell.abs().sum(dim=0) / (n * c))
    return torch.cat(out)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def bootstrap_ci(
    metric: str | Callable[..., torch.Tensor],
    *,
    logits: Any = None,
    probs: Any = None,
    labels: Any,
    n_resamples: int = 1000,
    level: float = 0.9,
    seed: int = 0,
    ignore_index: int | None = IGNORE_INDEX,
    **metric_kwargs: Any,
) -> BootstrapResult:
    """Point estimate and bootstrap percentile interval of a metric.

    Args:
        metric: a metric function (e.g. :func:`torchcal.metrics.ece`) or its name (``"ece"``,
            ``"mce"``, ``"rmsce"``, ``"ace"``, ``"adaptive_ece"``, ``"classwise_ece"``, ``"nll"``,
            ``"brier"``, ``"error"``, ``"topk_error"``), or any callable taking
            ``logits=``/``probs=`` and ``labels=`` and returning a 0-d tensor.
        logits: (N, C) logits; exactly one of ``logits`` / ``probs``.
        probs: (N, C) probabilities.
        labels: (N,) integer class indices.
        n_resamples: number R of bootstrap resamples.
        level: coverage of the interval, in (0, 1); 0.9 gives the 5th and 95th percentiles.
        seed: seed of the resampling generator (same seed, same index sets).
        ignore_index: label of the entries left out; (N, C, d1, ...) predictions with
            (N, d1, ...) labels are flattened first (:func:`torchcal.metrics.flatten_valid`)
            and the kept entries are resampled as separate samples.
        **metric_kwargs: passed to the metric (e.g. ``n_bins=15``).

    Returns:
        ``BootstrapResult(estimate, low, high)`` of 0-d tensors in the estimate's dtype.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> logits = 3 * torch.randn(500, 5, generator=g, dtype=torch.float64)
        >>> labels = torch.randint(0, 5, (500,), generator=g)
        >>> res = bootstrap_ci("ece", logits=logits, labels=labels, n_resamples=200)
        >>> bool(res.low <= res.estimate <= res.high)
        True
    """
    fn = _resolve_metric(metric)
    n_resamples, seed = _check_options(n_resamples, level, seed)
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)

    estimate = fn(logits=logits, probs=probs, labels=labels, **metric_kwargs)
    if not isinstance(estimate, torch.Tensor) or estimate.ndim != 0:
        raise TypeError("Expected `metric` to return a 0-d tensor")
    p, y = prepare(logits, probs, labels, validate_args=False)
    n = p.shape[0]
    batches = _index_batches(n, n_resamples, seed, p.device)

    stats = _fast_stats(fn, logits, p, y, batches, metric_kwargs)
    if stats is None:
        stats = _looped_stats(fn, logits, probs, p, y, batches, metric_kwargs)

    alpha = (1.0 - float(level)) / 2.0
    q = torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64, device=stats.device)
    low, high = torch.quantile(stats.to(torch.float64), q)
    return BootstrapResult(estimate, low.to(estimate.dtype), high.to(estimate.dtype))


def _resolve_metric(metric: str | Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The metric function named by ``metric`` (a name of ``_METRICS`` or a callable)."""
    if isinstance(metric, str):
        if metric not in _METRICS:
            close = difflib.get_close_matches(metric, list(_METRICS), n=1, cutoff=0.6)
            raise ValueError(
                f"Expected `metric` to be one of {sorted(_METRICS)} or a callable, got {metric!r}"
                + (f"; did you mean {close[0]!r}?" if close else ""))
        return _METRICS[metric]
    if callable(metric):
        return metric
    raise TypeError(f"Expected `metric` to be a metric name or a callable, got {metric!r}")


def _check_options(n_resamples: int, level: float, seed: int) -> tuple[int, int]:
    """Validate ``n_resamples``, ``level`` and ``seed``; return ``(n_resamples, int(seed))``."""
    n_resamples = check_positive_int(n_resamples, "n_resamples")
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0.0 < level < 1.0:
        raise ValueError(f"Expected `level` to be a number in (0, 1), got {level!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"Expected `seed` to be an integer, got {seed!r}")
    return n_resamples, int(seed)


def _fast_stats(
    fn: Callable[..., torch.Tensor], logits: Any, p: torch.Tensor, y: torch.Tensor, batches,
    metric_kwargs: dict[str, Any],
) -> torch.Tensor | None:
    """The R resampled values by the vectorised paths, or None if ``fn`` has none."""
    vectorised = fn in _NORMS or fn in (calibration.adaptive_ece, calibration.classwise_ece)
    per_sample = fn in (scoring.nll, scoring.brier, scoring.error, scoring.topk_error)
    allowed = {"n_bins", "validate_args"} if vectorised else {"k", "validate_args"}
    if not ((vectorised or per_sample) and set(metric_kwargs) <= allowed):
        return None
    if fn is scoring.nll:
        return _mean_stats(scoring.nll_per_sample(logits, p, y), batches)
    if fn is scoring.brier:
        return _mean_stats(scoring.brier_per_sample(p, y), batches)
    if fn is scoring.error:
        # the arg-max rule of `error` (first index on ties), not top-k's tie rule
        return _mean_stats(~top1(p, y)[1], batches)
    if fn is scoring.topk_error:
        return _mean_stats(~scoring.topk_hits(scoring.ranking_scores(logits, p), y,
                                              metric_kwargs.get("k", 5)), batches)
    if fn is calibration.classwise_ece:
        return _classwise_stats(p, y, batches, metric_kwargs.get("n_bins", 15))
    if fn is calibration.adaptive_ece:
        return _top_label_stats(p, y, batches, metric_kwargs.get("n_bins", 15), "l1",
                                equal_mass=True)
    return _top_label_stats(p, y, batches, metric_kwargs.get("n_bins", 15),
                            _NORMS[fn], equal_mass=False)


def _looped_stats(
    fn: Callable[..., torch.Tensor], logits: Any, probs: Any, p: torch.Tensor, y: torch.Tensor,
    batches, metric_kwargs: dict[str, Any],
) -> torch.Tensor:
    """The R resampled values by calling ``fn`` on each resample (float64)."""
    kwargs = dict(metric_kwargs)
    if _accepts(fn, "validate_args"):
        kwargs.setdefault("validate_args", False)
    src_name = "logits" if logits is not None else "probs"
    src = as_tensor(logits if logits is not None else probs, src_name).to(p.device)
    vals = [fn(**{src_name: src[i]}, labels=y[i], **kwargs)
            for _, _, idx in batches for i in idx]
    return torch.stack(vals).to(torch.float64)
