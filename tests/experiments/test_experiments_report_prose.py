"""The demo report's prose (issue 26, items 2 and 3): a shortened run's verdict label
(``--quick``: a smoke test whose verdicts are not evidence; tests/report/test_report_html.py
checks it on every verdict line); the intro states the
setting in a few lines and the registered losses not trained go to an appendix table, one row
per reason, with what the CIFAR schedule would be on the run's own epochs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from torchcal.experiments import DemoConfig
from torchcal.experiments.demo import appendix_text, intro_text, verdict_label
from torchcal.losses import list_losses
from torchcal.report.aggregate import loss_label

OUT = Path("/x")


@pytest.fixture(scope="module")
def quick(demo_configs):
    cfg = DemoConfig(quick=True)
    jobs = demo_configs(cfg, OUT)
    return cfg, jobs, intro_text(cfg, jobs, seconds=19.0), appendix_text(cfg, jobs)


def test_verdict_label_of_each_profile(demo_configs):
    for cfg, want in ((DemoConfig(quick=True), "--quick smoke test, 15 of 350 epochs: not evidence"),
                      (DemoConfig(epochs=60), "shortened schedule, 60 of 350 epochs"),
                      (DemoConfig(), ""),  # the default: the recipe's schedule
                      (DemoConfig(epochs=350, seeds=(0,)), "")):
        assert verdict_label(cfg, demo_configs(cfg, OUT)) == want


def test_intro_states_the_setting_in_a_few_lines(quick):
    _cfg, _jobs, intro, appendix = quick
    text_lines = [ln for ln in intro.splitlines() if ln.strip()]
    assert len(text_lines) <= 7, intro
    assert len(intro) < 2500, len(intro)
    assert "A smoke test (`--quick`), not evidence" in intro
    assert "published code" not in intro and "Registered" not in intro  # in the appendix
    assert "100-epoch" not in intro + appendix  # a 15-epoch run says 15
    assert "on this 15-epoch run, focal γ=5 throughout" in appendix


def test_untrained_losses_are_one_appendix_table(demo_configs, quick):
    cfg, _jobs, _intro, appendix = quick
    rows = [ln for ln in appendix.splitlines() if ln.startswith("| ")][1:]  # no header
    named = [n for row in rows for n in row.split(" | ")[0].lstrip("| ").split(", ")]
    untrained = [loss_label(n) for n in list_losses() if n not in _trained(demo_configs, cfg)]
    assert sorted(named) == sorted(untrained)  # each exactly once
    reasons = [row.split(" | ")[1] for row in rows]
    assert len(reasons) == len(set(reasons)) <= 4  # one row per reason
    assert appendix.count("a variant from the published code") == 1


def _trained(demo_configs, cfg):
    return {j.loss for j in demo_configs(cfg, OUT)}


def test_the_tiny_report_has_intro_claims_and_appendix_in_order(tmp_path):
    """End to end on a 1-epoch digits run of two losses: the appendix follows the runs table,
    and the shortened run's verdict lines carry the label (none testable: CE and AdaFocal)."""
    from torchcal.experiments import run_demo

    cfg = DemoConfig(out=tmp_path / "d", seeds=(0,), epochs=1, losses=("ce", "focal"),
                     workers=1, progress=False, figures=False, benchmark="digits")
    md = run_demo(cfg).report.report_md.read_text(encoding="utf-8")
    assert md.index("## Runs") < md.index("## Appendix: the setting in full")
    assert "**Verdict (shortened schedule, 1 of 100 epochs): " in md
    # the claims first, then the intro (the setting) under its own heading
    assert md.index("## The papers' claims") < md.index("## This run")
    assert np.all([ln.startswith("- **") for ln in md.split("## This run", 1)[1].strip()
                   .split("\n\n", 1)[0].splitlines()])
