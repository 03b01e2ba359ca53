"""Multi-task uncertainty weighting (Kendall, Gal & Cipolla, CVPR 2018).

Each task ``t`` gets a learnable log-variance ``s_t = log sigma_t^2``; the task losses ``L_t``
are combined as::

    L_total = sum_t  c_t * exp(-s_t) * L_t  +  1/2 * s_t

with ``c_t = 1/2`` for a Gaussian regression task (``L_t`` a mean squared error) and ``c_t = 1``
for a softmax classification task (``L_t`` a cross-entropy).  ``form="uniform"`` uses ``c_t = 1/2``
for every task, as LibMTL's "UW" does (LibMTL also starts at ``init=-0.5``).

For fixed task losses the total is minimised at ``s_t* = log(2 c_t L_t)``, where the task weight
``c_t exp(-s_t*)`` equals ``1 / (2 L_t)``: tasks with a large (noisy) loss are down-weighted.
Put :attr:`UncertaintyWeighting.log_vars` into the optimiser beside the model, usually without
weight decay.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["UncertaintyWeighting"]

_KIND_COEF = {"regression": 0.5, "classification": 1.0}
_FORMS = ("kendall", "uniform")


class UncertaintyWeighting(nn.Module):
    """Learned homoscedastic-uncertainty weighting of ``T`` task losses.

    ``forward(losses) = sum_t c_t * exp(-s_t) * L_t + 1/2 * s_t``.

    Args:
        kinds: one entry per task, each ``"regression"`` (``c = 1/2``) or ``"classification"``
            (``c = 1``).
        init: initial ``s_t`` (a number for all tasks, or one number per task).
        form: ``"kendall"`` (coefficients from ``kinds``) or ``"uniform"`` (``c = 1/2`` for all).

    Attributes:
        log_vars: ``nn.Parameter`` of shape (T,), the ``s_t``.
        coefficients: buffer of shape (T,), the ``c_t``.

    Example:
        >>> mtl = UncertaintyWeighting(kinds=("regression", "classification"))
        >>> mtl([torch.tensor(2.0), torch.tensor(1.0)])  # 1/2*2 + 1*1 (s = 0)
        tensor(2., grad_fn=<SumBackward0>)
        >>> mtl.weights()
        tensor([0.5000, 1.0000])
    """

    def __init__(
        self,
        kinds: Sequence[str] = ("regression", "classification"),
        init: float | Sequence[float] = 0.0,
        form: str = "kendall",
    ) -> None:
        super().__init__()
        if isinstance(kinds, str) or not isinstance(kinds, Sequence):
            raise TypeError(
                f"Expected `kinds` to be a sequence of task kinds such as "
                f"('regression', 'classification'), got {kinds!r}"
            )
        kinds = tuple(kinds)
        if not kinds:
            raise ValueError("Expected `kinds` to name at least one task, got an empty sequence")
        for k in kinds:
            if k not in _KIND_COEF:
                raise ValueError(
                    f"Expected every entry of `kinds` to be one of {tuple(_KIND_COEF)}, got {k!r}"
                )
        if form not in _FORMS:
            raise ValueError(f"Expected `form` to be one of {_FORMS}, got {form!r}")
        t = len(kinds)
        if isinstance(init, numbers.Real) and not isinstance(init, bool):
            init_values = [float(init)] * t
        elif isinstance(init, Sequence) and not isinstance(init, str):
            init_values = list(init)
            if len(init_values) != t or not all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in init_values
            ):
                raise ValueError(
                    f"Expected `init` to be a number or {t} numbers (one per task), got {init!r}"
                )
            init_values = [float(v) for v in init_values]
        else:
            raise ValueError(f"Expected `init` to be a number or {t} numbers, got {init!r}")
        if not all(math.isfinite(v) for v in init_values):
            raise ValueError(f"Expected `init` to be finite, got {init!r}")
        self.kinds = kinds
        self.form = form
        coefs = [0.5] * t if form == "uniform" else [_KIND_COEF[k] for k in kinds]
        self.log_vars = nn.Parameter(torch.tensor(init_values, dtype=torch.float32))
        self.register_buffer("coefficients", torch.tensor(coefs, dtype=torch.float32))

    @property
    def num_tasks(self) -> int:
        return len(self.kinds)

    def _stack(self, losses: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        t = self.num_tasks
        if isinstance(losses, torch.Tensor):
            if losses.ndim != 1 or losses.shape[0] != t:
                raise ValueError(
                    f"Expected `losses` to hold {t} scalar task losses (a 1-D tensor of shape "
                    f"({t},) or a sequence of 0-d tensors), got a tensor of shape {tuple(losses.shape)}"
                )
            stacked = losses
        elif isinstance(losses, Sequence) and not isinstance(losses, str):
            if len(losses) != t:
                raise ValueError(
                    f"Expected `losses` to hold {t} task losses (one per entry of `kinds`), got {len(losses)}"
                )
            items = []
            for i, item in enumerate(losses):
                if isinstance(item, torch.Tensor):
                    if item.ndim != 0:
                        raise ValueError(
                            f"Expected `losses[{i}]` to be a scalar (0-d) loss, got shape "
                            f"{tuple(item.shape)}; reduce it first (e.g. .mean())"
                        )
                    items.append(item)
                elif isinstance(item, numbers.Real) and not isinstance(item, bool):
                    items.append(torch.tensor(float(item), device=self.log_vars.device))
                else:
                    raise TypeError(
                        f"Expected `losses[{i}]` to be a 0-d tensor, got {type(item).__name__}"
                    )
            dtypes = {x.dtype for x in items}
            dtype = torch.float64 if torch.float64 in dtypes else torch.float32
            stacked = torch.stack([x.to(dtype) for x in items])
        else:
            raise TypeError(
                f"Expected `losses` to be a sequence of 0-d tensors or a 1-D tensor, got {type(losses).__name__}"
            )
        if not stacked.is_floating_point():
            raise TypeError(f"Expected `losses` to be floating point, got {stacked.dtype}")
        return stacked

    def forward(self, losses: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """Return ``sum_t c_t exp(-s_t) L_t + s_t / 2`` (a 0-d tensor)."""
        L = self._stack(losses)
        work = L.dtype if L.dtype == torch.float64 else torch.float32
        s = self.log_vars.to(work)
        c = self.coefficients.to(work)
        return (c * torch.exp(-s) * L.to(work) + 0.5 * s).sum()

    @torch.no_grad()
    def weights(self) -> torch.Tensor:
        """The current task weights ``c_t * exp(-s_t)``, shape (T,), detached."""
        return self.coefficients * torch.exp(-self.log_vars.detach())

    def extra_repr(self) -> str:
        return f"kinds={self.kinds}, form={self.form!r}"
