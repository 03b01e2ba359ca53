"""The training engine: one set of steps that train a stack of M lanes (each a run).

:func:`~torchcal.train.train` is the case M = 1 and :func:`~torchcal.train.train_packed` the
case of M runs that share a model and a recipe (the seeds of a loss, several losses); both go
through :func:`run_stack`.  The steps, in the order of an epoch:

* **batches** (:class:`Batches`): every lane's batch of a step stacked (M, B, ...), one gather
  from the data on the device (each lane its own order, from its seed; under ``torchrun``
  each rank its shard);
* **forward and step**: the stack's (:mod:`torchcal.train.stacks`): a
  :class:`~torchcal.train.stacks.PackedModel` (stacked parameters, one batched forward,
  per-lane clipping, one SGD) or a :class:`~torchcal.train.stacks.SoloModel` (one run's own
  module with its head, DDP, compile and AMP scaler);
* **losses** (:class:`~torchcal.train.loss_groups.LossGroups`): one call per loss
  configuration, the lanes' loss state stacked; the losses' protocol
  (:mod:`torchcal.losses.base`: ``set_epoch`` before an epoch, ``on_validation`` after each
  validation pass, extra passes every ``update_every`` batches) driven per lane;
* **statistics** (:class:`PackedStats`): the training loss, NLL, error and ECE of every lane,
  accumulated on the device (no host synchronisation in a step);
* **end of epoch** (:func:`end_epoch`, its state kept in :class:`EpochEnd`): the schedules,
  the loss hooks on the validation logits (one evaluation forward per split for the whole
  stack), every lane's validation (and, when due, test) metrics and loss, the divergence
  check, the ``fc`` norm and whether it improved on its best, from the stacked tensors with one
  device-to-host copy; the best-epoch weights kept on the device as stacked tensors (one
  ``where`` per stacked tensor, :mod:`torchcal.train.epoch_end`); then every lane's log line,
  ``best.pt`` and staged checkpoint, committed together (:mod:`torchcal.train.pack_commit`),
  written from one host copy per stacked tensor by the writer thread
  (:class:`~torchcal.train.pack_commit.EpochWriter`) while the next epoch trains;
* **final evaluation** (:func:`final_results`): one packed pass over the validation, test and
  OOD sets, or a run's own (:func:`~torchcal.train.run.final_evaluation`).

A lane whose training loss or parameters become non-finite stops: alone in a stack of one
with :class:`~torchcal.errors.DivergedError` (``train`` raises it), and in a pack with
:class:`LaneDivergedError` while it stays in its place as a *ghost* (computed, never written),
so its companions keep their pack and their numbers.

Ownership: the engine works with a stack only through the
:class:`~torchcal.train.stacks.Stack` protocol (``tools/check_architecture.py``, rule 15); it
owns the lanes (:class:`Lane`: each lane's run), steps every schedule
(:func:`step_schedules`) and sets a pack's learning rate (``Stack.start_epoch``); a stack holds
modules, optimisers and settings, no run, and computes a split's logits from the sources the
engine gives it (:func:`split_logits`).  Where a run alone and a pack differ (what stops a
lane, what its checkpoint records, the schedules' order check, the final evaluation) the
engine calls the stack's strategy, :attr:`Stack.policy <torchcal.train.stacks.Stack.policy>`
(:class:`~torchcal.train.stacks.AlonePolicy`, :class:`~torchcal.train.stacks.PackPolicy`):
it has no flag for either.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..errors import LaneDivergedError
from ..losses.base import loss_log_state, loss_on_validation, loss_set_epoch, loss_wants_validation
from ..metrics.binning import calibration_from_sums
from ..metrics.epoch import (
    DIAGNOSTIC_KEYS,
    EPOCH_KEYS,
    stacked_binned_sums,
    stacked_epoch_metrics,
)
from ..run_dir import LOSS_STATE_KEY
from .build import load_ood_sets
from .checkpoint import rng_state_tensors, save_checkpoint
from .compiled import CompiledStep, make_compiled_step
from .device import autocast
from .distributed import epoch_permutation, epoch_seed
from .epoch_end import DeviceBest, StateRows, mean_rows, resolve, rows_of
from .loss_groups import LossGroups
from .pack_commit import EpochJob, EpochWriter, commit_staged, stage_checkpoint
from .run import (
    Run,
    finished_run_numbers,
    progress_bar,
    shares_data,
    tensorboard_logger,
    train_batches,
    update_every,
)
from .stacks import Stack

__all__ = ["Lane", "LaneDivergedError", "Batches", "PackedStats", "train_epoch", "split_loss",
           "EpochEnd", "end_epoch", "fit_stack", "final_results", "run_stack", "step_schedules", "split_logits"]


class PackedStats:
    """Fixed-size per-epoch training statistics of M lanes accumulated on the device (no
    host syncs): the loss, NLL, error and equal-width ECE of the training batches seen."""

    def __init__(self, n_lanes: int, n_bins: int, device: torch.device) -> None:
        self.n, self.n_bins = n_lanes, n_bins
        self.scalars = torch.zeros(n_lanes, 4, dtype=torch.float64, device=device)
        self.bins = torch.zeros(3, n_lanes, n_bins, dtype=torch.float64, device=device)

    @torch.no_grad()
    def update(self, logits: torch.Tensor, y: torch.Tensor, loss_sums: torch.Tensor) -> None:
        n, b = y.shape
        logp = torch.log_softmax(logits.detach().float(), 2)
        conf, pred = logp.max(dim=2)
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
# lanes, data
# ------------------------------------------------------------------------------------------
class Lane:
    """One lane of a stack (its position ``index`` in the caller's results; -1 for a
    ghost): its :class:`~torchcal.train.run.Run`, its last epoch's numbers and, once it
    stopped, its error.  A *ghost* (a packed lane that stopped, or a lane whose run does
    not resume with this pack) is computed with the others but writes nothing.  What stopping
    a lane does is its stack's policy's
    (:meth:`LanePolicy.stop <torchcal.train.stacks.LanePolicy.stop>`: a run alone raises
    the error, a packed lane becomes a ghost).  The engine owns the lanes' runs: a stack
    holds none."""

    def __init__(self, index: int, run: Run, ghost: bool = False) -> None:
        self.index, self.run, self.ghost = index, run, ghost
        self.final: dict[str, float] = {} if ghost else finished_run_numbers(run)
        self.error: BaseException | None = None
        self.every = update_every(run.loss_fn)
        self.tb: Any = None  # its TensorBoard logger (rank 0 with ``tensorboard``)


def live(lanes: list[Lane]) -> list[Lane]:
    """The lanes that train and write (no ghosts)."""
    return [mb for mb in lanes if not mb.ghost]


def split_logits(stack: Stack, lanes: list[Lane], split: str
                 ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """:meth:`Stack.split_logits <torchcal.train.stacks.Stack.split_logits>` of ``split``
    (``"val"``, ``"test"``) from the lanes' batch sources of it."""
    return stack.split_logits([mb.run.src[split] for mb in lanes], lanes[0].run.eval_bs)


