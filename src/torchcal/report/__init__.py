"""Reports from evaluated runs: tables in the papers' layout and figures.

* :func:`build_report` - run directories -> report.md / report.html / figures / results.json+csv
  (the engine of ``torchcal report`` and ``torchcal demo``).
* :func:`load_runs`, :func:`group_runs` - reading and averaging ``results.json`` files.
* ``torchcal.report.plots`` - the reliability diagram; ``torchcal.report.figures`` - the others.

The demo trains models, so it is application code: :mod:`torchcal.experiments`
(``run_demo``, ``DemoConfig``, ``DemoResult``).  This package reads run directories only and
never imports ``torchcal.train`` or ``torchcal.cli``.
"""

from typing import Any

from .aggregate import Group, RunRecord, group_runs, load_runs, loss_label
from .build import ReportOutput, build_report

__all__ = [
    "build_report",
    "ReportOutput",
    "load_runs",
    "group_runs",
    "loss_label",
    "Group",
    "RunRecord",
]

_MOVED = ("run_demo", "DemoConfig", "DemoResult")


def __getattr__(name: str) -> Any:
    if name in _MOVED:  # moved up to the experiments layer, which this package may not import
        raise AttributeError(
            f"torchcal.report.{name} moved to torchcal.experiments (the demo trains models, so "
            f"it is application code): use `from torchcal.experiments import {name}`")
    raise AttributeError(f"module 'torchcal.report' has no attribute {name!r}")
