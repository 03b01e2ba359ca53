"""Training configuration: one dataclass, validated, round-tripped through ``config.json``.

A run is fully described by a :class:`TrainConfig`.  Named recipes
(:func:`torchcal.train.get_recipe`) return one with the papers' settings; the CLI's options and
:func:`dataclasses.replace` override single fields.

Each field declares its **role** beside its default (field metadata, in the spirit of
scikit-learn's ``_parameter_constraints``), and every rule that asks "does this field change
training?" reads it (:func:`changed_fields`); there is no second list:

* ``identity``: what is trained (data, model, loss and its arguments, seed, optimiser,
  reduction, clipping, precision, ...).  Resuming a run with a changed identity field is
  refused (:class:`~torchcal.errors.CheckpointError` naming the fields); a benchmark runner
  trains such a run afresh.
* ``schedule``: how long (``epochs``, the milestones).  A run resumes into more epochs (a
  changed milestone list warns: the checkpoint's scheduler is kept); a benchmark runner trains
  a run afresh, since an extended run is not a fresh run of the new length.
* ``runtime``: how it is run (device, threads, logging, checkpoint frequency, evaluation
  bins, ...).  Resuming with a changed runtime field warns (fields declared ``warn=False``, such as
  ``out_dir`` and ``resume``, differ on every resume and say nothing).

A field may declare ``value``, the name of a method giving the value compared instead of the
field (``loss_kwargs`` and ``loss_defaults`` compare the loss's effective arguments,
``milestones`` and ``milestone_fractions`` the effective milestones).

>>> sorted(f.name for f in dataclasses.fields(TrainConfig) if field_role(f) == "schedule")
['epochs', 'milestone_fractions', 'milestones']
>>> changed_fields(TrainConfig(), TrainConfig(reduction="sum", grad_clip=None, device="cpu"))
{'identity': ['grad_clip', 'reduction'], 'schedule': [], 'runtime': ['device']}
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from .._validation import check_scalar

__all__ = ["TrainConfig", "AMP_MODES", "SELECT_BEST_BY", "REDUCTIONS", "ROLES", "field_role",
           "changed_fields", "describe_fields"]

AMP_MODES = ("off", "bf16", "fp16")
SELECT_BEST_BY = ("ece", "nll", "error", "none")
REDUCTIONS = ("published", "mean", "sum")
#: The roles a TrainConfig field may have (module docstring).
ROLES = ("identity", "schedule", "runtime")
#: Data options that do not change the data (``verify`` only skips a checksum).
_DATA_KWARGS_IGNORED = ("verify",)


def _role(role: str, default: Any = dataclasses.MISSING, *, value: str | None = None,
          warn: bool = True, **kw: Any) -> Any:
    """A dataclass field with its role (and comparison method, warning flag) as metadata."""
    meta = {"role": role, "value": value, "warn": warn}
    return field(default=default, metadata=meta, **kw)


def identity(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A field that changes what is trained (resume refused when it changes)."""
    return _role("identity", default, **kw)


