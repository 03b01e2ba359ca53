"""End-to-end training runs on small data: run directory contents, resume, protocol, head."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest
import torch

from torchcal.errors import CheckpointError, TorchcalError
from torchcal.losses.base import CalibrationLoss
from torchcal.train import JointHeadConfig, TrainConfig, get_recipe, train
from torchcal.train.checkpoint import load_checkpoint
from torchcal.train.run import n_batches as _run_n_batches

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")


def make_cifar10(root, n_train=200, n_test=100, seed=0, archive=False):
    """A tiny CIFAR-10 in the official python-pickle layout (cifar-10-batches-py/), or with
    ``archive`` packed as the official ``cifar-10-python.tar.gz`` (the folder removed).

    Images carry a class signal (a per-class colour offset) so a small net learns something.
    """
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    colours = rng.integers(0, 200, size=(10, 3))

    def batch(n, name):
        labels = rng.integers(0, 10, size=n)
        img = rng.integers(0, 56, size=(n, 3, 32, 32)) + colours[labels][:, :, None, None]
        return {b"batch_label": name.encode(), b"labels": labels.tolist(),
                b"data": img.astype(np.uint8).reshape(n, 3072),
                b"filenames": [f"img_{i}.png".encode() for i in range(n)]}

    sizes = np.diff(np.linspace(0, n_train, 6).astype(int))
    for i, n in enumerate(sizes, start=1):
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump(batch(int(n), f"training batch {i} of 5"), f, protocol=2)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch(n_test, "testing batch 1 of 1"), f, protocol=2)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"class{i}".encode() for i in range(10)],
                     b"num_cases_per_batch": 10000, b"num_vis": 3072}, f, protocol=2)
    if archive:
        import shutil
        import tarfile

        with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tf:
            tf.add(folder, arcname="cifar-10-batches-py")
        shutil.rmtree(folder)
    return root


def digits_config(tmp_path, name="run", **kw):
    base = dict(out_dir=str(tmp_path / name), epochs=3, progress=False, num_threads=1,
                device="cpu")
    base.update(kw)
    return dataclasses.replace(get_recipe("digits-mlp"), **base)


# ------------------------------------------------------------------------------------------
def test_cifar_two_epochs_writes_the_run_directory(tmp_path):
    from torchcal.data.fake import write_fake_cifar10c, write_fake_svhn

    root = make_cifar10(tmp_path / "data", archive=True)
    write_fake_svhn(root, "test", n=30)
    write_fake_cifar10c(root, n=20)
    cfg = dataclasses.replace(
        get_recipe("cifar10-resnet50"), model="small_cnn", model_kwargs={"width": 8},
        data_root=str(root), out_dir=str(tmp_path / "run"), epochs=2, batch_size=32,
        progress=False, num_threads=1, device="cpu", select_best_by="nll",
        data_kwargs={"verify": False},  # a generated archive: not the published MD5
        ood_kwargs={"svhn": {"verify": False}})
    summary = train(cfg)
    assert (root / "cifar-10-batches-py" / "test_batch").is_file()  # the archive was extracted
    run = tmp_path / "run"
    assert (run / "config.json").is_file()
    conf = json.loads((run / "config.json").read_text())
    assert conf["dataset"] == "cifar10" and conf["model"] == "small_cnn" and conf["epochs"] == 2
    lines = [json.loads(s) for s in (run / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2]
    for key in ("train_loss", "train_nll", "train_ece", "train_error", "val_loss", "val_nll",
                "val_ece", "val_error", "test_loss", "test_nll", "test_ece", "test_error",
                "fc_weight_norm", "test_nll_correct", "test_nll_incorrect",
                "test_entropy_correct", "test_entropy_incorrect", "lr"):
        assert key in lines[-1], key
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert last["epoch"] == 2 and last["config"]["model"] == "small_cnn"
    # the logged last-layer weight norm is that of the saved final weights
    assert lines[-1]["fc_weight_norm"] == pytest.approx(
        float(last["model"]["fc.weight"].norm()), rel=1e-6)
    # the recipe's settings as run: lr 0.1 in both epochs (drops at 150 and 250), summed CE
    assert [r["lr"] for r in lines] == [0.1, 0.1]
    best = load_checkpoint(run / "checkpoints" / "best.pt")
    assert best["epoch"] == summary["best"]["epoch"]
    assert summary["best"]["value"] == min(r["val_nll"] for r in lines)
    # the published reduction for CE is a sum over the batch: logged loss is per sample
    assert abs(lines[-1]["val_loss"] - lines[-1]["val_nll"]) < 1e-4
    # evaluation artefacts, with the papers' OOD sets (SVHN test, CIFAR-10-C noise level 5)
    for f in ("val.npz", "test.npz", "ood_svhn.npz", "ood_cifar10c.npz"):
        assert (run / "logits" / f).is_file()
    res = json.loads((run / "results.json").read_text())
    assert res["n"] == {"val": 20, "test": 100}
    assert res["ood"]["svhn"]["n"] == 30 and res["ood"]["cifar10c"]["n"] == 20
    assert 0.0 <= res["ood"]["svhn"]["auroc_entropy"] <= 1.0
    assert res["meta"]["loss"] == "ce" and res["meta"]["checkpoint"] == "last"
    with np.load(run / "logits" / "test.npz") as z:
        assert z["logits"].shape == (100, 10) and z["labels"].dtype == np.int64


def test_digits_run_and_resume_in_process_match(tmp_path):
    """Training 2 epochs, then resuming to 4, equals 4 uninterrupted epochs exactly."""
    full = train(digits_config(tmp_path, "full", epochs=4, milestone_fractions=None,
                               milestones=[2, 3]))
    part = digits_config(tmp_path, "part", epochs=2, milestone_fractions=None, milestones=[2, 3],
                         evaluate=False)
    train(part)
    resumed = train(dataclasses.replace(part, epochs=4, resume=True, evaluate=True))
    assert resumed["resumed_from"] == 2
    for k, v in full["final"].items():
        assert resumed["final"][k] == pytest.approx(v, abs=1e-6), k
    la = (tmp_path / "full" / "log.jsonl").read_text().splitlines()
    lb = (tmp_path / "part" / "log.jsonl").read_text().splitlines()
    assert len(la) == len(lb) == 4
    ra = json.loads((tmp_path / "full" / "results.json").read_text())
    rb = json.loads((tmp_path / "part" / "results.json").read_text())
    assert ra["test"]["pre"]["ece"] == pytest.approx(rb["test"]["pre"]["ece"], abs=1e-6)


def test_cifar_adafocal_resume_with_augmentation_matches(tmp_path):
    """Augmentation, data order and AdaFocal's state survive a stop/resume exactly."""
    from torchcal.losses import list_losses

    if "adafocal" not in list_losses():
        pytest.skip("adafocal not registered yet")
    root = make_cifar10(tmp_path / "data", n_train=120, n_test=40)
    base = dataclasses.replace(
        get_recipe("cifar10-resnet50"), model="small_cnn", model_kwargs={"width": 4},
        loss="adafocal", loss_kwargs={"n_bins": 3}, data_root=str(root), epochs=3,
        batch_size=16, progress=False, num_threads=1, device="cpu", evaluate=False,
        milestones=[1, 2])
    full = train(dataclasses.replace(base, out_dir=str(tmp_path / "full")))
    part = dataclasses.replace(base, out_dir=str(tmp_path / "part"), epochs=1)
    train(part)
    res = train(dataclasses.replace(part, epochs=3, resume=True))
    assert res["resumed_from"] == 1
    for k, v in full["final"].items():
        assert res["final"][k] == pytest.approx(v, abs=1e-6), k
    ga = json.loads((tmp_path / "full" / "log.jsonl").read_text().splitlines()[-1])
    gb = json.loads((tmp_path / "part" / "log.jsonl").read_text().splitlines()[-1])
    assert ga["loss_state"]["gammas"] == pytest.approx(gb["loss_state"]["gammas"], abs=1e-6)


