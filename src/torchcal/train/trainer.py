"""The training loop: SGD + multistep schedule, any registered loss, checkpoint/resume, DDP, AMP.

One function, :func:`train`, runs a :class:`~torchcal.train.TrainConfig` end to end:

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
  atomically to ``RUN_DIR/checkpoints/last.pt`` every ``checkpoint_every`` epochs, and
  ``best.pt`` holds the epoch with the best validation ``select_best_by`` metric;
* ``RUN_DIR/log.jsonl`` gets one JSON object per epoch (flushed and fsynced);
* at the end, the last epoch's model is evaluated into ``RUN_DIR/logits/*.npz`` and
  ``RUN_DIR/results.json`` (``evaluate=True``).

The run directory's layout belongs to :mod:`torchcal.runs`.  :func:`fit` is the loop itself and
reads top to bottom like a plain PyTorch loop: the pieces it calls (resume checks, building,
one training epoch, end-of-epoch evaluation, checkpointing, final evaluation) are the helpers
below it.  The optional joint uncertainty head (``uncertainty_head``) is a plug-in object with
hooks (:class:`JointHead`; :class:`NoHead` does nothing), so the loop has no special case for it.

Under ``torchrun`` (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel (gloo on CPU,
NCCL on CUDA), every rank trains on its shard of the epoch's permutation, ``batch_size`` is the
global batch, and only rank 0 logs and writes files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from .._io import exclusive_lock
from .._registry import unknown_name
from ..errors import CheckpointError, DivergedError, TorchcalError
from ..losses import create_loss
from ..losses.base import (
    loss_log_state,
    loss_on_validation,
    loss_set_epoch,
    loss_wants_validation,
    published_reduction,
)
from ..metrics.epoch import EpochStats, epoch_metrics
from ..models import list_models
from ..runs import LOSS_STATE_KEY, RunDir
from .build import build_data, build_model, check_model_input, load_ood_sets
from .checkpoint import (
    load_checkpoint,
    remove_stale_run_temp_files,
    restore_rng_state,
    rng_state_tensors,
    save_checkpoint,
)
from .config import TrainConfig, changed_fields, describe_fields
from .device import _autocast, resolve_device
from .distributed import (
    DistEnv,
    cleanup_distributed,
    epoch_permutation,
    epoch_seed,
    setup_distributed,
    shard_indices,
)
from .evaluation import collect_predictions, write_predictions
from .inference import BatchSource, predict_logits
from .joint_head import JointHead, NoHead
from .multitask import train_multitask
from .tracking import TensorBoardLogger, tensorboard_available

__all__ = ["train", "fit", "build_loss", "epoch_metrics", "NoHead", "JointHead"]


# ------------------------------------------------------------------------------------------
# pieces
# ------------------------------------------------------------------------------------------
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


def _loss_reduction(loss: nn.Module) -> str:
    return str(getattr(loss, "reduction", "mean"))


def _chunked_loss(loss: nn.Module, logits: torch.Tensor, labels: torch.Tensor,
                  batch_size: int) -> torch.Tensor:
    """Mean per-sample loss over a split, in training-size chunks (O(batch) memory for MMCE)."""
    red = _loss_reduction(loss)
    total = torch.zeros((), device=logits.device)
    n = logits.shape[0]
    with torch.no_grad():
        for s in range(0, n, batch_size):
            z, y = logits[s:s + batch_size], labels[s:s + batch_size]
            v = loss(z, y).float()
            total = total + (v * z.shape[0] if red == "mean" else v.sum())
    return total / max(n, 1)


# ------------------------------------------------------------------------------------------
# the state of one training run
# ------------------------------------------------------------------------------------------
@dataclass
class _Run:
    """Everything :func:`fit` works with, built by :func:`_build`."""

    config: TrainConfig
    env: DistEnv
    device: torch.device
    amp: str
    run: RunDir
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
    head: NoHead
    fwd: nn.Module = field(init=False)  # what the loop calls (wrapped for the head, DDP, compile)
    start_epoch: int = 0
    best: dict[str, Any] = field(default_factory=dict)
    best_snapshot: dict[str, Any] | None = None

    @property
    def eval_bs(self) -> int:
        return max(self.local_bs, 256)

    @property
    def n_batches(self) -> int:
        return _n_batches(self.src["train"].n, self.env.world_size, self.local_bs)


# ------------------------------------------------------------------------------------------
# train
# ------------------------------------------------------------------------------------------
def train(config: TrainConfig) -> dict[str, Any]:
    """Train ``config`` end to end and return a summary.

    Returns:
        ``{"run_dir", "epochs", "final": {"train_*", "val_*", "test_*"}, "best": {"metric",
        "value", "epoch"}, "results": results dict or None, "seconds", "resumed_from"}``
        (on every rank; ``results`` only on rank 0).

    Raises:
        TorchcalError: the run directory already holds a run and ``resume`` is False, or the
            checkpoint to resume does not match the config.
        InUseError: another process is using the run directory (it holds
            ``RUN_DIR/.torchcal.lock`` for the life of its run).
        ValueError: a bad config field, unknown loss/model/data set.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"Expected `config` to be a TrainConfig, got {type(config).__name__}")
    config.validate()
    if config.tasks:  # two tasks: the multi-task loop (torchcal.train.multitask)
        return _train_multitask(config)
    t_start = time.perf_counter()
    if config.num_threads is not None:
        torch.set_num_threads(int(config.num_threads))

    dev_type = "cuda" if (config.device.startswith("cuda") or
                          (config.device == "auto" and torch.cuda.is_available())) else "cpu"
    env = setup_distributed(dev_type)
    try:
        # rank 0 owns the run directory for the whole run: a second process fails at once
        with exclusive_lock(config.out_dir) if env.is_main else contextlib.nullcontext():
            summary = fit(config, env)
    finally:
        cleanup_distributed(env)
    summary["seconds"] = time.perf_counter() - t_start
    return summary


