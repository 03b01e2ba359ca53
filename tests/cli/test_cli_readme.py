"""`torchcal readme` (issue 32 item 5: the two command lines that lived in report/front.py and
experiments/uncertainty_report.py are one command of the command-line layer): it regenerates a
README's front table and uncertainty block from the committed results, and refuses other files."""

from __future__ import annotations

import shutil
from pathlib import Path

from torchcal.cli import main

ROOT = Path(__file__).resolve().parents[2]
CSV = "docs/results/mnist1d/results.csv"
SUITE = "docs/results/uncertainty/suite_results.json"


def test_readme_blocks_are_regenerated_from_the_committed_runs(tmp_path, capsys):
    for rel in (CSV, SUITE):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    original = (ROOT / "README.md").read_text(encoding="utf-8")
    begin_front = original.index("<!-- front-table:")
    begin_suite = original.index("<!-- uncertainty-demo:")
    # both generated blocks damaged: a table row and a verdict line edited by hand
    broken = original.replace("| Cross-entropy |", "| Cross-entropy (edited) |", 1)
    broken = broken[:begin_suite] + broken[begin_suite:].replace("holds on", "held on", 1)
    assert broken != original and broken.index("<!-- front-table:") == begin_front
    readme = tmp_path / "README.md"
    readme.write_text(broken, encoding="utf-8")
    assert main(["readme", str(readme), CSV, SUITE]) == 0
    assert readme.read_text(encoding="utf-8") == original
    assert f"regenerated from {CSV}" in capsys.readouterr().out


def test_readme_refuses_another_source(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("x\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("y\n", encoding="utf-8")
    assert main(["readme", str(readme), "notes.txt"]) == 2
    assert "results.csv or the uncertainty suite's suite_results.json" in capsys.readouterr().err
    assert readme.read_text(encoding="utf-8") == "x\n"
