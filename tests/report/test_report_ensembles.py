"""Ensembles in the demo's report (issue 34): `torchcal.ensemble.evaluate_ensemble` against a
float64 NumPy computation, the ensemble claims and Mukhoti et al.'s OOD claim on hand-made
numbers (each rule flipped at its boundary), and a 2-seed demo whose results.csv and report
carry each loss's ensemble."""

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from torchcal.ensemble import CALIBRATE_THEN_POOL, CALIBRATE_THEN_POOL_NLL, evaluate_ensemble
from torchcal.experiments.claims import ENSEMBLE_CLAIMS, mukhoti_ood_claim
from torchcal.logits_file import load_logits, save_logits
from torchcal.report.aggregate import RunRecord, group_runs, load_runs, runs_from_results_csv
from torchcal.report.claims import (
    CAL_THEN_POOL,
    CAL_THEN_POOL_NLL,
    ECE,
    ERR,
    GAP_KEY,
    NLL,
    POOL_THEN_CAL,
    POOL_THEN_CAL_NLL,
    check_claims,
    claims_markdown,
)
from torchcal.report.tables import ensemble_table, runs_csv
from torchcal.run_dir import RunDir

GRID = np.arange(1, 101) / 10.0


def np_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def np_ece(p, y, n_bins=15):
    """Equal-width ECE from the formula, float64, bins (k/B, (k+1)/B] (the first closed)."""
    conf, acc = p.max(1), (p.argmax(1) == y).astype(np.float64)
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        m = ((conf > lo) if b else (conf >= 0)) & (conf <= hi)
        if m.any():
            total += m.mean() * abs(acc[m].mean() - conf[m].mean())
    return total


def np_grid_ece_min(z, y):
    return min(np_ece(np_softmax(np.asarray(z, np.float64) / t), y) for t in GRID)


def write_member_runs(root, n_members=3, n=300, c=4, seed=0):
    """Member runs with saved val/test/OOD logits (over-confident, each right on its own
    inputs) and the labels."""
    g = torch.Generator().manual_seed(seed)
    labels = {s: torch.randint(0, c, (n,), generator=g) for s in ("val", "test")}
    dirs = []
    for m in range(n_members):
        run = RunDir(root / f"seed{m}")
        for split, y in labels.items():
            right = torch.rand(n, generator=g) < 0.7
            guess = torch.where(right, y, torch.randint(0, c, (n,), generator=g))
            z = torch.randn(n, c, generator=g) + 4.0 * torch.nn.functional.one_hot(guess, c)
            save_logits(run.logits(split), z, y)
        save_logits(run.logits("ood_noise"), torch.randn(50, c, generator=g), torch.full((50,), -1))
        dirs.append(run.path)
    return dirs


