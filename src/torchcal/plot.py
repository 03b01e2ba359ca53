"""Figures of calibration: the reliability diagram and the smooth reliability curve; and of
selective prediction: the risk-coverage curve.

Both take logits or probabilities (keywords ``logits=`` / ``probs=``, exactly one) and labels
(tensors or NumPy arrays) and return a Matplotlib ``Figure``; given ``ax=``, they draw into a
figure the caller owns.  Built with Matplotlib's object API on the Agg canvas (no pyplot, no
global backend change, safe in worker processes); ``path=`` writes a PNG atomically.

Example:
    >>> import torch
    >>> from torchcal.plot import reliability_diagram
    >>> logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.5, 0.0], [0.0, 3.0]])
    >>> fig = reliability_diagram(logits=logits, labels=torch.tensor([0, 1, 1, 1]), n_bins=5)
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['accuracy', 'samples']
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._io import atomic_write_bytes
from ._validation import check_positive_int
from .metrics.binfree import smooth_reliability_curve
from .metrics.calibration import ReliabilityCurve, ece, reliability_curve
from .metrics.ranking import aurc, risk_coverage_curve

__all__ = ["reliability_diagram", "smooth_reliability_diagram", "risk_coverage_plot",
           "reliability_legend_handles", "MIN_COUNT"]


def _atomic_write_png(fig: Any, path: str | os.PathLike) -> Path:
    """Render ``fig`` as PNG and write it to ``path`` atomically (temp file, fsync, replace)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def _new_figure(width: float, height: float) -> Any:
    # deferred: matplotlib is slow to import: only when a figure is drawn (start-up time)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


#: Bins with fewer samples than this are drawn faded with their count written on the bar: the
#: accuracy of a bin of n samples is uncertain by about sqrt(p(1-p)/n), ±0.11 at n = 20.
MIN_COUNT = 20


#: Colours of the reliability bars: the accuracy, and the gap to the bin's mean confidence on
#: either side (opaque, so the under-confident gap drawn inside the accuracy bar mixes no colour).
ACCURACY_COLOR, OVER_COLOR, UNDER_COLOR = "#1f77b4", "#d62728", "#ff9f1c"


def _draw_reliability(ax: Any, curve: ReliabilityCurve, ece_value: float | None,
                      min_count: int = MIN_COUNT, legend: bool = True,
                      ylabel: str = "accuracy", ece_text: str = "ECE") -> None:
    """Accuracy bars; the gap to the mean confidence above an over-confident bin's bar (red,
    hatched) or as the top part of an under-confident bin's bar (orange, hatched)."""
    edges = curve.edges.double().cpu().numpy()
    counts = curve.counts.cpu().numpy()
    acc = curve.accuracies.double().cpu().numpy()
    conf = curve.confidences.double().cpu().numpy()
    left, width = edges[:-1], np.diff(edges)
    filled = counts >= max(min_count, 1)
    sparse = (counts > 0) & ~filled
    over, under = filled & (conf > acc), filled & (conf < acc)
    ax.bar(left[filled], acc[filled], width=width[filled], align="edge", color=ACCURACY_COLOR,
           edgecolor="black", linewidth=0.6, label="accuracy")
    ax.bar(left[over], conf[over] - acc[over], bottom=acc[over], width=width[over],
           align="edge", color="#f4c7c7", edgecolor=OVER_COLOR, hatch="//", linewidth=0.6,
           label="gap, over-confident (confidence > accuracy)")
    ax.bar(left[under], acc[under] - conf[under], bottom=conf[under], width=width[under],
           align="edge", color=UNDER_COLOR, edgecolor="black", hatch="\\\\", linewidth=0.6,
           label="gap, under-confident (accuracy > confidence)")
    if sparse.any():
        ax.bar(left[sparse], acc[sparse], width=width[sparse], align="edge", color=ACCURACY_COLOR,
               alpha=0.25, edgecolor="0.35", linestyle=":", linewidth=0.8,
               label=f"< {min_count} samples")
        for x, w, a, n in zip(left[sparse], width[sparse], acc[sparse], counts[sparse],
                              strict=True):
            ax.text(x + w / 2, min(a, 0.9) + 0.02, str(int(n)), ha="center", va="bottom",
                    fontsize=6, color="0.25")
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfect")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel(ylabel)
    if legend:
        _reliability_legend(ax, min_count, bool(sparse.any()))
    if ece_value is not None:
        _corner_label(ax, f"{ece_text} = {100 * ece_value:.2f}%")


