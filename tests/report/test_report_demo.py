"""`torchcal demo` end to end on a tiny configuration, and the `report` / `demo` CLI."""

import json
import math

import pytest

from torchcal.cli import main
from torchcal.cli.demo import parse_seeds
from torchcal.experiments import DemoConfig, run_demo
from torchcal.experiments.demo import applicable_losses
from torchcal.experiments.training import benchmark_config, run_pack_job
from torchcal.results_file import SCHEMA, read_results, write_results

TINY = dict(seeds=(0,), epochs=3, losses=("ce", "adafocal"), workers=1, progress=False,
            benchmark="digits")


def _same(a, b) -> bool:
    """Equal nested results, NaN equal to NaN (an undefined metric such as s99_accuracy)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return run_demo(DemoConfig(out=out, **TINY))


def test_tiny_demo_writes_every_file(tiny_demo):
    res = tiny_demo
    out = res.out_dir
    assert res.failed == []
    for name in ("report.md", "report.html", "results.json", "results.csv", "summary.csv"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    figs = sorted(p.name for p in (out / "figures").iterdir())
    # the default figure set (issue 43): every loss at once, as SVG; each loss's pre/post-T
    # pair only with figures="all" (tests/report/test_report_figure_sets.py)
    assert not any(f.startswith("reliability_") and "_ce" in f for f in figs), figs
    assert any(f.startswith("confidence_") for f in figs), figs
    assert any(f.startswith("reliability_overview_") for f in figs), figs
    assert any(f.startswith("roc_") for f in figs), figs
    assert any(f.startswith("gamma_") for f in figs), figs
    for f in figs:
        assert f.endswith(".svg") and (out / "figures" / f).read_bytes().startswith(b"<svg "), f
    for loss in ("ce", "adafocal"):
        run = out / "runs" / loss / "seed0"
        r = read_results(run)
        assert r["schema"] == SCHEMA and r["meta"]["loss"] == loss and r["meta"]["seed"] == 0
        assert (run / "logits" / "test.npz").is_file()
        assert r["ood"], "the demo evaluates an OOD set"
    md = (out / "report.md").read_text()
    assert "ECE pre T" in md and "Cross-entropy" in md and "AdaFocal (λ=0.1)" in md
    assert "λ=0.1" in md and "OOD" in md and "figures/gamma_" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/svg+xml;base64,") == len(figs)
    assert "data:image/png" not in html
    doc = json.loads((out / "results.json").read_text())
    assert {g["loss"] for g in doc["groups"]} == {"ce", "adafocal"}
    assert "post T (T)" in res.report.text and "Cross-entropy" in res.report.text


def test_demo_is_deterministic_across_processes(tiny_demo, tmp_path):
    """The same (loss, seed) in a spawned worker gives exactly the numbers of the in-process run."""
    ref = read_results(tiny_demo.out_dir / "runs" / "ce" / "seed0")
    res = run_demo(DemoConfig(out=tmp_path, **dict(TINY, losses=("ce",), workers=2, seeds=(0, 1))))
    assert res.failed == []
    again = read_results(tmp_path / "runs" / "ce" / "seed0")
    a, b = again["test"]["pre"], ref["test"]["pre"]
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a), (a, b)
    assert again["temperatures"] == ref["temperatures"]
    other = read_results(tmp_path / "runs" / "ce" / "seed1")
    assert other["test"]["pre"]["nll"] != ref["test"]["pre"]["nll"]  # seeds differ


def test_rerun_with_other_epochs_retrains_instead_of_reusing(tiny_demo, tmp_path):
    """Re-running the demo into the same --out with other settings must not report the old
    runs' models under the new settings."""
    import shutil

    out = tmp_path / "again"
    shutil.copytree(tiny_demo.out_dir / "runs" / "ce", out / "runs" / "ce")
    res = run_demo(DemoConfig(out=out, **dict(TINY, losses=("ce",), epochs=1)))
    assert res.failed == []
    run = out / "runs" / "ce" / "seed0"
    log = (run / "log.jsonl").read_text().splitlines()
    assert len(log) == 1 and json.loads(log[0])["epoch"] == 1
    assert read_results(run)["meta"]["epochs"] == 1