def _train_multitask(config: TrainConfig) -> dict[str, Any]:
    """:func:`train`'s summary of a two-task run."""
    t0 = time.perf_counter()
    res = train_multitask(config)
    return {"run_dir": str(config.out_dir), "epochs": config.epochs, "resumed_from": 0,
            "final": {f"test_{k}": v for k, v in res["test"].items()}, "best": None,
            "results": res, "seconds": time.perf_counter() - t0, "world_size": 1}


def fit(config: TrainConfig, env: DistEnv | None = None) -> dict[str, Any]:
    """The training loop of :func:`train` (which also validates ``config``, sets up the process
    group and holds the run directory's lock): build, resume, train the remaining epochs with
    an evaluation, log line and checkpoint after each, then evaluate the last epoch."""
    env = env or DistEnv()
    r = _build(config, env, _resume_state(config, env))
    ood_sets = load_ood_sets(config, r.splits) if config.evaluate else {}
    final = _finished_run_numbers(r)
    reduction, every = _loss_reduction(r.loss_fn), _update_every(r.loss_fn)
    with _progress_bar(r) as bar, _tensorboard(r) as tb:
        for epoch in range(r.start_epoch, config.epochs):
            t0 = time.perf_counter()
            torch.manual_seed(epoch_seed(config.seed, epoch, stream=3 + env.rank))
            loss_set_epoch(r.loss_fn, epoch)
            r.fwd.train()
            r.head.start_epoch()
            stats = EpochStats(config.n_bins, r.device)
            lr = r.optimizer.param_groups[0]["lr"]
            for step, (x, y) in enumerate(_train_batches(r, epoch)):
                with _autocast(r.device, r.amp):
                    logits, feats = r.head.split(r.fwd(x))
                logits = logits.float()
                loss = r.loss_fn(logits, y)
                stats.update(logits, y, _sample_sum(loss, y, reduction))
                if reduction == "sum" and env.enabled:
                    loss = loss * env.world_size  # DDP averages gradients; a sum must sum
                total = r.head.add_loss(loss, logits, feats, y)
                _backward_and_step(r, total)
                if bar is not None:
                    bar.update(1)
                if every and (step + 1) % every == 0:
                    _validation_pass(r)  # a stateful loss' extra update (AdaFocal & co.)
                    r.fwd.train()
            rec = _end_epoch(r, epoch, lr, stats.compute(sync_dist=env.enabled), t0, tb=tb, bar=bar)
            final = {k: v for k, v in rec.items() if isinstance(v, float) and k != "seconds"}
    epochs = max(config.epochs, r.start_epoch)
    return {"run_dir": str(r.run.path), "epochs": epochs, "resumed_from": r.start_epoch,
            "final": final, "best": r.best, "results": _final_evaluation(r, ood_sets, epochs),
            "world_size": env.world_size}


