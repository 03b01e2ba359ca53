"""Packs: runs formed into packs once (:func:`form_packs`) and trained by one sequence
(:func:`train_pack`).

A run is a resolved :class:`~torchcal.train.TrainConfig`; a **pack** (:class:`Pack`) is one or
more runs that train as one model (:mod:`torchcal.train.packed`), each run in its own *lane*.
A run alone is a pack of one.  Runs whose configs differ only in :data:`LANE_FIELDS` (seed,
loss, loss arguments, run directory, ...) and are packable (:func:`pack_problem`) may share a
pack; :func:`form_packs` is the one place where packs are formed, and a :class:`Pack` is never
made elsewhere.

:func:`train_pack` is the one sequence of a sweep's work, for a pack and for a run alone:

1. lock every run directory (:func:`torchcal._io.exclusive_lock`) for the whole sequence;
2. skip a run whose directory holds its evaluated last epoch (:func:`is_finished`);
3. clear a run of other settings (:func:`is_stale`: a changed *identity* or *schedule* field,
   :func:`torchcal.train.config.changed_fields`) so that it trains afresh;
4. resume the others from their last checkpoint and train them as one pack;
5. retry, from epoch 0, a run whose checkpoint is refused (:class:`~torchcal.errors.CheckpointError`);
6. check that every evaluated run wrote its results file.

It returns one :class:`RunOutcome` per run, a frozen record that crosses a process or a Ray
boundary as JSON (:meth:`RunOutcome.to_json`, :meth:`RunOutcome.from_json`).  Every caller
(the demo's job function, the uncertainty suite, :func:`train_packed`) trains through it or
through the same forming, so there is one locking rule and one staleness rule.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import check_own_path, exclusive_lock
from ..errors import CheckpointError, ResultsFileError, TorchcalError
from ..results_file import read_results
from ..run_dir import RunDir
from .checkpoint import remove_stale_run_temp_files
from .config import TrainConfig, changed_fields
from .device import is_cuda
from .evaluation import read_config
from .packed import train_lanes
from .stacks import FORWARDS

__all__ = ["LANE_FIELDS", "CPU_PACK_SIZE", "Pack", "RunOutcome", "form_packs", "pack_problem",
           "train_pack", "train_packed", "is_stale", "is_finished", "untrusted_results",
           "warn_untrusted_results", "clear_run_dir", "retrain_reason"]

#: TrainConfig fields in which the runs of one pack may differ.
LANE_FIELDS = frozenset({"seed", "loss", "loss_kwargs", "loss_defaults", "reduction", "out_dir",
                         "resume", "progress", "num_threads"})
#: The most runs of one CPU pack in a sweep (one thread per worker process; measured,
#: ``benchmarks/results/packing.md``).
CPU_PACK_SIZE = 5


def pack_problem(config: TrainConfig) -> str | None:
    """Why ``config`` cannot train in a pack of several runs (None: it can)."""
    if config.joint_head.enabled:
        return "the joint uncertainty head is not packed"
    if config.multitask.tasks:
        return "a multi-task run is not packed"
    if config.compile:
        return "compile=True is not packed"
    if config.amp == "fp16":
        return "fp16 AMP's loss scaler would couple the lanes"
    if config.tensorboard:
        return "TensorBoard logging is not packed"
    return None


def _pack_key(config: TrainConfig) -> str:
    d = config.to_dict()
    d["milestones"] = config.effective_milestones()
    return repr(sorted((k, repr(v)) for k, v in d.items() if k not in LANE_FIELDS))


@dataclass(frozen=True)
class Pack:
    """Runs that train as one model, in lanes (made by :func:`form_packs` only).

    Attributes:
        configs: the runs, in lane order.
        positions: each run's index in the configs given to :func:`form_packs`.
        index: the pack's index among the packs :func:`form_packs` formed.
    """

    configs: tuple[TrainConfig, ...]
    positions: tuple[int, ...]
    index: int = 0

    @property
    def name(self) -> str:
        """``"ce seed 0"`` for a run alone, ``"pack 2 (ce 0, focal 0)"`` for several."""
        if len(self.configs) == 1:
            c = self.configs[0]
            return f"{c.loss} seed {c.seed}"
        runs = ", ".join(f"{c.loss} {c.seed}" for c in self.configs)
        return f"pack {self.index + 1} ({runs})"

    @property
    def cuda(self) -> bool:
        """Whether the pack trains on CUDA."""
        return is_cuda(self.configs[0].device)


def form_packs(configs: Sequence[TrainConfig], *, max_lanes: int | None = None) -> list[Pack]:
    """The packs of ``configs``: the one place where packs are formed.

    Each config is checked here, once (:meth:`TrainConfig.validate`; ``ValueError`` naming the
    first bad field).  Configs that differ only in :data:`LANE_FIELDS` and are packable
    (:func:`pack_problem`) form a group, in the order given; a config that cannot be packed is a
    pack of one.  A group is dealt round robin (seed-major: a pack mixes losses and seeds) into
    packs of at most ``max_lanes`` runs, as few as that takes.  ``max_lanes`` None: a sweep's
    default, at most :data:`CPU_PACK_SIZE` runs per CPU pack in an even number of packs (so
    that two workers finish together), every run of a group in one pack on a GPU.

    The packs depend on the configs alone (never on the executor's workers), so a run's
    numbers do not depend on the workers either; a pack of another size may round differently
    (the CPU's kernels block the packed batch by size).

    >>> from torchcal.train import TrainConfig
    >>> cs = [TrainConfig(loss=n, seed=s, out_dir=f"r/{n}{s}") for s in (0, 1) for n in ("ce", "focal")]
    >>> [p.positions for p in form_packs(cs)], [p.positions for p in form_packs(cs, max_lanes=4)]
    ([(0, 2), (1, 3)], [(0, 1, 2, 3)])
    """
    configs = list(configs)
    if max_lanes is not None and (isinstance(max_lanes, bool) or not isinstance(max_lanes, int)
                                  or max_lanes < 1):
        raise ValueError(f"Expected `max_lanes` to be a positive integer or None, got "
                         f"{max_lanes!r}")
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(configs):
        if not isinstance(cfg, TrainConfig):
            raise TypeError(f"Expected `configs` to hold TrainConfig, got {type(cfg).__name__}")
        cfg.validate()
        key = _pack_key(cfg) if pack_problem(cfg) is None else f"alone {i}"
        groups.setdefault(key, []).append(i)
    packs: list[Pack] = []
    for group in groups.values():
        cuda = is_cuda(configs[group[0]].device)
        size = max_lanes or (len(group) if cuda else CPU_PACK_SIZE)
        n_packs = math.ceil(len(group) / size)
        if max_lanes is None and not cuda:
            n_packs = min(len(group), 2 * math.ceil(n_packs / 2))
        for k in range(n_packs):
            lanes = tuple(group[k::n_packs])
            packs.append(Pack(tuple(configs[i] for i in lanes), lanes, len(packs)))
    return packs


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`train_pack` says of one run; JSON across a process or Ray boundary.

    Attributes:
        run_dir, loss, seed: the run (its config's ``out_dir``, ``loss`` and ``seed``).
        error: None on success, else one line (``"ValueError: ..."``).
        traceback: the error's traceback, None on success.
        skipped: the run was already finished (nothing trained).
        seconds: the run's share of its pack's wall time.
        lanes: the runs of its pack that trained (0: every run of the pack was skipped).
        results: the run's results (train()'s ``results``, or the finished run's verified
            ``results.json``) when :func:`train_pack` was asked to keep them, else None.

    >>> o = RunOutcome("runs/ce/seed0", "ce", 0, seconds=1.5, lanes=2)
    >>> RunOutcome.from_json(o.to_json()) == o
    True
    """

    run_dir: str
    loss: str
    seed: int
    error: str | None = None
    traceback: str | None = None
    skipped: bool = False
    seconds: float = 0.0
    lanes: int = 0
    results: Mapping[str, Any] | None = field(default=None, hash=False)

    @classmethod
    def failed(cls, config: TrainConfig, error: str) -> RunOutcome:
        """The outcome of a run that never reported (its worker died): ``error``."""
        return cls(str(config.out_dir), config.loss, int(config.seed), error=error)

    def to_json(self) -> dict[str, Any]:
        """The outcome as a JSON-able dict (:meth:`from_json` reads it back)."""
        return {"run_dir": self.run_dir, "loss": self.loss, "seed": self.seed,
                "error": self.error, "traceback": self.traceback, "skipped": self.skipped,
                "seconds": self.seconds, "lanes": self.lanes,
                "results": None if self.results is None else dict(self.results)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunOutcome:
        """The outcome :meth:`to_json` wrote (``TypeError`` naming a missing or unknown key)."""
        return cls(**dict(d))


def is_stale(run_dir: str | Path, config: TrainConfig) -> bool:
    """Whether ``run_dir`` holds a run trained with other settings than ``config``: an
    *identity* or *schedule* field differs (the fields' roles; a field the old ``config.json``
    lacks, written before the field existed, had its default).

    The trainer refuses a changed identity but extends a run to more epochs, which would
    report a model that a fresh run with these settings does not give (other milestones).
    """
    p = RunDir(run_dir).config
    if not p.is_file():
        return False
    try:
        old = read_config(run_dir)
    except (OSError, TorchcalError):  # unreadable or malformed: not this run's
        return True
    changed = changed_fields(old, config)
    return bool(changed["identity"] or changed["schedule"])


def _finished_results(run_dir: str | Path, config: TrainConfig) -> dict[str, Any] | None:
    """The verified results of this run's evaluated last epoch in ``run_dir``, None if none."""
    try:  # verified: its SHA-256, the run it belongs to, the logits it was computed from
        res = read_results(RunDir(run_dir).results())
        meta = res["meta"]
        done = (int(meta["epoch"]) == config.epochs and meta.get("checkpoint") == "last"
                and int(res["n_bins"]) == config.n_bins
                and meta.get("loss") == config.loss and meta.get("seed") == config.seed
                and RunDir(run_dir).has_checkpoint("last"))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return res if done else None


def is_finished(run_dir: str | Path, config: TrainConfig) -> bool:
    """Whether ``run_dir`` holds this run's evaluated last epoch (a rerun skips it)."""
    return _finished_results(run_dir, config) is not None


def untrusted_results(run_dir: str | Path) -> str:
    """Why a run's ``results.json`` cannot be trusted (edited after it was written, copied
    from another run, computed from other logits; :func:`torchcal.results_file.read_results`),
    '' when it can or there is none."""
    p = RunDir(run_dir).results()
    if not os.path.lexists(p):
        return ""
    try:
        read_results(p)
    except ResultsFileError as exc:
        return str(getattr(exc, "reason", exc))
    return ""


def warn_untrusted_results(run_dir: Path) -> None:
    """Warn (one line) when an untrusted ``results.json`` is about to be recomputed: the run's
    last checkpoint is evaluated again (its logits rewritten from the model)."""
    problem = untrusted_results(run_dir)
    if problem:
        warnings.warn(f"{problem}: recomputed from the run's checkpoint", UserWarning,
                      stacklevel=2)


_OTHER_SETTINGS = "holds a run of other settings"


def clear_run_dir(run_dir: Path, why: str = _OTHER_SETTINGS) -> list[Path]:
    """Remove the files torchcal wrote in a run directory (:meth:`torchcal.run_dir.RunDir.clear`:
    the names of :data:`torchcal.run_dir.OWN_NAMES`), keeping the lock file of its owner (this
    process) and everything torchcal did not write, which a warning names ("kept 2 files
    torchcal did not write: ...").  ``why`` says in that warning why the run was cleared.

    A run directory that is a symbolic link is refused
    (:class:`~torchcal.errors.UnsafePathError`): its target is not the run's.

    Returns:
        The paths kept.
    """
    run_dir = Path(run_dir)
    check_own_path(run_dir, "Run directory", directory=True)
    kept = RunDir(run_dir).clear()
    if kept or why != _OTHER_SETTINGS:  # a refused checkpoint is always said
        names = ", ".join(repr(p.name + ("/" if p.is_dir() and not p.is_symlink() else ""))
                          for p in kept[:5]) + (", ..." if len(kept) > 5 else "")
        keep = (f"; kept {len(kept)} file{'s' if len(kept) != 1 else ''} torchcal did not "
                f"write ({names})") if kept else ""
        warnings.warn(f"Run directory {str(run_dir)!r} {why}: torchcal's files removed{keep}",
                      UserWarning, stacklevel=2)
    return kept


def retrain_reason(exc: BaseException) -> str:
    """The clause of :func:`clear_run_dir`'s warning for a run whose checkpoint was refused:
    the refusal, and that the run is retrained from epoch 0."""
    text = " ".join(str(exc).split())
    return f"cannot be resumed ({text[:300]}): the run is retrained from epoch 0"


def _error(out: dict[str, Any], exc: BaseException) -> None:
    out["error"] = f"{type(exc).__name__}: {exc}"
    out["traceback"] = "".join(traceback.format_exception(exc))


def _prepare(config: TrainConfig, out: dict[str, Any]) -> bool:
    """Whether the locked run ``config`` is left to train: a killed writer's temp files removed,
    a run of other settings cleared, a finished one skipped (``out["skipped"]``)."""
    run_dir = Path(config.out_dir)
    remove_stale_run_temp_files(run_dir)  # a killed writer's, also of a finished run
    if is_stale(run_dir, config):
        clear_run_dir(run_dir)  # this sweep's directory, from a run with other settings
        return True
    done = _finished_results(run_dir, config)
    if done is not None:
        out["skipped"] = True
        out["results"] = done
        return False
    warn_untrusted_results(run_dir)
    return True


def _train_and_retry(configs: Sequence[TrainConfig], forward: str) -> list[Any]:
    """Train ``configs`` (one pack's runs left to train); a run whose directory holds a
    checkpoint of other settings or a broken one (CheckpointError) is cleared and trained
    afresh, never reported under these settings.  One result per config: train()'s summary
    or the exception that stopped the run."""
    res = train_lanes(configs, forward=forward, locked=True)
    retry = [i for i, r in enumerate(res) if isinstance(r, CheckpointError)]
    for i in retry:
        clear_run_dir(Path(configs[i].out_dir), retrain_reason(res[i]))
    if retry:
        again = train_lanes([configs[i] for i in retry], forward=forward, locked=True)
        for i, r in zip(retry, again, strict=True):
            res[i] = r
    return res


def _checked(config: TrainConfig, summary: Any) -> Mapping[str, Any] | None:
    """A trained run's results (its summary's), after checking that an evaluated run wrote its
    results file; raises what stopped the run."""
    if isinstance(summary, BaseException):
        raise summary
    if config.evaluate and not RunDir(config.out_dir).results().is_file():
        raise ResultsFileError(f"Run {str(config.out_dir)!r} finished without writing its "
                               "results file")
    return summary.get("results") if isinstance(summary, Mapping) else None


def train_pack(pack: Pack, *, forward: str = "auto", keep_results: bool = False
               ) -> list[RunOutcome]:
    """Train the runs of ``pack`` (:func:`form_packs`) by the one sequence (see the module
    docstring): lock, skip if finished, clear if stale, resume, train, retry a refused
    checkpoint, check the results file.  The runs train on this process's threads (a config's
    ``num_threads`` when set).

    Args:
        pack: the runs, formed by :func:`form_packs` (a run alone is a pack of one).
        forward: how a pack's model runs (:data:`~torchcal.train.stacks.FORWARDS`).
        keep_results: each outcome keeps the run's results (:attr:`RunOutcome.results`).

    Returns:
        One :class:`RunOutcome` per run, in lane order; an error of one run (a busy lock, a
        diverged run, a loss' error, ...) is that run's outcome, the others go on.

    Raises:
        KeyboardInterrupt: every run keeps its last committed checkpoint.
    """
    if not isinstance(pack, Pack):
        raise TypeError(f"Expected `pack` to be a Pack (form_packs), got {type(pack).__name__}")
    if forward not in FORWARDS:
        raise ValueError(f"Expected `forward` to be one of {FORWARDS}, got {forward!r}")
    t0 = time.perf_counter()
    configs = pack.configs
    out: list[dict[str, Any]] = [{"error": None, "skipped": False} for _ in configs]
    todo: list[int] = []
    with contextlib.ExitStack() as stack:
        for i, c in enumerate(configs):
            try:
                stack.enter_context(exclusive_lock(c.out_dir))  # held until evaluated
                if _prepare(c, out[i]):
                    todo.append(i)
            except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
                _error(out[i], exc)
        res = _train_and_retry([configs[i] for i in todo], forward) if todo else []
        for i, r in zip(todo, res, strict=True):
            try:
                out[i]["results"] = _checked(configs[i], r)
            except Exception as exc:  # noqa: BLE001 - this run failed, the others are reported
                _error(out[i], exc)
    seconds = (time.perf_counter() - t0) / len(configs)
    return [RunOutcome(str(c.out_dir), c.loss, int(c.seed), error=o["error"],
                       traceback=o.get("traceback"), skipped=o["skipped"], seconds=seconds,
                       lanes=len(todo),
                       results=o.get("results") if keep_results and o["error"] is None else None)
            for c, o in zip(configs, out, strict=True)]


def train_packed(configs: Sequence[TrainConfig], *, max_lanes: int | None = None,
                 forward: str = "auto") -> list[dict[str, Any] | BaseException]:
    """Train ``configs`` in packs (:func:`form_packs`): one result per config, in order.

    Unlike :func:`train_pack`, nothing is skipped or cleared: each run trains as
    :func:`~torchcal.train.train` would train it (resuming when its ``resume`` is set), with
    the runs that may share its pack.

    Args:
        configs: the runs; those that differ only in :data:`LANE_FIELDS` (seed, loss, loss
            arguments, run directory, ...) train together.
        max_lanes: the most runs in one pack (None: no limit); a group larger than that is
            dealt round robin into as few packs as it takes.
        forward: how the packs' model runs (:data:`~torchcal.train.stacks.FORWARDS`):
            ``"auto"`` loops over the lanes on the CPU and vmaps them on a GPU.

    A pack of one (a run alone, or one :func:`pack_problem` refuses) is trained as
    :func:`~torchcal.train.train` trains it.  Calling it again with the same configs resumes
    every run in the pack it trained in, from the epoch its companions resume from
    (:mod:`torchcal.train.pack_commit`), so a killed sweep ends with the numbers of an
    uninterrupted one.

    Returns:
        For each config, the summary :func:`~torchcal.train.train` returns, or the exception
        that stopped that run alone (:class:`~torchcal.train.packed.LaneDivergedError`,
        ``CheckpointError``, ``InUseError``, a loss' error, ...).

    Raises:
        KeyboardInterrupt: every run keeps its last committed checkpoint (resume continues it).
        ValueError: a bad config (:func:`form_packs`), or under ``torchrun`` (packing is for
            one process).
    """
    configs = list(configs)
    if forward not in FORWARDS:
        raise ValueError(f"Expected `forward` to be one of {FORWARDS}, got {forward!r}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("Packed training runs in one process; run torchrun with train()")
    if max_lanes is not None and (isinstance(max_lanes, bool)
                                    or not isinstance(max_lanes, int) or max_lanes < 1):
        raise ValueError(f"Expected `max_lanes` to be a positive integer, got {max_lanes!r}")
    results: list[Any] = [None] * len(configs)
    for pack in form_packs(configs, max_lanes=max_lanes or max(len(configs), 1)):
        for i, r in zip(pack.positions, train_lanes(pack.configs, forward=forward), strict=True):
            results[i] = r
    return results
