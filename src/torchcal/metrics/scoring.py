"""Proper scoring rules and accuracy-type metrics: NLL, Brier, error, top-k error, S99.

Same input conventions as :mod:`torchcal.metrics.calibration`: exactly one of ``logits=`` /
``probs=`` (N, C), ``labels=`` (N,) integer class indices; 0-d results on the input's device in
the input's float dtype promoted to at least float32; sums accumulated in float64.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import as_tensor, check_labels, check_positive_int
from ._common import (
    check_unit_interval,
    keyword_inputs,
    prepare,
    resolve,
    result_dtype,
    top1,
)
from .layout import IGNORE_INDEX, flatten_inputs

__all__ = ["nll", "brier", "error", "topk_error", "s99", "entropy"]


@keyword_inputs
def entropy(*, logits: Any = None, probs: Any = None, validate_args: bool = True) -> torch.Tensor:
    """Per-sample predictive entropy ``H_i = -sum_c p_ic log p_ic`` in nats, shape (N,).

    The one entropy of the library (the trainer's diagnostics, OOD scores, uncertainty heads).
    From ``logits`` it uses ``log_softmax`` (no ``0 * log 0`` NaN); from ``probs`` a zero
    probability contributes 0.  The result has the input's float dtype promoted to at least
    float32.

    Example:
        >>> entropy(logits=torch.zeros(2, 4))  # log 4
        tensor([1.3863, 1.3863])
        >>> entropy(probs=torch.tensor([[0.5, 0.5], [0.25, 0.75]]))
        tensor([0.6931, 0.5623])
    """
    p = resolve(logits, probs, validate_args=validate_args)
    if logits is not None:
        z = as_tensor(logits, "logits").to(device=p.device, dtype=result_dtype(p.dtype))
        return -plogp_from_logits(z).sum(dim=1)
    return -torch.special.xlogy(p, p).sum(dim=1)


def plogp_from_logits(z: torch.Tensor) -> torch.Tensor:
    """The terms ``p_c log p_c`` (N, C) of the entropy from float logits via ``log_softmax``; a
    masked class (``-inf`` logit) adds 0, not ``0 * -inf``."""
    logp = torch.log_softmax(z, dim=1)
    return (logp.exp() * logp).masked_fill(logp == float("-inf"), 0.0)


@keyword_inputs
def nll(
    *, logits: Any = None, probs: Any = None, labels: Any, validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX,
) -> torch.Tensor:
    """Negative log-likelihood ``mean_i -log p_{i, y_i}``.

    From ``logits`` it uses ``log_softmax`` (exact for very small probabilities); from ``probs``
    it takes ``-log p_y`` directly, so a zero true-class probability gives ``inf``.

    Example:
        >>> nll(probs=torch.tensor([[0.5, 0.5], [0.25, 0.75]]), labels=torch.tensor([0, 1]))
        tensor(0.4904)
        >>> nll(logits=torch.zeros(2, 4), labels=torch.tensor([0, 3]))  # log 4
        tensor(1.3863)
    """
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p = resolve(logits, probs, validate_args=validate_args)
    y = check_labels(labels, n=p.shape[0], num_classes=p.shape[1], device=p.device)
    return nll_per_sample(logits, p, y).mean().to(result_dtype(p.dtype))


def nll_per_sample(logits: Any, p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(N,) float64 ``-log p_y``: from ``log_softmax(logits)`` if given, else from ``p``."""
    if logits is not None:
        z = as_tensor(logits, "logits").to(device=p.device, dtype=result_dtype(p.dtype))
        logp_y = torch.log_softmax(z, dim=1).gather(1, y[:, None]).squeeze(1)
        return -logp_y.to(torch.float64)
    return -p.gather(1, y[:, None]).squeeze(1).to(torch.float64).log()


@keyword_inputs
def brier(
    *, logits: Any = None, probs: Any = None, labels: Any, validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX,
) -> torch.Tensor:
    """Multiclass Brier score ``mean_i sum_c (p_ic - [y_i = c])^2``.

    The **sum** over the C classes, not divided by C (range [0, 2]); libraries that divide by C
    (e.g. some reporting code) give this value / C.

    Example:
        >>> brier(probs=torch.tensor([[0.5, 0.5], [0.25, 0.75]]), labels=torch.tensor([0, 1]))
        tensor(0.3125)
    """
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p, y = prepare(logits, probs, labels, validate_args=validate_args)
    return brier_per_sample(p, y).mean().to(result_dtype(p.dtype))


def brier_per_sample(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(N,) float64 ``sum_c (p_c - onehot_c)^2`` (squares in at least float32)."""
    w = p.to(result_dtype(p.dtype), copy=True)
    w[torch.arange(w.shape[0], device=w.device), y] -= 1
    return (w * w).sum(dim=1, dtype=torch.float64)


@keyword_inputs
def error(
    *, logits: Any = None, probs: Any = None, labels: Any, validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX,
) -> torch.Tensor:
    """Top-1 error ``1 - accuracy`` (the prediction is ``argmax_c p_c``, first index on ties).

    Example:
        >>> error(probs=torch.tensor([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]),
        ...       labels=torch.tensor([0, 1, 1]))
        tensor(0.3333)
    """
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p, y = prepare(logits, probs, labels, validate_args=validate_args)
    _, correct = top1(p, y)
    return (1.0 - correct.to(torch.float64).mean()).to(result_dtype(p.dtype))


@keyword_inputs
def topk_error(
    *, logits: Any = None, probs: Any = None, labels: Any, k: int = 5, validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX,
) -> torch.Tensor:
    """Top-k error: share of samples whose label is not among the k most probable classes.

    Given ``logits``, the classes are ranked on the logits themselves (softmax is monotone, so
    this is the ranking of the exact probabilities, in any dtype: probabilities computed in
    float16 or float32 underflow to ties for large logits).  Given ``probs``, they are ranked on
    the probabilities.  A sample is a hit when fewer than ``k`` other classes score at least as
    high as its true class, so **ties count as misses** (the result does not depend on how
    ``topk`` breaks ties, and tied scores never make a sample look better ranked than it is).
    ``k`` must not exceed C.

    Example:
        >>> probs = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]])
        >>> topk_error(probs=probs, labels=torch.tensor([1, 2]), k=2)
        tensor(0.5000)
        >>> topk_error(probs=torch.tensor([[0.4, 0.4, 0.2]]), labels=torch.tensor([1]), k=1)
        tensor(1.)
    """
    k = check_positive_int(k, "k")
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p, y = prepare(logits, probs, labels, validate_args=validate_args)
    if k > p.shape[1]:
        raise ValueError(
            f"Expected `k` to be at most the number of classes C={p.shape[1]}, got {k}"
        )
    hits = topk_hits(ranking_scores(logits, p), y, k)
    return (1.0 - hits.to(torch.float64).mean()).to(result_dtype(p.dtype))


def ranking_scores(logits: Any, p: torch.Tensor) -> torch.Tensor:
    """What top-k ranks: the ``logits`` when given (exact in any dtype), else the
    probabilities ``p``."""
    return p if logits is None else torch.as_tensor(logits).to(p.device)


def topk_hits(scores: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """(N,) bool: fewer than ``k`` other classes score at least as high as the true class
    (ties count as misses)."""
    s_y = scores.gather(1, y[:, None])
    return (scores >= s_y).sum(dim=1) <= k


def confident_mask(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """(N,) bool ``conf >= threshold``, compared in float64 (exact for every input dtype: a
    low-precision comparison would round the threshold, e.g. 0.99 to 0.98828125 in bfloat16)."""
    return conf.to(torch.float64) >= threshold


@keyword_inputs
def s99(
    *, logits: Any = None, probs: Any = None, labels: Any, threshold: float = 0.99,
    validate_args: bool = True, ignore_index: int | None = IGNORE_INDEX,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Share of samples with top-1 confidence ``>= threshold`` and the accuracy on them.

    Returns ``(share, accuracy)``; ``accuracy`` is NaN when no sample reaches the threshold.
    The comparison is exact in every input dtype (made in float64).

    Example:
        >>> probs = torch.tensor([[0.995, 0.005], [0.5, 0.5], [0.001, 0.999], [0.3, 0.7]])
        >>> s99(probs=probs, labels=torch.tensor([0, 0, 0, 1]))
        (tensor(0.5000), tensor(0.5000))
    """
    threshold = check_unit_interval(threshold, "threshold")
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p, y = prepare(logits, probs, labels, validate_args=validate_args)
    conf, correct = top1(p, y)
    confident = confident_mask(conf, threshold)
    n_conf = confident.sum().to(torch.float64)
    share = n_conf / conf.shape[0]
    acc = (confident & correct).sum().to(torch.float64) / n_conf
    out = result_dtype(p.dtype)
    return share.to(out), acc.to(out)
