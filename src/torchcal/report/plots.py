"""Plots built with matplotlib's object API on the Agg canvas (no pyplot, no global backend
change, safe in worker processes); PNG files are written atomically.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write_bytes
from ..metrics.calibration import ReliabilityCurve, ece, reliability_curve

__all__ = ["reliability_diagram"]


def _atomic_write_png(fig: Any, path: str | os.PathLike) -> Path:
    """Render ``fig`` as PNG and write it to ``path`` atomically (temp file, fsync, replace)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _draw_reliability(ax: Any, curve: ReliabilityCurve, ece_value: float | None) -> None:
    edges = curve.edges.double().cpu().numpy()
    counts = curve.counts.cpu().numpy()
    acc = curve.accuracies.double().cpu().numpy()
    conf = curve.confidences.double().cpu().numpy()
    left, width = edges[:-1], np.diff(edges)
    filled = counts > 0
    ax.bar(left[filled], acc[filled], width=width[filled], align="edge", color="#1f77b4",
           edgecolor="black", linewidth=0.6, label="accuracy")
    # The gap between mean confidence and accuracy of each bin, hatched.
    ax.bar(left[filled], conf[filled] - acc[filled], bottom=acc[filled], width=width[filled],
           align="edge", color="#d62728", alpha=0.3, edgecolor="#d62728", hatch="//",
           linewidth=0.6, label="gap")
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfect")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize=8)
    if ece_value is not None:
        ax.text(0.97, 0.05, f"ECE = {100 * ece_value:.2f}%", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=9,
                bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8})


def _draw_histogram(ax: Any, curve: ReliabilityCurve, mean_conf: float, accuracy: float) -> None:
    edges = curve.edges.double().cpu().numpy()
    counts = curve.counts.cpu().numpy().astype(np.float64)
    share = counts / max(counts.sum(), 1.0)
    ax.bar(edges[:-1], share, width=np.diff(edges), align="edge", color="#7f7f7f",
           edgecolor="black", linewidth=0.6)
    ax.axvline(accuracy, color="#1f77b4", linestyle="-", linewidth=1.2, label="accuracy")
    ax.axvline(mean_conf, color="#d62728", linestyle="--", linewidth=1.2, label="avg. confidence")
    ax.set_xlim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("share of samples")
    ax.legend(loc="upper left", fontsize=8)


def reliability_diagram(
    *,
    logits: Any = None,
    probs: Any = None,
    labels: Any,
    n_bins: int = 15,
    title: str | None = None,
    path: str | os.PathLike | None = None,
    ax: Any = None,
) -> Any:
    """Reliability diagram of the top-1 confidence with a confidence histogram below it.

    Top panel: per equal-width bin (the ECE convention of :mod:`torchcal.metrics.binning`),
    the accuracy as a bar and the gap to the bin's mean confidence hatched, the diagonal, and
    the ECE in the corner.  Bottom panel: the share of samples per bin with the accuracy and
    the average confidence as vertical lines.  When ``ax`` is given only the reliability panel
    is drawn into it (the caller owns the figure).

    Args:
        logits, probs: (N, C), exactly one of them.
        labels: (N,) integer class indices.
        n_bins: number of equal-width bins.
        title: figure title.
        path: if given, the figure is also written there as PNG (atomically).
        ax: an existing matplotlib Axes to draw the reliability panel into.

    Returns:
        The matplotlib ``Figure``.
    """
    curve = reliability_curve(logits=logits, probs=probs, labels=labels, n_bins=n_bins)
    ece_value = float(ece(logits=logits, probs=probs, labels=labels, n_bins=n_bins))
    counts = curve.counts.double()
    n = float(counts.sum())
    filled = counts > 0
    mean_conf = float((curve.confidences.double()[filled] * counts[filled]).sum()) / n
    accuracy = float((curve.accuracies.double()[filled] * counts[filled]).sum()) / n
    if ax is not None:
        fig = ax.figure
        _draw_reliability(ax, curve, ece_value)
        if title:
            ax.set_title(title)
    else:
        fig = _new_figure(4.5, 6.0)
        top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
        _draw_reliability(top, curve, ece_value)
        _draw_histogram(bottom, curve, mean_conf, accuracy)
        if title:
            top.set_title(title)
        fig.tight_layout()
    if path is not None:
        _atomic_write_png(fig, path)
    return fig
