"""Regression metrics on any :mod:`~torchcal.regression.predictive` prediction.

Every metric takes ``(pred, target, *, mask=None, ignore_value=None)``, drops missing targets
with :func:`~torchcal.regression.predictive.kept_rows` and returns a 0-d float64 tensor on the
input's device.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .predictive import Gaussian, kept_rows

__all__ = ["gaussian_nll"]

_LOG_2PI = math.log(2 * math.pi)


def gaussian_nll(pred: Gaussian, target: Any, *, mask: Any = None, ignore_value: Any = None,
                 full: bool = True) -> torch.Tensor:
    r"""Mean Gaussian negative log-likelihood
    :math:`\frac{1}{n}\sum_i \tfrac12\left(\log 2\pi\sigma_i^2 + (y_i-\mu_i)^2/\sigma_i^2\right)`
    over the observed elements (``full=False`` drops the constant ``log(2 pi) / 2``, as
    ``torch.nn.functional.gaussian_nll_loss``'s default does).

    A zero variance is refused (its NLL is infinite or undefined).

    >>> g = Gaussian(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 4.0]))
    >>> float(gaussian_nll(g, torch.tensor([1.0, 2.0]), full=False))  # (0.5 + (log 4 + 1)/2)/2
    0.8465735902799727
    """
    if not isinstance(pred, Gaussian):
        raise TypeError(f"Expected `pred` to be a Gaussian, got {type(pred).__name__}")
    g, y, _ = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
    mu, var = g.mean.double(), g.var.double()
    if bool((var <= 0).any()):
        raise ValueError(f"Expected `var` > 0 for a Gaussian NLL, found {int((var <= 0).sum())} "
                         "zero variance(s)")
    nll = 0.5 * (torch.log(var) + (y.double() - mu) ** 2 / var)
    return nll.mean() + (0.5 * _LOG_2PI if full else 0.0)
