"""Issue 43 item 1: the report draws the figures of every loss at once by default
(``figures=True`` / ``"default"``); each loss's pre/post-T reliability pair only with
``figures="all"``; none with ``False`` / ``"none"``; anything else is refused by name."""

from __future__ import annotations

import pytest

from torchcal.report import build_report
from torchcal.report.build import FIGURE_SETS, figure_set

LOSSES = ("ce", "focal")


def _names(rep) -> list[str]:
    return sorted(p.name for p in rep.figures)


def test_default_draws_the_figures_of_every_loss_at_once(runs, tmp_path):
    for figures in (True, "default"):
        names = _names(build_report([runs], tmp_path / str(figures), figures=figures))
        assert any(n.startswith("reliability_overview_") for n in names), names
        assert any(n.startswith("confidence_") for n in names), names
        pairs = [n for n in names if n.startswith("reliability_") and "overview" not in n]
        assert pairs == [], names


def test_all_adds_each_loss_pair_and_none_draws_nothing(runs, tmp_path):
    default = _names(build_report([runs], tmp_path / "d", figures="default"))
    every = _names(build_report([runs], tmp_path / "a", figures="all"))
    pairs = sorted(set(every) - set(default))
    assert len(pairs) == len(LOSSES) and all(n.startswith("reliability_") for n in pairs), pairs
    for figures in (False, "none"):
        assert build_report([runs], tmp_path / f"n{figures}", figures=figures).figures == []


@pytest.mark.parametrize("bad", ["some", "ALL", 1, None])
def test_an_unknown_figure_set_is_refused_by_name(runs, tmp_path, bad):
    with pytest.raises(ValueError, match="`figures`.*'none', 'default', 'all'"):
        build_report([runs], tmp_path / "x", figures=bad)
    assert not (tmp_path / "x").exists()
    assert FIGURE_SETS == ("none", "default", "all") and figure_set("all") == "all"
