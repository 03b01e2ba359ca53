"""The recipe's optimisation as run: multistep schedule, gradient clipping, published reductions,
and the DDP gather that drops a distributed sampler's padding."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from torchcal.train import TrainConfig, build_loss, get_recipe, train


def test_multistep_schedule_and_clipping_as_configured(tiny_config, tmp_path, monkeypatch):
    calls = []
    real = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm, *a, **k):
        params = list(params)
        calls.append((max_norm, len(params)))
        return real(params, max_norm, *a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    cfg = tiny_config(epochs=3, milestone_fractions=None, milestones=[1, 2], lr=0.05,
                  lr_gamma=0.1, grad_clip=0.5)
    train(cfg)
    lines = [json.loads(s) for s in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in lines] == pytest.approx([0.05, 0.005, 0.0005], rel=1e-9)
    # one clip per optimiser step, at the configured norm, over the classifier's parameters
    from torchcal.train import build_data
    from torchcal.train.run import n_batches as _n_batches

    n_train = len(build_data(cfg).train.labels)
    assert len(calls) == 3 * _n_batches(n_train, 1, cfg.batch_size)
    assert {c for c in calls} == {(0.5, 6)}  # MLP 64-256-256-10: 3 weights + 3 biases
    # no clipping when disabled
    calls.clear()
    train(dataclasses.replace(cfg, out_dir=str(tmp_path / "noclip"), grad_clip=None, epochs=1))
    assert calls == []


def test_one_epoch_run_trains_at_the_initial_learning_rate(tiny_config, tmp_path):
    """Milestone fractions of a 1-epoch run must not land on epoch 0 (lr x 0.01 from the start)."""
    train(tiny_config(epochs=1))
    rec = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    assert rec["lr"] == pytest.approx(0.05)
    assert TrainConfig(epochs=3, milestone_fractions=[0.5, 0.75]).effective_milestones() == [1, 2]
    assert TrainConfig(epochs=2, milestone_fractions=[0.0]).effective_milestones() == [0]


def test_published_reductions_per_loss():
    """REFERENCE §1: summed CE / focal family, averaged Brier, MMCE as N·(CE_mean + λ·MMCE)."""
    cfg = get_recipe("cifar10-resnet50")
    torch.manual_seed(0)
    z = torch.randn(12, 10, dtype=torch.float64) * 3
    y = torch.randint(0, 10, (12,))
    ce = build_loss(dataclasses.replace(cfg, loss="ce"))
    assert ce.reduction == "sum"
    torch.testing.assert_close(ce(z, y), F.cross_entropy(z, y, reduction="sum"))
    for name in ("focal", "flsd53", "dual_focal", "bsce_gra", "ls"):
        assert build_loss(dataclasses.replace(cfg, loss=name)).reduction == "sum", name
    brier = build_loss(dataclasses.replace(cfg, loss="brier"))
    assert brier.reduction == "mean"
    p = z.softmax(1)
    torch.testing.assert_close(brier(z, y), ((p - F.one_hot(y, 10)) ** 2).sum(1).mean())
    mmce_pub = build_loss(dataclasses.replace(cfg, loss="mmce"))
    assert mmce_pub.reduction == "sum"
    mmce_mean = build_loss(dataclasses.replace(cfg, loss="mmce", reduction="mean"))
    torch.testing.assert_close(mmce_pub(z, y), 12 * mmce_mean(z, y))
    # the digits recipe trains with plain means
    d = get_recipe("digits-mlp")
    assert build_loss(dataclasses.replace(d, loss="focal")).reduction == "mean"


@pytest.mark.parametrize("n,world", [(11, 2), (7, 3), (3, 4)])
def test_gather_padded_drops_the_sampler_padding(n, world, monkeypatch):
    """gather_padded itself (a faked all_gather): every sample once, in order, padding dropped."""
    from torchcal.train import distributed as D

    idx = torch.arange(n)
    shards = [D.shard_indices(idx, r, world)[0] for r in range(world)]
    values = [(s.double() * 10)[:, None].repeat(1, 2) for s in shards]  # rows: 10 * index

    def fake_all_gather(parts, local):
        for p, v in zip(parts, values, strict=True):
            p.copy_(v)

    monkeypatch.setattr(D.dist, "all_gather", fake_all_gather)
    out = D.gather_padded(values[1], n, D.DistEnv(rank=1, world_size=world))
    assert out.shape == (n, 2)
    assert out[:, 0].tolist() == [10.0 * i for i in range(n)]


def test_resume_rejects_other_data_or_fewer_epochs(tiny_config, tmp_path):
    """A checkpoint is never silently reported under settings it was not trained with."""
    from torchcal.errors import CheckpointError

    cfg = tiny_config(epochs=2, data_kwargs={"noise_std": 0.5})
    train(cfg)
    with pytest.raises(CheckpointError, match="data_kwargs"):
        train(dataclasses.replace(cfg, resume=True, data_kwargs={"noise_std": 0.3}))
    with pytest.raises(CheckpointError, match="val_fraction"):
        train(dataclasses.replace(cfg, resume=True, val_fraction=0.2))
    with pytest.raises(CheckpointError, match="trained 2 epochs.*epochs=1"):
        train(dataclasses.replace(cfg, resume=True, epochs=1))
    # the same settings: a finished run resumes (nothing to train)
    out = train(dataclasses.replace(cfg, resume=True))
    assert out["resumed_from"] == 2
    # `verify` only skips an MD5 check
    assert dataclasses.replace(cfg, data_kwargs={"verify": False}).data_identity() == {}


def test_best_checkpoint_holds_the_selected_epochs_weights(tiny_config, tmp_path):
    from torchcal.train import build_data, load_model_from_run, predict_logits

    # (at the default lr 0.05 the validation ECE is lowest after epoch 1: best != last)
    cfg = tiny_config(epochs=3, select_best_by="ece", milestone_fractions=None,
                  milestones=[2])
    summary = train(cfg)
    lines = [json.loads(s) for s in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    best_epoch = summary["best"]["epoch"]
    assert lines[best_epoch - 1]["val_ece"] == min(r["val_ece"] for r in lines)
    assert best_epoch < 3, "this configuration is meant to select an earlier epoch"
    splits = build_data(cfg)
    for which, epoch in (("best", best_epoch), ("last", 3)):
        model, _ = load_model_from_run(tmp_path / "run", checkpoint=which)
        z, y = predict_logits(model, splits.val, "cpu", 512)
        assert float(F.cross_entropy(z, y)) == pytest.approx(lines[epoch - 1]["val_nll"],
                                                             abs=1e-5), which
