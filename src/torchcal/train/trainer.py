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

Under ``torchrun`` (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel (gloo on CPU,
NCCL on CUDA), every rank trains on its shard of the epoch's permutation, ``batch_size`` is the
global batch, and only rank 0 logs and writes files.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .._io import append_text, exclusive_lock
from ..errors import CheckpointError, TorchcalError
from ..losses.base import (
    loss_on_validation,
    loss_set_epoch,
    loss_wants_validation,
    published_reduction,
)
from .checkpoint import (
    load_checkpoint,
    remove_stale_run_temp_files,
    restore_rng_state,
    rng_state_tensors,
    save_checkpoint,
)
from .config import TrainConfig
from .distributed import (
    DistEnv,
    cleanup_distributed,
    epoch_permutation,
    epoch_seed,
    setup_distributed,
    shard_indices,
)
from .predict import (
    BatchSource,
    _autocast,
    build_data,
    build_model,
    check_model_input,
    collect_predictions,
    load_ood_sets,
    resolve_device,
    write_predictions,
)
from .tracking import TENSORBOARD_DIR, TensorBoardLogger, tensorboard_available

__all__ = ["train", "build_loss", "epoch_metrics"]

_COMPAT_FIELDS = ("dataset", "model", "loss", "seed", "batch_size", "model_kwargs",
                  "val_fraction", "data_seed")
_DATA_KWARGS_IGNORED = ("verify",)  # data options that do not change the data


def _data_identity(config: TrainConfig) -> dict[str, Any]:
    return {k: v for k, v in dict(config.data_kwargs).items() if k not in _DATA_KWARGS_IGNORED}


# ------------------------------------------------------------------------------------------
# pieces
# ------------------------------------------------------------------------------------------
def build_loss(config: TrainConfig, num_classes: int | None = None) -> nn.Module:
    """The loss of ``config`` with its reduction resolved (``"published"`` -> the papers')."""
    from ..losses import create_loss

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


class _FeaturesAndLogits(nn.Module):
    """``forward(x) -> (logits, features)`` in one pass (features -> model.fc), for DDP."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.model.forward_features(x)
        return self.model.fc(f), f


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    append_text(path, json.dumps(_nan_to_none(record), allow_nan=False) + "\n")


def _truncate_log(path: Path, keep_epochs: int) -> None:
    """Keep the log lines of epochs ``<= keep_epochs`` (a resumed run rewrites the rest)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed run
        if isinstance(rec, dict) and int(rec.get("epoch", 0)) <= keep_epochs:
            kept.append(line)
    from ..evaluate import atomic_write_text

    atomic_write_text(path, "".join(s + "\n" for s in kept))


def _write_config(run_dir: Path, config: TrainConfig, extra: dict[str, Any]) -> None:
    from ..evaluate import atomic_write_text

    d = config.to_dict()
    d["loss_kwargs"] = config.effective_loss_kwargs()
    d.update(extra)
    atomic_write_text(run_dir / "config.json", json.dumps(_nan_to_none(d), indent=2) + "\n")


def _loss_state_for_log(loss: nn.Module) -> dict[str, Any]:
    """Small inspectable loss state (e.g. AdaFocal's per-bin γ and bin edges) for the log."""
    out: dict[str, Any] = {}
    for name in ("gammas", "bin_edges", "gamma"):
        v = getattr(loss, name, None)
        if isinstance(v, torch.Tensor) and v.numel() <= 1024:
            out[name] = v.detach().float().cpu().tolist()
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v)
    return out


