"""The uncertainty suite (torchcal demo --suite uncertainty): verdicts computed from unit
results by hand, and one end-to-end run at tiny sizes."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from torchcal.cli import main
from torchcal.experiments import (
    Benchmark,
    BenchmarkKind,
    DemoConfig,
    get_benchmark,
    list_benchmarks,
    register_benchmark,
    run_demo,
)
from torchcal.experiments import uncertainty as suite
from torchcal.experiments import uncertainty_report as rep
from torchcal.experiments.benchmark import BENCHMARKS


def _kirchhof(seed, head, mp, en, up=0.8, speedup=1.5, diff=0.0):
    unseen = {"r_auroc_recall": head, "baselines": {"max_prob": {"r_auroc_recall": mp},
                                                    "entropy": {"r_auroc_recall": en}}}
    upstream = {"r_auroc_recall": up, "r_auroc_correct": 0.9}
    return {"kind": "kirchhof", "seed": seed, "error": None,
            "heads": {"validation": {"unseen classes": unseen, "upstream": upstream,
                                     "shifted generator": upstream}},
            "timing": {"speedup": speedup, "backbone_pass": 0.1, "head_epoch_from_cache": 0.2},
            "stopgrad_max_abs_logit_diff": diff, "upstream_accuracy": 0.9}


def _kendall(seed, arm, acc, rmse, w=(1.0, 1.0)):
    return {"kind": "kendall", "seed": seed, "arm": arm, "error": None, "weights": list(w),
            "test": {"accuracy": acc, "rmse": rmse}}


def test_verdicts_by_hand():
    units = [
        _kirchhof(0, 0.65, 0.60, 0.62),                    # beats both; share (.15/.3) = 50%
        _kirchhof(1, 0.61, 0.62, 0.55, speedup=25, diff=1e-3),  # loses to max-prob
        _kendall(0, "fixed 1:0.1", 0.90, 5.0), _kendall(0, "fixed 1:10", 0.80, 3.0),
        _kendall(0, "kendall", 0.85, 4.0, (1.0, 0.5)),
        _kendall(0, "kendall, noisy target", 0.86, 4.5, (1.0, 0.2)),
        _kendall(1, "fixed 1:0.1", 0.90, 3.9), _kendall(1, "kendall", 0.85, 4.0, (0.5, 0.5)),
        _kendall(1, "kendall, noisy target", 0.85, 4.0, (0.5, 0.6)),
        {"kind": "kendall", "seed": 2, "arm": "kendall", "error": "Traceback ..."},
    ]
    v = {c["key"]: c for c in rep.claim_verdicts(units)}
    assert (v["kirchhof_unseen"]["holds"], v["kirchhof_unseen"]["n"]) == (1, 2)
    # seed 0: (0.65 - 0.5) / (0.8 - 0.5) = 0.5, not more than half; seed 1: 0.11 / 0.3
    assert v["kirchhof_share"]["holds"] == 0
    assert v["kirchhof_share"]["numbers"]["raw share"] == pytest.approx(
        (0.65 / 0.8 + 0.61 / 0.8) / 2)
    assert (v["kirchhof_cache"]["holds"], v["kirchhof_stopgrad"]["holds"]) == (1, 1)
    # seed 1: fixed 1:0.1 has higher accuracy and lower RMSE than Kendall: it dominates
    assert (v["kendall_frontier"]["holds"], v["kendall_frontier"]["n"]) == (1, 2)
    # weight ratios: seed 0 0.5 -> 0.2 (lower), seed 1 1.0 -> 1.2 (higher)
    assert (v["kendall_noise"]["holds"], v["kendall_noise"]["n"]) == (1, 2)
    lines = rep.verdict_lines(list(v.values()))
    assert any("Kendall et al. 2018" in s and "holds on 1 of 2 seeds" in s for s in lines)
    assert any("fails" in s and "keeps most" in s for s in lines)
    assert all("not evidence" in s for s in rep.verdict_lines(list(v.values()), evidence=False))


def test_claims_on_a_model_at_chance_are_not_evaluated():
    """Issue 33: a --quick run's Kendall model at 12% accuracy (chance 10%) printed "holds on
    1 of 1"; a Kirchhof backbone at chance on its 5 upstream classes likewise."""
    units = [_kendall(0, "fixed 1:0.1", 0.10, 5.0), _kendall(0, "kendall", 0.12, 4.0, (1, 0.5)),
             _kendall(0, "kendall, noisy target", 0.60, 4.5, (1.0, 0.2)),
             _kendall(1, "fixed 1:0.1", 0.50, 5.0), _kendall(1, "kendall", 0.60, 4.0, (1, 0.5)),
             {**_kirchhof(0, 0.65, 0.60, 0.62), "upstream_accuracy": 0.22}]
    v = {c["key"]: c for c in rep.claim_verdicts(units)}
    assert (v["kendall_frontier"]["n"], v["kendall_frontier"]["at_chance"]) == (1, 1)
    assert (v["kendall_noise"]["n"], v["kendall_noise"]["at_chance"]) == (0, 1)
    assert (v["kirchhof_unseen"]["n"], v["kirchhof_unseen"]["at_chance"]) == (0, 1)
    assert v["kirchhof_cache"]["n"] == 1  # timing: no model accuracy involved
    lines = dict(zip(v, rep.verdict_lines(list(v.values())), strict=True))
    assert lines["kendall_noise"].endswith("**not evaluated (model at chance)**.")
    assert "holds on 1 of 1 seeds**, 1 seed(s) not evaluated (model at chance)" in \
        lines["kendall_frontier"]
    assert "not evaluated (model at chance)" in lines["kirchhof_share"]


