"""`torchcal demo` end to end on a tiny configuration, and the `report` / `demo` CLI."""

import json
import math

import pytest

from torchcal.cli import main
from torchcal.evaluate import SCHEMA, read_results, write_results
from torchcal.report.cli import parse_seeds
from torchcal.report.demo import DemoConfig, applicable_losses, demo_jobs, run_demo, run_job

TINY = dict(seeds=(0,), epochs=3, losses=("ce", "adafocal"), workers=1, progress=False)


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
    figs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert any(f.startswith("reliability_") and "_ce" in f for f in figs), figs
    assert any(f.startswith("reliability_") and "adafocal" in f for f in figs), figs
    assert any(f.startswith("confidence_") for f in figs), figs
    assert any(f.startswith("reliability_overview_") for f in figs), figs
    assert any(f.startswith("roc_") for f in figs), figs
    assert any(f.startswith("gamma_") for f in figs), figs
    for f in figs:
        assert (out / "figures" / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
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
    assert html.count("data:image/png;base64,") == len(figs)
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


def test_default_losses_cover_the_issue_list():
    names = applicable_losses()
    for n in ("ce", "ls", "brier", "mmce", "focal", "flsd53", "dual_focal", "adafocal", "bsce_gra"):
        assert n in names
    jobs = demo_jobs(DemoConfig(seeds=(3, 4)), __import__("pathlib").Path("/x"))
    assert len(jobs) == 2 * len(names)
    adaf = [j for j in jobs if j["loss"] == "adafocal"][0]
    assert adaf["loss_kwargs"]["lam"] == 0.1 and adaf["run_dir"].endswith("adafocal/seed3")


def test_failed_run_is_reported_not_fatal(tmp_path):
    r = run_job({"recipe": "no-such-recipe", "loss": "ce", "loss_kwargs": {}, "seed": 0,
                 "epochs": 1, "noise_std": 0.5, "n_bins": 15, "run_dir": str(tmp_path / "r"),
                 "overrides": {}})
    assert r["error"] and "no-such-recipe" in r["error"]


def test_demo_argument_errors(tmp_path, capsys):
    assert main(["demo", "--losses", "ce,nope", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "Unknown loss(es) ['nope']" in capsys.readouterr().err
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
    assert (out / "report.html").is_file() and list((out / "figures").glob("reliability_*.png"))
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