def step_schedules(stack: Stack, lanes: list[Lane], per_step: bool) -> None:
    """Step the lanes' learning-rate schedules after the stack's optimiser step: those of
    a head stepped at every optimiser step (``per_step``), or the others, at the end of an
    epoch.  The engine alone steps them (a stack never does), in the stack's policy's context
    (:meth:`LanePolicy.stepping_schedules
    <torchcal.train.stacks.LanePolicy.stepping_schedules>`: a pack's lanes' optimisers are
    never stepped themselves, which torch's check of the order cannot see)."""
    schedules = [mb.run.scheduler for mb in lanes if mb.run.plugin.per_step_schedule == per_step]
    if not schedules:
        return
    with stack.policy.stepping_schedules():
        for schedule in schedules:
            schedule.step()


class Batches:
    """The lanes' training batches, stacked (M, B, ...): one gather per step from the shared
    data on the device (each lane its own order, from its seed); per lane when the lanes'
    data differ, augmentation draws per lane or each rank trains on its shard."""

    def __init__(self, lanes: list[Lane]) -> None:
        r0 = lanes[0].run
        self.src = r0.src["train"]
        augment = bool(getattr(r0.splits, "augment", False))
        self.shared = (self.src.array and not augment and not r0.env.enabled
                       and shares_data([mb.run for mb in lanes]))
        self.bs = r0.local_bs
        self.gather = True  # False: a compiled step gathers its batch itself (index only)

    def epoch(self, lanes: list[Lane], epoch: int):
        """The epoch's steps: ``(x (M, B, ...), y (M, B), index (M, B))``, ``index`` the
        samples' positions in the training split (on the device)."""
        if not self.shared:
            for batch in zip(*[train_batches(mb.run, epoch) for mb in lanes], strict=True):
                yield tuple(torch.stack([b[k] for b in batch]) for k in range(3))
            return
        n = self.src.n
        perms = torch.stack([epoch_permutation(n, mb.run.config.seed, epoch) for mb in lanes])
        perms = perms.to(self.src.device)
        stop = n - 1 if (n % self.bs == 1 and n > 1) else n  # a lone last sample is dropped
        for s in range(0, stop, self.bs):
            index = perms[:, s:min(s + self.bs, stop)]
            yield (*self.src.take(index), index) if self.gather else (None, None, index)


