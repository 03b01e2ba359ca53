"""The model half of the engine's stack of M runs: how their networks run and step, and how
the engine treats them.

The engine (:mod:`torchcal.train.engine`) drives M runs with one set of steps; the networks and
optimisers are one of two *stacks* with the same methods:

* :class:`PackedModel` (M >= 1 runs of one model and recipe): the lanes' parameters and
  buffers stacked along a leading lane dimension, their forward passes as one batched call
  (``torch.func.vmap`` over ``functional_call``, ``forward="vmap"``) or as each lane's own
  kernels on its slices (``forward="loop"``, the CPU's default), per-lane gradient-norm
  clipping and one SGD over the stacks (one SGD with momentum, weight decay and Nesterov over
  the stacked tensors equals M SGDs: every operation is elementwise).
* :class:`SoloModel` (one run): the run's own module as :func:`~torchcal.train.run.build_run`
  wrapped it (the joint uncertainty head, DistributedDataParallel, ``torch.compile``), its own
  optimiser and AMP scaler: what a stack cannot hold (a head's optimiser, fp16's loss scaler,
  DDP's gradient hooks, a compiled graph, dropout's per-lane random streams).

Both implement :class:`Stack`, the protocol the engine (:func:`~torchcal.train.engine.run_stack`)
and the compiled step (:mod:`torchcal.train.compiled`) rely on, and the only lanes of a stack
they use (``tools/check_architecture.py``, rule 15): they take inputs (M, B, ...) and give
logits (M, B, C); ``step(losses, logits, y, max_norm)`` runs the backward pass and the
optimiser; ``split_logits(sources, batch_size)`` gives every lane's logits on a split from the
lanes' batch sources; ``finite`` and ``fc_norms`` give the end of epoch's per-lane checks on
the device; ``stacked_state`` the stacked tensors a checkpoint's rows are cut from; ``graph()``
the stack as stacked tensors and one forward function for the compiled step (:class:`StepGraph`;
None for a run's own module).  A stack holds the modules, optimisers and settings it computes
with, never a run (:class:`~torchcal.train.run.Run`): the engine owns the lanes' runs, steps
their schedules and sets a pack's learning rate (:meth:`Stack.start_epoch`).

What differs between a run alone and a pack in the engine's own steps is a strategy, the
stack's :attr:`Stack.policy` (a :class:`LanePolicy`), not a flag: :class:`AlonePolicy` (a
run of :func:`~torchcal.train.train`: what stops it is raised, its checkpoints name no pack,
it evaluates itself) and :class:`PackPolicy` (a stopped lane stays in its place as a ghost,
its checkpoints name the pack's layout, one pass of the stack evaluates the lanes).
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from ..errors import LaneDivergedError, diverged_message
from .evaluation import write_predictions
from .inference import BatchSource, predict_logits
from .run import SGD, Run, divergence_error, final_evaluation, shares_data

__all__ = ["Stack", "PackedModel", "SoloModel", "SharedInput", "FORWARDS", "StepGraph",
           "StackLane", "LanePolicy", "AlonePolicy", "PackPolicy"]

#: How a pack runs its lanes' model: ``"vmap"`` (one batched forward and backward: a GPU's
#: way, whose kernel launches do not grow with the lanes), ``"loop"`` (each lane's forward on
#: its slices of the stacked parameters, with the kernels of a separate run: faster on a CPU,
#: whose grouped convolutions are slow), ``"auto"`` (``"loop"`` on the CPU, else ``"vmap"``).
#: Losses, statistics, clipping and SGD are shared either way.
FORWARDS = ("auto", "vmap", "loop")


@dataclass(frozen=True)
class StepGraph:
    """A stack as stacked tensors and one forward function: what a compiled step
    (:class:`~torchcal.train.compiled.CompiledStep`) needs to write the whole training step as
    one function of tensors (:meth:`Stack.graph`).

    Attributes:
        params: the stacked parameters by name (leading lane dimension), stepped in place.
        buffers: the stacked buffers by name (a compiled step wants none).
        momenta: each parameter's stacked SGD momentum buffer, in the order of ``params``
            (empty without momentum), updated in place.
        sgd: the stacked SGD's parameter group (``lr``, set by :meth:`Stack.start_epoch`,
            ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``): read, never written.
        n_lanes: M, the stacks' leading dimension.
        forward: ``forward(params, x)``: logits (M, B, C) of inputs (M, B, ...) with the stacked
            parameters ``params`` (those :func:`torch.func.grad` passes), no side effect.
    """

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    momenta: list[torch.Tensor]
    sgd: dict[str, Any]
    n_lanes: int
    forward: Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


class StackLane(Protocol):
    """What a :class:`LanePolicy` reads and sets of a stack's lane (the engine's
    :class:`~torchcal.train.engine.Lane`).

    Attributes:
        index: its position in the caller's results (-1 for a ghost that stands in for an
            absent run).
        run: its :class:`~torchcal.train.run.Run`.
        ghost: computed with the others but writing nothing.
        error: what stopped it (None: it trains).
    """

    index: int
    run: Run
    ghost: bool
    error: BaseException | None


class LanePolicy(Protocol):
    """How the engine treats the lanes of a stack where a run alone and a pack differ: the
    strategy the engine calls in place of a branch (:class:`AlonePolicy`,
    :class:`PackPolicy`)."""

    def stop(self, lane: StackLane, error: BaseException) -> None:
        """Stop ``lane`` with ``error`` (raised, or kept while it stays a ghost)."""

    def stop_error(self, lane: StackLane, epoch: int, rec: dict[str, Any], finite: bool,
                   drain: Callable[[], None]) -> BaseException | None:
        """What stops ``lane`` after ``epoch`` (``rec``: its log record, ``finite``: all its
        parameters are finite; None: it goes on); ``drain`` waits for the earlier epochs'
        files, so that an error may say whether the last checkpoint is on disk."""

    def checkpoint_meta(self, layout: list[str], slot: int, writers: list[str]
                        ) -> dict[str, Any]:
        """The entries a lane's checkpoint adds for its stack (``layout``: the lanes' run
        directories, ``slot``: this lane's position, ``writers``: the live lanes')."""

    def stepping_schedules(self) -> contextlib.AbstractContextManager[Any]:
        """The context in which the engine steps the lanes' learning-rate schedules."""

    def final_results(self, stack: Stack, lanes: Sequence[StackLane],
                      oods: list[dict[str, Any]]) -> dict[int, dict[str, Any] | None]:
        """Each lane's final evaluation by position in ``lanes`` (``oods``: each lane's
        OOD sets)."""


