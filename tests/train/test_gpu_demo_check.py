"""``benchmarks/gpu_demo_check.py`` (issue 38): the one-call GPU measurement script's logic,
run on the CPU.  The per-step sync watch counts every step (not once per epoch) and records
a synchronising step; the verdict comparison names each claim; the summary line is printed and
written to ``--out``.  (The whole ``--dry-run`` takes about a minute of CPU: the demo sections
are skipped here and the demo's own tests cover it.)"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gdc():
    spec = importlib.util.spec_from_file_location("gpu_demo_check",
                                                  ROOT / "benchmarks" / "gpu_demo_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_demo_check"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_step_watch_counts_each_step_and_names_a_sync(gdc):
    watch = gdc._StepWatch(cuda=False, skip=2)
    watch.active = True

    def step(sync: bool) -> int:
        if sync:
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)
        return 1

    eager, compiled = watch.wrap(step, False), watch.wrap(step, True)
    for i in range(4):
        assert eager(i == 2) == 1
    for _ in range(3):
        compiled(True)  # the first two compile and capture: not checked
    assert watch.steps == 5 and watch.synced == 2
    assert any("synchronizing" in s for s in watch.sources)


def test_dry_run_prints_the_summary(gdc, tmp_path, capsys):
    gdc.main(["--dry-run", "--out", str(tmp_path), "--skip", "equivalence,gpu,cpu,profile"])
    out = capsys.readouterr().out
    assert "steps checked, 0 synchronised" in out
    assert "the GPU demo wrote no results.csv" in out
    assert "summary (CPU (dry run))" in out
    assert "summary" in (tmp_path / "gpu_demo_check.txt").read_text()


def test_verdicts_compare_with_the_committed_run(gdc, tmp_path):
    committed = ROOT / "docs" / "results" / "mnist1d" / "results.csv"
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "results.csv").write_text(committed.read_text())
    assert gdc.verdicts(tmp_path) is True
