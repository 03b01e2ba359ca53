"""The job functions of benchmark runs: train one :class:`~torchcal.train.TrainConfig` run, or
one pack of runs, and check its evaluation, skipping finished work and resuming unfinished work.

A run's *spec* is a JSON-able dict: ``recipe``, ``loss``, ``loss_kwargs``, ``seed``, ``epochs``
(None: the recipe's), ``n_bins``, ``data_kwargs`` (declared options of the data set, e.g.
digits' ``noise_std``), ``run_dir`` and ``overrides``
(other TrainConfig fields).  :func:`run_spec` resolves it once, in the parent, into a typed
:class:`RunSpec` (its TrainConfig and the labels the report uses); :meth:`RunSpec.to_json` is
the spec again with that TrainConfig as a dict (``config``), what crosses a process or Ray
boundary, and :func:`train_job` makes it a :class:`~torchcal.experiments.runner.Job` whose
function is :func:`run_job`.  :func:`train_runs` is the one sequence of a job (lock, skip or
resume, train, retry a refused checkpoint, check the evaluation) for a pack and for a run alone
(a pack of one).

Workers receive resolved specs: a worker process or a Ray task trains the ``config`` it is
given and never looks the recipe up, so a recipe registered only in the parent process (a
notebook, a script, ``python -c``, a Ray driver) trains there as it would in the parent; the
recipe is resolved once per run, in the parent.

Which differences between the run directory and the spec retrain a run is read from the roles
of TrainConfig's fields (:func:`torchcal.train.config.changed_fields`): a changed *identity* or
*schedule* field trains the run afresh (a fresh run with these settings must give the reported
numbers), a changed *runtime* field does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import check_own_path, exclusive_lock
from ..errors import CheckpointError, ResultsFileError, TorchcalError
from ..evaluate import read_results
from ..run_dir import RunDir
from ..train import TrainConfig, get_recipe
from ..train.checkpoint import remove_stale_run_temp_files
from ..train.config import changed_fields, grouped_name
from ..train.device import is_cuda
from ..train.evaluation import read_config
from ..train.packed import train_pack
from .runner import Job, Resources, set_threads

__all__ = ["RunSpec", "run_spec", "train_config", "train_job", "run_job",
           "train_runs", "is_stale", "is_finished", "warn_untrusted_results", "clear_run_dir",
           "retrain_reason", "untrusted_results", "is_cuda", "spec_labels"]


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep, resolved once in the parent: its TrainConfig and the spec's fields
    the report and the job's labels use.  It becomes JSON (:meth:`to_json`) only where a job
    crosses to a worker process or a Ray task, and is read back there by :func:`run_spec`.

    Attributes:
        config: the run's resolved TrainConfig (:func:`train_config`).
        recipe, loss, loss_kwargs, seed, run_dir, n_bins: the spec's (labels of the report).
        epochs, data_kwargs, overrides: the spec's as given (``epochs`` None: the recipe's).
    """

    config: TrainConfig
    recipe: str
    loss: str
    loss_kwargs: Mapping[str, Any]
    seed: int
    run_dir: str
    n_bins: int = 15
    epochs: int | None = None
    data_kwargs: Mapping[str, Any] = field(default_factory=dict)
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.config, TrainConfig):
            raise TypeError(f"Expected `config` to be a TrainConfig, got "
                            f"{type(self.config).__name__}")
        if not getattr(self.config, "evaluate", True):
            raise ValueError("Expected the run's `overrides` not to set evaluate=False: a "
                             "benchmark run is evaluated at its last epoch (its results file "
                             f"is what the report reads), got it for {self.run_dir!r}")

    @property
    def labels(self) -> dict[str, Any]:
        """``{"run_dir", "loss", "seed"}``: what names the run in a job's result."""
        return {"run_dir": self.run_dir, "loss": self.loss, "seed": self.seed}

    def to_json(self) -> dict[str, Any]:
        """The JSON-able spec a worker receives: the spec's fields and ``config`` (the
        TrainConfig as a dict); :func:`run_spec` reads it back."""
        return {"recipe": self.recipe, "loss": self.loss, "loss_kwargs": dict(self.loss_kwargs),
                "seed": self.seed, "epochs": self.epochs, "n_bins": self.n_bins,
                "data_kwargs": dict(self.data_kwargs), "run_dir": self.run_dir,
                "overrides": dict(self.overrides), "config": self.config.to_dict()}


