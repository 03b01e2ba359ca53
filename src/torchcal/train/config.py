"""Training configuration: one dataclass, validated, round-tripped through ``config.json``.

A run is fully described by a :class:`TrainConfig`.  Named recipes
(:func:`torchcal.train.get_recipe`) return one with the papers' settings; the CLI's options and
:func:`dataclasses.replace` override single fields.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from .._validation import check_scalar

__all__ = ["TrainConfig", "AMP_MODES", "SELECT_BEST_BY", "REDUCTIONS"]

AMP_MODES = ("off", "bf16", "fp16")
SELECT_BEST_BY = ("ece", "nll", "error", "none")
REDUCTIONS = ("published", "mean", "sum")


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
            ``with_params``), trained by :func:`torchcal.train.multitask.train_multitask`.
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

    recipe: str = ""
    dataset: str = "digits"
    model: str = "mlp"
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    loss: str = "ce"
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    loss_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    data_root: str | None = None
    download: bool = False
    data_kwargs: dict[str, Any] = field(default_factory=dict)
    ood_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    val_fraction: float = 0.1
    data_seed: int | None = 1
    out_dir: str = "runs/run"
    resume: bool = False
    epochs: int = 350
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False
    milestones: list[int] = field(default_factory=lambda: [150, 250])
    milestone_fractions: list[float] | None = None
    lr_gamma: float = 0.1
    grad_clip: float | None = 2.0
    seed: int = 0
    device: str = "auto"
    amp: str = "off"
    channels_last: bool = False
    compile: bool = False
    reduction: str = "published"
    select_best_by: str = "ece"
    checkpoint_every: int = 1
    eval_test_every: int = 1
    evaluate: bool = True
    n_bins: int = 15
    num_threads: int | None = None
    num_workers: int = 4
    uncertainty_head: bool = False
    head_lr: float = 1e-3
    head_weight_decay: float = 1e-4
    progress: bool = True
    tensorboard: bool = False
    tasks: list[str] = field(default_factory=list)
    task_weighting: str = "kendall"
    log_var_lr: float = 0.05
    log_var_init: float = 0.0
    standardize_targets: bool = True
    target_noise: float = 0.0

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
            from .multitask import parse_task_weighting  # deferred: multitask imports config

            parse_task_weighting(self.task_weighting)

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

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

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
