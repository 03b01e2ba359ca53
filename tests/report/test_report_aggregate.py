"""`torchcal report` on hand-made result files: grouping, exact mean/std, best marking, bad files."""

import csv
import json
import math

import pytest

from torchcal.errors import ResultsFileError
from torchcal.report.aggregate import flatten_results, group_runs, load_runs, mean_std
from torchcal.report.build import build_report
from torchcal.report.tables import main_table
from torchcal.results_file import SCHEMA, read_results, write_results

KEYS = ("ece", "adaptive_ece", "classwise_ece", "mce", "rmsce", "nll", "brier", "error",
        "topk_error", "s99_share", "s99_accuracy")


def fake_results(loss, seed, ece, post_ece, t, *, error=0.1, dataset="digits", model="mlp",
                 loss_kwargs=None, s99_acc=0.9):
    pre = {k: 0.05 for k in KEYS}
    pre.update(ece=ece, adaptive_ece=ece + 0.01, error=error, nll=2 * ece,
               s99_accuracy=s99_acc)
    post = dict(pre, ece=post_ece, adaptive_ece=post_ece + 0.01, nll=2 * post_ece)
    return {
        "schema": SCHEMA,
        "meta": {"dataset": dataset, "model": model, "loss": loss, "loss_kwargs": loss_kwargs or {},
                 "seed": seed},
        "temperatures": {"grid_ece": t, "grid_adaece": t + 0.1, "grid_nll": t, "nll": t},
        "test": {"pre": pre, "post": {m: post for m in ("grid_ece", "grid_adaece", "grid_nll", "nll")}},
        "val": {"pre": pre},
        "ood": {"noise": {"auroc_entropy": 0.5 + ece, "auroc_max_prob": 0.6, "fpr95_entropy": 0.4,
                          "aupr_entropy": 0.7, "post_auroc_entropy": 0.8}},
        "n": {"val": 100, "test": 300},
        "n_bins": 15,
    }


@pytest.fixture()
def runs_dir(tmp_path):
    root = tmp_path / "runs"
    spec = {
        # loss: [(seed, ece, post_ece, T)]
        "ce": [(0, 0.10, 0.02, 2.0), (1, 0.20, 0.03, 2.5), (2, 0.30, 0.04, 3.0)],
        "focal": [(0, 0.05, 0.01, 1.1), (1, 0.07, 0.05, 1.2), (2, 0.06, 0.03, 1.3)],
    }
    for loss, rows in spec.items():
        for seed, ece, post, t in rows:
            write_results(root / loss / f"seed{seed}", fake_results(
                loss, seed, ece, post, t, loss_kwargs={"gamma": 3.0} if loss == "focal" else {}))
    return root


def test_mean_std_exact():
    m, s, n = mean_std([0.1, 0.2, 0.3])
    assert n == 3 and m == pytest.approx(0.2, abs=1e-15)
    assert s == pytest.approx(math.sqrt(((0.1 - 0.2) ** 2 + 0 + (0.3 - 0.2) ** 2) / 2), abs=1e-15)
    m, s, n = mean_std([0.4])
    assert (m, n) == (0.4, 1) and math.isnan(s)
    m, s, n = mean_std([float("nan")])
    assert n == 0 and math.isnan(m)


def test_flatten_every_number():
    flat = flatten_results(fake_results("ce", 0, 0.1, 0.02, 2.0))
    assert flat["temperature.grid_adaece"] == 2.1
    assert flat["test.post.grid_ece.ece"] == 0.02
    assert flat["ood.noise.post_auroc_entropy"] == 0.8
    assert flat["val.pre.nll"] == 0.2
    assert flat["n.test"] == 300.0
    # 4 temperatures + 11 pre + 4 * 11 post + 11 val + 5 ood + 2 n
    assert len(flat) == 4 + 11 + 44 + 11 + 5 + 2


def test_grouping_mean_std_and_order(runs_dir):
    loaded = load_runs([runs_dir])
    assert loaded.errors == [] and len(loaded.runs) == 6
    groups = group_runs(loaded.runs)
    assert [g.loss for g in groups] == ["ce", "focal"]
    ce, fl = groups
    assert ce.seeds == [0, 1, 2] and fl.label == "Focal (γ=3)"
    assert ce.mean["test.pre.ece"] == pytest.approx(0.2, abs=1e-12)
    assert ce.std["test.pre.ece"] == pytest.approx(0.1, abs=1e-12)
    assert ce.mean["temperature.grid_ece"] == pytest.approx(2.5)
    assert ce.std["temperature.grid_ece"] == pytest.approx(0.5)
    assert fl.mean["test.post.grid_ece.ece"] == pytest.approx(0.03)
    assert fl.std["test.post.grid_ece.ece"] == pytest.approx(0.02)


