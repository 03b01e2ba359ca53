"""A run's identity is its configuration, not only its loss and seed (issue 51, item 2): two run
directories with the same loss and seeds but another learning rate are never counted as seeds
of one loss, nor pooled into one ensemble, and the report and the ensembles name them and why."""

import csv
import io
import json
import warnings

import pytest
import torch

from torchcal.ensemble import evaluate_ensemble
from torchcal.evaluate import evaluate_saved_logits
from torchcal.logits_file import save_logits
from torchcal.report.aggregate import group_runs, load_runs, runs_from_results_csv
from torchcal.report.build import build_report
from torchcal.results_file import config_meta, read_results
from torchcal.run_dir import RunDir
from torchcal.train import TrainConfig


def config_identity(config):
    from torchcal.train.config import config_identity  # new with the identity (issue 51)

    return config_identity(config)


def _labels(n=200, c=4):
    g = torch.Generator().manual_seed(0)
    return {s: torch.randint(0, c, (n,), generator=g) for s in ("val", "test")}


def write_run(path, *, lr, seed, identity_in_meta=True, c=4):
    """A focal run directory: config.json of a TrainConfig, saved logits and its results (meta
    as the trainer writes it; ``identity_in_meta=False``: as a torchcal before the field)."""
    cfg = TrainConfig(dataset="digits", model="mlp", loss="focal", lr=lr, seed=seed, epochs=3,
                      out_dir=str(path), recipe="digits")
    run = RunDir(path)
    run.path.mkdir(parents=True)
    run.config.write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
    g = torch.Generator().manual_seed(100 * seed + int(1000 * lr))
    for split, y in _labels(c=c).items():
        right = torch.rand(len(y), generator=g) < 0.7
        guess = torch.where(right, y, torch.randint(0, c, (len(y),), generator=g))
        z = torch.randn(len(y), c, generator=g) + 2.0 * torch.nn.functional.one_hot(guess, c)
        save_logits(run.logits(split), z, y)
    meta = {**config_meta(cfg.to_dict()), "epoch": 3, "checkpoint": "last"}
    if identity_in_meta:
        meta.update(config_identity(cfg))
    evaluate_saved_logits(run.path, meta=meta)
    return run.path


def two_learning_rates(root, identity_in_meta=True):
    """3 focal runs at lr 0.1 (``a/``) and 2 at lr 0.05 (``b/``), seeds 0, 1, 2 and 0, 1."""
    a = [write_run(root / "a" / f"seed{s}", lr=0.1, seed=s, identity_in_meta=identity_in_meta)
         for s in range(3)]
    b = [write_run(root / "b" / f"seed{s}", lr=0.05, seed=s, identity_in_meta=identity_in_meta)
         for s in range(2)]
    return a, b


def test_identity_hash_is_the_training_settings_but_the_seed():
    base = TrainConfig(loss="focal")
    same = [TrainConfig(loss="focal", seed=7), TrainConfig(loss="focal", device="cpu",
            out_dir="elsewhere", recipe="x", n_bins=10, data_root="/d", lr=0.1 + 0.0)]
    other = [TrainConfig(loss="focal", lr=0.05), TrainConfig(loss="focal", epochs=10),
             TrainConfig(loss="focal", loss_kwargs={"gamma": 1.0}), TrainConfig(loss="ce")]
    assert all(c.identity_hash() == base.identity_hash() for c in same)
    assert len({c.identity_hash() for c in [base, *other]}) == 5
    h = base.identity_hash()
    assert len(h) == 12 and set(h) <= set("0123456789abcdef")
    # a config.json's dict gives the same identity (results written before the field)
    assert config_identity(json.loads(json.dumps(base.to_dict())))["identity"] == h
    assert TrainConfig(loss="focal", lr=1).identity_hash() == \
        TrainConfig(loss="focal", lr=1.0).identity_hash()


def test_a_trained_run_records_its_identity(tmp_path):
    from torchcal.train import train

    cfg = TrainConfig(dataset="digits", model="mlp", epochs=1, out_dir=str(tmp_path / "r"),
                      device="cpu", progress=False, num_threads=1, milestones=[])
    train(cfg)
    meta = read_results(tmp_path / "r")["meta"]
    assert meta["identity"] == cfg.identity_hash()
    assert meta["identity_fields"] == json.loads(json.dumps(cfg.identity_values()))


