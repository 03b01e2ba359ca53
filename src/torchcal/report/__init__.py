"""Reports from evaluated runs: tables in the papers' layout and figures.

* :func:`build_report` - run directories -> report.md / report.html / figures / results.json+csv
  (the engine of ``torchcal report`` and ``torchcal demo``); :class:`ReportOptions` - what it
  reads and shows.
* :func:`load_runs`, :func:`group_runs` - reading and averaging ``results.json`` files.
* ``torchcal.report.svg`` - the report's default figures as SVG, written without matplotlib
  (issue 43: a few percent of its CPU); ``torchcal.report.figures`` - the same figures and each
  loss's reliability pair by matplotlib, as PNG (the reliability diagram is
  :func:`torchcal.plot.reliability_diagram`).

The demo trains models, so it is application code: :mod:`torchcal.experiments`
(``run_demo``, ``DemoConfig``, ``DemoResult``).  This package reads run directories only and
never imports ``torchcal.train`` or ``torchcal.cli``.
"""

from .aggregate import Group, RunRecord, group_runs, load_runs, loss_label
from .build import ReportOptions, ReportOutput, build_report

__all__ = [
    "build_report",
    "ReportOptions",
    "ReportOutput",
    "load_runs",
    "group_runs",
    "loss_label",
    "Group",
    "RunRecord",
]
