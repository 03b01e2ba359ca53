"""Mistyped names get a "did you mean" (difflib) and argparse errors are one line with the hint
to --help (issue 26, item 9); the metrics' keyword-only error says to pass logits=/probs=."""

from __future__ import annotations

import pytest
import torch

import torchcal.metrics as M
from torchcal.cli import main
from torchcal.data import load_splits
from torchcal.losses import create_loss
from torchcal.models import create_model
from torchcal.train import get_recipe


def _err(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    return captured.err


@pytest.mark.parametrize("argv, expected", [
    (["trian"], "torchcal: error: Unknown command 'trian'; did you mean 'train'? "
                "(see `torchcal --help`)"),
    (["calibrate", "x.npz", "--method", "vectr"],
     "torchcal calibrate: error: argument --method: Unknown choice 'vectr'; did you mean "
     "'vector'? (see `torchcal calibrate --help`)"),
    (["demo", "--benchmark", "digts"], "did you mean 'digits'?"),
    (["data", "download", "cifr10"], "did you mean 'cifar10'"),
    (["train", "--epochs", "x"],
     "torchcal train: error: argument --epochs: invalid int value: 'x' "
     "(see `torchcal train --help`)"),
])
def test_argparse_errors_are_one_line_with_a_hint(argv, expected, capsys):
    err = _err(argv, capsys)
    assert expected in err
    assert err.count("\n") == 1 and "usage:" not in err, err  # one line, no usage block


def test_unknown_loss_and_recipe_on_the_command_line(tmp_path, capsys):
    assert main(["train", "--recipe", "digits-mlp", "--loss", "focall",
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "Unknown loss 'focall'; did you mean 'focal'" in err
    assert "flsd53" not in err and err.count("\n") == 1  # no dump of every registered loss
    assert main(["train", "--recipe", "digits_mlp", "--out", str(tmp_path / "r")]) == 2
    assert "did you mean 'digits-mlp'?" in capsys.readouterr().err


@pytest.mark.parametrize("call, expected", [
    (lambda: create_loss("focall"), "Unknown loss 'focall'; did you mean 'focal'"),
    (lambda: create_model("resnet5O", num_classes=10), "did you mean 'resnet50'"),
    (lambda: get_recipe("mnist1d_cnn"), "did you mean 'mnist1d-cnn'?"),
    (lambda: load_splits("digit"), "Unknown data set 'digit'; did you mean 'digits'"),
    (lambda: M.bootstrap_ci("ecee", logits=torch.zeros(4, 2), labels=torch.zeros(4).long()),
     "did you mean 'ece'?"),
])
def test_library_lookups_suggest_the_close_name(call, expected):
    with pytest.raises(ValueError, match=expected.replace("?", r"\?").replace("(", r"\(")):
        call()


def test_far_off_names_still_list_every_valid_one():
    with pytest.raises(ValueError, match="Unknown loss 'xyzzy'; expected one of: .*focal"):
        create_loss("xyzzy")


@pytest.mark.parametrize("metric", [M.ece, M.nll, M.smooth_ece, M.reliability_curve])
def test_positional_metric_inputs_say_to_pass_logits_or_probs(metric):
    z, y = torch.randn(8, 3), torch.arange(8) % 3
    with pytest.raises(TypeError, match=rf"{metric.__name__}\(\) takes its inputs by keyword: "
                                        r"pass `logits=` \(scores\) or `probs=`"):
        metric(z, y)
    metric(logits=z, labels=y)  # the keyword call works


def test_entropy_hint_has_no_labels():
    with pytest.raises(TypeError, match=r"e\.g\. entropy\(logits=z\);"):
        M.entropy(torch.randn(4, 3))
