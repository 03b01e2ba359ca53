"""A pack's training step as one graph: :func:`torch.compile` over the whole step.

The eager step of a pack (:func:`~torchcal.train.engine.train_epoch`) dispatches about 600
aten operations: on a GPU each is a kernel launch, and a small network's step is bound by the
launches, not by its arithmetic.  :class:`CompiledStep` is the same step as **one function**
of tensors, compiled once per batch shape:

* the batch gather from the shared data on the device (``BatchSource.take``: the step takes the
  lanes' sample indices (M, B), not the samples);
* the forward pass of every lane (the stack's :class:`~torchcal.train.stacks.StepGraph`:
  :meth:`PackedModel.forward_with <torchcal.train.stacks.PackedModel.forward_with>`, vmapped or
  looped), the
  grouped losses (:class:`~torchcal.train.loss_groups.LossGroups`) and their gradient with
  :func:`torch.func.grad_and_value` (no ``backward()``: the backward pass is part of the graph);
* the epoch statistics (:class:`~torchcal.train.engine.PackedStats`, updated in place);
* per-lane gradient-norm clipping and SGD (momentum, dampening, weight decay, Nesterov) on
  the stacked parameters and momentum buffers, in place, as ``torch.optim.SGD`` computes it;
  the learning rate is a 0-d tensor on the device, so the schedule never recompiles.

The loss state (AdaFocal's γ, a scheduled focal loss' γ, ...) stays in the groups' stacked
buffers, which :meth:`LossGroups.refresh` updates in place between steps.  On CUDA the compiled
step runs in ``mode="reduce-overhead"`` (CUDA graphs, with every tensor the step mutates marked
as a static address); on the CPU with the inductor backend.

``TrainConfig.compile_step`` chooses: ``"off"`` (the eager step: packed equals ``--no-pack`` bit
for bit), ``"on"`` (compiled), ``"auto"`` (compiled on CUDA; eager on the CPU, where compiling
costs more than it saves in a demo-sized run: ``docs/guide/packing.md``).  A configuration that
cannot be compiled trains eagerly, with one :class:`CompiledStepWarning` naming the reason.  The
compiled step equals the eager one to float rounding, not bit for bit (fused kernels round
differently).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch.func import grad_and_value

from ..errors import CompiledStepWarning
from .device import autocast
from .loss_groups import LossGroups
from .stacks import Stack, StepGraph

__all__ = ["COMPILE_STEP", "CompiledStep", "CompiledStepWarning", "compile_problem",
           "make_compiled_step"]

#: Values of ``TrainConfig.compile_step``.
COMPILE_STEP = ("auto", "off", "on")


def compile_problem(stack: Stack, groups: LossGroups, gather: bool) -> str | None:
    """Why the step of ``stack`` cannot be one compiled graph (None: it can): what its
    :meth:`~torchcal.train.stacks.Stack.graph` is, or is not, and how the lanes' batches and
    losses are computed."""
    graph = stack.graph()
    if graph is None:
        return "the stack steps its own module (a run alone: head, AMP scaler, DDP)"
    if graph.buffers:
        return "the model has buffers (batch norm's running statistics are not stacked state)"
    if not gather:
        return "the lanes' batches are not one gather from shared data (augmentation, " \
               "per-lane data or torchrun)"
    if groups.unbatched:
        return "a lane's loss cannot join a vmapped group"
    if any(g.grad is not None for g in graph.params.values()):
        return "the stacked parameters hold gradients"
    return None


@contextlib.contextmanager
def _cpu_codegen_workaround():
    """torch's C++ code generator (2.13) fails with ``KeyError: 'bufN'`` when it fuses the
    clipped gradient's reduction into the in-place SGD update through an outer loop
    (``CppScheduling.try_outer_loop_fusion_with_local_buf``); while the step compiles, that
    fusion is off (the kernels are otherwise the same)."""
    try:
        from torch._inductor.codegen.cpp import CppScheduling  # noqa: PLC0415 - optional, torch-internal
    except ImportError:  # pragma: no cover - another torch: nothing to work around
        yield
        return
    old = CppScheduling.can_fuse_vertical_outer_loop
    CppScheduling.can_fuse_vertical_outer_loop = lambda self, node1, node2: False
    try:
        yield
    finally:
        CppScheduling.can_fuse_vertical_outer_loop = old


class CompiledStep:
    """The packed step of :func:`~torchcal.train.engine.train_epoch` as one compiled function.

    Args:
        pack: the lanes' stack: its :meth:`~torchcal.train.stacks.Stack.graph` (the stacked
            parameters, momenta, SGD settings and forward function) is all the step uses.
        groups: the lanes' losses.
        source: the shared training data (``BatchSource``) the indices gather from.
        max_norm: per-lane gradient clipping (None: none).
        amp: the runs' ``amp`` (``"off"`` or ``"bf16"``).
        backend: :func:`torch.compile`'s backend (``"inductor"``; tests use ``"aot_eager"``).
        mode: :func:`torch.compile`'s mode (None: ``"reduce-overhead"`` on CUDA, else default).

    Call it with ``(index (M, B), stats)``: one training step of every lane.

    Raises:
        TypeError: ``pack`` has no graph (a run alone steps its own module).
    """

    def __init__(self, pack: Stack, groups: LossGroups, source: Any,
                 max_norm: float | None, amp: str = "off", backend: str = "inductor",
                 mode: str | None = None) -> None:
        graph = pack.graph()
        if graph is None:
            raise TypeError(f"Expected `pack` to be a stack with a step graph (a pack), got "
                            f"{type(pack).__name__}, which steps its own module")
        self.graph: StepGraph = graph
        self.groups, self.source = groups, source
        self.max_norm = None if max_norm is None else float(max_norm)
        self.amp = amp
        self.device = next(iter(graph.params.values())).device
        group = graph.sgd
        self.momentum, self.dampening = float(group["momentum"]), float(group["dampening"])
        self.weight_decay, self.nesterov = float(group["weight_decay"]), bool(group["nesterov"])
        self.names = list(graph.params)
        self.momenta = graph.momenta
        self.lr = torch.zeros((), dtype=torch.float64, device=self.device)
        self._lr_host: float | None = None
        self.mean_rows = groups.mean_rows
        cuda = self.device.type == "cuda"
        if mode is None and cuda and backend == "inductor":
            mode = "reduce-overhead"
        self.cudagraphs = mode == "reduce-overhead"
        self._fn = torch.compile(self._step, backend=backend, mode=mode, fullgraph=True,
                                 dynamic=False)
        self.failed: str | None = None
        self._stats: Any = None
        self._scalars: torch.Tensor | None = None
        self._bins: torch.Tensor | None = None

    def _static(self, stats: Any) -> None:
        """The epoch's statistics accumulate in this step's own buffers (zeroed when a new
        epoch's ``stats`` arrives, then lent to it), so that the tensors the step mutates keep
        their addresses; on CUDA they, the parameters, momenta, learning rate, data and the
        stacked loss state are marked static (CUDA graphs replay on fixed addresses; a loss
        buffer a hook replaced is copied in)."""
        if stats is not self._stats:
            if self._scalars is None:
                self._scalars, self._bins = stats.scalars, stats.bins
            else:
                self._scalars.zero_()
                self._bins.zero_()
                stats.scalars, stats.bins = self._scalars, self._bins
            self._stats = stats
        if not self.cudagraphs:
            return
        mark = torch._dynamo.mark_static_address
        state = [t for g in self.groups.groups for t in g.state.values()]
        for t in [*self.graph.params.values(), *self.momenta, self.lr, self._scalars,
                  self._bins, self.source.data, self.source.labels, self.mean_rows, *state]:
            mark(t)

    def _loss(self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
        with autocast(self.device, self.amp):
            logits = self.graph.forward(params, x)
        logits = logits.float()
        loss = self.groups(logits, y)
        return loss.sum(), (loss.detach(), logits.detach())

    def _step(self, index: torch.Tensor, stats: Any) -> None:
        x, y = self.source.take(index)
        params = self.graph.params
        grads, (_, (loss, logits)) = grad_and_value(self._loss, has_aux=True)(params, x, y)
        stats.update(logits, y, torch.where(self.mean_rows, loss * y.shape[1], loss))
        self._sgd([params[k] for k in self.names], [grads[k] for k in self.names])

    @torch.no_grad()
    def _sgd(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """Per-lane clipping (as :meth:`PackedModel.step
        <torchcal.train.stacks.PackedModel.step>`) and ``torch.optim.SGD``'s update, in place
        on the stacked parameters and momentum buffers."""
        n = self.graph.n_lanes
        if self.max_norm is not None:
            norms = torch.stack([torch.linalg.vector_norm(g.reshape(n, -1), 2.0, dim=1)
                                 for g in grads])
            coef = (self.max_norm / (torch.linalg.vector_norm(norms, 2.0, dim=0) + 1e-6)
                    ).clamp(max=1.0)
            grads = [g * coef.view(n, *([1] * (g.dim() - 1))).to(g.dtype) for g in grads]
        for j, (p, g) in enumerate(zip(params, grads, strict=True)):
            d = g.add(p, alpha=self.weight_decay) if self.weight_decay else g
            if self.momentum:
                buf = self.momenta[j]
                buf.mul_(self.momentum).add_(d, alpha=1.0 - self.dampening)
                d = d.add(buf, alpha=self.momentum) if self.nesterov else buf
            p.sub_(self.lr.to(p.dtype) * d)

    def __call__(self, index: torch.Tensor, stats: Any) -> bool:
        """One step of every lane; False when the step cannot compile (the caller then runs
        the eager step; the reason was warned once and the pack stays eager)."""
        if self.failed is not None:
            return False
        lr = float(self.graph.sgd["lr"])
        if lr != self._lr_host:  # the schedule moved: one fill, no recompilation
            self.lr.fill_(lr)
            self._lr_host = lr
        self._static(stats)
        try:
            with _cpu_codegen_workaround() if self.device.type == "cpu" else \
                    contextlib.nullcontext():
                self._fn(index, stats)
        except Exception as exc:  # noqa: BLE001 - compilation failed: eager, said once
            self.failed = _reason(exc)
            warnings.warn(f"the packed step trains eagerly: it did not compile ({self.failed})",
                          CompiledStepWarning, stacklevel=2)
            return False
        return True


def _reason(exc: BaseException) -> str:
    """One line naming why compilation failed (the backend's own error, when it wraps one)."""
    cause = getattr(exc, "inner_exception", None) or exc.__cause__ or exc
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    what = type(exc).__name__ if cause is exc else f"{type(exc).__name__}, {type(cause).__name__}"
    return f"{what}: {lines[0][:200] if lines else ''}"


def _wanted(setting: str, device: torch.device) -> bool:
    if setting not in COMPILE_STEP:
        raise ValueError(f"Expected `compile_step` to be one of {COMPILE_STEP}, got {setting!r}")
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


def make_compiled_step(stack: Stack, groups: LossGroups, batches: Any, setting: str,
                       max_norm: float | None, amp: str = "off",
                       backend: str = "inductor") -> CompiledStep | None:
    """The compiled step of ``stack`` when ``setting`` (``TrainConfig.compile_step``) asks for
    one and the pack allows it; None for the eager step (with a :class:`CompiledStepWarning`
    naming the reason when one was asked for and cannot be had; none for a stack without a
    :meth:`~torchcal.train.stacks.Stack.graph`, a run alone, whose own ``compile`` option
    compiles its model)."""
    device = groups.device
    if not _wanted(setting, device) or stack.graph() is None:
        return None
    why = compile_problem(stack, groups, bool(getattr(batches, "shared", False)))
    if why is not None:
        warnings.warn(f"the packed step trains eagerly: {why}", CompiledStepWarning,
                      stacklevel=2)
        return None
    return CompiledStep(stack, groups, batches.src, max_norm, amp, backend)
