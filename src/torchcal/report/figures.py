"""Report figures: reliability diagrams per loss, confidence histograms, OOD ROC curves and
AdaFocal's γ per bin over epochs.

Figures are built on :class:`matplotlib.figure.Figure` with the Agg canvas (no pyplot, no global
backend change) and written as PNG atomically.  Every function takes plain arrays, so the
figures can be made from any saved logits.

Each figure is laid out once, by hand, in inches (:class:`Grid`: equal cells of panels, the
margins for the tick labels, titles and legends fixed by their font sizes), not by matplotlib's
constrained layout: that measured every text of the figure and drew it once more before each
save, half of a report figure's CPU (issue 43).  Only the panels drawn are created.
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
    "Grid",
    "title_height",
    "save_figure",
    "roc_curve",
    "reliability_pair",
    "reliability_overview",
    "confidence_histograms",
    "roc_figure",
    "gamma_history_figure",
    "line_height",
    "wrap_title",
    "legend_columns",
    "gamma_limits",
    "LEGEND_ENTRIES",
    "OVERVIEW_CELL",
]


def new_figure(width: float, height: float, *, layout: str | None = "constrained"):
    """A matplotlib Figure with an Agg canvas attached (no pyplot); ``layout``: its layout
    engine (default constrained: every label kept inside; ``None`` for a figure placed by
    hand, e.g. with :class:`Grid`, which is drawn once per save)."""
    # deferred: matplotlib is slow to import: only when a figure is drawn (start-up time)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout=layout)
    FigureCanvasAgg(fig)
    return fig


#: The height in inches of one line of text of a font size in points (1.2 line spacing).
def line_height(fontsize: float) -> float:
    return 1.2 * fontsize / 72


class Grid:
    """A figure of ``n`` equal cells (``ncols`` per row, filled row by row) laid out by hand, in
    inches: a cell is ``cell`` = (width, height); ``top`` inches above the cells (the title),
    ``bottom`` below them (a legend or a shared x label) and ``left`` on their left (a shared
    y label); ``right`` on their right.  :meth:`axes` places an Axes inside a cell."""

    def __init__(self, n: int, ncols: int, cell: tuple[float, float], *, top: float = 0.0,
                 bottom: float = 0.0, left: float = 0.0, right: float = 0.0) -> None:
        self.n, self.ncols = n, ncols
        self.nrows = max(1, -(-n // ncols))
        self.cell, self.top, self.bottom, self.left = cell, top, bottom, left
        self.width = left + min(max(n, 1), ncols) * cell[0] + right
        self.height = top + self.nrows * cell[1] + bottom
        self.fig = new_figure(self.width, self.height, layout=None)

    def axes(self, k: int, x: float, y: float, w: float, h: float, **kwargs):
        """An Axes in cell ``k``: lower-left corner (``x``, ``y``) inches from the cell's,
        ``w`` x ``h`` inches."""
        r, c = divmod(k, self.ncols)
        x0 = self.left + c * self.cell[0] + x
        y0 = self.bottom + (self.nrows - 1 - r) * self.cell[1] + y
        return self.fig.add_axes((x0 / self.width, y0 / self.height, w / self.width,
                                  h / self.height), **kwargs)

    def last_in_column(self, k: int) -> bool:
        """Whether panel ``k`` is the lowest of its column."""
        return k + self.ncols >= self.n

    def suptitle(self, title: str, fontsize: float = 12.0) -> None:
        """The figure's title at its top (:meth:`title_height` inches tall)."""
        if title:
            self.fig.suptitle(wrap_title(self.width, title, fontsize), fontsize=fontsize,
                              y=1 - 0.06 / self.height, va="top")

    def supxlabel(self, text: str, fontsize: float = 9.0) -> None:
        """A label under every panel, at the figure's bottom."""
        self.fig.supxlabel(text, fontsize=fontsize, y=0.06 / self.height, va="bottom")

    def supylabel(self, text: str, fontsize: float = 9.0) -> None:
        """A label left of every panel, at the figure's left edge."""
        self.fig.supylabel(text, fontsize=fontsize, x=0.06 / self.width, ha="left")


