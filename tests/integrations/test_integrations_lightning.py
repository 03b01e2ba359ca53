"""A real Lightning fit (tiny MLP, scikit-learn digits, 2 epochs, AdaFocal) with the callback:
γ moves after every validation, from exactly the validation logits, and the metrics logged
equal torchcal.metrics on those logits."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch
from integration_extras import require
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchcal.data import load_digits_splits
from torchcal.losses import AdaFocalLoss, ScheduledFocalLoss
from torchcal.losses.base import MissingValidationWarning
from torchcal.metrics import adaptive_ece, ece, error, nll

L = require("lightning", "lightning")
from torchcal.integrations.lightning import CalibrationCallback  # noqa: E402


def digits_data():
    """((x, y) train: 1077 noisy digits, (x, y) validation: 360 others), torchcal.data's split."""
    s = load_digits_splits(seed=0, n_copies=1, split=(0.6, 0.2, 0.2))
    return (s.train.data, s.train.labels), (s.val.data, s.val.labels)


def digits_loaders():
    (xt, yt), (xv, yv) = digits_data()
    train = DataLoader(TensorDataset(xt, yt), batch_size=100, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(xv, yv), batch_size=200)
    return train, val, (xv, yv)


class DigitsMLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.criterion = AdaFocalLoss(n_bins=5, lam=2.0)  # found by the callback
        self.schedule = ScheduledFocalLoss(milestones=(1,), gammas=(3.0, 1.0))  # found too

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.criterion(self(x), y)

    def validation_step(self, batch, batch_idx):  # the callback needs nothing from it
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class Record(L.Callback):
    """After each validation (the callback's work done): γ and the logged metrics."""

    def __init__(self) -> None:
        self.gammas, self.metrics = [], []

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.gammas.append(pl_module.criterion.gammas.clone())
            self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def make_trainer(root, callbacks, epochs=2, **kw):
    return L.Trainer(**{**dict(max_epochs=epochs, accelerator="cpu", devices=1,
                               callbacks=callbacks, logger=False, enable_checkpointing=False,
                               enable_progress_bar=False, enable_model_summary=False,
                               default_root_dir=root, deterministic=True), **kw})


def test_lightning_fit_moves_adafocal_and_logs_metrics(tmp_path):
    L.seed_everything(0, verbose=False)
    train, val, (xv, yv) = digits_loaders()
    model = DigitsMLP()
    gamma0 = model.criterion.gammas.clone()
    rec = Record()
    cb = CalibrationCallback(n_bins=15)
    trainer = make_trainer(tmp_path, [cb, rec])
    trainer.fit(model, train, val)

    # one update per validation epoch; the sanity check (2 batches by default) is skipped
    loss = model.criterion
    assert len(loss.history) == 2 and len(rec.gammas) == 2
    assert not torch.equal(rec.gammas[0], gamma0)
    assert not torch.equal(rec.gammas[1], rec.gammas[0])
    assert [int(h["counts"].sum()) for h in loss.history] == [len(yv), len(yv)]
    assert model.schedule.epoch == 1  # set_epoch at each training epoch start

    # the last update came from exactly the final model's validation logits
    model.eval()
    with torch.no_grad():
        zv = model(xv)
    replay = AdaFocalLoss(n_bins=5, lam=2.0)
    replay.gammas.copy_(loss.history[0]["gammas"])
    replay.bin_edges.copy_(loss.history[0]["bin_edges"])
    replay.update(logits=zv, labels=yv)
    torch.testing.assert_close(replay.gammas, loss.gammas, rtol=1e-6, atol=1e-9)

    # the metrics were logged after each validation epoch, the last ones equal torchcal.metrics
    for m in rec.metrics:
        assert set(cb.metric_names) <= set(m)
    expected = {"val_ece": ece(logits=zv, labels=yv, n_bins=15),
                "val_adaptive_ece": adaptive_ece(logits=zv, labels=yv, n_bins=15),
                "val_nll": nll(logits=zv, labels=yv), "val_error": error(logits=zv, labels=yv)}
    for k, v in expected.items():
        assert rec.metrics[-1][k] == pytest.approx(float(v), rel=1e-5, abs=1e-6), k
        assert float(trainer.callback_metrics[k]) == pytest.approx(float(v), rel=1e-5, abs=1e-6)
    assert rec.metrics[0]["val_ece"] != rec.metrics[1]["val_ece"]

    # trainer.validate logs the metrics but leaves the loss state alone
    state = loss.gammas.clone()
    out = make_trainer(tmp_path, [cb]).validate(model, val, verbose=False)[0]
    assert torch.equal(loss.gammas, state) and len(loss.history) == 2
    assert out["val_ece"] == pytest.approx(float(expected["val_ece"]), rel=1e-5, abs=1e-6)


