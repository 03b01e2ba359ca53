"""Compatibility module: the names that lived here before ``torchcal.train`` was split into
:mod:`~torchcal.train.device` (where a run computes), :mod:`~torchcal.train.build` (data, model,
a trained model from a checkpoint), :mod:`~torchcal.train.inference` (batches and
:func:`predict_logits`) and :mod:`~torchcal.train.evaluation` (a run's logits and results).

Import from those modules (or from ``torchcal.train``); every name here keeps working.
``evaluate_run`` is the deprecated name of :func:`~torchcal.train.evaluation.evaluate_checkpoint`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from .build import (
    build_data,
    build_model,
    check_model_input,
    load_model_from_run,
    load_ood_sets,
)
from .device import resolve_device
from .evaluation import collect_predictions, evaluate_checkpoint, write_predictions
from .inference import BatchSource, predict_logits

__all__ = [
    "build_data",
    "build_model",
    "check_model_input",
    "load_ood_sets",
    "load_model_from_run",
    "predict_logits",
    "evaluate_run",
    "collect_predictions",
    "write_predictions",
    "resolve_device",
    "BatchSource",
]


def evaluate_run(run_dir: str | Path, checkpoint: str = "last", *, data_root: str | None = None,
                 device: str = "cpu", batch_size: int | None = None) -> dict[str, Any]:
    """Deprecated name of :func:`~torchcal.train.evaluation.evaluate_checkpoint` (same
    arguments and results; a ``DeprecationWarning`` names the new function)."""
    warnings.warn("torchcal.train.evaluate_run is deprecated: use "
                  "torchcal.train.evaluate_checkpoint (same arguments)", DeprecationWarning,
                  stacklevel=2)
    return evaluate_checkpoint(run_dir, checkpoint, data_root=data_root, device=device,
                               batch_size=batch_size)
