"""Reports from evaluated runs: tables in the papers' layout, figures, and the embedded demo.

* :func:`build_report` - run directories -> report.md / report.html / figures / results.json+csv
  (the engine of ``torchcal report`` and ``torchcal demo``).
* :func:`run_demo` / :class:`DemoConfig` - the noisy-digits benchmark (``torchcal demo``).
* :func:`load_runs`, :func:`group_runs` - reading and averaging ``results.json`` files.
* ``torchcal.report.plots`` - the reliability diagram; ``torchcal.report.figures`` - the others.
"""

from .aggregate import Group, RunRecord, group_runs, load_runs, loss_label
from .build import ReportOutput, build_report
from .demo import DemoConfig, DemoResult, run_demo

__all__ = [
    "build_report",
    "ReportOutput",
    "run_demo",
    "DemoConfig",
    "DemoResult",
    "load_runs",
    "group_runs",
    "loss_label",
    "Group",
    "RunRecord",
]