def test_default_losses_cover_the_issue_list(demo_configs):
    names = applicable_losses()
    for n in ("ce", "ls", "brier", "mmce", "focal", "flsd53", "dual_focal", "adafocal", "bsce_gra"):
        assert n in names
    jobs = demo_configs(DemoConfig(seeds=(3, 4), benchmark="digits"), __import__("pathlib").Path("/x"))
    assert len(jobs) == 2 * len(names)
    adaf = [j for j in jobs if j.loss == "adafocal"][0]
    assert adaf.loss_kwargs["lam"] == 0.1 and adaf.out_dir.endswith("adafocal/seed3")
    assert adaf.recipe == "digits-mlp" and adaf.data_kwargs == {"noise_std": 0.5}


def test_mnist1d_is_the_default_at_the_papers_defaults(demo_configs):
    """The default demo: MNIST-1D, the claims' losses, AdaFocal at the paper's λ=1 (no demo
    override), 2 seeds x the recipe's 350 epochs (the papers' regime); --full: every demo loss,
    5 seeds, the recipe's 350 epochs."""
    from pathlib import Path

    from torchcal.experiments.calibration import CLAIM_LOSSES
    from torchcal.train.run import build_loss

    jobs = demo_configs(DemoConfig(), Path("/x"))
    assert {j.recipe for j in jobs} == {"mnist1d-cnn"}
    assert sorted({j.seed for j in jobs}) == [0, 1]
    assert [j.loss for j in jobs if j.seed == 0] == list(CLAIM_LOSSES)
    adaf = [j for j in jobs if j.loss == "adafocal"][0]
    assert "lam" not in adaf.loss_kwargs and adaf.data_kwargs == {}
    tc = adaf
    assert build_loss(tc).lam == 1.0  # the paper's λ, the registry default
    assert tc.epochs == 350 and tc.effective_milestones() == [150, 250]  # the recipe's
    assert "noise_std" not in tc.data_kwargs and tc.grad_clip == 2.0
    full = demo_configs(DemoConfig(full=True), Path("/x"))
    assert sorted({j.seed for j in full}) == [0, 1, 2, 3, 4]
    assert {j.loss for j in full} == set(applicable_losses())
    assert full[0].epochs == 350 and full[0].milestones == [150, 250]
    quick = demo_configs(DemoConfig(quick=True), Path("/x"))
    assert {j.loss for j in quick} == set(CLAIM_LOSSES)
    with pytest.raises(ValueError, match="`benchmark`"):
        demo_configs(DemoConfig(benchmark="cifar"), Path("/x"))


def test_failed_run_is_reported_not_fatal(tmp_path):
    from torchcal.train.packs import RunOutcome, form_packs

    cfg = benchmark_config("digits-mlp", loss="ce", seed=0, epochs=1, run_dir=str(tmp_path / "r"),
                           overrides={"model": "no-such-model"})
    (pack,) = form_packs([cfg])
    r = run_pack_job({"pack": pack})
    (o,) = [RunOutcome.from_json(x) for x in r["outcomes"]]
    assert r["error"] is None and o.error and "no-such-model" in o.error and o.traceback


def test_demo_argument_errors(tmp_path, capsys):
    assert main(["demo", "--losses", "ce,nope", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "Unknown loss 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--workers", "0"])
    assert parse_seeds("2") == (0, 1)


