"""Issue 23 item 3: each TrainConfig field declares its role (identity, schedule, runtime);
the trainer's resume check and the benchmark runner's stale check both read it."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from torchcal.errors import CheckpointError
from torchcal.train import TrainConfig, get_recipe, train
from torchcal.train.config import ROLES, changed_fields, field_role


def test_every_field_has_a_role():
    roles = {f.name: field_role(f) for f in dataclasses.fields(TrainConfig)}
    assert all(r in ROLES for r in roles.values()), {n: r for n, r in roles.items() if r not in ROLES}
    assert roles["loss"] == roles["reduction"] == roles["grad_clip"] == roles["lr"] == "identity"
    assert roles["epochs"] == "schedule" and roles["device"] == roles["progress"] == "runtime"


def test_every_identity_field_is_detected_as_changed():
    """Each identity field, changed alone, is named (none is silently ignored by the check)."""
    base = TrainConfig()
    other = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v / 2 + 0.01,
             str: lambda v: v + "x", dict: lambda v: {**v, "k": 1},
             list: lambda v: [*v, "x"]}  # list: the two-task runs' `tasks`
    for f in dataclasses.fields(TrainConfig):
        if field_role(f) != "identity" or f.name == "loss_defaults":
            continue
        v = getattr(base, f.name)
        if dataclasses.is_dataclass(v):  # a plug-in group: each of its fields, named by the group
            for g in dataclasses.fields(v):
                x = getattr(v, g.name)
                new = dataclasses.replace(v, **{g.name: other[type(x)](x)})
                got = changed_fields(base, dataclasses.replace(base, **{f.name: new}))
                assert got["identity"] == [f.name], (f.name, g.name, got)
            continue
        new = other[type(v)](v) if v is not None else 1
        got = changed_fields(base, dataclasses.replace(base, **{f.name: new}))
        assert got["identity"] == [f.name], (f.name, got)
    # loss_defaults changes training through the loss's effective arguments
    got = changed_fields(base, dataclasses.replace(base, loss_defaults={"ce": {"k": 1}}))
    assert got["identity"] == ["loss_kwargs"]


def test_resume_with_a_changed_identity_field_is_refused_naming_the_fields(tiny_config, tmp_path):
    """Before issue 23: reduction mean -> sum and grad_clip 2.0 -> None resumed silently."""
    cfg = tiny_config(reduction="mean", grad_clip=2.0)
    train(cfg)
    changed = dataclasses.replace(cfg, resume=True, epochs=2, reduction="sum", grad_clip=None)
    with pytest.raises(CheckpointError) as err:
        train(changed)
    msg = str(err.value)
    assert len(msg.splitlines()) == 1, msg
    assert "grad_clip=2.0, reduction='mean'" in msg and "grad_clip=None, reduction='sum'" in msg
    with pytest.raises(CheckpointError, match="lr=0.05.*lr=0.5"):
        train(dataclasses.replace(cfg, resume=True, lr=0.5, epochs=2))


def test_resume_with_a_changed_runtime_field_warns_and_more_epochs_extend(tiny_config, tmp_path):
    cfg = tiny_config(reduction="mean", grad_clip=2.0)
    train(cfg)
    with pytest.warns(UserWarning, match=r"runtime setting.*n_bins") as rec:
        out = train(dataclasses.replace(cfg, resume=True, epochs=2, n_bins=10))
    assert out["resumed_from"] == 1 and out["epochs"] == 2
    assert not any("out_dir" in str(w.message) or "resume" in str(w.message).split(":")[-1]
                   for w in rec)
    with warnings.catch_warnings():  # nothing changed but `resume`: no warning
        warnings.simplefilter("error")
        train(dataclasses.replace(cfg, resume=True, epochs=2, n_bins=10))


def test_stale_check_reads_the_same_roles(tiny_config, tmp_path):
    """The runner retrains a run whose identity or schedule changed, keeps it for runtime."""
    from torchcal.train.packs import is_stale

    cfg = tiny_config(reduction="mean", grad_clip=2.0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert not is_stale(run, cfg)
    assert not is_stale(run, dataclasses.replace(cfg, n_bins=10, device="auto", progress=True))
    for change in ({"reduction": "sum"}, {"grad_clip": None}, {"epochs": 5}, {"lr": 0.5},
                   {"loss_kwargs": {"gamma": 1.0}}):
        assert is_stale(run, dataclasses.replace(cfg, **change)), change


def test_tiny_config_is_the_recipe_with_the_test_settings(tiny_config, tmp_path):

    recipe = get_recipe("digits-mlp")
    cfg = tiny_config(epochs=3, lr=0.5)
    assert (cfg.model, cfg.batch_size, cfg.dataset) == (recipe.model, recipe.batch_size,
                                                         recipe.dataset)
    assert (cfg.epochs, cfg.lr, cfg.evaluate, cfg.device) == (3, 0.5, False, "cpu")
    assert cfg.out_dir == str(tmp_path / "run") and tiny_config("b").out_dir.endswith("/b")