def test_the_kirchhof_share_line_sets_the_papers_shares_beside_ours():
    """Like for like: 43% above chance beside the paper's 89% above chance (it stood beside
    the paper's raw 96%)."""
    v = {c["key"]: c for c in rep.claim_verdicts([_kirchhof(0, 0.63, 0.60, 0.62)])}
    line = rep.verdict_lines([v["kirchhof_share"]])[0]
    above, raw = (0.63 - 0.5) / (0.8 - 0.5), 0.63 / 0.8
    assert (f"share above chance {100 * above:.0f}% (paper: 89%), raw share {100 * raw:.0f}% "
            "(paper: 96%)") in line
    assert round(100 * (0.758 - 0.5) / (0.791 - 0.5)) == 89 and round(100 * 0.758 / 0.791) == 96


def test_replace_readme_block():
    begin = rep.README_BEGIN.format(path="p.json")
    text = f"intro\n{begin}\nold\n{rep.README_END}\noutro\n"
    new = f"{begin}\nnew\n{rep.README_END}"
    assert rep.replace_readme_block(text, new) == f"intro\n{new}\noutro\n"


def _tiny_profile():
    return suite.UncertaintyProfile(
        seeds=(0,), backbone_epochs=1, upstream_sizes=(60, 40, 40), head_epochs=1, head_width=8,
        mt_epochs=1, mt_sizes=(60, 20, 40), grid=(0.1, 10.0), width=4, mt_width=4,
        evidence=False)


@pytest.fixture
def tiny_suite():
    """The uncertainty benchmark registered again at tiny sizes (``full``: a wider backbone
    trained two epochs), as a plug-in would register a benchmark of the suite's kind."""
    tiny = _tiny_profile()
    other = dataclasses.replace(tiny, width=6, backbone_epochs=2)
    bench = register_benchmark(dataclasses.replace(
        get_benchmark("uncertainty"), name="uncertainty-tiny",
        profiles={"default": tiny, "quick": tiny, "full": other}))
    yield bench
    BENCHMARKS.unregister(bench.name)


def _run_tiny(out, **kw):
    return run_demo(DemoConfig(benchmark="uncertainty-tiny", workers=1, progress=False, out=out,
                               **kw))


def test_the_suite_is_a_registered_benchmark_of_run_demo():
    """Issue 32 item 1: one experiment framework; the suite is the benchmark ``uncertainty``
    (its profiles the suite's sizes, its claims the suite's Claim objects), of its own kind,
    run by ``torchcal demo --suite uncertainty`` and not offered by ``--benchmark``."""
    bench = get_benchmark("uncertainty")
    assert isinstance(bench, Benchmark) and isinstance(bench.kind, BenchmarkKind)
    assert dict(bench.profiles) == suite.PROFILES and tuple(bench.claims) == rep.CLAIMS
    assert bench.suite == "uncertainty" and bench.job_fn is suite.run_unit
    assert "uncertainty" in list_benchmarks()
    assert "uncertainty" not in list_benchmarks("calibration")


