"""Packed training: several runs that share a model and a recipe trained as one packed model.

A benchmark trains the same network many times (the seeds of a loss, and several losses).  One
small network leaves most of a GPU idle and pays Python's and the kernels' fixed costs once per
step; :func:`train_packed` trains M such runs ("members") together: their parameters are stacked
along a leading member dimension and the M forward and backward passes run as one batched pass
(``torch.func.vmap`` over ``functional_call``, chosen by measurement,
``benchmarks/results/packing.md``).

Each member is a run in every other respect, built by the trainer's own pieces
(:mod:`torchcal.train.trainer`): its initialisation and data order come from its seed (the same
weights and batches as ``train(config)`` with that seed), it has its own loss object (AdaFocal's
per-bin γ, a temperature-aware loss' T), its own gradient-norm clipping, its own SGD state (one
SGD over the stacked parameters equals M separate SGDs: every operation of SGD with momentum,
weight decay and Nesterov is elementwise; the members share the learning-rate schedule), its own
validation pass, log, checkpoints, run directory (the format of :mod:`torchcal.runs`) and final
evaluation.  Each member's ``nn.Module`` holds views of its slice of the stacked tensors, so the
trainer's per-run helpers (evaluation, checkpointing) read the packed values without copies.

Resume works per member: members whose checkpoints are at the same epoch are packed together.
A member whose training loss becomes non-finite stops alone with
:class:`MemberDivergedError` at the end of that epoch (the members' computations never mix, so a
non-finite member leaves the others' numbers unchanged); an error of one member's loss or
evaluation stops that member only.  Ctrl-C stops every member at its last checkpoint, as it
stops a run.

No host synchronisation is added per step: the members' losses, statistics and gradient norms
stay on the device until the end of the epoch, as in :func:`~torchcal.train.train`.

Not packable (:func:`pack_problem` says why; such runs train with :func:`~torchcal.train.train`):
the joint uncertainty head, ``compile``, fp16 AMP (one loss scaler would couple the members),
TensorBoard logging, ``torchrun`` (DDP), and models with dropout (one random stream for every
member).  A member's log line counts in ``seconds`` its share of the pack's training and
validation time plus its own evaluation and checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from .._io import exclusive_lock
from ..errors import TorchcalError
from ..losses.base import loss_log_state, loss_on_validation, loss_set_epoch, loss_wants_validation
from ..metrics.binning import calibration_from_sums
from ..metrics.epoch import (
    DIAGNOSTIC_KEYS,
    EPOCH_KEYS,
    stacked_binned_sums,
    stacked_epoch_metrics,
)
from ..runs import LOSS_STATE_KEY, RunDir
from .build import _data_seed
from .checkpoint import rng_state_tensors, save_checkpoint
from .config import TrainConfig
from .device import _autocast
from .distributed import DistEnv, epoch_permutation, epoch_seed
from .evaluation import write_predictions
from .inference import predict_logits
from .loss_groups import LossGroups
from .pack_commit import commit_staged, ghost_run, pack_layout, reconcile_staged, stage_checkpoint
from .trainer import (
    _build,
    _build_sources,
    _device_and_amp,
    _final_evaluation,
    _finished_run_numbers,
    _resume_state,
    _Run,
    _snapshot,
    _train_batches,
    _update_best,
    _update_every,
    build_loss,
    load_ood_sets,
    train,
)

__all__ = ["train_packed", "pack_groups", "pack_problem", "MemberDivergedError", "FORWARDS"]

#: How a pack runs its members' model: ``"vmap"`` (one batched forward and backward: a GPU's
#: way, whose kernel launches do not grow with the members), ``"loop"`` (each member's forward on
#: its slices of the stacked parameters, with the kernels of a separate run: faster on a CPU,
#: whose grouped convolutions are slow), ``"auto"`` (``"loop"`` on the CPU, else ``"vmap"``).
#: Losses, statistics, clipping and SGD are shared either way.
FORWARDS = ("auto", "vmap", "loop")

#: TrainConfig fields in which the members of one pack may differ.
MEMBER_FIELDS = frozenset({"seed", "loss", "loss_kwargs", "loss_defaults", "reduction", "out_dir",
                           "resume", "progress", "num_threads"})


class MemberDivergedError(TorchcalError, FloatingPointError):
    """A packed member's training loss became non-finite; the member stopped, the others go on."""


