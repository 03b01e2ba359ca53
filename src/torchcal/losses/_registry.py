"""One registry of training losses (timm-style).

``@register_loss("name")`` on an ``nn.Module`` subclass (or a factory returning one) adds it to
the table; :func:`create_loss` builds one by name with keyword hyperparameters and
:func:`list_losses` lists the names.  The CLI's ``--loss`` reads the same table.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from torch import nn

from .._registry import Registry

__all__ = ["register_loss", "create_loss", "list_losses", "loss_entrypoint", "LOSSES"]

# The papers the built-in losses come from (their registry ``paper``; the report's claims cite
# them from there).
MUKHOTI_2020 = ("Mukhoti et al. 2020, *Calibrating Deep Neural Networks using Focal Loss* "
                "(NeurIPS)")
KUMAR_2018 = ("Kumar et al. 2018, *Trainable Calibration Measures for Neural Networks from "
              "Kernel Mean Embeddings* (ICML)")
LIN_2025 = "Lin et al. 2025 (BSCE-GRA: the Brier-score uncertainty weights each sample's gradient)"
#: the comparison losses the BSCE-GRA repository implements beside BSCE-GRA
LIN_2025_CODE = "Lin et al. 2025, the BSCE-GRA repository's comparison losses"

T = TypeVar("T")


#: The loss table (a :class:`torchcal._registry.Registry`): display names, canonical order and
#: papers of every registered loss, read by the report and the command line; its first lookup
#: imports the package, which registers every built-in loss.
LOSSES: Registry[Callable[..., nn.Module]] = Registry("loss", modules=("torchcal.losses",))


def register_loss(name: str, *, display: str | None = None, order: float | None = None,
                  paper: str | None = None, tags: Iterable[str] = ()) -> Callable[[T], T]:
    """Class/factory decorator registering a loss under ``name`` (lower case, unique), with its
    display name, canonical table position, paper and tags (:class:`~torchcal._registry.Registry`).

    Tags select losses without a list elsewhere: ``"demo"`` puts a loss in the table of
    ``torchcal demo`` (its ``--full`` and noisy-digits runs), ``"variant"`` marks a published
    variant kept for faithful recipes (:func:`list_losses`'s ``tag``).  A loss's registry name
    is its class's and its function's stem.
    """
    return LOSSES.register(name, display=display, order=order, paper=paper, tags=tags)


def list_losses(pattern: str | None = None, *, tag: str | None = None) -> list[str]:
    """Sorted registered loss names, optionally filtered by a shell-style ``pattern``; with
    ``tag``, the losses whose registry entry carries it, in the canonical table order."""
    if tag is None:
        return LOSSES.names(pattern)
    names = set(LOSSES.names(pattern))
    return [n for n in LOSSES.tagged(tag) if n in names]


def loss_entrypoint(name: str) -> Callable[..., nn.Module]:
    """The class or factory registered as ``name``."""
    return LOSSES.get(name)


def create_loss(name: str, **kwargs: Any) -> nn.Module:
    """Build the loss registered as ``name`` with hyperparameters ``kwargs``.

    Unknown names raise ``ValueError`` listing the valid ones; unknown keyword arguments raise
    ``TypeError`` listing the accepted ones.
    """
    fn = loss_entrypoint(name)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # pragma: no cover - builtins without signatures
        sig = None
    if sig is not None and not any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()
    ):
        accepted = [p for p in sig.parameters if p != "self"]
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise TypeError(
                f"Loss {name!r} got unexpected argument(s) {unknown}; accepted: {accepted}"
            )
    return fn(**kwargs)
