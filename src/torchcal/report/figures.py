"""Report figures: reliability diagrams per loss, confidence histograms, OOD ROC curves and
AdaFocal's γ per bin over epochs.

Figures are built on :class:`matplotlib.figure.Figure` with the Agg canvas (no pyplot, no global
backend change) and written as PNG atomically.  Every function takes plain arrays, so the
figures can be made from any saved logits.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._io import atomic_write_bytes

__all__ = [
    "new_figure",
    "save_figure",
    "roc_curve",
    "reliability_pair",
    "reliability_overview",
    "confidence_histograms",
    "roc_figure",
    "gamma_history_figure",
]


def new_figure(width: float, height: float):
    """A matplotlib Figure (constrained layout) with an Agg canvas attached (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 100) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically; returns the path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def _softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def roc_curve(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ROC curve ``(fpr, tpr)`` of ``scores`` (higher = positive) with tied scores taken together.

    Starts at (0, 0) and ends at (1, 1).

    >>> fpr, tpr = roc_curve(np.array([0.9, 0.8, 0.8, 0.1]), np.array([1, 1, 0, 0]))
    >>> fpr.tolist(), tpr.tolist()
    ([0.0, 0.0, 0.5, 1.0], [0.0, 0.5, 1.0, 1.0])
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(positive).astype(bool)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), s.size - 1]  # last index of each tie block
    tp = np.cumsum(y)[last]
    fp = np.cumsum(~y)[last]
    P, N = max(int(y.sum()), 1), max(int((~y).sum()), 1)
    return np.r_[0.0, fp / N], np.r_[0.0, tp / P]


def reliability_pair(
    pre_logits: np.ndarray, post_logits: np.ndarray, labels: np.ndarray, *, n_bins: int = 15,
    title: str = "", temperature: float | None = None,
):
    """Two reliability diagrams side by side: before and after temperature scaling."""
    from .plots import reliability_diagram

    fig = new_figure(8.0, 3.9)
    axes = fig.subplots(1, 2)
    t = f" (T={temperature:.2f})" if temperature is not None else ""
    reliability_diagram(logits=pre_logits, labels=labels, n_bins=n_bins, title="pre T", ax=axes[0])
    reliability_diagram(logits=post_logits, labels=labels, n_bins=n_bins, title=f"post T{t}",
                        ax=axes[1])
    if title:
        fig.suptitle(title)
    return fig


def reliability_overview(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray]], *, n_bins: int = 15, title: str = "",
):
    """All losses' reliability diagrams in one grid: ``{label: (logits, labels)}``."""
    from .plots import reliability_diagram

    names = list(curves)
    ncols = min(5, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    fig = new_figure(3.0 * ncols, 3.0 * nrows)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, name in zip(axes, names, strict=False):
        z, y = curves[name]
        reliability_diagram(logits=z, labels=y, n_bins=n_bins, title=name, ax=ax)
        ax.title.set_fontsize(9)
        ax.tick_params(labelsize=7)
        ax.yaxis.label.set_fontsize(8)
        leg = ax.get_legend()
        if leg is not None and ax is not axes[0]:
            leg.remove()
    for ax in axes[len(names):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def confidence_histograms(
    confidences: Mapping[str, np.ndarray], *, n_bins: int = 15, title: str = "",
    accuracies: Mapping[str, float] | None = None,
):
    """One small panel per loss: the histogram of top-1 confidences (share of samples per bin),
    the mean confidence (dashed) and, if given, the accuracy (solid): their gap is the
    over-confidence."""
    names = list(confidences)
    ncols = min(5, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    fig = new_figure(2.6 * ncols, 2.2 * nrows)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    for ax, name in zip(axes, names, strict=False):
        c = np.asarray(confidences[name], dtype=np.float64)
        w = np.full(c.shape, 1.0 / max(c.size, 1))
        ax.hist(c, bins=edges, weights=w, color="#4C72B0", edgecolor="white")
        ax.axvline(c.mean() if c.size else 0.0, color="#C44E52", lw=1.2, ls="--")
        if accuracies is not None and name in accuracies:
            ax.axvline(float(accuracies[name]), color="#1f3f6f", lw=1.2)
        ax.set_title(name, fontsize=9)
        ax.set_xlim(0, 1)
        ax.tick_params(labelsize=7)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.supxlabel("confidence (dashed: mean confidence"
                  + (", solid: accuracy)" if accuracies is not None else ")"), fontsize=9)
    fig.supylabel("share of samples", fontsize=9)
    return fig


def roc_figure(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray, float]], *, title: str = ""
):
    """ROC curves, one per loss: ``{label: (fpr, tpr, auroc)}``."""
    fig = new_figure(5.2, 4.6)
    ax = fig.subplots()
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    for i, (name, (fpr, tpr, auc)) in enumerate(curves.items()):
        ax.plot(fpr, tpr, lw=1.3, color=cmap(i % 20), label=f"{name} ({100 * auc:.1f})")
    ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls=":")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("false positive rate (in-distribution flagged)")
    ax.set_ylabel("true positive rate (OOD detected)")
    ax.legend(fontsize=7, loc="lower right", title="loss (AUROC %)", title_fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def gamma_history_figure(
    histories: Mapping[str, np.ndarray], *, title: str = "", gamma_max: float | None = None,
):
    """AdaFocal's γ per bin over epochs, one panel per run: ``{run label: array (E, B)}``.

    Row e holds the B per-bin γ values in force after epoch e's update (bin 0 = lowest
    confidence); each bin is one line, coloured from dark (low bins) to light (high bins).
    """
    import matplotlib

    names = list(histories)
    ncols = min(3, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    fig = new_figure(4.2 * ncols, 3.2 * nrows)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    cmap = matplotlib.colormaps["viridis"]
    for ax, name in zip(axes, names, strict=False):
        h = np.asarray(histories[name], dtype=np.float64)
        if h.ndim != 2 or h.size == 0:
            ax.set_visible(False)
            continue
        E, B = h.shape
        x = np.arange(1, E + 1)
        for b in range(B):
            ax.plot(x, h[:, b], color=cmap(b / max(B - 1, 1)), lw=1.0)
        ax.axhline(0.0, color="0.5", lw=0.6, ls=":")
        if gamma_max is not None and np.nanmax(h) >= 0.5 * gamma_max:
            ax.axhline(gamma_max, color="#C44E52", lw=0.8, ls="--")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.set_ylabel("γ", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    if names:
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        B = max(np.asarray(histories[n]).shape[-1] for n in names)
        sm = ScalarMappable(norm=Normalize(0, max(B - 1, 1)), cmap=cmap)
        cb = fig.colorbar(sm, ax=list(axes), fraction=0.03, pad=0.02)
        cb.set_label("bin (0: lowest confidence)", fontsize=8)
        cb.ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title)
    return fig