def test_report_cli_on_demo_runs_and_bad_file(tiny_demo, tmp_path, capsys):
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "results.json").write_text('{"schema": "torchcal.results/1", "test": 3}')
    out = tmp_path / "rep"
    code = main(["report", str(tiny_demo.out_dir / "runs"), str(bad), "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 1
    assert "broken/results.json" in cap.err and "malformed" in cap.err
    assert "Cross-entropy" in cap.out and str(out / "report.md") in cap.out
    assert (out / "report.html").is_file() and list((out / "figures").glob("reliability_*.svg"))
    # nothing readable at all: one clear line, exit status 2
    assert main(["report", str(bad), "--out", str(tmp_path / "rep2")]) == 2
    assert "broken/results.json" in capsys.readouterr().err


def test_report_reads_meta_from_config_json(tmp_path):
    """Runs from `torchcal train`/`eval` may keep the run description in config.json only."""
    from torchcal.report.build import build_report

    for seed, ece in ((1, 0.1), (2, 0.3)):
        run = tmp_path / f"run{seed}"
        write_results(run, {"schema": SCHEMA, "meta": {}, "temperatures": {"grid_ece": 2.0},
                            "test": {"pre": {"ece": ece, "error": 0.1}, "post": {}}})
        (run / "config.json").write_text(json.dumps({"dataset": "cifar10", "model": "resnet50",
                                                     "loss": "focal", "loss_kwargs": {"gamma": 3},
                                                     "seed": seed}))
    rep = build_report([tmp_path], tmp_path / "out", figures=False)
    (g,) = rep.groups
    assert (g.dataset, g.model, g.loss, g.seeds) == ("cifar10", "resnet50", "focal", [1, 2])
    assert g.mean["test.pre.ece"] == pytest.approx(0.2)
    assert "20.00 ± 14.14" in rep.text


def test_demo_cli_prints_table_and_report_path(tiny_demo, tmp_path, capsys):
    """`torchcal demo` ends by printing the main table and where the report is; re-running into
    a directory with the same settings reuses the finished runs (no retraining)."""
    import shutil

    out = tmp_path / "d"
    shutil.copytree(tiny_demo.out_dir / "runs", out / "runs")
    log = out / "runs" / "ce" / "seed0" / "log.jsonl"
    before = log.read_text()
    code = main(["demo", "--benchmark", "digits", "--seeds", "0,", "--epochs", "3", "--losses", "ce,adafocal",
                 "--workers", "1", "--no-progress", "--no-figures", "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    table = cap.out.split("Report:")[0]
    assert "Calibration: digits / mlp" in table and "post T (T)" in table
    assert "Cross-entropy" in table and "AdaFocal (λ=0.1)" in table
    assert f"Report: {out / 'report.md'}" in cap.out and str(out / "report.html") in cap.out
    assert str(out / "results.json") in cap.out and str(out / "results.csv") in cap.out
    assert log.read_text() == before
    assert _same(read_results(out / "runs" / "ce" / "seed0")["test"],
                 read_results(tiny_demo.out_dir / "runs" / "ce" / "seed0")["test"])


def test_rerun_with_more_epochs_equals_a_fresh_run(tiny_demo, tmp_path):
    """More epochs than an existing run: the trainer alone would resume it with the old schedule
    (milestones at 50%/75% of the old length); the demo must give a fresh run's numbers."""
    import shutil

    out = tmp_path / "again"
    shutil.copytree(tiny_demo.out_dir / "runs" / "ce", out / "runs" / "ce")
    cfg = dict(TINY, losses=("ce",), epochs=4, figures=False)
    assert run_demo(DemoConfig(out=out, **cfg)).failed == []
    assert run_demo(DemoConfig(out=tmp_path / "fresh", **cfg)).failed == []
    a = read_results(out / "runs" / "ce" / "seed0")
    b = read_results(tmp_path / "fresh" / "runs" / "ce" / "seed0")
    assert _same(a["test"], b["test"]) and a["temperatures"] == b["temperatures"]


def test_stale_detects_changed_training_settings(demo_configs, tiny_demo):
    import dataclasses

    from torchcal.train.packs import is_stale as _stale

    run = tiny_demo.out_dir / "runs" / "ce" / "seed0"
    (cfg,) = demo_configs(DemoConfig(out=tiny_demo.out_dir, **dict(TINY, losses=("ce",))),
                          tiny_demo.out_dir)
    assert not _stale(run, cfg)
    assert not _stale(run, dataclasses.replace(cfg, n_bins=10, num_threads=2, progress=True))
    for change in ({"lr": 0.02}, {"batch_size": 32}, {"weight_decay": 0.0},
                   {"data_kwargs": {"noise_std": 0.5, "n_copies": 2}}, {"epochs": 5},
                   {"model_kwargs": {"hidden": [64]}}):
        assert _stale(run, dataclasses.replace(cfg, **change)), change


def test_a_config_written_before_a_field_existed_is_not_stale(demo_configs, tiny_demo, tmp_path):
    """A finished run whose config.json lacks a newer TrainConfig field (e.g. `tensorboard`,
    `amp`) had that field's default: a rerun of the demo skips it instead of training it again
    (the retraining of every committed --full run that this caught)."""
    import json

    from torchcal.train.packs import is_stale as _stale

    (cfg,) = demo_configs(DemoConfig(out=tiny_demo.out_dir, **dict(TINY, losses=("ce",))),
                          tiny_demo.out_dir)
    old = json.loads((tiny_demo.out_dir / "runs" / "ce" / "seed0" / "config.json").read_text())
    for field in ("tensorboard", "amp", "compile"):
        old.pop(field, None)
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert not _stale(tmp_path, cfg)
    import dataclasses

    assert _stale(tmp_path, dataclasses.replace(cfg, compile=True))  # not the missing default


def test_knobs_reach_the_runs_and_the_report_text(demo_configs, tmp_path):
    from pathlib import Path

    from torchcal.experiments.demo import appendix_text, intro_text
    def _setup_text(cfg, job):  # the report's prose: the intro and the appendix
        return intro_text(cfg, [job]) + appendix_text(cfg, [job])

    cfg = DemoConfig(benchmark="digits", seeds=(0,), epochs=8, data_kwargs={"n_copies": 2, "noise_std": 0.3},
                     overrides={"lr": 0.02, "batch_size": 32, "model_kwargs": {"hidden": [32]}},
                     loss_kwargs={"focal": {"gamma": 2}}, losses=("ce", "focal"))
    jobs = demo_configs(cfg, Path("/x"))
    tc = jobs[1]
    assert (tc.lr, tc.batch_size, tc.epochs) == (0.02, 32, 8)
    assert tc.data_kwargs == {"n_copies": 2, "noise_std": 0.3}
    assert tc.loss_kwargs == {"gamma": 2} and tc.effective_milestones() == [4, 6]
    text = _setup_text(cfg, jobs[0])
    for s in ("std 0.3", "2 independent noisy copies", "MLP 64-32-10", "lr 0.02", "batch 32",
              "8 epochs", "epochs 4, 6 (50%, 75%)", "60/10/30", "(1077 / 180 / 540 images)"):
        assert s in text, (s, text)
    dg = DemoConfig(seeds=(0, 1), benchmark="digits")
    default = _setup_text(dg, demo_configs(dg, Path("/x"))[0])
    for s in ("std 0.5", "60/10/30", "5 independent noisy copies", "MLP 64-256-256-10",
              "momentum 0.9, lr 0.05, weight decay 0.0005, batch 64, 100 epochs",
              "lr ×0.1 at epochs 50, 75 (50%, 75%)"):
        assert s in default, (s, default)


def test_bad_knobs_are_one_error_before_any_run(tmp_path, capsys):
    out = tmp_path / "never"
    for argv, msg in ((["--data-arg", "n_copy=2"], "n_copy"),
                      (["--train-arg", "lrr=1"], "lrr"),
                      (["--loss-arg", "focal:gama=2", "--losses", "focal"], "gama"),
                      (["--loss-arg", "focal:gamma=2", "--losses", "ce"], "does not train"),
                      (["--loss-arg", "gamma=2"], "LOSS:KEY=VALUE")):
        assert main(["demo", "--out", str(out), "--no-progress", *argv]) == 2, argv
        assert msg in capsys.readouterr().err, argv
    assert not out.exists()


def test_adafocal_note_names_the_lambda_used():
    from torchcal.experiments.calibration import ADAFOCAL_LAM, adafocal_note

    assert adafocal_note(ADAFOCAL_LAM).startswith(f"AdaFocal uses λ={ADAFOCAL_LAM:g} instead of the paper's λ=1")
    assert adafocal_note(1.0).startswith("AdaFocal uses the paper's λ=1")
    assert adafocal_note(0.3).startswith("AdaFocal uses λ=0.3 (set by the user")
    for lam in (ADAFOCAL_LAM, 1.0, 0.3):
        assert "γ_max" in adafocal_note(lam)  # and why


def test_progress_bar_shows_runs_done_and_time_left(tmp_path, capsys):
    from torchcal.experiments import Job, LocalExecutor, run_sweep

    # quick jobs (a run spec is resolved in this process, so an unknown recipe no longer makes
    # a job that fails at once: it is refused before the sweep)
    jobs = [Job(f"run {s}", dict, {"seed": s}) for s in range(2)]
    res = run_sweep(jobs, LocalExecutor(workers=1), progress=True)
    err = capsys.readouterr().err
    assert len(res) == 2 and "2/2 runs" in err and " left]" in err and "<" in err


def test_default_out_is_a_fresh_directory(tmp_path, monkeypatch):
    from torchcal.experiments.demo import default_out as _default_out

    monkeypatch.chdir(tmp_path)
    a = _default_out()
    assert a.parent == tmp_path / "torchcal-demo" and not a.exists()
    a.mkdir(parents=True)
    b = _default_out()
    assert b != a and b.parent == a.parent and not b.exists()


def test_report_on_train_and_eval_runs(tmp_path, capsys):
    """`torchcal report` on runs of `torchcal train` (evaluated at the end) and `torchcal eval`,
    with one run never evaluated: grouped by data set/model/loss, the missing file named."""
    root = tmp_path / "runs"
    common = ["--recipe", "digits-mlp", "--loss", "focal", "--loss-arg", "gamma=3", "--epochs", "2",
              "--no-progress"]
    assert main(["train", *common, "--seed", "0", "--out", str(root / "f0")]) == 0
    assert main(["train", *common, "--seed", "1", "--out", str(root / "f1"), "--no-eval"]) == 0
    assert main(["eval", str(root / "f1")]) == 0
    assert main(["train", *common, "--seed", "2", "--out", str(root / "f2"), "--no-eval"]) == 0
    capsys.readouterr()
    out = tmp_path / "rep"
    assert main(["report", str(root), "--out", str(out), "--figures", "all"]) == 1
    cap = capsys.readouterr()
    assert str((root / "f2" / "results.json").resolve()) in cap.err
    assert "Focal (γ=3)" in cap.out and str(out / "report.md") in cap.out
    doc = json.loads((out / "results.json").read_text())
    (g,) = doc["groups"]
    assert (g["dataset"], g["model"], g["loss"], g["seeds"]) == ("digits", "mlp", "focal", [0, 1])
    assert g["mean"]["test.pre.ece"] == pytest.approx(
        (read_results(root / "f0")["test"]["pre"]["ece"] + read_results(root / "f1")["test"]["pre"]["ece"]) / 2)
    assert list((out / "figures").glob("reliability_*focal*.png"))
    assert list((out / "figures").glob("roc_*.svg"))


def test_every_registered_loss_is_trained_or_excluded_with_a_reason(demo_configs):
    """"Every loss of the registry that applies": the losses tagged `demo` in the registry are
    trained by --full; every other registered loss is named in the report with its reason."""
    from torchcal.experiments import get_benchmark
    from torchcal.experiments.demo import appendix_text
    from torchcal.losses import LOSSES, list_losses
    from torchcal.report.aggregate import loss_label

    tagged = list_losses(tag="demo")
    assert applicable_losses() == tagged and {"ce", "focal", "adafocal"} <= set(tagged)
    cfg = DemoConfig(seeds=(0,), full=True)
    text = appendix_text(cfg, demo_configs(cfg, __import__("pathlib").Path("/x")))
    rows = {line.split(" | ")[1]: line.split(" | ")[0].lstrip("| ").split(", ")
            for line in text.splitlines() if line.startswith("| ") and "Losses |" not in line}
    bench = get_benchmark("mnist1d")
    for n in list_losses():
        if n not in tagged:  # the appendix table's row of its reason names it
            assert loss_label(n) in next(v for k, v in rows.items()
                                         if k.startswith(bench.exclusion(n))), n
            assert LOSSES.entry(n).tags, n  # each built-in loss says why it is left out


def test_in_process_demo_restores_the_callers_threads(tmp_path):
    import torch

    from torchcal.experiments import Job, LocalExecutor, run_sweep
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # the job function sets one thread, then fails at once (no pack)
        res = run_sweep([Job("r", run_pack_job, {"pack": None})], LocalExecutor(workers=1),
                        progress=False)
        assert "Expected `pack` to be a Pack" in res[0]["error"]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_demo_names_are_not_in_report():
    """The demo trains models, so it lives in torchcal.experiments; report/ keeps no pointer
    (the moved-name shims are gone, issue 32)."""
    import torchcal.report

    for name in ("run_demo", "DemoConfig", "DemoResult"):
        assert name not in torchcal.report.__all__ and not hasattr(torchcal.report, name)


@pytest.mark.parametrize("bad", [dict(figure_format="jpg"), dict(figures="some")])
def test_bad_report_settings_are_refused_before_anything_trains(tmp_path, monkeypatch, bad):
    """A figure format or set the report cannot draw was refused by build_report only after
    every run had trained: the demo checks both first, naming the argument."""
    import torchcal.experiments.demo as demo_mod

    def no_training(*a, **kw):  # pragma: no cover - reached only with the defect
        raise AssertionError("trained before the settings were checked")

    monkeypatch.setattr(demo_mod, "run_sweep", no_training)
    with pytest.raises(ValueError, match=next(iter(bad))):
        run_demo(DemoConfig(out=tmp_path / "demo", **dict(TINY, **bad)))