def pack_problem(config: TrainConfig) -> str | None:
    """Why ``config`` cannot train in a pack (None: it can)."""
    if config.uncertainty_head:
        return "the joint uncertainty head is not packed"
    if config.compile:
        return "compile=True is not packed"
    if config.amp == "fp16":
        return "fp16 AMP's loss scaler would couple the members"
    if config.tensorboard:
        return "TensorBoard logging is not packed"
    return None


def _pack_key(config: TrainConfig) -> str:
    d = config.to_dict()
    d["milestones"] = config.effective_milestones()
    return repr(sorted((k, repr(v)) for k, v in d.items() if k not in MEMBER_FIELDS))


def pack_groups(configs: Sequence[TrainConfig], max_members: int | None = None
                ) -> list[list[int]]:
    """Indices of ``configs`` grouped into packs: configs that differ only in
    :data:`MEMBER_FIELDS` (seed, loss, ...), at most ``max_members`` per pack, in the order
    given; an unpackable config (:func:`pack_problem`) is a pack of one."""
    if max_members is not None and (not isinstance(max_members, int) or max_members < 1):
        raise ValueError(f"Expected `max_members` to be a positive integer, got {max_members!r}")
    groups: dict[str, list[list[int]]] = {}
    order: list[list[int]] = []
    for i, cfg in enumerate(configs):
        key = _pack_key(cfg) if pack_problem(cfg) is None else f"alone {i}"
        packs = groups.setdefault(key, [])
        if not packs or (max_members is not None and len(packs[-1]) >= max_members):
            packs.append([])
            order.append(packs[-1])
        packs[-1].append(i)
    return order


