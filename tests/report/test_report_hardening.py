"""`torchcal report` on bad or hostile inputs (issue 14): a non-UTF-8 or corrupt results.json
costs only that run, metadata is validated before it becomes a label, report.html has the same
tables as report.md, and the ECE noise floor is computed and stated."""

from __future__ import annotations

import json
import os
import re
import stat

import numpy as np
import pytest
import torch
from test_report_aggregate import fake_results  # same folder (pytest puts it on sys.path)

from torchcal.cli import main
from torchcal.metrics import ece, ece_noise_floor
from torchcal.report.aggregate import load_runs
from torchcal.report.build import build_report
from torchcal.results_file import write_results

RUNS = dict(losses=("ce", "focal"), seeds=2, n=300)  # the `runs` fixture (conftest.py)


def test_non_utf8_and_corrupt_results_skip_only_that_run(runs, tmp_path, capsys):
    bad = runs / "ce" / "seed7" / "results.json"
    bad.parent.mkdir()
    bad.write_bytes(b'{"schema": "torchcal.results/1", "meta": {"loss": "\xff\xfe"}}')
    cut = runs / "focal" / "seed8" / "results.json"
    cut.parent.mkdir()
    cut.write_text(json.dumps(fake_results("focal", 8, 0.1, 0.02, 1.5))[:150])
    code = main(["report", str(runs), "--out", str(tmp_path / "rep"), "--no-figures"])
    out, err = capsys.readouterr()
    assert code == 1  # the report is written; the exit status says files were skipped
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err
    assert any(str(bad) in s and "cannot be read" in s for s in lines), err
    assert any(str(cut) in s and "not valid JSON" in s for s in lines), err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Cross-entropy" in md and "Focal" in md and "## Skipped files" in md


@pytest.mark.parametrize("field,value", [
    ("loss", "ce | **pwned**\n# x"), ("loss", "<img src=x onerror=alert(1)>"), ("loss", ["ce"]),
    ("dataset", "a" * 200), ("model", {"x": 1}),
    ("loss_kwargs", {"gamma": "<script>"}), ("loss_kwargs", {"a b": 1}),
    ("loss_kwargs", {"gamma": [[[1]]]}), ("seed", "0; rm -rf"), ("seed", True),
])
def test_metadata_is_validated_before_it_becomes_a_label(runs, tmp_path, field, value):
    hostile = runs / "evil" / "results.json"
    res = fake_results("ce", 9, 0.1, 0.02, 1.5)
    res["meta"][field] = value
    write_results(hostile, res)
    loaded = load_runs([runs])
    assert len(loaded.runs) == 4
    ((path, msg),) = loaded.errors
    assert path == str(hostile.resolve()) and f"meta.{field}" in msg, msg
    rep = build_report([runs], tmp_path / "rep", figures=False)
    html = rep.report_html.read_text()
    assert "<img src=x" not in html and "<script>" not in html
    md_tables = rep.report_md.read_text().split("## Skipped files")[0]
    assert "pwned" not in md_tables and "<script>" not in md_tables


def test_html_has_the_same_tables_as_markdown(runs, tmp_path):
    rep = build_report([runs], tmp_path / "rep", figures=False)
    md, html = rep.report_md.read_text(), rep.report_html.read_text()
    md_titles = re.findall(r"^### (.+)$", md, flags=re.M)
    html_titles = re.findall(r"<h3>(.+?)</h3>", html)
    assert md_titles == [t.replace("&#x27;", "'") for t in html_titles]
    assert "Run directories" in md_titles
    assert len(re.findall(r"^\|---", md, flags=re.M)) == html.count("<table>") == len(md_titles)
    for d in ("ce/seed0", "focal/seed1"):
        assert d in html.split("<h2>Runs</h2>")[1]


def test_noise_floor_matches_the_exact_value_and_a_reference():
    # one bin holding n samples of confidence 0.5: E|Binomial(n, 1/2)/n - 1/2| exactly
    from math import comb

    n = 50
    exact = sum(comb(n, k) * abs(k / n - 0.5) for k in range(n + 1)) / 2 ** n
    assert ece_noise_floor([0.5] * n, n_bins=1, n_draws=40000) == pytest.approx(exact, rel=0.02)
    # a reference: the ECE of torchcal.metrics on labels drawn with the same uniforms
    rng = np.random.default_rng(1)
    c = rng.uniform(0.5, 1.0, 400)
    got = ece_noise_floor(c, n_bins=15, n_draws=50, seed=3)
    u = torch.rand(50, 400, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    probs = torch.stack([torch.as_tensor(c), 1 - torch.as_tensor(c)], 1)
    ref = np.mean([float(ece(probs=probs, labels=(u[r] >= torch.as_tensor(c)).long(), n_bins=15))
                   for r in range(50)])
    assert got == pytest.approx(ref, rel=1e-9)
    with pytest.raises(ValueError, match="`confidences`"):
        ece_noise_floor([])


def test_noise_floor_caveat_is_in_the_report(runs, tmp_path):
    rep = build_report([runs], tmp_path / "rep", figures=False)
    md = rep.report_md.read_text()
    assert "Noise floor: a perfectly calibrated model" in md and "on 300 test samples" in md
    doc = json.loads(rep.results_json.read_text())
    floors = [g["ece_noise_floor"] for g in doc["groups"]]
    assert all(0.0 < f < 0.2 for f in floors)
    assert re.search(r"ECE of about \d+\.\d\d(-\d+\.\d\d)?%", md)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_report_files_respect_the_umask(runs, tmp_path):
    from torchcal.report import figures as F

    old = os.umask(0o022)
    try:
        rep = build_report([runs], tmp_path / "rep", figures=False)
        png = F.save_figure(F.new_figure(1, 1), tmp_path / "rep" / "figures" / "x.png")
    finally:
        os.umask(old)
    files = [rep.report_md, rep.report_html, rep.results_json, rep.results_csv, png]
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o644}


def test_results_files_name_runs_relative_to_the_report(runs, tmp_path):
    """Issue 26 (10): results.csv and results.json held absolute run directories (the paths of
    the machine that ran them); they name runs relative to the report's directory."""
    import csv

    rep = build_report([runs], tmp_path / "rep", figures=False)
    rows = list(csv.DictReader(rep.results_csv.open(encoding="utf-8")))
    assert sorted(r["run_dir"] for r in rows) == [
        f"../runs/{loss}/seed{s}" for loss in ("ce", "focal") for s in range(2)]
    doc = json.loads(rep.results_json.read_text(encoding="utf-8"))
    named = [r["run_dir"] for r in doc["runs"]] + [d for g in doc["groups"] for d in g["runs"]]
    assert named and all(d.startswith("../runs/") for d in named), named
    for d in named:  # each resolves from the report's directory to the run
        assert (rep.out_dir / d / "results.json").is_file()


def test_committed_results_name_no_machine_paths():
    import csv
    from pathlib import Path, PureWindowsPath

    root = Path(__file__).resolve().parents[2] / "docs" / "results"
    files = sorted(root.rglob("results.csv"))
    assert files
    for f in files:
        for row in csv.DictReader(f.open(encoding="utf-8")):
            for d in row.values():  # no cell names a machine path
                assert not d.startswith("/") and not PureWindowsPath(d).drive, (f, d)
            if "run_dir" in row:  # the demo's runs and ensembles, relative to the report
                assert row["run_dir"].startswith(("runs/", "ensembles/")), (f, row["run_dir"])