def run_spec(spec: RunSpec | Mapping[str, Any]) -> RunSpec:
    """``spec`` as a :class:`RunSpec`: one is returned as is, a JSON spec (resolved or not) is
    resolved here once (:func:`train_config`)."""
    if isinstance(spec, RunSpec):
        return spec
    if not isinstance(spec, Mapping):
        raise TypeError(f"Expected `spec` to be a RunSpec or a mapping, got {type(spec).__name__}")
    epochs = spec.get("epochs")
    return RunSpec(config=train_config(spec), recipe=spec["recipe"], loss=spec["loss"],
                   loss_kwargs=dict(spec["loss_kwargs"]), seed=spec["seed"],
                   run_dir=spec["run_dir"], n_bins=int(spec.get("n_bins", 15)),
                   epochs=None if epochs is None else int(epochs),
                   data_kwargs=dict(spec.get("data_kwargs") or {}),
                   overrides=dict(spec.get("overrides") or {}))


def spec_labels(spec: RunSpec | Mapping[str, Any]) -> dict[str, Any]:
    """``{"run_dir", "loss", "seed"}`` of a :class:`RunSpec` or a JSON spec (nothing resolved)."""
    if isinstance(spec, RunSpec):
        return spec.labels
    return {"run_dir": spec["run_dir"], "loss": spec["loss"], "seed": spec["seed"]}