def test_suite_end_to_end_tiny(tmp_path, tiny_suite):
    out = tmp_path / "out"
    res = _run_tiny(out)
    summary = res.report
    assert res.out_dir == out and res.failed == [] and res.config.seeds == (0,)
    assert not [u for u in summary["units"] if u["error"]]
    # 2 grid + 2 Kendall + the learned variance
    assert [u["kind"] for u in summary["units"]].count("kendall") == 5
    text = (out / "report.md").read_text()
    assert "## The papers' claims on this benchmark" in text
    assert "Command: `torchcal demo --suite uncertainty-tiny --default`" in text
    claims = text.split("## The papers' claims on this benchmark")[1].split("\n## ")[0]
    claims = claims.split("Beyond the claims")[0]
    lines = [s for s in claims.splitlines() if s.startswith("- ")]
    assert len(lines) == len(rep.CLAIMS) == 7
    assert sum("Kirchhof et al. 2024" in s for s in lines) == 4
    assert sum("Kendall et al. 2018" in s for s in lines) == 2
    assert sum("Lei et al. 2018" in s for s in lines) == 1
    # the regression section: the arms with a variance (Kendall's two, the learned variance)
    section = text.split("## Regression: ")[1].split("\n## ")[0]
    assert "| learned variance | sample |" in section and "| kendall | task |" in section
    lv = [u for u in summary["units"] if u.get("arm") == "learned variance"][0]
    assert lv["regression"]["variance"] == "sample" and "predictions" not in lv
    assert 0 <= lv["regression"]["split coverage"] <= 1
    # a 1-epoch model is at chance: its claims are not evaluated, the others hold or fail
    assert all(("holds on" in s and "of 1 seeds" in s or "not evaluated (model at chance)" in s)
               and "not evidence" in s for s in lines), lines
    saved = json.loads((out / suite.SUMMARY_FILE).read_text())
    assert [(c["key"], c["holds"], c["n"]) for c in saved["claims"]] == \
        [(c["key"], c["holds"], c["n"]) for c in summary["claims"]]
    assert (out / "kendall_frontier.png").stat().st_size > 0
    assert (out / "kirchhof_rauroc.png").stat().st_size > 0
    page = (out / "report.html").read_text()  # the same report as HTML, figures embedded
    assert "The papers&#x27; claims on this benchmark" in page or \
        "The papers' claims on this benchmark" in page
    assert page.count("data:image/png;base64,") == 2
    csv = (out / "results.csv").read_text().splitlines()
    assert csv[0] == "part,seed,arm,setting,method,metric,value" and len(csv) > 20
    # what `torchcal demo` prints: the verdicts and where the report went
    shown = tiny_suite.kind.summary(res)
    assert shown.startswith("## The papers' claims on this benchmark") and \
        f"report: {out / 'report.md'}" in shown and "profile default" in shown
    # a second run reuses the finished units (two-task results read back)
    again = _run_tiny(out).report
    reused = [u for u in again["units"] if u["kind"] == "kendall"]
    assert all(u.get("reused") for u in reused)
    k0 = [u for u in summary["units"] if u["kind"] == "kirchhof"][0]
    k1 = [u for u in again["units"] if u["kind"] == "kirchhof"][0]
    assert k0["heads"] == k1["heads"]  # same backbones, same seeded heads: same numbers
    assert math.isfinite(k0["timing"]["speedup"])
    # another size into the same directory (a wider backbone, two epochs): the backbones of
    # other settings are trained afresh, never extended or refused (issue 32: the stale check)
    third = _run_tiny(out, full=True).report
    assert not [u["error"] for u in third["units"] if u["error"]]
    for name in ("backbone", "backbone_joint"):
        run = out / "kirchhof" / "seed0" / name
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["model_kwargs"] == {"width": 6} and cfg["epochs"] == 2
        assert len((run / "log.jsonl").read_text().splitlines()) == 2


def test_demo_suite_refuses_calibration_options(tmp_path, capsys):
    out = str(tmp_path / "x")
    code = main(["demo", "--suite", "uncertainty", "--losses", "ce", "--out", out])
    assert code != 0 and "--losses" in capsys.readouterr().err
    code = main(["demo", "--suite", "uncertainty", "--train-arg", "lr=0.1", "--out", out])
    assert code != 0 and "--train-arg" in capsys.readouterr().err
    # options the suite has no use for are refused too, not silently ignored
    for flag in (["--n-bins", "10"], ["--no-pack"]):
        code = main(["demo", "--suite", "uncertainty", *flag, "--out", out])
        assert code != 0 and flag[0] in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before the directory is taken


def test_no_figures_writes_the_suite_report_without_figures(tmp_path, tiny_suite):
    """``--no-figures`` is honoured by the suite (it was silently ignored): no PNG, no figure
    section, nothing embedded in report.html."""
    out = tmp_path / "out"
    res = _run_tiny(out, figures=False)
    assert res.failed == []
    assert not list(out.glob("*.png"))
    assert "## Figures" not in (out / "report.md").read_text()
    assert "data:image/png;base64," not in (out / "report.html").read_text()