def test_nan_metrics_ignored_in_mean(tmp_path):
    for seed, acc in ((0, None), (1, 0.8), (2, 0.9)):
        r = fake_results("ce", seed, 0.1, 0.02, 2.0, s99_acc=acc if acc is not None else float("nan"))
        write_results(tmp_path / f"s{seed}", r)
    assert "null" in (tmp_path / "s0" / "results.json").read_text()
    assert math.isnan(read_results(tmp_path / "s0")["test"]["pre"]["s99_accuracy"])
    (g,) = group_runs(load_runs([tmp_path]).runs)
    assert g.mean["test.pre.s99_accuracy"] == pytest.approx(0.85)
    assert g.count["test.pre.s99_accuracy"] == 2


def test_main_table_cells_and_best_marking(runs_dir):
    groups = group_runs(load_runs([runs_dir]).runs)
    tab = main_table(groups)
    assert tab.header[:3] == ["Loss", "ECE pre T", "ECE post T (T)"]
    ce, fl = tab.rows
    assert ce[1].text == "20.00 ± 10.00" and not ce[1].best
    assert fl[1].text == "6.00 ± 1.00" and fl[1].best
    # post T column: equal means (3.00) are within noise -> nothing marked; (T) is the mean
    # grid-ECE temperature
    assert ce[2].text == "3.00 ± 1.00 (2.50)"
    assert fl[2].text == "3.00 ± 2.00 (1.20)"
    assert not ce[2].best and not fl[2].best
    # AdaECE post uses the grid_adaece temperature
    assert ce[4].text.endswith("(2.60)")
    # error: equal everywhere -> a tie, nothing marked
    assert not ce[-1].best and not fl[-1].best
    md = tab.to_markdown()
    assert "| **6.00 ± 1.00** |" in md and "| 20.00 ± 10.00 |" in md


def test_best_within_the_seeds_spread_is_not_bold(tmp_path):
    """Focal's mean ECE (6.00 ± 1.00) is lower than CE's (9.00 ± 3.00) but within CE's spread:
    no bold.  With CE at 20 ± 3 the difference is beyond both spreads: bold.  A single run
    (no spread) is never enough."""
    def table(ce_eces, focal_eces=(0.05, 0.07, 0.06)):
        root = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        for loss, eces in (("ce", ce_eces), ("focal", focal_eces)):
            for seed, e in enumerate(eces):
                write_results(root / loss / f"s{seed}", fake_results(loss, seed, e, 0.02, 1.5))
        return main_table(group_runs(load_runs([root]).runs))

    ce, fl = table((0.06, 0.09, 0.12)).rows
    assert fl[1].text == "6.00 ± 1.00" and ce[1].text == "9.00 ± 3.00"
    assert not fl[1].best and not ce[1].best
    ce, fl = table((0.17, 0.20, 0.23)).rows
    assert fl[1].best and not ce[1].best
    ce, fl = table((0.20,), (0.06,)).rows
    assert not fl[1].best
    tab = table((0.06, 0.09, 0.12))
    assert "**" not in tab.to_markdown() and "beyond the seeds' spread" in tab.to_markdown()


def test_build_report_files_and_bad_file(runs_dir, tmp_path):
    bad = runs_dir / "ce" / "seed9"
    bad.mkdir()
    (bad / "results.json").write_text("{not json")
    worse = runs_dir / "brier" / "seed0"
    worse.mkdir(parents=True)
    (worse / "results.json").write_text(json.dumps({"schema": "other/1"}))
    out = build_report([runs_dir, tmp_path / "missing"], tmp_path / "rep", figures=False)
    paths = [p for p, _ in out.errors]
    assert str((bad / "results.json").resolve()) in paths
    assert str((worse / "results.json").resolve()) in paths
    assert str(tmp_path / "missing") in paths
    msgs = " ".join(m for _, m in out.errors)
    assert "not valid JSON" in msgs and "expected schema" in msgs and "does not exist" in msgs
    md = out.report_md.read_text()
    assert "## Skipped files" in md and "seed9" in md
    assert "**6.00 ± 1.00**" in md and "Temperatures" in md and "OOD detection (noise)" in md
    html = out.report_html.read_text()
    assert "<b>6.00 ± 1.00</b>" in html and "seed9" in html
    doc = json.loads(out.results_json.read_text())
    assert [g["loss"] for g in doc["groups"]] == ["ce", "focal"]
    assert doc["groups"][0]["mean"]["test.pre.ece"] == pytest.approx(0.2)
    assert len(doc["runs"]) == 6 and len(doc["errors"]) == 3
    rows = list(csv.DictReader(out.results_csv.open()))
    assert len(rows) == 6
    assert sorted(float(r["test.pre.ece"]) for r in rows if r["loss"] == "ce") == [0.1, 0.2, 0.3]
    srows = list(csv.DictReader(out.summary_csv.open()))
    assert float(srows[0]["test.pre.ece.std"]) == pytest.approx(0.1)
    assert "20.00 ± 10.00" in out.text