def title_height(width: float, title: str, fontsize: float = 12.0) -> float:
    """The inches a figure title of ``width`` inches takes at its top (0 for none)."""
    if not title:
        return 0.0
    return 0.16 + line_height(fontsize) * wrap_title(width, title, fontsize).count("\n") + line_height(fontsize)


def wrap_title(width: float, title: str, fontsize: float) -> str:
    """``title``, each line wrapped to ``width`` inches (the figure is drawn at its own size:
    a longer line would be cut at the edges)."""
    chars = max(20, int(width * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars) for line in title.split("\n"))


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 100) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically; returns the path.

    Drawn once, at the figure's size: no ``bbox_inches="tight"`` (which lays the figure out and
    measures it once more before drawing, issue 43); the report's figures are laid out by hand
    (:class:`Grid`), so nothing is measured before the one draw."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return atomic_write_bytes(path, buf.getvalue())


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


#: The reliability panels' geometry in inches: (cell width, cell height, space left of the axes
#: for the y label and tick labels, space under the count axes for the x label and tick labels,
#: the count axes' height, the space above the reliability axes for the panel title); the
#: pair's panels have matplotlib's default font sizes, the overview's smaller ones.
_PAIR_CELL = (4.0, 4.6, 0.7, 0.55, 0.85, 0.35)
OVERVIEW_CELL = (3.0, 3.75, 0.55, 0.42, 0.7, 0.3)


def _reliability_grid(n_panels: int, ncols: int, cell: tuple[float, ...], title: str,
                      title_size: float = 12.0) -> tuple[Grid, list]:
    """A :class:`Grid` of ``n_panels`` (reliability axes, count axes) pairs, the counts under
    each, a legend row under the panels and ``title`` above them."""
    cw, ch, left, bottom, hist_h, head = cell
    width = min(max(n_panels, 1), ncols) * cw + 0.15
    legend_rows = -(-LEGEND_ENTRIES // legend_columns(width))
    grid = Grid(n_panels, ncols, (cw, ch), top=title_height(width, title, title_size),
                bottom=0.15 + line_height(8.0) * 1.25 * legend_rows, right=0.15)
    w = cw - left - 0.15
    pairs = []
    for k in range(n_panels):
        bottom_ax = grid.axes(k, left, bottom, w, hist_h)
        top_y = bottom + hist_h + 0.1
        top_ax = grid.axes(k, left, top_y, w, ch - top_y - head, sharex=bottom_ax)
        pairs.append((top_ax, bottom_ax))
    grid.suptitle(title, title_size)
    return grid, pairs


def reliability_pair(
    pre_logits: np.ndarray, post_logits: np.ndarray, labels: np.ndarray, *, n_bins: int = 15,
    title: str = "", temperature: float | None = None,
):
    """Two reliability diagrams side by side, before and after temperature scaling, each with
    its samples per bin below (:func:`~torchcal.plot.reliability_diagram`)."""
    grid, ((a0, h0), (a1, h1)) = _reliability_grid(2, 2, _PAIR_CELL, title)
    t = f" (T={temperature:.2f})" if temperature is not None else ""
    reliability_diagram(logits=pre_logits, labels=labels, n_bins=n_bins, title="pre T", ax=a0,
                        hist_ax=h0, legend=False)
    reliability_diagram(logits=post_logits, labels=labels, n_bins=n_bins, title=f"post T{t}",
                        ax=a1, hist_ax=h1, legend=False)
    _legend_below(grid.fig)
    return grid.fig


def _legend_below(fig) -> None:
    """One legend of the reliability bars under the panels, where it covers no bar (inside a
    panel it covered a sparse bin's bar, e.g. a one-sample bin of accuracy 1)."""
    sparse = any(c.get_label().startswith("< ") for ax in fig.axes for c in ax.containers)
    handles = reliability_legend_handles(MIN_COUNT, sparse)
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(handles), legend_columns(fig.get_figwidth())), fontsize=8,
               frameon=False)