def _reliability_legend(ax: Any, min_count: int, sparse: bool) -> None:
    """Every bar kind's legend entry, drawn or not in this panel."""
    ax.legend(handles=reliability_legend_handles(min_count, sparse), loc="upper left",
              fontsize=7)


def reliability_legend_handles(min_count: int = MIN_COUNT, sparse: bool = True) -> list:
    """The legend entries of every bar kind of :func:`reliability_diagram` (and of its
    diagonal), drawn or not in a given panel: for a figure that explains several panels with
    one legend outside them, where it covers no bar (``fig.legend(handles=...)``).

    >>> [h.get_label() for h in reliability_legend_handles(20)][-2:]
    ['< 20 samples', 'perfect']
    """
    # deferred: matplotlib is slow to import: only when a figure is drawn (start-up time)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=ACCURACY_COLOR, edgecolor="black", label="accuracy"),
               Patch(facecolor="#f4c7c7", edgecolor=OVER_COLOR, hatch="//",
                     label="gap: over-confident"),
               Patch(facecolor=UNDER_COLOR, edgecolor="black", hatch="\\\\",
                     label="gap: under-confident")]
    if sparse:
        handles.append(Patch(facecolor=ACCURACY_COLOR, alpha=0.25, edgecolor="0.35",
                             linestyle=":", label=f"< {min_count} samples"))
    handles.append(Line2D([0], [0], linestyle="--", color="gray", label="perfect"))
    return handles


def _corner_label(ax: Any, text: str) -> None:
    ax.text(0.97, 0.05, text, transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8})