def test_explicit_losses_and_custom_logits_fn(tmp_path):
    L.seed_everything(0, verbose=False)
    train, val, _ = digits_loaders()
    model = DigitsMLP()
    other = AdaFocalLoss(n_bins=3)  # not an attribute of the module
    calls = []

    def logits_fn(pl_module, batch):
        calls.append(batch[0].shape[0])
        return pl_module(batch[0])

    cb = CalibrationCallback(n_bins=10, losses=other, logits_fn=logits_fn, prefix="cal/")
    trainer = make_trainer(tmp_path, [cb], epochs=1)
    trainer.fit(model, train, val)
    assert len(other.history) == 1 and len(model.criterion.history) == 0
    assert sum(calls) == 360  # the sanity-check batches are not collected
    assert {"cal/ece", "cal/adaptive_ece", "cal/nll", "cal/error"} <= set(trainer.callback_metrics)


def test_bad_arguments():
    with pytest.raises(ValueError, match="`n_bins` to be a positive integer, got 0"):
        CalibrationCallback(n_bins=0)
    with pytest.raises(TypeError, match="`losses` to hold objects with an `on_validation`"):
        CalibrationCallback(losses=[nn.CrossEntropyLoss()])
    with pytest.raises(TypeError, match="`logits_fn` to be None or callable"):
        CalibrationCallback(logits_fn=3)


def test_ddp_two_processes_share_one_loss_state(tmp_path):
    # two CPU ranks (gloo): each collects its half of the validation set, yet every rank logs
    # the metrics of the whole set and ends with the AdaFocal state of one process over it
    worker = pathlib.Path(__file__).with_name("lightning_ddp_worker.py")
    src = str(pathlib.Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([src, str(worker.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out.pt"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", str(worker), str(out)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    r0, r1 = (torch.load(f"{out}.{r}", weights_only=True) for r in range(2))

    assert len(r0["history"]) == 2
    for a, b in zip(r0["history"], r1["history"], strict=True):
        assert torch.equal(a, b)  # identical loss state on both ranks after every update
    assert [int(c.sum()) for c in r0["counts"]] == [360, 360]  # the whole set, not a half
    assert not torch.equal(r0["history"][0], r0["history"][1])
    zv, yv = r0["logits"], r0["labels"]
    torch.testing.assert_close(zv, r1["logits"])  # DDP kept the replicas equal
    replay = AdaFocalLoss(n_bins=5, lam=2.0)
    replay.gammas.copy_(r0["gamma0"])
    replay.bin_edges.copy_(r0["edges0"])
    replay.update(logits=zv, labels=yv)
    torch.testing.assert_close(replay.gammas, r0["gammas"], rtol=1e-6, atol=1e-9)
    for k, fn in (("val_ece", ece), ("val_adaptive_ece", adaptive_ece)):
        v = float(fn(logits=zv, labels=yv, n_bins=15))
        assert r0["metrics"][k] == r1["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    for k, fn in (("val_nll", nll), ("val_error", error)):
        v = float(fn(logits=zv, labels=yv))
        assert r0["metrics"][k] == r1["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def _fit_warnings(tmp_path, model, callbacks, val=None, epochs=2):
    train, _, _ = digits_loaders()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        make_trainer(tmp_path, callbacks, epochs=epochs, limit_train_batches=1,
                     num_sanity_val_steps=0).fit(model, train, val)
    return [str(w.message) for w in rec if issubclass(w.category, MissingValidationWarning)]


def test_no_validation_loader_warns(tmp_path):
    # issue 24, 1: Lightning without a validation loader left γ at 1, metrics {} and no word
    L.seed_everything(0, verbose=False)
    model = DigitsMLP()
    msgs = _fit_warnings(tmp_path, model, [CalibrationCallback()])
    assert any("AdaFocalLoss" in m and "val_dataloaders" in m for m in msgs)
    assert len(model.criterion.history) == 0


def test_module_loss_not_among_given_losses_warns(tmp_path):
    L.seed_everything(0, verbose=False)
    _, val, _ = digits_loaders()
    msgs = _fit_warnings(tmp_path, DigitsMLP(), [CalibrationCallback(losses=AdaFocalLoss())],
                         val=val, epochs=1)
    assert any("AdaFocalLoss" in m and "other `losses`" in m for m in msgs)


def test_validated_fit_is_quiet(tmp_path):
    L.seed_everything(0, verbose=False)
    _, val, _ = digits_loaders()
    model = DigitsMLP()
    assert _fit_warnings(tmp_path, model, [CalibrationCallback()], val=val) == []
    assert len(model.criterion.history) == 2