def test_evaluate_ensemble_equals_a_numpy_computation(tmp_path):
    dirs = write_member_runs(tmp_path / "runs")
    res = evaluate_ensemble(dirs, tmp_path / "ens", meta={"loss": "ce", "members": [0, 1, 2]})
    val = [load_logits(RunDir(d).logits("val")) for d in dirs]
    test = [load_logits(RunDir(d).logits("test")) for d in dirs]
    yv, yt = val[0][1], test[0][1]
    pv = np.mean([np_softmax(z) for z, _y in val], 0)  # mean of the members' probabilities
    pt = np.mean([np_softmax(z) for z, _y in test], 0)
    # before temperature scaling: the pooled probabilities' NLL, error and ECE
    assert res["test"]["pre"]["nll"] == pytest.approx(-np.log(pt[np.arange(len(yt)), yt]).mean(),
                                                       abs=1e-6)
    assert res["test"]["pre"]["error"] == pytest.approx((pt.argmax(1) != yt).mean(), abs=1e-12)
    assert res["test"]["pre"]["ece"] == pytest.approx(np_ece(pt, yt), abs=1e-6)
    # pool then calibrate: T minimises the grid ECE of the pooled *validation* log-probabilities
    t = res["temperatures"]["grid_ece"]
    assert np_ece(np_softmax(np.log(pv) / t), yv) <= np_grid_ece_min(np.log(pv), yv) + 1e-9
    assert res["test"]["post"]["grid_ece"]["ece"] == pytest.approx(
        np_ece(np_softmax(np.log(pt) / t), yt), abs=1e-6)
    # calibrate then pool: each member's own grid-ECE T on its validation logits, then pooled
    temps = res["meta"]["member_temperatures"]
    for (z, y), tm in zip(val, temps, strict=True):
        assert np_ece(np_softmax(z / tm), y) <= np_grid_ece_min(z, y) + 1e-9
    pc = np.mean([np_softmax(z / tm) for (z, _y), tm in zip(test, temps, strict=True)], 0)
    post = res["test"]["post"][CALIBRATE_THEN_POOL]
    assert post["nll"] == pytest.approx(-np.log(pc[np.arange(len(yt)), yt]).mean(), abs=1e-6)
    assert post["ece"] == pytest.approx(np_ece(pc, yt), abs=1e-6)
    assert res["temperatures"][CALIBRATE_THEN_POOL] == pytest.approx(np.mean(temps), abs=1e-12)
    # issue 41: calibrate then pool with each member's NLL-fitted T (the ensemble papers' fit):
    # T minimises the member's validation NLL (no point of a fine grid around it is lower)
    temps_nll = res["meta"]["member_temperatures_nll"]
    for (z, y), tm in zip(val, temps_nll, strict=True):
        def nll_at(t, z=z, y=y):
            return -np.log(np_softmax(z / t)[np.arange(len(y)), y]).mean()
        assert nll_at(tm) <= min(nll_at(t) for t in tm * np.linspace(0.95, 1.05, 41)) + 1e-7
    pn = np.mean([np_softmax(z / tm) for (z, _y), tm in zip(test, temps_nll, strict=True)], 0)
    post = res["test"]["post"][CALIBRATE_THEN_POOL_NLL]
    assert post["nll"] == pytest.approx(-np.log(pn[np.arange(len(yt)), yt]).mean(), abs=1e-6)
    assert post["ece"] == pytest.approx(np_ece(pn, yt), abs=1e-6)
    assert res["temperatures"][CALIBRATE_THEN_POOL_NLL] == pytest.approx(np.mean(temps_nll))
    assert res["meta"]["predictor"] == "ensemble" and res["meta"]["seed"] is None
    # written as a run: the report reads it as the ensemble's own row, with its members
    rec, = load_runs([tmp_path / "ens"]).runs
    assert rec.predictor == "ensemble" and rec.meta["members"] == [0, 1, 2]
    z_saved, _y = load_logits(RunDir(tmp_path / "ens").logits("test"))
    np.testing.assert_allclose(np_softmax(z_saved), pt, atol=1e-6)
    assert set(res["ood"]) == {"noise"}


def test_evaluate_ensemble_refuses_runs_of_other_samples(tmp_path):
    a = write_member_runs(tmp_path / "a", n_members=1, seed=0)
    b = write_member_runs(tmp_path / "b", n_members=1, seed=1)
    with pytest.raises(ValueError, match="same 'val' samples"):
        evaluate_ensemble(a + b)


# --------------------------------------------------------------------------------------------
# the claims on hand-made numbers
# --------------------------------------------------------------------------------------------
def record(loss, seed, flat, predictor="run", members=None):
    meta = {"dataset": "d", "model": "m", "loss": loss, "loss_kwargs": {}, "seed": seed,
            "predictor": predictor}
    if members is not None:
        meta["members"] = members
    return RunRecord(Path(f"/r/{loss}/{seed}"), Path(f"/r/{loss}/{seed}/results.json"), {},
                     meta, dict(flat))


