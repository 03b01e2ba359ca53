"""build_report takes what it reads and shows as one frozen ReportOptions (issue 40 item 6) or,
as before, as keywords, which win over the options; a keyword that is no setting is refused
before anything is written."""

from __future__ import annotations

import dataclasses
import re

import pytest

from torchcal.report import ReportOptions, build_report

RUNS = dict(losses=("ce",), seeds=2, n=300)  # the `runs` fixture (conftest.py)


def _page(path):
    return re.sub(r"Generated .* UTC", "Generated", path.read_text())  # the minute it ran


def test_options_give_the_keyword_forms_report(runs, tmp_path):
    settings = dict(title="Opts", intro="An intro.", appendix="The end.", n_bins=10,
                    figures=False, verdict_label="label")
    by_kw = build_report([runs], tmp_path / "kw", **settings)
    by_options = build_report([runs], tmp_path / "opt", options=ReportOptions(**settings))
    for name in ("report.md", "report.html", "results.csv", "summary.csv"):
        assert _page(by_kw.out_dir / name) == _page(by_options.out_dir / name), name
    assert by_kw.text == by_options.text and "# Opts" in _page(by_kw.report_md)
    mixed = build_report([runs], tmp_path / "mix", options=ReportOptions(**settings),
                         title="Keyword")  # the keyword wins over the options
    assert "# Keyword" in _page(mixed.report_md) and "An intro." in _page(mixed.report_md)


def test_what_is_no_setting_is_refused_before_anything_is_written(runs, tmp_path):
    with pytest.raises(TypeError, match=r"build_report\(\) got an unexpected keyword argument "
                                        r"'bins'"):
        build_report([runs], tmp_path / "r", bins=10)
    with pytest.raises(TypeError, match="Expected `options` of build_report.. to be a "
                                        "ReportOptions, got dict"):
        build_report([runs], tmp_path / "r", options={"title": "x"})
    assert not (tmp_path / "r").exists()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ReportOptions().title = "x"
    assert ReportOptions().n_bins == 15 and ReportOptions().checkpoint == "last"