@runtime_checkable
class Stack(Protocol):
    """What the engine (:mod:`torchcal.train.engine`) and the compiled step
    (:mod:`torchcal.train.compiled`) rely on in a stack of M lanes, and all they use of one
    (``tools/check_architecture.py``, rule 15).

    Attributes:
        policy: how the engine treats the lanes (:class:`LanePolicy`):
            :class:`AlonePolicy` for a run's own module and optimiser, :class:`PackPolicy` when
            one stacked optimiser steps for the lanes (their own optimisers hold views of its
            state and are never stepped themselves).
        amp: the lanes' ``amp`` (``"off"``, ``"bf16"``, ``"fp16"``).
    """

    policy: LanePolicy
    amp: str

    def train(self, mode: bool = True) -> None:
        """Train (or evaluation) mode of every lane."""

    def start_epoch(self, lr: float) -> None:
        """Train mode and the epoch's learning rate ``lr`` (the engine's, from the lanes'
        schedule)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (M, B, C) of inputs (M, B, ...): lane ``m`` sees ``x[m]``."""

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, M, C) of every lane on the same inputs (B, ...)."""

    def step(self, losses: torch.Tensor, logits: torch.Tensor, y: torch.Tensor,
             max_norm: float | None, index: torch.Tensor | None = None) -> None:
        """Backward of the lanes' losses (M,), clipping and one optimiser step."""

    def annotate(self, rec: dict[str, Any]) -> None:
        """Add what the stack knows to a lane's log record."""

    def split_logits(self, sources: Sequence[BatchSource], batch_size: int
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Every lane's logits (N, M, C) and labels on a split (``sources[m]``: lane
        ``m``'s batch source of it), twice: all of them, and this process' share."""

    def finite(self) -> torch.Tensor:
        """(M,) bool: every parameter of lane ``m`` is finite."""

    def fc_norms(self) -> torch.Tensor | None:
        """(M,) norms of each lane's ``fc.weight``, None without one."""

    def stacked_state(self) -> dict[str, torch.Tensor]:
        """The stacked tensors (leading lane dimension) a lane's checkpoint rows are cut
        from, by name; empty when the stack holds no stacked tensor."""

    def graph(self) -> StepGraph | None:
        """The stack as stacked tensors and one forward function, for a compiled step; None
        when its step is its own module's (a run alone, whose own ``compile`` option compiles
        its model)."""


# torch's check that a schedule steps after its optimiser (PyTorch issue 20124)
_ORDER_WARNING = re.escape("Detected call of `lr_scheduler.step()` before `optimizer.step()`")


class AlonePolicy:
    """The lanes of a run alone (:class:`SoloModel`, the run of
    :func:`~torchcal.train.train`): what stops it is raised
    (:class:`~torchcal.errors.DivergedError` worded once its earlier epochs' files are on disk),
    its checkpoints name no pack, and it evaluates itself
    (:func:`~torchcal.train.run.final_evaluation`)."""

    def stop(self, lane: StackLane, error: BaseException) -> None:
        """Raise ``error``."""
        raise error

    def stop_error(self, lane: StackLane, epoch: int, rec: dict[str, Any], finite: bool,
                   drain: Callable[[], None]) -> BaseException | None:
        """:func:`~torchcal.train.run.divergence_error`, worded after ``drain``."""
        finite_loss = math.isfinite(rec["train_loss"])
        if divergence_error(lane.run, epoch, finite_loss, finite) is None:
            return None
        drain()  # worded once the earlier epochs' files are written
        return divergence_error(lane.run, epoch, finite_loss, finite)

    def checkpoint_meta(self, layout: list[str], slot: int, writers: list[str]
                        ) -> dict[str, Any]:
        """Nothing: a run alone is in no pack."""
        return {}

    def stepping_schedules(self) -> contextlib.AbstractContextManager[Any]:
        """No context: the run's own optimiser stepped before its schedule."""
        return contextlib.nullcontext()

    def final_results(self, stack: Stack, lanes: Sequence[StackLane],
                      oods: list[dict[str, Any]]) -> dict[int, dict[str, Any] | None]:
        """Each lane's own :func:`~torchcal.train.run.final_evaluation`."""
        return {m: final_evaluation(mb.run, oods[m], max(mb.run.config.epochs,
                                                         mb.run.start_epoch))
                for m, mb in enumerate(lanes)}


class PackPolicy:
    """The lanes of a pack (:class:`PackedModel`): a lane that stops stays in its place as
    a ghost (:class:`~torchcal.errors.LaneDivergedError` when it diverged), so its companions
    keep their pack and their numbers; its checkpoints name the pack's layout (the
    ``"pack"`` entry :mod:`torchcal.train.pack_commit` resumes from); one pass of the stack
    evaluates the lanes that share their data."""

    def stop(self, lane: StackLane, error: BaseException) -> None:
        """Keep ``error`` and make ``lane`` a ghost."""
        lane.error, lane.ghost = error, True

    def stop_error(self, lane: StackLane, epoch: int, rec: dict[str, Any], finite: bool,
                   drain: Callable[[], None]) -> BaseException | None:
        """:class:`~torchcal.errors.LaneDivergedError` when the training loss or a parameter
        is not finite."""
        finite_loss = math.isfinite(rec["train_loss"])
        if finite_loss and finite:
            return None
        what = " and ".join(w for w, bad in (("training loss", not finite_loss),
                                             ("parameters", not finite)) if bad)
        return LaneDivergedError(diverged_message(
            epoch, f"{what} {rec['train_loss'] if 'loss' in what else 'not finite'}",
            "it stops at its last checkpoint, the other packed runs go on",
            run=str(lane.run.dir.path)))

    def checkpoint_meta(self, layout: list[str], slot: int, writers: list[str]
                        ) -> dict[str, Any]:
        """The checkpoint's ``"pack"`` entry (a file format: its ``"slots"`` are the lanes'
        run directories)."""
        return {"pack": {"slots": layout, "slot": slot, "writers": writers}}

    @contextlib.contextmanager
    def stepping_schedules(self) -> Iterator[None]:
        """torch's "``lr_scheduler.step()`` before ``optimizer.step()``" warning ignored: the
        lanes' optimisers are never stepped themselves (the stacked SGD steps for them),
        which torch's check of the order cannot see (the order is the right one)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_ORDER_WARNING, category=UserWarning)
            yield

    def final_results(self, stack: Stack, lanes: Sequence[StackLane],
                      oods: list[dict[str, Any]]) -> dict[int, dict[str, Any] | None]:
        """One pass of ``stack`` when the lanes share their data, else each live lane's
        own :func:`~torchcal.train.run.final_evaluation` (with ``evaluate``)."""
        if shares_data([mb.run for mb in lanes]):
            return _evaluate_pack(stack, lanes, next((o for o in oods if o), {}))
        return {m: final_evaluation(mb.run, oods[m], max(mb.run.config.epochs,
                                                         mb.run.start_epoch))
                for m, mb in enumerate(lanes) if not mb.ghost and mb.run.config.evaluate}


def _evaluate_pack(stack: Stack, lanes: Sequence[StackLane], ood_sets: dict[str, Any]
                   ) -> dict[int, dict[str, Any]]:
    """The final evaluation of every live lane with ``evaluate``: one forward of the stack
    over the validation, test and OOD sets; each lane's logits and results written as a
    run's."""
    evaluated = [mb for mb in lanes if not mb.ghost and mb.run.config.evaluate]
    if not evaluated:
        return {}
    r0 = lanes[0].run
    preds = {s: stack.split_logits([mb.run.src[s] for mb in lanes], r0.eval_bs)[0]
             for s in ("val", "test")}
    mean, std = getattr(r0.splits, "mean", None), getattr(r0.splits, "std", None)
    for name, ds in ood_sets.items():
        preds[f"ood_{name}"] = predict_logits(SharedInput(stack), ds, r0.device, r0.eval_bs,
                                              mean=mean, std=std, amp=r0.amp)
    out = {}
    for mb in evaluated:
        m, cfg = lanes.index(mb), mb.run.config
        own = {k: (z[:, m].contiguous(), y if y.ndim == 1 else y[:, m]) for k, (z, y) in
               preds.items()}
        epochs = max(cfg.epochs, mb.run.start_epoch)
        out[m] = write_predictions(own, mb.run.dir.path, cfg, epoch=epochs, checkpoint="last")
    return out


def _check_sources(sources: Any) -> None:
    if isinstance(sources, str):
        raise TypeError(f"Expected `sources` to be the lanes' batch sources of a split (one "
                        f"per lane), got the split name {sources!r}: a stack holds no run")


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
    """The lanes' parameters and buffers stacked (leading lane dimension), the forward
    pass of all lanes at once, per-lane gradient clipping, and one SGD over the stacks.

    ``models[m]`` and ``optimizers[m]`` (an SGD over ``models[m]``'s parameters, never stepped
    itself) hold views of slice ``m`` afterwards, so checkpoints, evaluation and the schedules
    see the packed values without copies.  The lanes' schedules set ``optimizers[m]``'s
    learning rate; the engine hands it to the stacked SGD (:meth:`start_epoch`).  ``amp``: the
    lanes' (their evaluation passes' autocast).
    """

    policy: LanePolicy = PackPolicy()

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
        """The stacked momentum buffers from the lanes' SGD states (zeros for a new run:
        SGD's first step then gives ``buf = grad`` exactly as an empty buffer does), and the
        lanes' states made views of them."""
        lane_params = [list(model.parameters()) for model in self.models]
        for j, p in enumerate(self.params.values()):
            bufs = []
            for opt, mp in zip(self.optimizers, lane_params, strict=True):
                b = opt.state.get(mp[j], {}).get("momentum_buffer")
                bufs.append(torch.zeros_like(p[0]) if b is None else b.to(p.device))
            stacked = torch.stack(bufs)
            self.opt.state[p]["momentum_buffer"] = stacked
            for m, (opt, mp) in enumerate(zip(self.optimizers, lane_params, strict=True)):
                opt.state[mp[j]]["momentum_buffer"] = stacked[m]

    def _call(self, params, buffers, x):
        return functional_call(self.base, (params, buffers), (x,))

    def _lanes(self, xs, stacked: dict[str, torch.Tensor] | None = None
                 ) -> list[torch.Tensor]:
        """Each lane's forward on its slices of the stacked tensors (``stacked``: these
        parameters instead of the pack's), with the very kernels of a separate run.  The slices
        come from one ``unbind`` per tensor, whose backward stacks the lanes' gradients in one
        operation (indexing each lane would add a zero-filled full-size gradient per lane
        and tensor)."""
        stacked = self.params if stacked is None else stacked
        params = {k: v.unbind(0) for k, v in stacked.items()}
        buffers = {k: v.unbind(0) for k, v in self.buffers.items()}
        return [self._call({k: v[m] for k, v in params.items()},
                           {k: v[m] for k, v in buffers.items()}, x) for m, x in enumerate(xs)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (M, B, C) of inputs (M, B, ...): lane ``m`` sees ``x[m]``."""
        return self.forward_with(self.params, x)

    def forward_with(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` with the stacked parameters ``params`` (the compiled step's
        :func:`torch.func.grad` passes its own)."""
        if self.mode == "loop":
            return torch.stack(self._lanes(x.unbind(0), params))
        packed = getattr(self.base, "forward_packed", None)
        if packed is not None and not self.buffers:  # the model's own layout for a pack
            return packed(params, x)
        return vmap(self._call, randomness="error")(params, self.buffers, x)

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, M, C) of every lane on the same inputs (B, ...)."""
        if self.mode == "loop":
            return torch.stack(self._lanes([x] * len(self.models)), 1)
        return vmap(self._call, in_dims=(0, 0, None), out_dims=1,
                    randomness="error")(self.params, self.buffers, x)

    def train(self, mode: bool = True) -> None:
        for model in self.models:
            model.train(mode)

    def start_epoch(self, lr: float) -> None:
        """Train mode and the epoch's learning rate (the lanes share the schedule)."""
        self.train()
        for g in self.opt.param_groups:
            g["lr"] = lr

    def annotate(self, rec: dict[str, Any]) -> None:
        """Nothing to add to a lane's log record."""

    def split_logits(self, sources: Sequence[BatchSource], batch_size: int
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Every lane's logits (N, M, C) on a split (``sources[m]``: lane ``m``'s batch
        source of it, in ``batch_size`` batches) and the labels ((N,) or, when the lanes'
        sources differ, (N, M)), twice: all of them, and this process' share (the same here: a
        pack runs in one process)."""
        _check_sources(sources)
        if len(sources) != len(self.models):
            raise ValueError(f"Expected `sources` to hold one source per lane "
                             f"({len(self.models)}), got {len(sources)}")
        if all(s is sources[0] for s in sources):
            out = predict_logits(SharedInput(self), None, self.device, batch_size,
                                 source=sources[0], amp=self.amp)
        else:  # a split that follows the seed: one pass per lane
            outs = [predict_logits(model, None, self.device, batch_size, source=s, amp=self.amp)
                    for model, s in zip(self.models, sources, strict=True)]
            out = torch.stack([o[0] for o in outs], 1), torch.stack([o[1] for o in outs], 1)
        return out, out

    def step(self, losses: torch.Tensor, logits: torch.Tensor, y: torch.Tensor,
             max_norm: float | None, index: torch.Tensor | None = None) -> None:
        """Backward of the lanes' summed losses, each lane's gradient clipped by its own
        norm, one SGD step.

        The clipping is ``clip_grad_norm_``'s computation for every lane at once: the norm of
        each parameter tensor's row of each lane (the very reduction ``_foreach_norm`` runs on
        one lane's tensor), the norm of those norms, ``max_norm / (norm + 1e-6)`` clamped at
        1, one ``_foreach_mul_``: a number of operations that grows with the parameter tensors,
        not with the lanes."""
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
        """(M,) bool: every parameter of lane ``m`` is finite (one op per parameter tensor,
        whatever M)."""
        n = len(self.models)
        flags = [torch.isfinite(p).reshape(n, -1).all(1) for p in self.params.values()]
        return torch.stack(flags).all(0)

    @torch.no_grad()
    def fc_norms(self) -> torch.Tensor | None:
        """(M,) norms of each lane's ``fc.weight`` (what a run logs), None without one."""
        w = self.params.get("fc.weight")
        return None if w is None else w.float().reshape(len(self.models), -1).norm(dim=1)

    def graph(self) -> StepGraph:
        """The stacked parameters, buffers and momenta, the stacked SGD's settings and
        :meth:`forward_with`: the whole stack as a compiled step sees it."""
        group = self.opt.param_groups[0]
        momenta = ([self.opt.state[p]["momentum_buffer"] for p in self.params.values()]
                   if group["momentum"] else [])
        return StepGraph(params=self.params, buffers=self.buffers, momenta=momenta, sgd=group,
                         n_lanes=len(self.models), forward=self.forward_with)

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
    gives every lane's logits (B, M, C) on the same batch; ``eval()`` reaches the lanes."""

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

    policy: LanePolicy = AlonePolicy()

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

    def graph(self) -> None:
        """None: a run alone steps its own module (head, AMP scaler, DDP); its ``compile``
        option compiles the model."""
        return None
