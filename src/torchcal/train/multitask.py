"""Two-task training: a class and a generator parameter, weighted fixed or as Kendall et al.

A run whose :class:`~torchcal.train.TrainConfig` names ``multitask.tasks = ["class", PARAM]``
(its :class:`~torchcal.train.config.MultitaskConfig`) is trained by
:func:`~torchcal.train.train` with the one engine (:mod:`torchcal.train.engine`) like any
run; this module is its *strategy*, :class:`TaskHead`, a plug-in with the hooks of the joint
uncertainty head (:class:`~torchcal.train.plugin.RunPlugin`).  It trains one trunk (the
config's model without its classifier: ``forward_features``) with two heads: the model's ``fc``
(classification, the run's loss: cross-entropy in the recipe) and a linear regression head on
the same features
predicting the signal's generator parameter ``PARAM`` (an MNIST-1D parameter of
:data:`torchcal.data.mnist1d_params.PARAM_NAMES`, e.g. ``"translation"``; mean squared error).
The two losses are combined by ``task_weighting``:

* ``"kendall"``: :class:`torchcal.losses.UncertaintyWeighting` (Kendall, Gal & Cipolla 2018),
  ``exp(-s_1) CE + 1/2 exp(-s_2) MSE + (s_1 + s_2) / 2`` with learned log-variances ``s``;
* ``"equal"``: ``CE + MSE``;
* ``"fixed:W1,W2"``: ``W1 CE + W2 MSE``.

The regression target is standardised with the training split's mean and standard deviation
(``standardize_targets``, default); the RMSE is reported in the parameter's own units.  With
``target_noise`` > 0, Gaussian noise of that standard deviation (in standardised units, drawn
once from the run's seed) is added to the *training* targets only: a noisier task.

Optimiser: AdamW (``lr``, ``weight_decay``) with a cosine schedule over all steps (the
multi-task loop does not use ``momentum`` or the milestones).  Kendall's log-variances form a
parameter group of their own, with learning rate ``log_var_lr``, no weight decay and initial
value ``log_var_init``.  The reason: Adam moves each parameter by about its learning rate per
step whatever the gradient's scale, and the log-variances' optimum ``s_t* = log(2 c_t L_t)``
lies several units from 0 when a loss is far from 1 (a raw-unit regression target with a mean
squared error of 100 wants ``s = 3.9``; ``2 c L`` = 0.1 wants ``s = -2.3``).  At the trunk's
``lr = 3e-3`` a 25-epoch run of 32 steps per epoch (800 steps, cosine-decayed) moves ``s`` by at
most about 1.2, so the weighting would stay near its starting point and Kendall's method would
be a fixed weighting in disguise.  ``log_var_lr = 0.05`` lets them move up to 3 units in 60
steps (two epochs).  Standardised targets keep the optimum within about 2 units of 0; with raw
units Adam's second-moment estimate, filled by the large early gradients, slows them further
(a squared error of 100 at lr 0.05: 3.4 of the 4.6 units after 200 steps,
``tests/train/test_multitask.py``).  The default initial value 0 is the paper's (weights
``c_t``).

The run directory is a run's (:mod:`torchcal.run_dir`): ``config.json``, ``log.jsonl`` (a run's
epoch record plus ``train_ce``, ``train_mse``, ``task_weights`` and ``val_rmse``),
``checkpoints/last.pt`` (trunk and ``fc`` as ``model``, the regression head and the weighting as
``head``, AdamW, the cosine schedule, RNG) and the common ``results.json``
(:data:`torchcal.results_file.SCHEMA`: the classifier's validation and test metrics, with logits)
with a ``multitask`` block: validation and test accuracy, NLL and RMSE, the learned weights and
log-variances, the target's mean and standard deviation, and the validation and test
regression predictions in standardised units (``predictions``: means, targets and, with
``regression_variance="sample"``, the predicted log-variances).  A killed run resumes (``resume``) to
the numbers of an uninterrupted one.  Not with ``torchrun``, not packed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import TorchcalError
from ..losses.multitask import UncertaintyWeighting
from .config import TrainConfig, parse_task_weighting
from .distributed import epoch_seed
from .joint_head import FeaturesAndLogits
from .plugin import RunPlugin

__all__ = [ "TaskWeighting", "TaskHead", "MULTITASK_SCHEMA"]

#: The schema of a multi-task run's ``multitask`` block in ``results.json``.
MULTITASK_SCHEMA = "torchcal.multitask_results/1"


class TaskWeighting(nn.Module):
    """The combined loss of (cross-entropy, mean squared error) under a ``task_weighting``.

    Example:
        >>> w = TaskWeighting("fixed:1,10")
        >>> w(torch.tensor(0.5), torch.tensor(0.2)), w.weights().tolist()
        (tensor(2.5000), [1.0, 10.0])
    """

    def __init__(self, task_weighting: str, log_var_init: float = 0.0) -> None:
        super().__init__()
        self.kind, fixed = parse_task_weighting(task_weighting)
        self.kendall = (UncertaintyWeighting(("classification", "regression"), init=log_var_init)
                        if self.kind == "kendall" else None)
        self.register_buffer("fixed", torch.tensor(fixed or (1.0, 1.0)))

    def forward(self, ce: torch.Tensor, mse: torch.Tensor) -> torch.Tensor:
        if self.kendall is not None:
            return self.kendall(torch.stack([ce, mse]))
        return self.fixed[0] * ce + self.fixed[1] * mse

    @torch.no_grad()
    def weights(self) -> torch.Tensor:
        """The current weights of (CE, MSE): ``c_t exp(-s_t)`` for Kendall's."""
        return self.kendall.weights() if self.kendall is not None else self.fixed.clone()