@pytest.mark.filterwarnings("ignore:The validation NLL")
def test_imagenet_folder_recipe_runs(tmp_path):
    """The ImageNet recipe as registered (the standard ResNet-50) on a generated class-folder
    tree of JPEGs: the DataLoader path over lazily decoded images (small crops keep it fast)."""
    from torchcal.data.fake import write_fake_imagenet_folder

    root = write_fake_imagenet_folder(tmp_path / "imagenet", n_classes=3, n_train=8, n_val=3,
                                      size=(40, 40))
    recipe = get_recipe("imagenet-resnet50")
    assert recipe.model == "imagenet_resnet50"
    cfg = dataclasses.replace(
        recipe, data_root=str(root), data_kwargs={"image_size": 32, "resize_size": 36},
        out_dir=str(tmp_path / "run"), epochs=1, batch_size=8, num_workers=0,
        select_best_by="none", progress=False, num_threads=1, device="cpu")
    summary = train(cfg)
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["n"] == {"val": 2, "test": 9} and res["num_classes"] == 3
    assert res["meta"]["model"] == "imagenet_resnet50"
    assert summary["final"]["val_error"] >= 0.0
    st = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert st["input_shape"] == [3, 32, 32] and st["model"]["fc.weight"].shape == (3, 2048)
    # the standard ResNet-50 body: 25,557,032 parameters at 1000 classes, less 997 classes' fc
    assert sum(v.numel() for k, v in st["model"].items()
               if k.endswith(("weight", "bias"))) == 25_557_032 - 997 * 2049