# ------------------------------------------------------------------------------------------
# the packed model and optimiser
# ------------------------------------------------------------------------------------------
def _bind(model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
          m: int) -> None:
    """Make ``model``'s parameters and buffers views of slice ``m`` of the stacked tensors."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = params[name][m]
    for name, _ in list(model.named_buffers()):
        mod, _, leaf = name.rpartition(".")
        model.get_submodule(mod)._buffers[leaf] = buffers[name][m]


class _Pack:
    """The members' parameters and buffers stacked (leading member dimension), the forward
    pass of all members at once, per-member gradient clipping, and one SGD over the stacks.

    ``models[m]`` and ``optimizers[m]`` (an SGD over ``models[m]``'s parameters, never stepped
    itself) hold views of slice ``m`` afterwards.
    """

    def __init__(self, models: list[nn.Module], optimizers: list[torch.optim.SGD],
                 forward: str = "vmap") -> None:
        if forward not in FORWARDS:
            raise ValueError(f"Expected `forward` to be one of {FORWARDS}, got {forward!r}")
        self.models, self.optimizers = models, optimizers
        self.base = models[0]
        self.mode = forward
        params, buffers = stack_module_state(models)
        self.params, self.buffers = params, buffers
        group = optimizers[0].param_groups[0]
        self.opt = torch.optim.SGD(list(params.values()), lr=group["lr"],
                                   momentum=group["momentum"], dampening=group["dampening"],
                                   weight_decay=group["weight_decay"], nesterov=group["nesterov"])
        for m, (model, opt) in enumerate(zip(models, optimizers, strict=True)):
            _bind(model, params, buffers, m)
            opt._opt_called = True  # stepped through the pack (no scheduler warning)
        if group["momentum"]:
            self._stack_momentum()

    def _stack_momentum(self) -> None:
        """The stacked momentum buffers from the members' SGD states (zeros for a new run:
        SGD's first step then gives ``buf = grad`` exactly as an empty buffer does), and the
        members' states made views of them."""
        member_params = [list(model.parameters()) for model in self.models]
        for j, p in enumerate(self.params.values()):
            bufs = []
            for opt, mp in zip(self.optimizers, member_params, strict=True):
                b = opt.state.get(mp[j], {}).get("momentum_buffer")
                bufs.append(torch.zeros_like(p[0]) if b is None else b.to(p.device))
            stacked = torch.stack(bufs)
            self.opt.state[p]["momentum_buffer"] = stacked
            for m, (opt, mp) in enumerate(zip(self.optimizers, member_params, strict=True)):
                opt.state[mp[j]]["momentum_buffer"] = stacked[m]

    def _call(self, params, buffers, x):
        return functional_call(self.base, (params, buffers), (x,))

    def _members(self, xs) -> list[torch.Tensor]:
        """Each member's forward on its slices of the stacked tensors, with the very kernels of
        a separate run.  The slices come from one ``unbind`` per tensor, whose backward stacks
        the members' gradients in one operation (indexing each member would add a zero-filled
        full-size gradient per member and tensor)."""
        params = {k: v.unbind(0) for k, v in self.params.items()}
        buffers = {k: v.unbind(0) for k, v in self.buffers.items()}
        return [self._call({k: v[m] for k, v in params.items()},
                           {k: v[m] for k, v in buffers.items()}, x) for m, x in enumerate(xs)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (M, B, C) of inputs (M, B, ...): member ``m`` sees ``x[m]``."""
        if self.mode == "loop":
            return torch.stack(self._members(x.unbind(0)))
        return vmap(self._call, randomness="error")(self.params, self.buffers, x)

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, M, C) of every member on the same inputs (B, ...)."""
        if self.mode == "loop":
            return torch.stack(self._members([x] * len(self.models)), 1)
        return vmap(self._call, in_dims=(0, 0, None), out_dims=1,
                    randomness="error")(self.params, self.buffers, x)

    def train(self, mode: bool = True) -> None:
        for model in self.models:
            model.train(mode)

    def set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    def step(self, total: torch.Tensor, max_norm: float | None) -> None:
        """Backward, each member's gradient clipped by its own norm, one SGD step.

        The clipping is ``clip_grad_norm_``'s computation for every member at once: the norm of
        each parameter tensor's row of each member (the very reduction ``_foreach_norm`` runs on
        one member's tensor), the norm of those norms, ``max_norm / (norm + 1e-6)`` clamped at
        1, one ``_foreach_mul_``: a number of operations that grows with the parameter tensors,
        not with the members."""
        self.opt.zero_grad(set_to_none=True)
        total.backward()
        if max_norm is not None:
            grads = [p.grad for p in self.params.values() if p.grad is not None]
            n = len(self.models)
            norms = torch.stack([torch.linalg.vector_norm(g.reshape(n, -1), 2.0, dim=1)
                                 for g in grads])
            coef = (max_norm / (torch.linalg.vector_norm(norms, 2.0, dim=0) + 1e-6)).clamp(
                max=1.0)
            views = {d: coef.view(n, *([1] * (d - 1))) for d in {g.dim() for g in grads}}
            torch._foreach_mul_(grads, [views[g.dim()].to(g.dtype) for g in grads])
        self.opt.step()

    @torch.no_grad()
    def finite(self) -> torch.Tensor:
        """(M,) bool: every parameter of member ``m`` is finite (one op per parameter tensor,
        whatever M)."""
        n = len(self.models)
        flags = [torch.isfinite(p).reshape(n, -1).all(1) for p in self.params.values()]
        return torch.stack(flags).all(0)

    @torch.no_grad()
    def fc_norms(self) -> torch.Tensor | None:
        """(M,) norms of each member's ``fc.weight`` (what a run logs), None without one."""
        w = self.params.get("fc.weight")
        return None if w is None else w.float().reshape(len(self.models), -1).norm(dim=1)


class _SharedInput(nn.Module):
    """A pack as a module for :func:`~torchcal.train.inference.predict_logits`: ``forward(x)``
    gives every member's logits (B, M, C) on the same batch; ``eval()`` reaches the members."""

    def __init__(self, pack: _Pack) -> None:
        super().__init__()
        self.pack = pack

    def train(self, mode: bool = True):
        self.training = mode
        self.pack.train(mode)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pack.forward_shared(x)


class _PackedStats:
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

    def numbers(self) -> torch.Tensor:
        """(M, 4) float64 on the device: loss, nll, error, ece (NaN before any batch)."""
        s = self.scalars
        n = torch.where(s[:, 3] > 0, s[:, 3], torch.full_like(s[:, 3], float("nan")))
        return torch.stack([s[:, 0] / n, s[:, 1] / n, 1.0 - s[:, 2] / n,
                            calibration_from_sums(self.bins, "l1")], 1)


# ------------------------------------------------------------------------------------------
# members, data
# ------------------------------------------------------------------------------------------
class _Member:
    """One slot of a pack: its :class:`~torchcal.train.trainer._Run`, its last epoch's
    numbers and, once it stopped alone, its error.  A *ghost* (a member that stopped, or a slot
    whose run does not resume with this pack) is computed with the others but writes nothing."""

    def __init__(self, index: int, r: _Run, ghost: bool = False) -> None:
        self.index, self.r, self.ghost = index, r, ghost
        self.final: dict[str, float] = {} if ghost else _finished_run_numbers(r)
        self.error: BaseException | None = None
        self.every = _update_every(r.loss_fn)

    def stop(self, error: BaseException) -> None:
        """Stop this member alone: it stays in its slot as a ghost."""
        self.error, self.ghost = error, True


def _live(members: list[_Member]) -> list[_Member]:
    return [mb for mb in members if not mb.ghost]


class _Batches:
    """The members' training batches, stacked (M, B, ...): one gather per step from the shared
    data on the device (each member its own order, from its seed); per member when the members'
    data differ or augmentation draws per member."""

    def __init__(self, members: list[_Member]) -> None:
        r0 = members[0].r
        self.src = r0.src["train"]
        augment = bool(getattr(r0.splits, "augment", False))
        self.shared = (self.src.array and not augment
                       and all(mb.r.src["train"] is self.src for mb in members))
        self.bs = r0.local_bs

    def epoch(self, members: list[_Member], epoch: int):
        if not self.shared:
            for batch in zip(*[_train_batches(mb.r, epoch) for mb in members], strict=True):
                yield torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch])
            return
        n = self.src.n
        perms = torch.stack([epoch_permutation(n, mb.r.config.seed, epoch) for mb in members])
        perms = perms.to(self.src.device)
        stop = n - 1 if (n % self.bs == 1 and n > 1) else n  # a lone last sample is dropped
        for s in range(0, stop, self.bs):
            yield self.src.take(perms[:, s:min(s + self.bs, stop)])


