"""The multi-task strategy: task weightings, the log-variances' parameter group, a tiny run
through the one engine, its results format and its resume."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
import torch

import torchcal.train.engine as E
from torchcal.losses import UncertaintyWeighting
from torchcal.models import create_model
from torchcal.train import get_recipe, train
from torchcal.train.config import parse_task_weighting
from torchcal.train.multitask import TaskHead, TaskWeighting


@pytest.mark.parametrize("text,want", [
    ("kendall", ("kendall", None)), ("equal", ("equal", (1.0, 1.0))),
    ("fixed:1,10", ("fixed", (1.0, 10.0))), ("fixed:0,2.5", ("fixed", (0.0, 2.5))),
])
def test_parse_task_weighting(text, want):
    assert parse_task_weighting(text) == want


@pytest.mark.parametrize("text", ["fixed:1", "fixed:a,b", "fixed:-1,1", "fixed:0,0", "kendal",
                                  "fixed:nan,1"])
def test_parse_task_weighting_rejects(text):
    with pytest.raises(ValueError, match="task_weighting"):
        parse_task_weighting(text)


def test_weightings_match_their_formulas():
    ce, mse = torch.tensor(0.7), torch.tensor(2.0)
    assert float(TaskWeighting("fixed:2,0.5")(ce, mse)) == pytest.approx(2 * 0.7 + 0.5 * 2.0)
    assert float(TaskWeighting("equal")(ce, mse)) == pytest.approx(2.7)
    k = TaskWeighting("kendall", log_var_init=0.3)
    s = 0.3  # exp(-s) CE + 1/2 exp(-s) MSE + (s + s) / 2, computed by hand
    want = math.exp(-s) * 0.7 + 0.5 * math.exp(-s) * 2.0 + s
    assert float(k(ce, mse)) == pytest.approx(want, rel=1e-6)
    assert k.weights().tolist() == pytest.approx([math.exp(-s), 0.5 * math.exp(-s)], rel=1e-6)


def _splits():
    """Three splits of 6 samples with a ``translation`` parameter (what TaskHead reads)."""
    part = SimpleNamespace(params={"translation": torch.arange(6.0)})
    return SimpleNamespace(train=part, val=part, test=part)


def test_log_variances_have_their_own_group():
    recipe = get_recipe("mnist1d-multitask")
    cfg = dataclasses.replace(recipe, multitask=dataclasses.replace(recipe.multitask,
                                                                    log_var_lr=0.07))
    model = create_model("mnist1d_cnn", 10, width=4)
    head = TaskHead(model, cfg, _splits(), torch.device("cpu"))
    opt = head.make_optimizer(model, cfg)
    assert len(opt.param_groups) == 2
    g = opt.param_groups[1]
    assert g["params"][0] is head.weighting.kendall.log_vars
    assert g["lr"] == 0.07 and g["weight_decay"] == 0
    assert opt.param_groups[0]["lr"] == cfg.lr
    trained = list(model.parameters()) + list(head.reg.parameters())
    assert opt.param_groups[0]["params"] == trained  # the trunk, fc and the regression head
    equal = dataclasses.replace(cfg, multitask=dataclasses.replace(cfg.multitask,
                                                                   task_weighting="equal"))
    assert len(TaskHead(model, equal, _splits(), torch.device("cpu"))
               .make_optimizer(model, equal).param_groups) == 1


def test_why_the_log_variances_need_their_own_learning_rate():
    """The documented reason: Adam moves s by about lr per step, so at the trunk's lr the
    log-variances cannot reach log(2 c L) for a raw-unit regression loss in a short run."""
    losses = torch.tensor([0.3, 100.0])  # CE, raw-unit MSE
    optimum = [math.log(2 * 1.0 * 0.3), math.log(2 * 0.5 * 100.0)]  # -0.51, 4.61
    reached = {}
    for lr in (3e-3, 0.05):
        m = UncertaintyWeighting(("classification", "regression"))
        opt = torch.optim.Adam([m.log_vars], lr=lr)
        for _ in range(200):
            opt.zero_grad()
            m(losses).backward()
            opt.step()
        reached[lr] = m.log_vars.detach().tolist()
    assert abs(reached[3e-3][1]) <= 200 * 3e-3 * 1.01  # at most lr per step: 0.6 of 4.6
    assert reached[0.05][0] == pytest.approx(optimum[0], abs=0.01)
    # Adam's second moment remembers the large early gradient: even at 0.05 the raw-unit
    # task's s is still short of 4.61 after 200 steps (3.39), one reason to standardise
    assert 3.0 < reached[0.05][1] < optimum[1]


def _tiny(tmp_path, name, **kw):
    cfg = get_recipe("mnist1d-multitask")
    mt = {k: kw.pop(k) for k in [f.name for f in dataclasses.fields(cfg.multitask)] if k in kw}
    kw = {"epochs": 2, "multitask": dataclasses.replace(cfg.multitask, **mt), **kw}
    return dataclasses.replace(
        cfg, out_dir=str(tmp_path / name), data_root=str(tmp_path / "data"),
        model_kwargs={"width": 8}, progress=False,
        data_kwargs={"with_params": True, "n_train": 120, "n_val": 40, "n_test": 40}, **kw)


def test_tiny_run_writes_results(tmp_path):
    summary = train(_tiny(tmp_path, "k"))
    common = json.loads((tmp_path / "k" / "results.json").read_text())
    assert common["schema"] == "torchcal.results/1"  # the common format, with its block
    assert common["meta"]["seed"] == 0 and "ece" in common["test"]["pre"]
    res = common["multitask"]
    assert res == summary["results"]["multitask"]
    assert res["tasks"] == ["class", "translation"] and len(res["log_vars"]) == 2
    assert 0 <= res["test"]["accuracy"] <= 1 and res["test"]["rmse"] > 0
    # the classifier's accuracy in both blocks is the same model's on the same split
    assert res["test"]["accuracy"] == pytest.approx(1 - common["test"]["pre"]["error"])
    from torchcal.data import load_splits

    s = load_splits("mnist1d", tmp_path / "data", seed=42, with_params=True, n_train=120,
                    n_val=40, n_test=40)
    t = s.train.params["translation"].float()
    assert res["target_mean"] == pytest.approx(float(t.mean()))
    assert res["target_std"] == pytest.approx(float(t.std()))
    log = [json.loads(line) for line in (tmp_path / "k" / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2]
    assert {"train_ce", "train_mse", "task_weights", "val_rmse", "val_ece"} <= set(log[0])


def test_a_killed_run_resumes_to_the_uninterrupted_numbers(tmp_path, monkeypatch):
    """Interrupted at the end of its 2nd of 3 epochs (checkpoint of epoch 1 kept: the
    regression head, the weighting, AdamW and the cosine schedule), resumed: the results of
    the uninterrupted run, bit for bit."""
    whole = train(_tiny(tmp_path, "whole", epochs=3))["results"]["multitask"]
    orig = E.end_epoch

    def interrupting(stack, lanes, groups, stats, epoch, *a, **kw):
        if epoch == 1:
            raise KeyboardInterrupt
        return orig(stack, lanes, groups, stats, epoch, *a, **kw)

    monkeypatch.setattr(E, "end_epoch", interrupting)
    with pytest.raises(KeyboardInterrupt):
        train(_tiny(tmp_path, "cut", epochs=3))
    monkeypatch.setattr(E, "end_epoch", orig)
    resumed = train(_tiny(tmp_path, "cut", epochs=3, resume=True))
    assert resumed["resumed_from"] == 1
    assert resumed["results"]["multitask"] == whole


def test_noise_only_on_training_targets(tmp_path):
    a = train(_tiny(tmp_path, "a", task_weighting="fixed:1,1"))["results"]["multitask"]
    b = train(_tiny(tmp_path, "b", task_weighting="fixed:1,1", target_noise=0.0))["results"]
    assert a["test"] == b["multitask"]["test"]  # deterministic
    c = train(_tiny(tmp_path, "c", task_weighting="fixed:1,1", target_noise=3.0))["results"]
    c = c["multitask"]
    assert c["test"]["rmse"] != a["test"]["rmse"]
    assert c["target_mean"] == a["target_mean"]  # statistics of the clean targets


def test_bad_task_and_missing_params(tmp_path):
    recipe = get_recipe("mnist1d-multitask")
    with pytest.raises(ValueError, match=r"`multitask.tasks` to be \[\] or \['class', PARAM\]"):
        dataclasses.replace(recipe, multitask=dataclasses.replace(
            recipe.multitask, tasks=["translation"])).validate()
    cfg = _tiny(tmp_path, "x", tasks=["class", "nope"])
    with pytest.raises(Exception, match="nope"):
        train(cfg)


def test_evaluating_a_multitask_checkpoint_keeps_its_block(tmp_path):
    """`torchcal eval` of a multi-task run rewrites results.json: its `multitask` block is
    recomputed from the checkpoint's regression head (it was dropped), equal to training's."""
    from torchcal.train import evaluate_checkpoint

    cfg = _tiny(tmp_path, "e")
    trained = train(cfg)["results"]["multitask"]
    again = evaluate_checkpoint(cfg.out_dir)
    assert again["multitask"] == trained
    assert json.loads((tmp_path / "e" / "results.json").read_text())["multitask"] == trained


def test_sample_variance_head_trains_on_the_gaussian_nll(tmp_path):
    """regression_variance='sample': a (mean, log-variance) head whose loss is the Gaussian NLL
    (checked by hand on one batch), and results carrying the predictions the regression
    section of the uncertainty suite calibrates (their RMSE equals the block's)."""
    cfg = _tiny(tmp_path, "h", regression_variance="sample", task_weighting="equal")
    model = create_model("mnist1d_cnn", 10, width=4)
    head = TaskHead(model, cfg, _splits(), torch.device("cpu"))
    feats = torch.randn(3, model.num_features)
    index = torch.tensor([0, 2, 5])
    out, t = head.reg(feats), head.targets["train"][index]
    nll = (0.5 * (out[:, 1] + (t - out[:, 0]) ** 2 / out[:, 1].exp())).mean()
    got = head.add_loss(torch.tensor(0.25), None, feats, None, index)
    assert float(got.detach()) == pytest.approx(0.25 + float(nll.detach()), rel=1e-6)

    res = train(cfg)["results"]["multitask"]
    assert res["regression_variance"] == "sample"
    for split in ("val", "test"):
        pred = res["predictions"][split]
        assert len(pred["mean"]) == len(pred["target"]) == len(pred["log_var"]) == 40
        err = torch.tensor(pred["mean"]) - torch.tensor(pred["target"])
        rmse = float(err.double().pow(2).mean().sqrt()) * res["target_std"]
        assert rmse == pytest.approx(res[split]["rmse"], rel=1e-5)
    plain = train(_tiny(tmp_path, "m"))["results"]["multitask"]
    assert "log_var" not in plain["predictions"]["test"]


def test_sample_variance_refuses_kendall_weighting(tmp_path):
    with pytest.raises(ValueError, match="regression_variance='sample'"):
        _tiny(tmp_path, "x", regression_variance="sample").validate()
    with pytest.raises(ValueError, match="regression_variance"):
        _tiny(tmp_path, "y", regression_variance="both", task_weighting="equal").validate()