def schedule(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A field of the training schedule (a run extends to more epochs)."""
    return _role("schedule", default, **kw)


def runtime(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A field that changes how a run is computed or recorded, not what is trained."""
    return _role("runtime", default, **kw)


def field_role(f: dataclasses.Field) -> str | None:
    """The role a dataclass field declares (None: no role)."""
    return f.metadata.get("role")


def _compared(config: Any, f: dataclasses.Field) -> Any:
    """What a role check compares for field ``f``: its value method's result, JSON-normalised
    (tuples and lists alike, as in ``config.json``)."""
    method = f.metadata.get("value")
    v = getattr(config, method)() if method else getattr(config, f.name)
    return json.loads(json.dumps(v, default=str))


def changed_fields(old: TrainConfig, new: TrainConfig) -> dict[str, list[str]]:
    """The fields whose compared values differ between ``old`` and ``new``, by role (sorted
    names; of fields sharing a value method only the first is named).

    >>> changed_fields(TrainConfig(epochs=2), TrainConfig(epochs=3, out_dir="x"))
    {'identity': [], 'schedule': ['epochs'], 'runtime': ['out_dir']}
    """
    out: dict[str, list[str]] = {r: [] for r in ROLES}
    seen: set[str] = set()
    for f in dataclasses.fields(new):
        method = f.metadata.get("value")
        if method in seen:
            continue
        if method:
            seen.add(method)
        if _compared(old, f) != _compared(new, f):
            out[field_role(f)].append(f.name)
    return {r: sorted(v) for r, v in out.items()}


def describe_fields(config: TrainConfig, names: list[str]) -> str:
    """``"reduction='mean', grad_clip=2.0"``: the compared values of ``names`` in ``config``.

    >>> describe_fields(TrainConfig(), ["loss", "grad_clip"])
    "loss='ce', grad_clip=2.0"
    """
    fs = {f.name: f for f in dataclasses.fields(config)}
    return ", ".join(f"{n}={_compared(config, fs[n])!r}" for n in names)


def parse_task_weighting(text: str) -> tuple[str, tuple[float, float] | None]:
    """``("kendall", None)``, ``("equal", (1, 1))`` or ``("fixed", (W1, W2))`` from the text.

    >>> parse_task_weighting("fixed:1,0.5")
    ('fixed', (1.0, 0.5))
    """
    if text == "kendall":
        return "kendall", None
    if text == "equal":
        return "equal", (1.0, 1.0)
    if isinstance(text, str) and text.startswith("fixed:"):
        parts = text[len("fixed:"):].split(",")
        try:
            w = tuple(float(p) for p in parts)
        except ValueError:
            w = ()
        if len(w) == 2 and all(math.isfinite(v) and v >= 0 for v in w) and sum(w) > 0:
            return "fixed", (w[0], w[1])
    raise ValueError("Expected `task_weighting` to be 'kendall', 'equal' or 'fixed:W1,W2' with "
                     f"two finite weights >= 0, not both 0, got {text!r}")


@dataclass
class TrainConfig:
    """Everything that defines a training run.

    Attributes:
        recipe: name of the recipe this config came from (informational; ``""`` for none).
        dataset: data set name for :func:`torchcal.data.load_splits` (``"cifar10"``,
            ``"cifar100"``, ``"tinyimagenet"``, ``"imagenet"``, ``"digits"``).
        model: model name for :func:`torchcal.models.create_model`.
        model_kwargs: extra keyword arguments of the model constructor.
        loss: loss name for :func:`torchcal.losses.create_loss`.
        loss_kwargs: hyperparameters of the loss (they override ``loss_defaults``).
        loss_defaults: per-loss default hyperparameters of the recipe, ``{loss: {k: v}}``
            (e.g. dual focal's published γ per data set and architecture); the effective
            ``loss_kwargs`` of a run are ``{**loss_defaults.get(loss, {}), **loss_kwargs}``.
        data_root: directory holding (or receiving) the data set files.
        download: download missing files (with checksum verification) when the network allows.
        data_kwargs: extra keyword arguments of :func:`torchcal.data.load_splits`.
        ood_kwargs: extra keyword arguments of :func:`torchcal.data.load_ood` per OOD set,
            ``{name: {k: v}}`` (e.g. ``{"svhn": {"verify": False}}``).
        val_fraction: share of the training set held out for validation.
        data_seed: seed of the train/validation split (the papers use NumPy seed 1);
            ``None`` uses ``seed`` (the digits benchmark draws a split per seed).
        out_dir: run directory (``config.json``, ``log.jsonl``, ``checkpoints/``, ``logits/``).
        resume: continue from ``out_dir/checkpoints/last.pt`` when it exists.
        epochs: number of training epochs.
        batch_size: global batch size (split evenly across DDP processes).
        lr, momentum, weight_decay, nesterov: SGD settings.
        milestones: epochs at which the learning rate is multiplied by ``lr_gamma``.
        milestone_fractions: if set, the milestones are these fractions of ``epochs``
            (``floor(f * epochs)``) instead, so that ``--epochs`` keeps the schedule's shape.
        lr_gamma: multiplicative learning-rate decay at each milestone.
        grad_clip: maximum global gradient 2-norm (``None`` disables clipping).
        seed: seed of initialisation, data order and augmentation.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        amp: mixed precision on CUDA: ``"off"``, ``"bf16"`` or ``"fp16"`` (with a gradient scaler).
        channels_last: use the channels-last memory format for image models on CUDA.
        compile: wrap the model in :func:`torch.compile` for training.
        compile_step: a pack's training step as one compiled graph
            (:mod:`torchcal.train.compiled`): ``"auto"`` (on CUDA; eager on the CPU, where
            compiling costs more than it saves), ``"on"`` or ``"off"`` (eager).
        reduction: ``"published"`` sets ``loss.reduction = loss.published_reduction`` (how the
            papers' code reduced each loss over a batch), or ``"mean"`` / ``"sum"``.
        select_best_by: validation metric choosing ``checkpoints/best.pt`` (``"ece"``,
            ``"nll"``, ``"error"``, or ``"none"`` for no best checkpoint).
        checkpoint_every: write ``checkpoints/last.pt`` every this many epochs (and always after
            the last one).
        eval_test_every: evaluate the test split for the log every this many epochs (0: never
            during training).
        evaluate: after training, write ``logits/*.npz`` and ``results.json`` for the last epoch.
        n_bins: bins of the logged and evaluated calibration metrics.
        num_threads: ``torch.set_num_threads`` for this process (``None``: leave as is).
        num_workers: DataLoader workers for file-backed data sets (ImageNet folders).
        uncertainty_head: train a :class:`torchcal.uncertainty.UncertaintyHead` jointly on the
            detached pre-logit features with the ranking loss (REFERENCE §5).
        head_lr, head_weight_decay: AdamW settings of the head.
        progress: show a tqdm progress bar.
        tasks: ``[]`` for a classifier (every recipe but ``mnist1d-multitask``), or
            ``["class", PARAM]``: one trunk with a classification head and a regression head
            predicting the data set's generator parameter ``PARAM`` (MNIST-1D with
            ``with_params``), trained with the multi-task strategy of :mod:`torchcal.train.multitask`.
        task_weighting: how the two task losses are combined: ``"kendall"`` (learned
            log-variances, Kendall et al. 2018), ``"equal"`` or ``"fixed:W1,W2"``.
        log_var_lr: learning rate of Kendall's log-variances (their own AdamW parameter group,
            no weight decay; the reason is in :mod:`torchcal.train.multitask`).
        log_var_init: initial value of every log-variance.
        standardize_targets: standardise the regression target with the training split's mean
            and standard deviation.
        target_noise: standard deviation of Gaussian noise added to the (standardised)
            training targets of the regression task (a noisier task; 0 = none).
        tensorboard: also write each epoch's log line (the scalars and AdaFocal's γ per bin) to
            TensorBoard event files under ``out_dir/tensorboard`` (needs the ``tensorboard``
            package); ``log.jsonl`` stays the record.
    """

    recipe: str = runtime("", warn=False)
    dataset: str = identity("digits")
    model: str = identity("mlp")
    model_kwargs: dict[str, Any] = identity(default_factory=dict)
    loss: str = identity("ce")
    loss_kwargs: dict[str, Any] = identity(default_factory=dict, value="effective_loss_kwargs")
    loss_defaults: dict[str, dict[str, Any]] = identity(default_factory=dict, value="effective_loss_kwargs")
    data_root: str | None = runtime(None)
    download: bool = runtime(False)
    data_kwargs: dict[str, Any] = identity(default_factory=dict, value="data_identity")
    ood_kwargs: dict[str, dict[str, Any]] = identity(default_factory=dict, value="ood_identity")
    val_fraction: float = identity(0.1)
    data_seed: int | None = identity(1)
    out_dir: str = runtime("runs/run", warn=False)
    resume: bool = runtime(False, warn=False)
    epochs: int = schedule(350)
    batch_size: int = identity(128)
    lr: float = identity(0.1)
    momentum: float = identity(0.9)
    weight_decay: float = identity(5e-4)
    nesterov: bool = identity(False)
    milestones: list[int] = schedule(default_factory=lambda: [150, 250], value="effective_milestones")
    milestone_fractions: list[float] | None = schedule(None, value="effective_milestones")
    lr_gamma: float = identity(0.1)
    grad_clip: float | None = identity(2.0)
    seed: int = identity(0)
    device: str = runtime("auto")
    amp: str = identity("off")
    channels_last: bool = identity(False)
    compile: bool = identity(False)
    compile_step: str = runtime("auto")
    reduction: str = identity("published")
    select_best_by: str = runtime("ece")
    checkpoint_every: int = runtime(1)
    eval_test_every: int = runtime(1)
    evaluate: bool = runtime(True)
    n_bins: int = runtime(15)
    num_threads: int | None = runtime(None)
    num_workers: int = runtime(4)
    uncertainty_head: bool = identity(False)
    head_lr: float = identity(1e-3)
    head_weight_decay: float = identity(1e-4)
    progress: bool = runtime(True, warn=False)
    tensorboard: bool = runtime(False)
    tasks: list[str] = identity(default_factory=list)
    task_weighting: str = identity("kendall")
    log_var_lr: float = identity(0.05)
    log_var_init: float = identity(0.0)
    standardize_targets: bool = identity(True)
    target_noise: float = identity(0.0)

    # ------------------------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        """Check every field; raise ``ValueError`` naming the first bad one.  Returns self."""

        def pos_int(name: str, allow_zero: bool = False) -> None:
            check_scalar(getattr(self, name), name, int, min_val=0 if allow_zero else 1)

        def finite(name: str, strict: bool = False) -> None:
            check_scalar(getattr(self, name), name, float, min_val=0.0,
                         include_boundaries="neither" if strict else "left",
                         expected=f"a finite number {'>' if strict else '>='} 0")

        def choice(name: str, options: tuple[str, ...]) -> None:
            v = getattr(self, name)
            if v not in options:
                raise ValueError(f"Expected `{name}` to be one of {options}, got {v!r}")

        for name in ("dataset", "model", "loss", "out_dir"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise ValueError(f"Expected `{name}` to be a non-empty string, got {v!r}")
        for name in ("model_kwargs", "loss_kwargs", "loss_defaults", "data_kwargs", "ood_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"Expected `{name}` to be a dict, got {getattr(self, name)!r}")
        pos_int("epochs")
        pos_int("batch_size")
        pos_int("checkpoint_every")
        pos_int("eval_test_every", allow_zero=True)
        pos_int("n_bins")
        pos_int("num_workers", allow_zero=True)
        if self.num_threads is not None:
            pos_int("num_threads")
        check_scalar(self.seed, "seed", int, min_val=0)
        check_scalar(self.data_seed, "data_seed", int, allow_none=True)
        finite("lr", strict=True)
        finite("momentum")
        finite("weight_decay")
        finite("lr_gamma", strict=True)
        finite("head_lr", strict=True)
        finite("head_weight_decay")
        finite("log_var_lr", strict=True)
        finite("target_noise")
        check_scalar(self.log_var_init, "log_var_init", float)
        self._validate_tasks()
        check_scalar(self.val_fraction, "val_fraction", float, min_val=0.0, max_val=1.0,
                     include_boundaries="neither", expected="in (0, 1)")
        if self.grad_clip is not None:
            finite("grad_clip", strict=True)
        ms = self.milestones
        if not isinstance(ms, (list, tuple)) or any(
            isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 0 for m in ms
        ) or list(ms) != sorted(ms):
            raise ValueError(
                f"Expected `milestones` to be a sorted list of non-negative integers, got {ms!r}"
            )
        mf = self.milestone_fractions
        if mf is not None and (not isinstance(mf, (list, tuple)) or any(
            isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0.0 <= float(f) <= 1.0
            for f in mf
        ) or list(mf) != sorted(mf)):
            raise ValueError(
                f"Expected `milestone_fractions` to be None or a sorted list of numbers in [0, 1], got {mf!r}"
            )
        choice("amp", AMP_MODES)
        choice("compile_step", ("auto", "off", "on"))
        choice("reduction", REDUCTIONS)
        choice("select_best_by", SELECT_BEST_BY)
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"Expected `device` to be a device string, got {self.device!r}")
        return self

    def _validate_tasks(self) -> None:
        t = self.tasks
        if not isinstance(t, (list, tuple)) or not all(isinstance(v, str) and v for v in t) \
                or (t and (len(t) != 2 or t[0] != "class")):
            raise ValueError(f"Expected `tasks` to be [] or ['class', PARAM], got {t!r}")
        if t:
            parse_task_weighting(self.task_weighting)
            if self.uncertainty_head:
                raise ValueError(f"Expected `uncertainty_head` to be False for a multi-task run "
                                 f"(tasks={list(t)!r}): the two heads are plug-ins of one slot")

    def effective_milestones(self) -> list[int]:
        """The learning-rate milestones in epochs (from ``milestone_fractions`` when set).

        >>> TrainConfig(epochs=30, milestone_fractions=[0.5, 0.75]).effective_milestones()
        [15, 22]
        >>> TrainConfig(epochs=1, milestone_fractions=[0.5, 0.75]).effective_milestones()
        [1, 1]
        """
        if self.milestone_fractions is not None:
            # a positive fraction never lands on epoch 0 (MultiStepLR would then cut the initial
            # learning rate before the first step: 1-epoch runs trained at lr x 0.01)
            return [max(int(math.floor(float(f) * self.epochs)), 1 if f > 0 else 0)
                    for f in self.milestone_fractions]
        return [int(m) for m in self.milestones]

    def data_identity(self) -> dict[str, Any]:
        """``data_kwargs`` without the options that do not change the data (``verify``).

        >>> TrainConfig(data_kwargs={"noise_std": 0.5, "verify": False}).data_identity()
        {'noise_std': 0.5}
        """
        return {k: v for k, v in dict(self.data_kwargs).items() if k not in _DATA_KWARGS_IGNORED}

    def ood_identity(self) -> dict[str, Any]:
        """``ood_kwargs`` without the options that do not change the data, per OOD set."""
        return {name: ({k: v for k, v in kw.items() if k not in _DATA_KWARGS_IGNORED}
                       if isinstance(kw, dict) else kw)
                for name, kw in dict(self.ood_kwargs).items()}

    def effective_loss_kwargs(self) -> dict[str, Any]:
        """``{**loss_defaults.get(loss, {}), **loss_kwargs}``: what the loss is built with."""
        return {**dict(self.loss_defaults.get(self.loss, {})), **dict(self.loss_kwargs)}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field (lists for tuples)."""
        d = dataclasses.asdict(self)
        d["milestones"] = [int(m) for m in self.milestones]
        if self.milestone_fractions is not None:
            d["milestone_fractions"] = [float(f) for f in self.milestone_fractions]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility)."""
        if not isinstance(d, dict):
            raise ValueError(f"Expected a config dict, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for k in ("milestones", "milestone_fractions", "tasks"):
            if kw.get(k) is not None:
                kw[k] = list(kw[k])
        return cls(**kw)
