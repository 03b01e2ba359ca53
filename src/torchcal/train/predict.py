"""From a model to logits: data building, batched prediction (DDP-aware) and run evaluation.

:func:`predict_logits` runs a model over a data set in order and returns its logits and labels;
under DDP every rank predicts its shard and the shards are gathered with the padding a
distributed sampler adds dropped, so every sample counts exactly once.  :func:`evaluate_run`
loads a run's checkpoint, writes ``RUN_DIR/logits/{val,test,ood_<name>}.npz`` and
``RUN_DIR/results.json`` (through :mod:`torchcal.evaluate`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._io import exclusive_lock
from ..errors import CheckpointError, DataNotFoundError, TorchcalError
from ..evaluate import evaluate_logits, save_logits, write_results
from ..runs import RunDir
from .checkpoint import load_checkpoint
from .config import TrainConfig
from .distributed import DistEnv, gather_padded, shard_indices

__all__ = [
    "build_data",
    "build_model",
    "check_model_input",
    "load_ood_sets",
    "load_model_from_run",
    "predict_logits",
    "evaluate_run",
    "collect_predictions",
    "write_predictions",
    "resolve_device",
    "BatchSource",
]


# ------------------------------------------------------------------------------------------
# device / data / model
# ------------------------------------------------------------------------------------------
def resolve_device(device: str, env: DistEnv | None = None) -> torch.device:
    """``"auto"`` -> ``cuda:LOCAL_RANK`` when CUDA is available, else CPU."""
    env = env or DistEnv()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"Expected `device` to be a valid torch device, got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"Expected `device` to be an available device, got {device!r}, but "
                             "CUDA is not available here (use --device cpu or auto)")
        if dev.index is None:
            dev = torch.device("cuda", env.local_rank if env.enabled else torch.cuda.current_device())
    return dev


def _data_seed(config: TrainConfig) -> int:
    return int(config.seed if config.data_seed is None else config.data_seed)


def build_data(config: TrainConfig):
    """The :class:`torchcal.data.DataSplits` of ``config`` (train/val/test)."""
    from ..data import load_splits

    return load_splits(config.dataset, config.data_root, download=config.download,
                       seed=_data_seed(config), val_fraction=config.val_fraction,
                       **dict(config.data_kwargs))


def load_ood_sets(config: TrainConfig, splits: Any = None) -> dict[str, Any]:
    """OOD data sets evaluated for ``config.dataset``; absent files are skipped with a warning.

    The sets are :func:`torchcal.data.default_ood_sets` (CIFAR-10: SVHN test and CIFAR-10-C
    Gaussian noise severity 5; CIFAR-100: SVHN; digits: the noisy photo patches of
    :mod:`torchcal.data.digits`, with the run's seed and noise).  A set whose input shape differs
    from the model's is skipped too.
    """
    from ..data import default_ood_sets, load_ood

    out: dict[str, Any] = {}
    for name in default_ood_sets(config.dataset):
        kw: dict[str, Any] = {}
        if name == "digits_ood":
            kw = {"seed": _data_seed(config),
                  **{k: v for k, v in config.data_kwargs.items() if k == "noise_std"}}
        elif name == "cifar10c":
            kw = {"corruption": "gaussian_noise", "severity": 5}
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
    from ..models import create_model

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
    state = _load_run_checkpoint(run_dir, checkpoint)
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


def _load_run_checkpoint(run_dir: str | Path, checkpoint: str) -> dict[str, Any]:
    path = RunDir(run_dir).checkpoint(checkpoint)  # ValueError for a checkpoint not last/best
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"Run directory {str(run_dir)!r} does not exist")
    return load_checkpoint(path)


# ------------------------------------------------------------------------------------------
# batches
# ------------------------------------------------------------------------------------------
def _is_array_dataset(ds: Any) -> bool:
    return isinstance(getattr(ds, "data", None), torch.Tensor) and isinstance(
        getattr(ds, "labels", None), torch.Tensor)


class BatchSource:
    """Fetches normalised batches of a data set by index, on the device.

    In-memory ``ArrayDataset``: the tensors are moved to the device once and batches are index
    gathers (no DataLoader, no workers); uint8 images are (optionally augmented and) normalised
    on the device.  Other ``Dataset`` s (the ImageNet folder) go through a DataLoader over the
    given indices.
    """

    def __init__(self, dataset: Any, device: torch.device, *, mean: Any = None, std: Any = None,
                 channels_last: bool = False, num_workers: int = 0, padding: int = 4) -> None:
        self.dataset = dataset
        self.padding = int(padding)
        self.device = device
        self.array = _is_array_dataset(dataset)
        self.mean, self.std = mean, std
        self.channels_last = channels_last and device.type == "cuda"
        self.num_workers = num_workers
        if self.array:
            self.data = dataset.data.to(device)
            self.labels = dataset.labels.to(device)
            self.n = int(self.labels.shape[0])
        else:
            self.n = len(dataset)

    def _prepare(self, x: torch.Tensor, augment: bool, generator: torch.Generator | None):
        if x.dtype == torch.uint8:
            from ..data.augment import normalize, random_crop_flip

            if augment:
                x = random_crop_flip(x, padding=self.padding, generator=generator)
            if self.mean is None or self.std is None:
                x = x.float() / 255.0
            else:
                x = normalize(x, self.mean, self.std)
        elif not x.is_floating_point():
            x = x.float()
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def batches(self, indices: torch.Tensor, batch_size: int, *, augment: bool = False,
                generator: torch.Generator | None = None, drop_singleton: bool = False,
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(x, y)`` on the device for ``indices`` in order, ``batch_size`` at a time.

        ``drop_singleton`` drops a final batch of one sample (BatchNorm cannot train on it).
        """
        n = int(indices.numel())
        stop = n - 1 if (drop_singleton and n % batch_size == 1 and n > 1) else n
        if self.array:
            idx_dev = indices.to(self.device)
            for s in range(0, stop, batch_size):
                i = idx_dev[s:min(s + batch_size, stop)]
                yield self._prepare(self.data[i], augment, generator), self.labels[i]
            return
        from torch.utils.data import DataLoader

        loader = DataLoader(self.dataset, batch_size=batch_size,
                            sampler=indices[:stop].tolist(), num_workers=self.num_workers,
                            pin_memory=self.device.type == "cuda",
                            persistent_workers=False)
        for x, y in loader:
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True).long()
            yield self._prepare(x, False, None), y