def test_build_report_nothing_readable(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text("[]")
    with pytest.raises(ResultsFileError, match="results.json.*expected a JSON object"):
        build_report([tmp_path], tmp_path / "out", figures=False)


def test_read_results_errors_name_the_file(tmp_path):
    p = tmp_path / "results.json"
    with pytest.raises(ResultsFileError, match="does not exist"):
        read_results(p)
    p.write_text(json.dumps({"schema": SCHEMA, "test": {"pre": {"ece": "high"}}}))
    with pytest.raises(ResultsFileError, match=r"results\.json.*test\.pre\['ece'\]"):
        read_results(p)
    p.write_text(json.dumps({"schema": SCHEMA, "test": {"pre": {}}, "temperatures": {"nll": -1}}))
    with pytest.raises(ResultsFileError, match="positive number"):
        read_results(p)


def test_report_of_reports_skips_report_files(runs_dir, tmp_path):
    """Pointing `report` at a directory holding an earlier report (its results.json is a report
    document, not a run) reports the runs and does not flag the report file."""
    build_report([runs_dir], runs_dir / "old-report", figures=False)
    loaded = load_runs([runs_dir])
    assert loaded.errors == [] and len(loaded.runs) == 6


def test_uncertainty_results_of_a_run_are_not_flagged(runs_dir):
    """`torchcal uncertainty eval` writes RUN_DIR/uncertainty/results.json (another schema): a
    report over run directories skips it silently instead of listing it as a malformed run."""
    d = runs_dir / "ce" / "seed0" / "uncertainty"
    d.mkdir()
    (d / "results.json").write_text(json.dumps(
        {"schema": "torchcal.uncertainty_results/1", "meta": {}}, indent=2))
    loaded = load_runs([runs_dir])
    assert loaded.errors == [] and len(loaded.runs) == 6
    # a genuinely malformed run file is still reported
    (runs_dir / "ce" / "seed1" / "results.json").write_text('{"schema": "x"}')
    loaded = load_runs([runs_dir])
    assert [e[0].endswith("seed1/results.json") for e in loaded.errors] == [True]


def test_figures_problem_is_a_note_not_a_failure(runs_dir, tmp_path):
    """Saved logits that cannot be pooled (different class counts across seeds) cost the figures
    of that data set / model, never the report; runs without logits are noted."""
    import numpy as np

    from torchcal.logits_file import save_logits

    rng = np.random.default_rng(0)
    for seed, c in ((0, 10), (1, 7)):
        save_logits(runs_dir / "ce" / f"seed{seed}" / "logits" / "test.npz",
                    rng.normal(size=(30, c)).astype(np.float32), rng.integers(0, c, 30))
    out = build_report([runs_dir], tmp_path / "rep")
    assert any("figures stopped early" in n for n in out.notes)
    assert "## Notes" in out.report_md.read_text()
    assert len(out.groups) == 2 and out.errors == []


def test_unevaluated_train_run_is_named_and_others_reported(runs_dir, tmp_path):
    """A `torchcal train` run directory (config.json, no results.json) under a searched directory
    is a missing result file: an error naming it, never silently left out of the table."""
    run = runs_dir / "brier" / "seed0"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(
        {"dataset": "digits", "model": "mlp", "loss": "brier", "epochs": 3, "seed": 0}))
    (runs_dir / "notes").mkdir()
    (runs_dir / "notes" / "config.json").write_text('{"unrelated": true}')  # not a run: ignored
    loaded = load_runs([runs_dir])
    assert len(loaded.runs) == 6
    assert [p for p, _ in loaded.errors] == [str((run / "results.json").resolve())]
    assert "does not exist" in loaded.errors[0][1] and "torchcal eval" in loaded.errors[0][1]
    out = build_report([runs_dir], tmp_path / "rep", figures=False)
    assert [g.loss for g in out.groups] == ["ce", "focal"]
    assert "brier/seed0/results.json" in out.report_md.read_text().split("## Skipped files")[1]
    # the run directory itself, not evaluated: the same message
    (err,) = load_runs([run]).errors
    assert err[0] == str((run / "results.json").resolve())
