"""Train one run: SGD + multistep schedule, any registered loss, checkpoint/resume, DDP, AMP.

One function, :func:`train`, runs a :class:`~torchcal.train.TrainConfig` end to end with the
training engine (:mod:`torchcal.train.engine`) as a stack of one run
(:class:`~torchcal.train.stacks.SoloModel`): the same steps that train a pack of runs.

* data from :func:`torchcal.data.load_splits`; in-memory data sets are batched by index on the
  device (augmentation batched on the device too), the ImageNet folder through a DataLoader;
* the epoch's data order and augmentation are derived from ``(seed, epoch)`` alone, and the
  global torch RNG is reseeded from ``(seed, epoch)`` each epoch, so ``resume`` continues
  exactly where an uninterrupted run would be (CPU: identical final metrics);
* the loss comes from :func:`torchcal.losses.create_loss` and is driven only through the
  protocol of :mod:`torchcal.losses.base` (``set_epoch`` before each epoch, ``on_validation``
  after each validation pass when ``wants_validation``, extra passes every ``update_every``
  batches);
* a checkpoint (model, optimiser, scheduler, loss state, RNG states, config) is written
  atomically to ``RUN_DIR/checkpoints/last.pt`` every ``checkpoint_every`` epochs (staged and
  committed, :mod:`torchcal.train.pack_commit`), and ``best.pt`` holds the epoch with the best
  validation ``select_best_by`` metric;
* ``RUN_DIR/log.jsonl`` gets one JSON object per epoch (flushed each epoch, fsynced with the
  checkpoint; a resume drops the lines past its checkpoint);
* at the end, the last epoch's model is evaluated into ``RUN_DIR/logits/*.npz`` and
  ``RUN_DIR/results.json`` (``evaluate=True``).

Two plug-ins with the same hooks (:class:`~torchcal.train.plugin.RunPlugin`) change what a run
trains without a loop of their own: the joint uncertainty head (``joint_head``,
:class:`~torchcal.train.joint_head.JointHead`) and the multi-task strategy (``multitask``: a class
and a regression target weighted as Kendall et al., :class:`~torchcal.train.multitask.TaskHead`).

Under ``torchrun`` (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel (gloo on CPU,
NCCL on CUDA), every rank trains on its shard of the epoch's permutation, ``batch_size`` is the
global batch, and only rank 0 logs and writes files.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
import torch.distributed as dist

from .._io import exclusive_lock
from .config import TrainConfig
from .device import is_cuda
from .distributed import DistEnv, cleanup_distributed, setup_distributed
from .engine import Lane, run_stack
from .pack_commit import reconcile_staged
from .run import build_run, resume_state
from .stacks import SoloModel

__all__ = ["train", "fit"]


def train(config: TrainConfig) -> dict[str, Any]:
    """Train ``config`` end to end and return a summary.

    Returns:
        ``{"run_dir", "epochs", "final": {"train_*", "val_*", "test_*"}, "best": {"metric",
        "value", "epoch"}, "results": results dict or None, "seconds", "resumed_from"}``
        (on every rank; ``results`` only on rank 0).

    Raises:
        TorchcalError: the run directory already holds a run and ``resume`` is False, or the
            checkpoint to resume does not match the config.
        DivergedError: the training loss or the parameters became NaN/Inf (the last good
            checkpoint is kept).
        InUseError: another process is using the run directory (it holds
            ``RUN_DIR/.torchcal.lock`` for the life of its run).
        ValueError: a bad config field, unknown loss/model/data set.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"Expected `config` to be a TrainConfig, got {type(config).__name__}")
    config.validate()
    t_start = time.perf_counter()
    if config.num_threads is not None:
        torch.set_num_threads(int(config.num_threads))

    dev_type = "cuda" if is_cuda(config.device) else "cpu"
    env = setup_distributed(dev_type)
    try:
        # rank 0 owns the run directory for the whole run: a second process fails at once
        with exclusive_lock(config.out_dir) if env.is_main else contextlib.nullcontext():
            summary = fit(config, env)
    finally:
        cleanup_distributed(env)
    summary["seconds"] = time.perf_counter() - t_start
    return summary


def fit(config: TrainConfig, env: DistEnv | None = None) -> dict[str, Any]:
    """The engine on ``config`` alone (:func:`train` also validates ``config``, sets up the
    process group and holds the run directory's lock): finish or drop a killed run's staged
    checkpoint, resume, build, train the remaining epochs, evaluate the last one."""
    env = env or DistEnv()
    if env.is_main:
        reconcile_staged([config.out_dir])
    if env.enabled and dist.is_initialized():
        dist.barrier()  # every rank reads the checkpoint rank 0 settled
    r = build_run(config, env, resume_state(config, env))
    results: list[Any] = [None]
    run_stack(SoloModel(r), [Lane(0, r)], results)
    return results[0]
