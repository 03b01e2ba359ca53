"""TensorBoard tracking: the events read back equal the log lines they mirror."""

from __future__ import annotations

import math

import pytest

from torchcal.errors import TorchcalError
from torchcal.train import tracking
from torchcal.train.tracking import TensorBoardLogger, tensorboard_scalars

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package (extra `tensorboard`) is not installed")


def _read(log_dir) -> dict[str, list[tuple[int, float]]]:
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _record(epoch: int) -> dict:
    return {"epoch": epoch, "lr": 0.1 / epoch, "train_loss": 2.0 - 0.1 * epoch,
            "train_ece": 0.01 * epoch, "val_ece": 0.02 * epoch, "val_nll": float("nan"),
            "test_nll": None, "fc_weight_norm": 3.0 + epoch, "seconds": 0.5, "note": "x",
            "flag": True, "loss_state": {"gammas": [1.0 * epoch, 2.0, -0.5], "bin_edges": [0.1]}}


def test_tags_follow_the_log_keys():
    s = tensorboard_scalars(_record(2))
    assert s["train/loss"] == pytest.approx(1.8) and s["val/ece"] == pytest.approx(0.04)
    assert s["lr"] == 0.05 and s["fc_weight_norm"] == 5.0 and s["seconds"] == 0.5
    assert [k for k in s if k.startswith("loss_state/")] == [
        "loss_state/gamma_bin_00", "loss_state/gamma_bin_01", "loss_state/gamma_bin_02"]
    assert s["loss_state/gamma_bin_00"] == 2.0 and s["loss_state/gamma_bin_02"] == -0.5
    # skipped: the step itself, None, strings, booleans, the bin edges
    assert not {"epoch", "test/nll", "note", "flag"} & set(s)
    assert math.isnan(s["val/nll"])
    assert tensorboard_scalars({"epoch": 1, "loss_state": {"gamma": 3.0}}) == {
        "loss_state/gamma": 3.0}
    wide = tensorboard_scalars({"loss_state": {"gammas": list(range(120))}})
    assert "loss_state/gamma_bin_007" in wide and "loss_state/gamma_bin_119" in wide


def test_events_read_back_equal_the_records(tmp_path):
    with TensorBoardLogger(tmp_path / "tb") as tb:
        for e in (1, 2, 3):
            tb.log_epoch(_record(e))
    ev = _read(tmp_path / "tb")
    for tag in ("train/loss", "val/ece", "lr", "loss_state/gamma_bin_00"):
        want = [(e, tensorboard_scalars(_record(e))[tag]) for e in (1, 2, 3)]
        got = ev[tag]
        assert [s for s, _ in got] == [1, 2, 3]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


def test_resume_purges_the_epochs_trained_again(tmp_path):
    with TensorBoardLogger(tmp_path / "tb") as tb:
        for e in (1, 2, 3, 4):  # the killed run logged epochs 3-4 past its checkpoint at 2
            tb.log_epoch({**_record(e), "val_ece": 1.0})
    with TensorBoardLogger(tmp_path / "tb", purge_step=3) as tb:
        for e in (3, 4, 5):
            tb.log_epoch(_record(e))
    got = _read(tmp_path / "tb")["val/ece"]
    assert [s for s, _ in got] == [1, 2, 3, 4, 5]
    assert [v for _, v in got][2:] == pytest.approx([0.06, 0.08, 0.10])


def test_bad_input_is_named(tmp_path, monkeypatch):
    with TensorBoardLogger(tmp_path / "tb") as tb, pytest.raises(ValueError, match="epoch"):
        tb.log_epoch({"lr": 0.1})
    with pytest.raises(ValueError, match="purge_step"):
        TensorBoardLogger(tmp_path / "tb2", purge_step=-1)
    monkeypatch.setattr(tracking, "tensorboard_available", lambda: False)
    with pytest.raises(TorchcalError, match=r"torchcal\[tensorboard\]"):
        TensorBoardLogger(tmp_path / "tb3")


def test_train_tensorboard_mirrors_the_log_and_resumes(tmp_path):
    """`torchcal train --tensorboard` with AdaFocal: every epoch's val ECE and γ per bin in the
    event files equal log.jsonl; a resumed run leaves one event per epoch."""
    import json

    from torchcal.cli import main

    out = tmp_path / "run"
    base = ["train", "--recipe", "digits-mlp", "--loss", "adafocal", "--out", str(out),
            "--no-progress", "--no-eval", "--tensorboard", "--num-threads", "1"]
    assert main([*base, "--epochs", "2"]) == 0
    assert main([*base, "--epochs", "3", "--resume"]) == 0
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    ev = _read(out / "tensorboard")
    assert [s for s, _ in ev["val/ece"]] == [1, 2, 3]
    assert [v for _, v in ev["val/ece"]] == pytest.approx([r["val_ece"] for r in log], rel=1e-6)
    gammas = [r["loss_state"]["gammas"] for r in log]
    for b in range(len(gammas[0])):
        got = [v for _, v in ev[f"loss_state/gamma_bin_{b:02d}"]]
        assert got == pytest.approx([g[b] for g in gammas], rel=1e-6)
    assert len({tuple(g) for g in gammas}) > 1  # γ moved: the test would see a stale value
