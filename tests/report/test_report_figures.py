"""Report figures (ROC curve numbers against scikit-learn; every figure renders to a PNG) and the
AdaFocal γ-history reader."""

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from torchcal.report import figures as F
from torchcal.report.build import gamma_history
from torchcal.run_dir import LOSS_STATE_KEY


def test_roc_curve_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    s = np.round(rng.normal(size=400), 1)  # many ties
    y = (rng.random(400) < 0.3 + 0.2 * (s > 0)).astype(int)
    fpr, tpr = F.roc_curve(s, y)
    sf, st, _ = sk_roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sf, atol=1e-12)
    np.testing.assert_allclose(tpr, st, atol=1e-12)
    assert np.trapezoid(tpr, fpr) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_every_figure_renders(tmp_path):
    rng = np.random.default_rng(1)
    conf = {"CE": rng.beta(8, 1, 300), "Focal (γ=3)": rng.beta(4, 1, 300)}
    fpr, tpr = F.roc_curve(rng.normal(size=50), rng.integers(0, 2, 50))
    figs = {
        "hist.png": F.confidence_histograms(conf, title="t"),
        "roc.png": F.roc_figure({"CE": (fpr, tpr, 0.7)}, title="t"),
        "gamma.png": F.gamma_history_figure({"seed 0": rng.normal(size=(6, 15)),
                                             "seed 1": rng.normal(size=(6, 15))}, gamma_max=20.0),
    }
    for name, fig in figs.items():
        p = F.save_figure(fig, tmp_path / name)
        assert p.read_bytes()[:4] == b"\x89PNG"
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(figs)  # no temp files left


def test_gamma_history_from_log(tmp_path):
    """γ history comes from the one documented key: each log line's ``loss_state.gammas``."""
    g = np.arange(12, dtype=float).reshape(4, 3)
    lines = [{"epoch": e + 1, "train_loss": 1.0,
              LOSS_STATE_KEY: {"gammas": g[e].tolist(), "bin_edges": [0, 0.5, 0.9, 1]}}
             for e in range(4)]
    text = "\n".join(json.dumps(r) for r in lines) + "\n" + '{"epoch": 5, "tr'  # torn last line
    (tmp_path / "log.jsonl").write_text(text)
    np.testing.assert_array_equal(gamma_history(tmp_path), g)