def _draw_counts(ax: Any, curve: ReliabilityCurve, mean_conf: float, accuracy: float,
                 min_count: int = MIN_COUNT, legend: bool = True,
                 xlabel: str = "confidence") -> None:
    """Samples per bin on a log scale (a bin of 1 sample and one of 5,000 both visible), the
    ``min_count`` line, the accuracy and the mean confidence."""
    edges = curve.edges.double().cpu().numpy()
    counts = curve.counts.cpu().numpy().astype(np.float64)
    filled = counts > 0
    colors = np.where(counts[filled] >= min_count, "#7f7f7f", "#d9d9d9")
    ax.bar(edges[:-1][filled], counts[filled], width=np.diff(edges)[filled], align="edge",
           color=colors, edgecolor="black", linewidth=0.6)
    ax.set_yscale("log")
    top = max(float(counts.max()), 10.0)
    ax.set_ylim(0.7, top * 3)
    ax.axhline(min_count, color="0.4", linestyle=":", linewidth=0.8)
    ax.axvline(accuracy, color="#1f77b4", linestyle="-", linewidth=1.2, label="accuracy")
    ax.axvline(mean_conf, color="#d62728", linestyle="--", linewidth=1.2, label="avg. confidence")
    ax.set_xlim(0, 1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("samples")
    if legend:
        ax.legend(loc="upper left", fontsize=7)


def _pooled(curve: ReliabilityCurve) -> ReliabilityCurve:
    """One curve from the per-label curves (L, B) of ``task="multilabel"``: every (sample,
    label) entry of a bin together (counts summed, means weighted by the counts)."""
    counts = curve.counts.sum(dim=0)
    w = curve.counts.double()
    denom = torch.where(counts > 0, counts.double(), torch.full_like(w[0], float("nan")))
    return ReliabilityCurve(
        counts=counts,
        confidences=(curve.confidences.double().nan_to_num() * w).sum(dim=0) / denom,
        accuracies=(curve.accuracies.double().nan_to_num() * w).sum(dim=0) / denom,
        edges=curve.edges)


#: Axis labels and the corner's name of the ECE, by task.
_TASK_TEXT = {"multiclass": ("accuracy", "confidence", "ECE"),
              "binary": ("fraction of positives", "predicted probability", "ECE"),
              "multilabel": ("fraction of positives", "predicted probability",
                             "ECE (mean over labels)")}


def reliability_diagram(
    *,
    logits: Any = None,
    probs: Any = None,
    labels: Any,
    n_bins: int = 15,
    title: str | None = None,
    path: str | os.PathLike | None = None,
    ax: Any = None,
    hist_ax: Any = None,
    min_count: int = MIN_COUNT,
    legend: bool = True,
    task: str = "multiclass",
) -> Any:
    """Reliability diagram of the top-1 confidence with the samples per bin below it.

    Top panel: per equal-width bin (the ECE convention of :mod:`torchcal.metrics.binning`),
    the accuracy as a bar, the gap to the bin's mean confidence hatched (red above the bar
    where the bin is over-confident, orange as the bar's top part where it is
    under-confident), the diagonal, and the ECE in the corner.  A bin with fewer than ``min_count`` samples is drawn faded with its
    count written on it: its bar says little (a full-height bar may be a single sample).
    Bottom panel: the number of samples per bin on a log scale (faded below ``min_count``,
    dotted line at ``min_count``) with the accuracy and the average confidence as vertical
    lines.  When ``ax`` is given the reliability panel is drawn into it, and the count panel
    into ``hist_ax`` if given (the caller owns the figure).

    ``task="binary"`` draws the class-1 probability against the fraction of positives per
    bin (the ECE of ``ece(task="binary")``, torchmetrics' ``BinaryCalibrationError``);
    ``task="multilabel"`` draws every (sample, label) entry pooled in the same bins, with the
    mean over the labels of their binary ECE in the corner (``ece(task="multilabel")``).

    Args:
        logits: (N, C) scores.  Exactly one of ``logits`` / ``probs``.
        probs: (N, C) probabilities, rows summing to 1.
        labels: (N,) integer class indices.
        n_bins: number of equal-width bins.
        title: figure title.
        path: if given, the figure is also written there as PNG (atomically).
        ax: an existing matplotlib Axes to draw the reliability panel into.
        hist_ax: with ``ax``, an Axes for the count panel (below ``ax``, sharing its x-axis).
        min_count: bins with fewer samples are marked as sparse (default 20).
        legend: draw the legends.
        task: ``"multiclass"`` (default), ``"binary"`` or ``"multilabel"``, with the inputs
            of :mod:`torchcal.metrics.tasks`.

    Returns:
        The matplotlib ``Figure``.
    """
    check_positive_int(min_count, "min_count")
    inputs = {"logits": logits, "probs": probs, "labels": labels, "n_bins": n_bins,
              "task": task}
    curve = reliability_curve(**inputs)
    ece_value = float(ece(**inputs))
    if task == "multilabel":
        curve = _pooled(curve)
    ylabel, xlabel, ece_text = _TASK_TEXT[task]
    counts = curve.counts.double()
    n = float(counts.sum())
    filled = counts > 0
    mean_conf = float((curve.confidences.double()[filled] * counts[filled]).sum()) / n
    accuracy = float((curve.accuracies.double()[filled] * counts[filled]).sum()) / n
    if ax is not None:
        fig = ax.figure
        _draw_reliability(ax, curve, ece_value, min_count, legend, ylabel, ece_text)
        if hist_ax is not None:
            _draw_counts(hist_ax, curve, mean_conf, accuracy, min_count, legend=False,
                         xlabel=xlabel)
            ax.tick_params(labelbottom=False)
        else:
            ax.set_xlabel(xlabel)
        if title:
            ax.set_title(title)
    else:
        fig = _new_figure(4.5, 6.0)
        top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
        _draw_reliability(top, curve, ece_value, min_count, legend, ylabel, ece_text)
        _draw_counts(bottom, curve, mean_conf, accuracy, min_count, legend, xlabel)
        if title:
            top.set_title(title)
        fig.tight_layout()
    if path is not None:
        _atomic_write_png(fig, path)
    return fig


def smooth_reliability_diagram(
    *,
    logits: Any = None,
    probs: Any = None,
    labels: Any,
    sigma: float | None = None,
    title: str | None = None,
    path: str | os.PathLike | None = None,
    ax: Any = None,
) -> Any:
    """The smooth reliability curve (kernel-smoothed accuracy against top-1 confidence) and
    the density of the confidences, with the smooth ECE in the corner.

    Draws :func:`torchcal.metrics.smooth_reliability_curve`: the curve (blue) against the
    diagonal, and below it the confidences' density (grey, scaled to a fifth of the height)
    so a reader sees where the curve rests on many samples.  No bins to choose: the bandwidth
    is the smooth ECE's own (``sigma=None``) or the one given.

    Args:
        logits: (N, C) scores.  Exactly one of ``logits`` / ``probs``.
        probs: (N, C) probabilities, rows summing to 1.
        labels: (N,) integer class indices.
        sigma: kernel bandwidth; None: the smooth ECE's automatic bandwidth.
        title: axes title.
        path: if given, the figure is also written there as PNG (atomically).
        ax: an existing matplotlib Axes to draw into (the caller owns the figure).

    Returns:
        The matplotlib ``Figure``.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
        >>> fig = smooth_reliability_diagram(probs=probs, labels=torch.tensor([0, 1, 1, 0]))
        >>> fig.axes[0].texts[0].get_text()
        'smECE = 13.77% (σ = 0.139)'
    """
    curve = smooth_reliability_curve(logits=logits, probs=probs, labels=labels, sigma=sigma)
    t = curve.mesh.cpu().numpy()
    mu = curve.accuracies.double().cpu().numpy()
    dens = curve.density.double().cpu().numpy()
    if ax is None:
        fig = _new_figure(4.5, 4.5)
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    scale = 0.2 / max(float(dens.max()), 1e-12)
    ax.fill_between(t, 0.0, dens * scale, color="0.8", label="density of confidences")
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfect")
    ax.plot(t, mu, color=ACCURACY_COLOR, linewidth=2, label="smoothed accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize=7)
    _corner_label(ax, f"smECE = {100 * float(curve.smooth_ece):.2f}% (σ = {curve.sigma:.3f})")
    if title:
        ax.set_title(title)
    if path is not None:
        _atomic_write_png(fig, path)
    return fig


def risk_coverage_plot(
    curves: Any,
    *,
    title: str | None = None,
    path: str | os.PathLike | None = None,
    ax: Any = None,
) -> Any:
    """Risk-coverage curves of selective prediction, one line per predictor, with each one's
    AURC in the legend and, dotted, the curve of a perfect ranking of the first predictor's
    errors (every correct prediction accepted first).

    Args:
        curves: a mapping ``{name: (uncertainty, correct)}`` (each (N,), as
            :func:`torchcal.metrics.risk_coverage_curve` takes them), or one
            ``(uncertainty, correct)`` pair.
        title: the figure's title (None: none).
        path: where to write the figure as a PNG, atomically (None: not written).
        ax: an Axes of the caller's to draw into (None: a new figure).

    Returns:
        The matplotlib ``Figure`` (one Axes: risk in percent against coverage).

    Example:
        >>> import torch
        >>> u, c = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([1, 1, 0, 1])
        >>> fig = risk_coverage_plot({"entropy": (u, c)})
        >>> fig.axes[0].get_legend().get_texts()[0].get_text()
        'entropy (AURC 14.58%)'
    """
    if isinstance(curves, tuple) and len(curves) == 2:
        curves = {"model": curves}
    if not isinstance(curves, dict) or not curves:
        raise TypeError("Expected `curves` to be a non-empty mapping {name: (uncertainty, "
                        f"correct)}} or one (uncertainty, correct) pair, got {type(curves).__name__}")
    if ax is None:
        fig = _new_figure(5.0, 4.0)
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    first, top = None, 0.0
    for name, (uncertainty, correct) in curves.items():
        curve = risk_coverage_curve(uncertainty=uncertainty, correct=correct)
        # the first few points rest on a handful of samples (0% or 100%): leave them out of
        # the y-range so that the part of the curve a reader compares is not flattened
        settled = curve.risk[curve.coverage >= 0.05]
        top = max(top, float((settled if settled.numel() else curve.risk).max()))
        area = float(aurc(uncertainty=uncertainty, correct=correct))
        ax.plot(curve.coverage.cpu().numpy(), 100 * curve.risk.cpu().numpy(), linewidth=1.8,
                label=f"{name} (AURC {100 * area:.2f}%)")
        first = first or (uncertainty, correct)
    # the perfect ranking of the first predictor: its correct predictions first
    correct0 = np.asarray(first[1]).astype(bool)
    best = risk_coverage_curve(uncertainty=np.where(correct0, 0.0, 1.0), correct=correct0)
    ax.plot(best.coverage.numpy(), 100 * best.risk.numpy(), linestyle=":", color="gray",
            label="perfect ranking")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, min(100.0, 100 * 1.35 * max(top, 1e-3)))
    ax.set_xlabel("coverage (share of samples accepted, least uncertain first)")
    ax.set_ylabel("risk: error among accepted (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    if title:
        ax.set_title(title)
    if path is not None:
        _atomic_write_png(fig, path)
    return fig
