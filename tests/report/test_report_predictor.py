"""The results' `predictor` field (issue 32): a loss's seeds and an ensemble of them are separate
rows; an ensemble record (`seed: null`) is never averaged in as one more seed, and a seed's run
without a seed is refused, named in the skipped files."""

import csv
import io
import json

import numpy as np
import pytest
from test_report_aggregate import fake_results  # same folder (pytest puts it on sys.path)

from torchcal.errors import ResultsFileError
from torchcal.experiments.claims import CLAIMS
from torchcal.report.aggregate import group_runs, load_runs, runs_from_results_csv
from torchcal.report.build import build_report
from torchcal.report.claims import check_claims
from torchcal.report.front import front_table
from torchcal.report.tables import main_table, runs_csv
from torchcal.results_file import PREDICTORS, predictor_of, write_results

CE_ECE = {0: 0.10, 1: 0.20, 2: 0.30}
ENSEMBLE_ECE = 0.45  # apart from the seeds: averaging it in would move the mean to 0.2625


@pytest.fixture()
def runs_dir(tmp_path):
    root = tmp_path / "runs"
    for seed, e in CE_ECE.items():
        write_results(root / "ce" / f"seed{seed}", fake_results("ce", seed, e, 0.02, 2.0))
        write_results(root / "focal" / f"seed{seed}", fake_results("focal", seed, e / 2, 0.02, 1.1))
    ens = fake_results("ce", None, ENSEMBLE_ECE, 0.05, 3.0)
    ens["meta"].update(predictor="ensemble", members=[0, 1, 2])
    write_results(root / "ce" / "ensemble", ens)
    return root


def test_an_ensemble_is_its_own_row_not_one_more_seed(runs_dir):
    loaded = load_runs([runs_dir])
    assert loaded.errors == []
    groups = group_runs(loaded.runs)
    assert [(g.loss, g.predictor, len(g.runs)) for g in groups] == [
        ("ce", "run", 3), ("ce", "ensemble", 1), ("focal", "run", 3)]
    ce, ens, _fl = groups
    seeds_mean = float(np.mean(np.array(list(CE_ECE.values()), dtype=np.float64)))
    assert ce.mean["test.pre.ece"] == pytest.approx(seeds_mean, abs=1e-12)  # 0.2, not 0.375
    assert ce.seeds == [0, 1, 2] and ens.seeds == [None]
    assert ens.mean["test.pre.ece"] == ENSEMBLE_ECE and ens.label == "Cross-entropy · ensemble"
    tab = main_table(groups)
    assert [r[0].text for r in tab.rows] == ["Cross-entropy", "Cross-entropy · ensemble", "Focal"]
    assert "mean ± std over 3 seed(s)" in tab.notes[0] and "ensemble rows pool runs" in tab.notes[0]
    # claims are tested on seeds' runs only: the ensemble is not a seed of CE
    res = {r.claim.key: r for r in check_claims(groups, CLAIMS)}
    assert res["mukhoti_focal_lt_ce"].seeds == [0, 1, 2]


def test_results_csv_marks_the_predictor_and_reads_back(runs_dir, tmp_path):
    groups = group_runs(load_runs([runs_dir]).runs)
    text = runs_csv(groups, base=runs_dir)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["loss"], r["predictor"], r["seed"]) for r in rows] == [
        ("ce", "run", "0"), ("ce", "run", "1"), ("ce", "run", "2"), ("ce", "ensemble", ""),
        ("focal", "run", "0"), ("focal", "run", "1"), ("focal", "run", "2")]
    again = group_runs(runs_from_results_csv(text))
    assert [(g.predictor, len(g.runs)) for g in again] == [("run", 3), ("ensemble", 1), ("run", 3)]
    assert again[0].mean["test.pre.ece"] == pytest.approx(0.2, abs=1e-12)
    front = front_table(text)
    assert "| Cross-entropy | 20.00 ± 10.00 |" in front
    assert "| Cross-entropy · ensemble | 45.00 |" in front and "over 3 seed(s)" in front
    out = build_report([runs_dir], tmp_path / "rep", figures=False)
    doc = json.loads(out.results_json.read_text())
    assert [(g["predictor"], g["n_runs"]) for g in doc["groups"]] == [
        ("run", 3), ("ensemble", 1), ("run", 3)]
    assert "over 4 seed(s)" not in out.report_md.read_text()


def test_a_run_without_a_seed_is_refused_not_averaged(runs_dir):
    write_results(runs_dir / "ce" / "stray", fake_results("ce", None, 0.45, 0.05, 3.0))
    loaded = load_runs([runs_dir])
    (path, msg), = loaded.errors
    assert path.endswith("stray/results.json")
    assert "meta.seed is null: a seed's run (meta.predictor 'run', the default)" in msg
    (ce, *_rest) = group_runs(loaded.runs)
    assert ce.seeds == [0, 1, 2] and ce.mean["test.pre.ece"] == pytest.approx(0.2, abs=1e-12)


def test_unknown_predictor_is_named():
    assert list(PREDICTORS) == ["run", "ensemble", "mc_dropout"]
    assert predictor_of({}) == "run"
    with pytest.raises(ResultsFileError, match="meta.predictor to be one of run, ensemble"):
        predictor_of({"predictor": "bagging"})


def test_unknown_predictor_in_a_file_is_a_skipped_file(runs_dir):
    bad = fake_results("ce", 5, 0.1, 0.02, 2.0)
    bad["meta"]["predictor"] = "bagging"
    write_results(runs_dir / "ce" / "seed5", bad)
    (path, msg), = load_runs([runs_dir]).errors
    assert path.endswith("seed5/results.json") and "got 'bagging'" in msg
