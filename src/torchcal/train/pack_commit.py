"""A pack's epoch commits as one: staged checkpoints, their reconciliation on resume, and the
pack's layout (which run sits in which slot) that a resume rebuilds.

Why: a packed member's numbers depend on the pack it trains in (a batched convolution over M
members may round differently from one over M - 1), so a member must resume in the very pack
it trained in, at the epoch its companions resume from:

* **Staged checkpoints.**  At a checkpoint epoch every live member writes
  ``checkpoints/next.pt`` (verified, fsynced; the log is fsynced with it), and only when all of
  them are written is each moved onto ``last.pt`` (:func:`torchcal._io.replace_verified`).  A
  kill while the files are staged leaves every ``last.pt`` at the previous checkpoint; a kill
  while they are moved leaves some members' ``last.pt`` at the new one and the others'
  ``next.pt`` complete.  :func:`reconcile_staged` (run when a pack is opened again) finishes
  the move when every writer of that epoch has its new checkpoint in one of the two places,
  and otherwise drops the staged files: the members resume from one common epoch.
* **Layout.**  Each checkpoint records the pack's slots (the members' run directories in pack
  order) and the writers of that epoch.  A member that diverged (or failed) stays in its slot
  as a *ghost* until the pack ends - it is computed but never logged or checkpointed - so its
  companions keep their pack size; a resume puts a ghost back into every slot whose run does
  not resume with the pack (:func:`ghost_run`).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._io import replace_verified
from ..errors import CheckpointError, TorchcalError
from ..runs import RunDir
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig
from .steps import SGD

__all__ = ["STAGED", "staged_path", "stage_checkpoint", "commit_staged", "reconcile_staged",
           "pack_layout", "ghost_run"]

#: The file name of a staged checkpoint (beside ``last.pt``).
STAGED = "next.pt"


def staged_path(run_dir: str | os.PathLike) -> Path:
    """``RUN_DIR/checkpoints/next.pt``."""
    return RunDir(run_dir).checkpoint_dir / STAGED


def stage_checkpoint(run_dir: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` as the run's staged checkpoint (verified and durable, with the log)."""
    run = RunDir(run_dir)
    run.sync_log()
    return save_checkpoint(staged_path(run_dir), state)


def commit_staged(run_dirs: Sequence[str | os.PathLike]) -> None:
    """Move every staged checkpoint onto its ``last.pt`` (call once all are staged)."""
    for d in run_dirs:
        replace_verified(staged_path(d), RunDir(d).checkpoint("last"))


def _epoch_and_meta(path: Path) -> tuple[int, dict[str, Any]] | None:
    """A checkpoint's epoch and pack record, None when it is absent or unreadable."""
    if not path.is_file():
        return None
    try:
        state = load_checkpoint(path, map_location="cpu")
    except (CheckpointError, OSError):
        return None
    return int(state["epoch"]), dict(state.get("pack") or {})


def reconcile_staged(run_dirs: Sequence[str | os.PathLike]) -> None:
    """Finish or drop the staged checkpoints of ``run_dirs`` (module docstring): the commit of
    epoch E completes when every writer named by a staged E checkpoint has E in ``next.pt``
    or in ``last.pt``; else every staged E checkpoint is removed."""
    staged = {str(d): _epoch_and_meta(staged_path(d)) for d in run_dirs}
    staged = {d: v for d, v in staged.items() if v is not None}
    for d in run_dirs:  # a torn or unverifiable staged file is no checkpoint
        if str(d) not in staged:
            _remove_staged(d)
    by_epoch: dict[int, list[str]] = {}
    for d, (epoch, _) in staged.items():
        by_epoch.setdefault(epoch, []).append(d)
    for epoch, dirs in by_epoch.items():
        writers = set(dirs)
        for d in dirs:
            named = staged[d][1].get("writers")
            if isinstance(named, (list, tuple)):
                writers.update(str(w) for w in named)
        complete = all(_has_epoch(w, epoch, staged) for w in writers)
        for d in dirs:
            if complete:
                commit_staged([d])
            else:
                _remove_staged(d)


def _has_epoch(run_dir: str, epoch: int, staged: dict[str, tuple[int, dict[str, Any]]]) -> bool:
    if run_dir in staged and staged[run_dir][0] == epoch:
        return True
    last = _epoch_and_meta(RunDir(run_dir).checkpoint("last"))
    return last is not None and last[0] == epoch


def _remove_staged(run_dir: str | os.PathLike) -> None:
    p = staged_path(run_dir)
    for f in (p, p.with_name(p.name + ".sha256")):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()


def pack_layout(state: dict[str, Any] | None) -> tuple[str, ...] | None:
    """The slots recorded in a checkpoint (None: a new run, or one written before layouts)."""
    record = (state or {}).get("pack") or {}
    slots = record.get("slots") if isinstance(record, dict) else None
    if not (isinstance(slots, (list, tuple)) and slots and all(isinstance(s, str) for s in slots)):
        return None  # no layout (or not one this reader can trust): the pack of the configs given
    return tuple(slots)


def ghost_run(template: Any, config: TrainConfig, build_loss: Any) -> Any:
    """A ghost for a slot whose run is not trained here: ``template``'s run (a live member of
    the same pack: same model, data and schedule) with ``config``'s loss and seed, its own copy
    of the model, a fresh optimiser and schedule.  It writes nothing."""
    if config.model != template.config.model:
        raise TorchcalError(f"Slot {config.out_dir!r} trained model {config.model!r}, "
                            f"not {template.config.model!r}")
    r = copy.copy(template)
    r.config = config
    r.model = copy.deepcopy(template.model)
    r.loss_fn = build_loss(config, template.num_classes).to(template.device)
    g = template.optimizer.param_groups[0]
    r.optimizer = SGD(r.model.parameters(), lr=g["lr"], momentum=g["momentum"],
                      weight_decay=g["weight_decay"], nesterov=g["nesterov"])
    r.scheduler = torch.optim.lr_scheduler.MultiStepLR(
        r.optimizer, milestones=config.effective_milestones(), gamma=config.lr_gamma)
    r.run = RunDir(config.out_dir)
    r.best, r.best_snapshot = {}, None
    return r
