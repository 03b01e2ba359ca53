"""The report's default figures as standalone SVG, written by hand: no matplotlib (issue 43).

Drawing the four default figures with matplotlib cost about 2.4 s of CPU in a demo, 11-14 %
of ``torchcal demo --quick``: its import and first text alone 0.5 s.  These writers format
the same panels as :mod:`torchcal.report.figures` (same data, layout in inches, colours, line
styles, fonts) as SVG text: rectangles, lines, polylines and text, with axes, ticks, tick
labels, axis labels, titles and legends; a browser draws them.  Nothing is measured: text
widths are estimated (0.6 em per character), and the layout leaves room for them.

Each panel is a ``<g class="panel">`` carrying its name (``data-name``) and its axes' data
limits (``data-xlim``, ``data-ylim``, ``data-yscale``) over its frame (``<rect
class="frame">``), so a reader (or a test) can map every bar and line back to its data.

:func:`reliability_overview`, :func:`confidence_histograms`, :func:`roc_figure` and
:func:`gamma_history_figure` take the arguments of their :mod:`~torchcal.report.figures`
namesakes and return an :class:`Svg`; :func:`save_svg` writes it atomically.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .._io import atomic_write_bytes
from ..metrics.calibration import ece, reliability_curve
from ..plot import ACCURACY_COLOR, MIN_COUNT, OVER_COLOR, UNDER_COLOR
from .figures import (
    LEGEND_ENTRIES,
    OVERVIEW_CELL,
    gamma_limits,
    legend_columns,
    line_height,
    title_height,
    wrap_title,
)

__all__ = ["Svg", "Axes", "save_svg", "nice_ticks", "viridis", "reliability_overview",
           "confidence_histograms", "roc_figure", "gamma_history_figure"]

#: Pixels (SVG user units) per inch; a figure of W x H inches is W*PX x H*PX px.
PX = 100.0
FONT = "DejaVu Sans, Bitstream Vera Sans, Verdana, Arial, Helvetica, sans-serif"
#: A character's estimated width in em (DejaVu Sans' digits and lower case: about 0.6).
EM_WIDTH = 0.6
#: Tick labels' font size in points (matplotlib's small size in the report's panels).
TICK_SIZE = 7.0


def _pt(size: float) -> float:
    """Points in pixels."""
    return size * PX / 72.0


def _esc(s: str) -> str:
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _dash(ls: str | None, lw: float) -> str:
    """The stroke-dasharray of a matplotlib line style at width ``lw`` points."""
    w = _pt(lw)
    if ls == "--":
        return f' stroke-dasharray="{3.7 * w:.2f},{1.6 * w:.2f}"'
    if ls == ":":
        return f' stroke-dasharray="{w:.2f},{1.65 * w:.2f}"'
    return ""


def _stroke(color: str, lw: float, ls: str | None = None) -> str:
    return f'stroke="{color}" stroke-width="{_pt(lw):.2f}"{_dash(ls, lw)}'


def text_width(s: str, size: float) -> float:
    """The estimated width in px of the longest line of ``s`` at ``size`` points."""
    return EM_WIDTH * _pt(size) * max((len(line) for line in s.split("\n")), default=0)


_VIRIDIS = ("#440154", "#48186a", "#472d7b", "#424086", "#3b528b", "#33638d", "#2c728e",
            "#26828e", "#21918c", "#1fa088", "#28ae80", "#3fbc73", "#5ec962", "#84d44b",
            "#addc30", "#d8e219", "#fde725")  # matplotlib's viridis at 0, 1/16, ..., 1


def viridis(t: float) -> str:
    """matplotlib's viridis colour at ``t`` in [0, 1] (linear between 17 of its colours).

    >>> viridis(0.0), viridis(1.0)
    ('#440154', '#fde725')
    """
    t = min(max(float(t), 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    f = t - i
    a, b = _VIRIDIS[i], _VIRIDIS[i + 1]
    rgb = [round((1 - f) * int(a[k:k + 2], 16) + f * int(b[k:k + 2], 16)) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def nice_ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    """About ``n`` round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) in
    [``lo``, ``hi``]; ``integer``: steps of at least 1.

    >>> nice_ticks(0, 1)
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    >>> nice_ticks(0.55, 15.45, integer=True)
    [5.0, 10.0, 15.0]
    """
    span = hi - lo
    if not (math.isfinite(span) and span > 0):
        return [float(lo)] if math.isfinite(lo) else []
    raw = span / max(n, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + 1e-9 * span:
        ticks.append(round(k * step, 12) + 0.0)
        k += 1
    return ticks


def _tick_label(v: float, ticks: Sequence[float]) -> str:
    """``v`` with the decimals its ticks' step needs; a minus sign as matplotlib's."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    d = next((d for d in range(7) if abs(round(step, d) - step) <= 1e-9 * max(step, 1)), 6)
    s = f"{v:.{d}f}"
    return ("\u2212" + s[1:]) if s.startswith("-") and float(s) != 0 else s.lstrip("-")


