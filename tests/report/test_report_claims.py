"""The papers' claims section (torchcal.report.claims) and the README's front table
(torchcal.report.front): verdicts computed from run results, and the README kept equal to the
committed results.csv."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from torchcal.experiments.claims import CLAIMS
from torchcal.report.aggregate import RunRecord, group_runs, runs_from_results_csv
from torchcal.report.claims import (
    CHANCE_MARGIN,
    GAP_KEY,
    SIMILAR_ERROR,
    at_chance,
    check_claims,
    claims_markdown,
    claims_verdicts,
    confidence_gap,
)
from torchcal.report.front import BEGIN, END, front_table, replace_front_table

ROOT = Path(__file__).resolve().parents[2]


def _run(loss, seed, ece, err=0.06, t=1.0, adaece=None, gap=0.0, dataset="mnist1d"):
    flat = {"test.pre.ece": ece, "test.pre.adaptive_ece": ece if adaece is None else adaece,
            "test.pre.error": err, "temperature.grid_ece": t, GAP_KEY: gap}
    meta = {"dataset": dataset, "model": "m", "loss": loss, "seed": seed, "loss_kwargs": {}}
    return RunRecord(Path(f"/r/{loss}/{seed}"), Path(f"/r/{loss}/{seed}/results.json"), {}, meta,
                     flat)


def _verdicts(runs):
    return {r.claim.key: r for r in check_claims(group_runs(runs), CLAIMS)}


def test_confidence_gap_against_torch():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(500, 7, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 7, (500,), generator=g)
    p = torch.softmax(z, 1)
    want = (p.max(1).values.mean() - (p.argmax(1) == y).double().mean()).item()
    assert confidence_gap(z.numpy(), y.numpy()) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="`logits`"):
        confidence_gap(np.zeros((3,)), np.zeros(3))


def test_verdicts_are_counted_per_seed():
    runs = []
    for s in range(3):
        runs += [_run("ce", s, 0.05, t=(2.0, 0.9, 1.5)[s], gap=0.03),
                 # focal: lower ECE on seeds 0, 1; seed 2 has a worse error beyond the margin
                 _run("focal", s, 0.02, err=0.06 + (0, 0.01, 0.05)[s], adaece=0.03),
                 _run("flsd53", s, 0.06, adaece=0.02),  # never below CE
                 _run("adafocal", s, 0.01, adaece=(0.01, 0.025, 0.01)[s]),
                 _run("bsce", s, 0.03), _run("bsce_gra", s, (0.02, 0.04, 0.02)[s])]
    v = _verdicts(runs)
    assert (v["mukhoti_ce_overconfident"].k, v["mukhoti_ce_overconfident"].n) == (2, 3)
    assert v["mukhoti_ce_overconfident"].verdict == "holds on 2 of 3 seeds"
    assert v["mukhoti_focal_lt_ce"].holds == [True, True, False]  # 5 points > SIMILAR_ERROR
    assert SIMILAR_ERROR < 5
    assert v["mukhoti_flsd53_lt_ce"].verdict == "fails on every seed (holds on 0 of 3)"
    assert not v["mukhoti_flsd53_lt_ce"].passed
    assert v["ghosh_adafocal_lowest"].holds == [True, False, True]  # 0.025 > FLSD-53's 0.02
    assert v["lin_bsce_gra"].holds == [True, False, True]
    assert v["tao_dual_focal"].n == 0 and v["tao_dual_focal"].verdict.startswith("not tested")
    assert "Dual focal" in v["tao_dual_focal"].verdict


def test_a_seed_whose_model_is_at_chance_is_not_evaluated():
    """Issue 33: a claim evaluated on a model at chance said "holds on 1 of 1"; a run at chance
    (10 classes, 12% accuracy) takes its seed out of every claim that needs it."""
    runs = []
    for s in range(2):
        runs += [_run("ce", s, 0.05, t=2.0, gap=0.03, err=(0.88, 0.10)[s]), _run("focal", s, 0.02,
                                                                      err=(0.88, 0.10)[s]),
                 _run("dual_focal", s, 0.01, err=0.10)]
    for r in runs:
        r.results["num_classes"] = 10
    v = _verdicts(runs)
    assert v["mukhoti_ce_overconfident"].at_chance == [0]
    assert v["mukhoti_ce_overconfident"].verdict == (
        "holds on 1 of 1 seed (1 seed not evaluated (model at chance))")
    assert v["tao_dual_focal"].verdict.startswith("holds on 1 of 1 seed")  # focal seed 0
    for r in runs:  # both seeds at chance
        r.flat["test.pre.error"] = 0.88
    v = _verdicts(runs)
    assert v["mukhoti_focal_lt_ce"].n == 0
    assert v["mukhoti_focal_lt_ce"].verdict == "not evaluated (model at chance)"
    assert claims_verdicts(group_runs(runs), CLAIMS)[1].endswith(": not evaluated (model at chance)")
    # the class count unknown (the committed results.csv): evaluated as before
    for r in runs:
        del r.results["num_classes"]
    assert _verdicts(runs)["mukhoti_focal_lt_ce"].n == 2
    assert at_chance(0.149, 10) and not at_chance(0.151, 10) and CHANCE_MARGIN == 0.05


def test_only_common_seeds_count_and_nan_fails():
    runs = [_run("focal", 0, 0.02), _run("focal", 1, 0.02), _run("dual_focal", 1, 0.01),
            _run("dual_focal", 2, 0.01), _run("ce", 0, math.nan), _run("focal", 5, 0.02)]
    v = _verdicts(runs)
    assert v["tao_dual_focal"].seeds == [1] and v["tao_dual_focal"].passed
    assert v["mukhoti_focal_lt_ce"].holds == [False]  # CE's ECE undefined: not a pass


def test_section_shows_numbers_verdicts_and_direction():
    runs = [_run("ce", s, 0.05, t=2.5, gap=0.04) for s in (0, 1)]
    runs += [_run("focal", 0, 0.01, t=0.8, gap=-0.02), _run("focal", 1, 0.01, t=0.9, gap=0.01)]
    runs += [_run("dual_focal", s, 0.02) for s in (0, 1)]
    md = claims_markdown(group_runs(runs), CLAIMS)
    assert md.startswith("## The papers' claims on this benchmark")
    for c in CLAIMS:
        assert c.source.split(",")[0] in md
    assert "**Verdict: holds on 2 of 2 seeds.**" in md  # CE over-confident, focal < CE
    assert "**Verdict: fails on every seed (holds on 0 of 2).**" in md  # dual focal vs focal
    assert "| 0 | 5.00 | 1.00 |" in md  # per-seed ECE numbers of the focal claim
    assert "| Focal (γ=3) |" not in md  # the runs carry no loss_kwargs: label without γ
    assert "| Focal | 1.00 ± 0.00 | 0.85 ± 0.07 | -0.50 ± 2.12 | 1 of 2 seeds |" in md
    assert "| Cross-entropy | 5.00 ± 0.00 | 2.50 ± 0.00 | 4.00 ± 0.00 | 2 of 2 seeds |" in md
    assert claims_markdown(group_runs([_run("ls", 0, 0.1)]), CLAIMS) == ""  # nothing testable


def test_front_table_from_a_results_csv():
    rows = ["loss,loss_kwargs,seed,test.pre.ece,test.post.grid_ece.ece,temperature.grid_ece,"
            "test.pre.adaptive_ece,test.pre.conf_minus_acc,test.pre.error",
            'focal,"{""gamma"": 3.0}",0,0.01,0.02,0.9,0.011,-0.01,0.07',
            "ce,{},0,0.04,0.01,2.5,0.04,0.03,0.06", "ce,{},1,0.05,0.02,2.7,0.05,0.04,0.05"]
    t = front_table("\n".join(rows) + "\n").splitlines()
    assert t[0].startswith("| Loss | ECE pre T | ECE post T (T) | AdaECE pre T | conf − acc |")
    assert t[2] == "| Cross-entropy | 4.50 ± 0.71 | 1.50 ± 0.71 (2.60) | 4.50 ± 0.71 | 3.50 ± 0.71 | 5.50 ± 0.71 |"
    # post T worse than pre T: marked, and the legend says what the mark means
    assert t[3] == "| Focal (γ=3) | 1.00 | 2.00 (0.90) † | 1.10 | -1.00 | 7.00 |"
    assert "Mean ± std over 1/2 seed(s)" in t[5] and "†: worse after the post-hoc step" in t[5]
    with pytest.raises(ValueError, match="results.csv"):
        front_table("a,b\n1,2\n")
    readme = f"x\n{BEGIN.format(csv='d/r.csv')}\nold\n{END}\ny\n"
    new = replace_front_table(readme, "d/r.csv", "\n".join(rows) + "\n")
    assert new.startswith("x\n") and new.endswith(f"{END}\ny\n") and "old" not in new
    assert replace_front_table(new, "d/r.csv", "\n".join(rows) + "\n") == new
    with pytest.raises(ValueError, match="one"):
        replace_front_table(readme, "other.csv", "")


def test_readme_front_table_equals_the_committed_results_csv():
    """The README's front table is generated from the committed demo results.csv: regenerate
    with `torchcal readme README.md <csv>` after a new run."""
    for doc in (ROOT / "README.md", ROOT / "docs" / "snippets" / "demo_table.md"):
        text = doc.read_text(encoding="utf-8")
        start = text.index("<!-- front-table: generated from ")
        csv_rel = text[start:].split("generated from ", 1)[1].split(" by ", 1)[0]
        csv_text = (doc.parent / csv_rel).read_text(encoding="utf-8")
        assert replace_front_table(text, csv_rel, csv_text) == text, doc
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # and the figures the README embeds from that run are committed next to it
    for line in readme.splitlines():
        if line.startswith("![") and "docs/results/" in line:
            assert (ROOT / line.split("](", 1)[1].rstrip(")")).is_file(), line


def test_tiny_mnist1d_demo_has_the_claims_section(tmp_path):
    """A few epochs of the default MNIST-1D demo on a small generated set: the report holds the
    claims section with verdicts computed from these runs (whatever they are)."""
    from torchcal.experiments import DemoConfig, get_benchmark, run_demo
    from torchcal.experiments.calibration import CLAIM_LOSSES

    cfg = DemoConfig(
        out=tmp_path / "demo", seeds=(0, 1), epochs=1, workers=1, progress=False, figures=False,
        data_kwargs={"n_train": 60, "n_val": 40, "n_test": 50},
        overrides={"data_root": str(tmp_path / "data"), "model_kwargs": {"width": 4},
                   "ood_kwargs": {"mnist1d_shuffled": {"n": 30}}})
    res = run_demo(cfg)
    assert res.failed == []
    md = res.report.report_md.read_text(encoding="utf-8")
    assert "validate_args" not in md and "already finished" not in md
    # the shortened run quotes the --full verdicts in a block of their own, labelled, at the
    # head of the claims section (they were in the shortened-schedule paragraph of the intro)
    claims_at = md.index("## The papers' claims on this benchmark")
    assert md.index("> **The committed full run's verdicts, not this run's:**") > claims_at
    assert "The committed full run" not in md.split("## This run", 1)[1]
    assert claims_at < md.index("## This run") < md.index("## mnist1d / mnist1d_cnn")
    assert res.report.verdict_label == "shortened schedule, 1 of 350 epochs"
    assert res.report.verdicts == claims_verdicts(res.report.groups,
                                                  get_benchmark("mnist1d").claims)
    assert res.report.verdicts[1] == ("Mukhoti et al. 2020, focal below cross-entropy: "
                                      + check_claims(res.report.groups, CLAIMS)[1].verdict)
    # the same command again: every run is skipped and the report says its time is not the demo's
    again = run_demo(cfg).report.report_md.read_text(encoding="utf-8")
    assert f"{2 * len(CLAIM_LOSSES)} of {2 * len(CLAIM_LOSSES)} runs were already finished" in again
    assert "MNIST-1D" in md and "Shortened schedule" in md and "AdaFocal uses the paper's λ=1" in md
    assert "60 / 40 / 50 train/validation/test signals" in md  # the sizes actually used
    section = md.split("## The papers' claims on this benchmark", 1)[1]
    groups = res.report.groups
    assert {g.loss for g in groups} == set(CLAIM_LOSSES)
    for r in check_claims(groups, CLAIMS):
        assert r.n + len(r.at_chance) == 2  # a 1-epoch model of width 4 may be at chance
        assert f"**Verdict (shortened schedule, 1 of 350 epochs): {r.verdict}.**" in section
    csv_text = res.report.results_csv.read_text(encoding="utf-8")
    assert GAP_KEY in csv_text.splitlines()[0]
    front = front_table(csv_text)  # a row per loss, and one per loss's ensemble of the 2 seeds
    assert front.count("\n| ") == 2 * len(CLAIM_LOSSES) and front.count(" · ensemble |") == len(CLAIM_LOSSES)
    html = res.report.report_html.read_text(encoding="utf-8")
    assert "<table>" in html
    # each per-seed table named by its claim (Mukhoti's three were all "Mukhoti et al. 2020,
    # per seed"); a 1-epoch model at chance has none
    titles = re.findall(r"<h3>([^<]*per seed[^<]*)</h3>", html)
    assert len(titles) == len(set(titles)) == sum(
        bool(r.n) for r in check_claims(groups, get_benchmark("mnist1d").claims))
    # a table of contents, then the claims as the first section
    assert re.search(r'<nav class="toc">.*?</nav>\s*<div class="md"><a id="s1"></a><h2>The papers', html, re.S)
    doc = json.loads(res.report.results_json.read_text(encoding="utf-8"))
    assert all(GAP_KEY in g["mean"] for g in doc["groups"])


def test_full_schedule_verdicts_quoted_by_the_demo_are_the_committed_runs():
    """The shortened demo quotes the --full run's verdicts, computed from the committed
    results.csv (no constants to regenerate after a new --full run)."""
    from torchcal.experiments import get_benchmark
    from torchcal.experiments.benchmark import committed_note, committed_verdicts
    from torchcal.report.aggregate import group_runs, runs_from_results_csv

    bench = get_benchmark("mnist1d")
    csv_text = (ROOT / bench.committed_results).read_text(encoding="utf-8")
    results = check_claims(group_runs(runs_from_results_csv(csv_text)), bench.claims)
    got = {r.claim.key: (r.k, r.n) for r in results if r.n}
    verdicts = committed_verdicts(bench)
    assert {k: (v[1], v[2]) for k, v in verdicts.items()} == got
    assert set(bench.verdict_labels) == {c.key for c in bench.claims}
    # every per-seed claim (Mukhoti's OOD claim included) is tested on the committed run; the
    # ensemble claims only once the run is regenerated with its ensemble rows
    seed_claims = {c.key for c in bench.claims if c.per == "seed"}
    assert set(verdicts) >= seed_claims and "mukhoti_ood_entropy" in verdicts
    untested = {r.claim.key: r.verdict for r in results if not r.n}
    assert set(untested) <= {c.key for c in bench.claims if c.per == "seed_set"}
    assert all(n == 5 for k, (_k, n) in got.items() if k in seed_claims)  # --full: 5 seeds
    text = committed_note(bench)
    assert text.startswith("**The committed full run's verdicts, not this run's:**")
    for label, k, n in verdicts.values():
        assert f"{label} {k} of {n}" in text, label


def test_readme_claim_lines_equal_the_committed_run():
    """Each claim line of the README states the verdict computed from the committed results.csv."""
    from torchcal.experiments import get_benchmark
    from torchcal.experiments.benchmark import committed_verdicts

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bench = get_benchmark("mnist1d")
    csv_text = (ROOT / bench.committed_results).read_text(encoding="utf-8")
    units = {r.claim.key: r.unit
             for r in check_claims(group_runs(runs_from_results_csv(csv_text)), bench.claims)}
    for key, (label, k, n) in committed_verdicts(bench).items():
        line = next(line for line in readme.splitlines() if line.startswith("- ") and label in line)
        unit = units[key]  # seed, seed set, or seed subset (ensembles of 3 of the seeds)
        assert f"holds on {k} of {n} {unit}{'s' if n > 1 else ''}" in line, (key, line)
