"""Report figures: reliability diagrams per loss, confidence histograms, OOD ROC curves and
AdaFocal's γ per bin over epochs.

Figures are built on :class:`matplotlib.figure.Figure` with the Agg canvas (no pyplot, no global
backend change) and written as PNG atomically.  Every function takes plain arrays, so the
figures can be made from any saved logits.
"""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._io import atomic_write_bytes
from ..plot import MIN_COUNT, reliability_diagram, reliability_legend_handles

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
    # deferred: matplotlib is slow to import: only when a figure is drawn (start-up time)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 100) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically; returns the path.

    Drawn once, at the figure's size: its constrained layout already keeps every label inside
    the canvas, so no ``bbox_inches="tight"`` (which lays the figure out and measures it once
    more before drawing: ~20% of a report figure's CPU, issue 43)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return atomic_write_bytes(path, buf.getvalue())


def _suptitle(fig, title: str, fontsize: float = 12.0) -> None:
    """``fig``'s title, each line wrapped to the figure's width (the figure is drawn at its own
    size: a longer line would be cut at the edges)."""
    chars = max(20, int(fig.get_figwidth() * 72 / (0.6 * fontsize)))
    lines = [textwrap.fill(line, chars) for line in title.split("\n")]
    fig.suptitle("\n".join(lines), fontsize=fontsize)


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


def _reliability_grid(fig, n_panels: int, ncols: int):
    """``n_panels`` (reliability axes, count axes) pairs in a grid, the counts under each."""
    nrows = max(1, -(-n_panels // ncols))
    grid = fig.add_gridspec(2 * nrows, ncols, height_ratios=[3, 1] * nrows)
    pairs = []
    for k in range(nrows * ncols):
        r, c = divmod(k, ncols)
        top = fig.add_subplot(grid[2 * r, c])
        bottom = fig.add_subplot(grid[2 * r + 1, c], sharex=top)
        if k >= n_panels:
            top.set_visible(False)
            bottom.set_visible(False)
        pairs.append((top, bottom))
    return pairs[:n_panels]


def reliability_pair(
    pre_logits: np.ndarray, post_logits: np.ndarray, labels: np.ndarray, *, n_bins: int = 15,
    title: str = "", temperature: float | None = None,
):
    """Two reliability diagrams side by side, before and after temperature scaling, each with
    its samples per bin below (:func:`~torchcal.plot.reliability_diagram`)."""
    fig = new_figure(8.0, 5.2)
    (a0, h0), (a1, h1) = _reliability_grid(fig, 2, 2)
    t = f" (T={temperature:.2f})" if temperature is not None else ""
    reliability_diagram(logits=pre_logits, labels=labels, n_bins=n_bins, title="pre T", ax=a0,
                        hist_ax=h0, legend=False)
    reliability_diagram(logits=post_logits, labels=labels, n_bins=n_bins, title=f"post T{t}",
                        ax=a1, hist_ax=h1, legend=False)
    _legend_below(fig)
    if title:
        _suptitle(fig, title)
    return fig


def _legend_below(fig) -> None:
    """One legend of the reliability bars under the panels, where it covers no bar (inside a
    panel it covered a sparse bin's bar, e.g. a one-sample bin of accuracy 1)."""
    sparse = any(c.get_label().startswith("< ") for ax in fig.axes for c in ax.containers)
    handles = reliability_legend_handles(MIN_COUNT, sparse)
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8,
               frameon=False)


def reliability_overview(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray]], *, n_bins: int = 15, title: str = "",
):
    """All losses' reliability diagrams in one grid, each with its samples per bin below:
    ``{label: (logits, labels)}``."""
    names = list(curves)
    ncols = min(5, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    fig = new_figure(3.0 * ncols, 3.9 * nrows)
    for name, (ax, hax) in zip(names, _reliability_grid(fig, len(names), ncols), strict=True):
        z, y = curves[name]
        reliability_diagram(logits=z, labels=y, n_bins=n_bins, title=name, ax=ax, hist_ax=hax,
                            legend=False)
        ax.title.set_fontsize(9)
        for a in (ax, hax):
            a.tick_params(labelsize=7)
            a.yaxis.label.set_fontsize(8)
            a.xaxis.label.set_fontsize(8)
    _legend_below(fig)
    if title:
        _suptitle(fig, title)
    return fig


def confidence_histograms(
    confidences: Mapping[str, np.ndarray], *, n_bins: int = 15, title: str = "",
    accuracies: Mapping[str, float] | None = None,
):
    """One small panel per loss: the histogram of top-1 confidences (share of samples per bin),
    the mean confidence (dashed) and, if given, the accuracy (solid): their gap is the
    over-confidence.  Every panel has the same y-scale."""
    names = list(confidences)
    ncols = min(5, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    fig = new_figure(2.6 * ncols, 2.2 * nrows)
    # one y-scale for every panel: the shares of samples compare across losses at a glance
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False, sharey=True)).ravel()
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
        _suptitle(fig, title)
    fig.supxlabel("confidence (dashed: mean confidence"
                  + (", solid: accuracy)" if accuracies is not None else ")"), fontsize=9)
    fig.supylabel("share of samples", fontsize=9)
    return fig


