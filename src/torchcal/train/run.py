"""One run: build, resume, the best epoch, snapshots, the final evaluation.

The engine (:mod:`torchcal.train.engine`) trains a stack of M runs (M = 1 for
:func:`~torchcal.train.train`, more for :func:`~torchcal.train.train_packed`); each run of the
stack is a :class:`Run` built here the same way whatever M:

* :func:`resume_state` reads and checks the checkpoint to continue (refusing one whose
  identity fields differ from the config, warning on changed runtime settings);
* :func:`build_run` builds the data (or shares another run's), the model (initialised from the
  seed), the loss (:func:`build_loss`), the SGD optimiser and the multistep schedule
  (:func:`build_optimizer`, which a pack's ghost shares), the AMP
  scaler and the joint uncertainty head, restores the checkpoint, wraps the model for the head,
  DDP and ``torch.compile``, and prepares the run directory (``config.json``, the log truncated
  to the resumed epoch);
* :func:`train_batches` gives a run's batches of an epoch (its shard of the epoch's
  permutation, the epoch's augmentation: both from ``(seed, epoch)`` alone);
* :func:`divergence_error` words a diverged run's stop (the best epoch and the state a
  checkpoint holds are the engine's: :mod:`torchcal.train.epoch_end`);
* :func:`final_evaluation` evaluates the last epoch into ``logits/`` and ``results.json``.

The run directory's layout belongs to :mod:`torchcal.run_dir`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from .._registry import unknown_name
from ..errors import CheckpointError, DivergedError, TorchcalError, diverged_message
from ..losses import create_loss
from ..losses.base import loss_wants_validation, published_reduction
from ..models import list_models
from ..run_dir import RunDir
from .build import build_data, build_model, check_model_input
from .checkpoint import load_checkpoint, remove_stale_run_temp_files, restore_rng_state
from .config import TrainConfig, changed_fields, describe_fields
from .device import resolve_device
from .distributed import DistEnv, cleanup_distributed, epoch_permutation, epoch_seed, shard_indices
from .evaluation import collect_predictions, write_predictions
from .inference import BatchSource
from .joint_head import JointHead
from .multitask import TaskHead
from .plugin import RunPlugin
from .tracking import TensorBoardLogger, tensorboard_available

__all__ = ["Run", "build_loss", "build_optimizer", "build_run", "build_sources", "device_and_amp",
           "resume_state",
           "finished_run_numbers", "train_batches", "update_every",
           "divergence_error", "final_evaluation", "n_batches", "progress_bar",
           "tensorboard_logger", "SGD", "shares_data"]



def _undecorated(fn: Any) -> Any:
    """The function under ``torch._disable_dynamo``'s wrapper (``functools.wraps`` keeps it)."""
    return getattr(fn, "__wrapped__", fn)


_SGD_STEP = _undecorated(torch.optim.SGD.step)


class SGD(torch.optim.SGD):
    """:class:`torch.optim.SGD` that never imports ``torch._dynamo``.

    ``torch.optim`` wraps ``add_param_group``, ``zero_grad``, ``state_dict`` and
    ``load_state_dict`` in ``torch._disable_dynamo``, and ``step`` in a wrapper that sets the
    grad mode and marks TorchDynamo graph breaks: both import ``torch._dynamo`` on their first
    call in a process (2.4-2.6 s of CPU, issue 43), only for the case where TorchDynamo traces
    the optimiser.  torchcal never compiles an optimiser, so these methods are called
    unwrapped, and ``step`` sets the grad mode as torch's wrapper does.  The update itself
    (``torch.optim.SGD.step`` and the functional ``sgd``) and the state are torch's own: training
    is bit for bit that of ``torch.optim.SGD`` and a checkpoint's optimiser state is the same
    dict.  Every SGD of a run, a pack or a ghost is one of these (one plain ``torch.optim.SGD``
    in a process would pay the import again).
    """

    add_param_group = _undecorated(torch.optim.Optimizer.add_param_group)
    zero_grad = _undecorated(torch.optim.Optimizer.zero_grad)
    state_dict = _undecorated(torch.optim.Optimizer.state_dict)
    load_state_dict = _undecorated(torch.optim.Optimizer.load_state_dict)

    def step(self, closure: Any = None) -> Any:
        """One SGD update (torch's), with autograd off unless ``differentiable``."""
        previous = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return _SGD_STEP(self, closure)
        finally:
            torch.set_grad_enabled(previous)


