"""Issue 43 item 1: the report's default figures as SVG written by hand (torchcal.report.svg).

Each SVG is parsed back (xml.etree) and checked against its data: one panel per loss (two for
a reliability diagram: the bars and the counts), the legend's entries, the bars' heights and
the lines' points mapped back through the panel's axes limits; a report with the default
figures imports no matplotlib; ``figure_format="png"`` still gives matplotlib's PNGs."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from torchcal.metrics.calibration import reliability_curve
from torchcal.report import build_report
from torchcal.report import figures as F
from torchcal.report import svg as S

NS = {"s": "http://www.w3.org/2000/svg"}
LOSSES = ("Cross-entropy", "Focal (γ=3)", "AdaFocal")


def _parse(svg: S.Svg) -> ET.Element:
    root = ET.fromstring(svg.to_bytes())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert float(root.get("width")) == pytest.approx(svg.W, abs=1)
    return root


def _panels(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "panel"]


class _Map:
    """A panel's px <-> data mapping, from its frame and its data limits."""

    def __init__(self, panel: ET.Element) -> None:
        fr = next(r for r in panel.iter("{http://www.w3.org/2000/svg}rect")
                  if r.get("class") == "frame")
        self.x, self.y = float(fr.get("x")), float(fr.get("y"))
        self.w, self.h = float(fr.get("width")), float(fr.get("height"))
        self.xlim = [float(v) for v in panel.get("data-xlim").split()]
        self.ylim = [float(v) for v in panel.get("data-ylim").split()]
        self.log = panel.get("data-yscale") == "log"

    def data_x(self, px):
        return self.xlim[0] + (np.asarray(px) - self.x) / self.w * (self.xlim[1] - self.xlim[0])

    def data_y(self, py):
        lo, hi = (np.log10(self.ylim) if self.log else self.ylim)
        v = lo + (self.y + self.h - np.asarray(py)) / self.h * (hi - lo)
        return 10 ** v if self.log else v

    def span_y(self, height_px: float) -> float:  # a bar's height in data units (linear)
        return height_px / self.h * (self.ylim[1] - self.ylim[0])


def _bars(panel: ET.Element, kind: str) -> list[ET.Element]:
    return [r for r in panel.iter("{http://www.w3.org/2000/svg}rect")
            if kind in (r.get("class") or "").split()]


def _lines(panel: ET.Element, kind: str) -> list[np.ndarray]:
    return [np.array([[float(v) for v in p.split(",")] for p in pl.get("points").split()])
            for pl in panel.iter("{http://www.w3.org/2000/svg}polyline")
            if kind in (pl.get("class") or "").split()]