# ------------------------------------------------------------------------------------------
# one epoch
# ------------------------------------------------------------------------------------------
def train_epoch(stack: Stack, lanes: list[Lane], groups: LossGroups, batches: Batches,
                epoch: int, bar: Any, compiled: CompiledStep | None = None) -> PackedStats:
    """One epoch of every lane's batches (each lane its own data order), stepped as one
    (``compiled``: each step one compiled graph, :mod:`torchcal.train.compiled`); the
    learning rate is the first live lane's (its schedule's), set by the engine."""
    r0, running = lanes[0].run, live(lanes)
    for mb in lanes:
        loss_set_epoch(mb.run.loss_fn, epoch)
    groups.refresh()
    # the global stream (dropout of a run alone; nothing of a pack) follows the first lane
    torch.manual_seed(epoch_seed(r0.config.seed, epoch, stream=3 + r0.env.rank))
    stack.start_epoch(running[0].run.optimizer.param_groups[0]["lr"])
    stats = PackedStats(len(lanes), r0.config.n_bins, r0.device)
    mean_rows = groups.mean_rows  # built once per pack (a host list would sync every epoch)
    stateful = [mb for mb in running if mb.every]  # losses with extra validation passes
    per_step = any(mb.run.plugin.per_step_schedule for mb in lanes)  # a head's schedule
    batches.gather = compiled is None or compiled.failed is not None
    for step, (x, y, index) in enumerate(batches.epoch(lanes, epoch)):
        if not batches.gather and not compiled(index, stats):
            batches.gather = True  # it did not compile: this step and the next ones eager
            x, y = batches.src.take(index)
        if batches.gather:
            _eager_step(stack, groups, stats, x, y, index, mean_rows, r0)
        if per_step:
            step_schedules(stack, lanes, per_step=True)
        if bar is not None:
            bar.update(1)
        extra = [mb for mb in stateful if (step + 1) % mb.every == 0] if stateful else None
        if extra:  # a stateful loss' extra update (AdaFocal & co.)
            _drive_validation(stack, lanes, extra)
            groups.refresh()
            stack.train()
    return stats


def _eager_step(stack: Stack, groups: LossGroups, stats: PackedStats, x: torch.Tensor,
                y: torch.Tensor, index: torch.Tensor, mean_rows: torch.Tensor, r0: Run) -> None:
    """One step of every lane, operation by operation."""
    with autocast(r0.device, r0.amp):
        logits = stack.forward(x)
    logits = logits.float()
    loss = groups(logits, y)
    sums = loss.detach()
    stats.update(logits, y, torch.where(mean_rows, sums * y.shape[1], sums))
    stack.step(loss, logits, y, r0.config.grad_clip, index)