def build_loss(config: TrainConfig, num_classes: int | None = None) -> nn.Module:
    """The loss of ``config`` with its reduction resolved (``"published"`` -> the papers')."""
    kwargs = config.effective_loss_kwargs()
    try:
        loss = create_loss(config.loss, **kwargs)
    except TypeError as exc:
        raise ValueError(f"Bad --loss-arg for loss {config.loss!r}: {exc}") from exc
    red = published_reduction(loss) if config.reduction == "published" else config.reduction
    if hasattr(loss, "reduction"):
        loss.reduction = red
    return loss


@dataclass
class Run:
    """One run of a stack: everything the engine works with, built by :func:`build_run`."""

    config: TrainConfig
    env: DistEnv
    device: torch.device
    amp: str
    dir: RunDir  # its run directory
    local_bs: int
    splits: Any
    src: dict[str, BatchSource]
    num_classes: int
    input_shape: list[int]
    model: nn.Module  # the bare model (no DDP / compile wrapper)
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    plugin: RunPlugin  # the run plug-in (joint uncertainty head, multi-task strategy, or none)
    fwd: nn.Module = field(init=False)  # what the loop calls (wrapped for the head, DDP, compile)
    start_epoch: int = 0
    best: dict[str, Any] = field(default_factory=dict)
    best_snapshot: dict[str, Any] | None = None

    @property
    def eval_bs(self) -> int:
        return max(self.local_bs, 256)

    @property
    def n_batches(self) -> int:
        return n_batches(self.src["train"].n, self.env.world_size, self.local_bs)


def shares_data(runs: Sequence[Run]) -> bool:
    """Whether ``runs`` hold one data: the same batch sources of every split (built once and given
    to each :func:`build_run` as ``data``, as a pack does for lanes of one data seed; a
    ghost keeps its template's).  The one answer for the engine's one gather per training step,
    one load of the OOD sets and one packed final evaluation."""
    own = runs[0].src
    return all(r.src.keys() == own.keys() and all(r.src[k] is own[k] for k in own) for r in runs)


def resume_state(config: TrainConfig, env: DistEnv) -> dict[str, Any] | None:
    """The checkpoint to continue (None for a new run), checked against ``config``.

    ``resume=True`` without a checkpoint starts a new run ("resume if there is anything to
    resume"); a checkpoint without ``resume`` is refused.
    """
    rdir = RunDir(config.out_dir)
    if not rdir.has_checkpoint("last"):
        return None
    if not config.resume:
        raise TorchcalError(
            f"Run directory {str(rdir.path)!r} already holds a run "
            f"({rdir.checkpoint('last').relative_to(rdir.path).as_posix()}); "
            "pass --resume to continue it or choose another --out")
    state = load_checkpoint(rdir.checkpoint("last"), map_location="cpu")
    _check_resumable(TrainConfig.from_dict(state["config"]), config, int(state["epoch"]), env)
    return state


def _check_resumable(old: TrainConfig, config: TrainConfig, epoch: int, env: DistEnv) -> None:
    """Refuse a checkpoint whose *identity* fields differ from ``config`` or that trained more
    epochs; warn when the milestones or a *runtime* field changed (the fields' roles,
    :func:`torchcal.train.config.changed_fields`)."""
    where = f"Cannot resume {str(config.out_dir)!r}"
    changed = changed_fields(old, config)
    if changed["identity"]:
        names = changed["identity"]
        raise CheckpointError(f"{where}: its checkpoint has {describe_fields(old, names)}, the "
                              f"config {describe_fields(config, names)} (settings that change "
                              "what is trained; restore them or choose another --out)")
    if epoch > config.epochs:
        raise CheckpointError(f"{where}: its checkpoint has trained {epoch} epochs, more than "
                              f"the requested epochs={config.epochs}")
    if not env.is_main:
        return
    sched = [k for k in changed["schedule"] if k != "epochs"]
    if sched:
        warnings.warn(f"Resuming {str(config.out_dir)!r}: the checkpoint's optimiser and schedule "
                      f"state is kept, so the changed {', '.join(sched)} take no effect",
                      stacklevel=5)
    fields = {f.name: f for f in dataclasses.fields(config)}
    runtime = [k for k in changed["runtime"] if fields[k].metadata.get("warn", True)]
    if runtime:
        warnings.warn(f"Resuming {str(config.out_dir)!r} with changed runtime setting(s) "
                      f"{describe_fields(config, runtime)} (the checkpoint has "
                      f"{describe_fields(old, runtime)}): they change how the run is computed "
                      "or recorded, not what is trained", stacklevel=5)