# ------------------------------------------------------------------------------------------
# one epoch
# ------------------------------------------------------------------------------------------
def _train_epoch(pack: _Pack, members: list[_Member], groups: LossGroups, batches: _Batches,
                 epoch: int, bar: Any) -> _PackedStats:
    """One epoch of every member's batches (each member its own data order), stepped as one."""
    r0, live = members[0].r, _live(members)
    for mb in members:
        loss_set_epoch(mb.r.loss_fn, epoch)
    groups.refresh()
    # the global stream (used by nothing of a dropout-free model) follows the first slot
    torch.manual_seed(epoch_seed(r0.config.seed, epoch, stream=3))
    pack.train()
    pack.set_lr(live[0].r.optimizer.param_groups[0]["lr"])
    stats = _PackedStats(len(members), r0.config.n_bins, r0.device)
    mean_rows = torch.tensor([red == "mean" for red in groups.reductions()], device=r0.device)
    stateful = [mb for mb in live if mb.every]  # losses with extra validation passes
    for step, (x, y) in enumerate(batches.epoch(members, epoch)):
        with _autocast(r0.device, r0.amp):
            logits = pack.forward(x)
        logits = logits.float()
        loss = groups(logits, y)
        sums = loss.detach()
        stats.update(logits, y, torch.where(mean_rows, sums * y.shape[1], sums))
        pack.step(loss.sum(), r0.config.grad_clip)
        if bar is not None:
            bar.update(1)
        extra = [mb for mb in stateful if (step + 1) % mb.every == 0] if stateful else None
        if extra:  # a stateful loss' extra update (AdaFocal & co.)
            _drive_validation(pack, members, extra)
            groups.refresh()
            pack.train()
    return stats


