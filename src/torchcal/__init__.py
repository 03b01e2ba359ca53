"""torchcal: calibration-aware training, calibration metrics and post-hoc calibration for PyTorch.

Sub-packages are imported on first use: ``torchcal.metrics``, ``torchcal.losses``,
``torchcal.functional``, ``torchcal.posthoc``, ``torchcal.uncertainty``, ``torchcal.data``,
``torchcal.models``, ``torchcal.train``, ``torchcal.report``, ``torchcal.evaluate``,
``torchcal.logits_file`` and ``torchcal.results_file`` (the files evaluation reads and writes),
``torchcal.run_dir`` (the run directory's layout), ``torchcal.errors``, ``torchcal.plot``
(reliability diagrams), ``torchcal.experiments`` (benchmarks and the sweep runner),
``torchcal.ensemble`` (deep ensembles and MC dropout), ``torchcal.regression`` (regression
predictions, their metrics and calibrators), ``torchcal.conformal`` (conformal regression and
risk control), ``torchcal.llm`` (confidence, calibration and abstention for LLM answers).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBPACKAGES = (
    "metrics", "losses", "functional", "posthoc", "uncertainty", "data", "models", "train",
    "report", "evaluate", "logits_file", "results_file", "run_dir", "errors", "plot", "experiments", "ensemble", "regression",
    "conformal", "llm",
)

__all__ = ["__version__", *_SUBPACKAGES]



def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'torchcal' has no attribute {name!r}")
