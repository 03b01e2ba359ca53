"""Issue 33 part 5: the calibration demo ends with the claims' verdicts on the screen (they
were only in the report, 7,800 px down report.html)."""

from __future__ import annotations

import pytest

from torchcal.cli import main
from torchcal.report import group_runs, load_runs
from torchcal.report.claims import check_claims

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def test_the_calibration_demo_prints_the_verdicts_at_its_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--benchmark", "digits", "--losses", "ce,focal", "--seeds", "0,",
                 "--epochs", "1", "--workers", "1", "--no-progress", "--no-figures",
                 "--out", str(out)]) == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    from torchcal.experiments.benchmark import get_benchmark

    results = check_claims(group_runs(load_runs([out / "runs"]).runs),
                           get_benchmark("digits").claims)
    tail = lines[-len(results) - 1:]
    assert tail[0] == ("The papers' claims on this run (shortened schedule, 1 of 100 epochs); "
                       "the report's first section has each seed's numbers:"), lines[-10:]
    assert tail[2] == f"- Mukhoti et al. 2020, focal below cross-entropy: {results[1].verdict}"
    # issue 41: a claim comparing a loss the run did not train has no verdict: it is listed
    # after the verdicts as needing --full
    ghosh, = [line for line in tail if "Ghosh et al. 2022" in line]
    assert results[1].n == 1 and ghosh.startswith("- Needs --full: Ghosh et al. 2022, ")
    assert ghosh.endswith("(no run of FLSD-53, AdaFocal)")
    assert not any("not tested" in line for line in tail)
    needs = [i for i, line in enumerate(tail) if line.startswith("- Needs --full:")]
    assert needs and needs == list(range(needs[0], len(tail)))  # after every verdict