def _end_epoch(r: _Run, epoch: int, lr: float, train_numbers: dict[str, float], t0: float, *,
               tb: Any = None, bar: Any = None,
               val: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, Any]:
    """The end of a training epoch: the schedule's step, the evaluation (``val``: see
    :func:`_evaluate_epoch`), the log line (its ``seconds`` counted from ``t0``), the best epoch
    and the checkpoints.  Returns the record."""
    r.scheduler.step()
    rec: dict[str, Any] = {"epoch": epoch + 1, "lr": lr}
    rec.update({f"train_{k}": v for k, v in train_numbers.items()})
    _stop_if_diverged(r, epoch, rec["train_loss"])  # before any log line or checkpoint
    rec.update(_evaluate_epoch(r, epoch, val))
    rec["seconds"] = time.perf_counter() - t0
    best_improved = _update_best(r, rec, epoch)
    if r.env.is_main:  # the log line first: a resume drops lines past its checkpoint
        r.run.append_log(rec)
        if tb is not None:
            tb.log_epoch(rec)
        _checkpoint(r, epoch, best_improved)
        if bar is not None:
            # percent, as every number the command line prints (the log keeps fractions)
            bar.set_postfix(val_ece=f"{100 * rec['val_ece']:.2f}%",
                            val_err=f"{100 * rec['val_error']:.2f}%", refresh=False)
    return rec


# ------------------------------------------------------------------------------------------
# resume checks
# ------------------------------------------------------------------------------------------
def _resume_state(config: TrainConfig, env: DistEnv) -> dict[str, Any] | None:
    """The checkpoint to continue (None for a new run), checked against ``config``.

    ``resume=True`` without a checkpoint starts a new run ("resume if there is anything to
    resume"); a checkpoint without ``resume`` is refused.
    """
    run = RunDir(config.out_dir)
    if not run.has_checkpoint("last"):
        return None
    if not config.resume:
        raise TorchcalError(
            f"Run directory {str(run.path)!r} already holds a run "
            f"({run.checkpoint('last').relative_to(run.path).as_posix()}); "
            "pass --resume to continue it or choose another --out")
    state = load_checkpoint(run.checkpoint("last"), map_location="cpu")
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
def _device_and_amp(config: TrainConfig, env: DistEnv) -> tuple[torch.device, str]:
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


def _build_sources(config: TrainConfig, device: torch.device
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


def _build(config: TrainConfig, env: DistEnv, state: dict[str, Any] | None,
           data: tuple[Any, dict[str, BatchSource]] | None = None) -> _Run:
    """Data (or ``data``: the ``(splits, sources)`` of another run with the same data),
    model, loss, optimiser, schedule, scaler and head; restored from ``state``; wrapped for
    DDP / compile; the run directory prepared (rank 0)."""
    device, amp = _device_and_amp(config, env)
    if config.batch_size % env.world_size:
        raise ValueError(f"Expected `batch_size` ({config.batch_size}) to be divisible by the "
                         f"number of processes ({env.world_size})")
    loss_fn = _check_names(config)
    splits, src = data if data is not None else _build_sources(config, device)
    num_classes, input_shape = int(splits.num_classes), [int(s) for s in splits.input_shape]
    use_cl = bool(config.channels_last and device.type == "cuda")
    torch.manual_seed(config.seed)
    model = build_model(config, num_classes, input_shape).to(device)
    check_model_input(model, input_shape, num_classes, model_name=config.model,
                      dataset=config.dataset)
    if use_cl:
        model = model.to(memory_format=torch.channels_last)
    head = JointHead(model, config, device) if config.uncertainty_head else NoHead()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay, nesterov=config.nesterov)
    r = _Run(config=config, env=env, device=device, amp=amp, run=RunDir(config.out_dir),
             local_bs=config.batch_size // env.world_size, splits=splits, src=src,
             num_classes=num_classes, input_shape=input_shape, model=model,
             loss_fn=loss_fn.to(device), optimizer=optimizer,
             scheduler=torch.optim.lr_scheduler.MultiStepLR(
                 optimizer, milestones=config.effective_milestones(), gamma=config.lr_gamma),
             scaler=torch.amp.GradScaler("cuda", enabled=amp == "fp16"), head=head,
             best={"metric": config.select_best_by, "value": float("inf"), "epoch": 0})
    if state is not None:
        _restore(r, state)
    _wrap(r)
    if env.is_main:
        _prepare_run_dir(r)
    return r


