"""Pretrained uncertainty heads (Kirchhof et al. 2024): the head and its ranking loss.

A frozen classifier gives a pre-logit embedding ``z = f(x)`` of shape (N, D).  The uncertainty
head is a small MLP ``u = g(stopgrad(z))`` with a strictly positive output (Softplus + 1e-6)
trained to *rank* samples like the classifier's per-sample cross-entropy: samples on which the
classifier is wrong (large loss) should get a large uncertainty.  The loss is a pairwise hinge
over consecutive pairs of the batch, so it is scale-free and the head transfers across data sets.

The stop-gradient is part of :class:`UncertaintyHead` itself (its ``forward`` detaches its input),
so training the head, alone or beside the classifier (``L_cls + lam * L_rank``), never changes the
backbone's or the classifier's gradients.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._io import read_verified, write_verified
from .._validation import check_nonneg_finite, check_positive_int
from ..errors import CheckpointError

__all__ = ["UncertaintyHead", "ranking_loss", "per_sample_cross_entropy", "save_head", "load_head",
           "as_vector"]

_EPS = 1e-6


class UncertaintyHead(nn.Module):
    """MLP ``D -> width -> ... -> width -> 1`` with LeakyReLU, Softplus output plus ``1e-6``.

    ``forward(features)`` detaches ``features`` first (the stop-gradient of the paper), so no
    gradient ever flows from the head into whatever produced the features.

    Args:
        in_features: embedding width ``D`` (e.g. ``model.num_features``).
        width: hidden width (512 in the paper).
        depth: number of hidden layers (2 in the paper: ``D -> 512 -> 512 -> 1``).

    Shapes:
        features (N, D) -> uncertainty (N,), every entry ``> 1e-6``.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> head = UncertaintyHead(8, width=16)
        >>> u = head(torch.randn(4, 8, requires_grad=True))
        >>> u.shape, bool((u > 1e-6).all()), u.requires_grad
        (torch.Size([4]), True, True)
        >>> sum(p.numel() for p in head.parameters())  # 8*16+16 + 16*16+16 + 16+1
        433
    """

    def __init__(self, in_features: int, width: int = 512, depth: int = 2) -> None:
        super().__init__()
        self.in_features = check_positive_int(in_features, "in_features")
        self.width = check_positive_int(width, "width")
        self.depth = check_positive_int(depth, "depth")
        layers: list[nn.Module] = []
        d = self.in_features
        for _ in range(self.depth):
            layers += [nn.Linear(d, self.width), nn.LeakyReLU()]
            d = self.width
        layers += [nn.Linear(d, 1), nn.Softplus()]
        self.mlp = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if not isinstance(features, torch.Tensor) or not features.is_floating_point():
            raise TypeError(
                "Expected `features` to be a floating-point torch.Tensor, got "
                + (str(features.dtype) if isinstance(features, torch.Tensor) else type(features).__name__)
            )
        if features.ndim != 2 or features.shape[1] != self.in_features:
            raise ValueError(
                f"Expected `features` of shape (N, {self.in_features}), got {tuple(features.shape)}"
            )
        x = features.detach()  # the stop-gradient: the head never trains the backbone
        w = self.mlp[0].weight
        if x.dtype != w.dtype:
            x = x.to(w.dtype)
        return self.mlp(x).squeeze(1) + _EPS

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, width={self.width}, depth={self.depth}"


def as_vector(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` (named ``name`` in errors) checked to be a floating tensor of shape (N,) or (N, 1),
    as shape (N,)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"Expected `{name}` to be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"Expected `{name}` to have a floating dtype, got {t.dtype}")
    if t.ndim == 2 and t.shape[1] == 1:
        t = t.squeeze(1)
    if t.ndim != 1:
        raise ValueError(f"Expected `{name}` to be of shape (N,) or (N, 1), got {tuple(t.shape)}")
    return t


def ranking_loss(
    uncertainty: torch.Tensor, target_loss: torch.Tensor, margin: float = 0.1,
    leeway: float = 0.0,
) -> torch.Tensor:
    """Pairwise ranking hinge of the pretrained-uncertainty paper.

    The batch is paired consecutively as (0, 1), (2, 3), ...; for a pair ``(a, b)``::

        s = +1 if l_a > l_b else -1          (ties count as -1)
        s = 0  if |l_a - l_b| < leeway        (the published code's ``leeway_rho``)
        L = mean_pairs max(0, -s * (u_a - u_b) + margin)

    ``target_loss`` (the frozen classifier's per-sample cross-entropy) is detached here, so only
    ``uncertainty`` receives gradients.  With ``leeway = ρ > 0`` (Kirchhof et al.'s ``url`` code,
    ``LossOrderLoss(leeway_rho=ρ)``, CLI ``--orderloss_leeway``) pairs whose losses differ by
    less than ρ count as equal: their term is the constant ``margin`` and they give no gradient.
    ``leeway=0`` (the default, the published default) is the plain hinge.

    Args:
        uncertainty: predicted uncertainties, shape (N,) or (N, 1), N even and > 0.
        target_loss: per-sample target losses, same number of entries.
        margin: hinge margin (0.1 in the paper), finite and >= 0.
        leeway: ρ, finite and >= 0 (default 0).

    Returns:
        0-d tensor (the mean over the N/2 pairs), in the uncertainty's dtype and device.

    Raises:
        ValueError: odd or empty batch, shape mismatch, negative margin or leeway.

    Example:
        >>> u = torch.tensor([0.1, 0.2, 0.3, 0.3])
        >>> l = torch.tensor([2.0, 1.0, 1.0, 1.0])
        >>> ranking_loss(u, l)  # pair 1: s=+1, 0.1+0.1=0.2; pair 2 (tie): s=-1, 0+0.1
        tensor(0.1500)
        >>> u = torch.tensor([0.5, 0.3, 0.2, 0.6])
        >>> l = torch.tensor([1.05, 1.0, 2.0, 0.5])
        >>> ranking_loss(u, l), ranking_loss(u, l, leeway=0.1)  # pair 1: 0 -> 0.1 (s = 0)
        (tensor(0.2500), tensor(0.3000))
    """
    u = as_vector(uncertainty, "uncertainty")
    t = as_vector(target_loss, "target_loss").detach()
    margin = check_nonneg_finite(margin, "margin")
    leeway = check_nonneg_finite(leeway, "leeway")
    n = u.shape[0]
    if t.shape[0] != n:
        raise ValueError(
            f"Expected `target_loss` to have {n} entries (one per `uncertainty`), got {t.shape[0]}"
        )
    if n == 0 or n % 2:
        raise ValueError(
            f"Expected an even, non-zero batch size for the pairwise ranking loss, got {n}"
        )
    if t.device != u.device:
        t = t.to(u.device)
    u_a, u_b = u[0::2], u[1::2]
    t_a, t_b = t[0::2], t[1::2]
    sign = torch.where(t_a > t_b, 1.0, -1.0).to(u.dtype)
    if leeway > 0:
        sign = torch.where((t_a - t_b).abs() >= leeway, sign, torch.zeros_like(sign))
    return torch.clamp(margin - sign * (u_a - u_b), min=0).mean()


def per_sample_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Detached per-sample cross-entropy ``-log softmax(logits)[y]`` in float32 (float64 kept),
    the head's training target.  Shapes: (N, C), (N,) -> (N,).

    Example:
        >>> per_sample_cross_entropy(torch.zeros(2, 4), torch.tensor([0, 3]))
        tensor([1.3863, 1.3863])
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.ndim != 2:
        raise ValueError(
            "Expected `logits` to be a floating-point tensor of shape (N, C), got "
            + (f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__)
        )
    work = logits.detach()
    if work.dtype not in (torch.float32, torch.float64):
        work = work.float()
    return torch.nn.functional.cross_entropy(work, labels.to(work.device).long(), reduction="none")


HEAD_FORMAT = "torchcal.uncertainty_head/1"


def nonfinite_parameters(state_dict: dict[str, Any]) -> str:
    """``"'net.0.weight' (12 of 4,096 values)"`` for the first tensor of ``state_dict`` holding
    NaN/Inf ('' if every value is finite; a non-tensor entry is named as such)."""
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            return f"{name!r} (not a tensor: {type(t).__name__})"
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return f"{name!r} ({int((~torch.isfinite(t)).sum()):,} of {t.numel():,} values)"
    return ""


def save_head(head: UncertaintyHead, path: str | os.PathLike, meta: dict | None = None) -> None:
    """Write a head (architecture + weights + ``meta``) atomically (temp file in the same
    directory, fsync, ``os.replace``) with its SHA-256 beside it (``head.pt.sha256``,
    :func:`torchcal._io.write_verified`).  Read it back with :func:`load_head`.

    Raises:
        CheckpointError: a parameter holds NaN/Inf (a diverged fit); nothing is written, so
            a good head at ``path`` stays.
    """
    if not isinstance(head, UncertaintyHead):
        raise TypeError(f"Expected `head` to be an UncertaintyHead, got {type(head).__name__}")
    path = Path(path)
    bad = nonfinite_parameters(head.state_dict())
    if bad:
        raise CheckpointError(f"Uncertainty head not written to {str(path)!r}: its parameter "
                              f"{bad} is NaN/Inf (the fit diverged; lower the learning rate); "
                              "the file there is unchanged")
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format": HEAD_FORMAT,
        "in_features": head.in_features,
        "width": head.width,
        "depth": head.depth,
        "state_dict": {k: v.detach().cpu() for k, v in head.state_dict().items()},
        "meta": json.loads(json.dumps(meta or {}, default=str)),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    write_verified(path, buf.getvalue())


def load_head(path: str | os.PathLike, map_location: Any = "cpu") -> tuple[UncertaintyHead, dict]:
    """Load a head written by :func:`save_head` (``weights_only=True``) -> ``(head in eval
    mode, meta)``.

    The file is checked against its SHA-256 file first (:func:`torchcal._io.read_verified`; a
    head written before torchcal verified heads loads with a warning).

    Raises:
        CheckpointError: the file is missing, corrupt, or does not match its SHA-256.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Uncertainty head file {str(path)!r} does not exist")
    data = read_verified(path, what="Uncertainty head file", error=CheckpointError,
                         hint="fit the head again (torchcal uncertainty fit)")
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:  # truncated zip, unpickling errors, ...
        raise CheckpointError(
            f"Uncertainty head file {str(path)!r} is corrupt or truncated ({type(exc).__name__})"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != HEAD_FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a torchcal uncertainty head ({HEAD_FORMAT})")
    try:
        head = UncertaintyHead(state["in_features"], width=state["width"], depth=state["depth"])
        bad = nonfinite_parameters(state["state_dict"])  # values, not only the checksum
        if bad:
            raise ValueError(f"its parameter {bad} is NaN/Inf")
        head.load_state_dict(state["state_dict"])
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"Uncertainty head file {str(path)!r} is malformed: {exc}; fit "
                              "the head again (torchcal uncertainty fit)") from exc
    return head.eval(), dict(state.get("meta") or {})