def _logits(seed: int, n: int = 600, c: int = 5, scale: float = 2.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    z = rng.normal(size=(n, c)) * scale
    z[np.arange(n), y] += 1.0
    return z, y


def test_reliability_overview_panels_legend_and_bars_match_the_data():
    curves = {name: _logits(k, scale=1 + k) for k, name in enumerate(LOSSES)}
    root = _parse(S.reliability_overview(curves, n_bins=10, title="t"))
    panels = _panels(root)
    # two panels per loss (reliability over counts), in the losses' order
    assert [p.get("data-name") for p in panels] == [n for n in LOSSES for _ in range(2)]
    for k, name in enumerate(LOSSES):
        top, counts = panels[2 * k], panels[2 * k + 1]
        assert counts.get("data-yscale") == "log" and top.get("data-yscale") == "linear"
        rc = reliability_curve(logits=curves[name][0], labels=curves[name][1], n_bins=10)
        n, acc = rc.counts.numpy(), rc.accuracies.double().numpy()
        m = _Map(top)
        bars = _bars(top, "accuracy")
        filled = n >= 20
        assert len(bars) == filled.sum()
        got = [m.span_y(float(b.get("height"))) for b in bars]
        np.testing.assert_allclose(got, acc[filled], atol=2e-4)
        lefts = m.data_x([float(b.get("x")) for b in bars])
        np.testing.assert_allclose(lefts, rc.edges.numpy()[:-1][filled], atol=1e-3)
        mc = _Map(counts)
        tops = mc.data_y([float(b.get("y")) for b in _bars(counts, "count")])
        np.testing.assert_allclose(np.sort(tops), np.sort(n[n > 0]), rtol=1e-3)
    legend = [t.find("s:tspan", NS).text for t in root.iter("{http://www.w3.org/2000/svg}text")
              if t.get("class") == "legend-entry"]
    sparse = any(_bars(p, "sparse") for p in panels)
    assert legend == ["accuracy", "gap: over-confident", "gap: under-confident",
                      *(["< 20 samples"] if sparse else []), "perfect"]


def test_confidence_histograms_bars_are_the_shares_on_one_scale():
    conf = {name: np.random.default_rng(k).beta(2 + 3 * k, 2, 500) for k, name in enumerate(LOSSES)}
    acc = {name: 0.5 + 0.1 * k for k, name in enumerate(LOSSES)}
    root = _parse(S.confidence_histograms(conf, n_bins=15, accuracies=acc))
    panels = _panels(root)
    assert [p.get("data-name") for p in panels] == list(LOSSES)
    assert len({p.get("data-ylim") for p in panels}) == 1  # one y-scale for every panel
    for p, name in zip(panels, LOSSES, strict=True):
        m = _Map(p)
        share = np.histogram(conf[name], bins=np.linspace(0, 1, 16))[0] / conf[name].size
        np.testing.assert_allclose([m.span_y(float(b.get("height"))) for b in _bars(p, "bar")],
                                   share, atol=2e-4)
        (mean,), (a,) = _lines(p, "mean-confidence"), _lines(p, "accuracy")
        assert m.data_x(mean[0, 0]) == pytest.approx(conf[name].mean(), abs=2e-3)
        assert m.data_x(a[0, 0]) == pytest.approx(acc[name], abs=2e-3)


def test_roc_panels_draw_each_curve_through_its_points():
    rng = np.random.default_rng(0)
    curves = {}
    for k, name in enumerate(LOSSES):
        s = np.r_[rng.normal(0, 1, 3000), rng.normal(0.5 * k, 1, 3000)]
        fpr, tpr = F.roc_curve(s, np.r_[np.zeros(3000), np.ones(3000)])
        curves[name] = (fpr, tpr, 0.5 + 0.1 * k, 0.01)
    root = _parse(S.roc_figure(curves, title="t"))
    panels = _panels(root)
    assert [p.get("data-name") for p in panels] == list(LOSSES)
    for k, (p, name) in enumerate(zip(panels, LOSSES, strict=True)):
        m = _Map(p)
        (own,) = _lines(p, "own")
        x, y = m.data_x(own[:, 0]), m.data_y(own[:, 1])
        fpr, tpr = curves[name][:2]
        assert (x[0], y[0]) == pytest.approx((0, 0), abs=1e-3)
        assert (x[-1], y[-1]) == pytest.approx((1, 1), abs=1e-3)
        # every drawn point is a point of the curve (to the px's rounding)
        d = np.abs(x[:, None] - fpr[None]) + np.abs(y[:, None] - tpr[None])
        assert d.min(1).max() < 2e-3
        assert 10 < len(own) < len(fpr) / 4  # thinned: not every one of 6,000 steps
        assert len(_lines(p, "reference")) == (k > 0) and len(_lines(p, "other")) == (
            len(LOSSES) - 1 - (k > 0))
        title = " ".join(t.text for t in p.iter("{http://www.w3.org/2000/svg}tspan"))
        assert f"AUROC {100 * curves[name][2]:.1f} ± 1.0%" in title


def test_gamma_history_one_line_per_bin_and_a_colour_scale():
    rng = np.random.default_rng(0)
    hist = {"seed 0": rng.random((8, 5)) * 4, "seed 1": rng.random((8, 5)) * 12}
    svg = S.gamma_history_figure(hist, title="γ", gamma_max=20.0)
    root = _parse(svg)
    panels = _panels(root)
    assert [p.get("data-name") for p in panels] == ["seed 0", "seed 1"]
    for p, h in zip(panels, hist.values(), strict=True):
        m = _Map(p)
        lines = _lines(p, "bin")
        assert len(lines) == 5
        for b, pts in enumerate(lines):
            np.testing.assert_allclose(m.data_x(pts[:, 0]), np.arange(1, 9), atol=1e-2)
            np.testing.assert_allclose(m.data_y(pts[:, 1]), h[:, b], atol=2e-2)
        assert len(_lines(p, "gamma-max")) == 1  # 12 >= 20 / 2: γ_max inside the scale
    bars = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "colorbar"]
    assert len(bars) == 1 and "lowest confidence" in ET.tostring(bars[0], encoding="unicode")


def test_viridis_is_matplotlibs():
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    for t in np.linspace(0, 1, 23):
        want = np.array(cmap(t)[:3]) * 255
        got = np.array([int(S.viridis(t)[k:k + 2], 16) for k in (1, 3, 5)])
        assert np.abs(got - want).max() <= 6, t


def test_the_default_figures_are_svg_without_matplotlib(runs, tmp_path):
    code = ("import sys; from torchcal.report import build_report\n"
            f"rep = build_report([{str(runs)!r}], {str(tmp_path / 'r')!r})\n"
            "assert rep.figures and all(p.suffix == '.svg' for p in rep.figures), rep.figures\n"
            "assert 'matplotlib' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    html = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    assert html.count("data:image/svg+xml;base64,") == 2  # the overview, the histograms
    md = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    assert "figures/reliability_overview_" in md and ".svg)" in md


def test_figure_format_png_and_a_bad_format(runs, tmp_path):
    rep = build_report([runs], tmp_path / "p", figure_format="png")
    assert rep.figures and all(p.read_bytes()[:4] == b"\x89PNG" for p in rep.figures)
    assert "data:image/png;base64," in rep.report_html.read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="`figure_format`"):
        build_report([runs], tmp_path / "x", figure_format="pdf")


def test_a_missing_value_breaks_the_line():
    h = np.array([[1.0, 2.0], [np.nan, 2.5], [1.5, 3.0], [1.2, 3.5]])
    root = _parse(S.gamma_history_figure({"seed 0": h}))
    (p,) = _panels(root)
    lines = _lines(p, "bin")
    assert [len(pts) for pts in lines] == [2, 4]  # bin 0: the epochs 3-4 after the gap
    assert all(np.isfinite(pts).all() for pts in lines)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_reliability_legend_fits_the_figure(n):
    z, y = _logits(0, n=200, scale=3.0)
    svg = S.reliability_overview({f"loss {k}": (z, y) for k in range(n)}, title="t")
    root = _parse(svg)
    entries = [t for t in root.iter("{http://www.w3.org/2000/svg}text")
               if t.get("class") == "legend-entry"]
    assert len(entries) == 5  # a sparse bin: every kind
    frames = [float(r.get("y")) + float(r.get("height"))
              for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "frame"]
    for t in entries:
        span = t.find("s:tspan", NS)
        x, ty = float(span.get("x")), float(span.get("y"))
        assert 0 < x and x + S.text_width(span.text, 8) < svg.W, span.text
        assert max(frames) + 20 < ty < svg.H, span.text  # under the panels' x labels