_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076"
                             "\u2077\u2078\u2079")


class Svg:
    """An SVG document of ``width`` x ``height`` inches being written: :meth:`text`,
    :meth:`add` (raw elements), :meth:`axes`; :meth:`to_bytes` closes it.  Positions given
    in inches are from the figure's lower-left corner (as matplotlib's), in px from its
    upper-left (as SVG's)."""

    def __init__(self, width: float, height: float) -> None:
        self.width, self.height = float(width), float(height)
        self.W, self.H = self.width * PX, self.height * PX
        self.defs: list[str] = []
        self.body: list[str] = []
        self._ids = 0

    def uid(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}{self._ids}"

    def add(self, element: str) -> None:
        self.body.append(element)

    def text(self, x: float, y: float, s: str, size: float, *, anchor: str = "middle",
             va: str = "baseline", color: str = "#000", rotate: float = 0.0,
             cls: str | None = None, out: list[str] | None = None) -> None:
        """Text at (``x``, ``y``) px; ``va``: which of its lines' box edge is at ``y`` (top,
        center, bottom or the first line's baseline); several lines with ``\\n``."""
        lines = s.split("\n")
        fs = _pt(size)
        lead = 1.2 * fs
        block = lead * (len(lines) - 1)
        first = {"top": y + 0.76 * fs, "center": y + 0.36 * fs - block / 2,
                 "bottom": y - 0.24 * fs - block}.get(va, y)
        rot = f' transform="rotate({rotate:g} {x:.1f} {y:.1f})"' if rotate else ""
        c = f' class="{cls}"' if cls else ""
        if rotate:  # lines stacked along the rotated axis: offset from the anchor point
            first -= y
            spans = "".join(f'<tspan x="{x:.1f}" y="{y + first + i * lead:.1f}">{_esc(t)}</tspan>'
                            for i, t in enumerate(lines))
        else:
            spans = "".join(f'<tspan x="{x:.1f}" y="{first + i * lead:.1f}">{_esc(t)}</tspan>'
                            for i, t in enumerate(lines))
        (self.body if out is None else out).append(
            f'<text{c} font-size="{fs:.2f}" text-anchor="{anchor}" fill="{color}"{rot}>'
            f"{spans}</text>")

    def axes(self, x: float, y: float, w: float, h: float, xlim: tuple[float, float],
             ylim: tuple[float, float], *, ylog: bool = False, name: str = "") -> Axes:
        """Axes whose frame's lower-left corner is (``x``, ``y``) inches, ``w`` x ``h``."""
        return Axes(self, x, y, w, h, xlim, ylim, ylog=ylog, name=name)

    def suptitle(self, title: str, size: float = 12.0) -> None:
        """A title at the figure's top, wrapped to its width (:func:`title_height` tall)."""
        if title:
            self.text(self.W / 2, 0.06 * PX, wrap_title(self.width, title, size), size,
                      va="top", cls="title")

    def supxlabel(self, s: str, size: float = 9.0) -> None:
        self.text(self.W / 2, self.H - 0.06 * PX, s, size, va="bottom", cls="xlabel")

    def supylabel(self, s: str, size: float = 9.0) -> None:
        x = 0.06 * PX + 0.76 * _pt(size)  # the glyphs' top 0.06 inch from the left edge
        self.text(x, self.H / 2, s, size, rotate=-90.0, cls="ylabel")

    def to_bytes(self) -> bytes:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.W:.0f}" '
                f'height="{self.H:.0f}" viewBox="0 0 {self.W:.0f} {self.H:.0f}" '
                f'font-family="{FONT}">')
        defs = f"<defs>{''.join(self.defs)}</defs>" if self.defs else ""
        bg = f'<rect width="{self.W:.0f}" height="{self.H:.0f}" fill="#fff"/>'
        return "\n".join([head, defs, bg, *self.body, "</svg>\n"]).encode("utf-8")


