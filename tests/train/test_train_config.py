"""TrainConfig validation, the recipe registry and that every recipe builds its model and loss."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torchcal.cli._args import parse_loss_args
from torchcal.errors import TorchcalError
from torchcal.train import TrainConfig, get_recipe, list_recipes, register_recipe

ALL_RECIPES = [
    "cifar10-resnet50", "cifar100-resnet50", "cifar10-resnet110", "cifar100-resnet110",
    "cifar10-wrn26-10", "cifar100-wrn26-10", "cifar10-densenet121", "cifar100-densenet121",
    "tinyimagenet-resnet50", "imagenet-resnet50", "digits-mlp",
]


def test_every_required_recipe_is_registered():
    assert set(ALL_RECIPES) <= set(list_recipes())
    assert list_recipes("digits-*") == ["digits-mlp"]


@pytest.mark.parametrize("name", [n for n in ALL_RECIPES if n.startswith("cifar")])
def test_cifar_recipes_have_the_papers_settings(name):
    c = get_recipe(name)
    assert (c.epochs, c.batch_size, c.lr, c.momentum, c.weight_decay) == (350, 128, 0.1, 0.9, 5e-4)
    assert c.effective_milestones() == [150, 250] and c.lr_gamma == 0.1
    assert c.grad_clip == 2.0 and c.reduction == "published"
    assert c.val_fraction == 0.1 and c.data_seed == 1
    assert c.dataset == name.split("-")[0] and c.recipe == name


def test_tinyimagenet_imagenet_digits_recipes():
    t = get_recipe("tinyimagenet-resnet50")
    assert (t.dataset, t.model, t.epochs, t.batch_size, t.milestones) == (
        "tinyimagenet", "resnet50_tiny", 100, 64, [40, 60])
    assert t.loss_defaults["dual_focal"] == {"gamma": 2.3}
    i = get_recipe("imagenet-resnet50")
    assert (i.model, i.epochs, i.batch_size, i.lr, i.weight_decay, i.milestones) == (
        "imagenet_resnet50", 90, 256, 0.1, 1e-4, [30, 60])
    d = get_recipe("digits-mlp")
    assert (d.dataset, d.model, d.epochs, d.batch_size, d.lr, d.momentum, d.weight_decay) == (
        "digits", "mlp", 100, 64, 0.05, 0.9, 5e-4)
    assert d.effective_milestones() == [50, 75]
    # the schedule keeps its shape when the demo shortens the run
    assert dataclasses.replace(d, epochs=30).effective_milestones() == [15, 22]


def test_dual_focal_gammas_follow_the_paper():
    expect = {"cifar10-resnet50": 5.0, "cifar10-resnet110": 4.5, "cifar10-wrn26-10": 2.6,
              "cifar10-densenet121": 5.0, "cifar100-resnet50": 5.0, "cifar100-resnet110": 6.1,
              "cifar100-wrn26-10": 3.9, "cifar100-densenet121": 3.4}
    for name, g in expect.items():
        c = dataclasses.replace(get_recipe(name), loss="dual_focal")
        assert c.effective_loss_kwargs() == {"gamma": g}
        # an explicit value wins
        c2 = dataclasses.replace(c, loss_kwargs={"gamma": 1.0})
        assert c2.effective_loss_kwargs() == {"gamma": 1.0}


def test_get_recipe_returns_independent_copies():
    a = get_recipe("cifar10-resnet50")
    a.milestones.append(999)
    a.loss_defaults["ls"]["alpha"] = 0.3
    b = get_recipe("cifar10-resnet50")
    assert b.milestones == [150, 250] and b.loss_defaults["ls"]["alpha"] == 0.05


def test_unknown_recipe_lists_the_valid_ones():
    with pytest.raises(TorchcalError, match="Unknown recipe 'nope'.*digits-mlp"):
        get_recipe("nope")


def test_register_recipe():
    name = "test-train-config-recipe"
    if name not in list_recipes():
        register_recipe(name, TrainConfig(dataset="digits", model="mlp", epochs=3))
    assert get_recipe(name).epochs == 3 and get_recipe(name).recipe == name
    with pytest.raises(ValueError, match="already registered"):
        register_recipe(name, TrainConfig())
    with pytest.raises(ValueError, match="lower-case"):
        register_recipe("Bad", TrainConfig())


@pytest.mark.parametrize("field,value,msg", [
    ("epochs", 0, "`epochs` to be a positive integer"),
    ("batch_size", 2.5, "`batch_size` to be a positive integer"),
    ("lr", 0.0, "`lr` to be a finite number > 0"),
    ("lr", float("nan"), "`lr`"),
    ("momentum", -0.1, "`momentum`"),
    ("amp", "fp8", "`amp` to be one of"),
    ("reduction", "avg", "`reduction` to be one of"),
    ("select_best_by", "acc", "`select_best_by` to be one of"),
    ("milestones", [250, 150], "`milestones` to be a sorted list"),
    ("milestone_fractions", [0.5, 1.5], "`milestone_fractions`"),
    ("grad_clip", -1.0, "`grad_clip`"),
    ("val_fraction", 1.0, r"`val_fraction` to be a number in \(0, 1\), got 1.0"),
    ("seed", -1, "`seed`"),
    ("checkpoint_every", 0, "`checkpoint_every`"),
    ("loss_kwargs", [1], "`loss_kwargs` to be a dict"),
])
def test_config_validation_names_the_field(field, value, msg):
    with pytest.raises(ValueError, match=msg):
        dataclasses.replace(TrainConfig(), **{field: value}).validate()


def test_config_dict_round_trip():
    c = dataclasses.replace(get_recipe("digits-mlp"), loss="focal", loss_kwargs={"gamma": 2.0},
                            grad_clip=None)
    d = c.to_dict()
    import json

    c2 = TrainConfig.from_dict(json.loads(json.dumps(d)))
    assert c2 == c
    # unknown keys (a newer version's config.json) are ignored
    assert TrainConfig.from_dict({**d, "future_field": 1}) == c


def test_parse_loss_args():
    assert parse_loss_args(["gamma=3", "lam=0.1", "name=x", "flag=false", "n-bins=15"]) == {
        "gamma": 3, "lam": 0.1, "name": "x", "flag": False, "n_bins": 15}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_loss_args(["gamma"])


@pytest.mark.parametrize("name", ALL_RECIPES)
def test_every_recipe_builds_its_model_and_loss(name):
    from torchcal.losses import list_losses
    from torchcal.train import build_loss, build_model

    c = get_recipe(name).validate()
    num_classes = {"cifar10": 10, "cifar100": 100, "tinyimagenet": 200, "imagenet": 1000,
                   "digits": 10}[c.dataset]
    shape = {"digits": (64,), "tinyimagenet": (3, 64, 64), "imagenet": (3, 224, 224)}.get(
        c.dataset, (3, 32, 32))
    with torch.device("meta"):  # construct only: no memory, no init cost
        model = build_model(c, num_classes, shape)
    assert model.fc.out_features == num_classes
    assert model.fc.in_features == model.num_features
    losses = list_losses()
    if not losses:
        pytest.skip("no loss registered yet")
    for loss in losses:
        lc = dataclasses.replace(c, loss=loss)
        fn = build_loss(lc, num_classes)
        if lc.reduction == "published":
            assert fn.reduction == getattr(fn, "published_reduction", "sum")
        else:
            assert fn.reduction == lc.reduction
