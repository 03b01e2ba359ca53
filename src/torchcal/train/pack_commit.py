"""A pack's epoch commits as one: staged checkpoints, their reconciliation on resume, and the
pack's layout (which run is which lane) that a resume rebuilds.

Why: a packed lane's numbers depend on the pack it trains in (a batched convolution over M
lanes may round differently from one over M - 1), so a lane must resume in the very pack
it trained in, at the epoch its companions resume from:

* **Staged checkpoints.**  At a checkpoint epoch every live lane writes
  ``checkpoints/next.pt`` (verified, fsynced; the log is fsynced with it), and only when all of
  them are written is each moved onto ``last.pt`` (:func:`torchcal._io.replace_verified`).  A
  kill while the files are staged leaves every ``last.pt`` at the previous checkpoint; a kill
  while they are moved leaves some lanes' ``last.pt`` at the new one and the others'
  ``next.pt`` complete.  :func:`reconcile_staged` (run when a pack is opened again) finishes
  the move when every writer of that epoch has its new checkpoint in one of the two places,
  and otherwise drops the staged files: the lanes resume from one common epoch.
* **Layout.**  Each checkpoint records the pack's lanes (their run directories in pack
  order, under the checkpoint's ``"slots"`` key) and the writers of that epoch.  A lane that
  diverged (or failed) stays in its place as a *ghost* until the pack ends - it is computed but
  never logged or checkpointed - so its companions keep their pack size; a resume puts a ghost
  back in the place of every lane whose run does not resume with the pack
  (:func:`ghost_run`); a ghost that cannot be built stops the pack with an error, never a
  pack of another size.
* **Writer.**  The files of an epoch (every lane's log line, ``best.pt``, staged checkpoint
  and the commit) are written by :class:`EpochWriter`, one background thread that takes the
  epoch's host copy and writes the jobs in the order they came, so that the next epoch's steps
  run meanwhile.  The order of the writes, their fsyncs and the commit are those above, so a
  kill leaves what it left before: a job not yet written is an epoch not yet committed.
"""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import replace_verified
from ..errors import CheckpointError, TorchcalError
from ..run_dir import RunDir
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig
from .run import build_optimizer

__all__ = ["STAGED", "staged_path", "stage_checkpoint", "commit_staged", "reconcile_staged",
           "pack_layout", "ghost_run", "EpochJob", "EpochWriter"]

#: The file name of a staged checkpoint (beside ``last.pt``).
STAGED = "next.pt"


def staged_path(run_dir: str | os.PathLike) -> Path:
    """``RUN_DIR/checkpoints/next.pt``."""
    return RunDir(run_dir).checkpoint_dir / STAGED


def stage_checkpoint(run_dir: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` as the run's staged checkpoint (verified and durable, with the log)."""
    rdir = RunDir(run_dir)
    rdir.sync_log()
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
    """The lanes' run directories recorded in a checkpoint (its ``"slots"``; None: a new
    run, or one written before layouts)."""
    record = (state or {}).get("pack") or {}
    dirs = record.get("slots") if isinstance(record, dict) else None
    if not (isinstance(dirs, (list, tuple)) and dirs and all(isinstance(d, str) for d in dirs)):
        return None  # no layout (or not one this reader can trust): the pack of the configs given
    return tuple(dirs)


def ghost_run(template: Any, config: TrainConfig, build_loss: Any) -> Any:
    """A ghost for a lane whose run is not trained here: ``template``'s run (a live lane
    of the same pack: same model, data and schedule) with ``config``'s loss and seed, its own
    copy of the model, a fresh optimiser and schedule
    (:func:`~torchcal.train.run.build_optimizer`, as a run's).  It writes nothing."""
    if config.model != template.config.model:
        raise TorchcalError(f"Lane {config.out_dir!r} trained model {config.model!r}, "
                            f"not {template.config.model!r}")
    r = copy.copy(template)
    r.config = config
    r.model = copy.deepcopy(template.model)
    r.loss_fn = build_loss(config, template.num_classes).to(template.device)
    r.optimizer, r.scheduler = build_optimizer(r.model, config, template.plugin,
                                               config.epochs * template.n_batches)
    r.dir = RunDir(config.out_dir)
    r.best, r.best_snapshot = {}, None
    return r


# ------------------------------------------------------------------------------------------
# the writer: an epoch's files written off the training thread
# ------------------------------------------------------------------------------------------
@dataclass
class EpochJob:
    """One epoch's writing: ``write()`` writes every lane's files from the epoch's host copy
    and returns ``[(lane, error)]`` for the lanes whose files failed (they stop, the
    others go on); any other exception it raises stops the training."""

    epoch: int
    write: Callable[[], list[tuple[Any, BaseException]]]


#: How often an idle epoch writer looks at its queue (seconds).
_POLL_S = 0.05


class EpochWriter:
    """Writes the epochs' jobs in order on one background thread (``threaded=False``: in the
    caller's thread, at :meth:`submit`).

    A lane's failed write is handed back by :meth:`failures` (the engine stops that
    lane); an exception that escapes a job (a bug, ``KeyboardInterrupt`` raised in it) stops
    the writer, whose pending jobs are dropped, and is raised again in the training thread by
    the next :meth:`submit`, :meth:`drain` or :meth:`close`.  At most ``depth`` jobs wait
    (their host copies are the memory a writer holds): :meth:`submit` blocks beyond.
    """

    def __init__(self, threaded: bool = True, depth: int = 2) -> None:
        self.threaded = threaded
        self._jobs: queue.Queue[EpochJob | None] = queue.Queue(maxsize=depth)
        self._failures: list[tuple[Any, BaseException]] = []
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._stopped = False  # a job raised: the thread drops what is still queued
        self._thread: threading.Thread | None = None

    def _write(self, job: EpochJob) -> None:
        failed = job.write()
        with self._lock:
            self._failures.extend(failed)

    def _loop(self) -> None:
        if hasattr(signal, "pthread_sigmask"):  # Ctrl-C and SIGTERM go to the training thread,
            # which alone can raise them, so that where it holds them back they wait
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        while True:
            try:
                # polled: a Ctrl-C or SIGTERM in the training thread can land in ``put`` after
                # the job is queued and before this thread is woken; a wake-up that never
                # comes costs one poll here, not a ``close`` that waits for ever
                job = self._jobs.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            try:
                if job is None:
                    return
                if not self._stopped:  # after an error, the pending jobs are dropped
                    self._write(job)
            except BaseException as exc:  # noqa: BLE001 - raised again in the training thread
                self._error, self._stopped = exc, True
            finally:
                # ValueError: the interrupted ``put`` had queued the job but not counted it
                with contextlib.suppress(ValueError):
                    self._jobs.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, job: EpochJob) -> None:
        """Queue ``job`` (raising first an error of an earlier job)."""
        self._raise()
        if not self.threaded or self._stopped:  # (stopped: a later job is written here)
            self._write(job)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="torchcal-epoch-writer",
                                            daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def failures(self) -> list[tuple[Any, BaseException]]:
        """The lanes whose files failed since the last call, with their errors."""
        with self._lock:
            out, self._failures = self._failures, []
        return out

    def drain(self) -> None:
        """Wait until every submitted job is written; raise an error of one of them."""
        if self._thread is not None:
            self._jobs.join()
        self._raise()

    def close(self) -> None:
        """Drain, then end the thread (:meth:`drain`'s error raised after the thread ended)."""
        try:
            if self._thread is not None and self._thread.is_alive():
                self._jobs.join()
                self._jobs.put(None)
                self._thread.join()
        finally:
            self._thread = None
            self._raise()