def test_tinyimagenet_recipe_runs(tmp_path):
    """The Tiny-ImageNet recipe on a generated archive in the official layout."""
    from torchcal.data.fake import write_fake_tinyimagenet

    root = tmp_path / "data"
    write_fake_tinyimagenet(root, n_classes=3, n_train=8, n_val=2, archive=False)
    cfg = dataclasses.replace(
        get_recipe("tinyimagenet-resnet50"), model="small_cnn", model_kwargs={"width": 4},
        data_root=str(root), data_kwargs={"per_class": 2}, out_dir=str(tmp_path / "run"),
        epochs=1, batch_size=8, progress=False, num_threads=1, device="cpu")
    train(cfg)
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["n"] == {"val": 6, "test": 6} and res["num_classes"] == 3
    assert res["ood"] == {}  # no OOD sets are defined for Tiny-ImageNet


def test_progress_bar(tmp_path, capsys):
    """A tqdm bar counting the training batches of every epoch (on stderr)."""
    from torchcal.train import build_data
    from torchcal.train.run import n_batches as _n_batches

    cfg = digits_config(tmp_path, epochs=2, evaluate=False, progress=True)
    train(cfg)
    err = capsys.readouterr().err
    total = 2 * _n_batches(len(build_data(cfg).train), 1, cfg.batch_size)
    assert f"{total}/{total}" in err and "batch" in err and "val_ece=" in err
    train(digits_config(tmp_path, "quiet", epochs=1, evaluate=False, progress=False))
    assert capsys.readouterr().err == ""