class Axes:
    """A panel: data drawn into its frame (clipped to it), then :meth:`finish` draws the
    frame, the ticks and their labels, the title and the axis labels."""

    def __init__(self, svg: Svg, x: float, y: float, w: float, h: float,
                 xlim: tuple[float, float], ylim: tuple[float, float], *, ylog: bool = False,
                 name: str = "") -> None:
        self.svg, self.name = svg, name
        self.x0, self.y0 = x * PX, (svg.height - y - h) * PX  # the frame's upper-left, px
        self.w, self.h = w * PX, h * PX
        self.xlim, self.ylim, self.ylog = (float(xlim[0]), float(xlim[1])), \
            (float(ylim[0]), float(ylim[1])), ylog
        self._ly = (math.log10(self.ylim[0]), math.log10(self.ylim[1])) if ylog else self.ylim
        self.data: list[str] = []
        self.over: list[str] = []

    def X(self, x):  # noqa: N802 - data to px
        a, b = self.xlim
        return self.x0 + (np.asarray(x, dtype=np.float64) - a) / (b - a) * self.w

    def Y(self, y):  # noqa: N802
        y = np.asarray(y, dtype=np.float64)
        if self.ylog:
            y = np.log10(np.maximum(y, 1e-300))
        a, b = self._ly
        return self.y0 + self.h - (y - a) / (b - a) * self.h

    # ---- data
    def bars(self, left, width, height, bottom=None, *, fill: str, stroke: str = "none",
             lw: float = 0.6, ls: str | None = None, opacity: float | None = None,
             cls: str = "bar") -> None:
        left, width = np.asarray(left, np.float64), np.asarray(width, np.float64)
        height = np.asarray(height, np.float64)
        base = np.zeros(height.shape) if bottom is None else np.asarray(bottom, np.float64)
        top = base + height
        if self.ylog:  # a bar from 0 starts at the axis' bottom
            base = np.maximum(base, min(self.ylim))
        x0, x1 = self.X(left), self.X(left + width)
        y0, y1 = self.Y(base), self.Y(top)
        op = f' fill-opacity="{opacity:g}"' if opacity is not None else ""
        st = _stroke(stroke, lw, ls) if stroke != "none" else 'stroke="none"'
        for a, b, c, d in zip(x0, x1, y0, y1, strict=True):
            top, bot = min(c, d), max(c, d)
            self.data.append(f'<rect class="{cls}" x="{a:.2f}" y="{top:.2f}" '
                             f'width="{b - a:.2f}" height="{bot - top:.2f}" fill="{fill}"{op} '
                             f"{st}/>")

    def line(self, x, y, *, color: str, lw: float = 1.0, ls: str | None = None,
             cls: str = "line", thin: float = 0.0) -> None:
        """A polyline through the data points; ``thin``: one point kept every ``thin`` px
        along the line (an ROC curve's thousands of steps)."""
        px, py = self.X(x), self.Y(y)
        ok = np.isfinite(px) & np.isfinite(py)
        if not ok.all():  # broken at a missing value (NaN), as matplotlib draws it
            cuts = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
            for seg, good in zip(np.split(np.arange(px.size), cuts),
                                 np.split(ok, cuts), strict=True):
                if good[0] and seg.size > 1:
                    self.line(np.asarray(x, np.float64)[seg], np.asarray(y, np.float64)[seg],
                              color=color, lw=lw, ls=ls, cls=cls, thin=thin)
            return
        if thin and px.size > 2:
            # a point every `thin` px along the curve (L1 length): an ROC curve's thousands of
            # steps drawn within `thin` px of where they are
            s = np.r_[0.0, np.cumsum(np.abs(np.diff(px)) + np.abs(np.diff(py)))]
            q = np.floor(s / float(thin))
            keep = np.r_[True, q[1:] != q[:-1]]
            keep[-1] = True
            px, py = px[keep], py[keep]
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px.tolist(), py.tolist(), strict=True))
        self.data.append(f'<polyline class="{cls}" points="{pts}" fill="none" '
                         f'{_stroke(color, lw, ls)}/>')

    def hline(self, y: float, **kw) -> None:
        self.line(self.xlim, [y, y], **kw)

    def vline(self, x: float, **kw) -> None:
        yl = self.ylim
        self.line([x, x], yl, **kw)

    def text(self, x: float, y: float, s: str, size: float, *, frac: bool = False,
             **kw) -> None:
        """Text at data (``x``, ``y``), or at axes fractions with ``frac``."""
        if frac:
            px, py = self.x0 + x * self.w, self.y0 + (1 - y) * self.h
        else:
            px, py = float(self.X(x)), float(self.Y(y))
        self.svg.text(px, py, s, size, out=self.over, **kw)

    def boxed_text(self, fx: float, fy: float, s: str, size: float) -> None:
        """Text right/bottom-aligned at axes fractions in a white rounded box (the ECE)."""
        fs = _pt(size)
        w, pad = text_width(s, size), 0.3 * fs
        x1, y1 = self.x0 + fx * self.w, self.y0 + (1 - fy) * self.h
        self.over.append(f'<rect class="box" x="{x1 - w - 2 * pad:.1f}" y="{y1 - fs * 1.2 - 2 * pad:.1f}" '
                         f'width="{w + 2 * pad:.1f}" height="{fs * 1.2 + 2 * pad:.1f}" '
                         f'rx="{pad:.1f}" fill="#fff" fill-opacity="0.8" stroke="#000" '
                         f'stroke-width="{_pt(0.8):.2f}"/>')
        self.svg.text(x1 - pad, y1 - pad, s, size, anchor="end", va="bottom", out=self.over)

    # ---- decorations
    def finish(self, *, xticks: Sequence[float] | None = None,
               yticks: Sequence[float] | None = None, xlabels: bool = True,
               ylabels: bool = True, title: str = "",
               title_size: float = 9.0, xlabel: str = "", ylabel: str = "",
               label_size: float = 8.0, xinteger: bool = False) -> None:
        """Write the panel: its data clipped to the frame, the frame, the ticks (``None``:
        round values, or decades on a log scale) with their labels (``xlabels``/``ylabels``),
        the title above and the axis labels (tick labels at :data:`TICK_SIZE` points)."""
        size = TICK_SIZE
        svg, fs = self.svg, _pt(size)
        clip = svg.uid("clip")
        svg.defs.append(f'<clipPath id="{clip}"><rect x="{self.x0:.2f}" y="{self.y0:.2f}" '
                        f'width="{self.w:.2f}" height="{self.h:.2f}"/></clipPath>')
        out = [f'<g class="panel" data-name="{_esc(self.name)}" '
               f'data-xlim="{self.xlim[0]!r} {self.xlim[1]!r}" '
               f'data-ylim="{self.ylim[0]!r} {self.ylim[1]!r}" '
               f'data-yscale="{"log" if self.ylog else "linear"}">',
               f'<g clip-path="url(#{clip})">', *self.data, "</g>",
               f'<rect class="frame" x="{self.x0:.2f}" y="{self.y0:.2f}" width="{self.w:.2f}" '
               f'height="{self.h:.2f}" fill="none" {_stroke("#000", 0.8)}/>']
        tick, pad = _pt(3.5), _pt(3.5)
        bottom = self.y0 + self.h
        if xticks is None:
            xticks = nice_ticks(*self.xlim, max(3, round(self.w / PX * 2.5)), integer=xinteger)
        ticks = [t for t in xticks if self.xlim[0] - 1e-9 <= t <= self.xlim[1] + 1e-9]
        path = []
        for t in ticks:
            x = float(self.X(t))
            path.append(f"M{x:.2f},{bottom:.2f}v{tick:.2f}")
            if xlabels:
                svg.text(x, bottom + tick + pad, _tick_label(t, ticks), size, va="top",
                         cls="ticklabel", out=out)
        ylab_w = 0.0
        if yticks is None:
            yticks = self._log_ticks() if self.ylog else nice_ticks(
                *self.ylim, max(3, round(self.h / PX * 2.5)))
        lo, hi = min(self.ylim), max(self.ylim)
        yt = [t for t in yticks if lo * (1 - 1e-9) - 1e-12 <= t <= hi * (1 + 1e-9) + 1e-12]
        # on a short log axis every decade's tick, a label on every stride-th (1.3 lines apart)
        stride = 1
        if self.ylog and len(yt) > 1:
            gap = abs(float(self.Y(yt[0])) - float(self.Y(yt[1])))
            stride = max(1, math.ceil(1.3 * fs / max(gap, 1e-9)))
        for i, t in enumerate(yt):
            y = float(self.Y(t))
            path.append(f"M{self.x0:.2f},{y:.2f}h{-tick:.2f}")
            if ylabels and i % stride == 0:
                s = (f"10{str(round(math.log10(t))).translate(_SUPERSCRIPT)}" if self.ylog
                     else _tick_label(t, yt))
                ylab_w = max(ylab_w, text_width(s, size))
                svg.text(self.x0 - tick - pad, y, s, size, anchor="end", va="center",
                         cls="ticklabel", out=out)
        if self.ylog:  # minor ticks, unlabelled
            for k in range(math.floor(self._ly[0]), math.ceil(self._ly[1]) + 1):
                for m in range(2, 10):
                    v = m * 10.0 ** k
                    if lo <= v <= hi:
                        path.append(f"M{self.x0:.2f},{float(self.Y(v)):.2f}h{-_pt(2):.2f}")
        if path:
            out.append(f'<path class="ticks" d="{"".join(path)}" {_stroke("#000", 0.8)}/>')
        if title:
            svg.text(self.x0 + self.w / 2, self.y0 - _pt(6), title, title_size, va="bottom",
                     cls="paneltitle", out=out)
        if xlabel:
            y = bottom + tick + pad + (1.2 * fs if xlabels and ticks else 0) + _pt(3.5)
            svg.text(self.x0 + self.w / 2, y, xlabel, label_size, va="top", cls="xlabel",
                     out=out)
        if ylabel:
            x = self.x0 - tick - pad - ylab_w - _pt(4) - 0.24 * _pt(label_size)
            svg.text(x, self.y0 + self.h / 2, ylabel, label_size, rotate=-90.0, cls="ylabel",
                     out=out)
        out += self.over
        out.append("</g>")
        svg.body += out

    def _log_ticks(self) -> list[float]:
        return [10.0 ** k for k in range(math.ceil(self._ly[0] - 1e-9),
                                         math.floor(self._ly[1] + 1e-9) + 1)]


