"""Named training recipes: the source papers' exact settings (REFERENCE.md §6).

CIFAR (all three focal-family papers): SGD lr 0.1, momentum 0.9, weight decay 5e-4, batch 128,
350 epochs, lr ×0.1 at epochs 150 and 250, gradient-norm clipping at 2, each loss reduced over the
batch as its published code does (``reduction="published"``), 10% of the training set held out
for validation with NumPy seed 1.  Tiny-ImageNet: the same with 100 epochs, drops at 40 and 60,
batch 64.  ImageNet: the standard ResNet-50 recipe (SGD lr 0.1 for batch 256, momentum 0.9,
weight decay 1e-4, 90 epochs, ×0.1 at 30 and 60, no clipping).  ``digits-mlp``: the embedded
benchmark of ``torchcal demo`` (64-256-256-10 MLP, lr 0.05, batch 64, 100 epochs, ×0.1 at 50%
and 75%, plain mean reduction, no clipping; seconds on a CPU; one CPU thread, since threads
only add synchronisation to a model this small (10x slower on a busy machine); a checkpoint
every epoch, as every recipe: 100 of them add about 4% to the run, 7.9 s vs 7.6 s).
``mnist1d-multitask``: two tasks on one trunk (the
digit and the generator's translation, :mod:`torchcal.train.multitask`), AdamW 3e-3 with a
cosine schedule, 25 epochs, 4,000 / 1,000 / 4,000 signals.  ``mnist1d-cnn``: the CIFAR setting and schedule above (SGD lr 0.1, momentum 0.9, weight decay
5e-4, batch 128, published reductions, clipping at 2, 350 epochs, ×0.1 at 150 and 250) on
MNIST-1D (:func:`torchcal.data.load_mnist1d_splits`: 2,000 / 2,000 / 8,000 signals generated
with the package's seed 42, the same data for every training seed, as CIFAR's fixed split) with
the paper's 1-D CNN at width 64; its OOD set is MNIST-1D's shuffled variant.  The test split is
evaluated for the log every 10 epochs (and after the last): a forward pass over the 8,000 test
signals costs about 1.5 training epochs on a CPU.

Dual focal's γ was tuned per data set and architecture in its paper; the recipes carry those
values in ``loss_defaults`` (an explicit ``--loss-arg gamma=...`` wins).

>>> get_recipe("cifar10-resnet50").milestones
[150, 250]
>>> "digits-mlp" in list_recipes()
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .._registry import Registry
from ..data.mnist1d import MNIST1D_SEED
from ..errors import UnknownRecipeError
from .config import MultitaskConfig, TrainConfig

__all__ = ["get_recipe", "list_recipes", "register_recipe", "UnknownRecipeError", "RECIPES"]


#: The recipe table (a :class:`torchcal._registry.Registry` of zero-argument factories).
RECIPES: Registry[Callable[[], TrainConfig]] = Registry("recipe", error=UnknownRecipeError)


def register_recipe(name: str, factory: Callable[[], TrainConfig] | TrainConfig | None = None,
                    *, display: str | None = None, paper: str | None = None):
    """Register a recipe under ``name``: a :class:`TrainConfig` or a zero-argument factory.

    Usable as a decorator (``@register_recipe("my-recipe")`` on a factory) or a call.
    """
    if not isinstance(name, str) or not name or name != name.lower():
        raise ValueError(f"Expected `name` to be a non-empty lower-case string, got {name!r}")

    def add(f: Callable[[], TrainConfig] | TrainConfig):
        if isinstance(f, TrainConfig):
            cfg = f

            def f_cfg() -> TrainConfig:
                return dataclasses.replace(cfg)

            fn = f_cfg
        elif callable(f):
            fn = f
        else:
            raise TypeError(f"Expected a TrainConfig or a factory, got {type(f).__name__}")
        if name in RECIPES:
            raise ValueError(f"Recipe {name!r} is already registered")
        RECIPES.register(name, fn, display=display, paper=paper)
        return f

    if factory is None:
        return add
    return add(factory)


def list_recipes(pattern: str | None = None) -> list[str]:
    """Sorted recipe names, optionally filtered by a shell-style ``pattern``."""
    return RECIPES.names(pattern)


def get_recipe(name: str) -> TrainConfig:
    """A fresh :class:`TrainConfig` of recipe ``name`` (its ``recipe`` field set to ``name``)."""
    cfg = RECIPES.get(name)()
    # deep-copy the mutable fields so callers may edit them freely
    cfg = dataclasses.replace(
        cfg, recipe=name, model_kwargs=dict(cfg.model_kwargs), loss_kwargs=dict(cfg.loss_kwargs),
        loss_defaults={k: dict(v) for k, v in cfg.loss_defaults.items()},
        data_kwargs=dict(cfg.data_kwargs),
        ood_kwargs={k: dict(v) for k, v in cfg.ood_kwargs.items()}, milestones=list(cfg.milestones),
        milestone_fractions=None if cfg.milestone_fractions is None else list(cfg.milestone_fractions),
    )
    return cfg


# ------------------------------------------------------------------------------------------
# the papers' recipes
# ------------------------------------------------------------------------------------------
#: Dual focal's published γ (Tao et al. 2023), per (dataset, model).
DUAL_FOCAL_GAMMA = {
    ("cifar10", "resnet50"): 5.0, ("cifar10", "resnet110"): 4.5, ("cifar10", "wrn26_10"): 2.6,
    ("cifar10", "densenet121"): 5.0, ("cifar100", "resnet50"): 5.0,
    ("cifar100", "resnet110"): 6.1, ("cifar100", "wrn26_10"): 3.9,
    ("cifar100", "densenet121"): 3.4, ("tinyimagenet", "resnet50_tiny"): 2.3,
}
#: Label smoothing's α and focal's γ of the papers' tables.
_COMMON_LOSS_DEFAULTS = {"ls": {"alpha": 0.05}, "focal": {"gamma": 3.0}}


def _loss_defaults(dataset: str, model: str) -> dict[str, dict[str, float]]:
    d = {k: dict(v) for k, v in _COMMON_LOSS_DEFAULTS.items()}
    if (dataset, model) in DUAL_FOCAL_GAMMA:
        d["dual_focal"] = {"gamma": DUAL_FOCAL_GAMMA[(dataset, model)]}
    return d


def _cifar(dataset: str, model: str) -> TrainConfig:
    return TrainConfig(
        dataset=dataset, model=model, loss="ce", loss_defaults=_loss_defaults(dataset, model),
        epochs=350, batch_size=128, lr=0.1, momentum=0.9, weight_decay=5e-4,
        milestones=[150, 250], lr_gamma=0.1, grad_clip=2.0, reduction="published",
        val_fraction=0.1, data_seed=1, select_best_by="ece",
    )


for _ds in ("cifar10", "cifar100"):
    for _tag, _model in (("resnet50", "resnet50"), ("resnet110", "resnet110"),
                         ("wrn26-10", "wrn26_10"), ("densenet121", "densenet121")):
        register_recipe(f"{_ds}-{_tag}", (lambda d=_ds, m=_model: _cifar(d, m)))


@register_recipe("tinyimagenet-resnet50")
def _tinyimagenet() -> TrainConfig:
    return TrainConfig(
        dataset="tinyimagenet", model="resnet50_tiny", loss="ce",
        loss_defaults=_loss_defaults("tinyimagenet", "resnet50_tiny"),
        epochs=100, batch_size=64, lr=0.1, momentum=0.9, weight_decay=5e-4,
        milestones=[40, 60], lr_gamma=0.1, grad_clip=2.0, reduction="published",
        data_seed=1, select_best_by="ece",
    )


@register_recipe("imagenet-resnet50")
def _imagenet() -> TrainConfig:
    return TrainConfig(
        dataset="imagenet", model="imagenet_resnet50", loss="ce",
        loss_defaults={k: dict(v) for k, v in _COMMON_LOSS_DEFAULTS.items()},
        epochs=90, batch_size=256, lr=0.1, momentum=0.9, weight_decay=1e-4,
        milestones=[30, 60], lr_gamma=0.1, grad_clip=None, reduction="mean",
        data_seed=1, select_best_by="ece", num_workers=8,
    )


@register_recipe("digits-mlp")
def _digits() -> TrainConfig:
    return TrainConfig(
        dataset="digits", model="mlp", loss="ce", loss_defaults={},
        epochs=100, batch_size=64, lr=0.05, momentum=0.9, weight_decay=5e-4,
        milestones=[50, 75], milestone_fractions=[0.5, 0.75], lr_gamma=0.1, grad_clip=None,
        reduction="mean", data_seed=None, select_best_by="ece", checkpoint_every=1,
        eval_test_every=1, device="cpu", num_threads=1,
    )


@register_recipe("mnist1d-cnn")
def _mnist1d() -> TrainConfig:
    # the CIFAR setting and schedule; the split sizes are data args (val_fraction is not used)
    return dataclasses.replace(_cifar("mnist1d", "mnist1d_cnn"), data_seed=MNIST1D_SEED,
                               eval_test_every=10)


@register_recipe("mnist1d-multitask")
def _mnist1d_multitask() -> TrainConfig:
    # Kendall et al.'s setting on MNIST-1D: one trunk (the paper's CNN at width 64), the digit
    # and the generator's translation; AdamW 3e-3 with a cosine schedule, 25 epochs, 4,000 /
    # 1,000 / 4,000 signals (see torchcal.train.multitask)
    return TrainConfig(
        dataset="mnist1d", model="mnist1d_cnn", loss="ce", epochs=25, batch_size=128, lr=3e-3,
        weight_decay=1e-4, milestones=[], grad_clip=None, reduction="mean",
        data_seed=MNIST1D_SEED, select_best_by="none", evaluate=False, num_threads=1,
        data_kwargs={"with_params": True, "n_train": 4000, "n_val": 1000, "n_test": 4000},
        multitask=MultitaskConfig(tasks=["class", "translation"], task_weighting="kendall"),
        device="cpu",
    )