# ------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------
def device_and_amp(config: TrainConfig, env: DistEnv) -> tuple[torch.device, str]:
    device = resolve_device(config.device, env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if config.amp != "off" and device.type != "cuda" and env.is_main:
        warnings.warn(f"amp={config.amp!r} is only used on CUDA; training in float32 on {device}",
                      stacklevel=5)
    return device, (config.amp if device.type == "cuda" else "off")


def _check_names(config: TrainConfig) -> nn.Module:
    """The loss; unknown model / loss names and bad hyperparameters fail before any data."""
    if config.model not in list_models():
        raise ValueError(unknown_name("model", config.model, list_models()))
    loss_fn = build_loss(config)
    if config.tensorboard and not tensorboard_available():
        raise TorchcalError("--tensorboard needs the `tensorboard` package: pip install "
                            "\"torchcal[tensorboard]\" (or pip install tensorboard)")
    return loss_fn


def build_sources(config: TrainConfig, device: torch.device
                   ) -> tuple[Any, dict[str, BatchSource]]:
    """The data splits of ``config`` and a batch source on ``device`` for each split."""
    splits = build_data(config)
    use_cl = bool(config.channels_last and device.type == "cuda")
    src = {name: BatchSource(getattr(splits, name), device, mean=getattr(splits, "mean", None),
                             std=getattr(splits, "std", None), channels_last=use_cl,
                             num_workers=config.num_workers,
                             padding=int(getattr(splits, "padding", 4)))
           for name in ("train", "val", "test")}
    return splits, src


def build_run(config: TrainConfig, env: DistEnv, state: dict[str, Any] | None,
           data: tuple[Any, dict[str, BatchSource]] | None = None) -> Run:
    """Data (or ``data``: the ``(splits, sources)`` of another run with the same data),
    model, loss, optimiser, schedule, scaler and head; restored from ``state``; wrapped for
    DDP / compile; the run directory prepared (rank 0)."""
    device, amp = device_and_amp(config, env)
    if config.batch_size % env.world_size:
        raise ValueError(f"Expected `batch_size` ({config.batch_size}) to be divisible by the "
                         f"number of processes ({env.world_size})")
    loss_fn = _check_names(config)
    splits, src = data if data is not None else build_sources(config, device)
    num_classes, input_shape = int(splits.num_classes), [int(s) for s in splits.input_shape]
    use_cl = bool(config.channels_last and device.type == "cuda")
    torch.manual_seed(config.seed)
    model = build_model(config, num_classes, input_shape).to(device)
    check_model_input(model, input_shape, num_classes, model_name=config.model,
                      dataset=config.dataset)
    if use_cl:
        model = model.to(memory_format=torch.channels_last)
    plugin = _plugin(model, config, splits, device)
    local_bs = config.batch_size // env.world_size
    steps = config.epochs * n_batches(src["train"].n, env.world_size, local_bs)
    optimizer, scheduler = build_optimizer(model, config, plugin, steps)
    r = Run(config=config, env=env, device=device, amp=amp, dir=RunDir(config.out_dir),
            local_bs=local_bs, splits=splits, src=src,
            num_classes=num_classes, input_shape=input_shape, model=model,
            loss_fn=loss_fn.to(device), optimizer=optimizer, scheduler=scheduler,
            scaler=torch.amp.GradScaler("cuda", enabled=amp == "fp16"), plugin=plugin,
            best={"metric": config.select_best_by, "value": float("inf"), "epoch": 0})
    if state is not None:
        _restore(r, state)
    _wrap(r)
    if env.is_main:
        _prepare_run_dir(r)
    return r


def build_optimizer(model: nn.Module, config: TrainConfig, plugin: RunPlugin, steps: int
                    ) -> tuple[torch.optim.Optimizer, Any]:
    """A run's optimiser and learning-rate schedule (the one builder of both, for a run and a
    pack's ghost): ``plugin``'s own when it makes them, else :class:`SGD` over ``model``'s
    parameters (``config``'s ``lr``, ``momentum``, ``weight_decay``, ``nesterov``) and a
    ``MultiStepLR`` at ``config``'s effective milestones with ``lr_gamma``.  ``steps``: the
    run's optimiser steps in all (a per-step schedule's length)."""
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"Expected `steps` to be a non-negative integer, got {steps!r}")
    optimizer = plugin.make_optimizer(model, config) or SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum,
        weight_decay=config.weight_decay, nesterov=config.nesterov)
    scheduler = plugin.make_schedule(optimizer, steps) or torch.optim.lr_scheduler.MultiStepLR(
        optimizer, milestones=config.effective_milestones(), gamma=config.lr_gamma)
    return optimizer, scheduler


