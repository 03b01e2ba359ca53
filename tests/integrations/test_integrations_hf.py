"""A real transformers Trainer fit (a tiny randomly initialised BERT built from a config, no hub
download, a synthetic token task, 2 epochs, AdaFocal through compute_loss_func) with the
callback: γ moves after every evaluation, from exactly the evaluation logits, and the metrics
recorded in log_history equal torchcal.metrics on those logits."""

from __future__ import annotations

import os
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never reach the hub

import pytest  # noqa: E402
import torch  # noqa: E402
from integration_extras import require  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from torchcal.losses import AdaFocalLoss, FocalLoss, ScheduledFocalLoss  # noqa: E402
from torchcal.losses.base import MissingValidationWarning  # noqa: E402
from torchcal.metrics import adaptive_ece, ece, error, nll  # noqa: E402

transformers = require("transformers", "hf")
require("accelerate", "hf")
from torchcal.integrations.hf import (  # noqa: E402
    CalibrationCallback,
    compute_loss_func,
    compute_metrics,
)

VOCAB, LENGTH, CLASSES = 30, 8, 3


class TokenTask(Dataset):
    """Random token sequences; the label is the count of tokens < 10, modulo 3."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
        self.labels = (self.ids < 10).sum(1) % CLASSES

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.int64),
                "labels": self.labels[i]}


def tiny_bert():
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=LENGTH, num_labels=CLASSES,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def training_args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=32,
                per_device_eval_batch_size=100, learning_rate=5e-3, eval_strategy="epoch",
                save_strategy="no", logging_strategy="epoch", report_to="none", use_cpu=True,
                dataloader_num_workers=0, disable_tqdm=True, seed=0)
    return transformers.TrainingArguments(**{**base, **kw})


class Record(transformers.TrainerCallback):
    """After each evaluation (the calibration callback's work done): γ."""

    def __init__(self, loss) -> None:
        self.loss, self.gammas = loss, []

    def on_evaluate(self, args, state, control, **kwargs):
        self.gammas.append(self.loss.gammas.clone())


def eval_logits(model, data):
    model.eval()
    with torch.no_grad():
        return model(input_ids=data.ids, attention_mask=torch.ones_like(data.ids)).logits


def test_trainer_fit_moves_adafocal_and_records_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train, val = TokenTask(256, seed=1), TokenTask(200, seed=2)
    model = tiny_bert()
    loss = AdaFocalLoss(n_bins=5, lam=2.0)
    schedule = ScheduledFocalLoss(milestones=(1,), gammas=(3.0, 1.0))
    gamma0 = loss.gammas.clone()
    rec = Record(loss)
    trainer = transformers.Trainer(
        model=model, args=training_args(tmp_path), train_dataset=train, eval_dataset=val,
        compute_loss_func=compute_loss_func(loss),
        callbacks=[CalibrationCallback(losses=[loss, schedule]), rec])
    trainer.train()

    # one update per evaluation, from the whole evaluation set
    assert len(loss.history) == 2 and len(rec.gammas) == 2
    assert not torch.equal(rec.gammas[0], gamma0)
    assert not torch.equal(rec.gammas[1], rec.gammas[0])
    assert [int(h["counts"].sum()) for h in loss.history] == [200, 200]
    assert schedule.epoch == 1

    zv = eval_logits(model, val)
    replay = AdaFocalLoss(n_bins=5, lam=2.0)
    replay.gammas.copy_(loss.history[0]["gammas"])
    replay.bin_edges.copy_(loss.history[0]["bin_edges"])
    # the Trainer's eval loss is the torchcal loss (γ of the first update) on these logits
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(evals) == 2
    assert evals[-1]["eval_loss"] == pytest.approx(float(replay(zv, val.labels)), rel=1e-4)
    replay.update(logits=zv, labels=val.labels)
    torch.testing.assert_close(replay.gammas, loss.gammas, rtol=1e-6, atol=1e-9)

    # the calibration metrics are in each evaluation's log_history entry
    for h in evals:
        assert {"eval_ece", "eval_adaptive_ece", "eval_nll", "eval_error"} <= set(h)
    expected = {"eval_ece": ece(logits=zv, labels=val.labels, n_bins=15),
                "eval_adaptive_ece": adaptive_ece(logits=zv, labels=val.labels, n_bins=15),
                "eval_nll": nll(logits=zv, labels=val.labels),
                "eval_error": error(logits=zv, labels=val.labels)}
    for k, v in expected.items():
        assert evals[-1][k] == pytest.approx(float(v), rel=1e-5, abs=1e-6), k
    assert evals[0]["eval_nll"] != evals[1]["eval_nll"]

    # a standalone evaluate() returns the metrics and leaves the loss state alone
    state = loss.gammas.clone()
    out = trainer.evaluate()
    assert out["eval_ece"] == pytest.approx(float(expected["eval_ece"]), rel=1e-5, abs=1e-6)
    assert torch.equal(loss.gammas, state) and len(loss.history) == 2


def test_compute_loss_func_matches_one_big_batch_under_accumulation():
    # the Trainer sums fn(micro-batch, num_items_in_batch) over accumulation steps: that sum
    # must equal the loss of the whole batch, for "mean" and for "sum"
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(10, 4, generator=g), torch.randint(0, 4, (10,), generator=g)
    y[3] = -100
    for reduction in ("mean", "sum"):
        loss = FocalLoss(gamma=2.0, reduction=reduction)
        fn = compute_loss_func(loss)
        n_items = int((y != -100).sum())
        acc = sum(fn({"logits": z[s:s + 4]}, y[s:s + 4], num_items_in_batch=n_items)
                  for s in range(0, 10, 4))
        torch.testing.assert_close(acc, loss(z, y))
    # token classification: (N, T, C) logits against (N, T) labels
    zt, yt = torch.randn(2, 5, 3, generator=g), torch.randint(0, 3, (2, 5), generator=g)
    fn = compute_loss_func(FocalLoss(gamma=1.0))
    torch.testing.assert_close(fn((zt,), yt), FocalLoss(gamma=1.0)(zt.reshape(-1, 3), yt.reshape(-1)))


def test_bad_arguments():
    with pytest.raises(ValueError, match="`n_bins` to be a positive integer, got 0"):
        CalibrationCallback(n_bins=0)
    with pytest.raises(TypeError, match="`losses` to hold objects with an `on_validation`"):
        CalibrationCallback(losses=[torch.nn.CrossEntropyLoss()])
    with pytest.raises(ValueError, match="`reduction` to be 'mean' or 'sum'"):
        compute_loss_func(FocalLoss(reduction="none"))
    with pytest.raises(ValueError, match="mappings with a 'labels' entry"):
        CalibrationCallback.predict(torch.nn.Linear(2, 2), [(torch.zeros(1, 2), 0)])


def test_metrics_reach_the_console_and_tensorboard(tmp_path, capsys):
    """Issue 26 (4): with compute_metrics the Trainer itself logs eval_ece ... as it logs
    eval_loss: printed on the console (PrinterCallback) and written to TensorBoard (eval/ece),
    with the values of torchcal.metrics on the evaluation logits."""
    pytest.importorskip("tensorboard", reason="TensorBoard is in the test extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train, val = TokenTask(128, seed=1), TokenTask(100, seed=2)
    model = tiny_bert()
    trainer = transformers.Trainer(
        model=model, train_dataset=train, eval_dataset=val,
        args=training_args(tmp_path / "out", num_train_epochs=1, report_to=["tensorboard"]),
        compute_metrics=compute_metrics(n_bins=15))
    trainer.train()
    console = capsys.readouterr().out
    zv = eval_logits(model, val)
    want = {"ece": ece(logits=zv, labels=val.labels, n_bins=15),
            "adaptive_ece": adaptive_ece(logits=zv, labels=val.labels, n_bins=15),
            "nll": nll(logits=zv, labels=val.labels), "error": error(logits=zv, labels=val.labels)}
    printed = [line for line in console.splitlines() if "'eval_loss'" in line]
    assert printed and all(f"'eval_{k}'" in printed[-1] for k in want), console[-2000:]
    events = list((tmp_path / "out").rglob("events.out.tfevents.*"))  # output_dir/runs/...
    assert events, "no TensorBoard event file"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    for k, v in want.items():
        (scalar,) = acc.Scalars(f"eval/{k}")
        assert scalar.value == pytest.approx(float(v), rel=1e-5, abs=1e-6), k
    assert trainer.evaluate()["eval_ece"] == pytest.approx(float(want["ece"]), rel=1e-5)


def test_compute_metrics_flattens_token_logits_and_drops_ignored_labels():
    z = torch.randn(2, 4, 3)  # (N, T, C) token logits
    y = torch.tensor([[0, 1, -100, 2], [1, -100, 1, 0]])
    out = compute_metrics(n_bins=5)(transformers.EvalPrediction(
        predictions=(z.numpy(), z.numpy()), label_ids=y.numpy()))
    keep = y.reshape(-1) != -100
    zf, yf = z.reshape(-1, 3)[keep], y.reshape(-1)[keep]
    assert out["ece"] == pytest.approx(float(ece(logits=zf, labels=yf, n_bins=5)), rel=1e-6)
    assert out["nll"] == pytest.approx(float(nll(logits=zf, labels=yf)), rel=1e-6)
    with pytest.raises(ValueError, match="`n_bins`"):
        compute_metrics(n_bins=0)


def test_callback_predict_takes_token_logits_n_t_c():
    """Issue 39: the callback's evaluation path on (N, T, C) logits (a causal LM's) with
    (N, T) labels was a shape error; it flattens by position and drops -100 labels."""

    class TokenModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 7)

        def forward(self, input_ids):
            return {"logits": self.emb(input_ids)}  # (N, T, 7)

    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 10, (3, 5), generator=g),
                "labels": torch.randint(0, 7, (3, 5), generator=g)} for _ in range(2)]
    batches[0]["labels"][:, -2:] = -100
    model = TokenModel()
    z, y = CalibrationCallback.predict(model, batches)
    zs = torch.cat([model(b["input_ids"])["logits"].reshape(-1, 7) for b in batches]).detach()
    ys = torch.cat([b["labels"].reshape(-1) for b in batches])
    keep = ys != -100
    assert torch.equal(z, zs[keep]) and torch.equal(y, ys[keep])


