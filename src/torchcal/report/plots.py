"""Moved: the reliability diagram is public in :mod:`torchcal.plot`.

These names stay importable from here (``from torchcal.report.plots import
reliability_diagram``) as re-exports of the same objects.
"""

from ..plot import MIN_COUNT, reliability_diagram

__all__ = ["reliability_diagram", "MIN_COUNT"]