def _plugin(model: nn.Module, config: TrainConfig, splits: Any, device: torch.device) -> RunPlugin:
    """The run's plug-in: the joint uncertainty head, the multi-task strategy, or none."""
    if config.joint_head.enabled:
        return JointHead(model, config, device)
    if config.multitask.tasks:
        return TaskHead(model, config, splits, device)
    return RunPlugin()


def _restore(r: Run, state: dict[str, Any]) -> None:
    """Load a checkpoint's training state into ``r`` (CheckpointError when it does not fit)."""
    try:
        r.model.load_state_dict(state["model"])
        r.optimizer.load_state_dict(state["optimizer"])
        r.scheduler.load_state_dict(state["scheduler"])
        r.loss_fn.load_state_dict(state.get("loss") or {})
        if r.scaler.is_enabled() and state.get("scaler"):
            r.scaler.load_state_dict(state["scaler"])
        r.plugin.load(state)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"Cannot resume from {str(r.dir.checkpoint('last'))!r}: "
                              f"{str(exc).splitlines()[0]}") from exc
    r.start_epoch = int(state["epoch"])
    r.best = dict(state.get("best") or r.best)
    restore_rng_state(state["rng"])
    r.loss_fn.to(r.device)


def _wrap(r: Run) -> None:
    """The module the loop calls: the plug-in's wrapper, then DDP, then ``torch.compile``."""
    r.fwd = r.plugin.wrap(r.model)
    if r.env.enabled:
        ids = [r.device.index] if r.device.type == "cuda" else None
        r.fwd = DistributedDataParallel(r.fwd, device_ids=ids)
        r.plugin.distribute(ids)
    if r.config.compile:  # after DDP, as PyTorch recommends
        r.fwd = torch.compile(r.fwd)


def _prepare_run_dir(r: Run) -> None:
    """Create the run directory, clear a killed run's temporary files, write ``config.json``,
    and keep the log lines up to the resumed epoch (all of them go for a new run)."""
    r.dir.path.mkdir(parents=True, exist_ok=True)
    remove_stale_run_temp_files(r.dir.path)  # of a run killed mid-write
    cfg = r.config.to_dict()
    cfg["loss_kwargs"] = r.config.effective_loss_kwargs()
    cfg.update(num_classes=r.num_classes, input_shape=r.input_shape,
               world_size=r.env.world_size)
    r.dir.write_config(cfg)
    if r.start_epoch > 0:
        r.dir.truncate_log(r.start_epoch)
    elif r.dir.log.exists():
        r.dir.log.unlink()


@contextlib.contextmanager
def progress_bar(r: Run, lanes: int = 1):
    """A tqdm bar over every training batch of the run ``r`` (of a stack of ``lanes`` runs
    that step together; rank 0 with ``progress``), or None."""
    if not (r.config.progress and r.env.is_main):
        yield None
        return
    per_epoch = r.n_batches
    what = r.config.loss if lanes == 1 else f"x{lanes} packed"
    bar = tqdm(total=r.config.epochs * per_epoch, initial=r.start_epoch * per_epoch,
               desc=f"{r.config.recipe or r.config.dataset} {what}", unit="batch",
               dynamic_ncols=True, leave=True)
    try:
        yield bar
    finally:
        bar.close()


@contextlib.contextmanager
def tensorboard_logger(r: Run):
    """TensorBoard mirroring ``log.jsonl`` (rank 0 with ``tensorboard``), or None; on resume it
    drops the events of the epochs trained again."""
    if not (r.config.tensorboard and r.env.is_main):
        yield None
        return
    tb = TensorBoardLogger(r.dir.tensorboard,
                           purge_step=r.start_epoch + 1 if r.start_epoch else None)
    try:
        yield tb
    finally:
        tb.close()


