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
from ..losses.base import loss_on_validation, loss_set_epoch
from ..metrics import equal_width_bin_index
from ..metrics.binning import binned_sums
from ..metrics.epoch import EpochStats
from .build import _data_seed
from .config import TrainConfig
from .device import _autocast
from .distributed import DistEnv, epoch_seed
from .inference import predict_logits
from .trainer import (
    _build,
    _build_sources,
    _device_and_amp,
    _end_epoch,
    _final_evaluation,
    _finished_run_numbers,
    _loss_reduction,
    _resume_state,
    _Run,
    _sample_sum,
    _train_batches,
    _update_every,
    _validation_pass,
    load_ood_sets,
    train,
)

__all__ = ["train_packed", "pack_groups", "pack_problem", "MemberDivergedError"]

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
    itself) hold views of slice ``m`` afterwards; a pack is rebuilt from them (on the
    survivors) when a member leaves.
    """

    def __init__(self, models: list[nn.Module], optimizers: list[torch.optim.SGD]) -> None:
        self.models, self.optimizers = models, optimizers
        self.base = models[0]
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (M, B, C) of inputs (M, B, ...): member ``m`` sees ``x[m]``."""
        return vmap(self._call, randomness="error")(self.params, self.buffers, x)

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, M, C) of every member on the same inputs (B, ...)."""
        return vmap(self._call, in_dims=(0, 0, None), out_dims=1,
                    randomness="error")(self.params, self.buffers, x)

    def train(self, mode: bool = True) -> None:
        for model in self.models:
            model.train(mode)

    def set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    def step(self, total: torch.Tensor, max_norm: float | None) -> None:
        """Backward, each member's gradient clipped by its own norm (``clip_grad_norm_``'s
        formula), one SGD step."""
        self.opt.zero_grad(set_to_none=True)
        total.backward()
        if max_norm is not None:
            grads = [p.grad for p in self.params.values() if p.grad is not None]
            n = len(self.models)
            sq = torch.stack([g.reshape(n, -1).float().pow(2).sum(1) for g in grads]).sum(0)
            coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
            for g in grads:
                g.mul_(coef.view(n, *([1] * (g.dim() - 1))).to(g.dtype))
        self.opt.step()


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
        logp = torch.log_softmax(logits.detach().float().reshape(n * b, -1), 1)
        conf, pred = logp.max(dim=1)  # as EpochStats.update
        correct = pred.eq(y.reshape(-1))
        conf = conf.exp()
        nll = -logp.gather(1, y.reshape(-1, 1)).reshape(n, b).sum(1)
        offset = torch.arange(n, device=y.device).repeat_interleave(b) * self.n_bins
        idx = equal_width_bin_index(conf, self.n_bins) + offset
        self.bins += binned_sums(idx, conf, correct, n * self.n_bins).reshape(3, n, self.n_bins)
        self.scalars += torch.stack([loss_sums.double(), nll.double(),
                                     correct.reshape(n, b).sum(1).double(),
                                     torch.full((n,), float(b), dtype=torch.float64,
                                                device=y.device)], 1)

    def compute(self, env: DistEnv) -> list[dict[str, float]]:
        """Each member's numbers, as :meth:`EpochStats.compute` gives them (one host copy)."""
        scalars, bins = self.scalars.cpu(), self.bins.cpu()
        out = []
        for m in range(self.n):
            s = EpochStats(self.n_bins, torch.device("cpu"))
            s.scalars, s.bins = scalars[m], bins[:, m]
            out.append(s.compute(sync_dist=env.enabled))
        return out


# ------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------
class _Member:
    """One run of a pack: its :class:`~torchcal.train.trainer._Run`, its last epoch's numbers
    and, once it stopped alone, its error."""

    def __init__(self, index: int, r: _Run) -> None:
        self.index, self.r = index, r
        self.final: dict[str, float] = _finished_run_numbers(r)
        self.error: BaseException | None = None
        self.reduction, self.every = _loss_reduction(r.loss_fn), _update_every(r.loss_fn)