def _autocast(device: torch.device, amp: str):
    if device.type != "cuda" or amp == "off":
        return nullcontext()
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


@torch.no_grad()
def _predict_indices(model: nn.Module, source: BatchSource, indices: torch.Tensor,
                     batch_size: int, amp: str = "off", features: bool = False):
    outs, labels = [], []
    for x, y in source.batches(indices, batch_size):
        with _autocast(source.device, amp):
            out = model.forward_features(x) if features else model(x)
        outs.append(out.float())
        labels.append(y)
    if not outs:
        raise ValueError("Expected a non-empty data set to predict on")
    return torch.cat(outs), torch.cat(labels)


def predict_logits(model: nn.Module, dataset: Any, device: str | torch.device = "cpu",
                   batch_size: int = 256, *, mean: Any = None, std: Any = None,
                   amp: str = "off", env: DistEnv | None = None, source: BatchSource | None = None,
                   return_local: bool = False):
    """Logits of ``model`` on every sample of ``dataset``, in order.

    Args:
        model: a classifier (put in eval mode here; a DDP wrapper is unwrapped).
        dataset: an ``ArrayDataset`` (uint8 images normalised with ``mean``/``std``, or float
            features) or any ``Dataset`` yielding ``(x, y)``.
        device: where to run.
        batch_size: prediction batch size (per process).
        env: under DDP (``env.world_size > 1``) each rank predicts its shard; the shards are
            gathered and the samples the distributed sampler pads in are dropped.

    Returns:
        ``(logits float32 (N, C), labels int64 (N,))`` on ``device`` (every rank gets all N).
        With ``return_local=True`` also this rank's unpadded share ``(logits, labels)``.

    Example:
        >>> from torchcal.data import ArrayDataset
        >>> ds = ArrayDataset(torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]),
        ...                   torch.tensor([0, 1, 1]))
        >>> z, y = predict_logits(nn.Identity(), ds, batch_size=2)
        >>> z.tolist(), y.tolist()
        ([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]], [0, 1, 1])
    """
    env = env or DistEnv()
    device = torch.device(device)
    module = getattr(model, "module", model)
    was_training = module.training
    module.eval()
    src = source or BatchSource(dataset, device, mean=mean, std=std)
    n = src.n
    shard, n_valid = shard_indices(torch.arange(n), env.rank, env.world_size)
    try:
        local_z, local_y = _predict_indices(module, src, shard, batch_size, amp)
    finally:
        module.train(was_training)
    z = gather_padded(local_z, n, env)
    y = gather_padded(local_y, n, env)
    if return_local:
        return z, y, (local_z[:n_valid], local_y[:n_valid])
    return z, y


# ------------------------------------------------------------------------------------------
# evaluation of a run
# ------------------------------------------------------------------------------------------
def _meta(config: TrainConfig, epoch: int, checkpoint: str) -> dict[str, Any]:
    return {"dataset": config.dataset, "model": config.model, "loss": config.loss,
            "loss_kwargs": config.effective_loss_kwargs(), "seed": config.seed,
            "recipe": config.recipe, "epochs": config.epochs, "epoch": int(epoch),
            "checkpoint": checkpoint}