def _validation_logits(pack: _Pack, members: list[_Member], split: str = "val"
                       ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every member's logits (N, M, C) on ``split`` and the labels, in one packed pass; None
    when the members' data differ (a split that follows the seed)."""
    src = members[0].r.src[split]
    if any(mb.r.src[split] is not src for mb in members):
        return None
    r0 = members[0].r
    return predict_logits(_SharedInput(pack), None, r0.device, r0.eval_bs, source=src,
                          amp=r0.amp)


def _drive_validation(pack: _Pack, members: list[_Member], which: list[_Member]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation logits (N, M, C) and labels of every member; the loss hooks of ``which``
    driven with their own columns (an error stops that member alone)."""
    val = _split_logits(pack, members, "val")
    for mb in which:
        m = members.index(mb)
        y = val[1] if val[1].ndim == 1 else val[1][:, m]
        try:
            loss_on_validation(mb.r.loss_fn, logits=val[0][:, m].contiguous(), labels=y)
        except Exception as exc:  # noqa: BLE001 - this member stops, the pack goes on
            mb.stop(exc)
    return val


def _split_loss(groups: LossGroups, z: torch.Tensor, y: torch.Tensor, chunk: int,
                mean_rows: torch.Tensor) -> torch.Tensor:
    """(M,) mean per-sample loss of every member over a split (``z`` (N, M, C)), in chunks of
    ``chunk`` samples (O(chunk) memory for MMCE), as the trainer's ``_chunked_loss``."""
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
    loss = _split_loss(groups, z, y, chunk, mean_rows).double()
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


def _split_logits(pack: _Pack, members: list[_Member], split: str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, M, C) logits and the labels of ``split`` (one packed pass, or one per member when
    the members' data differ)."""
    out = _validation_logits(pack, members, split)
    if out is not None:
        return out
    outs = [predict_logits(mb.r.model, None, mb.r.device, mb.r.eval_bs, source=mb.r.src[split],
                           amp=mb.r.amp) for mb in members]
    return torch.stack([o[0] for o in outs], 1), torch.stack([o[1] for o in outs], 1)


def _epoch_table(pack: _Pack, members: list[_Member], groups: LossGroups, stats: _PackedStats,
                 epoch: int) -> tuple[list[str], Any, bool]:
    """The epoch's numbers of every slot as one host array (M, K): training statistics,
    validation metrics and loss (after the loss hooks ran on the validation logits), the test
    split's when due, then "all parameters finite" and the ``fc`` weight norm."""
    r0 = members[0].r
    val = _drive_validation(pack, members, [mb for mb in _live(members)
                                            if loss_wants_validation(mb.r.loss_fn)])
    groups.refresh()
    mean_rows = torch.tensor([red == "mean" for red in groups.reductions()], device=r0.device)
    chunk = max(r0.local_bs, 1024)  # chunks of the logged loss (MMCE is O(chunk^2))
    every = r0.config.eval_test_every
    test = bool(every and ((epoch + 1) % every == 0 or epoch + 1 == r0.config.epochs))
    cols = [stats.numbers(), _split_numbers(groups, val, r0.config.n_bins, chunk, mean_rows,
                                            False)]
    if test:
        cols.append(_split_numbers(groups, _split_logits(pack, members, "test"),
                                   r0.config.n_bins, chunk, mean_rows, True))
    cols.append(pack.finite().double()[:, None])
    fc = pack.fc_norms()
    if fc is not None:
        cols.append(fc.double()[:, None])
    host = torch.cat(cols, 1).cpu().numpy()  # the epoch's one device-to-host copy
    return _epoch_keys(test), host, fc is not None


def _diverged(mb: _Member, epoch: int, rec: dict[str, Any], finite: bool) -> MemberDivergedError:
    what = " and ".join(w for w, bad in (("training loss", not math.isfinite(rec["train_loss"])),
                                         ("parameters", not finite)) if bad)
    return MemberDivergedError(
        f"Run {str(mb.r.run.path)!r} diverged in epoch {epoch + 1}: {what} "
        f"{rec['train_loss'] if 'loss' in what else 'not finite'}; it stops at its last "
        "checkpoint, the other packed runs go on")


def _end_pack_epoch(pack: _Pack, members: list[_Member], groups: LossGroups,
                    stats: _PackedStats, epoch: int, lr: float, t0: float) -> None:
    """The trainer's end of an epoch for every slot at once: schedules, the loss hooks, the
    numbers (one host copy), then for each live member its divergence check, log line, best
    epoch and staged checkpoint; the staged checkpoints are committed together."""
    for mb in members:
        mb.r.scheduler.step()
    keys, host, has_fc = _epoch_table(pack, members, groups, stats, epoch)
    k = len(keys)
    recs: dict[int, dict[str, Any]] = {}
    for m, mb in enumerate(members):
        if mb.ghost:
            continue
        rec = {"epoch": epoch + 1, "lr": lr, **dict(zip(keys, host[m, :k].tolist(), strict=True))}
        if not (math.isfinite(rec["train_loss"]) and host[m, k] == 1.0):
            mb.stop(_diverged(mb, epoch, rec, host[m, k] == 1.0))
            continue
        rec["fc_weight_norm"] = float(host[m, k + 1]) if has_fc else None
        state = loss_log_state(mb.r.loss_fn)
        if state:
            rec[LOSS_STATE_KEY] = state
        recs[m] = rec
    share = (time.perf_counter() - t0) / max(len(recs), 1)
    writers = [str(members[m].r.config.out_dir) for m in recs]
    layout = [str(mb.r.config.out_dir) for mb in members]
    staged = []
    for m, rec in recs.items():
        mb = members[m]
        rec["seconds"] = share
        try:
            if _record_member(mb, rec, epoch, {"slots": layout, "slot": m, "writers": writers}):
                staged.append(mb)
        except Exception as exc:  # noqa: BLE001 - this member stops, the pack goes on
            mb.stop(exc)
    for mb in staged:
        try:
            commit_staged([mb.r.config.out_dir])
        except Exception as exc:  # noqa: BLE001
            mb.stop(exc)


def _record_member(mb: _Member, rec: dict[str, Any], epoch: int, pack_meta: dict[str, Any]
                   ) -> bool:
    """One live member's log line, best epoch and (when due) staged checkpoint, as the
    trainer's ``_end_epoch`` writes them.  True when a checkpoint was staged."""
    r = mb.r
    _update_best(r, rec, epoch)
    r.run.append_log(rec, fsync=False)  # fsynced with the next checkpoint
    mb.final = {k: v for k, v in rec.items() if isinstance(v, float) and k != "seconds"}
    if (epoch + 1) % r.config.checkpoint_every and epoch + 1 != r.config.epochs:
        return False
    extra = {"num_classes": r.num_classes, "input_shape": r.input_shape,
             "config": r.config.to_dict(), "best": dict(r.best), "pack": pack_meta}
    if r.best_snapshot is not None:
        save_checkpoint(r.run.checkpoint("best"), {**r.best_snapshot, **extra,
                                                   "epoch": int(r.best["epoch"]),
                                                   "rng": rng_state_tensors()})
        r.best_snapshot = None
    stage_checkpoint(r.run.path, {**_snapshot(r, full=True), **extra, "epoch": epoch + 1,
                                  "rng": rng_state_tensors()})
    return True


# ------------------------------------------------------------------------------------------
# a pack: train, then evaluate
# ------------------------------------------------------------------------------------------
def _fit_pack(pack: _Pack, members: list[_Member], epochs: int, bar: Any) -> None:
    """Train the slots (members at the same epoch, ghosts in the slots of absent runs) to
    ``epochs``; a member that stops becomes a ghost, the pack keeps its size."""
    groups = LossGroups([mb.r.loss_fn for mb in members], members[0].r.device)
    batches = _Batches(members)
    for epoch in range(members[0].r.start_epoch, epochs):
        live = _live(members)
        if not live:
            return
        t0 = time.perf_counter()
        lr = live[0].r.optimizer.param_groups[0]["lr"]
        stats = _train_epoch(pack, members, groups, batches, epoch, bar)
        _end_pack_epoch(pack, members, groups, stats, epoch, lr, t0)


def _evaluate_pack(pack: _Pack, members: list[_Member], ood_sets: dict[str, Any]
                   ) -> dict[int, dict[str, Any]]:
    """The final evaluation of every live member with ``evaluate``: one packed forward over
    the validation, test and OOD sets; each member's logits and results written as a run's."""
    live = [mb for mb in _live(members) if mb.r.config.evaluate]
    if not live:
        return {}
    r0 = members[0].r
    preds = {s: _split_logits(pack, members, s) for s in ("val", "test")}
    mean, std = getattr(r0.splits, "mean", None), getattr(r0.splits, "std", None)
    for name, ds in ood_sets.items():
        preds[f"ood_{name}"] = predict_logits(_SharedInput(pack), ds, r0.device, r0.eval_bs,
                                              mean=mean, std=std, amp=r0.amp)
    out = {}
    for mb in live:
        m, cfg = members.index(mb), mb.r.config
        own = {k: (z[:, m].contiguous(), y if y.ndim == 1 else y[:, m]) for k, (z, y) in
               preds.items()}
        epochs = max(cfg.epochs, mb.r.start_epoch)
        out[m] = write_predictions(own, mb.r.run.path, cfg, epoch=epochs, checkpoint="last")
    return out


def _summary(mb: _Member, results: dict[str, Any] | None) -> dict[str, Any]:
    r = mb.r
    return {"run_dir": str(r.run.path), "epochs": max(r.config.epochs, r.start_epoch),
            "resumed_from": r.start_epoch, "final": mb.final, "best": r.best,
            "results": results, "world_size": 1}


def _has_dropout(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def _open_members(configs: Sequence[TrainConfig], group: list[int], stack: contextlib.ExitStack,
                  results: list[Any]) -> list[tuple[_Member, tuple[str, ...] | None]]:
    """Lock, check and build each member of ``group`` as :func:`~torchcal.train.train` does
    (finishing or dropping a killed pack's staged checkpoints first, then resuming its
    checkpoint), with the pack layout its checkpoint records; a member that fails here gets its
    error in ``results``."""
    env, locked, opened, data = DistEnv(), [], [], {}
    for i in group:
        try:
            configs[i].validate()
            stack.enter_context(exclusive_lock(configs[i].out_dir))
            locked.append(i)
        except Exception as exc:  # noqa: BLE001 - this member fails, the pack goes on
            results[i] = exc
    reconcile_staged([configs[i].out_dir for i in locked])
    for i in locked:
        cfg = configs[i]
        try:
            state = _resume_state(cfg, env)
            key = _data_seed(cfg)  # the split (digits: and noise) may follow the run's seed
            if key not in data:
                data[key] = _build_sources(cfg, _device_and_amp(cfg, env)[0])
            r = _build(cfg, env, state, data=data[key])
            if _has_dropout(r.model):
                raise ValueError(f"Run {cfg.out_dir!r}: model {cfg.model!r} has dropout, which a "
                                 "pack cannot draw per member; train it with train()")
        except Exception as exc:  # noqa: BLE001 - this member fails, the pack goes on
            results[i] = exc
            continue
        opened.append((_Member(i, r), pack_layout(state)))
    return opened


def _slot_config(out_dir: str, configs: Sequence[TrainConfig]) -> TrainConfig | None:
    """The config of the run in slot ``out_dir``: the one passed, else its ``config.json``."""
    for c in configs:
        if str(c.out_dir) == out_dir:
            return c
    try:
        return TrainConfig.from_dict(RunDir(out_dir).read_config())
    except (OSError, ValueError, TypeError):
        return None


def _packs(opened: list[tuple[_Member, tuple[str, ...] | None]], configs: Sequence[TrainConfig],
           group: list[int]) -> list[list[_Member]]:
    """The packs to train: members at the same epoch with the same recorded layout, in their
    slots; a slot whose run does not resume here holds a ghost (a slot whose config cannot be
    read is left out)."""
    default = tuple(str(configs[i].out_dir) for i in group)
    by_key: dict[tuple[int, tuple[str, ...]], list[_Member]] = {}
    for mb, layout in opened:
        by_key.setdefault((mb.r.start_epoch, layout or default), []).append(mb)
    packs = []
    for (_, layout), mbs in sorted(by_key.items(), key=lambda kv: kv[0][0]):
        own = {str(mb.r.config.out_dir): mb for mb in mbs}
        slots: list[_Member] = []
        for d in layout:
            if d in own:
                slots.append(own.pop(d))
                continue
            cfg = _slot_config(d, configs)
            with contextlib.suppress(Exception):
                if cfg is not None:
                    slots.append(_Member(-1, ghost_run(mbs[0].r, cfg, build_loss), ghost=True))
        packs.append(slots + list(own.values()))
    return packs


def _run_pack(members: list[_Member], results: list[Any], forward: str) -> None:
    """Train one pack to its epochs (when it has any left), evaluate it, fill ``results``."""
    r0 = members[0].r
    if forward == "auto":
        forward = "loop" if r0.device.type == "cpu" else "vmap"
    pack = _Pack([mb.r.model for mb in members], [mb.r.optimizer for mb in members], forward)
    epochs = r0.config.epochs
    if r0.start_epoch < epochs:
        bar = None
        if r0.config.progress:
            bar = tqdm(total=(epochs - r0.start_epoch) * r0.n_batches,
                       desc=f"{r0.config.recipe or r0.config.dataset} x{len(members)} packed",
                       unit="batch", dynamic_ncols=True)
        try:
            _fit_pack(pack, members, epochs, bar)
        finally:
            if bar is not None:
                bar.close()
    live = [mb for mb in _live(members) if mb.index >= 0]
    try:
        evaluated = _final_results(pack, members)
    except Exception as exc:  # noqa: BLE001 - reported in every member's place
        for mb in live:
            results[mb.index] = exc
        return
    for m, mb in enumerate(members):
        if mb.index >= 0:
            results[mb.index] = mb.error or _summary(mb, evaluated.get(m))


def _final_results(pack: _Pack, members: list[_Member]) -> dict[int, dict[str, Any]]:
    """Each live member's final evaluation: packed when the members share their data."""
    r0 = members[0].r
    if all(mb.r.src["val"] is r0.src["val"] for mb in members):
        ood = load_ood_sets(r0.config, r0.splits) if r0.config.evaluate else {}
        return _evaluate_pack(pack, members, ood)
    out = {}
    for m, mb in enumerate(members):
        if not mb.ghost and mb.r.config.evaluate:
            ood = load_ood_sets(mb.r.config, mb.r.splits)
            out[m] = _final_evaluation(mb.r, ood, max(mb.r.config.epochs, mb.r.start_epoch))
    return out


def train_packed(configs: Sequence[TrainConfig], *, max_members: int | None = None,
                 forward: str = "auto") -> list[dict[str, Any] | BaseException]:
    """Train ``configs`` in packs (:func:`pack_groups`): one result per config, in order.

    Args:
        configs: the runs; those that differ only in :data:`MEMBER_FIELDS` (seed, loss, loss
            arguments, run directory, ...) train together.
        max_members: the most runs in one pack (None: no limit).
        forward: how the members' model runs (:data:`FORWARDS`): ``"auto"`` loops over the
            members on the CPU and vmaps them on a GPU.

    A pack of one (a run alone, or one :func:`pack_problem` refuses) is trained by
    :func:`~torchcal.train.train` itself.  Calling it again with the same configs resumes
    every member in the pack it trained in, from the epoch its companions resume from
    (:mod:`torchcal.train.pack_commit`), so a killed sweep ends with the numbers of an
    uninterrupted one.

    Returns:
        For each config, the summary :func:`~torchcal.train.train` returns, or the exception
        that stopped that run alone (:class:`MemberDivergedError`, ``CheckpointError``,
        ``InUseError``, a loss' error, ...).

    Raises:
        KeyboardInterrupt: every member keeps its last committed checkpoint (resume continues
            it).
        ValueError: under ``torchrun`` (packing is for one process).
    """
    configs = list(configs)
    if forward not in FORWARDS:
        raise ValueError(f"Expected `forward` to be one of {FORWARDS}, got {forward!r}")
    for c in configs:
        if not isinstance(c, TrainConfig):
            raise TypeError(f"Expected `configs` to hold TrainConfig, got {type(c).__name__}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("Packed training runs in one process; run torchrun with train()")
    results: list[Any] = [None] * len(configs)
    for group in pack_groups(configs, max_members):
        if len(group) == 1:  # alone (or not packable): the trainer itself
            try:
                results[group[0]] = train(configs[group[0]])
            except Exception as exc:  # noqa: BLE001 - reported in its place
                results[group[0]] = exc
            continue
        t0 = time.perf_counter()
        if configs[group[0]].num_threads is not None:
            torch.set_num_threads(int(configs[group[0]].num_threads))
        with contextlib.ExitStack() as stack:
            opened = _open_members(configs, group, stack, results)
            for members in _packs(opened, configs, group):
                _run_pack(members, results, forward)
        for i in group:
            if isinstance(results[i], dict):
                results[i]["seconds"] = (time.perf_counter() - t0) / len(group)
    return results
