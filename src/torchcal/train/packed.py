"""Packed training: several runs that share a model and a recipe trained as one packed model.

A benchmark trains the same network many times (the seeds of a loss, and several losses).  One
small network leaves most of a GPU idle and pays Python's and the kernels' fixed costs once per
step; :func:`train_lanes` trains M such runs ("lanes"; the runs of one pack, formed by
:func:`torchcal.train.packs.form_packs`; :func:`torchcal.train.packs.train_packed` and
:func:`torchcal.train.packs.train_pack` call it) together: their parameters are stacked
along a leading lane dimension and the M forward and backward passes run as one batched pass
(``torch.func.vmap`` over ``functional_call``, chosen by measurement,
``benchmarks/results/packing.md``).

Each lane is a run in every other respect, built by the steps of a run alone
(:mod:`torchcal.train.run`) and trained by the one engine (:mod:`torchcal.train.engine`) with
a :class:`~torchcal.train.stacks.PackedModel`: its initialisation and data order come from its seed (the same
weights and batches as ``train(config)`` with that seed), it has its own loss object (AdaFocal's
per-bin γ, a temperature-aware loss' T), its own gradient-norm clipping, its own SGD state (one
SGD over the stacked parameters equals M separate SGDs: every operation of SGD with momentum,
weight decay and Nesterov is elementwise; the lanes share the learning-rate schedule), its own
validation pass, log, checkpoints, run directory (the format of :mod:`torchcal.run_dir`) and final
evaluation.  Each lane's ``nn.Module`` holds views of its slice of the stacked tensors, so the
per-run steps (evaluation, checkpointing) read the packed values without copies.

Resume works per lane: lanes whose checkpoints are at the same epoch are packed together.
A lane whose training loss becomes non-finite stops alone with
:class:`LaneDivergedError` at the end of that epoch (the lanes' computations never mix, so a
non-finite lane leaves the others' numbers unchanged); an error of one lane's loss or
evaluation stops that lane only.  Ctrl-C stops every lane at its last checkpoint, as it
stops a run.

No host synchronisation is added per step: the lanes' losses, statistics and gradient norms
stay on the device until the end of the epoch, as in :func:`~torchcal.train.train`.

Not packable (:func:`torchcal.train.packs.pack_problem` says why; such runs train with :func:`~torchcal.train.train`):
the joint uncertainty head, ``compile``, fp16 AMP (one loss scaler would couple the lanes),
TensorBoard logging, ``torchrun`` (DDP), and models with dropout (one random stream for every
lane).  A lane's log line counts in ``seconds`` its share of the pack's training and
validation time plus its own evaluation and checkpoint.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._io import exclusive_lock
from ..errors import CheckpointError, LaneDivergedError, TorchcalError
from .build import data_seed
from .config import TrainConfig
from .distributed import DistEnv
from .engine import Lane, run_stack
from .evaluation import read_config
from .pack_commit import ghost_run, pack_layout, reconcile_staged
from .run import build_loss, build_run, build_sources, device_and_amp, resume_state
from .stacks import PackedModel
from .trainer import fit

__all__ = ["train_lanes", "LaneDivergedError"]

def _has_dropout(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def _open_lanes(configs: Sequence[TrainConfig], group: list[int], stack: contextlib.ExitStack,
                  results: list[Any], locked_by_caller: bool = False
                  ) -> list[tuple[Lane, tuple[str, ...] | None]]:
    """Lock (unless ``locked_by_caller``: the caller holds every run directory's lock), check
    and build each lane of ``group`` as :func:`~torchcal.train.train` does (finishing or
    dropping a killed pack's staged checkpoints first, then resuming its checkpoint), with the
    pack layout its checkpoint records; a lane that fails here gets its error in
    ``results``."""
    env, locked, opened, data = DistEnv(), [], [], {}
    for i in group:
        try:
            if not locked_by_caller:
                stack.enter_context(exclusive_lock(configs[i].out_dir))
            locked.append(i)
        except Exception as exc:  # noqa: BLE001 - this lane fails, the pack goes on
            results[i] = exc
    reconcile_staged([configs[i].out_dir for i in locked])
    for i in locked:
        cfg = configs[i]
        try:
            state = resume_state(cfg, env)
            key = data_seed(cfg)  # the split (digits: and noise) may follow the run's seed
            if key not in data:
                data[key] = build_sources(cfg, device_and_amp(cfg, env)[0])
            r = build_run(cfg, env, state, data=data[key])
            if _has_dropout(r.model):
                raise ValueError(f"Run {cfg.out_dir!r}: model {cfg.model!r} has dropout, which a "
                                 "pack cannot draw per lane; train it with train()")
        except Exception as exc:  # noqa: BLE001 - this lane fails, the pack goes on
            results[i] = exc
            continue
        opened.append((Lane(i, r), pack_layout(state)))
    return opened


def _lane_config(out_dir: str, configs: Sequence[TrainConfig]) -> TrainConfig:
    """The config of the pack's lane in ``out_dir``: the one passed, else its
    :data:`~torchcal.run_dir.CONFIG_FILE`, read as every run's is
    (:func:`~torchcal.train.evaluation.read_config`; CheckpointError when neither can be had)."""
    for c in configs:
        if str(c.out_dir) == out_dir:
            return c
    try:
        return read_config(out_dir)
    except (OSError, TorchcalError) as exc:  # no config file, a malformed one, unreadable
        raise CheckpointError(f"its config was not passed and none can be read from "
                              f"{out_dir!r} ({type(exc).__name__}: {exc})") from exc


def _pack_lanes(layout: tuple[str, ...], mbs: list[Lane], configs: Sequence[TrainConfig]
                  ) -> list[Lane]:
    """The lanes of the pack recorded as ``layout``: ``mbs`` in their places, a ghost in the
    place of every run that does not resume here (CheckpointError naming it when its ghost
    cannot be built: a pack resumes at its recorded size or not at all)."""
    own = {str(mb.run.config.out_dir): mb for mb in mbs}
    lanes: list[Lane] = []
    for d in layout:
        if d in own:
            lanes.append(own.pop(d))
            continue
        try:
            ghost = ghost_run(mbs[0].run, _lane_config(d, configs), build_loss)
        except Exception as exc:  # noqa: BLE001 - raised again, naming the pack
            raise CheckpointError(
                f"Cannot resume the pack of {sorted(str(mb.run.config.out_dir) for mb in mbs)}: "
                f"its lane {d!r} (recorded in their checkpoints' pack layout) does not resume "
                f"with it and cannot be rebuilt as a ghost, so the pack would train at another "
                f"size: {exc}") from exc
        lanes.append(Lane(-1, ghost, ghost=True))
    return lanes + list(own.values())


def _packs(opened: list[tuple[Lane, tuple[str, ...] | None]], configs: Sequence[TrainConfig],
           group: list[int], results: list[Any]) -> list[list[Lane]]:
    """The packs to train: lanes at the same epoch with the same recorded layout, each in
    its place; a run of the layout that does not resume here is a ghost.  A pack whose ghost
    cannot be built is not trained: each of its lanes gets the error in ``results``."""
    default = tuple(str(configs[i].out_dir) for i in group)
    by_key: dict[tuple[int, tuple[str, ...]], list[Lane]] = {}
    for mb, layout in opened:
        by_key.setdefault((mb.run.start_epoch, layout or default), []).append(mb)
    packs = []
    for (_, layout), mbs in sorted(by_key.items(), key=lambda kv: kv[0][0]):
        try:
            packs.append(_pack_lanes(layout, mbs, configs))
        except CheckpointError as exc:
            for mb in mbs:
                results[mb.index] = exc
    return packs


def _packed_model(lanes: list[Lane], forward: str) -> PackedModel:
    runs = [mb.run for mb in lanes]
    return PackedModel([r.model for r in runs], [r.optimizer for r in runs], forward,
                       amp=runs[0].amp)


def train_lanes(configs: Sequence[TrainConfig], *, forward: str = "auto", locked: bool = False
                ) -> list[dict[str, Any] | BaseException]:
    """Train ``configs``, the runs of one :class:`~torchcal.train.packs.Pack` (formed and
    checked by :func:`~torchcal.train.packs.form_packs`, nothing is checked again here), as
    one packed model, one run per lane; a pack of one is trained as
    :func:`~torchcal.train.train` trains it.  Called by :mod:`torchcal.train.packs` only.

    Args:
        configs: the pack's runs, in lane order.
        forward: how the lanes' model runs (:data:`~torchcal.train.stacks.FORWARDS`).
        locked: the caller already holds each run directory's lock
            (:func:`torchcal._io.exclusive_lock`), so the runs are not locked again.

    Returns:
        For each config, the summary :func:`~torchcal.train.train` returns, or the exception
        that stopped that run alone.
    """
    results: list[Any] = [None] * len(configs)
    if configs:
        _train_group(list(configs), list(range(len(configs))), results, forward, locked)
    return results


def _train_alone(config: TrainConfig) -> dict[str, Any]:
    """:func:`~torchcal.train.train` of a run already checked (:func:`~torchcal.train.packs.
    form_packs` validated it), in this one process."""
    t_start = time.perf_counter()
    if config.num_threads is not None:
        torch.set_num_threads(int(config.num_threads))
    with exclusive_lock(config.out_dir):  # re-entered when the caller holds it
        summary = fit(config, DistEnv())
    summary["seconds"] = time.perf_counter() - t_start
    return summary


def _train_group(configs: Sequence[TrainConfig], group: list[int], results: list[Any],
                 forward: str, locked: bool = False) -> None:
    """Train the runs ``group`` of ``configs`` as one pack, their results in ``results``."""
    if len(group) == 1:  # alone (or not packable): the trainer itself
        try:
            results[group[0]] = _train_alone(configs[group[0]])
        except Exception as exc:  # noqa: BLE001 - reported in its place
            results[group[0]] = exc
        return
    t0 = time.perf_counter()
    if configs[group[0]].num_threads is not None:
        torch.set_num_threads(int(configs[group[0]].num_threads))
    with contextlib.ExitStack() as stack:
        opened = _open_lanes(configs, group, stack, results, locked)
        for lanes in _packs(opened, configs, group, results):
            run_stack(_packed_model(lanes, forward), lanes, results)
    for i in group:
        if isinstance(results[i], dict):
            results[i]["seconds"] = (time.perf_counter() - t0) / len(group)