def _fit_warnings(tmp_path, callbacks, loss, **kw):
    train, val = TokenTask(64, seed=1), TokenTask(50, seed=2)
    trainer = transformers.Trainer(
        model=tiny_bert(), args=training_args(tmp_path, **kw), train_dataset=train,
        eval_dataset=val, compute_loss_func=compute_loss_func(loss), callbacks=callbacks)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        trainer.train()
    return [str(w.message) for w in rec if issubclass(w.category, MissingValidationWarning)]


def test_stateful_loss_not_given_to_the_callback_warns(tmp_path, monkeypatch):
    # issue 24, 1: CalibrationCallback() without losses=[loss] left AdaFocal at γ = 1 silently
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loss = AdaFocalLoss(n_bins=3)
    msgs = _fit_warnings(tmp_path, [CalibrationCallback()], loss, max_steps=1)
    assert any("AdaFocalLoss" in m and "CalibrationCallback(losses=[loss])" in m for m in msgs)
    assert len(loss.history) == 0


def test_callback_given_the_loss_but_no_evaluation_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loss = AdaFocalLoss(n_bins=3)
    msgs = _fit_warnings(tmp_path, [CalibrationCallback(losses=[loss])], loss,
                         eval_strategy="no", max_steps=1)
    assert any("AdaFocalLoss" in m and "eval_strategy" in m for m in msgs)


def test_callback_given_the_loss_and_evaluating_is_quiet(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loss = AdaFocalLoss(n_bins=3)
    assert _fit_warnings(tmp_path, [CalibrationCallback(losses=[loss])], loss) == []
    assert len(loss.history) == 2
