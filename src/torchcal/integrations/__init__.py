"""Calibration inside the trainers people already use (optional extras, imported on use).

* :mod:`torchcal.integrations.lightning` - ``CalibrationCallback`` for PyTorch Lightning
  (``pip install "torchcal[lightning]"``);
* :mod:`torchcal.integrations.hf` - ``CalibrationCallback`` and ``compute_loss_func`` for the
  Hugging Face ``transformers`` ``Trainer`` (``pip install "torchcal[hf]"``).

Importing this package imports neither framework; each sub-module imports its own and raises
an ``ImportError`` naming the extra to install when it is missing.
"""

__all__: list[str] = []
