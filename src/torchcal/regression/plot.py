"""Reliability diagrams of regression predictions: expected against observed quantile coverage,
and the RMSE against the root mean predicted variance per std bin (Levi et al. 2022)."""

from __future__ import annotations

import os
from typing import Any

import torch

from ._scores import (
    ence_bin_index,
    ence_from_sums,
    gaussian_rows,
    std_bin_sums,
)
from .metrics import calibration_curve, quantile_calibration_error

__all__ = ["regression_reliability_diagram", "sigma_reliability_diagram"]


def _axes(ax: Any, width: float, height: float) -> tuple[Any, Any]:
    """The caller's Axes and its figure, or a new one-Axes figure."""
    if ax is not None:
        return ax.figure, ax
    # deferred: matplotlib is slow to import: only when a figure is drawn (start-up time)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _finish(fig: Any, ax: Any, title: str | None, path: Any) -> Any:
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if path is not None:
        fig.savefig(os.fspath(path), format="png", dpi=fig.dpi, bbox_inches="tight")
    return fig


def regression_reliability_diagram(pred: Any, target: Any, ax: Any = None, *,
                                   levels: Any = None, kind: str = "interval",
                                   mask: Any = None, ignore_value: Any = None,
                                   title: str | None = None, path: Any = None) -> Any:
    """Expected against observed proportions (:func:`~torchcal.regression.calibration_curve`):
    the curve, the diagonal of perfect calibration and the area between them shaded, with the
    mean absolute calibration error and the miscalibration area in the legend.  Below the
    diagonal (``kind="interval"``) the prediction is over-confident: its intervals cover less
    than they claim; with ``kind="quantile"`` an over-confident one crosses the diagonal from
    above to below.

    Args:
        pred: a :class:`~torchcal.regression.Gaussian`,
            :class:`~torchcal.regression.Quantiles` or :class:`~torchcal.regression.Samples`.
        target: the targets.
        ax: an Axes of the caller's to draw into (None: a new figure).
        levels: the expected proportions (see :func:`~torchcal.regression.calibration_curve`).
        kind: ``"interval"`` (central intervals) or ``"quantile"`` (``y <= q_p``).
        mask: optional boolean, True where the target is observed.
        ignore_value: optional value marking missing targets.
        title: the Axes' title (None: none).
        path: where to write the figure as a PNG (None: not written).

    Returns:
        The matplotlib ``Figure``.

    >>> from torchcal.regression import Gaussian
    >>> fig = regression_reliability_diagram(Gaussian([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]),
    ...                                      [0.1, -2.0, 0.5])
    >>> fig.axes[0].get_xlabel()
    'expected proportion (central interval)'
    """
    expected, observed = calibration_curve(pred, target, levels, kind=kind, mask=mask,
                                           ignore_value=ignore_value)
    args = {"kind": kind, "mask": mask, "ignore_value": ignore_value}
    mace = float(quantile_calibration_error(pred, target, levels, **args))
    area = float(quantile_calibration_error(pred, target, levels, norm="area", **args))
    fig, ax = _axes(ax, 4.6, 4.6)
    e, o = expected.cpu().numpy(), observed.cpu().numpy()
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="ideal")
    ax.fill_between(e, e, o, color="#d62728", alpha=0.18, linewidth=0,
                    label=f"miscalibration area {area:.3f}")
    ax.plot(e, o, color="#1f77b4", linewidth=2, marker="o" if e.size <= 25 else None,
            markersize=4, label=f"observed (MACE {mace:.3f})")
    what = "central interval" if kind == "interval" else "y <= predicted quantile"
    ax.set_xlabel(f"expected proportion ({what})")
    ax.set_ylabel("observed proportion")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    hint = ("below the diagonal: over-confident" if kind == "interval"
            else "above, then below the diagonal: over-confident")
    ax.legend(loc="best", fontsize=8, title=hint, title_fontsize=7)
    return _finish(fig, ax, title, path)


def sigma_reliability_diagram(pred: Any, target: Any, n_bins: int = 10, ax: Any = None, *,
                              std_range: Any = None, mask: Any = None,
                              ignore_value: Any = None, title: str | None = None,
                              path: Any = None) -> Any:
    """RMSE against RMV (the root mean predicted variance) per std bin, the bins of
    :func:`~torchcal.regression.ence` (equal-mass by default), with the diagonal of perfect
    calibration and the ENCE in the legend.  Points above the diagonal are bins whose errors
    exceed the predicted spread (over-confident); the bins' count is in the legend when they
    are equal, else written by each point.

    Args:
        pred: a :class:`~torchcal.regression.Gaussian` (or moment-matched
            :class:`~torchcal.regression.Samples`).
        target: the targets.
        n_bins: the number of std bins.
        ax: an Axes of the caller's to draw into (None: a new figure).
        std_range: None (equal-mass bins) or ``(lo, hi)`` (log-spaced fixed bins).
        mask: optional boolean, True where the target is observed.
        ignore_value: optional value marking missing targets.
        title: the Axes' title (None: none).
        path: where to write the figure as a PNG (None: not written).

    Returns:
        The matplotlib ``Figure``.

    >>> from torchcal.regression import Gaussian
    >>> fig = sigma_reliability_diagram(Gaussian([0.0, 0.0], [1.0, 4.0]), [2.0, 1.0], n_bins=2)
    >>> fig.axes[0].get_ylabel()
    'RMSE (observed error)'
    """
    var, sq = gaussian_rows(pred, target, mask, ignore_value, "a sigma reliability diagram")
    sums = std_bin_sums(ence_bin_index(var, n_bins, std_range), var, sq, n_bins)
    full = sums[0] > 0
    count = sums[0][full]
    rmv = (sums[1][full] / count).sqrt().cpu().numpy()
    rmse = (sums[2][full] / count).sqrt().cpu().numpy()
    value = float(ence_from_sums(sums))
    fig, ax = _axes(ax, 4.6, 4.6)
    top = 1.08 * float(max(rmv.max(), rmse.max()))
    ax.plot([0, top], [0, top], linestyle="--", color="gray", linewidth=1, label="ideal")
    counts = torch.as_tensor(count).long().tolist()
    same = len(set(counts)) == 1
    each = f", {counts[0]} per bin" if same else ""
    ax.plot(rmv, rmse, color="#1f77b4", linewidth=1.5, marker="o", markersize=5,
            label=f"per std bin (ENCE {value:.3f}{each})")
    if not same:  # unequal bins: each point's count, so that a sparse bin is read as such
        for x, y_, n in zip(rmv, rmse, counts, strict=True):
            ax.annotate(f"n={n}", (x, y_), textcoords="offset points", xytext=(5, -10),
                        fontsize=6, color="#555555")
    ax.set_xlabel("RMV (root mean predicted variance)")
    ax.set_ylabel("RMSE (observed error)")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_aspect("equal")
    ax.legend(loc="best", fontsize=8, title="above the diagonal: over-confident",
              title_fontsize=7)
    return _finish(fig, ax, title, path)
