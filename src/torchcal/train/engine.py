"""The training engine: one set of steps that train a stack of M runs.

:func:`~torchcal.train.train` is the case M = 1 and :func:`~torchcal.train.train_packed` the
case of M runs that share a model and a recipe (the seeds of a loss, several losses); both go
through :func:`run_stack`.  The steps, in the order of an epoch:

* **batches** (:class:`Batches`): every member's batch of a step stacked (M, B, ...), one gather
  from the data on the device (each member its own order, from its seed; under ``torchrun``
  each rank its shard);
* **forward and step**: the stack's (:mod:`torchcal.train.stacks`): a :class:`PackedModel`
  (stacked parameters, one batched forward, per-member clipping, one SGD) or a
  :class:`SoloModel` (one run's own module with its head, DDP, compile and AMP scaler);
* **losses** (:class:`~torchcal.train.loss_groups.LossGroups`): one call per loss
  configuration, the members' loss state stacked; the losses' protocol
  (:mod:`torchcal.losses.base`: ``set_epoch`` before an epoch, ``on_validation`` after each
  validation pass, extra passes every ``update_every`` batches) driven per member;
* **statistics** (:class:`PackedStats`): the training loss, NLL, error and ECE of every member,
  accumulated on the device (no host synchronisation in a step);
* **end of epoch** (:func:`end_epoch`): the schedules, the loss hooks on the validation logits,
  every member's validation (and, when due, test) metrics and loss, the divergence check and the
  ``fc`` norm from the stacked tensors with one device-to-host copy; then for each member its
  log line, best epoch and staged checkpoint, committed together
  (:mod:`torchcal.train.pack_commit`), so a stack's epoch commits as one;
* **final evaluation** (:func:`final_results`): one packed pass over the validation, test and
  OOD sets, or a run's own (:func:`~torchcal.train.steps.final_evaluation`).

A member whose training loss or parameters become non-finite stops: alone in a stack of one
with :class:`~torchcal.errors.DivergedError` (``train`` raises it), and in a pack with
:class:`MemberDivergedError` while it stays in its slot as a *ghost* (computed, never written),
so its companions keep their pack and their numbers.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch
import torch.distributed as dist

from ..errors import MemberDivergedError, diverged_message
from ..losses.base import loss_log_state, loss_on_validation, loss_set_epoch, loss_wants_validation
from ..metrics.binning import calibration_from_sums
from ..metrics.epoch import (
    DIAGNOSTIC_KEYS,
    EPOCH_KEYS,
    stacked_binned_sums,
    stacked_epoch_metrics,
)
from ..runs import LOSS_STATE_KEY
from .build import load_ood_sets
from .checkpoint import rng_state_tensors, save_checkpoint
from .device import autocast
from .distributed import epoch_permutation, epoch_seed
from .evaluation import write_predictions
from .inference import predict_logits
from .loss_groups import LossGroups
from .pack_commit import commit_staged, stage_checkpoint
from .stacks import PackedModel, SharedInput, SoloModel
from .steps import (
    Run,
    divergence_error,
    final_evaluation,
    finished_run_numbers,
    progress_bar,
    snapshot,
    tensorboard_logger,
    train_batches,
    update_best,
    update_every,
)

__all__ = ["Member", "MemberDivergedError", "Batches", "PackedStats", "train_epoch", "split_loss",
           "end_epoch", "fit_stack", "final_results", "run_stack"]

Stack = PackedModel | SoloModel


class PackedStats:
    """:class:`~torchcal.metrics.epoch.EpochStats` of M members at once (on the device)."""

    def __init__(self, n_members: int, n_bins: int, device: torch.device) -> None:
        self.n, self.n_bins = n_members, n_bins
        self.scalars = torch.zeros(n_members, 4, dtype=torch.float64, device=device)
        self.bins = torch.zeros(3, n_members, n_bins, dtype=torch.float64, device=device)

    @torch.no_grad()
    def update(self, logits: torch.Tensor, y: torch.Tensor, loss_sums: torch.Tensor) -> None:
        n, b = y.shape
        logp = torch.log_softmax(logits.detach().float(), 2)
        conf, pred = logp.max(dim=2)  # as EpochStats.update
        correct = pred.eq(y)
        nll = -logp.gather(2, y.unsqueeze(2)).reshape(n, b).sum(1)
        self.bins += stacked_binned_sums(conf.exp(), correct, self.n_bins)
        self.scalars += torch.stack([loss_sums.double(), nll.double(),
                                     correct.sum(1).double(),
                                     torch.full_like(nll, b, dtype=torch.float64)], 1)

    def numbers(self, sync: bool = False) -> torch.Tensor:
        """(M, 4) float64 on the device: loss, nll, error, ece (NaN before any batch);
        ``sync`` sums every rank's counts first (``torchrun``)."""
        if sync:
            flat = torch.cat([self.scalars.reshape(-1), self.bins.reshape(-1)])
            dist.all_reduce(flat)
            k = self.scalars.numel()
            self.scalars = flat[:k].reshape(self.scalars.shape)
            self.bins = flat[k:].reshape(self.bins.shape)
        s = self.scalars
        n = torch.where(s[:, 3] > 0, s[:, 3], torch.full_like(s[:, 3], float("nan")))
        return torch.stack([s[:, 0] / n, s[:, 1] / n, 1.0 - s[:, 2] / n,
                            calibration_from_sums(self.bins, "l1")], 1)


