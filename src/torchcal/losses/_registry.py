"""One registry of training losses (timm-style).

``@register_loss("name")`` on an ``nn.Module`` subclass (or a factory returning one) adds it to
the table; :func:`create_loss` builds one by name with keyword hyperparameters and
:func:`list_losses` lists the names.  The CLI's ``--loss`` reads the same table.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

__all__ = ["register_loss", "create_loss", "list_losses", "loss_entrypoint"]

_LOSSES: dict[str, Callable[..., nn.Module]] = {}
T = TypeVar("T")


def register_loss(name: str) -> Callable[[T], T]:
    """Class/factory decorator registering a loss under ``name`` (lower case, unique)."""
    if not isinstance(name, str) or not name or name != name.lower():
        raise ValueError(f"Expected `name` to be a non-empty lower-case string, got {name!r}")

    def deco(fn: T) -> T:
        if name in _LOSSES and _LOSSES[name] is not fn:
            raise ValueError(f"Loss {name!r} is already registered")
        _LOSSES[name] = fn  # type: ignore[assignment]
        return fn

    return deco


def _ensure_loaded() -> None:
    # Importing the package registers every built-in loss.
    from .. import losses  # noqa: F401


def list_losses(pattern: str | None = None) -> list[str]:
    """Sorted registered loss names, optionally filtered by a shell-style ``pattern``."""
    _ensure_loaded()
    names = sorted(_LOSSES)
    if pattern is not None:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    return names


def loss_entrypoint(name: str) -> Callable[..., nn.Module]:
    """The class or factory registered as ``name``."""
    _ensure_loaded()
    if name not in _LOSSES:
        raise ValueError(
            f"Unknown loss {name!r}; expected one of: {', '.join(sorted(_LOSSES))}"
        )
    return _LOSSES[name]


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