def save_svg(svg: Svg, path: str | os.PathLike) -> Path:
    """Write ``svg`` to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, svg.to_bytes())


# --------------------------------------------------------------------------------------------
# the reliability overview
# --------------------------------------------------------------------------------------------
_HATCH = (  # the gap bars' fills: matplotlib's "//" red on pink and "\\\\" black on orange
    '<pattern id="hatch-over" patternUnits="userSpaceOnUse" width="6" height="6">'
    '<rect width="6" height="6" fill="#f4c7c7"/>'
    f'<path d="M-1,1l2,-2M0,6l6,-6M5,7l2,-2" stroke="{OVER_COLOR}" stroke-width="0.9"/>'
    "</pattern>"
    '<pattern id="hatch-under" patternUnits="userSpaceOnUse" width="6" height="6">'
    f'<rect width="6" height="6" fill="{UNDER_COLOR}"/>'
    '<path d="M-1,5l2,2M0,0l6,6M5,-1l2,2" stroke="#000" stroke-width="0.9"/></pattern>')


def _curve(z: np.ndarray, y: np.ndarray, n_bins: int) -> dict[str, np.ndarray | float]:
    """A reliability diagram's data (:func:`torchcal.plot.reliability_diagram`'s): the bins'
    edges, counts, accuracies and mean confidences, the ECE, accuracy and mean confidence."""
    curve = reliability_curve(logits=z, labels=y, n_bins=n_bins)
    counts = curve.counts.double().cpu().numpy()
    acc = curve.accuracies.double().cpu().numpy()
    conf = curve.confidences.double().cpu().numpy()
    filled = counts > 0
    n = float(counts.sum())
    return {"edges": curve.edges.double().cpu().numpy(), "counts": counts, "acc": acc,
            "conf": conf, "ece": float(ece(logits=z, labels=y, n_bins=n_bins)),
            "accuracy": float((acc[filled] * counts[filled]).sum()) / n,
            "mean_conf": float((conf[filled] * counts[filled]).sum()) / n}


def _reliability_panels(svg: Svg, x: float, y: float, cell: tuple[float, ...], name: str,
                        d: dict, min_count: int = MIN_COUNT) -> bool:
    """One loss's reliability panel over its count panel in the cell whose lower-left corner
    is (``x``, ``y``) inches; returns whether a bin is sparse (faded)."""
    cw, ch, left, bottom, hist_h, head = cell
    w = cw - left - 0.15
    edges, counts, acc, conf = d["edges"], d["counts"], d["acc"], d["conf"]
    lft, wid = edges[:-1], np.diff(edges)
    filled = counts >= max(min_count, 1)
    sparse = (counts > 0) & ~filled
    over, under = filled & (conf > acc), filled & (conf < acc)
    top_y = y + bottom + hist_h + 0.1
    ax = svg.axes(x + left, top_y, w, y + ch - head - top_y, (0, 1), (0, 1), name=name)
    ax.bars(lft[filled], wid[filled], acc[filled], fill=ACCURACY_COLOR, stroke="#000",
            cls="bar accuracy")
    ax.bars(lft[over], wid[over], conf[over] - acc[over], acc[over], fill="url(#hatch-over)",
            stroke=OVER_COLOR, cls="bar over")
    ax.bars(lft[under], wid[under], acc[under] - conf[under], conf[under],
            fill="url(#hatch-under)", stroke="#000", cls="bar under")
    if sparse.any():
        ax.bars(lft[sparse], wid[sparse], acc[sparse], fill=ACCURACY_COLOR, opacity=0.25,
                stroke="#595959", lw=0.8, ls=":", cls="bar sparse")
        for a, b, c, n in zip(lft[sparse], wid[sparse], acc[sparse], counts[sparse],
                              strict=True):
            ax.text(a + b / 2, min(c, 0.9) + 0.02, str(int(n)), 6, va="bottom", color="#404040")
    ax.line([0, 1], [0, 1], color="gray", lw=1.0, ls="--", cls="line perfect")
    ax.boxed_text(0.97, 0.05, f"ECE = {100 * d['ece']:.2f}%", 8)
    ax.finish(xlabels=False, title=name, ylabel="accuracy")
    top = max(float(counts.max()), 10.0)
    hx = svg.axes(x + left, y + bottom, w, hist_h, (0, 1), (0.7, top * 3), ylog=True,
                  name=name)
    nz = counts > 0
    hx.bars(lft[nz & filled], wid[nz & filled], counts[nz & filled], fill="#7f7f7f",
            stroke="#000", cls="bar count")
    hx.bars(lft[sparse], wid[sparse], counts[sparse], fill="#d9d9d9", stroke="#000",
            cls="bar count")
    hx.hline(min_count, color="#666666", lw=0.8, ls=":", cls="line min-count")
    hx.vline(d["accuracy"], color="#1f77b4", lw=1.2, cls="line accuracy")
    hx.vline(d["mean_conf"], color="#d62728", lw=1.2, ls="--", cls="line mean-confidence")
    hx.finish(xlabel="confidence", ylabel="samples")
    return bool(sparse.any())


#: The reliability legend's widest label, and its handle, gap and column spacing in em
#: (matplotlib's legend defaults).
_LEGEND_WIDEST, _HANDLE_EM, _GAP_EM, _COLSEP_EM = "gap: under-confident", 2.0, 0.8, 2.0


def _legend_ncol(width: float, n: int = LEGEND_ENTRIES) -> int:
    """The reliability legend's columns (at most :func:`~torchcal.report.figures.
    legend_columns`') that fit side by side in a figure ``width`` inches wide."""
    fs = _pt(8)
    colw = (_HANDLE_EM + _GAP_EM) * fs + text_width(_LEGEND_WIDEST, 8)
    fit = int((width * PX - 0.1 * PX + _COLSEP_EM * fs) // (colw + _COLSEP_EM * fs))
    return max(1, min(n, legend_columns(width), fit))


def _reliability_legend(svg: Svg, sparse: bool, min_count: int = MIN_COUNT) -> None:
    """The bar kinds' legend in rows under the panels (:func:`torchcal.plot.
    reliability_legend_handles`' entries), :func:`_legend_ncol` columns."""
    entries = [("accuracy", f'fill="{ACCURACY_COLOR}" stroke="#000"'),
               ("gap: over-confident", f'fill="url(#hatch-over)" stroke="{OVER_COLOR}"'),
               ("gap: under-confident", 'fill="url(#hatch-under)" stroke="#000"')]
    if sparse:
        entries.append((f"< {min_count} samples", f'fill="{ACCURACY_COLOR}" fill-opacity="0.25" '
                        f'stroke="#595959"{_dash(":", 0.8)}'))
    entries.append(("perfect", None))
    ncol = min(len(entries), _legend_ncol(svg.width))
    fs = _pt(8)
    handle, gap, colsep = _HANDLE_EM * fs, _GAP_EM * fs, _COLSEP_EM * fs
    colw = handle + gap + max(text_width(e[0], 8) for e in entries)
    rows = -(-len(entries) // ncol)
    x0 = svg.W / 2 - (ncol * colw + (ncol - 1) * colsep) / 2
    out = ['<g class="legend">']
    for i, (label, style) in enumerate(entries):
        r, c = divmod(i, ncol)
        x = x0 + c * (colw + colsep)
        yc = svg.H - 0.1 * PX - (rows - 1 - r) * 1.25 * line_height(8) * PX - 0.6 * fs
        if style is None:
            out.append(f'<path d="M{x:.1f},{yc:.1f}h{handle:.1f}" {_stroke("gray", 1.0, "--")}/>')
        else:
            out.append(f'<rect x="{x:.1f}" y="{yc - 0.35 * fs:.1f}" width="{handle:.1f}" '
                       f'height="{0.7 * fs:.1f}" stroke-width="{_pt(0.6):.2f}" {style}/>')
        svg.text(x + handle + gap, yc, label, 8, anchor="start", va="center", cls="legend-entry",
                 out=out)
    out.append("</g>")
    svg.body += out


def reliability_overview(curves: Mapping[str, tuple[np.ndarray, np.ndarray]], *,
                         n_bins: int = 15, title: str = "") -> Svg:
    """Every loss's reliability diagram with its samples per bin below, in one grid of up to 5
    columns, the bar kinds' legend under them (:func:`torchcal.report.figures.
    reliability_overview`): ``{label: (logits, labels)}``."""
    names = list(curves)
    ncols = min(5, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    cw, ch = OVERVIEW_CELL[:2]
    width = ncols * cw + 0.15
    legend_rows = -(-LEGEND_ENTRIES // _legend_ncol(width))
    top = title_height(width, title, 12.0)
    bottom = 0.15 + line_height(8.0) * 1.25 * legend_rows
    svg = Svg(width, top + nrows * ch + bottom)
    svg.defs.append(_HATCH)
    sparse = False
    for k, name in enumerate(names):
        r, c = divmod(k, ncols)
        z, y = curves[name]
        sparse |= _reliability_panels(svg, c * cw, bottom + (nrows - 1 - r) * ch, OVERVIEW_CELL,
                                      name, _curve(z, y, n_bins))
    _reliability_legend(svg, sparse)
    svg.suptitle(title, 12.0)
    return svg


# --------------------------------------------------------------------------------------------
# confidence histograms, ROC curves, AdaFocal's γ
# --------------------------------------------------------------------------------------------
def confidence_histograms(confidences: Mapping[str, np.ndarray], *, n_bins: int = 15,
                          title: str = "", accuracies: Mapping[str, float] | None = None) -> Svg:
    """One panel per loss: the share of samples per confidence bin, the mean confidence
    (dashed) and the accuracy (solid), one y-scale for all
    (:func:`torchcal.report.figures.confidence_histograms`)."""
    names = list(confidences)
    ncols = min(5, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    width = 0.3 + ncols * 2.6 + 0.1
    top = title_height(width, title)
    svg = Svg(width, top + nrows * 2.0 + 0.32)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    shares = {}
    for name in names:
        c = np.asarray(confidences[name], dtype=np.float64)
        shares[name] = np.histogram(c, bins=edges)[0] / max(c.size, 1), c
    ymax = max([float(s.max()) for s, _c in shares.values()] + [1e-12]) * 1.05
    for k, name in enumerate(names):
        r, col = divmod(k, ncols)
        s, c = shares[name]
        ax = svg.axes(0.3 + col * 2.6 + 0.35, 0.32 + (nrows - 1 - r) * 2.0 + 0.3,
                      2.6 - 0.35 - 0.12, 2.0 - 0.3 - 0.28, (0, 1), (0, ymax), name=name)
        ax.bars(edges[:-1], np.diff(edges), s, fill="#4C72B0", stroke="#fff", lw=1.0)
        ax.vline(c.mean() if c.size else 0.0, color="#C44E52", lw=1.2, ls="--",
                 cls="line mean-confidence")
        if accuracies is not None and name in accuracies:
            ax.vline(float(accuracies[name]), color="#1f3f6f", lw=1.2, cls="line accuracy")
        ax.finish(ylabels=col == 0, title=name)
    svg.suptitle(title)
    svg.supxlabel("confidence (dashed: mean confidence"
                  + (", solid: accuracy)" if accuracies is not None else ")"))
    svg.supylabel("share of samples")
    return svg


def roc_figure(curves: Mapping[str, tuple], *, title: str = "",
               reference: str | None = None) -> Svg:
    """OOD ROC curves as small multiples, ``{label: (fpr, tpr, auroc[, auroc_std])}``: each
    loss's curve in blue over the others' in grey, ``reference``'s (default: the first)
    dashed, the chance diagonal dotted, the AUROC in the title
    (:func:`torchcal.report.figures.roc_figure`)."""
    names = list(curves)
    if reference is None and names:
        reference = names[0]
    ncols = min(5, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    if title and len(names) > 1:
        title += f"\nblue: the panel's loss; dashed: {reference}; grey: the other losses"
    width = 0.35 + ncols * 2.5 + 0.1
    top = title_height(width, title, 10.0)
    svg = Svg(width, top + nrows * 2.55 + 0.32)
    side = 1.87 / 1.01  # equal aspect: the box of 1.9 x 1.87 inches shrinks to the data's
    for k, name in enumerate(names):
        r, col = divmod(k, ncols)
        ax = svg.axes(0.35 + col * 2.5 + 0.4 + (1.9 - side) / 2,
                      0.32 + (nrows - 1 - r) * 2.55 + 0.3, side, 1.87, (0, 1), (0, 1.01),
                      name=name)
        for other in names:
            if other not in (name, reference):
                fpr, tpr = curves[other][:2]
                ax.line(fpr, tpr, color="#d1d1d1", lw=0.7, cls="line other", thin=2.0)
        ax.line([0, 1], [0, 1], color="#999999", lw=0.7, ls=":", cls="line chance")
        if reference in curves and reference != name:
            fpr, tpr = curves[reference][:2]
            ax.line(fpr, tpr, color="#404040", lw=1.0, ls="--", cls="line reference", thin=1.0)
        fpr, tpr, auc, *rest = curves[name]
        ax.line(fpr, tpr, color="#1f4e9c", lw=1.8, cls="line own", thin=1.0)
        spread = f" ± {100 * rest[0]:.1f}" if rest and np.isfinite(rest[0]) else ""
        ax.finish(ylabels=col == 0, xlabels=k + ncols >= len(names), title_size=8.0,
                  title=f"{name}\nAUROC {100 * auc:.1f}{spread}%",
                  yticks=nice_ticks(0, 1))
    svg.supxlabel("false positive rate (in-distribution flagged)")
    svg.supylabel("true positive rate (OOD detected)")
    svg.suptitle(title, 10.0)
    return svg


def gamma_history_figure(histories: Mapping[str, np.ndarray], *, title: str = "",
                         gamma_max: float | None = None) -> Svg:
    """AdaFocal's γ per bin over epochs, one panel per run (``{run label: array (E, B)}``),
    each bin a line from dark (low bins) to light (high), the bins' colour scale on the
    right, ``gamma_max`` dashed when some run reaches half of it, else named above the scale
    (:func:`torchcal.report.figures.gamma_history_figure`)."""
    names = [n for n in histories if np.asarray(histories[n]).ndim == 2
             and np.asarray(histories[n]).size]
    ncols = min(3, max(1, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    width = ncols * 4.2 + 0.85
    top = title_height(width, title)
    svg = Svg(width, top + nrows * 3.2)
    hists = [np.asarray(histories[n], dtype=np.float64) for n in names]
    data_hi = max([float(np.nanmax(h)) for h in hists if np.isfinite(h).any()], default=0.0)
    show_max = gamma_max is not None and data_hi >= 0.5 * gamma_max
    ylim = gamma_limits(hists, gamma_max if show_max else None)
    for k, (name, h) in enumerate(zip(names, hists, strict=True)):
        r, col = divmod(k, ncols)
        E, B = h.shape
        pad = 0.05 * (E - 1) if E > 1 else 0.5
        ax = svg.axes(col * 4.2 + 0.5, (nrows - 1 - r) * 3.2 + 0.42, 4.2 - 0.5 - 0.15,
                      3.2 - 0.42 - 0.28, (1 - pad, E + pad), ylim, name=name)
        x = np.arange(1, E + 1)
        for b in range(B):
            ax.line(x, h[:, b], color=viridis(b / max(B - 1, 1)), lw=1.0, cls="line bin")
        ax.hline(0.0, color="#808080", lw=0.6, ls=":", cls="line zero")
        if show_max:
            ax.hline(gamma_max, color="#C44E52", lw=0.9, ls="--", cls="line gamma-max")
            ax.text(ax.xlim[0] + 0.02 * (ax.xlim[1] - ax.xlim[0]), gamma_max,
                    f"γ_max = {gamma_max:g}", 7, anchor="start", va="bottom", color="#C44E52")
        elif gamma_max is not None:
            ax.text(0.02, 0.97, f"γ_max = {gamma_max:g}: above this scale", 7, frac=True,
                    anchor="start", va="top", color="#C44E52")
        ax.finish(ylabels=col == 0, title=name, xlabel="epoch", ylabel="γ", xinteger=True)
    if names:
        _gamma_colorbar(svg, ncols, nrows, max(h.shape[-1] for h in hists))
    svg.suptitle(title)
    return svg


def _gamma_colorbar(svg: Svg, ncols: int, nrows: int, n_bins: int) -> None:
    """The bins' colour scale right of the γ panels, as tall as their axes."""
    x, y, h = ncols * 4.2 + 0.05, 0.42, nrows * 3.2 - 0.42 - 0.28
    grad = svg.uid("viridis")
    stops = "".join(f'<stop offset="{i / 16:.4f}" stop-color="{c}"/>'
                    for i, c in enumerate(_VIRIDIS))
    svg.defs.append(f'<linearGradient id="{grad}" x1="0" y1="1" x2="0" y2="0">{stops}'
                    "</linearGradient>")
    hi = max(n_bins - 1, 1)
    x0, y0, w, hp = x * PX, (svg.height - y - h) * PX, 0.13 * PX, h * PX
    out = ['<g class="colorbar">',
           f'<rect x="{x0:.2f}" y="{y0:.2f}" width="{w:.2f}" height="{hp:.2f}" '
           f'fill="url(#{grad})" {_stroke("#000", 0.8)}/>']
    ticks = nice_ticks(0, hi, max(3, round(h * 2.5)), integer=True)
    tick, pad, wmax = _pt(3.5), _pt(3.5), 0.0
    for t in ticks:
        yy = y0 + hp - t / hi * hp
        out.append(f'<path d="M{x0 + w:.2f},{yy:.2f}h{tick:.2f}" {_stroke("#000", 0.8)}/>')
        s = _tick_label(t, ticks)
        wmax = max(wmax, text_width(s, 7))
        svg.text(x0 + w + tick + pad, yy, s, 7, anchor="start", va="center", out=out)
    lx = x0 + w + tick + pad + wmax + _pt(4) + 0.76 * _pt(8)
    svg.text(lx, y0 + hp / 2, "bin (0: lowest confidence)", 8, rotate=-90.0, out=out)
    out.append("</g>")
    svg.body += out