def finished_run_numbers(r: Run) -> dict[str, float]:
    """A finished run resumed (nothing to train): the last logged epoch's numbers."""
    if r.start_epoch < r.config.epochs or not r.env.is_main:
        return {}
    log = r.dir.read_log()
    return {k: v for k, v in log[-1].items() if isinstance(v, float) and k != "seconds"} if log \
        else {}


# ------------------------------------------------------------------------------------------
# one epoch
# ------------------------------------------------------------------------------------------
def train_batches(r: Run, epoch: int):
    """This rank's training batches ``(x, y, index)`` of ``epoch``: its shard of the epoch's
    permutation, with the epoch's augmentation (both from ``(seed, epoch)`` alone)."""
    src = r.src["train"]
    perm = epoch_permutation(src.n, r.config.seed, epoch)
    shard, _ = shard_indices(perm, r.env.rank, r.env.world_size)
    augment = bool(getattr(r.splits, "augment", False))
    gen = None
    if augment and src.array:
        gen = torch.Generator(device=r.device)
        gen.manual_seed(epoch_seed(r.config.seed, epoch, stream=1000 + r.env.rank))
    return src.batches(shard, r.local_bs, augment=augment, generator=gen, drop_singleton=True,
                       with_index=True)



def divergence_error(r: Run, epoch: int, finite_loss: bool, finite_params: bool
                     ) -> DivergedError | None:
    """The error that stops ``r`` when its epoch's mean training loss or a parameter (model,
    joint head) is NaN/Inf (None: it did not diverge).  Under fp16 autocast the scaler skips
    the steps whose loss overflowed, so only the weights tell."""
    finite_loss = finite_loss or r.amp == "fp16"
    if finite_loss and finite_params:
        return None
    what = " and ".join(w for w, bad in (("the training loss", not finite_loss),
                                         ("the parameters", not finite_params)) if bad)
    clip = ("gradient clipping is off (--no-grad-clip)" if r.config.grad_clip is None
            else f"gradients are clipped at {r.config.grad_clip:g}")
    last = (f"the last good checkpoint ({r.dir.checkpoint('last').name}, from before this "
            "epoch) is kept" if r.dir.has_checkpoint("last") else "no checkpoint was written yet")
    return DivergedError(diverged_message(
        epoch, f"{what} became NaN/Inf", f"the learning rate (lr={r.config.lr:g}) is likely too "
        f"high ({clip}): lower --lr or clip gradients (--grad-clip). Stopped; {last} in "
        f"{str(r.dir.path)!r}"))


def update_every(loss_fn: nn.Module) -> int:
    """Batches between a stateful loss' extra validation passes (0: none)."""
    every = getattr(loss_fn, "update_every", None)
    return int(every) if loss_wants_validation(loss_fn) and every else 0



def final_evaluation(r: Run, ood_sets: dict[str, Any], epochs: int) -> dict[str, Any] | None:
    """Evaluate the last epoch into ``logits/`` and ``results.json`` (rank 0 writes), with what
    the run's plug-in adds (the multi-task strategy's ``multitask`` block: such a run always
    writes its results, its OOD sets with ``evaluate`` only)."""
    env = r.env
    preds = None
    extra = r.plugin.results()
    if r.config.evaluate or extra is not None:
        preds = collect_predictions(r.model, r.splits, ood_sets, r.config, device=r.device,
                                    env=env, batch_size=r.eval_bs)
    if env.enabled:
        dist.barrier()
        if env.initialized_here:
            # the final metrics run on rank 0 alone: leave the process group first so that
            # nothing in them tries to sync with the other ranks
            cleanup_distributed(env)
    if preds is None:
        return None
    if env.is_main:
        return write_predictions(preds, r.dir.path, r.config, epoch=epochs, checkpoint="last",
                                 extra=extra)
    if env.enabled and not env.initialized_here:
        # a process group created by the caller stays up and metrics that sync under DDP
        # need every rank: compute the same results everywhere, write on rank 0 only
        write_predictions(preds, r.dir.path, r.config, epoch=epochs, checkpoint="last",
                          write=False)
    return None


def n_batches(n: int, world_size: int, batch_size: int) -> int:
    """Training batches per epoch and rank (a final batch of one sample is dropped)."""
    per_rank = math.ceil(n / world_size)
    return per_rank // batch_size + (1 if per_rank % batch_size > 1 else 0) or 1