def claim_result(key, records):
    claims = {c.key: c for c in ENSEMBLE_CLAIMS}
    claims["mukhoti_ood_entropy"] = mukhoti_ood_claim("svhn")
    res, = check_claims(group_runs(records), [claims[key]])
    return res


def lakshminarayanan(ens_nll=0.50, ens_err=0.10):
    runs = [record("ce", s, {NLL: nll, ERR: err})
            for s, nll, err in ((0, 0.6, 0.12), (1, 0.7, 0.14), (2, 0.01, 0.01))]
    # the ensemble pools seeds 0 and 1 only: its members' mean is NLL 0.65, error 13%
    return runs + [record("ce", None, {NLL: ens_nll, ERR: ens_err}, "ensemble", [0, 1])]


def test_lakshminarayanan_claim_compares_the_ensemble_with_its_best_member():
    res = claim_result("lakshminarayanan_ensemble", lakshminarayanan())
    assert res.seeds == ["0, 1"] and res.holds == [True]
    assert res.verdict == "holds on 1 of 1 seed set (one set of seeds: one observation)"
    assert res.numbers[0]["ce"]["members." + NLL] == pytest.approx(0.65)  # seed 2 not a member
    assert res.numbers[0]["ce"]["members_min." + NLL] == pytest.approx(0.6)
    assert res.numbers[0]["ce"]["members." + ERR] == pytest.approx(0.13)
    # issue 41: an NLL below the members' mean (0.65) is Jensen's inequality, true of every
    # ensemble; above the best member's (0.6) the claim fails, as with an error equal to the
    # members' mean (13%)
    assert claim_result("lakshminarayanan_ensemble", lakshminarayanan(ens_nll=0.62)).holds == [False]
    assert claim_result("lakshminarayanan_ensemble", lakshminarayanan(ens_nll=0.66)).holds == [False]
    assert claim_result("lakshminarayanan_ensemble", lakshminarayanan(ens_err=0.13)).holds == [False]
    assert "fails on every seed set" in claim_result(
        "lakshminarayanan_ensemble", lakshminarayanan(ens_err=0.13)).verdict


def repair(loss, gap=-0.02, ece=0.03, ptc=0.01, ctp=0.015, members_gap=0.01):
    """A loss's runs (seeds 0-2, conf − acc ``members_gap``) and their ensemble: conf − acc
    ``gap``, ECE ``ece``, pool-then-calibrate ``ptc`` and calibrate-then-pool ``ctp`` (NLL
    temperatures; the grid-ECE ones are set to the opposite verdict, which must not count)."""
    runs = [record(loss, s, {GAP_KEY: members_gap, ECE: 0.02}) for s in (0, 1, 2)]
    return runs + [record(loss, None, {GAP_KEY: gap, ECE: ece, POOL_THEN_CAL_NLL: ptc,
                                       CAL_THEN_POOL_NLL: ctp, POOL_THEN_CAL: ctp,
                                       CAL_THEN_POOL: ptc}, "ensemble", [0, 1, 2])]


@pytest.mark.parametrize("key,losses", [("rahaman_wen_calibrated_members", ("focal", "flsd53")),
                                        ("wen_label_smoothing", ("ls",))])
def test_underconfident_ensemble_repaired_by_pool_then_calibrate(key, losses):
    def result(ce_gap=-0.005, **bad):
        recs = repair("ce", gap=ce_gap, members_gap=0.02)
        for i, x in enumerate(losses):
            recs += repair(x, **(bad if i == len(losses) - 1 else {}))  # spoil the last loss
        return claim_result(key, recs)

    assert result().holds == [True]
    assert result().seeds == ["0, 1, 2"]
    assert result(gap=0.0).holds == [False]  # not under-confident (conf − acc = 0)
    assert result(members_gap=-0.02).holds == [False]  # no more under-confident than members
    assert result(ce_gap=-0.02).holds == [False]  # no more under-confident than CE's ensemble
    assert result(ptc=0.03).holds == [False]  # pool-then-calibrate does not lower the ECE
    assert result(ctp=0.009).holds == [False]  # calibrating members first does better
    assert result(ctp=0.01).holds == [False]  # a tie: pool-then-calibrate does not beat it
    # no calibrate-then-pool number (results written before it was measured): not evaluated,
    # not a failure
    res = result(ctp=math.nan)
    assert res.n == 0 and list(res.lacking) == ["0, 1, 2"]
    assert res.verdict.startswith("not evaluated (the results lack ") and "calibrate_then_pool_nll" in res.verdict