def roc_figure(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray, float]], *, title: str = "",
    reference: str | None = None,
):
    """OOD ROC curves as small multiples: ``{label: (fpr, tpr, auroc)}`` or
    ``{label: (fpr, tpr, auroc, auroc_std)}``.

    One panel per loss with its curve in a strong colour over every other loss' curve in light
    grey, the ``reference`` loss (default: the first label) dashed, the chance diagonal dotted,
    and the AUROC (in %) in the panel title: each curve can be read on its own and against the
    others, however many losses there are.
    """
    names = list(curves)
    if reference is None and names:
        reference = names[0]
    ncols = min(5, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    fig = new_figure(2.5 * ncols + 0.4, 2.55 * nrows + 0.5)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False, sharex=True,
                                      sharey=True)).ravel()
    for ax, name in zip(axes, names, strict=False):
        for other in names:
            if other not in (name, reference):
                fpr, tpr = curves[other][:2]
                ax.plot(fpr, tpr, color="0.82", lw=0.7, zorder=1)
        ax.plot([0, 1], [0, 1], color="0.6", lw=0.7, ls=":", zorder=1)
        if reference in curves and reference != name:
            fpr, tpr = curves[reference][:2]
            ax.plot(fpr, tpr, color="0.25", lw=1.0, ls="--", zorder=2)
        fpr, tpr, auc, *rest = curves[name]
        ax.plot(fpr, tpr, color="#1f4e9c", lw=1.8, zorder=3)
        spread = f" ± {100 * rest[0]:.1f}" if rest and np.isfinite(rest[0]) else ""
        ax.set_title(f"{name}\nAUROC {100 * auc:.1f}{spread}%", fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.01)
        ax.set_aspect("equal")
        ax.tick_params(labelsize=7)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    for ax in axes[max(0, len(names) - ncols):len(names)]:
        ax.tick_params(labelbottom=True)  # the lowest panel of each column
    fig.supxlabel("false positive rate (in-distribution flagged)", fontsize=9)
    fig.supylabel("true positive rate (OOD detected)", fontsize=9)
    if title:
        sub = (f"\nblue: the panel's loss; dashed: {reference}; grey: the other losses"
               if len(names) > 1 else "")
        _suptitle(fig, title + sub, fontsize=10)
    return fig


def gamma_history_figure(
    histories: Mapping[str, np.ndarray], *, title: str = "", gamma_max: float | None = None,
):
    """AdaFocal's γ per bin over epochs, one panel per run: ``{run label: array (E, B)}``.

    Row e holds the B per-bin γ values in force after epoch e's update (bin 0 = lowest
    confidence); each bin is one line, coloured from dark (low bins) to light (high bins).
    Every panel has the same y-scale and the same γ_max mark, so the panels compare at a
    glance: a dashed line at ``gamma_max`` when some run reaches half of it, else a note that
    γ_max lies above the scale (so the curves are not flattened against 0).
    """
    # deferred: matplotlib is slow to import: only when a figure is drawn (start-up time)
    import matplotlib

    names = [n for n in histories if np.asarray(histories[n]).ndim == 2
             and np.asarray(histories[n]).size]
    ncols = min(3, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    fig = new_figure(4.2 * ncols, 3.2 * nrows)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False, sharey=True)).ravel()
    cmap = matplotlib.colormaps["viridis"]
    hists = [np.asarray(histories[n], dtype=np.float64) for n in names]
    # γ_max is inside the common scale when some run comes near it, else named off the scale on
    # every panel (drawn at 20 over data near 1, the curves would be flat lines)
    data_hi = max([float(np.nanmax(h)) for h in hists if np.isfinite(h).any()], default=0.0)
    show_max = gamma_max is not None and data_hi >= 0.5 * gamma_max
    lo, hi = _gamma_limits(hists, gamma_max if show_max else None)
    for ax, name in zip(axes, names, strict=False):
        h = np.asarray(histories[name], dtype=np.float64)
        E, B = h.shape
        x = np.arange(1, E + 1)
        for b in range(B):
            ax.plot(x, h[:, b], color=cmap(b / max(B - 1, 1)), lw=1.0)
        ax.axhline(0.0, color="0.5", lw=0.6, ls=":")
        if show_max:
            ax.axhline(gamma_max, color="#C44E52", lw=0.9, ls="--")
            ax.text(0.02, gamma_max, f"γ_max = {gamma_max:g}", color="#C44E52", fontsize=7,
                    va="bottom", ha="left", transform=ax.get_yaxis_transform())
        elif gamma_max is not None:
            ax.text(0.02, 0.97, f"γ_max = {gamma_max:g}: above this scale", color="#C44E52",
                    fontsize=7, va="top", ha="left", transform=ax.transAxes)
        ax.set_ylim(lo, hi)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.set_ylabel("γ", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    if names:
        # deferred: matplotlib is slow to import: only when a figure is drawn (start-up time)
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        B = max(np.asarray(histories[n]).shape[-1] for n in names)
        sm = ScalarMappable(norm=Normalize(0, max(B - 1, 1)), cmap=cmap)
        cb = fig.colorbar(sm, ax=list(axes), fraction=0.03, pad=0.06)
        cb.set_label("bin (0: lowest confidence)", fontsize=8)
        cb.ax.tick_params(labelsize=7)
    if title:
        _suptitle(fig, title)
    return fig


def _gamma_limits(hists: list[np.ndarray], gamma_max: float | None) -> tuple[float, float]:
    """One y-range for every γ panel: the data of all panels, 0 and γ_max, with a margin.

    >>> _gamma_limits([np.array([[1.0, 2.0]]), np.array([[-1.0, 5.0]])], 20.0)
    (-2.05, 21.05)
    """
    vals = [float(v) for h in hists for v in (np.nanmin(h), np.nanmax(h)) if np.isfinite(v)]
    vals += [0.0] + ([float(gamma_max)] if gamma_max is not None else [])
    lo, hi = min(vals), max(vals)
    pad = 0.05 * (hi - lo) if hi > lo else 1.0
    return lo - pad, hi + pad