#: The most entries of the reliability legend (:func:`~torchcal.plot.reliability_legend_handles`)
LEGEND_ENTRIES = 5


def legend_columns(width: float) -> int:
    """The reliability legend's entries side by side in a figure ``width`` inches wide (its
    widest entry, "gap: under-confident" at 8 pt with its patch, takes about 1.45 inches)."""
    return max(1, min(LEGEND_ENTRIES, int(width / 1.45)))


def reliability_overview(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray]], *, n_bins: int = 15, title: str = "",
):
    """All losses' reliability diagrams in one grid, each with its samples per bin below:
    ``{label: (logits, labels)}``."""
    names = list(curves)
    ncols = min(5, max(1, len(names)))
    grid, pairs = _reliability_grid(len(names), ncols, OVERVIEW_CELL, title)
    for name, (ax, hax) in zip(names, pairs, strict=True):
        z, y = curves[name]
        reliability_diagram(logits=z, labels=y, n_bins=n_bins, title=name, ax=ax, hist_ax=hax,
                            legend=False)
        ax.title.set_fontsize(9)
        for a in (ax, hax):
            a.tick_params(labelsize=7)
            a.yaxis.label.set_fontsize(8)
            a.xaxis.label.set_fontsize(8)
    _legend_below(grid.fig)
    return grid.fig


def confidence_histograms(
    confidences: Mapping[str, np.ndarray], *, n_bins: int = 15, title: str = "",
    accuracies: Mapping[str, float] | None = None,
):
    """One small panel per loss: the histogram of top-1 confidences (share of samples per bin),
    the mean confidence (dashed) and, if given, the accuracy (solid): their gap is the
    over-confidence.  Every panel has the same y-scale."""
    names = list(confidences)
    ncols = min(5, max(1, len(names)))
    width = 0.3 + min(max(len(names), 1), ncols) * 2.6 + 0.1
    grid = Grid(len(names), ncols, (2.6, 2.0), top=title_height(width, title), bottom=0.32,
                left=0.3, right=0.1)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    first = None
    for k, name in enumerate(names):
        # one y-scale for every panel: the shares of samples compare across losses at a glance
        ax = grid.axes(k, 0.35, 0.3, 2.6 - 0.35 - 0.12, 2.0 - 0.3 - 0.28, sharey=first)
        first = first or ax
        c = np.asarray(confidences[name], dtype=np.float64)
        w = np.full(c.shape, 1.0 / max(c.size, 1))
        ax.hist(c, bins=edges, weights=w, color="#4C72B0", edgecolor="white")
        ax.axvline(c.mean() if c.size else 0.0, color="#C44E52", lw=1.2, ls="--")
        if accuracies is not None and name in accuracies:
            ax.axvline(float(accuracies[name]), color="#1f3f6f", lw=1.2)
        ax.set_title(name, fontsize=9)
        ax.set_xlim(0, 1)
        ax.tick_params(labelsize=7, labelleft=k % ncols == 0)
    grid.suptitle(title)
    grid.supxlabel("confidence (dashed: mean confidence"
                   + (", solid: accuracy)" if accuracies is not None else ")"))
    grid.supylabel("share of samples")
    return grid.fig


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
    if title and len(names) > 1:
        title += f"\nblue: the panel's loss; dashed: {reference}; grey: the other losses"
    width = 0.35 + min(max(len(names), 1), ncols) * 2.5 + 0.1
    grid = Grid(len(names), ncols, (2.5, 2.55), top=title_height(width, title, 10.0),
                bottom=0.32, left=0.35, right=0.1)
    first = None
    for k, name in enumerate(names):
        ax = grid.axes(k, 0.4, 0.3, 1.9, 1.87, sharex=first, sharey=first)
        first = first or ax
        _roc_panel(ax, curves, name, reference)
        ax.tick_params(labelsize=7, labelleft=k % ncols == 0,
                       labelbottom=grid.last_in_column(k))  # the lowest panel of each column
    grid.supxlabel("false positive rate (in-distribution flagged)")
    grid.supylabel("true positive rate (OOD detected)")
    grid.suptitle(title, 10.0)
    return grid.fig