def test_ensemble_claims_need_two_seeds_and_an_ensemble():
    one = [record("ce", 0, {NLL: 0.6, ERR: 0.1})]
    res = claim_result("lakshminarayanan_ensemble", one)
    assert res.n == 0 and res.verdict == "not evaluated (needs 2 or more seeds)"
    two = one + [record("ce", 1, {NLL: 0.6, ERR: 0.1})]  # 2 seeds, but no ensemble record
    assert claim_result("lakshminarayanan_ensemble", two).verdict.startswith("not tested")
    assert claim_result("wen_label_smoothing", two).verdict == "not tested (no run of Label smoothing)"
    md = claims_markdown(group_runs(one), list(ENSEMBLE_CLAIMS) + [mukhoti_ood_claim("svhn")])
    assert md == ""  # nothing testable: no section
    md = claims_markdown(group_runs(lakshminarayanan()), ENSEMBLE_CLAIMS)
    assert "Verdict: not evaluated" not in md and "Verdict: holds on 1 of 1 seed set" in md
    assert "per seed set: CE ensemble below its best member (d / m)" in md
    assert "| Seeds pooled |" in md


def test_mukhoti_ood_claim_seed_by_seed():
    key = "ood.svhn.auroc_entropy"
    aurocs = {0: (0.60, 0.70, 0.65), 1: (0.70, 0.72, 0.69), 2: (0.70, 0.70, 0.71)}
    recs = [record(loss, s, {key: a[i]}) for s, a in aurocs.items()
            for i, loss in enumerate(("ce", "focal", "flsd53"))]
    res = claim_result("mukhoti_ood_entropy", recs)
    # seed 0: both above CE; seed 1: FLSD-53 below; seed 2: focal equal to CE (not higher)
    assert res.seeds == [0, 1, 2] and res.holds == [True, False, False]
    assert res.verdict == "holds on 1 of 3 seeds"


def test_seed_sets_read_back_from_results_csv():
    groups = group_runs(lakshminarayanan())
    text = runs_csv(groups)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["members"] for r in rows if r["predictor"] == "ensemble"] == ["0 1"]
    again = group_runs(runs_from_results_csv(text))
    a, = check_claims(again, ENSEMBLE_CLAIMS[:1])
    b, = check_claims(groups, ENSEMBLE_CLAIMS[:1])
    assert (a.seeds, a.holds) == (b.seeds, b.holds) == (["0, 1"], [True])
    with pytest.raises(ValueError, match="members"):
        runs_from_results_csv(text.replace(",0 1,", ",0 x,"))
    from torchcal.report.front import front_table
    assert "ensemble rows: the mean of the probabilities" in front_table(text)
    assert "ensemble rows" not in front_table(runs_csv(groups[:1]))


