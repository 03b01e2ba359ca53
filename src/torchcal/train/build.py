"""Building a run's pieces from its :class:`~torchcal.train.TrainConfig`: the data splits, the
OOD sets, the model (checked against the data's input), and a trained model from a run
directory's checkpoint."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data import DATASETS, load_ood, load_splits
from ..errors import CheckpointError, DataNotFoundError
from ..models import create_model
from ..run_dir import RunDir
from .checkpoint import load_checkpoint
from .config import TrainConfig

__all__ = ["build_data", "build_model", "check_model_input", "load_ood_sets",
           "load_model_from_run", "model_from_checkpoint", "load_run_checkpoint", "data_seed"]


def data_seed(config: TrainConfig) -> int:
    """The seed of ``config``'s data split (``data_seed``, else the run's seed): runs with the
    same one share their data."""
    return int(config.seed if config.data_seed is None else config.data_seed)


def build_data(config: TrainConfig):
    """The :class:`torchcal.data.DataSplits` of ``config`` (train/val/test)."""
    return load_splits(config.dataset, config.data_root, download=config.download,
                       seed=data_seed(config), val_fraction=config.val_fraction,
                       **dict(config.data_kwargs))


def load_ood_sets(config: TrainConfig, splits: Any = None) -> dict[str, Any]:
    """OOD data sets evaluated for ``config.dataset``; absent files are skipped with a warning.

    The sets are the data set's registered default OOD sets, :func:`torchcal.data.
    default_ood_sets` (CIFAR-10: SVHN test and CIFAR-10-C
    Gaussian noise severity 5; CIFAR-100: SVHN; digits: the noisy photo patches of
    :mod:`torchcal.data.digits`, with the run's seed and noise).  A set whose input shape differs
    from the model's is skipped too.
    """
    out: dict[str, Any] = {}
    defaults = DATASETS.get(config.dataset).default_ood if config.dataset in DATASETS else ()
    for ood in defaults:  # each with its declared options (the data set's registration)
        name = ood.name
        kw = ood.options(data_seed(config), config.data_kwargs)
        kw.update(dict(config.ood_kwargs.get(name, {})))
        try:
            ds = load_ood(name, config.data_root, download=config.download, **kw)
        except (DataNotFoundError, FileNotFoundError) as exc:
            warnings.warn(f"OOD set {name!r} skipped: {exc}", stacklevel=2)
            continue
        if splits is not None and hasattr(ds, "data") and hasattr(splits.test, "data"):
            if tuple(ds.data.shape[1:]) != tuple(splits.test.data.shape[1:]):
                warnings.warn(
                    f"OOD set {name!r} skipped: its inputs have shape {tuple(ds.data.shape[1:])}, "
                    f"the model's {tuple(splits.test.data.shape[1:])}", stacklevel=2)
                continue
        out[name] = ds
    return out


def build_model(config: TrainConfig, num_classes: int, input_shape: Any = None) -> nn.Module:
    """The model of ``config`` (``torchcal.models.create_model``)."""
    kw = dict(config.model_kwargs)
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else None
    if config.model == "mlp" and shape is not None and "in_features" not in kw:
        n = 1
        for s in shape:
            n *= s
        kw["in_features"] = n
    if config.model == "small_cnn" and shape is not None and len(shape) == 1:
        # flat square images (the 8x8 digits): one channel, reshaped inside the net
        kw.setdefault("in_channels", 1)
        kw.setdefault("in_features", shape[0])
    try:
        return create_model(config.model, num_classes, **kw)
    except TypeError as exc:  # a misspelt --model-arg: one clear line, not a traceback
        raise ValueError(f"Bad --model-arg for model {config.model!r}: {exc}") from exc


def check_model_input(model: nn.Module, input_shape: Any, num_classes: int, *,
                      model_name: str, dataset: str) -> None:
    """Check that ``model`` takes the data set's inputs, before anything of a run is written.

    Runs one forward pass on a zero batch of two samples of shape ``input_shape`` (eval mode,
    no gradient, on the model's device; the model is left in its mode) and checks that it gives
    ``(2, num_classes)`` logits.

    Raises:
        ValueError: one line naming the model, the data set and its input shape.

    >>> from torchcal.models import create_model
    >>> check_model_input(create_model("resnet20", 10), (64,), 10, model_name="resnet20",
    ...                   dataset="digits")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Model 'resnet20' cannot take the inputs of data set 'digits' (one sample of shape (64,)): ...
    """
    shape = tuple(int(s) for s in input_shape)
    param = next(iter(model.parameters()), None)
    x = torch.zeros((2, *shape), device=param.device if param is not None else "cpu")
    was_training = model.training
    model.eval()
    head = (f"Model {model_name!r} cannot take the inputs of data set {dataset!r} (one sample of "
            f"shape {shape})")
    try:
        with torch.no_grad():
            out = model(x)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{head}: {msg[:200]}; choose a model made for this input "
                         "(--model)") from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, int(num_classes)):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{head}: it gives outputs of shape {got} for 2 samples, expected "
                         f"(2, {int(num_classes)}) logits")


def load_model_from_run(run_dir: str | Path, checkpoint: str = "last", device: str = "cpu",
                        ) -> tuple[nn.Module, TrainConfig]:
    """Rebuild a run's model from ``RUN_DIR/checkpoints/<checkpoint>.pt`` (``weights_only=True``).

    Returns ``(model in eval mode on device, TrainConfig)``.  Raises
    :class:`~torchcal.errors.CheckpointError` for a missing/corrupt checkpoint.
    """
    return model_from_checkpoint(load_run_checkpoint(run_dir, checkpoint), run_dir, device)


def model_from_checkpoint(state: dict[str, Any], run_dir: str | Path, device: Any = "cpu",
                          ) -> tuple[nn.Module, TrainConfig]:
    """The trained model of a loaded run checkpoint (in eval mode, on ``device``) and its
    :class:`TrainConfig`; :class:`~torchcal.errors.CheckpointError` when the weights do not fit
    the model the config names."""
    config = TrainConfig.from_dict(state["config"])
    model = build_model(config, int(state["num_classes"]), state.get("input_shape"))
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as exc:
        raise CheckpointError(
            f"Checkpoint of {str(run_dir)!r} does not fit model {config.model!r}: "
            f"{str(exc).splitlines()[0]}") from exc
    model.to(device).eval()
    return model, config


def load_run_checkpoint(run_dir: str | Path, checkpoint: str = "last") -> dict[str, Any]:
    """The verified state of ``RUN_DIR/checkpoints/<checkpoint>.pt`` (``"last"`` or ``"best"``)."""
    path = RunDir(run_dir).checkpoint(checkpoint)  # ValueError for a checkpoint not last/best
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"Run directory {str(run_dir)!r} does not exist")
    if checkpoint == "best" and not path.exists():
        _explain_missing_best(RunDir(run_dir), path)
    return load_checkpoint(path)


def _explain_missing_best(rdir: RunDir, path: Path) -> None:
    """Raise a CheckpointError saying why ``best.pt`` is absent and what to do instead."""
    try:
        select = rdir.read_config().get("select_best_by")
    except (OSError, ValueError):
        select = None
    if select == "none":
        why = ("the run was trained with --select-best-by none, which keeps no best epoch; "
               "evaluate its last epoch (--checkpoint last), or train again with "
               "--select-best-by ece (or nll, error)")
    else:
        why = ("no epoch was checkpointed as the best yet (the run ended or was stopped before "
               "one, or every validation value was NaN); evaluate --checkpoint last")
    raise CheckpointError(f"Checkpoint {str(path)!r} does not exist: {why}")