def _pack_of(members: list[_Member]) -> _Pack:
    return _Pack([mb.r.model for mb in members], [mb.r.optimizer for mb in members])


def _member_loss(mb: _Member, logits: torch.Tensor, y: torch.Tensor):
    loss = mb.r.loss_fn(logits, y)
    return loss, _sample_sum(loss, y, mb.reduction)


def _train_epoch(pack: _Pack, members: list[_Member], epoch: int, bar: Any) -> _PackedStats:
    """One epoch of every member's batches (each member its own data order), stepped as one."""
    r0 = members[0].r
    for mb in members:
        loss_set_epoch(mb.r.loss_fn, epoch)
    # the global stream (used by nothing of a dropout-free model) follows the first member
    torch.manual_seed(epoch_seed(r0.config.seed, epoch, stream=3))
    pack.train()
    pack.set_lr(r0.optimizer.param_groups[0]["lr"])
    stats = _PackedStats(len(members), r0.config.n_bins, r0.device)
    streams = [_train_batches(mb.r, epoch) for mb in members]
    for step, batch in enumerate(zip(*streams, strict=True)):
        x = torch.stack([b[0] for b in batch])
        y = torch.stack([b[1] for b in batch])
        with _autocast(r0.device, r0.amp):
            logits = pack.forward(x)
        logits = logits.float()
        out = [_member_loss(mb, logits[m], y[m]) for m, mb in enumerate(members)]
        stats.update(logits, y, torch.stack([o[1] for o in out]))
        pack.step(torch.stack([o[0] for o in out]).sum(), r0.config.grad_clip)
        if bar is not None:
            bar.update(1)
        extra = [mb for mb in members if mb.every and (step + 1) % mb.every == 0]
        if extra:  # a stateful loss' extra update (AdaFocal & co.)
            val = _validation_logits(pack, members)
            for mb in extra:
                if val is None:
                    _validation_pass(mb.r)
                else:
                    loss_on_validation(mb.r.loss_fn, logits=val[0][:, members.index(mb)],
                                       labels=val[1])
            pack.train()
    return stats