def test_ensemble_table_rows():
    recs = lakshminarayanan()
    recs[-1].flat.update({"test.post.grid_ece.nll": 0.45, "temperature.grid_ece": 1.3,
                          "test.post.calibrate_then_pool.nll": 0.47,
                          "temperature.calibrate_then_pool": 1.5})
    tab = ensemble_table(group_runs(recs))
    rows = [[c.text for c in r] for r in tab.rows]
    nll = tab.header.index("NLL")
    # results written before the NLL fits were measured: their rows are left out
    assert [r[2] for r in rows] == ["members (mean ± std)", "ensemble, no T",
                                    "pool then calibrate (grid-ECE T)",
                                    "calibrate then pool (grid-ECE T)"]
    assert [r[nll] for r in rows] == ["0.650 ± 0.071", "0.500", "0.450", "0.470"]
    assert [r[-1] for r in rows[1:]] == ["–", "1.30", "1.50"] and rows[0][1] == "0, 1"
    recs[-1].flat.update({"test.post.nll.nll": 0.44, "temperature.nll": 1.25,
                          "test.post.calibrate_then_pool_nll.nll": 0.46,
                          "temperature.calibrate_then_pool_nll": 1.4})
    rows = [[c.text for c in r] for r in ensemble_table(group_runs(recs)).rows]
    assert [(r[2], r[nll], r[-1]) for r in rows[2:4]] == [
        ("pool then calibrate (NLL T)", "0.440", "1.25"),
        ("calibrate then pool (NLL T)", "0.460", "1.40")]
    assert "validation split" in tab.notes[0] and "test split" in tab.notes[0]
    assert ensemble_table(group_runs(recs[:3])) is None


# --------------------------------------------------------------------------------------------
# a demo with 2 seeds
# --------------------------------------------------------------------------------------------
def test_two_seed_demo_reports_each_loss_ensemble(tmp_path):
    from torchcal.experiments import DemoConfig, run_demo

    losses = ("ce", "ls", "focal", "flsd53")
    cfg = DemoConfig(
        out=tmp_path / "demo", seeds=(0, 1), epochs=3, workers=1, progress=False, figures=False,
        losses=losses, data_kwargs={"n_train": 60, "n_val": 40, "n_test": 50},
        overrides={"data_root": str(tmp_path / "data"), "model_kwargs": {"width": 4},
                   "ood_kwargs": {"mnist1d_shuffled": {"n": 30}}})
    with pytest.warns(RuntimeWarning):  # 3 epochs on 60 signals: temperatures at the grid's edge
        res = run_demo(cfg)
    assert res.failed == []
    rows = list(csv.DictReader(io.StringIO(res.report.results_csv.read_text(encoding="utf-8"))))
    ens = [r for r in rows if r["predictor"] == "ensemble"]
    assert [r["loss"] for r in ens] == list(losses) and {r["members"] for r in ens} == {"0 1"}
    assert all(r["seed"] == "" and r["test.post.calibrate_then_pool.ece"] for r in ens)
    assert sum(r["predictor"] == "run" for r in rows) == 2 * len(losses)
    doc = json.loads(res.report.results_json.read_text(encoding="utf-8"))
    ce_runs = next(g for g in doc["groups"] if g["loss"] == "ce" and g["predictor"] == "run")
    assert ce_runs["n_runs"] == 2  # the ensemble is never averaged in as a third seed
    md = res.report.report_md.read_text(encoding="utf-8")
    assert "### Ensembles: mnist1d / mnist1d_cnn" in md
    assert "| Cross-entropy · ensemble |" in md
    assert "| Cross-entropy | 0, 1 | pool then calibrate (NLL T) |" in md
    assert "**Ensembles:** per loss, the mean of the probabilities of its seeds 0, 1" in md
    assert "fitted on the validation split" in md and "on the test split" in md
    results = {r.claim.key: r for r in check_claims(res.report.groups, cfg_claims())}
    for key in ("lakshminarayanan_ensemble", "rahaman_wen_calibrated_members",
                "wen_label_smoothing"):
        # a 3-epoch model of width 4 may be at chance: its seed set is then not evaluated
        assert results[key].seeds + results[key].at_chance == ["0, 1"], key
        assert results[key].verdict.endswith("(one set of seeds: one observation)") or (
            results[key].verdict == "not evaluated (model at chance)")
        assert f"**Verdict (shortened schedule, 3 of 350 epochs): {results[key].verdict}.**" in md
    ood = results["mukhoti_ood_entropy"]
    assert ood.n + len(ood.at_chance) == 2  # a 3-epoch model of width 4 may be at chance
    assert "mnist1d_shuffled` better than cross-entropy" in md