def test_gamma_history_absent(tmp_path):
    assert gamma_history(tmp_path) is None  # no log
    (tmp_path / "log.jsonl").write_text(json.dumps({"epoch": 1, "train_loss": 1.0}) + "\n")
    assert gamma_history(tmp_path) is None  # a loss without per-bin γ
    lines = [{"epoch": 1, LOSS_STATE_KEY: {"gammas": [1.0, 2.0]}},
             {"epoch": 2, LOSS_STATE_KEY: {"gammas": [1.0, 2.0, 3.0]}}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert gamma_history(tmp_path) is None  # the bins disagree: no figure rather than a wrong one


def _logits(rng, n=400, c=5):
    return rng.normal(size=(n, c)) * 3, rng.integers(0, c, n)


def test_report_reliability_figures_have_labelled_axes_and_counts():
    rng = np.random.default_rng(2)
    z, y = _logits(rng)
    fig = F.reliability_pair(z, z / 2, y, n_bins=10, temperature=2.0)
    rel = [a for a in fig.axes if a.get_ylabel() == "accuracy"]
    cnt = [a for a in fig.axes if a.get_ylabel() == "samples"]
    assert len(rel) == len(cnt) == 2
    assert all(a.get_xlabel() == "confidence" and a.get_yscale() == "log" for a in cnt)
    assert sum(r.get_height() for r in cnt[0].containers[0]) == 400
    fig = F.reliability_overview({f"L{i}": _logits(rng) for i in range(7)}, n_bins=10)
    vis = [a for a in fig.axes if a.get_visible()]
    assert len([a for a in vis if a.get_ylabel() == "accuracy"]) == 7
    assert len([a for a in vis if a.get_ylabel() == "samples"]) == 7


def test_gamma_panels_share_the_scale_and_the_gamma_max_mark():
    rng = np.random.default_rng(3)
    high = np.clip(np.cumsum(rng.normal(1.0, 1, (10, 15)), 0), 0, 20)
    low = 1 + 0.1 * rng.random((10, 15))
    fig = F.gamma_history_figure({"seed 0": high, "seed 1": low, "seed 2": low / 2},
                                 gamma_max=20.0)
    axes = [a for a in fig.axes if a.get_visible() and a.get_ylabel() == "γ"]
    assert len(axes) == 3 and len({a.get_ylim() for a in axes}) == 1
    assert axes[0].get_ylim()[1] > 20
    for a in axes:  # the same dashed γ_max line on every panel
        assert any(tuple(line.get_ydata()) == (20.0, 20.0) and line.get_linestyle() == "--"
                   for line in a.lines)
    fig = F.gamma_history_figure({"seed 0": low, "seed 1": low / 2}, gamma_max=20.0)
    axes = [a for a in fig.axes if a.get_visible() and a.get_ylabel() == "γ"]
    assert len({a.get_ylim() for a in axes}) == 1 and axes[0].get_ylim()[1] < 2
    assert all(any("γ_max = 20: above" in t.get_text() for t in a.texts) for a in axes)


def test_roc_figure_is_one_readable_panel_per_loss():
    rng = np.random.default_rng(4)
    curves = {}
    for i in range(14):
        s = np.r_[rng.normal(0, 1, 200), rng.normal(0.1 * i, 1, 200)]
        fpr, tpr = F.roc_curve(s, np.r_[np.zeros(200), np.ones(200)])
        curves[f"loss {i}"] = (fpr, tpr, 0.5 + 0.02 * i, 0.01)
    fig = F.roc_figure(curves, title="t")
    axes = [a for a in fig.axes if a.get_visible()]
    assert len(axes) == 14
    for a, name in zip(axes, curves, strict=True):
        assert a.get_title().startswith(name + "\nAUROC") and "±" in a.get_title()
        strong = [line for line in a.lines if line.get_linewidth() > 1.5]
        assert len(strong) == 1  # this panel's loss, drawn over the others in grey
        np.testing.assert_array_equal(strong[0].get_xdata(), curves[name][0])
    # every column's lowest visible panel shows its x tick labels
    assert all(t.get_visible() for t in axes[-1].get_xticklabels())
    assert any(t.get_text() for t in axes[9].get_xticklabels())


def test_confidence_histograms_share_one_y_scale():
    """Issue 26 (8): each panel had its own y-scale, so a tall bar of one loss and a short one
    of another looked alike; now every panel of the figure has the same y-limits."""
    rng = np.random.default_rng(2)
    conf = {"peaked": np.full(300, 0.97), "spread": rng.uniform(0, 1, 300),
            "mid": rng.beta(4, 2, 300)}
    fig = F.confidence_histograms(conf, n_bins=10)
    fig.canvas.draw()
    limits = {ax.get_ylim() for ax in fig.axes if ax.get_visible()}
    assert len(limits) == 1 and limits.pop()[1] >= 1.0  # the peaked panel's bar: all samples


def _one_sample_bin(rng, n=400, c=10):
    """Confident logits, and one sample of confidence about 0.15 that is right: a sparse bin
    with one sample and accuracy 1, a full-height bar at the upper left of the panel."""
    z, y = rng.normal(size=(n, c)), rng.integers(0, c, n)
    z[np.arange(n), y] += 8.0
    z[0] = 0.0
    z[0, y[0]] = 0.45  # softmax: about 0.15 on the right class
    return z, y


@pytest.mark.parametrize("kind", ["pair", "overview"])
def test_the_legend_covers_no_bar(kind):
    """Issue 33: the legend (upper left of the first panel) covered a one-sample bar."""
    rng = np.random.default_rng(0)
    z, y = _one_sample_bin(rng)
    fig = (F.reliability_pair(z, z, y, n_bins=15) if kind == "pair"
           else F.reliability_overview({"A": (z, y), "B": _one_sample_bin(rng)}, n_bins=15))
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    legends = fig.legends + [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    assert legends
    boxes = [leg.get_window_extent(renderer) for leg in legends]
    from matplotlib.transforms import Bbox

    bars = [Bbox.intersection(r.get_window_extent(renderer), a.bbox)  # as drawn: clipped
            for a in fig.axes if a.get_visible() for c in a.containers for r in c
            if r.get_height() > 0]
    bars = [b for b in bars if b is not None]
    sparse = [c for a in fig.axes for c in a.containers if c.get_label().startswith("< ")]
    assert sparse and any(r.get_height() == 1.0 for c in sparse for r in c)  # the bar is there
    assert not [(b, r) for b in boxes for r in bars if b.overlaps(r)]


def _text_boxes(fig):
    """Every visible non-empty text of ``fig`` as drawn, with its (tick, title, label...)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    from matplotlib.text import Text

    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts]


@pytest.mark.parametrize("kind", ["overview1", "overview7", "pair", "hist", "roc1", "roc7",
                                  "gamma1", "gamma4"])
def test_figures_laid_out_by_hand_keep_every_text_inside(kind):
    """Issue 43: the report's figures have no layout engine (no measuring pass before each
    save, half of their CPU): their fixed margins must still hold every title, label, tick
    label and legend inside the canvas, without a text over another panel's axes."""
    rng = np.random.default_rng(5)
    z, y = _logits(rng)
    fpr, tpr = F.roc_curve(rng.normal(size=80), rng.integers(0, 2, 80))
    long = "A title long enough to be wrapped onto a second line of a narrow figure: " * 2
    n = int(kind[-1]) if kind[-1].isdigit() else 7
    names = [f"Loss name {i}" for i in range(n)]
    fig = {
        "overview": lambda: F.reliability_overview({k: (z, y) for k in names}, title=long),
        "pair": lambda: F.reliability_pair(z, z / 2, y, title=long, temperature=2.0),
        "hist": lambda: F.confidence_histograms({k: rng.beta(4, 1, 300) for k in names},
                                                title=long, accuracies=dict.fromkeys(names, .8)),
        "roc": lambda: F.roc_figure({k: (fpr, tpr, 0.6, 0.01) for k in names}, title=long),
        "gamma": lambda: F.gamma_history_figure({k: rng.normal(size=(9, 15)) for k in names},
                                                title=long, gamma_max=20.0),
    }[kind.rstrip("0123456789")]()
    assert fig.get_layout_engine() is None
    assert all(a.get_visible() for a in fig.axes)  # only the panels drawn are created
    w, h = fig.canvas.get_width_height()
    boxes = _text_boxes(fig)
    assert boxes
    outside = [t for t, b in boxes if b.x0 < -0.5 or b.y0 < -0.5 or b.x1 > w + 0.5
               or b.y1 > h + 0.5]
    assert not outside
    # the figure's title and legend cover no panel nor a panel's title
    renderer = fig.canvas.get_renderer()
    panels = [a.get_window_extent(renderer) for a in fig.axes]
    panels += [a.title.get_window_extent(renderer) for a in fig.axes if a.get_title()]
    outer = [fig._suptitle] + fig.legends if fig._suptitle is not None else fig.legends
    assert not [(o, p) for o in outer for p in panels if o.get_window_extent(renderer).overlaps(p)]