def test_compile_option_wraps_the_training_model(tmp_path, monkeypatch):
    """``compile=True`` trains through torch.compile (TorchDynamo; the eager backend here, which
    needs no C++ toolchain) to the same numbers as the plain run; checkpoints keep plain keys."""
    real = torch.compile
    calls = []

    def spy(model, *args, **kwargs):
        calls.append(type(model).__name__)
        return real(model, backend="eager")

    monkeypatch.setattr(torch, "compile", spy)
    plain = train(digits_config(tmp_path, "plain", epochs=2, evaluate=False))
    assert calls == []
    compiled = train(digits_config(tmp_path, "compiled", epochs=2, evaluate=False, compile=True))
    assert calls == ["MLP"]
    for k, v in plain["final"].items():
        assert compiled["final"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    sd = load_checkpoint(tmp_path / "compiled" / "checkpoints" / "last.pt")["model"]
    assert not any(k.startswith("_orig_mod.") for k in sd)


def test_amp_is_ignored_with_a_warning_on_cpu(tmp_path):
    with pytest.warns(UserWarning, match="only used on CUDA"):
        train(digits_config(tmp_path, epochs=1, evaluate=False, amp="bf16"))


def test_existing_run_needs_resume_and_matching_config(tmp_path):
    cfg = digits_config(tmp_path, epochs=1, evaluate=False)
    train(cfg)
    with pytest.raises(TorchcalError, match="already holds a run.*--resume"):
        train(cfg)
    with pytest.raises(CheckpointError, match="loss='ce'.*loss='focal'"):
        train(dataclasses.replace(cfg, loss="focal", resume=True))
    # a changed learning rate changes what is trained (an identity field): refused, naming it
    with pytest.raises(CheckpointError, match="lr=0.05.*lr=0.5"):
        train(dataclasses.replace(cfg, resume=True, lr=0.5, epochs=2))
    # the milestones of a schedule cannot act on a restored scheduler: said, not ignored
    with pytest.warns(UserWarning, match="changed milestones take no effect"):
        train(dataclasses.replace(cfg, resume=True, epochs=2, milestone_fractions=[0.1]))
    # corrupt checkpoint -> a clear error
    (tmp_path / "run" / "checkpoints" / "last.pt").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        train(dataclasses.replace(cfg, resume=True))


class _ProtocolProbe(CalibrationLoss):
    """A stateful test loss recording how the trainer drives the protocol."""

    published_reduction = "mean"
    wants_validation = True
    update_every = 5

    def __init__(self, *, reduction="mean", ignore_index=-100):
        super().__init__(reduction=reduction, ignore_index=ignore_index)
        self.register_buffer("n_validations", torch.zeros((), dtype=torch.long))
        self.epochs_seen: list[int] = []
        self.val_sizes: list[int] = []

    def set_epoch(self, epoch):
        self.epochs_seen.append(epoch)

    def on_validation(self, *, logits, labels):
        self.n_validations += 1
        self.val_sizes.append(int(labels.shape[0]))
        assert logits.shape == (labels.shape[0], 10)

    def log_state(self):
        return {"validations": int(self.n_validations)}

    def forward(self, input, target):
        return torch.nn.functional.cross_entropy(input, target, reduction=self.reduction)


def test_stateful_loss_driven_only_through_the_protocol(tmp_path, monkeypatch, request):
    from torchcal.losses import _registry

    made = []

    def factory(**kw):
        made.append(_ProtocolProbe(**kw))
        return made[-1]

    _registry.LOSSES.register("test_protocol_probe", factory)
    request.addfinalizer(lambda: _registry.LOSSES.unregister("test_protocol_probe"))
    cfg = digits_config(tmp_path, loss="test_protocol_probe", epochs=2, evaluate=False)
    train(cfg)
    probe = made[-1]
    assert probe.epochs_seen == [0, 1]
    n_train_batches = _run_n_batches(len(_train_labels(cfg)), 1, cfg.batch_size)
    per_epoch = n_train_batches // 5 + 1  # every 5 batches + after the epoch
    assert int(probe.n_validations) == 2 * per_epoch
    n_val = probe.val_sizes[0]
    assert set(probe.val_sizes) == {n_val} and n_val > 0
    # the loss state is in the checkpoint
    st = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert int(st["loss"]["n_validations"]) == 2 * per_epoch
    # the log's loss state is what the loss' own log_state() returns, after each epoch
    lines = [json.loads(t) for t in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["loss_state"] for r in lines] == [{"validations": per_epoch},
                                                {"validations": 2 * per_epoch}]


def _train_labels(cfg):
    from torchcal.train import build_data

    return build_data(cfg).train.labels


def test_adafocal_through_the_protocol(tmp_path):
    from torchcal.losses import list_losses

    if "adafocal" not in list_losses():
        pytest.skip("adafocal not registered yet")
    cfg = digits_config(tmp_path, loss="adafocal", epochs=3, evaluate=False)
    train(cfg)
    lines = [json.loads(s) for s in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    gammas = [r["loss_state"]["gammas"] for r in lines]
    assert len(gammas) == 3 and len(gammas[0]) == 15
    assert gammas[0] != [1.0] * 15  # moved after the first validation pass
    st = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    from torchcal.losses import create_loss

    fresh = create_loss("adafocal")
    fresh.load_state_dict(st["loss"])
    assert torch.allclose(fresh.gammas.float(), torch.tensor(gammas[-1]))


def test_uncertainty_head_leaves_the_classifier_unchanged(tmp_path):
    pytest.importorskip("torchcal.uncertainty")
    a = train(digits_config(tmp_path, "plain", epochs=1, evaluate=False))
    b = train(digits_config(tmp_path, "head", epochs=1, evaluate=False,
                                joint_head=JointHeadConfig(enabled=True)))
    sa = load_checkpoint(tmp_path / "plain" / "checkpoints" / "last.pt")
    sb = load_checkpoint(tmp_path / "head" / "checkpoints" / "last.pt")
    assert sa["head"] is None and sb["head"] is not None
    for k, v in sa["model"].items():
        assert torch.equal(v, sb["model"][k]), k
    assert a["final"]["val_ece"] == b["final"]["val_ece"]
    # the head did train: its weights moved away from the trainer's seeded initialisation
    from torchcal.train.distributed import epoch_seed
    from torchcal.uncertainty import UncertaintyHead

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(epoch_seed(0, 0, stream=7))
        h0 = UncertaintyHead(256)
    assert set(h0.state_dict()) == set(sb["head"])
    moved = [k for k, v in h0.state_dict().items() if not torch.equal(v, sb["head"][k])]
    assert moved, "the uncertainty head's weights never changed"
    assert sb["head_optimizer"]["state"], "the head's optimiser never stepped"
    lines = [json.loads(s) for s in (tmp_path / "head" / "log.jsonl").read_text().splitlines()]
    assert lines[-1]["head_ranking_loss"] > 0


def test_evaluate_run_and_load_model(tmp_path):
    from torchcal.train import (
        evaluate_checkpoint,
        load_model_from_run,
        predict_logits,
    )

    cfg = digits_config(tmp_path, epochs=2, evaluate=False, select_best_by="error")
    train(cfg)
    res = evaluate_checkpoint(tmp_path / "run", checkpoint="best")
    assert res["meta"]["checkpoint"] == "best"
    # the best checkpoint's evaluation has its own files (issue #14 item 3)
    assert (tmp_path / "run" / "results-best.json").is_file()
    assert not (tmp_path / "run" / "results.json").exists()
    assert (tmp_path / "run" / "logits-best" / "ood_digits_ood.npz").is_file() or not res["ood"]
    assert evaluate_checkpoint(tmp_path / "run")["meta"]["checkpoint"] == "last"
    model, c2 = load_model_from_run(tmp_path / "run")
    assert c2.loss == "ce" and not model.training
    from torchcal.train import build_data

    splits = build_data(c2)
    z, y = predict_logits(model, splits.test, "cpu", 100)
    zs, ys = np.load(tmp_path / "run" / "logits" / "test.npz").values()
    assert z.shape[0] == len(splits.test)
    with pytest.raises(CheckpointError, match="does not exist"):
        evaluate_checkpoint(tmp_path / "nope")


def test_bad_config_values_raise_before_training(tmp_path):
    with pytest.raises(ValueError, match="`epochs`"):
        train(digits_config(tmp_path, epochs=0))
    with pytest.raises(ValueError, match="loss"):
        train(digits_config(tmp_path, loss="no_such_loss"))
    with pytest.raises(ValueError, match="Unknown model 'nope'.*mlp"):
        train(digits_config(tmp_path, model="nope"))
    with pytest.raises(ValueError, match="Bad --loss-arg.*gama"):
        train(digits_config(tmp_path, loss="focal", loss_kwargs={"gama": 2}))
    assert not (tmp_path / "run").exists()  # nothing written for a bad config
    with pytest.raises(TypeError, match="TrainConfig"):
        train({"epochs": 1})
    assert isinstance(get_recipe("digits-mlp"), TrainConfig)


def test_small_cnn_on_flat_digits(tmp_path):
    """``--model small_cnn`` on the digits' flat (N, 64) features: read as 1x8x8 images."""
    from torchcal.train import build_model

    cfg = digits_config(tmp_path, model="small_cnn", model_kwargs={"width": 4}, epochs=1,
                        evaluate=False)
    m = build_model(cfg, 10, (64,))
    assert m.in_channels == 1 and m.side == 8
    assert train(cfg)["final"]["val_error"] < 0.9