def train_config(spec: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of a run spec: the recipe's, with the spec's loss, seed, run directory,
    epochs (milestones kept at the recipe's fractions), data options and overrides; one thread
    on the CPU, a checkpoint every tenth of the epochs, the last epoch evaluated.

    A resolved spec (:meth:`RunSpec.to_json`) is its ``config``, read without looking anything up
    (``ValueError`` when the spec's loss, seed, run directory or overrides were changed after
    it was resolved: drop ``config`` to resolve it again).
    """
    if spec.get("config") is not None:
        _check_resolved(spec)
        return TrainConfig.from_dict(dict(spec["config"]))
    cfg = get_recipe(spec["recipe"])
    fields = {f.name for f in dataclasses.fields(cfg)}
    upd: dict[str, Any] = {
        "loss": spec["loss"], "loss_kwargs": dict(spec["loss_kwargs"]), "seed": spec["seed"],
        "out_dir": spec["run_dir"], "device": "auto", "num_threads": 1, "progress": False,
    }
    if spec.get("epochs") is not None and int(spec["epochs"]) != cfg.epochs:
        # keep the recipe's schedule shape: milestones at the same fractions of training
        e = int(spec["epochs"])
        upd["epochs"] = e
        if not getattr(cfg, "milestone_fractions", None):  # else the trainer scales them
            upd["milestones"] = sorted({max(1, round(m * e / cfg.epochs)) for m in cfg.milestones
                                        if m < cfg.epochs})
    # the benchmark evaluates the last epoch only: no per-epoch test pass, no best checkpoint; a
    # checkpoint every tenth of the epochs (a few ms each): running the sweep again into the
    # same directory resumes an interrupted run from there instead of training it from epoch 0
    for k, v in (("eval_test_every", 0), ("select_best_by", "none"), ("resume", True),
                 ("checkpoint_every", max(1, upd.get("epochs", cfg.epochs) // 10)),
                 ("evaluate", True),
                 ("n_bins", int(spec.get("n_bins", 15)))):
        if k in fields:
            upd[k] = v
    if "data_kwargs" in fields:
        dk = dict(cfg.data_kwargs or {})
        dk.update(spec.get("data_kwargs") or {})
        upd["data_kwargs"] = dk
    upd.update(spec.get("overrides") or {})
    unknown = sorted(set(upd) - fields)
    if unknown:
        moved = {k: grouped_name(TrainConfig, k) for k in unknown}
        hint = "".join(f"; `{k}` is `{w}`" for k, w in moved.items() if w)
        raise ValueError(f"TrainConfig has no field(s) {unknown}{hint}")
    for k, v in upd.items():  # a plug-in group as a dict: its fields over the recipe's
        if isinstance(v, Mapping) and dataclasses.is_dataclass(getattr(cfg, k)):
            upd[k] = dataclasses.replace(getattr(cfg, k), **v)
    return dataclasses.replace(cfg, **upd)


def _check_resolved(spec: Mapping[str, Any]) -> None:
    """Refuse a resolved spec whose other fields no longer say what its ``config`` holds."""
    cfg = spec["config"]
    said = {"loss": spec.get("loss"), "loss_kwargs": spec.get("loss_kwargs"),
            "seed": spec.get("seed"), "out_dir": spec.get("run_dir"),
            **(spec.get("overrides") or {})}
    for k, v in said.items():
        if v is not None and k in cfg and json.dumps(v, sort_keys=True) != json.dumps(
                cfg[k], sort_keys=True):
            name = ("run_dir" if k == "out_dir" else k if k in ("loss", "loss_kwargs", "seed")
                    else f"overrides[{k!r}]")
            raise ValueError(f"Expected the run spec's `config` to be resolved from its other "
                             f"fields, got {name} = {v!r} but config[{k!r}] = {cfg[k]!r} (drop "
                             "`config` to resolve the spec again)")


def train_job(spec: RunSpec | Mapping[str, Any], *,
              fn: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
              gpus: float | None = None) -> Job:
    """The :class:`~torchcal.experiments.runner.Job` of the run ``spec`` (a :class:`RunSpec`,
    or a JSON spec resolved here, :func:`run_spec`): named ``"LOSS seed N"``, executed by
    ``fn`` (default :func:`run_job`) on the spec as JSON (:meth:`RunSpec.to_json`), asking for
    one CPU and ``gpus`` GPUs (None: one when the run's device is CUDA, :func:`is_cuda`; the
    demo's runs are CPU runs)."""
    rs = run_spec(spec)
    if gpus is None:
        gpus = 1.0 if is_cuda(rs.config.device) else 0.0
    # a JSON spec keeps its other keys (a custom job function's arguments)
    js = rs.to_json() if spec is rs else {**spec, "config": rs.config.to_dict()}
    return Job(name=f"{rs.loss} seed {rs.seed}", fn=fn or run_job, spec=js,
               labels=rs.labels, resources=Resources(cpus=1.0, gpus=float(gpus)))


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


def is_finished(run_dir: str | Path, config: TrainConfig) -> bool:
    """Whether ``run_dir`` holds this run's evaluated last epoch (a rerun skips it)."""
    try:  # verified: its SHA-256, the run it belongs to, the logits it was computed from
        res = read_results(RunDir(run_dir).results())
        meta = res["meta"]
        return (int(meta["epoch"]) == config.epochs and meta.get("checkpoint") == "last"
                and int(res["n_bins"]) == config.n_bins
                and meta.get("loss") == config.loss and meta.get("seed") == config.seed
                and RunDir(run_dir).has_checkpoint("last"))
    except (OSError, ValueError, TypeError, KeyError):
        return False


def untrusted_results(run_dir: str | Path) -> str:
    """Why a run's ``results.json`` cannot be trusted (edited after it was written, copied
    from another run, computed from other logits; :func:`torchcal.evaluate.read_results`),
    '' when it can or there is none."""
    p = RunDir(run_dir).results()
    if not os.path.lexists(p):
        return ""
    try:
        read_results(p)
    except ResultsFileError as exc:
        return str(getattr(exc, "reason", exc))
    return ""


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


def run_job(spec: RunSpec | Mapping[str, Any]) -> dict[str, Any]:
    """Train one (loss, seed) run and evaluate it (in a worker process or task): the run as a
    pack of one (:func:`train_runs`).

    A run whose directory already holds its evaluated last epoch is skipped (``"skipped":
    True``); an unfinished one resumes from its last checkpoint; one of other settings
    (:func:`is_stale`) is trained afresh.

    Returns ``{"run_dir", "loss", "seed", "seconds", "error", "skipped"}`` (``error`` None on
    success; with ``"traceback"`` on failure).
    """
    t0 = time.perf_counter()
    out = {"run_dir": spec["run_dir"], "loss": spec["loss"], "seed": spec["seed"],
           "error": None, "skipped": False}
    try:
        set_threads(1)
        (res,) = train_runs([run_spec(spec)])
        out.update({k: v for k, v in res.items() if k in ("error", "traceback", "skipped")})
    except Exception as exc:  # reported, the other runs go on
        _error(out, exc)
    out["seconds"] = time.perf_counter() - t0
    return out


def _error(out: dict[str, Any], exc: BaseException) -> None:
    out["error"] = f"{type(exc).__name__}: {exc}"
    out["traceback"] = "".join(traceback.format_exception(exc))


def _prepare(spec: RunSpec, out: dict[str, Any]) -> bool:
    """Whether the locked run ``spec`` is left to train: a killed writer's temp files removed,
    a run of other settings cleared, a finished one skipped (``out["skipped"]``)."""
    run_dir = Path(spec.run_dir)
    remove_stale_run_temp_files(run_dir)  # a killed writer's, also of a finished run
    if is_stale(run_dir, spec.config):
        clear_run_dir(run_dir)  # this sweep's directory, from a run with other settings
    elif is_finished(run_dir, spec.config):
        out["skipped"] = True
        return False
    else:
        warn_untrusted_results(run_dir)
    return True


def _train_and_retry(specs: Sequence[RunSpec]) -> list[Any]:
    """Train ``specs`` as one pack; a run whose directory holds a checkpoint of other settings
    or a broken one (CheckpointError) is cleared and trained afresh, never reported under these
    settings.  One result per spec: train()'s summary or the exception that stopped the run."""
    res = train_pack([s.config for s in specs], locked=True)
    retry = [i for i, r in enumerate(res) if isinstance(r, CheckpointError)]
    for i in retry:
        clear_run_dir(Path(specs[i].run_dir), retrain_reason(res[i]))
    if retry:
        again = train_pack([specs[i].config for i in retry], locked=True)
        for i, r in zip(retry, again, strict=True):
            res[i] = r
    return res


def train_runs(specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
    """Train the runs ``specs`` (one pack, formed by the caller:
    :func:`~torchcal.experiments.packed.pack_jobs`; a run alone is a pack of one) and evaluate
    them: each run directory is locked once for the whole sequence, a finished run skipped,
    an unfinished one resumed, one of other settings trained afresh, one whose checkpoint is
    refused retrained from epoch 0.  The runs must form one pack
    (:func:`~torchcal.train.packed.train_pack`); they train on this process's threads (the job
    functions, :func:`run_job` and :func:`~torchcal.experiments.packed.run_packed_job`, set
    one).

    Returns:
        One result per spec, in order: ``{"run_dir", "loss", "seed", "error", "skipped",
        "packed"}`` (``error`` None on success, with ``"traceback"`` on failure; ``packed``:
        the runs trained, not skipped).
    """
    specs = list(specs)
    out = [{**s.labels, "error": None, "skipped": False} for s in specs]
    todo: list[int] = []
    with contextlib.ExitStack() as stack:
        for i, s in enumerate(specs):
            try:
                stack.enter_context(exclusive_lock(s.run_dir))  # held until evaluated
                if _prepare(s, out[i]):
                    todo.append(i)
            except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
                _error(out[i], exc)
        res = _train_and_retry([specs[i] for i in todo]) if todo else []
        for i, r in zip(todo, res, strict=True):
            try:
                if isinstance(r, BaseException):
                    raise r
                if not RunDir(specs[i].run_dir).results().is_file():
                    raise ResultsFileError(f"Run {specs[i].run_dir!r} finished without writing "
                                           "its results file")
            except Exception as exc:  # noqa: BLE001 - this run failed, the others are reported
                _error(out[i], exc)
    for o in out:
        o["packed"] = len(todo)
    return out


def warn_untrusted_results(run_dir: Path) -> None:
    """Warn (one line) when an untrusted ``results.json`` is about to be recomputed: the run's
    last checkpoint is evaluated again (its logits rewritten from the model)."""
    problem = untrusted_results(run_dir)
    if problem:
        warnings.warn(f"{problem}: recomputed from the run's checkpoint", UserWarning,
                      stacklevel=2)


def retrain_reason(exc: BaseException) -> str:
    """The clause of :func:`clear_run_dir`'s warning for a run whose checkpoint was refused:
    the refusal, and that the run is retrained from epoch 0."""
    text = " ".join(str(exc).split())
    return f"cannot be resumed ({text[:300]}): the run is retrained from epoch 0"