def _entropy(z: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(z, dim=1)
    return -(logp.exp() * logp).sum(dim=1)


def epoch_metrics(logits: torch.Tensor, labels: torch.Tensor, *, n_bins: int = 15,
                  diagnostics: bool = False) -> dict[str, float]:
    """NLL, ECE, error (and with ``diagnostics`` the NLL / entropy of correct vs incorrect
    samples) of a logged split, as floats."""
    from ..metrics import ece

    z = logits.float()
    nll_i = F.cross_entropy(z, labels, reduction="none")
    correct = z.argmax(1) == labels
    vals = [nll_i.mean(), 1.0 - correct.float().mean(),
            ece(logits=z, labels=labels, n_bins=n_bins, validate_args=False)]
    keys = ["nll", "error", "ece"]
    if diagnostics:
        ent = _entropy(z)
        c = correct.float()
        nc, ni = c.sum(), (1 - c).sum()
        nan = torch.tensor(float("nan"), device=z.device)
        vals += [torch.where(nc > 0, (nll_i * c).sum() / nc.clamp_min(1), nan),
                 torch.where(ni > 0, (nll_i * (1 - c)).sum() / ni.clamp_min(1), nan),
                 torch.where(nc > 0, (ent * c).sum() / nc.clamp_min(1), nan),
                 torch.where(ni > 0, (ent * (1 - c)).sum() / ni.clamp_min(1), nan)]
        keys += ["nll_correct", "nll_incorrect", "entropy_correct", "entropy_incorrect"]
    host = torch.stack([v.float().reshape(()) for v in vals]).cpu().tolist()
    return dict(zip(keys, host, strict=True))


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


def _val_pass(model, source, env, bs, amp, loss):
    """Validation logits (gathered) and drive the loss' ``on_validation`` with this rank's share."""
    from .predict import predict_logits

    z, y, (lz, ly) = predict_logits(model, None, source.device, bs, env=env, source=source,
                                    amp=amp, return_local=True)
    loss_on_validation(loss, logits=lz, labels=ly)
    return z, y


class _TrainStats:
    """Fixed-size per-epoch training statistics accumulated on the device (no host syncs)."""

    def __init__(self, n_bins: int, device: torch.device) -> None:
        self.n_bins = n_bins
        # loss_sum, nll_sum, correct, count
        self.scalars = torch.zeros(4, dtype=torch.float64, device=device)
        # per bin: count, conf sum, correct sum
        self.bins = torch.zeros(3, n_bins, dtype=torch.float64, device=device)

    @torch.no_grad()
    def update(self, logits: torch.Tensor, y: torch.Tensor, loss_sum: torch.Tensor) -> None:
        from ..metrics import equal_width_bin_index

        z = logits.detach().float()
        logp = torch.log_softmax(z, 1)
        conf, pred = logp.max(1)
        conf = conf.exp()
        correct = (pred == y).double()
        nll = -logp.gather(1, y[:, None]).sum()
        self.scalars += torch.stack([loss_sum.detach().double(), nll.double(), correct.sum(),
                                     torch.tensor(float(y.shape[0]), dtype=torch.float64,
                                                  device=z.device)])
        idx = equal_width_bin_index(conf, self.n_bins)
        self.bins.index_add_(1, idx, torch.stack([torch.ones_like(correct), conf.double(), correct]))

    def compute(self, env: DistEnv) -> dict[str, float]:
        flat = torch.cat([self.scalars, self.bins.reshape(-1)])
        if env.enabled:
            dist.all_reduce(flat)
        flat = flat.cpu()
        s, b = flat[:4], flat[4:].reshape(3, self.n_bins)
        n = float(s[3]) if float(s[3]) > 0 else float("nan")
        ece = float((b[1] - b[2]).abs().sum()) / n
        return {"loss": float(s[0]) / n, "nll": float(s[1]) / n, "error": 1.0 - float(s[2]) / n,
                "ece": ece}


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
    t_start = time.perf_counter()
    if config.num_threads is not None:
        torch.set_num_threads(int(config.num_threads))

    dev_type = "cuda" if (config.device.startswith("cuda") or
                          (config.device == "auto" and torch.cuda.is_available())) else "cpu"
    env = setup_distributed(dev_type)
    try:
        # rank 0 owns the run directory for the whole run: a second process fails at once
        with exclusive_lock(config.out_dir) if env.is_main else contextlib.nullcontext():
            return _train(config, env, t_start)
    finally:
        cleanup_distributed(env)


def _train(config: TrainConfig, env: DistEnv, t_start: float) -> dict[str, Any]:
    device = resolve_device(config.device, env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    amp = config.amp if device.type == "cuda" else "off"
    if config.amp != "off" and device.type != "cuda" and env.is_main:
        warnings.warn(f"amp={config.amp!r} is only used on CUDA; training in float32 on {device}",
                      stacklevel=3)
    run_dir = Path(config.out_dir)
    ckpt_dir = run_dir / "checkpoints"
    last_path = ckpt_dir / "last.pt"
    best_path = ckpt_dir / "best.pt"
    log_path = run_dir / "log.jsonl"

    if config.batch_size % env.world_size:
        raise ValueError(f"Expected `batch_size` ({config.batch_size}) to be divisible by the "
                         f"number of processes ({env.world_size})")
    local_bs = config.batch_size // env.world_size

    # --- resume state ----------------------------------------------------------------------
    state = None
    if last_path.exists():
        if not config.resume:
            raise TorchcalError(
                f"Run directory {str(run_dir)!r} already holds a run (checkpoints/last.pt); "
                "pass --resume to continue it or choose another --out")
        state = load_checkpoint(last_path, map_location="cpu")
        old = TrainConfig.from_dict(state["config"])
        for k in _COMPAT_FIELDS:
            if getattr(old, k) != getattr(config, k):
                raise CheckpointError(
                    f"Cannot resume {str(run_dir)!r}: its checkpoint has {k}={getattr(old, k)!r}, "
                    f"the config {k}={getattr(config, k)!r}")
        if _data_identity(old) != _data_identity(config):
            raise CheckpointError(
                f"Cannot resume {str(run_dir)!r}: its checkpoint was trained with data_kwargs="
                f"{_data_identity(old)!r}, the config has {_data_identity(config)!r}")
        if int(state["epoch"]) > config.epochs:
            raise CheckpointError(
                f"Cannot resume {str(run_dir)!r}: its checkpoint has trained {int(state['epoch'])} "
                f"epochs, more than the requested epochs={config.epochs}")
        changed = [k for k in ("lr", "momentum", "weight_decay", "nesterov", "lr_gamma")
                   if getattr(old, k) != getattr(config, k)]
        if old.effective_milestones() != config.effective_milestones():
            changed.append("milestones")
        if changed and env.is_main:
            warnings.warn(f"Resuming {str(run_dir)!r}: the checkpoint's optimiser and schedule "
                          f"state is kept, so the changed {', '.join(changed)} take no effect",
                          stacklevel=3)
        if old.effective_loss_kwargs() != config.effective_loss_kwargs():
            raise CheckpointError(
                f"Cannot resume {str(run_dir)!r}: its checkpoint has loss_kwargs="
                f"{old.effective_loss_kwargs()!r}, the config {config.effective_loss_kwargs()!r}")
    # (resume=True without a checkpoint starts a new run: "resume if there is anything to resume")

    # --- names and hyperparameters first: fail before any data is loaded -------------------
    from ..models import list_models

    if config.model not in list_models():
        raise ValueError(f"Unknown model {config.model!r}; expected one of: "
                         f"{', '.join(list_models())}")
    loss_fn = build_loss(config)
    if config.tensorboard and not tensorboard_available():
        raise TorchcalError("--tensorboard needs the `tensorboard` package: pip install "
                            "\"torchcal[tensorboard]\" (or pip install tensorboard)")

    # --- data --------------------------------------------------------------------------------
    splits = build_data(config)
    num_classes = int(splits.num_classes)
    input_shape = [int(s) for s in splits.input_shape]
    mean, std = getattr(splits, "mean", None), getattr(splits, "std", None)
    use_cl = bool(config.channels_last and device.type == "cuda")
    src = {name: BatchSource(getattr(splits, name), device, mean=mean, std=std,
                             channels_last=use_cl, num_workers=config.num_workers,
                             padding=int(getattr(splits, "padding", 4)))
           for name in ("train", "val", "test")}
    augment = bool(getattr(splits, "augment", False))
    n_train = src["train"].n

    # --- model, loss, optimiser ------------------------------------------------------------
    torch.manual_seed(config.seed)
    model = build_model(config, num_classes, input_shape).to(device)
    check_model_input(model, input_shape, num_classes, model_name=config.model,
                      dataset=config.dataset)
    if use_cl:
        model = model.to(memory_format=torch.channels_last)
    loss_fn = loss_fn.to(device)
    reduction = _loss_reduction(loss_fn)

    head = head_opt = None
    if config.uncertainty_head:
        from ..uncertainty import UncertaintyHead

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(epoch_seed(config.seed, 0, stream=7))
            head = UncertaintyHead(int(model.num_features)).to(device)
        head_opt = torch.optim.AdamW(head.parameters(), lr=config.head_lr,
                                     weight_decay=config.head_weight_decay)

    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay, nesterov=config.nesterov)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(
        optimizer, milestones=config.effective_milestones(), gamma=config.lr_gamma)
    scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None

    start_epoch = 0
    best = {"metric": config.select_best_by, "value": float("inf"), "epoch": 0}
    if state is not None:
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            loss_fn.load_state_dict(state.get("loss") or {})
            if scaler is not None and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            if head is not None:
                if not state.get("head"):
                    raise KeyError("no uncertainty head state")
                head.load_state_dict(state["head"])
                head_opt.load_state_dict(state["head_optimizer"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"Cannot resume from {str(last_path)!r}: "
                                  f"{str(exc).splitlines()[0]}") from exc
        start_epoch = int(state["epoch"])
        best = dict(state.get("best") or best)
        restore_rng_state(state["rng"])
        loss_fn.to(device)

    # --- wrappers --------------------------------------------------------------------------
    core = model
    fwd: nn.Module = _FeaturesAndLogits(model) if head is not None else model
    if env.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        fwd = DDP(fwd, device_ids=ids)
        if head is not None:
            head = DDP(head, device_ids=ids)
    if config.compile:  # after DDP, as PyTorch recommends
        fwd = torch.compile(fwd)

    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_run_temp_files(run_dir)  # of a run killed mid-write
        _write_config(run_dir, config, {"num_classes": num_classes, "input_shape": input_shape,
                                        "world_size": env.world_size})
        if start_epoch > 0:
            _truncate_log(log_path, start_epoch)
        elif log_path.exists():
            log_path.unlink()
    ood_sets = load_ood_sets(config, splits) if config.evaluate else {}

    wants_val = loss_wants_validation(loss_fn)
    update_every = getattr(loss_fn, "update_every", None)
    update_every = int(update_every) if wants_val and update_every else 0
    eval_bs = max(local_bs, 256)
    loss_chunk = max(local_bs, 1024)  # chunks of the logged val/test loss (MMCE is O(chunk^2))
    best_snapshot: dict[str, Any] | None = None
    best_dirty = False

    # TensorBoard mirrors log.jsonl; on resume it drops the events of epochs trained again
    tb = (TensorBoardLogger(run_dir / TENSORBOARD_DIR, purge_step=start_epoch + 1 if start_epoch
                            else None) if config.tensorboard and env.is_main else None)
    bar = None
    if config.progress and env.is_main:
        from tqdm.auto import tqdm

        per_epoch = _n_batches(n_train, env.world_size, local_bs)
        bar = tqdm(total=config.epochs * per_epoch, initial=start_epoch * per_epoch,
                   desc=f"{config.recipe or config.dataset} {config.loss}", unit="batch",
                   dynamic_ncols=True, leave=True)

    final: dict[str, float] = {}
    if start_epoch >= config.epochs and env.is_main and log_path.exists():
        # a finished run resumed: nothing to train, report the last epoch's numbers
        for line in log_path.read_text(encoding="utf-8").splitlines()[-1:]:
            final = {k: v for k, v in json.loads(line).items()
                     if isinstance(v, float) and k != "seconds"}
    try:
        for epoch in range(start_epoch, config.epochs):
            t0 = time.perf_counter()
            torch.manual_seed(epoch_seed(config.seed, epoch, stream=3 + env.rank))
            loss_set_epoch(loss_fn, epoch)
            fwd.train()
            if head is not None:
                head.train()
            perm = epoch_permutation(n_train, config.seed, epoch)
            shard, _ = shard_indices(perm, env.rank, env.world_size)
            gen = None
            if augment and src["train"].array:
                gen = torch.Generator(device=device)
                gen.manual_seed(epoch_seed(config.seed, epoch, stream=1000 + env.rank))
            stats = _TrainStats(config.n_bins, device)
            head_loss_sum = torch.zeros((), device=device)
            lr = optimizer.param_groups[0]["lr"]
            for step, (x, y) in enumerate(src["train"].batches(
                    shard, local_bs, augment=augment, generator=gen, drop_singleton=True)):
                with _autocast(device, amp):
                    out = fwd(x)
                if head is not None:
                    logits, feats = out
                else:
                    logits = out
                logits = logits.float()
                loss = loss_fn(logits, y)
                sample_sum = loss.detach() * y.shape[0] if reduction == "mean" else loss.detach()
                if reduction == "sum" and env.enabled:
                    # DDP averages gradients over ranks; a summed loss must sum over them
                    loss = loss * env.world_size
                total = loss
                if head is not None:
                    from ..uncertainty import ranking_loss

                    m = (y.shape[0] // 2) * 2
                    if m >= 2:
                        target = F.cross_entropy(logits.detach(), y, reduction="none")
                        hl = ranking_loss(head(feats[:m].float()), target[:m])
                        total = total + hl
                        head_loss_sum = head_loss_sum + hl.detach()
                optimizer.zero_grad(set_to_none=True)
                if head_opt is not None:
                    head_opt.zero_grad(set_to_none=True)
                if scaler is not None:
                    scaler.scale(total).backward()
                    if config.grad_clip is not None:
                        scaler.unscale_(optimizer)
                        torch.nn.utils.clip_grad_norm_(core.parameters(), config.grad_clip)
                    scaler.step(optimizer)
                    if head_opt is not None:
                        scaler.step(head_opt)
                    scaler.update()
                else:
                    total.backward()
                    if config.grad_clip is not None:
                        torch.nn.utils.clip_grad_norm_(core.parameters(), config.grad_clip)
                    optimizer.step()
                    if head_opt is not None:
                        head_opt.step()
                stats.update(logits, y, sample_sum)
                if bar is not None:
                    bar.update(1)
                if update_every and (step + 1) % update_every == 0:
                    _val_pass(core, src["val"], env, eval_bs, amp, loss_fn)
                    fwd.train()
            scheduler.step()

            # --- end of epoch: validation (drives stateful losses), test, log ------------------
            rec: dict[str, Any] = {"epoch": epoch + 1, "lr": lr}
            rec.update({f"train_{k}": v for k, v in stats.compute(env).items()})
            zv, yv = _val_pass(core, src["val"], env, eval_bs, amp, loss_fn)
            vm = epoch_metrics(zv, yv, n_bins=config.n_bins)
            vm["loss"] = float(_chunked_loss(loss_fn, zv, yv, loss_chunk))
            rec.update({f"val_{k}": v for k, v in vm.items()})
            last_epoch = epoch + 1 == config.epochs
            if config.eval_test_every and ((epoch + 1) % config.eval_test_every == 0 or last_epoch):
                from .predict import predict_logits

                zt, yt = predict_logits(core, None, device, eval_bs, env=env, source=src["test"],
                                        amp=amp)
                tm = epoch_metrics(zt, yt, n_bins=config.n_bins, diagnostics=True)
                tm["loss"] = float(_chunked_loss(loss_fn, zt, yt, loss_chunk))
                rec.update({f"test_{k}": v for k, v in tm.items()})
            rec["fc_weight_norm"] = float(core.fc.weight.detach().float().norm()) if hasattr(
                core, "fc") else None
            if head is not None:
                rec["head_ranking_loss"] = float(head_loss_sum) / max(
                    1, _n_batches(n_train, env.world_size, local_bs))
            ls = _loss_state_for_log(loss_fn)
            if ls:
                rec["loss_state"] = ls
            rec["seconds"] = time.perf_counter() - t0
            final = {k: v for k, v in rec.items() if isinstance(v, float) and k != "seconds"}

            # --- best ----------------------------------------------------------------------
            if config.select_best_by != "none":
                v = rec.get(f"val_{config.select_best_by}")
                if v is not None and math.isfinite(v) and v < best["value"]:
                    best = {"metric": config.select_best_by, "value": float(v), "epoch": epoch + 1}
                    if env.is_main:
                        # best.pt is for evaluation: the weights and the loss/head state
                        best_snapshot = _snapshot(core, None, None, loss_fn, None, head, None)
                        best_dirty = True

            # --- log, then checkpoint (rank 0): a resumed run drops log lines past its
            # checkpoint, so a kill between the two loses nothing ------------------------------
            if env.is_main:
                _append_jsonl(log_path, rec)
                if tb is not None:
                    tb.log_epoch(rec)
                if (epoch + 1) % config.checkpoint_every == 0 or last_epoch:
                    extra = {"num_classes": num_classes, "input_shape": input_shape,
                             "config": config.to_dict(), "best": dict(best)}
                    if best_dirty and best_snapshot is not None:
                        save_checkpoint(best_path, {**best_snapshot, **extra,
                                                    "epoch": int(best["epoch"]),
                                                    "rng": rng_state_tensors()})
                        best_dirty = False
                    save_checkpoint(last_path, {
                        **_snapshot(core, optimizer, scheduler, loss_fn, scaler, head, head_opt),
                        **extra, "epoch": epoch + 1, "rng": rng_state_tensors()})
                if bar is not None:
                    bar.set_postfix(val_ece=f"{vm['ece']:.4f}", val_err=f"{vm['error']:.4f}",
                                    refresh=False)
    finally:
        if bar is not None:
            bar.close()
        if tb is not None:
            tb.close()

    trained_epochs = max(config.epochs, start_epoch)
    preds = None
    if config.evaluate:
        preds = collect_predictions(core, splits, ood_sets, config, device=device, env=env,
                                    batch_size=eval_bs)
    if env.enabled:
        dist.barrier()
        if env.initialized_here:
            # the final metrics run on rank 0 alone: leave the process group first so that
            # nothing in them tries to sync with the other ranks
            cleanup_distributed(env)
    results = None
    if preds is not None:
        if env.is_main:
            results = write_predictions(preds, run_dir, config, epoch=trained_epochs,
                                        checkpoint="last")
        elif env.enabled and not env.initialized_here:
            # a process group created by the caller stays up and metrics that sync under DDP
            # need every rank: compute the same results everywhere, write on rank 0 only
            write_predictions(preds, run_dir, config, epoch=trained_epochs, checkpoint="last",
                              write=False)
    return {
        "run_dir": str(run_dir),
        "epochs": trained_epochs,
        "resumed_from": start_epoch,
        "final": final,
        "best": best,
        "results": results,
        "seconds": time.perf_counter() - t_start,
        "world_size": env.world_size,
    }


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


def _snapshot(model, optimizer, scheduler, loss_fn, scaler, head, head_opt) -> dict[str, Any]:
    h = getattr(head, "module", head)
    return _clone_state({
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "loss": loss_fn.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "head": h.state_dict() if h is not None else None,
        "head_optimizer": head_opt.state_dict() if head_opt is not None else None,
    })