# ------------------------------------------------------------------------------------------
# members, data
# ------------------------------------------------------------------------------------------
class Member:
    """One slot of a stack: its :class:`~torchcal.train.steps.Run`, its last epoch's numbers
    and, once it stopped, its error.  A *ghost* (a packed member that stopped, or a slot whose
    run does not resume with this pack) is computed with the others but writes nothing; an
    ``alone`` member (the run of :func:`~torchcal.train.train`) raises what stops it."""

    def __init__(self, index: int, r: Run, ghost: bool = False, alone: bool = False) -> None:
        self.index, self.r, self.ghost, self.alone = index, r, ghost, alone
        self.final: dict[str, float] = {} if ghost else finished_run_numbers(r)
        self.error: BaseException | None = None
        self.every = update_every(r.loss_fn)
        self.tb: Any = None  # its TensorBoard logger (rank 0 with ``tensorboard``)

    def stop(self, error: BaseException) -> None:
        """Stop this member: a packed member stays in its slot as a ghost; a member alone
        raises ``error``."""
        if self.alone:
            raise error
        self.error, self.ghost = error, True


def live(members: list[Member]) -> list[Member]:
    """The members that train and write (no ghosts)."""
    return [mb for mb in members if not mb.ghost]


class Batches:
    """The members' training batches, stacked (M, B, ...): one gather per step from the shared
    data on the device (each member its own order, from its seed); per member when the members'
    data differ, augmentation draws per member or each rank trains on its shard."""

    def __init__(self, members: list[Member]) -> None:
        r0 = members[0].r
        self.src = r0.src["train"]
        augment = bool(getattr(r0.splits, "augment", False))
        self.shared = (self.src.array and not augment and not r0.env.enabled
                       and all(mb.r.src["train"] is self.src for mb in members))
        self.bs = r0.local_bs

    def epoch(self, members: list[Member], epoch: int):
        """The epoch's steps: ``(x (M, B, ...), y (M, B), index (M, B))``, ``index`` the
        samples' positions in the training split (on the device)."""
        if not self.shared:
            for batch in zip(*[train_batches(mb.r, epoch) for mb in members], strict=True):
                yield tuple(torch.stack([b[k] for b in batch]) for k in range(3))
            return
        n = self.src.n
        perms = torch.stack([epoch_permutation(n, mb.r.config.seed, epoch) for mb in members])
        perms = perms.to(self.src.device)
        stop = n - 1 if (n % self.bs == 1 and n > 1) else n  # a lone last sample is dropped
        for s in range(0, stop, self.bs):
            index = perms[:, s:min(s + self.bs, stop)]
            yield (*self.src.take(index), index)


