"""Two-task training: a class and a generator parameter, weighted fixed or as Kendall et al.

A run whose :class:`~torchcal.train.TrainConfig` names ``tasks = ["class", PARAM]`` trains one
trunk (the config's model without its classifier: ``forward_features``) with two heads: the
model's ``fc`` (classification, cross-entropy) and a linear regression head on the same features
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

The run directory gets ``config.json``, ``log.jsonl`` (one line per epoch: losses, task weights,
validation accuracy and RMSE), ``checkpoints/last.pt`` (trunk, heads, weighting) and
``results.json`` (validation and test accuracy, NLL, RMSE, the learned weights).  Resume is not
supported: a multi-task run is short, and an interrupted one is trained again.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._io import atomic_write_json, exclusive_lock
from ..errors import TorchcalError
from ..losses.multitask import UncertaintyWeighting
from ..runs import RunDir
from .build import build_data, build_model
from .checkpoint import save_checkpoint
from .config import TrainConfig, parse_task_weighting
from .distributed import epoch_permutation, epoch_seed

__all__ = ["parse_task_weighting", "TaskWeighting", "TwoTaskNet", "train_multitask",
           "MULTITASK_SCHEMA"]

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


class TwoTaskNet(nn.Module):
    """A classifier's trunk (``forward_features``) and ``fc``, plus a linear regression head.

    ``forward(x)`` returns ``(logits (N, C), prediction (N,))``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not hasattr(model, "forward_features") or not hasattr(model, "fc"):
            raise TorchcalError("Multi-task training needs a torchcal model with "
                                "forward_features, num_features and fc")
        self.model = model
        self.reg = nn.Linear(int(model.num_features), 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.model.forward_features(x)
        return self.model.fc(h), self.reg(h).squeeze(1)


def _targets(config: TrainConfig, splits: Any) -> tuple[dict[str, torch.Tensor], float, float]:
    """Per split the (standardised) regression targets, and the training mean and std."""
    param = config.tasks[1]
    if not hasattr(splits.train, "params") or param not in splits.train.params:
        have = sorted(getattr(splits.train, "params", {}))
        raise TorchcalError(
            f"Task {param!r} is not a parameter of data set {config.dataset!r} (its parameters: "
            f"{', '.join(have) or 'none'}; MNIST-1D needs the data arg with_params=true)")
    raw = {k: getattr(splits, k).params[param].float() for k in ("train", "val", "test")}
    mean, std = float(raw["train"].mean()), float(raw["train"].std())
    if not config.standardize_targets:
        mean, std = 0.0, 1.0
    if not std > 0:
        raise TorchcalError(f"Task {param!r} is constant on the training split")
    out = {k: (v - mean) / std for k, v in raw.items()}
    if config.target_noise > 0:
        g = torch.Generator().manual_seed(epoch_seed(config.seed, 0, stream=77))
        out["train"] = out["train"] + config.target_noise * torch.randn(
            out["train"].shape, generator=g)
    return out, mean, std


def _optimizer(config: TrainConfig, net: TwoTaskNet, weighting: TaskWeighting):
    groups = [{"params": list(net.parameters()), "lr": config.lr,
               "weight_decay": config.weight_decay}]
    if weighting.kendall is not None:
        groups.append({"params": [weighting.kendall.log_vars], "lr": config.log_var_lr,
                       "weight_decay": 0.0})
    return torch.optim.AdamW(groups)


@torch.no_grad()
def _evaluate(net: TwoTaskNet, x: torch.Tensor, y: torch.Tensor, t: torch.Tensor,
              std: float) -> dict[str, float]:
    """Accuracy, NLL and RMSE (in the parameter's units) of ``net`` on one split."""
    net.eval()
    logits, pred = [], []
    for s in range(0, x.shape[0], 4096):
        a, b = net(x[s:s + 4096])
        logits.append(a)
        pred.append(b)
    z, p = torch.cat(logits), torch.cat(pred)
    return {"accuracy": float((z.argmax(1) == y).double().mean()),
            "nll": float(F.cross_entropy(z.double(), y)),
            "rmse": float(((p - t).double().pow(2).mean().sqrt()) * std)}


def _epoch(net, weighting, opt, sched, x, y, t, config: TrainConfig, epoch: int):
    """One epoch; the mean CE and MSE over its batches."""
    net.train()
    perm = epoch_permutation(x.shape[0], config.seed, epoch)
    sums = torch.zeros(2)
    steps = 0
    for s in range(0, x.shape[0], config.batch_size):
        idx = perm[s:s + config.batch_size]
        if idx.shape[0] < 2:
            continue
        logits, pred = net(x[idx])
        ce, mse = F.cross_entropy(logits, y[idx]), F.mse_loss(pred, t[idx])
        loss = weighting(ce, mse)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        sums += torch.stack([ce.detach(), mse.detach()])
        steps += 1
    return (sums / max(steps, 1)).tolist()


def train_multitask(config: TrainConfig) -> dict[str, Any]:
    """Train the two-task run ``config`` (see the module docstring) and write its run directory.

    Returns:
        The results dict (also ``results.json``): ``val`` / ``test`` accuracy, NLL and RMSE,
        ``weights`` (the final task weights), ``log_vars`` (Kendall's, else None),
        ``target_mean`` / ``target_std`` and ``seconds``.
    """
    config.validate()
    if len(config.tasks) != 2 or config.tasks[0] != "class":
        raise ValueError(f"Expected `tasks` to be ['class', PARAM], got {config.tasks!r}")
    if config.resume:
        raise TorchcalError("Multi-task runs cannot be resumed; train them again")
    if config.num_threads is not None:
        torch.set_num_threads(int(config.num_threads))
    with exclusive_lock(config.out_dir):
        return _fit(config)


def _fit(config: TrainConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    run = RunDir(config.out_dir)
    if run.looks_like_run():
        raise TorchcalError(f"{config.out_dir!r} already holds a run; choose another --out")
    splits = build_data(config)
    targets, mean, std = _targets(config, splits)
    torch.manual_seed(config.seed)
    net = TwoTaskNet(build_model(config, splits.num_classes, splits.input_shape))
    weighting = TaskWeighting(config.task_weighting, config.log_var_init)
    opt = _optimizer(config, net, weighting)
    steps = config.epochs * sum(1 for s in range(0, len(splits.train), config.batch_size)
                                if len(splits.train) - s >= 2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
    run.write_config(config.to_dict())
    x, y = splits.train.data.float(), splits.train.labels
    vx, vy = splits.val.data.float(), splits.val.labels
    for epoch in range(config.epochs):
        t1 = time.perf_counter()
        ce, mse = _epoch(net, weighting, opt, sched, x, y, targets["train"], config, epoch)
        val = _evaluate(net, vx, vy, targets["val"], std)
        run.append_log({"epoch": epoch + 1, "train_ce": ce, "train_mse": mse,
                        "weights": weighting.weights().tolist(),
                        **{f"val_{k}": v for k, v in val.items()},
                        "seconds": time.perf_counter() - t1})
    res = _results(config, net, weighting, splits, targets, mean, std)
    save_checkpoint(run.checkpoint("last"), {
        "model": net.state_dict(), "weighting": weighting.state_dict(),
        "config": config.to_dict(), "epoch": config.epochs})
    res["seconds"] = time.perf_counter() - t0
    atomic_write_json(run.results(), res)
    return res


def _results(config, net, weighting, splits, targets, mean, std) -> dict[str, Any]:
    out: dict[str, Any] = {"schema": MULTITASK_SCHEMA, "tasks": list(config.tasks),
                           "task_weighting": config.task_weighting,
                           "target_noise": config.target_noise,
                           "target_mean": mean, "target_std": std,
                           "weights": weighting.weights().tolist(),
                           "log_vars": (weighting.kendall.log_vars.detach().tolist()
                                        if weighting.kendall is not None else None)}
    for k in ("val", "test"):
        ds = getattr(splits, k)
        out[k] = _evaluate(net, ds.data.float(), ds.labels, targets[k], std)
    return out