def _drive_validation(stack: Stack, lanes: list[Lane], which: list[Lane]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation logits (N, M, C) and labels of every lane; the loss hooks of ``which``
    driven with their own columns of this process' share (an error stops that lane)."""
    val, (lz, ly) = split_logits(stack, lanes, "val")
    for mb in which:
        m = lanes.index(mb)
        y = ly if ly.ndim == 1 else ly[:, m]
        try:
            loss_on_validation(mb.run.loss_fn, logits=lz[:, m].contiguous(), labels=y)
        except Exception as exc:  # noqa: BLE001 - this lane stops, the pack goes on
            stack.policy.stop(mb, exc)
    return val


def split_loss(groups: LossGroups, z: torch.Tensor, y: torch.Tensor, chunk: int,
                mean_rows: torch.Tensor) -> torch.Tensor:
    """(M,) mean per-sample loss of every lane over a split (``z`` (N, M, C)), in chunks of
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
# the end of an epoch: every lane's numbers from the stacked tensors, one host copy
# ------------------------------------------------------------------------------------------
_TRAIN_KEYS = ("loss", "nll", "error", "ece")


class EpochEnd:
    """What the end of a stack's epochs keeps from one epoch to the next: the constants built
    once per stack (:func:`~torchcal.train.epoch_end.mean_rows`, the stacked tensors of
    :class:`~torchcal.train.epoch_end.StateRows`), the best values and best-epoch weights on
    the device (:class:`~torchcal.train.epoch_end.DeviceBest`), and the
    :class:`~torchcal.train.pack_commit.EpochWriter` that writes the files."""

    def __init__(self, stack: Stack, lanes: list[Lane], groups: LossGroups,
                 writer: EpochWriter | None = None) -> None:
        r0 = lanes[0].run
        self.mean_rows = mean_rows(groups)
        self.writer = writer if writer is not None else EpochWriter(threaded=False)
        self.metric = r0.config.select_best_by
        self.rows = StateRows(stack)
        self.best = None if self.metric == "none" else DeviceBest(
            self.rows, [mb.run.best for mb in lanes], r0.device)
        self.failed: set[str] = set()  # run directories whose files failed (writer thread)


def _epoch_keys(test: bool) -> list[str]:
    keys = [f"train_{k}" for k in _TRAIN_KEYS] + [f"val_{k}" for k in (*EPOCH_KEYS, "loss")]
    if test:
        keys += [f"test_{k}" for k in (*EPOCH_KEYS, *DIAGNOSTIC_KEYS, "loss")]
    return keys


def _epoch_table(stack: Stack, lanes: list[Lane], groups: LossGroups, stats: PackedStats,
                 epoch: int, ctx: EpochEnd) -> tuple[list[str], Any, dict[str, int], Any]:
    """The epoch's numbers of every lane as one host array (M, K): training statistics,
    validation metrics and loss (after the loss hooks ran on the validation logits), the test
    split's when due, then "all parameters finite", the ``fc`` weight norm and "improved on
    its best" (the columns named in the returned dict); and that flag and the validation metric
    on the device."""
    r0 = lanes[0].run
    val = _drive_validation(stack, lanes, [mb for mb in live(lanes)
                                             if loss_wants_validation(mb.run.loss_fn)])
    groups.refresh()
    chunk = max(r0.local_bs, 1024)  # chunks of the logged loss (MMCE is O(chunk^2))
    every = r0.config.eval_test_every
    test = bool(every and ((epoch + 1) % every == 0 or epoch + 1 == r0.config.epochs))
    keys = _epoch_keys(test)
    cols = [stats.numbers(sync=r0.env.enabled),
            _split_numbers(groups, val, r0.config.n_bins, chunk, ctx.mean_rows, False)]
    if test:
        cols.append(_split_numbers(groups, split_logits(stack, lanes, "test")[0],
                                   r0.config.n_bins, chunk, ctx.mean_rows, True))
    extra = {"finite": len(keys)}
    cols.append(stack.finite().double()[:, None])
    fc = stack.fc_norms()
    if fc is not None:
        extra["fc"] = len(keys) + len(extra)
        cols.append(fc.double()[:, None])
    best = None
    if ctx.best is not None:
        extra["improved"] = len(keys) + len(extra)
        v = cols[1][:, keys.index(f"val_{ctx.metric}") - len(_TRAIN_KEYS)]
        best = (ctx.best.improved(v), v)
        cols.append(best[0].double()[:, None])
    host = torch.cat(cols, 1).cpu().numpy()  # the epoch's one device-to-host copy
    return keys, host, extra, best


def _records(stack: Stack, lanes: list[Lane], keys: list[str], host: Any,
             extra: dict[str, int], epoch: int, lr: float,
             drain: Callable[[], None] = lambda: None) -> dict[int, dict[str, Any]]:
    """Each live lane's log record from the epoch's host table (a diverged lane stops:
    :meth:`LanePolicy.stop_error <torchcal.train.stacks.LanePolicy.stop_error>`).
    ``drain`` waits for the earlier epochs' files (a run alone's error says truly whether its
    last good checkpoint is on disk)."""
    k = len(keys)
    recs: dict[int, dict[str, Any]] = {}
    policy = stack.policy
    for m, mb in enumerate(lanes):
        if mb.ghost:
            continue
        rec = {"epoch": epoch + 1, "lr": lr, **dict(zip(keys, host[m, :k].tolist(), strict=True))}
        error = policy.stop_error(mb, epoch, rec, host[m, extra["finite"]] == 1.0, drain)
        if error is not None:
            policy.stop(mb, error)
            continue
        rec["fc_weight_norm"] = float(host[m, extra["fc"]]) if "fc" in extra else None
        stack.annotate(rec)
        state = loss_log_state(mb.run.loss_fn)
        if state:
            rec[LOSS_STATE_KEY] = state
        recs[m] = rec
    return recs


def _state(r: Run, full: bool) -> dict[str, Any]:
    """The entries of a run's checkpoint state (the weights and the loss/head state, and with
    ``full`` the optimiser, schedule and scaler), not yet copied (no tensor operation:
    :meth:`StateRows.capture` copies them)."""
    return {"model": r.model.state_dict(keep_vars=True),
            "loss": r.loss_fn.state_dict(keep_vars=True),
            "optimizer": r.optimizer.state_dict() if full else None,
            "scheduler": r.scheduler.state_dict() if full else None,
            "scaler": r.scaler.state_dict() if full and r.scaler.is_enabled() else None,
            **r.plugin.state(full)}


def _update_best(ctx: EpochEnd, lanes: list[Lane], recs: dict[int, dict[str, Any]],
                 host: Any, extra: dict[str, int], best: Any, epoch: int) -> None:
    """Each live lane's best epoch from the device's "improved" flag; rank 0 keeps the
    improved lanes' loss and head state (their weights stay in the device stacks, updated
    with one ``where`` per stacked tensor)."""
    if ctx.best is None:
        return
    better = [m for m in recs if host[m, extra["improved"]] == 1.0]
    if not better:
        return
    ctx.best.update(*best)
    for m in better:
        r = lanes[m].run
        r.best = {"metric": ctx.metric, "value": float(recs[m][f"val_{ctx.metric}"]),
                  "epoch": epoch + 1}
        if r.env.is_main:
            snap = ctx.rows.capture(_state(r, full=False))
            for row in rows_of(snap):
                row.src = "best"
            r.best_snapshot = snap


def end_epoch(stack: Stack, lanes: list[Lane], groups: LossGroups, stats: PackedStats,
              epoch: int, lr: float, t0: float, bar: Any = None, ctx: EpochEnd | None = None
              ) -> None:
    """The end of an epoch for every lane at once: schedules (:func:`step_schedules`), the loss hooks, the numbers (one
    host copy), each live lane's divergence check, best epoch and log record; then the
    epoch's files (log lines, ``best.pt``, staged checkpoints and their commit) handed to
    ``ctx``'s writer with the epoch's host copy of the stacked weights.  A lane whose files
    failed in an earlier epoch stops first."""
    ctx = ctx if ctx is not None else EpochEnd(stack, lanes, groups)
    _stop_failed(stack, ctx, lanes)
    step_schedules(stack, lanes, per_step=False)
    keys, host, extra, best = _epoch_table(stack, lanes, groups, stats, epoch, ctx)
    recs = _records(stack, lanes, keys, host, extra, epoch, lr, ctx.writer.drain)
    _update_best(ctx, lanes, recs, host, extra, best, epoch)
    share = (time.perf_counter() - t0) / max(len(recs), 1)
    for m, rec in recs.items():
        mb = lanes[m]
        rec["seconds"] = share
        mb.final = {k: v for k, v in rec.items() if isinstance(v, float) and k != "seconds"}
        if mb.tb is not None and mb.run.env.is_main:
            mb.tb.log_epoch(rec)
    job = _epoch_job(ctx, stack, lanes, recs, epoch)
    if job is not None:
        ctx.writer.submit(job)
    if bar is not None and len(recs) == 1 and len(lanes) == 1:
        # percent, as every number the command line prints (the log keeps fractions)
        rec = next(iter(recs.values()))
        bar.set_postfix(val_ece=f"{100 * rec['val_ece']:.2f}%",
                        val_err=f"{100 * rec['val_error']:.2f}%", refresh=False)


def _stop_failed(stack: Stack, ctx: EpochEnd, lanes: list[Lane]) -> None:
    """Stop the lanes whose files failed in the writer (an error of a lane alone is
    raised)."""
    for mb, exc in ctx.writer.failures():
        if not mb.ghost:
            stack.policy.stop(mb, exc)


class _Files:
    """One lane's files of an epoch: its log record, ``best.pt`` and staged checkpoint
    (None: not written this epoch), the states' tensors as rows of the host copy."""

    def __init__(self, mb: Lane, rec: dict[str, Any]) -> None:
        self.mb, self.rec = mb, rec
        self.best: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None