def cfg_claims():
    from torchcal.experiments import get_benchmark

    return get_benchmark("mnist1d").claims


def test_seed_ensembles_add_every_subset_of_3_for_the_claims_losses(tmp_path):
    """Issue 41: with more than 3 seeds, the losses the ensemble claims compare get the
    ensemble of every 3 of their seeds besides the ensemble of all; the report's tables keep
    the ensemble of all, the claims count the subsets, results.csv holds them all."""
    from torchcal.experiments.demo import seed_ensembles
    from torchcal.train import TrainConfig

    specs = []
    for loss in ("ce", "focal"):
        for d, seed in zip(write_member_runs(tmp_path / loss, n_members=4, seed=7), range(4),
                           strict=True):
            (d / "config.json").write_text(json.dumps(
                {"dataset": "d", "model": "m", "loss": loss, "loss_kwargs": {}, "seed": seed,
                 "epochs": 1}), encoding="utf-8")
            RunDir(d).results().write_text("{}", encoding="utf-8")
            specs.append(TrainConfig(dataset="d", model="m", loss=loss, seed=seed, epochs=1,
                                     out_dir=str(d)))
    dirs = seed_ensembles(specs, tmp_path / "out", subset_losses={"ce"})
    names = [d.relative_to(tmp_path / "out").as_posix() for d in dirs]
    assert names == ["ensembles/ce", "ensembles/ce/subsets/0-1-2", "ensembles/ce/subsets/0-1-3",
                     "ensembles/ce/subsets/0-2-3", "ensembles/ce/subsets/1-2-3",
                     "ensembles/focal"]
    recs = load_runs(dirs).runs
    ce, = [g for g in group_runs(recs) if g.loss == "ce"]
    assert [r.meta["members"] for r in ce.runs] == [[0, 1, 2, 3]]
    assert [r.meta["members"] for r in ce.subsets] == [[0, 1, 2], [0, 1, 3], [0, 2, 3], [1, 2, 3]]
    text = runs_csv(group_runs(recs))
    assert [r["members"] for r in csv.DictReader(io.StringIO(text))] == [
        "0 1 2 3", "0 1 2", "0 1 3", "0 2 3", "1 2 3", "0 1 2 3"]
    again, = [g for g in group_runs(runs_from_results_csv(text)) if g.loss == "ce"]
    assert len(again.runs) == 1 and len(again.subsets) == 4
    from torchcal.report.front import front_table  # the README's table: the ensemble of all
    ce_row = next(line for line in front_table(text).splitlines()
                  if line.startswith("| Cross-entropy · ensemble |"))
    ece = f"{100 * ce.runs[0].flat['test.pre.ece']:.2f}"
    assert ce_row.split(" | ")[1] == ece, (ce_row, ece)
    # each run's temperatures are fitted once (with the ensemble of all) and reused by the
    # subsets: the same numbers as fitting them afresh
    sub = ce.subsets[1]  # seeds 0, 1, 3
    fresh = evaluate_ensemble([specs[i].out_dir for i in (0, 1, 3)], meta={"members": [0, 1, 3]})
    assert sub.results["meta"]["member_temperatures_nll"] == fresh["meta"]["member_temperatures_nll"]
    assert sub.results["meta"]["member_temperatures"] == fresh["meta"]["member_temperatures"]
    got, want = (r["test"]["post"][CALIBRATE_THEN_POOL_NLL] for r in (sub.results, fresh))
    def known(d):  # NaN is null in the file
        return {k: v for k, v in d.items() if v is not None and not math.isnan(v)}
    assert known(got) == known(want)
    with pytest.raises(ValueError, match=r"member_temperatures\['nll'\]"):
        evaluate_ensemble([specs[0].out_dir, specs[1].out_dir],
                          member_temperatures={"grid_ece": [1.0, 1.0], "nll": [1.0]})
