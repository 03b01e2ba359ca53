"""The model half of the engine's stack of M runs: how their networks run and step.

The engine (:mod:`torchcal.train.engine`) drives M runs with one set of steps; the networks and
optimisers are one of two *stacks* with the same methods:

* :class:`PackedModel` (M >= 1 runs of one model and recipe): the members' parameters and
  buffers stacked along a leading member dimension, their forward passes as one batched call
  (``torch.func.vmap`` over ``functional_call``, ``forward="vmap"``) or as each member's own
  kernels on its slices (``forward="loop"``, the CPU's default), per-member gradient-norm
  clipping and one SGD over the stacks (one SGD with momentum, weight decay and Nesterov over
  the stacked tensors equals M SGDs: every operation is elementwise).
* :class:`SoloModel` (one run): the run's own module as :func:`~torchcal.train.run.build_run`
  wrapped it (the joint uncertainty head, DistributedDataParallel, ``torch.compile``), its own
  optimiser and AMP scaler: what a stack cannot hold (a head's optimiser, fp16's loss scaler,
  DDP's gradient hooks, a compiled graph, dropout's per-member random streams).

Both implement :class:`Stack`, the protocol the engine (:func:`~torchcal.train.engine.run_stack`)
relies on and the only members of a stack it uses: they take inputs (M, B, ...) and give logits
(M, B, C); ``step(losses, logits, y, max_norm)`` runs the backward pass and the optimiser;
``split_logits(sources, batch_size)`` gives every member's logits on a split from the members'
batch sources; ``finite`` and ``fc_norms`` give the end of epoch's per-member checks on the
device; ``stacked_state`` the stacked tensors a checkpoint's rows are cut from.  A stack holds
the modules, optimisers and settings it computes with, never a run
(:class:`~torchcal.train.run.Run`): the engine owns the members' runs, steps their schedules
and sets a pack's learning rate (:meth:`Stack.start_epoch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from .inference import BatchSource, predict_logits
from .run import SGD, Run

__all__ = ["Stack", "PackedModel", "SoloModel", "SharedInput", "FORWARDS"]

#: How a pack runs its members' model: ``"vmap"`` (one batched forward and backward: a GPU's
#: way, whose kernel launches do not grow with the members), ``"loop"`` (each member's forward on
#: its slices of the stacked parameters, with the kernels of a separate run: faster on a CPU,
#: whose grouped convolutions are slow), ``"auto"`` (``"loop"`` on the CPU, else ``"vmap"``).
#: Losses, statistics, clipping and SGD are shared either way.
FORWARDS = ("auto", "vmap", "loop")


@runtime_checkable
class Stack(Protocol):
    """What the engine (:mod:`torchcal.train.engine`) relies on in a stack of M members, and
    all it uses of one.

    Attributes:
        packed: True when one stacked optimiser steps for the members (their own optimisers
            hold views of its state and are never stepped themselves) and their final
            evaluation is one pass of the stack (:meth:`forward_shared`); False for a run's
            own module and optimiser.
        amp: the members' ``amp`` (``"off"``, ``"bf16"``, ``"fp16"``).
    """

    packed: bool
    amp: str

    def train(self, mode: bool = True) -> None:
        """Train (or evaluation) mode of every member."""

    def start_epoch(self, lr: float) -> None:
        """Train mode and the epoch's learning rate ``lr`` (the engine's, from the members'
        schedule)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (M, B, C) of inputs (M, B, ...): member ``m`` sees ``x[m]``."""

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, M, C) of every member on the same inputs (B, ...)."""

    def step(self, losses: torch.Tensor, logits: torch.Tensor, y: torch.Tensor,
             max_norm: float | None, index: torch.Tensor | None = None) -> None:
        """Backward of the members' losses (M,), clipping and one optimiser step."""

    def annotate(self, rec: dict[str, Any]) -> None:
        """Add what the stack knows to a member's log record."""

    def split_logits(self, sources: Sequence[BatchSource], batch_size: int
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Every member's logits (N, M, C) and labels on a split (``sources[m]``: member
        ``m``'s batch source of it), twice: all of them, and this process' share."""

    def finite(self) -> torch.Tensor:
        """(M,) bool: every parameter of member ``m`` is finite."""

    def fc_norms(self) -> torch.Tensor | None:
        """(M,) norms of each member's ``fc.weight``, None without one."""

    def stacked_state(self) -> dict[str, torch.Tensor]:
        """The stacked tensors (leading member dimension) a member's checkpoint rows are cut
        from, by name; empty when the stack holds no stacked tensor."""


def _check_sources(sources: Any) -> None:
    if isinstance(sources, str):
        raise TypeError(f"Expected `sources` to be the members' batch sources of a split (one "
                        f"per member), got the split name {sources!r}: a stack holds no run")


def _bind(model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
          m: int) -> None:
    """Make ``model``'s parameters and buffers views of slice ``m`` of the stacked tensors."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = params[name][m]
    for name, _ in list(model.named_buffers()):
        mod, _, leaf = name.rpartition(".")
        model.get_submodule(mod)._buffers[leaf] = buffers[name][m]


class PackedModel:
    """The members' parameters and buffers stacked (leading member dimension), the forward
    pass of all members at once, per-member gradient clipping, and one SGD over the stacks.

    ``models[m]`` and ``optimizers[m]`` (an SGD over ``models[m]``'s parameters, never stepped
    itself) hold views of slice ``m`` afterwards, so checkpoints, evaluation and the schedules
    see the packed values without copies.  The members' schedules set ``optimizers[m]``'s
    learning rate; the engine hands it to the stacked SGD (:meth:`start_epoch`).  ``amp``: the
    members' (their evaluation passes' autocast).
    """

    packed = True

    def __init__(self, models: list[nn.Module], optimizers: list[torch.optim.SGD],
                 forward: str = "vmap", amp: str = "off") -> None:
        if forward not in FORWARDS:
            raise ValueError(f"Expected `forward` to be one of {FORWARDS}, got {forward!r}")
        if forward == "auto":
            cpu = next(models[0].parameters()).device.type == "cpu"
            forward = "loop" if cpu else "vmap"
        self.amp = amp
        self.models, self.optimizers = models, optimizers
        self.device = next(models[0].parameters()).device
        self.base = models[0]
        self.mode = forward
        params, buffers = stack_module_state(models)
        self.params, self.buffers = params, buffers
        group = optimizers[0].param_groups[0]
        self.opt = SGD(list(params.values()), lr=group["lr"],
                       momentum=group["momentum"], dampening=group["dampening"],
                       weight_decay=group["weight_decay"], nesterov=group["nesterov"])
        for m, model in enumerate(models):
            _bind(model, params, buffers, m)
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

    def _members(self, xs, stacked: dict[str, torch.Tensor] | None = None
                 ) -> list[torch.Tensor]:
        """Each member's forward on its slices of the stacked tensors (``stacked``: these
        parameters instead of the pack's), with the very kernels of a separate run.  The slices
        come from one ``unbind`` per tensor, whose backward stacks the members' gradients in one
        operation (indexing each member would add a zero-filled full-size gradient per member
        and tensor)."""
        stacked = self.params if stacked is None else stacked
        params = {k: v.unbind(0) for k, v in stacked.items()}
        buffers = {k: v.unbind(0) for k, v in self.buffers.items()}
        return [self._call({k: v[m] for k, v in params.items()},
                           {k: v[m] for k, v in buffers.items()}, x) for m, x in enumerate(xs)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (M, B, C) of inputs (M, B, ...): member ``m`` sees ``x[m]``."""
        return self.forward_with(self.params, x)

    def forward_with(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` with the stacked parameters ``params`` (the compiled step's
        :func:`torch.func.grad` passes its own)."""
        if self.mode == "loop":
            return torch.stack(self._members(x.unbind(0), params))
        packed = getattr(self.base, "forward_packed", None)
        if packed is not None and not self.buffers:  # the model's own layout for a pack
            return packed(params, x)
        return vmap(self._call, randomness="error")(params, self.buffers, x)

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, M, C) of every member on the same inputs (B, ...)."""
        if self.mode == "loop":
            return torch.stack(self._members([x] * len(self.models)), 1)
        return vmap(self._call, in_dims=(0, 0, None), out_dims=1,
                    randomness="error")(self.params, self.buffers, x)

    def train(self, mode: bool = True) -> None:
        for model in self.models:
            model.train(mode)

    def start_epoch(self, lr: float) -> None:
        """Train mode and the epoch's learning rate (the members share the schedule)."""
        self.train()
        for g in self.opt.param_groups:
            g["lr"] = lr

    def annotate(self, rec: dict[str, Any]) -> None:
        """Nothing to add to a member's log record."""

    def split_logits(self, sources: Sequence[BatchSource], batch_size: int
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Every member's logits (N, M, C) on a split (``sources[m]``: member ``m``'s batch
        source of it, in ``batch_size`` batches) and the labels ((N,) or, when the members'
        sources differ, (N, M)), twice: all of them, and this process' share (the same here: a
        pack runs in one process)."""
        _check_sources(sources)
        if len(sources) != len(self.models):
            raise ValueError(f"Expected `sources` to hold one source per member "
                             f"({len(self.models)}), got {len(sources)}")
        if all(s is sources[0] for s in sources):
            out = predict_logits(SharedInput(self), None, self.device, batch_size,
                                 source=sources[0], amp=self.amp)
        else:  # a split that follows the seed: one pass per member
            outs = [predict_logits(model, None, self.device, batch_size, source=s, amp=self.amp)
                    for model, s in zip(self.models, sources, strict=True)]
            out = torch.stack([o[0] for o in outs], 1), torch.stack([o[1] for o in outs], 1)
        return out, out

    def step(self, losses: torch.Tensor, logits: torch.Tensor, y: torch.Tensor,
             max_norm: float | None, index: torch.Tensor | None = None) -> None:
        """Backward of the members' summed losses, each member's gradient clipped by its own
        norm, one SGD step.

        The clipping is ``clip_grad_norm_``'s computation for every member at once: the norm of
        each parameter tensor's row of each member (the very reduction ``_foreach_norm`` runs on
        one member's tensor), the norm of those norms, ``max_norm / (norm + 1e-6)`` clamped at
        1, one ``_foreach_mul_``: a number of operations that grows with the parameter tensors,
        not with the members."""
        self.opt.zero_grad(set_to_none=True)
        losses.sum().backward()
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

    def stacked_state(self) -> dict[str, torch.Tensor]:
        """The stacked parameters (``p.NAME``), buffers (``b.NAME``) and SGD momentum buffers
        (``m.J``, J the parameter's position)."""
        out = {f"p.{k}": v for k, v in self.params.items()}
        out.update({f"b.{k}": v for k, v in self.buffers.items()})
        for j, p in enumerate(self.params.values()):
            buf = self.opt.state.get(p, {}).get("momentum_buffer")
            if isinstance(buf, torch.Tensor):
                out[f"m.{j}"] = buf
        return out


class SharedInput(nn.Module):
    """A stack as a module for :func:`~torchcal.train.inference.predict_logits`: ``forward(x)``
    gives every member's logits (B, M, C) on the same batch; ``eval()`` reaches the members."""

    def __init__(self, pack: Stack) -> None:
        super().__init__()
        self.pack = pack

    def train(self, mode: bool = True):
        self.training = mode
        self.pack.train(mode)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pack.forward_shared(x)


class SoloModel:
    """One run as a stack of one: its own module (wrapped by
    :func:`~torchcal.train.run.build_run` for the joint head, DDP and ``torch.compile``), its
    own optimiser, AMP scaler and head, taken from ``run`` (the stack keeps these parts, not
    the run).  Under ``torchrun`` each rank holds its shard of the batches and of the
    evaluation splits; DDP averages the gradients."""

    packed = False

    def __init__(self, run: Run) -> None:
        self.fwd, self.model, self.plugin = run.fwd, run.model, run.plugin
        self.optimizer, self.scaler = run.optimizer, run.scaler
        self.env, self.device, self.amp = run.env, run.device, run.amp
        self.n_batches = run.n_batches  # the batches of an epoch (the head's log numbers)
        self.feats: Any = None
        world = run.env.world_size if run.env.enabled else 1
        # DDP averages the ranks' gradients: a summed loss must be scaled back to a sum
        self.scale = world if str(getattr(run.loss_fn, "reduction", "mean")) == "sum" else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (1, B, C) of inputs (1, B, ...); the head's features are kept for ``step``."""
        logits, self.feats = self.plugin.split(self.fwd(x[0]))
        return logits.unsqueeze(0)

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, C) of the bare model (no head, DDP or compile wrapper) on ``x``."""
        return self.model(x).unsqueeze(1)

    def train(self, mode: bool = True) -> None:
        self.fwd.train(mode)

    def start_epoch(self, lr: float) -> None:
        """Train mode and a fresh epoch of the head (``lr`` is the optimiser's already: its
        schedule set it)."""
        self.train()
        self.plugin.start_epoch()

    def annotate(self, rec: dict[str, Any]) -> None:
        """The head's epoch numbers in the run's log record."""
        self.plugin.log(rec, self.n_batches)

    def split_logits(self, sources: Sequence[BatchSource], batch_size: int
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """The logits (N, 1, C) and labels of a split (``sources``: the run's one source of
        it) gathered from every rank, and this rank's share (what a stateful loss' hook
        sees)."""
        _check_sources(sources)
        if len(sources) != 1:
            raise ValueError(f"Expected `sources` to hold one source (a run alone), got "
                             f"{len(sources)}")
        z, y, (lz, ly) = predict_logits(self.model, None, self.device, batch_size, env=self.env,
                                        source=sources[0], amp=self.amp, return_local=True)
        return (z.unsqueeze(1), y), (lz.unsqueeze(1), ly)

    def step(self, losses: torch.Tensor, logits: torch.Tensor, y: torch.Tensor,
             max_norm: float | None, index: torch.Tensor | None = None) -> None:
        """One backward pass and optimiser step (with the head's loss and step; the scaler is
        a no-op unless AMP is fp16; the engine steps a per-step schedule after it).  ``index``:
        the batch's sample indices (1, B), for a head that needs them."""
        loss = losses[0] * self.scale if self.scale != 1 else losses[0]
        total = self.plugin.add_loss(loss, logits[0], self.feats, y[0],
                                   index=None if index is None else index[0])
        self.optimizer.zero_grad(set_to_none=True)
        self.plugin.zero_grad()
        self.scaler.scale(total).backward()
        if max_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.scaler.step(self.optimizer)
        self.plugin.step(self.scaler)
        self.scaler.update()

    @torch.no_grad()
    def finite(self) -> torch.Tensor:
        """(1,) bool: every parameter of the model and the head is finite."""
        params = [p.detach() for p in self.model.parameters()]
        params += [p.detach() for p in getattr(self.plugin, "head", nn.Module()).parameters()]
        if not params:
            return torch.ones(1, dtype=torch.bool, device=self.device)
        return torch.stack([torch.isfinite(p).all() for p in params]).all().reshape(1)

    @torch.no_grad()
    def fc_norms(self) -> torch.Tensor | None:
        """(1,) norm of the model's ``fc.weight``, None without one."""
        fc = getattr(self.model, "fc", None)
        return None if fc is None else fc.weight.detach().float().norm().reshape(1)

    def stacked_state(self) -> dict[str, torch.Tensor]:
        """None: a run's own tensors are its checkpoint's."""
        return {}
