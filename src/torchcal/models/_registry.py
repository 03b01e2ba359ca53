"""The model registry: ``@register_model`` fills a table read by :func:`create_model`."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .._registry import Registry

__all__ = ["register_model", "create_model", "list_models", "adapt_state_dict", "MODELS"]

#: The model table (a :class:`torchcal._registry.Registry`).
MODELS: Registry[Callable[..., nn.Module]] = Registry("model")


def register_model(name: str, *, display: str | None = None, order: float | None = None,
                   paper: str | None = None,
                   ) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a model constructor ``fn(num_classes, **kw) -> nn.Module`` under
    ``name`` (lower case, unique), with its display name, table position and paper."""
    return MODELS.register(name, display=display, order=order, paper=paper)


def list_models(pattern: str | None = None) -> list[str]:
    """Sorted names of the registered models, optionally filtered by a glob ``pattern``.

    >>> "resnet50" in list_models()
    True
    >>> list_models("resnet5*")
    ['resnet50', 'resnet50_tiny']
    """
    return MODELS.names(pattern)


def create_model(name: str, num_classes: int, **kwargs) -> nn.Module:
    """Build the registered model ``name`` with ``num_classes`` outputs.

    Every model has ``forward(x) -> logits``, ``forward_features(x) -> (N, num_features)`` (the
    pre-logit embedding), ``.num_features`` and ``.fc`` (the final :class:`torch.nn.Linear`), with
    ``forward(x) == fc(forward_features(x))``.

    Args:
        name: a name of :func:`list_models`.
        num_classes: number of output logits (positive integer).
        **kwargs: passed to the model's constructor.

    Raises:
        ValueError: unknown ``name`` (the message lists the valid ones) or bad ``num_classes``.

    >>> m = create_model("mlp", 10)
    >>> m.fc.out_features, m.num_features
    (10, 256)
    """
    fn = MODELS.get(name)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"Expected `num_classes` to be a positive integer, got {num_classes!r}")
    return fn(num_classes, **kwargs)


def adapt_state_dict(state_dict: dict) -> dict:
    """Rename the keys of a checkpoint from the papers' published training code to torchcal's.

    The CIFAR ResNets, Wide-ResNet and DenseNet here use the published module names (``conv1``,
    ``bn1``, ``layer1.0.shortcut.0``, ``dense1``, ``trans1``, ...) except the classifier, which
    is ``fc`` (the published code calls it ``linear``).  This strips the ``module.``
    (DataParallel / DDP) and ``_orig_mod.`` (``torch.compile``) prefixes and renames
    ``linear.`` to ``fc.``; other keys are kept.

    >>> sorted(adapt_state_dict({"module.linear.weight": 1, "module.conv1.weight": 2}))
    ['conv1.weight', 'fc.weight']
    """
    out = {}
    for key, value in state_dict.items():
        k = key
        for prefix in ("module.", "_orig_mod."):
            while k.startswith(prefix):
                k = k[len(prefix):]
        if k.startswith("linear."):
            k = "fc." + k[len("linear."):]
        out[k] = value
    return out
