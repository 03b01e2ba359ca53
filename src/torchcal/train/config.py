"""Training configuration: one dataclass, validated, round-tripped through ``config.json``.

A run is fully described by a :class:`TrainConfig`.  Named recipes
(:func:`torchcal.train.get_recipe`) return one with the papers' settings; the CLI's options and
:func:`dataclasses.replace` override single fields.

Each field is declared once, beside its default (field metadata, as a loss's
``_parameter_constraints``): its constraint (``check=``, a callable ``check(value, name)``: the
shared :class:`~torchcal._validation.Interval` and :class:`~torchcal._validation.Options`, a
function of this module, or :data:`UNCHECKED`), which :meth:`TrainConfig.validate` calls in a
loop (:func:`check_fields`); its ``torchcal train`` options (``cli=``, :class:`Flag`), which the
command line adds and reads in a loop (:func:`cli_fields`); and its **role**, which every rule
that asks "does this field change training?" reads (:func:`changed_fields`).  There is no second
list.  The plug-ins' fields are groups of their own (:class:`JointHeadConfig`,
:class:`MultitaskConfig`).  The roles:

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

**A run's identity** (:meth:`TrainConfig.identity_hash`): the settings that make two runs seeds
of one configuration, read from the same roles.  Its fields (:meth:`TrainConfig.identity_values`)
are every field of the roles :data:`IDENTITY_ROLES` (``identity`` and ``schedule``: what is
trained and for how long, the fields for which a benchmark runner trains a run afresh) but
``seed``, which tells the seeds of one configuration apart; a plug-in group's fields are
named ``group.field``, and a field with a value method is hashed by that value under the first
field's name (``loss_kwargs``: the loss's effective arguments, ``loss_defaults`` included;
``milestones``: the effective milestones; ``data_kwargs`` / ``ood_kwargs`` without ``verify``).
The runtime fields (``recipe``, ``device``, ``data_root``, ``n_bins``, ``out_dir``, ...) are not
part of it.  The hash is the first 12 hex digits of the SHA-256 of the values' canonical JSON
(:func:`identity_digest`: sorted keys, no spaces, integral floats written as integers, so that
``lr=1`` and ``lr=1.0`` are one identity).  The trainer records it in each run's results
(``meta.identity``, and the hashed values in ``meta.identity_fields``); ``torchcal report`` and
the ensembles group seeds only when it matches.

>>> TrainConfig(seed=1).identity_hash() == TrainConfig(seed=2).identity_hash()
True
>>> TrainConfig(lr=0.05).identity_hash() == TrainConfig().identity_hash()
False

>>> sorted(f.name for f in dataclasses.fields(TrainConfig) if field_role(f) == "schedule")
['epochs', 'milestone_fractions', 'milestones']
>>> changed_fields(TrainConfig(), TrainConfig(reduction="sum", grad_clip=None, device="cpu"))
{'identity': ['grad_clip', 'reduction'], 'schedule': [], 'runtime': ['device']}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._validation import Interval, Options

__all__ = ["TrainConfig", "JointHeadConfig", "MultitaskConfig", "Flag", "UNCHECKED", "AMP_MODES",
           "SELECT_BEST_BY", "REDUCTIONS", "COMPILE_STEPS", "ROLES", "field_role",
           "changed_fields", "describe_fields", "check_fields", "cli_fields",
           "grouped_name", "IDENTITY_ROLES", "IDENTITY_EXCLUDED", "identity_digest",
           "config_identity"]

AMP_MODES = ("off", "bf16", "fp16")
SELECT_BEST_BY = ("ece", "nll", "error", "none")
REDUCTIONS = ("published", "mean", "sum")
COMPILE_STEPS = ("auto", "off", "on")
#: The roles a TrainConfig field may have (module docstring).
ROLES = ("identity", "schedule", "runtime")
#: The roles whose fields make a run's identity (:meth:`TrainConfig.identity_hash`).
IDENTITY_ROLES = ("identity", "schedule")
#: The fields of those roles left out of the identity: the seed tells one configuration's
#: seeds apart.
IDENTITY_EXCLUDED = ("seed",)
#: Hex digits of a run's identity hash.
IDENTITY_HEX_DIGITS = 12
#: Data options that do not change the data (``verify`` only skips a checksum).
_DATA_KWARGS_IGNORED = ("verify",)


class _Unchecked:
    """The constraint of a field that any value passes (declared, so that no field's check is
    forgotten: :data:`UNCHECKED`)."""

    def __call__(self, value: Any, name: str) -> Any:
        return value

    def __repr__(self) -> str:
        return "UNCHECKED"


#: The declared constraint of a field whose value is not checked (flags, free text).
UNCHECKED = _Unchecked()


@dataclass(frozen=True)
class Flag:
    """A ``torchcal train`` option that sets one TrainConfig field, declared in the field's
    metadata (``cli=``); the command line adds every declared flag and reads it back.

    Args:
        option: the option, e.g. ``"--batch-size"``.
        help: its ``--help`` text.
        type: argparse's ``type`` of an option taking a value (``int``, ``float``, ``str``).
        const: for a switch (no value): the field's value when the switch is given (``True``
            for ``--compile``, ``False`` for ``--no-progress``, ``None`` for ``--no-grad-clip``).
        choices, metavar: argparse's.
        convert: the field's value from the option's (``--task PARAM`` -> ``["class", PARAM]``).
        group: the title of the ``--help`` group it is shown in (None: the command's options).
    """

    option: str
    help: str
    type: Callable[[str], Any] | None = str
    const: Any = "<no const>"
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None
    convert: Callable[[Any], Any] | None = None
    group: str | None = None

    @property
    def switch(self) -> bool:
        """Whether the option takes no value (a ``store_true`` setting :attr:`const`)."""
        return self.const != "<no const>"

    @property
    def dest(self) -> str:
        """argparse's attribute for the option (``--no-grad-clip`` -> ``no_grad_clip``)."""
        return self.option.lstrip("-").replace("-", "_")


def _role(role: str, default: Any = dataclasses.MISSING, *, check: Callable[[Any, str], Any],
          cli: Flag | tuple[Flag, ...] = (), value: str | None = None, warn: bool = True,
          **kw: Any) -> Any:
    """A dataclass field with its declaration as metadata: its role (and comparison method,
    warning flag), its constraint ``check(value, name) -> value`` and its command-line flags."""
    meta = {"role": role, "value": value, "warn": warn, "check": check,
            "cli": (cli,) if isinstance(cli, Flag) else tuple(cli)}
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
    if dataclasses.is_dataclass(v):  # a plug-in group: compared as its dict
        v = dataclasses.asdict(v)
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


def _identity_values(obj: Any, prefix: str = "") -> dict[str, Any]:
    """The compared values of the identity fields of the dataclass ``obj`` (module docstring:
    a plug-in group's fields as ``group.field``, fields sharing a value method once)."""
    out: dict[str, Any] = {}
    seen: set[str] = set()
    for f in dataclasses.fields(obj):
        method = f.metadata.get("value")
        if field_role(f) not in IDENTITY_ROLES or f.name in IDENTITY_EXCLUDED or method in seen:
            continue
        if method:
            seen.add(method)
        if _group_class(f) is not None:
            out.update(_identity_values(getattr(obj, f.name), f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = _compared(obj, f)
    return out


def _canonical(v: Any) -> Any:
    """``v`` with integral floats as integers (``1.0`` -> ``1``), recursively."""
    if isinstance(v, dict):
        return {str(k): _canonical(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def identity_digest(values: dict[str, Any]) -> str:
    """The identity hash of a run's identity values (:meth:`TrainConfig.identity_values`): the
    first 12 hex digits of the SHA-256 of their canonical JSON (sorted keys, no spaces,
    integral floats as integers).

    >>> identity_digest({"lr": 1}) == identity_digest({"lr": 1.0})
    True
    """
    text = json.dumps(_canonical(values), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:IDENTITY_HEX_DIGITS]


def config_identity(config: Any) -> dict[str, Any] | None:
    """``{"identity": HASH, "identity_fields": {...}}`` of a run's config, a
    :class:`TrainConfig` or a config dict (a ``config.json``'s, as results written before
    ``meta.identity`` existed need); None for a dict that is no TrainConfig's.

    >>> sorted(config_identity({"loss": "focal", "lr": 0.05}))
    ['identity', 'identity_fields']
    """
    if not isinstance(config, TrainConfig):
        try:
            config = TrainConfig.from_dict(dict(config))
        except (TypeError, ValueError):
            return None
    return {"identity": config.identity_hash(), "identity_fields": config.identity_values()}


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


# ---------------------------------------------------------------------------------------------
# The constraints of the fields that the shared ones (Interval, Options) do not express; each is
# ``check(value, name) -> value`` as a loss' ``_parameter_constraints``.
POSITIVE_INT = Interval(int, 1, None)
NON_NEGATIVE_INT = Interval(int, 0, None)
POSITIVE = Interval(float, 0, None, closed="neither")
NON_NEGATIVE = Interval(float, 0, None, closed="left")


def non_empty_str(value: Any, name: str) -> str:
    """A non-empty string (a registry name, a path)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"Expected `{name}` to be a non-empty string, got {value!r}")
    return value


def a_dict(value: Any, name: str) -> dict:
    """A dict (keyword arguments)."""
    if not isinstance(value, dict):
        raise ValueError(f"Expected `{name}` to be a dict, got {value!r}")
    return value


def device_string(value: Any, name: str) -> str:
    """A device string (``"auto"``, ``"cpu"``, ``"cuda:1"``...)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"Expected `{name}` to be a device string, got {value!r}")
    return value


def sorted_epochs(value: Any, name: str) -> Any:
    """A sorted list of non-negative integers (learning-rate milestones)."""
    if not isinstance(value, (list, tuple)) or any(
        isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 0 for m in value
    ) or list(value) != sorted(value):
        raise ValueError(f"Expected `{name}` to be a sorted list of non-negative integers, "
                         f"got {value!r}")
    return value


def sorted_fractions(value: Any, name: str) -> Any:
    """None or a sorted list of numbers in [0, 1] (milestones as fractions of the epochs)."""
    if value is not None and (not isinstance(value, (list, tuple)) or any(
        isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0.0 <= float(f) <= 1.0
        for f in value
    ) or list(value) != sorted(value)):
        raise ValueError(f"Expected `{name}` to be None or a sorted list of numbers in [0, 1], "
                         f"got {value!r}")
    return value


def task_list(value: Any, name: str) -> Any:
    """``[]`` (a classifier) or ``["class", PARAM]`` (two tasks)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value) \
            or (value and (len(value) != 2 or value[0] != "class")):
        raise ValueError(f"Expected `{name}` to be [] or ['class', PARAM], got {value!r}")
    return value


def _task_of(param: str) -> list[str]:
    """``--task PARAM``: the two tasks ``["class", PARAM]``."""
    return ["class", param]


_MULTITASK = "two tasks (recipe mnist1d-multitask)"
#: The regression head's variance: one per task (Kendall et al. 2018) or one per sample.
REGRESSION_VARIANCES = ("task", "sample")


@dataclass(frozen=True)
class JointHeadConfig:
    """The joint uncertainty head (:mod:`torchcal.train.joint_head`), a plug-in of the trainer:
    ``TrainConfig.joint_head``.

    Attributes:
        enabled: train a :class:`torchcal.uncertainty.UncertaintyHead` jointly on the detached
            pre-logit features with the ranking loss (REFERENCE §5).
        lr, weight_decay: AdamW settings of the head.
    """

    enabled: bool = identity(False, check=UNCHECKED, cli=Flag(
        "--uncertainty-head", "jointly train an uncertainty head on the detached features "
        "(ranking loss, own AdamW)", const=True))
    lr: float = identity(1e-3, check=POSITIVE)
    weight_decay: float = identity(1e-4, check=NON_NEGATIVE)


@dataclass(frozen=True)
class MultitaskConfig:
    """The two-task strategy (:mod:`torchcal.train.multitask`), a plug-in of the trainer:
    ``TrainConfig.multitask``.

    Attributes:
        tasks: ``[]`` for a classifier (every recipe but ``mnist1d-multitask``), or
            ``["class", PARAM]``: one trunk with a classification head and a regression head
            predicting the data set's generator parameter ``PARAM`` (MNIST-1D with
            ``with_params``).
        task_weighting: how the two task losses are combined: ``"kendall"`` (learned
            log-variances, Kendall et al. 2018), ``"equal"`` or ``"fixed:W1,W2"`` (checked
            when ``tasks`` is set).
        log_var_lr: learning rate of Kendall's log-variances (their own AdamW parameter group,
            no weight decay; the reason is in :mod:`torchcal.train.multitask`).
        log_var_init: initial value of every log-variance.
        standardize_targets: standardise the regression target with the training split's mean
            and standard deviation.
        target_noise: standard deviation of Gaussian noise added to the (standardised)
            training targets of the regression task (a noisier task; 0 = none).
        regression_variance: ``"task"``: the regression head predicts the mean and its loss is
            the mean squared error (the task's variance is Kendall's learned homoscedastic
            ``exp(s_2)``); ``"sample"``: the head also predicts a log-variance per sample and
            its loss is the Gaussian negative log-likelihood (Kendall & Gal 2017's
            heteroscedastic regression), with ``task_weighting`` ``"equal"`` or ``"fixed:..."``
            (a learned task weight on a loss that can be negative has no minimum).
    """

    tasks: list[str] = identity(default_factory=list, check=task_list, cli=Flag(
        "--task", "the regression task: a generator parameter of the data (MNIST-1D: "
        "translation, scale, shear, padding, ...); the recipe's otherwise", metavar="PARAM",
        convert=_task_of, group=_MULTITASK))
    task_weighting: str = identity("kendall", check=UNCHECKED, cli=Flag(
        "--task-weighting", "combine the class and regression losses with Kendall et al.'s "
        "learned weights, equally, or with fixed weights (default: kendall)",
        metavar="kendall|equal|fixed:W1,W2", group=_MULTITASK))
    log_var_lr: float = identity(0.05, check=POSITIVE, cli=Flag(
        "--log-var-lr", "learning rate of Kendall's log-variances (their own parameter group; "
        "default 0.05: Adam moves them about this much per step, and their optimum log(2cL) can "
        "lie several units from 0)", type=float, group=_MULTITASK))
    log_var_init: float = identity(0.0, check=Interval(float, None, None),
                                   cli=Flag("--log-var-init", "initial log-variances (default 0)",
                                            type=float, group=_MULTITASK))
    standardize_targets: bool = identity(True, check=UNCHECKED,
                                         cli=Flag("--raw-targets", "do not standardise the "
                                                  "regression target", const=False,
                                                  group=_MULTITASK))
    target_noise: float = identity(0.0, check=NON_NEGATIVE, cli=Flag(
        "--target-noise", "Gaussian noise (std, standardised units) added to the training "
        "targets", type=float, group=_MULTITASK))
    regression_variance: str = identity("task", check=Options(REGRESSION_VARIANCES), cli=Flag(
        "--regression-variance", "task: the regression head predicts the mean (MSE); sample: "
        "also a log-variance per sample (Gaussian NLL, Kendall & Gal 2017)",
        choices=REGRESSION_VARIANCES, group=_MULTITASK))


def _check_group(cls: type) -> Callable[[Any, str], Any]:
    """The constraint of a plug-in group field: an instance of ``cls`` whose fields pass theirs."""
    def check(value: Any, name: str) -> Any:
        if not isinstance(value, cls):
            raise ValueError(f"Expected `{name}` to be a {cls.__name__}, got {value!r}")
        check_fields(value, prefix=f"{name}.")
        return value
    check.__qualname__ = f"group({cls.__name__})"
    return check


def plugin(cls: type) -> Any:
    """A TrainConfig field holding a plug-in's group of fields (a frozen dataclass ``cls``)."""
    return identity(default_factory=cls, check=_check_group(cls))


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check every field of the dataclass ``obj`` with the constraint its metadata declares;
    raise ``ValueError`` naming the first bad one (``prefix`` + its name)."""
    for f in dataclasses.fields(obj):
        f.metadata["check"](getattr(obj, f.name), prefix + f.name)


def cli_fields(cls: type) -> list[tuple[tuple[str, ...], Flag]]:
    """Every command-line flag the fields of ``cls`` declare, with the field's path (``("epochs",)``,
    ``("multitask", "tasks")``), in field order (a plug-in's after the others)."""
    out, groups = [], []
    for f in dataclasses.fields(cls):
        if _group_class(f) is not None:
            groups.append(f)
        out += [((f.name,), flag) for flag in f.metadata.get("cli", ())]
    for g in groups:
        out += [((g.name, *path), flag) for path, flag in cli_fields(_group_class(g))]
    return out


def _group_class(f: dataclasses.Field) -> type | None:
    """The plug-in group class a field holds (None: a plain field)."""
    factory = f.default_factory
    return factory if isinstance(factory, type) and dataclasses.is_dataclass(factory) else None


#: The joint head's fields under the top-level names they had before the grouping.
_JOINT_HEAD_KEYS = {"uncertainty_head": "enabled", "head_lr": "lr",
                    "head_weight_decay": "weight_decay"}


def grouped_name(cls: type, key: str) -> str | None:
    """``"group.name"`` when the top-level key ``key`` names a plug-in group's field
    (``"tasks"`` -> ``"multitask.tasks"``, ``"head_lr"`` -> ``"joint_head.lr"``); else None."""
    for g in dataclasses.fields(cls):
        sub = _group_class(g)
        names = {f.name: f.name for f in dataclasses.fields(sub)} if sub else {}
        if g.name == "joint_head":
            names.update(_JOINT_HEAD_KEYS)
        if key in names:
            return f"{g.name}.{names[key]}"
    return None


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (frozen: a run is its config; derive another
    with :func:`dataclasses.replace`).

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
        progress: show a tqdm progress bar.
        tensorboard: also write each epoch's log line (the scalars and AdaFocal's γ per bin) to
            TensorBoard event files under ``out_dir/tensorboard`` (needs the ``tensorboard``
            package); ``log.jsonl`` stays the record.
        joint_head: the joint uncertainty head's settings (:class:`JointHeadConfig`: whether,
            its AdamW learning rate and weight decay).
        multitask: the two-task strategy's settings (:class:`MultitaskConfig`: the tasks, their
            weighting, the log-variances' learning rate and initial value, the targets'
            standardisation and noise).

    Each field declares its role, its constraint (``check``, called as
    ``check(value, name)`` by :meth:`validate`) and its ``torchcal train`` flags (``cli``) where
    it is defined; adding a field is a change in this one place (docs/guide/architecture.md).
    """

    recipe: str = runtime("", check=UNCHECKED, warn=False)
    dataset: str = identity("digits", check=non_empty_str)
    model: str = identity("mlp", check=non_empty_str)
    model_kwargs: dict[str, Any] = identity(default_factory=dict, check=a_dict)
    loss: str = identity("ce", check=non_empty_str)
    loss_kwargs: dict[str, Any] = identity(default_factory=dict, check=a_dict,
                                           value="effective_loss_kwargs")
    loss_defaults: dict[str, dict[str, Any]] = identity(default_factory=dict, check=a_dict,
                                                        value="effective_loss_kwargs")
    data_root: str | None = runtime(None, check=UNCHECKED, cli=Flag(
        "--data-root", "directory holding (or receiving) the data set files"))
    download: bool = runtime(False, check=UNCHECKED, cli=Flag(
        "--download", "download missing data set files (checksums verified)", const=True))
    data_kwargs: dict[str, Any] = identity(default_factory=dict, check=a_dict,
                                           value="data_identity")
    ood_kwargs: dict[str, dict[str, Any]] = identity(default_factory=dict, check=a_dict,
                                                     value="ood_identity")
    val_fraction: float = identity(0.1, check=Interval(float, 0, 1, closed="neither"), cli=Flag(
        "--val-fraction", "share of the training set held out for validation (default 0.1)",
        type=float))
    data_seed: int | None = identity(1, check=Interval(int, None, None, allow_none=True))
    out_dir: str = runtime("runs/run", check=non_empty_str, warn=False)
    resume: bool = runtime(False, check=UNCHECKED, warn=False)
    epochs: int = schedule(350, check=POSITIVE_INT, cli=Flag(
        "--epochs", "number of epochs (recipe default otherwise)", type=int))
    batch_size: int = identity(128, check=POSITIVE_INT, cli=Flag(
        "--batch-size", "global batch size (split across processes)", type=int))
    lr: float = identity(0.1, check=POSITIVE, cli=Flag(
        "--lr", "initial SGD learning rate", type=float))
    momentum: float = identity(0.9, check=NON_NEGATIVE)
    weight_decay: float = identity(5e-4, check=NON_NEGATIVE, cli=Flag(
        "--weight-decay", "SGD weight decay", type=float))
    nesterov: bool = identity(False, check=UNCHECKED)
    milestones: list[int] = schedule(default_factory=lambda: [150, 250], check=sorted_epochs,
                                     value="effective_milestones")
    milestone_fractions: list[float] | None = schedule(None, check=sorted_fractions,
                                                       value="effective_milestones")
    lr_gamma: float = identity(0.1, check=POSITIVE)
    grad_clip: float | None = identity(
        2.0, check=Interval(float, 0, None, closed="neither", allow_none=True),
        cli=(Flag("--grad-clip", "maximum gradient 2-norm", type=float),
             Flag("--no-grad-clip", "disable gradient clipping", const=None)))
    seed: int = identity(0, check=NON_NEGATIVE_INT, cli=Flag(
        "--seed", "seed of initialisation, data order, augmentation", type=int))
    device: str = runtime("auto", check=device_string, cli=Flag(
        "--device", "'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:N'"))
    amp: str = identity("off", check=Options(AMP_MODES), cli=Flag(
        "--amp", "mixed precision on CUDA (fp16 uses a gradient scaler)", choices=AMP_MODES))
    channels_last: bool = identity(False, check=UNCHECKED, cli=Flag(
        "--channels-last", "channels-last memory format (CUDA image models)", const=True))
    compile: bool = identity(False, check=UNCHECKED, cli=Flag(
        "--compile", "torch.compile the model", const=True))
    compile_step: str = runtime("auto", check=Options(COMPILE_STEPS))
    reduction: str = identity("published", check=Options(REDUCTIONS), cli=Flag(
        "--reduction", "loss reduction over a batch: 'published' = as the papers' code (sum for "
        "most losses, mean for Brier)", choices=REDUCTIONS))
    select_best_by: str = runtime("ece", check=Options(SELECT_BEST_BY), cli=Flag(
        "--select-best-by", help="validation metric selecting checkpoints/best.pt",
        choices=SELECT_BEST_BY))
    checkpoint_every: int = runtime(1, check=POSITIVE_INT, cli=Flag(
        "--checkpoint-every", help="write last.pt every N epochs", type=int))
    eval_test_every: int = runtime(1, check=NON_NEGATIVE_INT)
    evaluate: bool = runtime(True, check=UNCHECKED, cli=Flag(
        "--no-eval", help="skip writing logits/ and results.json after training", const=False))
    n_bins: int = runtime(15, check=POSITIVE_INT)
    num_threads: int | None = runtime(None, check=Interval(int, 1, None, allow_none=True),
                                      cli=Flag("--num-threads", "torch CPU threads of this process",
                                               type=int))
    num_workers: int = runtime(4, check=NON_NEGATIVE_INT, cli=Flag(
        "--num-workers", "DataLoader workers (folder data sets)", type=int))
    progress: bool = runtime(True, check=UNCHECKED, warn=False, cli=Flag(
        "--no-progress", "no progress bar", const=False))
    tensorboard: bool = runtime(False, check=UNCHECKED, cli=Flag(
        "--tensorboard", help="also write each epoch's scalars and AdaFocal's γ per bin to "
        "TensorBoard under OUT/tensorboard (needs the tensorboard package; log.jsonl stays the "
        "record): tensorboard --logdir OUT", const=True))
    joint_head: JointHeadConfig = plugin(JointHeadConfig)
    multitask: MultitaskConfig = plugin(MultitaskConfig)

    # ------------------------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        """Check every field by the constraint it declares, then the settings that depend on
        each other; raise ``ValueError`` naming the first bad one.  Returns self."""
        check_fields(self)
        mt = self.multitask
        if mt.tasks:
            kind, _ = parse_task_weighting(mt.task_weighting)
            if mt.regression_variance == "sample" and kind == "kendall":
                raise ValueError("Expected `multitask.task_weighting` to be 'equal' or "
                                 "'fixed:W1,W2' with multitask.regression_variance='sample', got "
                                 "'kendall' (a learned weight on a Gaussian NLL, which can be "
                                 "negative, has no minimum)")
            if self.joint_head.enabled:
                raise ValueError(f"Expected `joint_head.enabled` to be False for a multi-task "
                                 f"run (multitask.tasks={list(mt.tasks)!r}): the two heads are "
                                 "plug-ins of one slot")
        return self

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

    def identity_values(self) -> dict[str, Any]:
        """The values that make this run's identity (module docstring), by field name: every
        ``identity`` and ``schedule`` field but ``seed``, compared values, a plug-in group's
        fields as ``group.field``.

        >>> v = TrainConfig(loss="focal", loss_kwargs={"gamma": 3}).identity_values()
        >>> v["loss"], v["loss_kwargs"], v["lr"], "seed" in v, "device" in v, "epochs" in v
        ('focal', {'gamma': 3}, 0.1, False, False, True)
        """
        return _identity_values(self)

    def identity_hash(self) -> str:
        """The run's identity hash: :func:`identity_digest` of :meth:`identity_values` (12 hex
        digits; the seeds of one configuration share it)."""
        return identity_digest(self.identity_values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field (lists for tuples; a plug-in group as a dict)."""
        d = dataclasses.asdict(self)
        d["milestones"] = [int(m) for m in self.milestones]
        if self.milestone_fractions is not None:
            d["milestone_fractions"] = [float(f) for f in self.milestone_fractions]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility), but a
        plug-in group's field at the top level (``"tasks"``, ``"head_lr"``) is refused
        (``ValueError`` naming its place, ``multitask.tasks``, ``joint_head.lr``).

        >>> TrainConfig.from_dict({"head_lr": 0.01})
        Traceback (most recent call last):
        ValueError: Expected the config's `head_lr` under its group, as `joint_head.lr`
        """
        if not isinstance(d, dict):
            raise ValueError(f"Expected a config dict, got {type(d).__name__}")
        names = {f.name: f for f in dataclasses.fields(cls)}
        for k in d:
            where = None if k in names else grouped_name(cls, k)
            if where is not None:
                raise ValueError(f"Expected the config's `{k}` under its group, as `{where}`")
        kw = {k: v for k, v in d.items() if k in names}
        for k in ("milestones", "milestone_fractions"):
            if kw.get(k) is not None:
                kw[k] = list(kw[k])
        groups = _groups({k: v for k, v in kw.items() if _group_class(names[k])}, cls)
        return cls(**{**kw, **groups})


def _groups(given: dict[str, Any], cls: type) -> dict[str, Any]:
    """The plug-in groups of ``cls`` from ``given`` (a group as a dict or instance)."""
    parts: dict[str, dict[str, Any]] = {}
    for name, v in given.items():
        sub = _group_class(next(f for f in dataclasses.fields(cls) if f.name == name))
        if isinstance(v, sub):
            v = {f.name: getattr(v, f.name) for f in dataclasses.fields(sub)}
        if not isinstance(v, dict):
            raise ValueError(f"Expected `{name}` to be a dict or a {sub.__name__}, got {v!r}")
        parts[name] = {k: x for k, x in v.items() if k in {f.name for f in dataclasses.fields(sub)}}
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in parts:
            kw = parts[f.name]
            if "tasks" in kw and kw["tasks"] is not None:
                kw["tasks"] = list(kw["tasks"])
            out[f.name] = _group_class(f)(**kw)
    return out