def collect_predictions(model: nn.Module, splits: Any, ood_sets: dict[str, Any],
                        config: TrainConfig, *, device: torch.device | str = "cpu",
                        env: DistEnv | None = None, batch_size: int | None = None,
                        ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Val/test/OOD logits and labels (``{"val", "test", "ood_<name>"}``), gathered on every
    rank under DDP (a collective: every rank must call it)."""
    env = env or DistEnv()
    device = torch.device(device)
    bs = int(batch_size or max(256, config.batch_size))
    mean, std = getattr(splits, "mean", None), getattr(splits, "std", None)
    preds: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name in ("val", "test"):
        preds[name] = predict_logits(model, getattr(splits, name), device, bs, mean=mean, std=std,
                                     amp=config.amp, env=env)
    for name, ds in ood_sets.items():
        preds[f"ood_{name}"] = predict_logits(model, ds, device, bs, mean=mean, std=std,
                                              amp=config.amp, env=env)
    return preds


def write_predictions(preds: dict[str, tuple[torch.Tensor, torch.Tensor]], run_dir: str | Path,
                      config: TrainConfig, *, epoch: int, checkpoint: str = "last",
                      write: bool = True) -> dict[str, Any]:
    """Save ``RUN_DIR/logits/<name>.npz`` and ``RUN_DIR/results.json`` (for ``checkpoint="best"``:
    ``logits-best/`` and ``results-best.json``, leaving the last epoch's files); return the results.

    Run it in one process (under DDP: rank 0, after the process group is gone, since the
    metrics would otherwise try to sync across ranks).
    """
    run = RunDir(run_dir)
    if write:  # "best" never replaces the last epoch's files
        for name, (z, y) in preds.items():
            save_logits(run.logits(name, checkpoint), z, y)
    results = evaluate_logits(
        val_logits=preds["val"][0], val_labels=preds["val"][1],
        test_logits=preds["test"][0], test_labels=preds["test"][1],
        ood_logits={k[len("ood_"):]: v[0] for k, v in preds.items() if k.startswith("ood_")},
        n_bins=config.n_bins, meta=_meta(config, epoch, checkpoint))
    if write:
        write_results(run.results(checkpoint), results)
    return results


def evaluate_run(run_dir: str | Path, checkpoint: str = "last", *, data_root: str | None = None,
                 device: str = "cpu", batch_size: int | None = None) -> dict[str, Any]:
    """Evaluate a run's checkpoint: write ``logits/*.npz`` and ``results.json``; return results.

    The last epoch's checkpoint writes ``logits/`` and ``results.json``; ``checkpoint="best"``
    writes ``logits-best/`` and ``results-best.json`` beside them, so that neither evaluation
    replaces the other (:func:`torchcal.evaluate.results_filename`).

    Args:
        run_dir: a ``torchcal train`` run directory.
        checkpoint: ``"last"`` (the last epoch, as the papers report) or ``"best"``.
        data_root: override the data root recorded in the run's config.
        device: where to run the model.

    Raises:
        CheckpointError: the checkpoint is missing or corrupt.
        DataNotFoundError: the data set files are absent.
        InUseError: another process owns the run directory (a training or evaluation of it).
    """
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"Run directory {str(run_dir)!r} does not exist")
    with exclusive_lock(run_dir):  # the run's owner for as long as this writes into it
        return _evaluate_run(run_dir, checkpoint, data_root, device, batch_size)


def _evaluate_run(run_dir, checkpoint, data_root, device, batch_size) -> dict[str, Any]:
    state = _load_run_checkpoint(run_dir, checkpoint)
    config = TrainConfig.from_dict(state["config"])
    if data_root is not None:
        config.data_root = str(data_root)
    dev = resolve_device(device)
    model = build_model(config, int(state["num_classes"]), state.get("input_shape"))
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as exc:
        raise CheckpointError(
            f"Checkpoint of {str(run_dir)!r} does not fit model {config.model!r}: "
            f"{str(exc).splitlines()[0]}") from exc
    model.to(dev).eval()
    splits = build_data(config)
    ood = load_ood_sets(config, splits)
    preds = collect_predictions(model, splits, ood, config, device=dev, batch_size=batch_size)
    return write_predictions(preds, run_dir, config, epoch=int(state["epoch"]),
                             checkpoint=checkpoint)


def read_config(run_dir: str | Path) -> TrainConfig:
    """The :class:`TrainConfig` stored in ``RUN_DIR/config.json``."""
    p = RunDir(run_dir).config
    try:
        return TrainConfig.from_dict(json.loads(p.read_text(encoding="utf-8")))
    except FileNotFoundError as exc:
        raise TorchcalError(f"Run directory {str(run_dir)!r} has no {p.name}") from exc
    except (json.JSONDecodeError, ValueError, TypeError) as exc:
        raise TorchcalError(f"Config file {str(p)!r} is malformed: {exc}") from exc
