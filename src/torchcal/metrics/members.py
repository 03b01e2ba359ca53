"""Scores of an ensemble (or of S stochastic forward passes): per-sample uncertainties from the
members' logits.

Every function takes ``member_logits=`` of shape (S, N, C) - S members (or MC-dropout samples),
N samples, C classes - and returns an (N,) float64 tensor on the input's device.  The
conventions (those of Lakshminarayanan et al. 2017 and Depeweg et al. 2018):

* member s predicts ``p_s = softmax(z_s)``; the **ensemble's prediction is the mean of the
  members' probabilities** ``pbar = (1/S) sum_s p_s`` (not the softmax of the mean logits), and
  its "logits" are ``log pbar`` (:func:`pooled_log_probs`, computed by ``logsumexp``);
* entropies are in nats; ``predictive_entropy = H(pbar)`` (total uncertainty),
  ``expected_entropy = (1/S) sum_s H(p_s)`` (aleatoric), ``mutual_information`` their
  difference (epistemic; >= 0 up to rounding);
* ``disagreement``: the fraction of members whose top class (first index on ties) differs
  from the ensemble's top class ``argmax pbar``.

All arithmetic is float64 (``log_softmax`` of the members' logits, so no ``0 * log 0``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._validation import as_tensor

__all__ = ["pooled_log_probs", "predictive_entropy", "expected_entropy", "mutual_information",
           "disagreement", "check_member_logits"]


def check_member_logits(member_logits: Any, name: str = "member_logits") -> torch.Tensor:
    """``member_logits`` as a float tensor of shape (S, N, C), S >= 1, N >= 1, C >= 2, without
    NaN or +inf (-inf, a masked class, is allowed when each row keeps a finite entry).

    >>> check_member_logits(torch.zeros(2, 3)).shape
    Traceback (most recent call last):
    ...
    ValueError: Expected `member_logits` to be 3-D of shape (S, N, C) (S members or samples, N samples, C classes), got shape (2, 3); stack the members' (N, C) logits with torch.stack
    """
    z = as_tensor(member_logits, name)
    if not z.is_floating_point():
        raise TypeError(f"Expected `{name}` to have a floating dtype, got {z.dtype}")
    if z.ndim != 3:
        raise ValueError(
            f"Expected `{name}` to be 3-D of shape (S, N, C) (S members or samples, N samples, "
            f"C classes), got shape {tuple(z.shape)}; stack the members' (N, C) logits with "
            "torch.stack"
        )
    if z.shape[0] == 0 or z.shape[1] == 0:
        raise ValueError(f"Expected `{name}` to hold at least one member and one sample, "
                         f"got shape {tuple(z.shape)}")
    if z.shape[2] < 2:
        raise ValueError(f"Expected `{name}` to have at least 2 classes, got {z.shape[2]}")
    if bool(torch.isnan(z).any() | (z == float("inf")).any()):
        raise ValueError(f"Expected `{name}` to be free of NaN and +inf")
    if bool((z.amax(dim=2) == float("-inf")).any()):
        raise ValueError(f"Expected every row of `{name}` to have a finite entry, but a row "
                         "has every class masked (-inf)")
    return z


def _member_log_probs(member_logits: Any) -> torch.Tensor:
    return torch.log_softmax(check_member_logits(member_logits).to(torch.float64), dim=2)


def _log_mean(logp: torch.Tensor) -> torch.Tensor:
    """``log((1/S) sum_s exp(logp_s))`` over the member axis 0."""
    return torch.logsumexp(logp, dim=0) - math.log(logp.shape[0])


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    """Entropy along the last axis from log-probabilities (a -inf entry adds 0)."""
    return -(logp.exp() * logp).masked_fill(logp == float("-inf"), 0.0).sum(dim=-1)


def pooled_log_probs(*, member_logits: Any) -> torch.Tensor:
    """The ensemble's log-probabilities ``log pbar`` (N, C), float64: the log of the mean of
    the members' softmax probabilities, usable as logits wherever a model's are (softmax of
    them gives ``pbar`` back).

    >>> z = torch.tensor([[[0.0, 0.0]], [[0.0, 20.0]]])  # p = (0.5, 0.5) and ~(0, 1)
    >>> pooled_log_probs(member_logits=z).exp()
    tensor([[0.2500, 0.7500]], dtype=torch.float64)
    """
    return _log_mean(_member_log_probs(member_logits))


def predictive_entropy(*, member_logits: Any) -> torch.Tensor:
    """Entropy of the ensemble's prediction ``H(pbar) = -sum_c pbar_c log pbar_c`` (N,), nats.

    >>> z = torch.tensor([[[0.0, 0.0]], [[0.0, 20.0]]])
    >>> predictive_entropy(member_logits=z)  # H(0.25, 0.75)
    tensor([0.5623], dtype=torch.float64)
    """
    return _entropy(_log_mean(_member_log_probs(member_logits)))


def expected_entropy(*, member_logits: Any) -> torch.Tensor:
    """Mean of the members' entropies ``(1/S) sum_s H(p_s)`` (N,), nats (aleatoric part).

    >>> z = torch.tensor([[[0.0, 0.0]], [[0.0, 20.0]]])
    >>> expected_entropy(member_logits=z)  # (log 2 + ~0) / 2
    tensor([0.3466], dtype=torch.float64)
    """
    return _entropy(_member_log_probs(member_logits)).mean(dim=0)


def mutual_information(*, member_logits: Any) -> torch.Tensor:
    """``predictive_entropy - expected_entropy`` (N,), nats: the information the members'
    disagreement carries (epistemic part; BALD's score).  Zero when all members agree.

    >>> z = torch.tensor([[[0.0, 0.0]], [[0.0, 20.0]]])
    >>> mutual_information(member_logits=z)
    tensor([0.2158], dtype=torch.float64)
    """
    logp = _member_log_probs(member_logits)
    return _entropy(_log_mean(logp)) - _entropy(logp).mean(dim=0)


def disagreement(*, member_logits: Any) -> torch.Tensor:
    """Fraction of the S members whose top class differs from the ensemble's (N,), float64.

    The ensemble's top class is ``argmax pbar`` (mean probabilities); a member's is the
    argmax of its logits (first index on ties, as :func:`torchcal.metrics.error`).

    >>> z = torch.tensor([[[2.0, 0.0]], [[0.0, 1.0]], [[3.0, 0.0]]])
    >>> disagreement(member_logits=z)  # ensemble says class 0; one member of 3 says 1
    tensor([0.3333], dtype=torch.float64)
    """
    logp = _member_log_probs(member_logits)
    ensemble = _log_mean(logp).argmax(dim=1)
    return (logp.argmax(dim=2) != ensemble).to(torch.float64).mean(dim=0)