def _validation_logits(pack: _Pack, members: list[_Member]
                       ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every member's validation logits (N, M, C) and the labels, in one packed pass; None
    when the members' validation sets differ (a split that follows the seed)."""
    src = members[0].r.src["val"]
    if any(mb.r.src["val"] is not src for mb in members):
        return None
    r0 = members[0].r
    return predict_logits(_SharedInput(pack), None, r0.device, r0.eval_bs, source=src,
                          amp=r0.amp)


def _end_member_epoch(mb: _Member, epoch: int, lr: float, numbers: dict[str, float],
                      share: float, val: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """The trainer's end of an epoch for one member (``share``: its part of the packed
    training and validation time, counted in its log's ``seconds``; ``val``: its validation
    logits and labels, None: its own pass); a non-finite training loss or an error of its
    evaluation stops the member alone."""
    if not math.isfinite(numbers["loss"]):
        mb.error = MemberDivergedError(
            f"Run {str(mb.r.run.path)!r} diverged in epoch {epoch + 1}: training loss "
            f"{numbers['loss']}; it stops at its last checkpoint, the other packed runs go on")
        return
    try:
        if val is not None:
            loss_on_validation(mb.r.loss_fn, logits=val[0], labels=val[1])
        rec = _end_epoch(mb.r, epoch, lr, numbers, time.perf_counter() - share, val=val)
    except Exception as exc:  # noqa: BLE001 - this member stops, the pack goes on
        mb.error = exc
        return
    mb.final = {k: v for k, v in rec.items() if isinstance(v, float) and k != "seconds"}


def _fit_pack(members: list[_Member], epochs: int, bar: Any) -> None:
    """Train one pack (members at the same epoch) to ``epochs``, dropping diverged members."""
    active = list(members)
    pack = _pack_of(active)
    for epoch in range(active[0].r.start_epoch, epochs):
        t0 = time.perf_counter()
        lr = active[0].r.optimizer.param_groups[0]["lr"]
        stats = _train_epoch(pack, active, epoch, bar)
        val = _validation_logits(pack, active)
        share = (time.perf_counter() - t0) / len(active)
        for m, (mb, numbers) in enumerate(zip(active, stats.compute(active[0].r.env),
                                              strict=True)):
            own = None if val is None else (val[0][:, m].contiguous(), val[1])
            _end_member_epoch(mb, epoch, lr, numbers, share, own)
        alive = [mb for mb in active if mb.error is None]
        if not alive:
            return
        if len(alive) < len(active):
            active, pack = alive, _pack_of(alive)


def _summary(mb: _Member, ood_sets: dict[str, Any]) -> dict[str, Any]:
    r = mb.r
    epochs = max(r.config.epochs, r.start_epoch)
    return {"run_dir": str(r.run.path), "epochs": epochs, "resumed_from": r.start_epoch,
            "final": mb.final, "best": r.best,
            "results": _final_evaluation(r, ood_sets, epochs), "world_size": 1}


def _has_dropout(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def _open_members(configs: Sequence[TrainConfig], group: list[int], stack: contextlib.ExitStack,
                  results: list[Any]) -> list[_Member]:
    """Lock, check and build each member of ``group`` as :func:`~torchcal.train.train` does
    (resuming its checkpoint); a member that fails here gets its error in ``results``."""
    env, members, data = DistEnv(), [], {}
    for i in group:
        cfg = configs[i]
        try:
            cfg.validate()
            stack.enter_context(exclusive_lock(cfg.out_dir))
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
        members.append(_Member(i, r))
    return members


def train_packed(configs: Sequence[TrainConfig], *, max_members: int | None = None
                 ) -> list[dict[str, Any] | BaseException]:
    """Train ``configs`` in packs (:func:`pack_groups`): one result per config, in order.

    Args:
        configs: the runs; those that differ only in :data:`MEMBER_FIELDS` (seed, loss, loss
            arguments, run directory, ...) train together.
        max_members: the most runs in one pack (None: no limit).

    A pack of one (a run alone, or one :func:`pack_problem` refuses) is trained by
    :func:`~torchcal.train.train` itself.

    Returns:
        For each config, the summary :func:`~torchcal.train.train` returns, or the exception
        that stopped that run alone (:class:`MemberDivergedError`, ``CheckpointError``,
        ``InUseError``, a loss' error, ...).

    Raises:
        KeyboardInterrupt: every member keeps its last checkpoint (resume continues it).
        ValueError: under ``torchrun`` (packing is for one process).
    """
    configs = list(configs)
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
            members = _open_members(configs, group, stack, results)
            _train_members(members)
            ood: dict[int, dict[str, Any]] = {}
            for mb in members:
                try:
                    cfg = mb.r.config
                    if cfg.evaluate and _data_seed(cfg) not in ood:
                        ood[_data_seed(cfg)] = load_ood_sets(cfg, mb.r.splits)
                    results[mb.index] = mb.error or _summary(mb, ood.get(_data_seed(cfg), {}))
                except Exception as exc:  # noqa: BLE001
                    results[mb.index] = exc
        for i in group:
            if isinstance(results[i], dict):
                results[i]["seconds"] = (time.perf_counter() - t0) / len(group)
    return results


def _train_members(members: list[_Member]) -> None:
    """Train the members, packed by the epoch they resume from (new runs: 0)."""
    by_start: dict[int, list[_Member]] = {}
    for mb in members:
        by_start.setdefault(mb.r.start_epoch, []).append(mb)
    for start, pack in sorted(by_start.items()):
        epochs = pack[0].r.config.epochs
        if start >= epochs:
            continue
        r0 = pack[0].r
        bar = None
        if r0.config.progress:
            bar = tqdm(total=(epochs - start) * r0.n_batches,
                       desc=f"{r0.config.recipe or r0.config.dataset} x{len(pack)} packed",
                       unit="batch", dynamic_ncols=True)
        try:
            _fit_pack(pack, epochs, bar)
        finally:
            if bar is not None:
                bar.close()
