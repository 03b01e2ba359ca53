"""Evaluation of a trained run: its model's logits on the validation, test and OOD sets, written
as ``logits/*.npz`` and turned into ``results.json`` by :mod:`torchcal.evaluate`
(:func:`evaluate_checkpoint` from a checkpoint; the trainer calls :func:`collect_predictions` and
:func:`write_predictions` at the end of a run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._io import exclusive_lock
from ..errors import CheckpointError, TorchcalError
from ..evaluate import evaluate_logits
from ..logits_file import save_logits
from ..results_file import config_meta, write_results
from ..run_dir import RunDir
from .build import build_data, load_ood_sets, load_run_checkpoint, model_from_checkpoint
from .checkpoint import remove_stale_run_temp_files
from .config import TrainConfig, changed_fields, config_identity, describe_fields
from .device import resolve_device
from .distributed import DistEnv
from .inference import predict_logits
from .multitask import TaskHead

__all__ = ["collect_predictions", "write_predictions", "evaluate_checkpoint", "read_config"]


def _meta(config: TrainConfig, epoch: int, checkpoint: str) -> dict[str, Any]:
    """A trained run's ``meta`` (:func:`torchcal.results_file.config_meta`), with its effective loss
    arguments, the evaluated epoch and checkpoint, and its identity (``identity``, the hash,
    and ``identity_fields``, the values hashed: :func:`~torchcal.train.config.config_identity`)."""
    meta = config_meta(config.to_dict())
    meta["loss_kwargs"] = config.effective_loss_kwargs()
    return {**meta, "epoch": int(epoch), "checkpoint": checkpoint, **config_identity(config)}


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
                      write: bool = True, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Save ``RUN_DIR/logits/<name>.npz`` and ``RUN_DIR/results.json`` (for ``checkpoint="best"``:
    ``logits-best/`` and ``results-best.json``, leaving the last epoch's files); return the results.
    The results are computed (and the logits checked: finite, of matching classes) before
    anything is written, so logits that are refused never replace the run's files.
    ``extra``: blocks added to the results (a multi-task run's ``multitask``).

    Run it in one process (under DDP: rank 0, after the process group is gone, since the
    metrics would otherwise try to sync across ranks).
    """
    rdir = RunDir(run_dir)
    results = evaluate_logits(  # computed and checked before anything is written
        val_logits=preds["val"][0], val_labels=preds["val"][1],
        test_logits=preds["test"][0], test_labels=preds["test"][1],
        ood_logits={k[len("ood_"):]: v[0] for k, v in preds.items() if k.startswith("ood_")},
        n_bins=config.n_bins, meta=_meta(config, epoch, checkpoint))
    if extra:
        results.update(extra)
    if write:  # "best" never replaces the last epoch's files
        for name, (z, y) in preds.items():
            save_logits(rdir.logits(name, checkpoint), z, y)
        write_results(rdir.results(checkpoint), results)
    return results


def evaluate_checkpoint(run_dir: str | Path, checkpoint: str = "last", *,
                        data_root: str | None = None, device: str = "cpu",
                        batch_size: int | None = None) -> dict[str, Any]:
    """Evaluate a run's checkpoint: run its model on the data, write ``logits/*.npz`` and
    ``results.json``; return the results (``torchcal eval``).

    The last epoch's checkpoint writes ``logits/`` and ``results.json``; ``checkpoint="best"``
    writes ``logits-best/`` and ``results-best.json`` beside them, so that neither evaluation
    replaces the other (:func:`torchcal.run_dir.results_filename`).

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
        remove_stale_run_temp_files(run_dir)  # a killed writer's
        return _evaluate_checkpoint(run_dir, checkpoint, data_root, device, batch_size)


def _evaluate_checkpoint(run_dir, checkpoint, data_root, device, batch_size) -> dict[str, Any]:
    state = load_run_checkpoint(run_dir, checkpoint)
    dev = resolve_device(device)
    model, config = model_from_checkpoint(state, run_dir, dev)
    _check_same_run(run_dir, checkpoint, config)
    if data_root is not None:
        config = dataclasses.replace(config, data_root=str(data_root))
    splits = build_data(config)
    ood = load_ood_sets(config, splits)
    preds = collect_predictions(model, splits, ood, config, device=dev, batch_size=batch_size)
    return write_predictions(preds, run_dir, config, epoch=int(state["epoch"]),
                             checkpoint=checkpoint, extra=_task_results(model, config, splits,
                                                                        state, dev))


def _check_same_run(run_dir: str | Path, checkpoint: str, config: TrainConfig) -> None:
    """Refuse a checkpoint whose config names another run than the run directory's
    ``config.json`` (an *identity* field differs, e.g. its ``loss`` was edited): evaluating it
    would relabel the run.  A run directory without a readable ``config.json`` is not checked."""
    try:
        own = read_config(run_dir)
    except TorchcalError:
        return
    changed = changed_fields(own, config)["identity"]
    if changed:
        raise CheckpointError(
            f"Checkpoint {str(RunDir(run_dir).checkpoint(checkpoint))!r} was trained as "
            f"{describe_fields(config, changed)} but its run directory's "
            f"{RunDir(run_dir).config.name} says "
            f"{describe_fields(own, changed)}: it belongs to another run; refused (nothing "
            "written)")


def _task_results(model: nn.Module, config: TrainConfig, splits: Any, state: dict[str, Any],
                  device: torch.device) -> dict[str, Any] | None:
    """A multi-task run's ``multitask`` block, recomputed from the checkpoint's regression head
    and weighting (as training wrote it), so that evaluating the run keeps it; None for a
    classifier."""
    if not config.multitask.tasks:
        return None
    head = TaskHead(model, config, splits, device)
    try:
        head.load(state)
    except (KeyError, RuntimeError) as exc:
        raise CheckpointError(f"The checkpoint of multi-task run {config.out_dir!r} holds no "
                              f"usable regression head: {exc}") from exc
    return head.results()


def read_config(run_dir: str | Path) -> TrainConfig:
    """The :class:`TrainConfig` stored in ``RUN_DIR/config.json``."""
    p = RunDir(run_dir).config
    try:
        return TrainConfig.from_dict(RunDir(run_dir).read_config())
    except FileNotFoundError as exc:
        raise TorchcalError(f"Run directory {str(run_dir)!r} has no {p.name}") from exc
    except (ValueError, TypeError) as exc:
        raise TorchcalError(f"Config file {str(p)!r} is malformed: {exc}") from exc