@pytest.mark.parametrize("identity_in_meta", [True, False], ids=["recorded", "from-config"])
def test_report_keeps_another_learning_rate_apart_and_says_why(tmp_path, identity_in_meta):
    """Same loss, same seed pattern, another lr: two groups, not five seeds of one loss (on
    main: one group, b's seeds 0 and 1 skipped as copies of a's); the report's notes and a
    warning name b's runs, their lr and a's."""
    two_learning_rates(tmp_path / "runs", identity_in_meta)
    with pytest.warns(UserWarning, match=r"kept apart .* identity differs in lr"):
        rep = build_report([tmp_path / "runs"], tmp_path / "rep", figures=False,
                           identity_of=config_identity)
    assert rep.errors == []
    focal = [g for g in rep.groups if g.loss == "focal"]
    assert [(g.label, g.seeds) for g in focal] == [("Focal", [0, 1, 2]),
                                                   ("Focal · lr=0.05", [0, 1])]
    note = ("../runs/b/seed0, ../runs/b/seed1 (lr 0.05) kept apart from the 3 runs of Focal at "
            "lr 0.1: identity differs in lr")
    assert note in rep.notes
    md = rep.report_md.read_text(encoding="utf-8")
    assert note in md and "| Focal · lr=0.05 |" in md
    rows = list(csv.DictReader(io.StringIO(rep.results_csv.read_text(encoding="utf-8"))))
    assert {r["identity"] for r in rows} == {g.identity for g in focal}
    # read back from results.csv: still two groups (the identity column)
    again = [g for g in group_runs(runs_from_results_csv(rep.results_csv.read_text("utf-8")))]
    assert sorted(len(g.runs) for g in again) == [2, 3]


def test_report_without_identity_of_old_results_says_so(tmp_path):
    """Results without meta.identity and no way to compute it: grouped as before (one key), and
    a note says their identity is unknown."""
    two_learning_rates(tmp_path / "runs", identity_in_meta=False)
    loaded = load_runs([tmp_path / "runs" / "a"])
    assert all(r.identity is None for r in loaded.runs)
    rep = build_report(runs=loaded, out_dir=tmp_path / "rep", figures=False)
    assert any("record no identity" in n for n in rep.notes), rep.notes


def test_the_report_command_names_the_runs_kept_apart(tmp_path, capsys):
    """``torchcal report`` on results written before the identity (their config.json says the
    lr): b's runs are no seeds of a's loss; the printed warning and report.md say why (on main:
    b's seeds 0 and 1 skipped as "a copied run directory?", nothing about the lr)."""
    from torchcal.cli import main

    two_learning_rates(tmp_path / "runs", identity_in_meta=False)
    with pytest.warns(UserWarning, match=r"runs/b/seed0, \S*runs/b/seed1 \(lr 0\.05\) kept "
                                         r"apart from the 3 runs of Focal at lr 0\.1: identity "
                                         r"differs in lr"):
        code = main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep"),
                     "--no-figures"])
    assert code == 0, capsys.readouterr().err
    md = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    assert "(lr 0.05) kept apart from the 3 runs of Focal at lr 0.1: identity differs in lr" in md
    assert "copied run directory" not in md


def test_seed_ensembles_do_not_pool_another_learning_rate(tmp_path):
    """The demo's ensembles pool one configuration's seeds: b's runs (lr 0.05) are their own
    ensemble, named in a warning with the reason (on main: one ensemble of the 5 runs, its
    members [0, 0, 1, 1, 2])."""
    from torchcal.experiments.demo import seed_ensembles

    a, b = two_learning_rates(tmp_path / "runs", identity_in_meta=False)
    import dataclasses

    from torchcal.train.evaluation import read_config

    specs = [dataclasses.replace(read_config(d), out_dir=str(d)) for ds in (a, b) for d in ds]
    assert [c.seed for c in specs] == [0, 1, 2, 0, 1]
    with pytest.warns(UserWarning) as got:
        dirs = seed_ensembles(specs, tmp_path / "out")
    said = [str(w.message) for w in got if "kept apart" in str(w.message)]
    assert said == [f"{b[0]}, {b[1]} (lr 0.05) kept apart from the 3 runs of "
                    "focal at lr 0.1: identity differs in lr; not pooled into one ensemble"]
    ident_b = TrainConfig(dataset="digits", model="mlp", loss="focal", lr=0.05,
                          epochs=3).identity_hash()
    assert [d.relative_to(tmp_path / "out").as_posix() for d in dirs] == [
        "ensembles/focal", f"ensembles/focal-{ident_b}"]
    members = [read_results(d)["meta"]["members"] for d in dirs]
    assert members == [[0, 1, 2], [0, 1]]
    groups = [g for g in group_runs(load_runs(dirs).runs)]
    assert [g.label for g in groups] == ["Focal · ensemble", "Focal · ensemble · lr=0.05"]


def test_evaluate_ensemble_says_when_it_pools_other_identities(tmp_path):
    a, b = two_learning_rates(tmp_path / "runs")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        same = evaluate_ensemble(a)
    assert same["meta"]["identity"] == read_results(a[0])["meta"]["identity"]
    with pytest.warns(UserWarning, match=r"different identities.*\(lr 0\.05\).*identity "
                                         r"differs in lr; the ensemble records no identity"):
        mixed = evaluate_ensemble([a[0], b[0]])
    assert "identity" not in mixed["meta"]