# ------------------------------------------------------------------------------------------
# one epoch
# ------------------------------------------------------------------------------------------
def train_epoch(stack: Stack, members: list[Member], groups: LossGroups, batches: Batches,
                epoch: int, bar: Any) -> PackedStats:
    """One epoch of every member's batches (each member its own data order), stepped as one."""
    r0, slots = members[0].r, live(members)
    for mb in members:
        loss_set_epoch(mb.r.loss_fn, epoch)
    groups.refresh()
    # the global stream (dropout of a run alone; nothing of a pack) follows the first slot
    torch.manual_seed(epoch_seed(r0.config.seed, epoch, stream=3 + r0.env.rank))
    stack.start_epoch(slots[0].r.optimizer.param_groups[0]["lr"])
    stats = PackedStats(len(members), r0.config.n_bins, r0.device)
    mean_rows = torch.tensor([red == "mean" for red in groups.reductions()], device=r0.device)
    stateful = [mb for mb in slots if mb.every]  # losses with extra validation passes
    for step, (x, y, index) in enumerate(batches.epoch(members, epoch)):
        with autocast(r0.device, r0.amp):
            logits = stack.forward(x)
        logits = logits.float()
        loss = groups(logits, y)
        sums = loss.detach()
        stats.update(logits, y, torch.where(mean_rows, sums * y.shape[1], sums))
        stack.step(loss, logits, y, r0.config.grad_clip, index)
        if bar is not None:
            bar.update(1)
        extra = [mb for mb in stateful if (step + 1) % mb.every == 0] if stateful else None
        if extra:  # a stateful loss' extra update (AdaFocal & co.)
            _drive_validation(stack, members, extra)
            groups.refresh()
            stack.train()
    return stats