def _epoch_job(ctx: EpochEnd, stack: Stack, lanes: list[Lane],
               recs: dict[int, dict[str, Any]], epoch: int) -> EpochJob | None:
    """The epoch's files of every live lane (rank 0), with the host copy they need: one
    copy per stacked tensor (this epoch's, and the best stacks' when a ``best.pt`` of an
    earlier epoch is due), taken here, before the next epoch's steps change them."""
    files = [_Files(lanes[m], rec) for m, rec in recs.items() if lanes[m].run.env.is_main]
    if not files:
        return None
    rows = ctx.rows
    writers = [str(lanes[m].run.config.out_dir) for m in recs]
    layout = [str(mb.run.config.out_dir) for mb in lanes]
    rng = None
    for f in files:
        r = f.mb.run
        if (epoch + 1) % r.config.checkpoint_every and epoch + 1 != r.config.epochs:
            continue
        rng = rng if rng is not None else rng_state_tensors()
        meta = {"num_classes": r.num_classes, "input_shape": r.input_shape,
                "config": r.config.to_dict(), "best": dict(r.best)}
        meta.update(stack.policy.checkpoint_meta(layout, lanes.index(f.mb), writers))
        if r.best_snapshot is not None:
            if int(r.best["epoch"]) == epoch + 1:  # this epoch's weights: the current rows
                for row in rows_of(r.best_snapshot):
                    row.src = "cur"
            f.best = {**r.best_snapshot, **meta, "epoch": int(r.best["epoch"]), "rng": rng}
            r.best_snapshot = None  # handed over: the next best.pt waits for a better epoch
        f.last = {**rows.capture(_state(r, full=True)), **meta, "epoch": epoch + 1, "rng": rng}
    used = [row for f in files for st in (f.best, f.last) for row in rows_of(st)]
    host = {"cur": rows.host(rows.stacks, {row.key for row in used if row.src == "cur"}),
            "best": rows.host(ctx.best.stacks or {} if ctx.best is not None else {},
                              {row.key for row in used if row.src == "best"})}
    event = None
    if any(t.is_cuda for t in rows.stacks.values()):
        event = torch.cuda.Event()
        event.record()
    return EpochJob(epoch, lambda: _write_files(ctx, files, host, event))