def _targets(config: TrainConfig, splits: Any) -> tuple[dict[str, torch.Tensor], float, float]:
    """Per split the (standardised) regression targets, and the training mean and std."""
    mt = config.multitask
    param = mt.tasks[1]
    if not hasattr(splits.train, "params") or param not in splits.train.params:
        have = sorted(getattr(splits.train, "params", {}))
        raise TorchcalError(
            f"Task {param!r} is not a parameter of data set {config.dataset!r} (its parameters: "
            f"{', '.join(have) or 'none'}; MNIST-1D needs the data arg with_params=true)")
    raw = {k: getattr(splits, k).params[param].float() for k in ("train", "val", "test")}
    mean, std = float(raw["train"].mean()), float(raw["train"].std())
    if not mt.standardize_targets:
        mean, std = 0.0, 1.0
    if not std > 0:
        raise TorchcalError(f"Task {param!r} is constant on the training split")
    out = {k: (v - mean) / std for k, v in raw.items()}
    if mt.target_noise > 0:
        g = torch.Generator().manual_seed(epoch_seed(config.seed, 0, stream=77))
        out["train"] = out["train"] + mt.target_noise * torch.randn(
            out["train"].shape, generator=g)
    return out, mean, std


class TaskHead(RunPlugin):
    """The multi-task strategy: a regression head on the model's features, the task weighting,
    AdamW with the log-variances' own group and a cosine schedule stepped every batch.

    Built by :func:`~torchcal.train.run.build_run` right after the model (the head's
    initialisation draws from the run's seeded stream); the engine calls its hooks.
    """

    def __init__(self, model: nn.Module, config: TrainConfig, splits: Any,
                 device: torch.device) -> None:
        if not hasattr(model, "forward_features") or not hasattr(model, "fc"):
            raise TorchcalError("Multi-task training needs a torchcal model with "
                                "forward_features, num_features and fc")
        self.model, self.config = model, config
        self.sample_var = config.multitask.regression_variance == "sample"
        self.reg = nn.Linear(int(model.num_features), 2 if self.sample_var else 1).to(device)
        self.weighting = TaskWeighting(config.multitask.task_weighting,
                                       config.multitask.log_var_init).to(device)
        targets, self.mean, self.std = _targets(config, splits)
        self.targets = {k: v.to(device) for k, v in targets.items()}
        self.splits, self.device = splits, device
        self._on_device: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.sums = torch.zeros(3, device=device)

    def make_optimizer(self, model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
        """AdamW over the trunk, ``fc`` and the regression head; Kendall's log-variances in a
        group of their own (``log_var_lr``, no weight decay: the module docstring)."""
        groups = [{"params": list(model.parameters()) + list(self.reg.parameters()),
                   "lr": config.lr, "weight_decay": config.weight_decay}]
        if self.weighting.kendall is not None:
            groups.append({"params": [self.weighting.kendall.log_vars], "lr": config.multitask.log_var_lr,
                           "weight_decay": 0.0})
        return torch.optim.AdamW(groups)

    def make_schedule(self, optimizer: torch.optim.Optimizer, steps: int) -> Any:
        """A cosine schedule over all ``steps`` (stepped after every batch)."""
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(steps, 1))

    per_step_schedule = True

    def wrap(self, model: nn.Module) -> nn.Module:
        return FeaturesAndLogits(model)

    def split(self, out: Any) -> tuple[torch.Tensor, Any]:
        return out

    def distribute(self, device_ids: list[int] | None) -> None:
        raise TorchcalError("Multi-task runs train in one process (not under torchrun)")

    def start_epoch(self) -> None:
        self.reg.train()
        self.sums = torch.zeros(3, device=self.device)

    def add_loss(self, total: torch.Tensor, logits: torch.Tensor, feats: Any, y: torch.Tensor,
                 index: torch.Tensor | None = None) -> torch.Tensor:
        """The weighted two-task loss of the batch (``total``: the run's classification loss;
        ``index``: the batch's sample indices, for the regression targets)."""
        if index is None:
            raise TorchcalError("A multi-task step needs the batch's sample indices")
        out, t = self.reg(feats), self.targets["train"][index]
        mse = F.mse_loss(out[:, 0], t)
        self.sums = self.sums + torch.stack([total.detach(), mse.detach(),
                                             torch.ones((), device=self.device)])
        if self.sample_var:  # Kendall & Gal 2017: the Gaussian NLL (without log(2 pi) / 2)
            log_var = out[:, 1]
            return self.weighting(total, 0.5 * (log_var + (t - out[:, 0]).pow(2)
                                                 * torch.exp(-log_var)).mean())
        return self.weighting(total, mse)

    def state(self, full: bool) -> dict[str, Any]:
        return {"head": {"reg": self.reg.state_dict(), "weighting": self.weighting.state_dict()},
                "head_optimizer": None}

    def load(self, state: dict[str, Any]) -> None:
        head = state.get("head") or {}
        if "reg" not in head or "weighting" not in head:
            raise KeyError("no multi-task head state")
        self.reg.load_state_dict(head["reg"])
        self.weighting.load_state_dict(head["weighting"])

    def log(self, rec: dict[str, Any], n_batches: int) -> None:
        ce, mse = (self.sums[:2] / self.sums[2].clamp(min=1)).tolist()  # batch means
        rec.update(train_ce=ce, train_mse=mse, task_weights=self.weighting.weights().tolist(),
                   val_rmse=self.evaluate("val")["rmse"])

    @torch.no_grad()
    def evaluate(self, split: str) -> dict[str, float]:
        """Accuracy, NLL and RMSE (in the parameter's units) on ``split``."""
        z, y, out, t = self._predict(split)
        p = out[:, 0]
        return {"accuracy": float((z.argmax(1) == y).double().mean()),
                "nll": float(F.cross_entropy(z.double(), y)),
                "rmse": float(((p - t).double().pow(2).mean().sqrt()) * self.std)}

    @torch.no_grad()
    def _predict(self, split: str
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits, labels, regression outputs (n, 1 or 2), standardised targets)`` of
        ``split``."""
        if split not in self._on_device:  # moved once, not every epoch
            ds = getattr(self.splits, split)
            self._on_device[split] = (ds.data.float().to(self.device), ds.labels.to(self.device))
        (x, y), t = self._on_device[split], self.targets[split]
        was = self.model.training
        self.model.eval()
        self.reg.eval()
        logits, pred = [], []
        for s in range(0, x.shape[0], 4096):
            h = self.model.forward_features(x[s:s + 4096])
            logits.append(self.model.fc(h))
            pred.append(self.reg(h))
        self.model.train(was)
        self.reg.train(was)
        return torch.cat(logits), y, torch.cat(pred), t

    def predictions(self, split: str) -> dict[str, list[float]]:
        """The regression predictions of ``split`` in standardised units: ``mean``, ``target``
        and, with ``regression_variance="sample"``, ``log_var`` (lists of floats, for the
        regression section of the uncertainty suite)."""
        _, _, out, t = self._predict(split)
        pred = {"mean": out[:, 0].double().cpu().tolist(), "target": t.double().cpu().tolist()}
        if self.sample_var:
            pred["log_var"] = out[:, 1].double().cpu().tolist()
        return pred

    def results(self) -> dict[str, Any]:
        """``{"multitask": block}`` for the run's ``results.json``."""
        c = self.config.multitask
        out: dict[str, Any] = {"schema": MULTITASK_SCHEMA, "tasks": list(c.tasks),
                               "task_weighting": c.task_weighting, "target_noise": c.target_noise,
                               "target_mean": self.mean, "target_std": self.std,
                               "regression_variance": c.regression_variance,
                               "weights": self.weighting.weights().tolist(),
                               "log_vars": (self.weighting.kendall.log_vars.detach().tolist()
                                            if self.weighting.kendall is not None else None)}
        for k in ("val", "test"):
            out[k] = self.evaluate(k)
        out["predictions"] = {k: self.predictions(k) for k in ("val", "test")}
        return {"multitask": out}