def _drive_validation(stack: Stack, members: list[Member], which: list[Member]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation logits (N, M, C) and labels of every member; the loss hooks of ``which``
    driven with their own columns of this process' share (an error stops that member)."""
    val, (lz, ly) = stack.split_logits("val")
    for mb in which:
        m = members.index(mb)
        y = ly if ly.ndim == 1 else ly[:, m]
        try:
            loss_on_validation(mb.r.loss_fn, logits=lz[:, m].contiguous(), labels=y)
        except Exception as exc:  # noqa: BLE001 - this member stops, the pack goes on
            mb.stop(exc)
    return val


def split_loss(groups: LossGroups, z: torch.Tensor, y: torch.Tensor, chunk: int,
                mean_rows: torch.Tensor) -> torch.Tensor:
    """(M,) mean per-sample loss of every member over a split (``z`` (N, M, C)), in chunks of
    ``chunk`` samples (O(chunk) memory for MMCE)."""
    n, m = z.shape[0], z.shape[1]
    total = torch.zeros(m, device=z.device)
    with torch.no_grad():
        for s in range(0, n, chunk):
            zc = z[s:s + chunk].transpose(0, 1)
            yc = y[s:s + chunk]
            yc = yc.expand(m, -1) if yc.ndim == 1 else yc.transpose(0, 1)
            v = groups(zc, yc).float()
            total = total + torch.where(mean_rows, v * zc.shape[1], v)
    return total / max(n, 1)


def _split_numbers(groups: LossGroups, split: tuple[torch.Tensor, torch.Tensor], n_bins: int,
                   chunk: int, mean_rows: torch.Tensor, diagnostics: bool) -> torch.Tensor:
    """(M, K + 1): :func:`stacked_epoch_metrics` of the split and its loss."""
    z, y = split
    yy = y if y.ndim == 1 else y.transpose(0, 1)
    metrics = stacked_epoch_metrics(z.transpose(0, 1), yy, n_bins=n_bins,
                                    diagnostics=diagnostics)
    loss = split_loss(groups, z, y, chunk, mean_rows).double()
    return torch.cat([metrics, loss[:, None]], 1)


# ------------------------------------------------------------------------------------------
# the end of an epoch: every member's numbers from the stacked tensors, one host copy
# ------------------------------------------------------------------------------------------
_TRAIN_KEYS = ("loss", "nll", "error", "ece")


def _epoch_keys(test: bool) -> list[str]:
    keys = [f"train_{k}" for k in _TRAIN_KEYS] + [f"val_{k}" for k in (*EPOCH_KEYS, "loss")]
    if test:
        keys += [f"test_{k}" for k in (*EPOCH_KEYS, *DIAGNOSTIC_KEYS, "loss")]
    return keys


def _epoch_table(stack: Stack, members: list[Member], groups: LossGroups, stats: PackedStats,
                 epoch: int) -> tuple[list[str], Any, bool]:
    """The epoch's numbers of every slot as one host array (M, K): training statistics,
    validation metrics and loss (after the loss hooks ran on the validation logits), the test
    split's when due, then "all parameters finite" and the ``fc`` weight norm."""
    r0 = members[0].r
    val = _drive_validation(stack, members, [mb for mb in live(members)
                                             if loss_wants_validation(mb.r.loss_fn)])
    groups.refresh()
    mean_rows = torch.tensor([red == "mean" for red in groups.reductions()], device=r0.device)
    chunk = max(r0.local_bs, 1024)  # chunks of the logged loss (MMCE is O(chunk^2))
    every = r0.config.eval_test_every
    test = bool(every and ((epoch + 1) % every == 0 or epoch + 1 == r0.config.epochs))
    cols = [stats.numbers(sync=r0.env.enabled),
            _split_numbers(groups, val, r0.config.n_bins, chunk, mean_rows, False)]
    if test:
        cols.append(_split_numbers(groups, stack.split_logits("test")[0], r0.config.n_bins,
                                   chunk, mean_rows, True))
    cols.append(stack.finite().double()[:, None])
    fc = stack.fc_norms()
    if fc is not None:
        cols.append(fc.double()[:, None])
    host = torch.cat(cols, 1).cpu().numpy()  # the epoch's one device-to-host copy
    return _epoch_keys(test), host, fc is not None


def _stop_error(mb: Member, epoch: int, rec: dict[str, Any], finite: bool
                ) -> BaseException | None:
    """What stops a member whose training loss or parameters are not finite (None: it goes
    on)."""
    finite_loss = math.isfinite(rec["train_loss"])
    if mb.alone:
        return divergence_error(mb.r, epoch, finite_loss, finite)
    if finite_loss and finite:
        return None
    what = " and ".join(w for w, bad in (("training loss", not finite_loss),
                                         ("parameters", not finite)) if bad)
    return MemberDivergedError(diverged_message(
        epoch, f"{what} {rec['train_loss'] if 'loss' in what else 'not finite'}",
        "it stops at its last checkpoint, the other packed runs go on", run=str(mb.r.run.path)))


def _records(stack: Stack, members: list[Member], keys: list[str], host: Any, has_fc: bool,
             epoch: int, lr: float) -> dict[int, dict[str, Any]]:
    """Each live slot's log record from the epoch's host table (a diverged member stops)."""
    k = len(keys)
    recs: dict[int, dict[str, Any]] = {}
    for m, mb in enumerate(members):
        if mb.ghost:
            continue
        rec = {"epoch": epoch + 1, "lr": lr, **dict(zip(keys, host[m, :k].tolist(), strict=True))}
        error = _stop_error(mb, epoch, rec, host[m, k] == 1.0)
        if error is not None:
            mb.stop(error)
            continue
        rec["fc_weight_norm"] = float(host[m, k + 1]) if has_fc else None
        stack.annotate(rec)
        state = loss_log_state(mb.r.loss_fn)
        if state:
            rec[LOSS_STATE_KEY] = state
        recs[m] = rec
    return recs


def end_epoch(stack: Stack, members: list[Member], groups: LossGroups, stats: PackedStats,
              epoch: int, lr: float, t0: float, bar: Any = None) -> None:
    """The end of an epoch for every slot at once: schedules, the loss hooks, the numbers (one
    host copy), then for each live member its divergence check, log line, best epoch and
    staged checkpoint; the staged checkpoints are committed together."""
    for mb in members:
        if not mb.r.head.per_step_schedule:
            mb.r.scheduler.step()
    keys, host, has_fc = _epoch_table(stack, members, groups, stats, epoch)
    recs = _records(stack, members, keys, host, has_fc, epoch, lr)
    share = (time.perf_counter() - t0) / max(len(recs), 1)
    writers = [str(members[m].r.config.out_dir) for m in recs]
    layout = [str(mb.r.config.out_dir) for mb in members]
    staged = []
    for m, rec in recs.items():
        mb = members[m]
        rec["seconds"] = share
        meta = None if mb.alone else {"slots": layout, "slot": m, "writers": writers}
        try:
            if _record_member(mb, rec, epoch, meta):
                staged.append(mb)
        except Exception as exc:  # noqa: BLE001 - this member stops, the pack goes on
            mb.stop(exc)
    for mb in staged:
        try:
            commit_staged([mb.r.config.out_dir])
        except Exception as exc:  # noqa: BLE001
            mb.stop(exc)
    if bar is not None and len(recs) == 1 and len(members) == 1:
        # percent, as every number the command line prints (the log keeps fractions)
        rec = next(iter(recs.values()))
        bar.set_postfix(val_ece=f"{100 * rec['val_ece']:.2f}%",
                        val_err=f"{100 * rec['val_error']:.2f}%", refresh=False)


def _record_member(mb: Member, rec: dict[str, Any], epoch: int,
                   pack_meta: dict[str, Any] | None) -> bool:
    """One live member's best epoch, log line and (when due) staged checkpoint, written by
    rank 0 (``pack_meta``: the pack's layout, recorded in a packed member's checkpoints).  True
    when a checkpoint was staged."""
    r = mb.r
    update_best(r, rec, epoch)
    mb.final = {k: v for k, v in rec.items() if isinstance(v, float) and k != "seconds"}
    if not r.env.is_main:
        return False
    r.run.append_log(rec, fsync=False)  # fsynced with the next checkpoint
    if mb.tb is not None:
        mb.tb.log_epoch(rec)
    if (epoch + 1) % r.config.checkpoint_every and epoch + 1 != r.config.epochs:
        return False
    extra = {"num_classes": r.num_classes, "input_shape": r.input_shape,
             "config": r.config.to_dict(), "best": dict(r.best)}
    if pack_meta is not None:
        extra["pack"] = pack_meta
    if r.best_snapshot is not None:
        save_checkpoint(r.run.checkpoint("best"), {**r.best_snapshot, **extra,
                                                   "epoch": int(r.best["epoch"]),
                                                   "rng": rng_state_tensors()})
        r.best_snapshot = None  # written: the next best.pt waits for a better epoch
    stage_checkpoint(r.run.path, {**snapshot(r, full=True), **extra, "epoch": epoch + 1,
                                  "rng": rng_state_tensors()})
    return True


# ------------------------------------------------------------------------------------------
# a stack: train, then evaluate
# ------------------------------------------------------------------------------------------
def fit_stack(stack: Stack, members: list[Member], epochs: int, bar: Any = None) -> None:
    """Train the slots (members at the same epoch; in a pack, ghosts in the slots of absent
    runs) to ``epochs``; a packed member that stops becomes a ghost, the pack keeps its size."""
    groups = LossGroups([mb.r.loss_fn for mb in members], members[0].r.device)
    batches = Batches(members)
    for epoch in range(members[0].r.start_epoch, epochs):
        slots = live(members)
        if not slots:
            return
        t0 = time.perf_counter()
        lr = slots[0].r.optimizer.param_groups[0]["lr"]
        stats = train_epoch(stack, members, groups, batches, epoch, bar)
        end_epoch(stack, members, groups, stats, epoch, lr, t0, bar)


def _evaluate_pack(stack: PackedModel, members: list[Member], ood_sets: dict[str, Any]
                   ) -> dict[int, dict[str, Any]]:
    """The final evaluation of every live member with ``evaluate``: one packed forward over
    the validation, test and OOD sets; each member's logits and results written as a run's."""
    evaluated = [mb for mb in live(members) if mb.r.config.evaluate]
    if not evaluated:
        return {}
    r0 = members[0].r
    preds = {s: stack.split_logits(s)[0] for s in ("val", "test")}
    mean, std = getattr(r0.splits, "mean", None), getattr(r0.splits, "std", None)
    for name, ds in ood_sets.items():
        preds[f"ood_{name}"] = predict_logits(SharedInput(stack), ds, r0.device, r0.eval_bs,
                                              mean=mean, std=std, amp=r0.amp)
    out = {}
    for mb in evaluated:
        m, cfg = members.index(mb), mb.r.config
        own = {k: (z[:, m].contiguous(), y if y.ndim == 1 else y[:, m]) for k, (z, y) in
               preds.items()}
        epochs = max(cfg.epochs, mb.r.start_epoch)
        out[m] = write_predictions(own, mb.r.run.path, cfg, epoch=epochs, checkpoint="last")
    return out


def _shares_data(members: list[Member]) -> bool:
    r0 = members[0].r
    return all(mb.r.src["val"] is r0.src["val"] for mb in members)


def _ood_sets(members: list[Member]) -> list[dict[str, Any]]:
    """Each slot's OOD sets (loaded before training, so that a missing set fails at once; one
    load for members that share their data)."""
    shared: dict[str, Any] | None = None
    one_data = _shares_data(members)
    out = []
    for mb in members:
        cfg = mb.r.config
        if mb.ghost or not cfg.evaluate:
            out.append({})
        elif one_data:
            shared = shared if shared is not None else load_ood_sets(cfg, mb.r.splits)
            out.append(shared)
        else:
            out.append(load_ood_sets(cfg, mb.r.splits))
    return out


def final_results(stack: Stack, members: list[Member], oods: list[dict[str, Any]]
                  ) -> dict[int, dict[str, Any] | None]:
    """Each live member's final evaluation (``oods``: each slot's OOD sets): packed when the
    members of a pack share their data, else each run's own."""
    if isinstance(stack, PackedModel) and _shares_data(members):
        return _evaluate_pack(stack, members, next((o for o in oods if o), {}))
    out = {}
    for m, mb in enumerate(members):
        if mb.alone or (not mb.ghost and mb.r.config.evaluate):
            out[m] = final_evaluation(mb.r, oods[m], max(mb.r.config.epochs, mb.r.start_epoch))
    return out


def _summary(mb: Member, results: dict[str, Any] | None) -> dict[str, Any]:
    r = mb.r
    return {"run_dir": str(r.run.path), "epochs": max(r.config.epochs, r.start_epoch),
            "resumed_from": r.start_epoch, "final": mb.final, "best": r.best,
            "results": results, "world_size": r.env.world_size}


def run_stack(stack: Stack, members: list[Member], results: list[Any]) -> None:
    """Train one stack to its epochs (when it has any left), evaluate it, fill ``results``
    (each member's summary, or the error that stopped it; a member ``alone`` raises it)."""
    r0 = members[0].r
    oods = _ood_sets(members)
    with contextlib.ExitStack() as ctx:
        for mb in live(members):
            mb.tb = ctx.enter_context(tensorboard_logger(mb.r))
        if r0.start_epoch < r0.config.epochs:
            bar = ctx.enter_context(progress_bar(r0, len(members)))
            fit_stack(stack, members, r0.config.epochs, bar)
    evaluated = [mb for mb in live(members) if mb.index >= 0]
    try:
        done = final_results(stack, members, oods)
    except Exception as exc:  # noqa: BLE001 - reported in every member's place
        if members[0].alone:
            raise
        for mb in evaluated:
            results[mb.index] = exc
        return
    for m, mb in enumerate(members):
        if mb.index >= 0:
            results[mb.index] = mb.error or _summary(mb, done.get(m))