def _write_files(ctx: EpochEnd, files: list[_Files], host: dict[str, Any], event: Any
                 ) -> list[tuple[Lane, BaseException]]:
    """Write an epoch's files (the writer thread): each lane's log line, ``best.pt`` and
    staged checkpoint, then the staged checkpoints committed together (a lane whose files
    fail is returned with its error; the others go on)."""
    if event is not None:
        event.synchronize()  # the host copy has arrived
    failed: list[tuple[Lane, BaseException]] = []
    staged = []
    for f in files:
        r = f.mb.run
        if str(r.config.out_dir) in ctx.failed:
            continue
        try:
            r.dir.append_log(f.rec, fsync=False)  # fsynced with the next checkpoint
            if f.best is not None:
                save_checkpoint(r.dir.checkpoint("best"), resolve(f.best, host))
            if f.last is not None:
                stage_checkpoint(r.dir.path, resolve(f.last, host))
                staged.append(f)
        except Exception as exc:  # noqa: BLE001 - this lane stops, the pack goes on
            ctx.failed.add(str(r.config.out_dir))
            failed.append((f.mb, exc))
    for f in staged:
        try:
            commit_staged([f.mb.run.config.out_dir])
        except Exception as exc:  # noqa: BLE001
            ctx.failed.add(str(f.mb.run.config.out_dir))
            failed.append((f.mb, exc))
    return failed