def _no_units(monkeypatch):
    """The jobs run_demo hands to the runner (none runs: each reports an error, the report has
    no finished unit)."""
    import torchcal.experiments.demo as demo

    jobs = []

    def sweep(js, *a, **k):
        jobs.extend(js)
        return [{"name": j.name, "error": "not run", **j.labels} for j in js]

    monkeypatch.setattr(demo, "run_sweep", sweep)
    return jobs


def test_demo_suite_dispatch(monkeypatch, tmp_path, capsys):
    """--suite uncertainty goes through run_demo: --full's arms, --seeds, the lock's directory
    and the report of no finished unit, printed."""
    jobs = _no_units(monkeypatch)
    out = tmp_path / "o"
    assert main(["demo", "--suite", "uncertainty", "--full", "--out", str(out),
                 "--seeds", "2", "--no-progress"]) == 1
    specs = [j.spec for j in jobs]
    assert sorted({s["seed"] for s in specs}) == [0, 1]
    assert {tuple(s["profile"]["grid"]) for s in specs} == {suite.PROFILES["full"].grid}
    assert [s["kind"] for s in specs].count("kirchhof") == 2
    assert all(j.fn is suite.run_unit for j in jobs)
    printed, err = capsys.readouterr()
    assert f"torchcal demo: {len(jobs)} unit(s) failed, see the report" in err
    assert "**not evaluated (no finished unit)**" in printed
    assert f"report: {out / 'report.md'}" in printed and "profile full" in printed
    assert json.loads((out / suite.SUMMARY_FILE).read_text())["profile"] == "full"


def test_readme_block_equals_the_committed_run():
    """The README's "What the uncertainty demo shows" block is generated from the committed
    suite run (regenerate: torchcal readme README.md PATH)."""
    root = Path(__file__).resolve().parents[2]
    path = "docs/results/uncertainty/suite_results.json"
    summary = json.loads((root / path).read_text(encoding="utf-8"))
    readme = (root / "README.md").read_text(encoding="utf-8")
    block = rep.readme_block(summary, path)
    assert block in readme
    assert "Kirchhof et al. 2024" in block and "Kendall et al. 2018" in block
    assert len([s for s in block.splitlines() if s.startswith("- ")]) == len(rep.CLAIMS)


def test_claims_are_the_calibration_benchmarks_claim_objects():
    """Issue 32 item 4: the suite's claims are report.claims.Claim objects, tested per seed by
    the same check_claim_on_seeds as the calibration demo's; the committed run's verdicts (its
    holds, numbers and per-seed numbers) come out unchanged."""
    from torchcal.report.claims import Claim

    assert all(isinstance(c, Claim) for c in rep.CLAIMS)
    root = Path(__file__).resolve().parents[2]
    summary = json.loads((root / "docs/results/uncertainty/suite_results.json").read_text())
    again = rep.claim_verdicts(summary["units"])
    assert [c["at_chance"] for c in again] == [0] * len(rep.CLAIMS)  # none at chance
    assert json.dumps(again, sort_keys=True) == json.dumps(summary["claims"], sort_keys=True)
    assert [c["n"] for c in again] == [5] * len(rep.CLAIMS)


def test_a_second_suite_into_one_out_is_refused_in_one_line(tmp_path, capsys):
    """Issue 32 item 4: the suite owns its --out while it runs, as the calibration demo does;
    the holder here is a process holding the same lock (what a running suite holds)."""
    import os
    import subprocess
    import sys

    import torchcal
    from torchcal._io import LOCK_NAME

    out = tmp_path / "o"
    src = str(Path(torchcal.__file__).resolve().parents[1])
    code = ("import sys, time\nfrom torchcal._io import exclusive_lock\n"
            "with exclusive_lock(sys.argv[1], what='Demo directory'):\n"
            "    print('locked', flush=True)\n    time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": src})
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["demo", "--suite", "uncertainty", "--quick", "--no-progress",
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert f"in use by process {holder.pid}" in err and "Traceback" not in err
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_each_suite_without_out_gets_a_fresh_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _no_units(monkeypatch)
    outs = []
    for _ in range(2):
        assert main(["demo", "--suite", "uncertainty", "--quick", "--no-progress"]) == 1
        outs.append(Path(capsys.readouterr().out.split("report: ")[1].split()[0]).parent)
    assert outs[0] != outs[1] and {o.parent for o in outs} == {tmp_path / "torchcal-demo"}
    assert all((o / "report.md").is_file() for o in outs)
