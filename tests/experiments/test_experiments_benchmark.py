"""Issue 23 item 1: a benchmark is data; which losses it trains comes from the loss registry."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.nn.functional as F
from torch import nn

from torchcal.cli import main
from torchcal.cli.demo import parse_demo_loss_args
from torchcal.experiments import Benchmark, DemoConfig, Profile, get_benchmark, list_benchmarks
from torchcal.experiments.demo import appendix_text, applicable_losses, demo_jobs, intro_text
from torchcal.losses import LOSSES, register_loss


class _PlainCE(nn.Module):
    """A user's loss: cross-entropy under another name."""

    def __init__(self, *, reduction: str = "mean", ignore_index: int = -100) -> None:
        super().__init__()
        self.reduction, self.ignore_index = reduction, ignore_index

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, reduction=self.reduction,
                               ignore_index=self.ignore_index)


@pytest.fixture
def user_losses():
    """Two losses registered by a user (one tagged for the demo), unregistered afterwards."""
    register_loss("zz_tagged", display="ZZ tagged", order=99, tags={"demo"})(_PlainCE)
    register_loss("zz_untagged", display="ZZ untagged", order=100)(_PlainCE)
    try:
        yield
    finally:
        LOSSES.unregister("zz_tagged")
        LOSSES.unregister("zz_untagged")


def test_adding_a_loss_touches_no_cli_experiments_or_report_file(user_losses):
    """A loss registered with `tags={"demo"}` is in the demo's --full and digits tables, its
    --loss-arg is accepted; an untagged one is named in the report with the reason."""
    assert applicable_losses()[-1] == "zz_tagged" and "zz_untagged" not in applicable_losses()
    for cfg in (DemoConfig(full=True), DemoConfig(dataset="digits")):
        jobs = demo_jobs(cfg, Path("/x"))
        assert "zz_tagged" in {j["loss"] for j in jobs}
        assert "zz_untagged" not in {j["loss"] for j in jobs}
    # the default MNIST-1D size trains the claims' losses only: the new loss is for --full
    assert "zz_tagged" not in {j["loss"] for j in demo_jobs(DemoConfig(), Path("/x"))}
    assert parse_demo_loss_args(["zz_tagged:reduction=sum"], applicable_losses()) == {
        "zz_tagged": {"reduction": "sum"}}
    cfg = DemoConfig(full=True, seeds=(0,))
    assert "ZZ tagged" in intro_text(cfg, demo_jobs(cfg, Path("/x")))  # trained
    text = appendix_text(cfg, demo_jobs(cfg, Path("/x")))
    assert "ZZ tagged" not in text.split("not trained")[1]
    assert "| ZZ untagged | its registry entry has no `demo` tag |" in text


def test_a_user_loss_trains_through_the_demo_command(user_losses, tmp_path, capsys):
    """The command line's demo trains the tagged loss in this process (its registry is here)."""
    out = tmp_path / "demo"
    assert main(["demo", "--dataset", "digits", "--losses", "zz_tagged", "--seeds", "0,",
                 "--epochs", "1", "--workers", "1", "--no-progress", "--no-figures",
                 "--out", str(out)]) == 0
    assert "ZZ tagged" in capsys.readouterr().out
    assert (out / "runs" / "zz_tagged" / "seed0" / "results.json").is_file()


def test_benchmarks_are_registered_data():
    assert list_benchmarks() == ["mnist1d", "digits"]
    m = get_benchmark("mnist1d")
    assert m.recipe == "mnist1d-cnn" and m.profile("quick").epochs == 15
    with pytest.raises(ValueError, match="`dataset`.*mnist1d, digits"):
        get_benchmark("cifar")
    with pytest.raises(ValueError, match="missing \\['full'\\]"):
        Benchmark(name="x", title="x", recipe="digits-mlp",
                  profiles={"default": Profile(seeds=(0,)), "quick": Profile(seeds=(0,))})


def test_executor_options_are_checked_before_anything_runs(tmp_path, capsys, monkeypatch):
    import torchcal.experiments.ray_executor as ray_executor

    out = tmp_path / "never"
    assert main(["demo", "--ray-address", "auto", "--out", str(out)]) == 2
    assert "`--ray-address` needs `--executor ray`" in capsys.readouterr().err
    monkeypatch.setattr(ray_executor, "ray_available", lambda: False)  # the registered check
    assert main(["demo", "--executor", "ray", "--out", str(out)]) == 2
    assert 'pip install "torchcal[ray]"' in capsys.readouterr().err
    assert not out.exists()