# ------------------------------------------------------------------------------------------
# a stack: train, then evaluate
# ------------------------------------------------------------------------------------------
def fit_stack(stack: Stack, lanes: list[Lane], epochs: int, bar: Any = None,
              writer: EpochWriter | None = None) -> None:
    """Train the lanes (at the same epoch; in a pack, ghosts in the places of absent runs)
    to ``epochs``; a packed lane that stops becomes a ghost, the pack keeps its size.
    The epochs' files go to ``writer`` (None: written at the end of each epoch); the caller
    closes it, and stops the lanes whose files failed in its last epochs."""
    r0 = lanes[0].run
    groups = LossGroups([mb.run.loss_fn for mb in lanes], r0.device)
    batches = Batches(lanes)
    compiled = make_compiled_step(stack, groups, batches, r0.config.compile_step,
                                  r0.config.grad_clip, r0.amp)
    ctx = EpochEnd(stack, lanes, groups, writer)
    for epoch in range(lanes[0].run.start_epoch, epochs):
        running = live(lanes)
        if not running:
            return
        t0 = time.perf_counter()
        lr = running[0].run.optimizer.param_groups[0]["lr"]
        stats = train_epoch(stack, lanes, groups, batches, epoch, bar, compiled)
        end_epoch(stack, lanes, groups, stats, epoch, lr, t0, bar, ctx)


def _ood_sets(lanes: list[Lane]) -> list[dict[str, Any]]:
    """Each lane's OOD sets (loaded before training, so that a missing set fails at once; one
    load for lanes that share their data)."""
    shared: dict[str, Any] | None = None
    one_data = shares_data([mb.run for mb in lanes])
    out = []
    for mb in lanes:
        cfg = mb.run.config
        if mb.ghost or not cfg.evaluate:
            out.append({})
        elif one_data:
            shared = shared if shared is not None else load_ood_sets(cfg, mb.run.splits)
            out.append(shared)
        else:
            out.append(load_ood_sets(cfg, mb.run.splits))
    return out


def final_results(stack: Stack, lanes: list[Lane], oods: list[dict[str, Any]]
                  ) -> dict[int, dict[str, Any] | None]:
    """Each live lane's final evaluation (``oods``: each lane's OOD sets), as the stack's
    policy does it (:meth:`LanePolicy.final_results
    <torchcal.train.stacks.LanePolicy.final_results>`): one pass of a pack whose lanes
    share their data, else each run's own."""
    return stack.policy.final_results(stack, lanes, oods)


def _summary(mb: Lane, results: dict[str, Any] | None) -> dict[str, Any]:
    r = mb.run
    return {"run_dir": str(r.dir.path), "epochs": max(r.config.epochs, r.start_epoch),
            "resumed_from": r.start_epoch, "final": mb.final, "best": r.best,
            "results": results, "world_size": r.env.world_size}


@contextlib.contextmanager
def _writing():
    """An :class:`EpochWriter` thread, drained and joined on the way out: at the end, and on
    an exception (Ctrl-C included: the epochs already handed over are written, so a run stops
    at its last finished epoch's checkpoint).  The writer's own error is raised; one that
    comes while another exception is on its way is added to that exception's notes."""
    writer = EpochWriter()
    try:
        yield writer
    except BaseException as exc:
        try:
            writer.close()
        except BaseException as late:  # noqa: BLE001 - the first error goes on, this one noted
            exc.add_note(f"and the epoch writer failed: {type(late).__name__}: {late}")
        raise
    writer.close()


def run_stack(stack: Stack, lanes: list[Lane], results: list[Any]) -> None:
    """Train one stack to its epochs (when it has any left), evaluate it, fill ``results``
    (each lane's summary, or the error that stopped it; a run alone raises it: the stack's
    :meth:`LanePolicy.stop <torchcal.train.stacks.LanePolicy.stop>`)."""
    r0, policy = lanes[0].run, stack.policy
    oods = _ood_sets(lanes)
    with contextlib.ExitStack() as ctx:
        for mb in live(lanes):
            mb.tb = ctx.enter_context(tensorboard_logger(mb.run))
        if r0.start_epoch < r0.config.epochs:
            bar = ctx.enter_context(progress_bar(r0, len(lanes)))
            with _writing() as writer:
                fit_stack(stack, lanes, r0.config.epochs, bar, writer)
            for mb, exc in writer.failures():  # the last epochs' files
                if not mb.ghost:
                    policy.stop(mb, exc)
    evaluated = [mb for mb in live(lanes) if mb.index >= 0]
    try:
        done = final_results(stack, lanes, oods)
    except Exception as exc:  # noqa: BLE001 - reported in every lane's place
        done = {}
        for mb in evaluated:
            policy.stop(mb, exc)
    for m, mb in enumerate(lanes):
        if mb.index >= 0:
            results[mb.index] = mb.error or _summary(mb, done.get(m))
