"""Issue 40 item 4: each TrainConfig field declares its constraint and its ``torchcal train``
flag in its metadata; ``validate`` and the command line are loops over the declarations; the
plug-in fields are grouped (``joint_head``, ``multitask``)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from torchcal._validation import Interval, Options
from torchcal.cli import build_parser
from torchcal.cli.train import _add_declared_flags, _declared_flags, config_from_args
from torchcal.train import JointHeadConfig, TrainConfig, get_recipe
from torchcal.train import config as C
from torchcal.train.config import UNCHECKED, Flag, cli_fields, identity

#: A value each named constraint refuses (a new constraint needs a line here: the test below
#: fails for a constraint without one, so that every declared check is shown to be enforced).
_BAD_FOR = {C.non_empty_str: "", C.a_dict: [1], C.device_string: "", C.sorted_epochs: [2, 1],
            C.sorted_fractions: [0.5, 1.5], C.task_list: ["translation"]}


def _bad_value(check):
    if isinstance(check, Interval):  # never an integer / never finite
        return 2.5 if check.target_type is int else float("nan")
    if isinstance(check, Options):
        return "no-such-option"
    if check.__qualname__.startswith("group("):
        return "not a group"
    return _BAD_FOR[check]


def _leaves(cls, prefix=()):
    """(path, field) of every field of ``cls``, a plug-in group's fields included."""
    for f in dataclasses.fields(cls):
        sub = C._group_class(f)
        yield (*prefix, f.name), f
        if sub is not None:
            yield from _leaves(sub, (*prefix, f.name))


def _with(cfg, path, value):
    """``cfg`` with the field at ``path`` (one or two names) set to ``value``."""
    if len(path) == 1:
        return dataclasses.replace(cfg, **{path[0]: value})
    group = dataclasses.replace(getattr(cfg, path[0]), **{path[1]: value})
    return dataclasses.replace(cfg, **{path[0]: group})


def _get(cfg, path):
    for name in path:
        cfg = getattr(cfg, name)
    return cfg


_CHECKED = [(".".join(p), p, f) for p, f in _leaves(TrainConfig)
            if f.metadata["check"] is not UNCHECKED]


def test_every_field_declares_a_constraint():
    missing = [".".join(p) for p, f in _leaves(TrainConfig) if not callable(f.metadata.get("check"))]
    assert missing == []
    assert len(_CHECKED) >= 35  # most fields are checked; UNCHECKED ones are flags and free text


@pytest.mark.parametrize("name,path,f", _CHECKED, ids=[c[0] for c in _CHECKED])
def test_every_declared_constraint_is_enforced_naming_field_and_value(name, path, f):
    bad = _bad_value(f.metadata["check"])
    TrainConfig().validate()  # the defaults pass
    with pytest.raises(ValueError) as err:
        _with(TrainConfig(), path, bad).validate()
    msg = str(err.value)
    assert msg.startswith(f"Expected `{name}` to be "), msg
    assert f"got {bad!r}" in msg, msg


_FLAGS = [(flag.option, path, flag) for path, flag in cli_fields(TrainConfig)]


def _given(flag: Flag) -> list[str]:
    """A valid command-line value for ``flag``."""
    if flag.switch:
        return []
    if flag.choices:
        return [str(flag.choices[-1])]
    sample = {"--task": "translation", "--task-weighting": "equal", "--device": "cuda:1"}
    return [sample.get(flag.option, {int: "3", float: "0.25"}.get(flag.type, "somewhere"))]


@pytest.mark.parametrize("option,path,flag", _FLAGS, ids=[f[0] for f in _FLAGS])
def test_every_declared_flag_is_an_option_that_sets_its_field(tmp_path, option, path, flag):
    given = _given(flag)
    args = build_parser("train").parse_args(
        ["train", "--recipe", "digits-mlp", "--out", str(tmp_path / "r"), option, *given])
    cfg = config_from_args(args)
    if flag.switch:
        want = flag.const
    else:
        want = flag.type(given[0]) if flag.type else given[0]
        want = flag.convert(want) if flag.convert else want
    assert _get(cfg, path) == want
    assert path[0] in _declared_flags(args, get_recipe("digits-mlp"))  # read back from the flag
    if not flag.switch:  # the recipe's value differs: the option did set it
        assert _get(get_recipe("digits-mlp"), path) != want


def test_the_flags_are_all_declared():
    """Every option of `torchcal train` that sets a TrainConfig field alone comes from a
    declaration; the others set several fields (--loss resets loss_kwargs) or none."""
    parser = build_parser("train")
    train = parser._subparsers._group_actions[0].choices["train"]
    options = {o for a in train._actions for o in a.option_strings}
    declared = {flag.option for _, flag in cli_fields(TrainConfig)}
    assert declared <= options
    assert options - declared == {"-h", "--help", "--recipe", "--loss", "--loss-arg", "--model",
                                  "--model-arg", "--data-arg", "--out", "--resume", "--debug"}


def test_a_new_field_is_one_declaration():
    """A field declared once, with its constraint and flag, is checked by validate and is an
    option of the command line (what docs/guide/architecture.md shows)."""

    @dataclasses.dataclass(frozen=True)
    class Extended(TrainConfig):
        label_noise: float = identity(0.0, check=Interval(float, 0, 1, closed="left"), cli=Flag(
            "--label-noise", "share of training labels drawn anew", type=float))

    Extended().validate()
    with pytest.raises(ValueError, match=r"Expected `label_noise` to be a number in \[0, 1\), "
                                         r"got 1.5"):
        Extended(label_noise=1.5).validate()
    p = argparse.ArgumentParser()
    _add_declared_flags(p, Extended)
    args = p.parse_args(["--label-noise", "0.2", "--epochs", "4"])
    upd = _declared_flags(args, Extended())
    assert upd == {"label_noise": 0.2, "epochs": 4}
    assert Extended.from_dict(Extended(label_noise=0.2).to_dict()).label_noise == 0.2


# ---------------------------------------------------------------- the plug-in groups

def test_a_group_field_at_the_top_level_is_refused_naming_its_place():
    for key, where in (("uncertainty_head", "joint_head.enabled"), ("head_lr", "joint_head.lr"),
                       ("head_weight_decay", "joint_head.weight_decay"),
                       ("tasks", "multitask.tasks"), ("target_noise", "multitask.target_noise")):
        with pytest.raises(ValueError, match=rf"`{key}` under its group, as `{where}`"):
            TrainConfig.from_dict({**TrainConfig().to_dict(), key: 1})
    recipe = get_recipe("mnist1d-multitask")
    assert TrainConfig.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    assert TrainConfig.from_dict({"not_a_field": 1}) == TrainConfig()  # forward compatibility
    with pytest.raises(ValueError, match="`multitask` to be a dict or a MultitaskConfig"):
        TrainConfig.from_dict({"multitask": [1]})
    with pytest.raises(TypeError):
        TrainConfig(head_lr=0.01)  # no flat keyword


def test_the_two_plugins_in_one_run_are_refused_naming_both():
    cfg = dataclasses.replace(get_recipe("mnist1d-multitask"),
                              joint_head=JointHeadConfig(enabled=True))
    with pytest.raises(ValueError, match=r"`joint_head.enabled` to be False for a multi-task "
                                         r"run \(multitask.tasks=\['class', 'translation'\]\)"):
        cfg.validate()
    bad = dataclasses.replace(cfg, joint_head=JointHeadConfig(),
                              multitask=dataclasses.replace(cfg.multitask, task_weighting="x"))
    with pytest.raises(ValueError, match="`task_weighting` to be 'kendall'"):
        bad.validate()
