"""``torchcal uncertainty fit | eval`` on a tiny digits run (trained with a joint head too)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from torchcal.cli import main
from torchcal.uncertainty import EmbeddingCache, evaluate_head, load_head


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    from torchcal.train import JointHeadConfig, get_recipe, train

    run = tmp_path_factory.mktemp("unc") / "run"
    n = torch.get_num_threads()
    try:
        cfg = dataclasses.replace(get_recipe("digits-mlp"), out_dir=str(run), epochs=2,
                                  progress=False, num_threads=1, device="cpu",
                                  joint_head=JointHeadConfig(enabled=True))
        train(cfg)
    finally:
        torch.set_num_threads(n)
    return run


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fit_then_eval(digits_run, capsys):
    run = str(digits_run)
    code, out, err = _run(["uncertainty", "fit", run, "--epochs", "2", "--width", "32",
                           "--batch-size", "64", "--no-progress", "--device", "cpu"], capsys)
    assert code == 0, err
    assert "fitted uncertainty head" in out and "val: R-AUROC" in out
    head, meta = load_head(digits_run / "uncertainty" / "head.pt")
    assert head.width == 32 and meta["epochs"] == 2 and meta["lr"] == pytest.approx(2.5e-4)
    assert len(meta["epoch_losses"]) == 2
    manifest = digits_run / "uncertainty" / "cache" / "train" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns

    code, out, err = _run(["uncertainty", "eval", run, "--no-progress", "--device", "cpu"], capsys)
    assert code == 0, err
    assert manifest.stat().st_mtime_ns == stamp  # caches are reused, not rebuilt
    res = json.loads((digits_run / "uncertainty" / "results.json").read_text())
    assert res["schema"] == "torchcal.uncertainty_results/1"
    assert set(res["splits"]) == {"val", "test"}
    assert res["meta"]["dataset"] == "digits"
    test = res["splits"]["test"]
    for key in ("r_auroc_correct", "r_auroc_recall", "accuracy", "recall_at_1"):
        assert 0.0 <= test[key] <= 1.0
    # the file holds what evaluate_head computes from the cache
    direct = evaluate_head(head, EmbeddingCache(digits_run / "uncertainty" / "cache" / "test"))
    assert test["r_auroc_correct"] == pytest.approx(direct["r_auroc_correct"])
    assert test["r_auroc_recall"] == pytest.approx(direct["r_auroc_recall"])
    ood = res["ood"]["digits_ood"]
    assert 0.0 <= ood["auroc_head"] <= 1.0 and 0.0 <= ood["auroc_entropy"] <= 1.0
    assert "test:" in out and "OOD digits_ood" in out


def test_eval_joint_head(digits_run, capsys, tmp_path):
    out_file = tmp_path / "joint.json"
    code, out, err = _run(["uncertainty", "eval", str(digits_run), "--joint", "--no-ood",
                           "--splits", "test", "--no-progress", "--device", "cpu",
                           "--out", str(out_file)], capsys)
    assert code == 0, err
    res = json.loads(out_file.read_text())
    assert res["meta"]["head"] == "joint"
    assert list(res["splits"]) == ["test"] and res["ood"] == {}
    assert not math.isnan(res["splits"]["test"]["r_auroc_correct"])


def test_errors_are_one_line(digits_run, capsys, tmp_path):
    code, _, err = _run(["uncertainty", "eval", str(digits_run), "--head",
                         str(tmp_path / "none.pt"), "--no-progress"], capsys)
    assert code == 2 and "No uncertainty head" in err and len(err.strip().splitlines()) == 1
    code, _, err = _run(["uncertainty", "fit", str(tmp_path / "missing"), "--no-progress"], capsys)
    assert code == 2 and "does not exist" in err
    with pytest.raises(SystemExit):
        main(["uncertainty", "fit", str(digits_run), "--batch-size", "7"])
    assert "even" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["uncertainty", "eval", str(digits_run), "--splits", "val,bogus"])
    capsys.readouterr()
    # a corrupted cache is refused with --on-stale error
    cache_dir = tmp_path / "caches"
    code, _, err = _run(["uncertainty", "eval", str(digits_run), "--joint", "--no-ood",
                         "--splits", "val", "--cache-dir", str(cache_dir), "--no-progress",
                         "--out", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    emb = cache_dir / "val" / "embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[-3] ^= 0xFF
    emb.write_bytes(bytes(data))
    code, _, err = _run(["uncertainty", "eval", str(digits_run), "--joint", "--no-ood",
                         "--splits", "val", "--cache-dir", str(cache_dir), "--no-progress",
                         "--on-stale", "error", "--out", str(tmp_path / "r.json")], capsys)
    assert code == 2 and "corrupt" in err


def test_eval_refuses_a_corrupted_head(digits_run, capsys, tmp_path):
    """A single flipped bit in head.pt: `uncertainty eval` exits 2 with one line naming the file
    (it exited 0 with other numbers before heads carried a SHA-256)."""
    head = tmp_path / "head.pt"
    common = ["--no-progress", "--device", "cpu", "--cache-dir", str(tmp_path / "caches")]
    code, _, err = _run(["uncertainty", "fit", str(digits_run), "--epochs", "1", "--width", "16",
                         "--out", str(head), *common], capsys)
    assert code == 0, err
    assert (tmp_path / "head.pt.sha256").is_file()
    data = bytearray(head.read_bytes())
    data[len(data) // 2] ^= 0x10
    head.write_bytes(bytes(data))
    code, _, err = _run(["uncertainty", "eval", str(digits_run), "--head", str(head), "--no-ood",
                         "--splits", "val", "--out", str(tmp_path / "r.json"), *common], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(head) in err and "does not match its SHA-256" in err and "fit the head again" in err
    assert not (tmp_path / "r.json").exists()


def test_bare_command_prints_help(capsys):
    assert main(["uncertainty"]) == 2
    assert "fit" in capsys.readouterr().out


def test_image_run_augmented_passes_and_zero_shot_transfer(tmp_path, capsys):
    from torchcal.data.fake import write_fake_cifar
    from torchcal.train import get_recipe, train

    data = tmp_path / "data"
    write_fake_cifar(data, "cifar10", n_train=60, n_test=40, archive=False)
    write_fake_cifar(data, "cifar100", n_train=100, n_test=40, archive=False)
    run = tmp_path / "run"
    n = torch.get_num_threads()
    try:
        train(dataclasses.replace(
            get_recipe("cifar10-resnet50"), model="small_cnn", model_kwargs={"width": 8},
            data_root=str(data), out_dir=str(run), epochs=1, batch_size=32, progress=False,
            num_threads=1, device="cpu", evaluate=False))
    finally:
        torch.set_num_threads(n)
    code, out, err = _run(["uncertainty", "fit", str(run), "--passes", "2", "--epochs", "1",
                           "--batch-size", "16", "--width", "8", "--no-val", "--no-progress",
                           "--device", "cpu"], capsys)
    assert code == 0, err
    cache = EmbeddingCache(run / "uncertainty" / "cache" / "train_x2")
    assert cache.n_passes == 2 and len(cache) == 2 * cache.n_samples
    assert cache.identity["augment"].endswith("random_crop_flip")
    emb, _, labels = cache.tensors()
    m = cache.n_samples
    assert torch.equal(labels[:m], labels[m:])
    assert not torch.equal(emb[:m], emb[m:])  # two different augmented passes
    code, out, err = _run(["uncertainty", "eval", str(run), "--no-ood", "--transfer", "cifar100",
                           "--no-progress", "--device", "cpu"], capsys)
    assert code == 0, err
    res = json.loads((run / "uncertainty" / "results.json").read_text())
    tr = res["transfer"]["cifar100"]
    assert tr["n"] == 40 and "recall_at_1" in tr and "r_auroc_correct" not in tr
    assert "zero-shot cifar100" in out


def test_mnist1d_fit_on_validation_and_transfer_to_other_classes_and_generator(tmp_path, capsys):
    """The paper's setting on MNIST-1D: a backbone on classes 0-4, a head fitted on the held-out
    validation split, zero-shot transfer to classes 5-9 and to a shifted generator."""
    from torchcal.train import get_recipe, train

    run = tmp_path / "m1d"
    data = {"classes": "0-4", "n_train": 60, "n_val": 40, "n_test": 40}
    n = torch.get_num_threads()
    try:
        train(dataclasses.replace(
            get_recipe("mnist1d-cnn"), out_dir=str(run), epochs=1, progress=False, num_threads=1,
            device="cpu", model_kwargs={"width": 8}, data_root=str(tmp_path / "data"),
            data_kwargs=data, evaluate=False))
    finally:
        torch.set_num_threads(n)
    code, out, err = _run(["uncertainty", "fit", str(run), "--fit-split", "val", "--epochs", "1",
                           "--width", "16", "--batch-size", "16", "--no-progress", "--device",
                           "cpu"], capsys)
    assert code == 0, err
    assert "cached mnist1d val rows" in out and "fitted on the validation split" in out
    _, meta = load_head(run / "uncertainty" / "head.pt")
    assert meta["fit_split"] == "val" and meta["rows"] == 40
    code, out, err = _run(["uncertainty", "eval", str(run), "--no-progress", "--device", "cpu",
                           "--transfer", "mnist1d:classes=5-9",
                           "--transfer", "mnist1d:shear_scale=2:corr_noise_scale=0.6"], capsys)
    assert code == 0, err
    res = json.loads((run / "uncertainty" / "results.json").read_text())
    assert set(res["transfer"]) == {"mnist1d:classes=5-9", "mnist1d:shear_scale=2:corr_noise_scale=0.6"}
    unseen = res["transfer"]["mnist1d:classes=5-9"]
    assert unseen["n"] == 40 and "accuracy" not in unseen  # the classifier's classes do not apply
    assert set(unseen["baselines"]) == {"max_prob", "entropy", "embedding_norm"}
    assert "(the head's training split)" in out and "max-prob" in out and "emb. norm" in out
    assert "OOD AUROC: how well" in out  # an OOD number is printed with its explanation
    code, _, err = _run(["uncertainty", "eval", str(run), "--no-ood", "--transfer",
                         "mnist1d:classes=0-11"], capsys)
    assert code != 0 and "classes" in err


def test_a_diverged_fit_does_not_replace_a_good_head(digits_run, capsys, tmp_path):
    """`uncertainty fit RUN --lr 1e30` printed "ranking loss nan -> nan", saved a head of
    non-finite tensors over the good head.pt, and only then failed (issue 33, 2)."""
    head = tmp_path / "head.pt"
    common = ["--no-progress", "--device", "cpu", "--cache-dir", str(tmp_path / "caches"),
              "--width", "16", "--out", str(head), "--no-val"]
    code, _, err = _run(["uncertainty", "fit", str(digits_run), "--epochs", "1", *common], capsys)
    assert code == 0, err
    good, good_sha = head.read_bytes(), (tmp_path / "head.pt.sha256").read_bytes()
    code, out, err = _run(["uncertainty", "fit", str(digits_run), "--epochs", "2", "--lr", "1e30",
                           *common], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "diverged: its ranking loss is nan from epoch 1 (--lr 1e+30)" in err, err
    assert f"{head} not written; lower --lr" in err
    assert "ranking loss nan" not in out and "wrote" not in out, out
    assert head.read_bytes() == good and (tmp_path / "head.pt.sha256").read_bytes() == good_sha
    load_head(head)
