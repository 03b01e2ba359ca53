"""The train / eval / calibrate CLI: one-line errors, SIGKILL + --resume, a 2-process torchrun run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from torchcal.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")


def _env():
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def _one_line_error(capsys, argv, match):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and match in err, err
    return err


def test_help_explains_every_option(capsys):
    for cmd in ("train", "eval", "calibrate"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert "usage: torchcal " + cmd in out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for opt in ("--recipe", "--loss", "--loss-arg", "--data-root", "--download", "--out",
                "--resume", "--epochs", "--batch-size", "--lr", "--seed", "--device", "--amp",
                "--compile", "--select-best-by", "--uncertainty-head", "digits-mlp"):
        assert opt in out


def test_user_mistakes_are_one_line(tmp_path, capsys):
    _one_line_error(capsys, ["train", "--recipe", "nope", "--out", str(tmp_path / "r")],
                    "Unknown recipe 'nope'")
    _one_line_error(capsys, ["train", "--recipe", "digits-mlp", "--loss", "nope",
                             "--out", str(tmp_path / "r")], "Unknown loss 'nope'")
    _one_line_error(capsys, ["train", "--recipe", "digits-mlp", "--model", "resnet51",
                             "--out", str(tmp_path / "r")], "Unknown model 'resnet51'")
    _one_line_error(capsys, ["train", "--recipe", "digits-mlp", "--model", "small_cnn",
                             "--model-arg", "widht=4", "--epochs", "1", "--no-progress",
                             "--out", str(tmp_path / "r")], "Bad --model-arg for model 'small_cnn'")
    _one_line_error(capsys, ["train", "--out", str(tmp_path / "r")], "--recipe is required")
    _one_line_error(capsys, ["train", "--recipe", "digits-mlp", "--loss-arg", "gamma",
                             "--out", str(tmp_path / "r")], "KEY=VALUE")
    _one_line_error(capsys, ["train", "--recipe", "digits-mlp", "--epochs", "0",
                             "--out", str(tmp_path / "r")], "`epochs`")
    # missing data: an empty data root for CIFAR, no download
    _one_line_error(capsys, ["train", "--recipe", "cifar10-resnet50", "--data-root",
                             str(tmp_path / "empty"), "--out", str(tmp_path / "r"),
                             "--no-progress"], "cifar")
    # corrupt / missing checkpoint
    (tmp_path / "bad" / "checkpoints").mkdir(parents=True)
    (tmp_path / "bad" / "checkpoints" / "last.pt").write_bytes(b"garbage")
    _one_line_error(capsys, ["eval", str(tmp_path / "bad")], "corrupt")
    _one_line_error(capsys, ["eval", str(tmp_path / "missing")], "does not exist")
    _one_line_error(capsys, ["calibrate", str(tmp_path / "none.npz")], "does not exist")
    # an output path that names an existing file: one line naming it, no traceback
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    _one_line_error(capsys, ["train", "--recipe", "digits-mlp", "--epochs", "1", "--no-progress",
                             "--out", str(afile)], str(afile))
    from torchcal.logits_file import save_logits

    save_logits(tmp_path / "v.npz", np.eye(3, dtype=np.float32) * 2, np.arange(3))
    _one_line_error(capsys, ["calibrate", str(tmp_path / "v.npz"), "--out",
                             str(afile / "cal.json")], str(afile))


def _final_metrics(run):
    res = json.loads((run / "results.json").read_text())
    last = json.loads((run / "log.jsonl").read_text().splitlines()[-1])
    return res, last


def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    epochs = "12"
    common = ["--recipe", "digits-mlp", "--loss", "ce", "--epochs", epochs, "--no-progress",
              "--num-threads", "1", "--device", "cpu", "--checkpoint-every", "2"]
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "torchcal.cli", "train", *common, "--out",
                             str(run)], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    ckpt = run / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (run / "results.json").exists()  # it was killed mid-run
    n_logged = len((run / "log.jsonl").read_text().splitlines())
    assert 1 <= n_logged < int(epochs)
    from torchcal.train.checkpoint import load_checkpoint

    at = int(load_checkpoint(ckpt)["epoch"])
    assert 1 <= at < int(epochs)
    before = (run / "log.jsonl").read_text().splitlines()[:at]
    # resume (no --recipe needed: config.json is reused) ...
    r = subprocess.run([sys.executable, "-m", "torchcal.cli", "train", "--out", str(run), "--resume",
                        "--no-progress", "--num-threads", "1"], env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # ... and an uninterrupted run in this process (one thread, as the subprocesses)
    import torch

    n_threads = torch.get_num_threads()
    try:
        assert main(["train", *common, "--out", str(tmp_path / "full")]) == 0
    finally:
        torch.set_num_threads(n_threads)
    ra, la = _final_metrics(run)
    rb, lb = _final_metrics(tmp_path / "full")
    assert la["epoch"] == lb["epoch"] == int(epochs)
    for k, v in lb.items():
        if isinstance(v, float) and k != "seconds":
            assert la[k] == pytest.approx(v, abs=1e-6), k
    for k, v in rb["test"]["pre"].items():
        if v is not None:
            assert ra["test"]["pre"][k] == pytest.approx(v, abs=1e-6), k
    after = (run / "log.jsonl").read_text().splitlines()
    assert len(after) == int(epochs)
    # it continued from the checkpoint instead of training again from epoch 0: the epochs up to
    # the checkpoint are the killed process's log lines, byte for byte (their "seconds" too)
    assert after[:at] == before


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_torchrun_gloo(tmp_path):
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "-m", "torchcal.cli", "train", "--recipe", "digits-mlp", "--loss", "adafocal", "--epochs", "2",
           "--no-progress", "--num-threads", "1", "--device", "cpu", "--out", str(run),
           "--reduction", "sum", "--lr", "0.001", "--val-fraction", "0.25"]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) in (
        ["best.pt", "best.pt.sha256", "last.pt", "last.pt.sha256"], ["last.pt", "last.pt.sha256"])
    from torchcal.train.checkpoint import load_checkpoint

    st = load_checkpoint(run / "checkpoints" / "last.pt")
    assert st["epoch"] == 2
    conf = json.loads((run / "config.json").read_text())
    assert conf["world_size"] == 2
    assert len((run / "log.jsonl").read_text().splitlines()) == 2  # rank 0 only
    # evaluation gathered every sample exactly once (no sampler padding)
    from torchcal.train import build_data
    from torchcal.train.config import TrainConfig

    splits = build_data(TrainConfig.from_dict(conf))
    res = json.loads((run / "results.json").read_text())
    assert res["n"] == {"val": len(splits.val), "test": len(splits.test)}
    assert len(splits.val) % 2 == 1  # the sampler pads the validation set by one sample
    for name in ("val", "test"):
        with np.load(run / "logits" / f"{name}.npz") as f:
            np.testing.assert_array_equal(f["labels"], getattr(splits, name).labels.numpy())
    assert r.stdout.count("trained digits-mlp") == 1  # rank-0 printing
    # 808 training samples (val_fraction 0.25): no sampler padding in training.  Each step of
    # the two ranks covers exactly the samples of the single-process step (the shards interleave
    # the same permutation) and DDP's gradient averaging is undone for the summed loss, so a
    # one-process run of the MLP (no BatchNorm) takes the same steps.
    import torch

    n = torch.get_num_threads()
    try:
        assert main(["train", "--recipe", "digits-mlp", "--loss", "adafocal", "--epochs", "2",
                     "--no-progress", "--num-threads", "1", "--device", "cpu", "--reduction",
                     "sum", "--lr", "0.001", "--val-fraction", "0.25",
                     "--out", str(tmp_path / "single")]) == 0
    finally:
        torch.set_num_threads(n)
    a = json.loads((run / "log.jsonl").read_text().splitlines()[-1])
    b = json.loads((tmp_path / "single" / "log.jsonl").read_text().splitlines()[-1])
    for k in ("train_loss", "train_error", "val_nll", "val_ece", "val_error", "test_nll",
              "fc_weight_norm"):
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
    # AdaFocal, a stateful loss, saw the whole validation set through the ranks' synced shares:
    # its per-bin γ and bin edges are those of the single process
    for k in ("gammas", "bin_edges"):
        assert a["loss_state"][k] == pytest.approx(b["loss_state"][k], rel=1e-6, abs=1e-9), k
    assert a["loss_state"]["gammas"] != [1.0] * 15  # moved by the validation passes
    with np.load(run / "logits" / "val.npz") as f, \
            np.load(tmp_path / "single" / "logits" / "val.npz") as g:
        np.testing.assert_allclose(f["logits"], g["logits"], rtol=1e-4, atol=1e-5)


def test_calibrate_on_saved_logits(tmp_path, capsys):
    pytest.importorskip("torchcal.posthoc", reason="posthoc not built yet")
    from torchcal import posthoc

    if not hasattr(posthoc, "TemperatureScaling"):
        pytest.skip("posthoc.TemperatureScaling not built yet")
    from torchcal.logits_file import save_logits

    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 400)
    z = rng.normal(size=(400, 5)) * 1.0
    z[np.arange(400), y] += 2.0
    z *= 3.0  # over-confident
    save_logits(tmp_path / "val.npz", z[:200], y[:200])
    save_logits(tmp_path / "test.npz", z[200:], y[200:])
    assert main(["calibrate", str(tmp_path / "val.npz"), "--test", str(tmp_path / "test.npz"),
                 "--method", "nll", "--out", str(tmp_path / "cal.json")]) == 0
    out = capsys.readouterr().out
    assert "nll: T = " in out and "test: ECE" in out
    rep = json.loads((tmp_path / "cal.json").read_text())
    assert rep["test"]["post"]["nll"] < rep["test"]["pre"]["nll"]
    assert rep["test"]["post"]["error"] == rep["test"]["pre"]["error"]
    # the fitted temperature is the NLL minimiser on the validation logits
    import torch

    t = rep["calibrator"]["temperature"]
    zv, yv = torch.tensor(z[:200]), torch.tensor(y[:200])
    grid = torch.linspace(0.5, 6.0, 2201, dtype=torch.float64)
    nlls = torch.stack([torch.nn.functional.cross_entropy(zv / g, yv) for g in grid])
    t_ref = float(grid[nlls.argmin()])
    assert abs(float(t) - t_ref) < 5e-3
    # a run directory works as the argument (val.npz fitted, test.npz evaluated)
    (tmp_path / "run" / "logits").mkdir(parents=True)
    for f in ("val.npz", "test.npz"):
        (tmp_path / "run" / "logits" / f).write_bytes((tmp_path / f).read_bytes())
    assert main(["calibrate", str(tmp_path / "run"), "--method", "grid_ece"]) == 0
    assert "test: ECE" in capsys.readouterr().out


def test_overrides_reach_the_config(tmp_path):
    """--epochs/--batch-size/--lr/--seed/--device/--model/--loss override the recipe, nothing else."""
    from torchcal.cli import build_parser
    from torchcal.cli.train import config_from_args
    from torchcal.train import get_recipe

    argv = ["train", "--recipe", "cifar10-resnet50", "--out", str(tmp_path / "r"), "--epochs", "7",
            "--batch-size", "32", "--lr", "0.02", "--seed", "5", "--device", "cpu",
            "--model", "small_cnn", "--model-arg", "width=8", "--loss", "focal",
            "--loss-arg", "gamma=2"]
    cfg = config_from_args(build_parser().parse_args(argv))
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.seed, cfg.device) == (7, 32, 0.02, 5, "cpu")
    assert (cfg.model, cfg.model_kwargs) == ("small_cnn", {"width": 8})
    assert cfg.loss == "focal" and cfg.effective_loss_kwargs() == {"gamma": 2}
    ref = get_recipe("cifar10-resnet50")
    for f in ("dataset", "momentum", "weight_decay", "milestones", "lr_gamma", "grad_clip",
              "reduction", "val_fraction", "data_seed", "select_best_by", "amp", "compile"):
        assert getattr(cfg, f) == getattr(ref, f), f
    # without overrides: the recipe as registered (and the recipe's default loss hyperparameters)
    plain = config_from_args(build_parser().parse_args(
        ["train", "--recipe", "cifar10-resnet50", "--out", str(tmp_path / "r"), "--loss", "focal"]))
    assert plain.effective_loss_kwargs() == {"gamma": 3.0}
    assert (plain.epochs, plain.batch_size, plain.lr, plain.model) == (350, 128, 0.1, "resnet50")


def test_eval_command_last_and_best(tmp_path, capsys):
    """`torchcal eval RUN_DIR` evaluates the last epoch's checkpoint into logits/*.npz and
    results.json, `--checkpoint best` the selected one into logits-best/ and results-best.json."""
    import torch

    from torchcal.logits_file import load_logits
    from torchcal.results_file import read_results
    from torchcal.train import build_data, load_model_from_run, predict_logits

    run = tmp_path / "run"
    n = torch.get_num_threads()
    try:
        assert main(["train", "--recipe", "digits-mlp", "--epochs", "3", "--no-progress",
                     "--num-threads", "1", "--device", "cpu", "--no-eval",
                     "--select-best-by", "nll", "--out", str(run)]) == 0
    finally:
        torch.set_num_threads(n)
    assert not (run / "results.json").exists()
    capsys.readouterr()
    for which, flag in (("last", []), ("best", ["--checkpoint", "best"])):
        assert main(["eval", str(run), *flag]) == 0
        out = capsys.readouterr().out
        assert f"({which})" in out and "AUROC(entropy)" in out
        sub = "" if which == "last" else "-best"
        res = read_results(run / f"results{sub}.json")
        assert res["meta"]["checkpoint"] == which
        model, cfg = load_model_from_run(run, checkpoint=which)
        splits = build_data(cfg)
        z, y = predict_logits(model, splits.test, "cpu", 512)
        zs, ys = load_logits(run / f"logits{sub}" / "test.npz")
        np.testing.assert_allclose(zs, z.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(ys, y.numpy())
        assert set(res["temperatures"]) >= {"grid_ece", "grid_adaece", "grid_nll", "nll"}
        assert "digits_ood" in res["ood"] and (run / f"logits{sub}" / "ood_digits_ood.npz").is_file()
    assert read_results(run)["meta"]["checkpoint"] == "last"  # kept beside the best's files
    log = [json.loads(s) for s in (run / "log.jsonl").read_text().splitlines()]
    best_epoch = min(range(3), key=lambda i: log[i]["val_nll"]) + 1
    assert res["meta"]["epoch"] == best_epoch


def test_train_uncertainty_head_flag(tmp_path):
    """`torchcal train ... --uncertainty-head` trains the head beside the classifier: the
    checkpoint holds the head and its optimiser, the log its ranking loss, and the classifier's
    weights equal a run without the flag."""
    import torch

    from torchcal.train.checkpoint import load_checkpoint

    n = torch.get_num_threads()
    common = ["train", "--recipe", "digits-mlp", "--epochs", "1", "--no-progress",
              "--num-threads", "1", "--device", "cpu", "--no-eval"]
    try:
        assert main([*common, "--uncertainty-head", "--out", str(tmp_path / "head")]) == 0
        assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    finally:
        torch.set_num_threads(n)
    sh = load_checkpoint(tmp_path / "head" / "checkpoints" / "last.pt")
    sp = load_checkpoint(tmp_path / "plain" / "checkpoints" / "last.pt")
    assert sh["head"] is not None and sh["head_optimizer"]["state"]
    assert sp["head"] is None
    for k, v in sp["model"].items():
        assert torch.equal(v, sh["model"][k]), k
    rec = json.loads((tmp_path / "head" / "log.jsonl").read_text().splitlines()[-1])
    assert rec["head_ranking_loss"] > 0
    written = json.loads((tmp_path / "head" / "config.json").read_text())
    assert written["joint_head"]["enabled"] is True and "uncertainty_head" not in written


def test_train_a_multitask_run_and_resume_it(tmp_path, capsys):
    """`torchcal train --recipe mnist1d-multitask`: the one line it prints reads the run's
    `multitask` results block (it raised KeyError 'weights' when the results moved into the
    common results.json); `--resume` of the finished run says there is nothing to train."""
    out = tmp_path / "mt"
    argv = ["train", "--recipe", "mnist1d-multitask", "--epochs", "2", "--no-progress",
            "--num-threads", "1", "--model-arg", "width=8", "--data-root", str(tmp_path / "d"),
            "--data-arg", "n_train=120", "--data-arg", "n_val=40", "--data-arg", "n_test=40",
            "--out", str(out)]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "class + translation, kendall" in line and "RMSE" in line and "task weights (" in line
    res = json.loads((out / "results.json").read_text())
    assert res["schema"] == "torchcal.results/1" and len(res["multitask"]["weights"]) == 2
    assert main([*argv, "--resume"]) == 0
    assert "nothing was trained" in capsys.readouterr().out