def _restore(r: _Run, state: dict[str, Any]) -> None:
    """Load a checkpoint's training state into ``r`` (CheckpointError when it does not fit)."""
    try:
        r.model.load_state_dict(state["model"])
        r.optimizer.load_state_dict(state["optimizer"])
        r.scheduler.load_state_dict(state["scheduler"])
        r.loss_fn.load_state_dict(state.get("loss") or {})
        if r.scaler.is_enabled() and state.get("scaler"):
            r.scaler.load_state_dict(state["scaler"])
        r.head.load(state)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"Cannot resume from {str(r.run.checkpoint('last'))!r}: "
                              f"{str(exc).splitlines()[0]}") from exc
    r.start_epoch = int(state["epoch"])
    r.best = dict(state.get("best") or r.best)
    restore_rng_state(state["rng"])
    r.loss_fn.to(r.device)


def _wrap(r: _Run) -> None:
    """The module the loop calls: the head's wrapper, then DDP, then ``torch.compile``."""
    r.fwd = r.head.wrap(r.model)
    if r.env.enabled:
        ids = [r.device.index] if r.device.type == "cuda" else None
        r.fwd = DistributedDataParallel(r.fwd, device_ids=ids)
        r.head.distribute(ids)
    if r.config.compile:  # after DDP, as PyTorch recommends
        r.fwd = torch.compile(r.fwd)


def _prepare_run_dir(r: _Run) -> None:
    """Create the run directory, clear a killed run's temporary files, write ``config.json``,
    and keep the log lines up to the resumed epoch (all of them go for a new run)."""
    r.run.path.mkdir(parents=True, exist_ok=True)
    remove_stale_run_temp_files(r.run.path)  # of a run killed mid-write
    cfg = r.config.to_dict()
    cfg["loss_kwargs"] = r.config.effective_loss_kwargs()
    cfg.update(num_classes=r.num_classes, input_shape=r.input_shape,
               world_size=r.env.world_size)
    r.run.write_config(cfg)
    if r.start_epoch > 0:
        r.run.truncate_log(r.start_epoch)
    elif r.run.log.exists():
        r.run.log.unlink()


@contextlib.contextmanager
def _progress_bar(r: _Run):
    """A tqdm bar over every training batch of the run (rank 0 with ``progress``), or None."""
    if not (r.config.progress and r.env.is_main):
        yield None
        return
    per_epoch = r.n_batches
    bar = tqdm(total=r.config.epochs * per_epoch, initial=r.start_epoch * per_epoch,
               desc=f"{r.config.recipe or r.config.dataset} {r.config.loss}", unit="batch",
               dynamic_ncols=True, leave=True)
    try:
        yield bar
    finally:
        bar.close()


@contextlib.contextmanager
def _tensorboard(r: _Run):
    """TensorBoard mirroring ``log.jsonl`` (rank 0 with ``tensorboard``), or None; on resume it
    drops the events of the epochs trained again."""
    if not (r.config.tensorboard and r.env.is_main):
        yield None
        return
    tb = TensorBoardLogger(r.run.tensorboard,
                           purge_step=r.start_epoch + 1 if r.start_epoch else None)
    try:
        yield tb
    finally:
        tb.close()


def _finished_run_numbers(r: _Run) -> dict[str, float]:
    """A finished run resumed (nothing to train): the last logged epoch's numbers."""
    if r.start_epoch < r.config.epochs or not r.env.is_main:
        return {}
    log = r.run.read_log()
    return {k: v for k, v in log[-1].items() if isinstance(v, float) and k != "seconds"} if log \
        else {}


# ------------------------------------------------------------------------------------------
# one epoch
# ------------------------------------------------------------------------------------------
def _train_batches(r: _Run, epoch: int):
    """This rank's training batches of ``epoch``: its shard of the epoch's permutation, with the
    epoch's augmentation (both from ``(seed, epoch)`` alone)."""
    src = r.src["train"]
    perm = epoch_permutation(src.n, r.config.seed, epoch)
    shard, _ = shard_indices(perm, r.env.rank, r.env.world_size)
    augment = bool(getattr(r.splits, "augment", False))
    gen = None
    if augment and src.array:
        gen = torch.Generator(device=r.device)
        gen.manual_seed(epoch_seed(r.config.seed, epoch, stream=1000 + r.env.rank))
    return src.batches(shard, r.local_bs, augment=augment, generator=gen, drop_singleton=True)