def _roc_panel(ax, curves: Mapping[str, tuple], name: str, reference: str | None) -> None:
    """One ROC panel: ``name``'s curve over the others' in grey and ``reference``'s dashed."""
    for other in curves:
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
    width = min(max(len(names), 1), ncols) * 4.2 + 0.85
    grid = Grid(len(names), ncols, (4.2, 3.2), top=title_height(width, title), right=0.85)
    cmap = matplotlib.colormaps["viridis"]
    hists = [np.asarray(histories[n], dtype=np.float64) for n in names]
    # γ_max is inside the common scale when some run comes near it, else named off the scale on
    # every panel (drawn at 20 over data near 1, the curves would be flat lines)
    data_hi = max([float(np.nanmax(h)) for h in hists if np.isfinite(h).any()], default=0.0)
    show_max = gamma_max is not None and data_hi >= 0.5 * gamma_max
    lo, hi = gamma_limits(hists, gamma_max if show_max else None)
    first = None
    for k, (name, h) in enumerate(zip(names, hists, strict=True)):
        ax = grid.axes(k, 0.5, 0.42, 4.2 - 0.5 - 0.15, 3.2 - 0.42 - 0.28, sharey=first)
        first = first or ax
        _gamma_panel(ax, h, cmap, gamma_max, show_max)
        ax.set_ylim(lo, hi)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7, labelleft=k % ncols == 0)
    if names:
        _gamma_colorbar(grid, max(h.shape[-1] for h in hists), cmap)
    grid.suptitle(title)
    return grid.fig


def _gamma_panel(ax, h: np.ndarray, cmap, gamma_max: float | None, show_max: bool) -> None:
    """One run's γ per bin over epochs (:func:`gamma_history_figure`)."""
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
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("epoch", fontsize=8)
    ax.set_ylabel("γ", fontsize=8)


def _gamma_colorbar(grid: Grid, n_bins: int, cmap) -> None:
    """The bins' colour scale right of the γ panels, as tall as their axes."""
    # deferred: matplotlib is slow to import: only when a figure is drawn (start-up time)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    x = grid.left + grid.ncols * grid.cell[0] + 0.05
    y, h = grid.bottom + 0.42, grid.nrows * grid.cell[1] - 0.42 - 0.28
    cax = grid.fig.add_axes((x / grid.width, y / grid.height, 0.13 / grid.width, h / grid.height))
    sm = ScalarMappable(norm=Normalize(0, max(n_bins - 1, 1)), cmap=cmap)
    cb = grid.fig.colorbar(sm, cax=cax)
    cb.set_label("bin (0: lowest confidence)", fontsize=8)
    cb.ax.tick_params(labelsize=7)


def gamma_limits(hists: list[np.ndarray], gamma_max: float | None) -> tuple[float, float]:
    """One y-range for every γ panel: the data of all panels, 0 and γ_max, with a margin.

    >>> gamma_limits([np.array([[1.0, 2.0]]), np.array([[-1.0, 5.0]])], 20.0)
    (-2.05, 21.05)
    """
    vals = [float(v) for h in hists for v in (np.nanmin(h), np.nanmax(h)) if np.isfinite(v)]
    vals += [0.0] + ([float(gamma_max)] if gamma_max is not None else [])
    lo, hi = min(vals), max(vals)
    pad = 0.05 * (hi - lo) if hi > lo else 1.0
    return lo - pad, hi + pad