def _sample_sum(loss: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
    """The batch's summed per-sample loss (for the logged mean), whatever the reduction."""
    return loss.detach() * y.shape[0] if reduction == "mean" else loss.detach()


def _backward_and_step(r: _Run, total: torch.Tensor) -> None:
    """One backward pass and optimiser step; the scaler is a no-op unless AMP is fp16."""
    r.optimizer.zero_grad(set_to_none=True)
    r.head.zero_grad()
    r.scaler.scale(total).backward()
    if r.config.grad_clip is not None:
        r.scaler.unscale_(r.optimizer)
        torch.nn.utils.clip_grad_norm_(r.model.parameters(), r.config.grad_clip)
    r.scaler.step(r.optimizer)
    r.head.step(r.scaler)
    r.scaler.update()


def _stop_if_diverged(r: _Run, epoch: int, train_loss: float) -> None:
    """Raise :class:`~torchcal.errors.DivergedError` when the epoch's mean training loss or a
    parameter (model, joint head) is NaN/Inf.  One host sync per epoch: a non-finite batch
    loss makes the loss sum accumulated on the device non-finite, and the parameters are
    reduced to one flag (every rank sees the same reduced loss and replicated weights)."""
    params = [p.detach() for p in r.model.parameters()]
    params += [p.detach() for p in getattr(r.head, "head", nn.Module()).parameters()]
    finite_params = bool(torch.stack([torch.isfinite(p).all() for p in params]).all()) \
        if params else True
    # fp16 autocast: the scaler skips steps whose loss overflowed, only the weights tell
    finite_loss = math.isfinite(train_loss) or r.amp == "fp16"
    if finite_loss and finite_params:
        return
    what = " and ".join(w for w, bad in (("the training loss", not finite_loss),
                                         ("the parameters", not finite_params)) if bad)
    clip = ("gradient clipping is off (--no-grad-clip)" if r.config.grad_clip is None
            else f"gradients are clipped at {r.config.grad_clip:g}")
    last = (f"the last good checkpoint ({r.run.checkpoint('last').name}, from before this "
            "epoch) is kept" if r.run.has_checkpoint("last") else "no checkpoint was written yet")
    raise DivergedError(
        f"Training diverged in epoch {epoch + 1}: {what} became NaN/Inf; the learning rate "
        f"(lr={r.config.lr:g}) is likely too high ({clip}): lower --lr or clip gradients "
        f"(--grad-clip). Stopped; {last} in {str(r.run.path)!r}")


def _update_every(loss_fn: nn.Module) -> int:
    """Batches between a stateful loss' extra validation passes (0: none)."""
    every = getattr(loss_fn, "update_every", None)
    return int(every) if loss_wants_validation(loss_fn) and every else 0


def _validation_pass(r: _Run) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation logits (gathered) and drive the loss' ``on_validation`` with this rank's share."""
    z, y, (lz, ly) = predict_logits(r.model, None, r.device, r.eval_bs, env=r.env,
                                    source=r.src["val"], amp=r.amp, return_local=True)
    loss_on_validation(r.loss_fn, logits=lz, labels=ly)
    return z, y


def _evaluate_epoch(r: _Run, epoch: int, val: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> dict[str, Any]:
    """End of an epoch: the validation pass (which drives stateful losses; ``val``: its logits
    and labels computed by the caller, who drove the loss), the test split every
    ``eval_test_every`` epochs and at the last, and what the log records beside them."""
    chunk = max(r.local_bs, 1024)  # chunks of the logged val/test loss (MMCE is O(chunk^2))
    zv, yv = val if val is not None else _validation_pass(r)
    vm = epoch_metrics(zv, yv, n_bins=r.config.n_bins)
    vm["loss"] = float(_chunked_loss(r.loss_fn, zv, yv, chunk))
    rec: dict[str, Any] = {f"val_{k}": v for k, v in vm.items()}
    every = r.config.eval_test_every
    if every and ((epoch + 1) % every == 0 or epoch + 1 == r.config.epochs):
        zt, yt = predict_logits(r.model, None, r.device, r.eval_bs, env=r.env,
                                source=r.src["test"], amp=r.amp)
        tm = epoch_metrics(zt, yt, n_bins=r.config.n_bins, diagnostics=True)
        tm["loss"] = float(_chunked_loss(r.loss_fn, zt, yt, chunk))
        rec.update({f"test_{k}": v for k, v in tm.items()})
    fc = getattr(r.model, "fc", None)
    rec["fc_weight_norm"] = float(fc.weight.detach().float().norm()) if fc is not None else None
    r.head.log(rec, r.n_batches)
    ls = loss_log_state(r.loss_fn)
    if ls:
        rec[LOSS_STATE_KEY] = ls
    return rec


def _update_best(r: _Run, rec: dict[str, Any], epoch: int) -> bool:
    """Track the best epoch by the validation ``select_best_by`` metric; rank 0 keeps a
    snapshot of its weights and loss/head state for ``best.pt``.  True when it improved."""
    if r.config.select_best_by == "none":
        return False
    v = rec.get(f"val_{r.config.select_best_by}")
    if v is None or not math.isfinite(v) or not v < r.best["value"]:
        return False
    r.best = {"metric": r.config.select_best_by, "value": float(v), "epoch": epoch + 1}
    if r.env.is_main:
        r.best_snapshot = _snapshot(r, full=False)
    return True


def _checkpoint(r: _Run, epoch: int, best_improved: bool) -> None:
    """Every ``checkpoint_every`` epochs and at the last (rank 0): ``best.pt`` when a better
    epoch is pending, then ``last.pt``."""
    last_epoch = epoch + 1 == r.config.epochs
    if (epoch + 1) % r.config.checkpoint_every and not last_epoch:
        return
    extra = {"num_classes": r.num_classes, "input_shape": r.input_shape,
             "config": r.config.to_dict(), "best": dict(r.best)}
    if r.best_snapshot is not None:
        save_checkpoint(r.run.checkpoint("best"), {**r.best_snapshot, **extra,
                                                   "epoch": int(r.best["epoch"]),
                                                   "rng": rng_state_tensors()})
        r.best_snapshot = None  # written: the next best.pt waits for a better epoch
    save_checkpoint(r.run.checkpoint("last"), {**_snapshot(r, full=True), **extra,
                                               "epoch": epoch + 1, "rng": rng_state_tensors()})


def _final_evaluation(r: _Run, ood_sets: dict[str, Any], epochs: int) -> dict[str, Any] | None:
    """Evaluate the last epoch into ``logits/`` and ``results.json`` (rank 0 writes)."""
    env = r.env
    preds = None
    if r.config.evaluate:
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
        return write_predictions(preds, r.run.path, r.config, epoch=epochs, checkpoint="last")
    if env.enabled and not env.initialized_here:
        # a process group created by the caller stays up and metrics that sync under DDP
        # need every rank: compute the same results everywhere, write on rank 0 only
        write_predictions(preds, r.run.path, r.config, epoch=epochs, checkpoint="last",
                          write=False)
    return None


def _n_batches(n: int, world_size: int, batch_size: int) -> int:
    """Training batches per epoch and rank (a final batch of one sample is dropped)."""
    per_rank = math.ceil(n / world_size)
    return per_rank // batch_size + (1 if per_rank % batch_size > 1 else 0) or 1


def _clone_state(sd: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.detach().clone()
        elif isinstance(v, dict):
            c = _clone_state(v)
            out[k] = c if type(v) is dict else type(v)(c)  # keep Counter/OrderedDict
        elif isinstance(v, list):
            out[k] = [x.detach().clone() if isinstance(x, torch.Tensor) else
                      (_clone_state(x) if isinstance(x, dict) else x) for x in v]
        else:
            out[k] = v
    return out


def _snapshot(r: _Run, full: bool) -> dict[str, Any]:
    """A copy of the run's state for a checkpoint: the weights and the loss/head state, and
    with ``full`` the optimiser, schedule and scaler (``best.pt`` is for evaluation only)."""
    state: dict[str, Any] = {
        "model": r.model.state_dict(), "loss": r.loss_fn.state_dict(),
        "optimizer": r.optimizer.state_dict() if full else None,
        "scheduler": r.scheduler.state_dict() if full else None,
        "scaler": r.scaler.state_dict() if full and r.scaler.is_enabled() else None,
        **r.head.state(full)}
    return _clone_state(state)
