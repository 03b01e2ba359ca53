"""torchcal.plot: reliability diagrams as real PNGs with the bars the reliability curve says,
Agg only; the smooth reliability curve's plot; the old import path still works."""

import numpy as np
import pytest
import torch
from PIL import Image

import torchcal.metrics as M
from torchcal import plot as plots


def _data():
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(400, 5, generator=g)
    y = torch.randint(0, 5, (400,), generator=g)
    return z, y


def test_png_written_atomically_with_two_panels(tmp_path):
    z, y = _data()
    path = tmp_path / "sub" / "rel.png"
    fig = plots.reliability_diagram(logits=z, labels=y, n_bins=10, title="demo", path=path)
    assert path.exists() and [p.name for p in path.parent.iterdir()] == ["rel.png"]
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 200 and im.size[1] > 200
    top, bottom = fig.axes
    assert top.get_title() == "demo"
    # accuracy bars = the non-empty bins of the reliability curve, with its heights
    curve = M.reliability_curve(logits=z, labels=y, n_bins=10)
    filled = curve.counts > 0
    many = curve.counts >= plots.MIN_COUNT  # solid bars; the sparse bins are drawn apart
    assert 0 < int(many.sum()) < int(filled.sum())
    heights = np.array([r.get_height() for r in top.containers[0]])
    assert np.allclose(heights, curve.accuracies[many].numpy(), atol=1e-6)
    heights = np.array([r.get_height() for r in top.containers[3]])
    assert np.allclose(heights, curve.accuracies[filled & ~many].numpy(), atol=1e-6)
    # the count panel: samples per non-empty bin (they sum to N), on a log scale, labelled
    counts = np.array([r.get_height() for r in bottom.containers[0]])
    assert counts.sum() == 400 and np.array_equal(counts, curve.counts[filled].numpy())
    assert bottom.get_yscale() == "log"
    assert bottom.get_xlabel() == "confidence" and bottom.get_ylabel() == "samples"
    assert top.get_ylabel() == "accuracy"
    # the ECE label matches the metric
    texts = [t.get_text() for t in top.texts if t.get_text().startswith("ECE")]
    ece = M.ece(logits=z, labels=y, n_bins=10).item()
    assert texts == [f"ECE = {100 * ece:.2f}%"]


def test_into_existing_axes_and_bad_input():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    z, y = _data()
    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    out = plots.reliability_diagram(probs=torch.softmax(z, 1).numpy(), labels=y.numpy(), ax=ax)
    assert out is fig and len(fig.axes) == 1
    assert ax.get_xlabel() == "confidence" and ax.get_ylabel() == "accuracy"  # labelled axes
    with pytest.raises(ValueError, match="exactly one of `logits` or `probs`"):
        plots.reliability_diagram(labels=y)


def test_sparse_bins_are_marked_with_their_count():
    """A full-height bar can be a single sample: bins with fewer than `min_count` samples are
    drawn apart (faded, own legend entry) with their count written on them."""
    conf = np.r_[0.35, np.full(5, 0.55), np.full(200, 0.95)]  # bins of 1, 5 and 200 samples
    probs = np.stack([conf, 1 - conf], 1)
    labels = np.r_[0, np.zeros(5, int), (np.arange(200) % 20 == 0).astype(int)]
    fig = plots.reliability_diagram(probs=probs, labels=labels, n_bins=10, min_count=20)
    top, bottom = fig.axes
    solid, _over, _under, sparse = top.containers[:4]
    assert len(solid) == 1 and len(sparse) == 2 and sparse.get_label() == "< 20 samples"
    assert [r.get_alpha() for r in sparse] == [0.25, 0.25]
    assert sorted(t.get_text() for t in top.texts if not t.get_text().startswith("ECE")) == [
        "1", "5"]
    assert any(line.get_ydata()[0] == 20 for line in bottom.lines)  # the min_count line
    fig = plots.reliability_diagram(probs=probs, labels=labels, n_bins=10, min_count=1)
    assert len(fig.axes[0].containers) == 3  # nothing sparse
    with pytest.raises(ValueError, match="`min_count`"):
        plots.reliability_diagram(probs=probs, labels=labels, min_count=0)


def test_the_moved_name_shim_is_gone():
    """0.1.0 has no users to keep: the reliability diagram is torchcal.plot's only (issue 32)."""
    with pytest.raises(ImportError):
        from torchcal.report import plots  # noqa: F401


def _over_and_under():
    """Bins at 0.55 (accuracy 0.9: under-confident) and 0.95 (accuracy 0.5: over-confident)."""
    conf = np.r_[np.full(40, 0.55), np.full(40, 0.95)]
    labels = np.r_[(np.arange(40) % 10 == 0).astype(int), (np.arange(40) % 2).astype(int)]
    return np.stack([conf, 1 - conf], 1), labels


def test_under_and_over_confident_gaps_each_have_their_own_legend_entry():
    """Issue 26 (8): an under-confident bin's gap was drawn translucent red over the blue
    accuracy bar (purple) with one legend entry "gap"; now each side has its own opaque
    colour, bar and legend entry, and the under-confident gap tops the bar at the accuracy."""
    probs, labels = _over_and_under()
    fig = plots.reliability_diagram(probs=probs, labels=labels, n_bins=10)
    top = fig.axes[0]
    acc, over, under = top.containers[:3]
    (o,), (u,) = list(over), list(under)
    assert o.get_y() == pytest.approx(0.5) and o.get_y() + o.get_height() == pytest.approx(0.95)
    assert u.get_y() == pytest.approx(0.55) and u.get_y() + u.get_height() == pytest.approx(0.9)
    for patch in (o, u, *acc):  # opaque: no colour from mixing two bars
        assert patch.get_facecolor()[3] == 1.0 and patch.get_alpha() in (None, 1.0)
    colours = {tuple(p.get_facecolor()) for p in (o, u, acc[0])}
    assert len(colours) == 3
    labels_shown = [t.get_text() for t in top.get_legend().get_texts()]
    assert "gap: over-confident" in labels_shown and "gap: under-confident" in labels_shown
    # the rendered image holds no purple: no pixel mixing the red and the blue
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    purple = (rgb[..., 0] > 90) & (rgb[..., 2] > 90) & (rgb[..., 1] < 0.75 * rgb[..., 0]) \
        & (rgb[..., 1] < 0.75 * rgb[..., 2])
    assert int(purple.sum()) == 0


def test_smooth_reliability_diagram_draws_the_metric_curve(tmp_path):
    z, y = _data()
    path = tmp_path / "smooth.png"
    fig = plots.smooth_reliability_diagram(logits=z, labels=y, title="smooth", path=path)
    with Image.open(path) as im:
        assert im.format == "PNG"
    (ax,) = fig.axes
    curve = M.smooth_reliability_curve(logits=z, labels=y)
    line = next(ln for ln in ax.lines if ln.get_label() == "smoothed accuracy")
    assert np.allclose(line.get_ydata(), curve.accuracies.numpy())
    assert np.allclose(line.get_xdata(), curve.mesh.numpy())
    smece = M.smooth_ece(logits=z, labels=y).item()
    assert ax.texts[0].get_text().startswith(f"smECE = {100 * smece:.2f}%")
    assert ax.get_title() == "smooth"


def test_risk_coverage_plot_draws_the_metric_curves(tmp_path):
    z, y = _data()
    correct = z.argmax(1) == y
    unc = M.entropy(logits=z)
    path = tmp_path / "rc.png"
    fig = plots.risk_coverage_plot({"entropy": (unc, correct), "max prob":
                                    (-torch.softmax(z, 1).amax(1), correct)},
                                   title="selective", path=path)
    with Image.open(path) as im:
        assert im.format == "PNG"
    (ax,) = fig.axes
    assert ax.get_title() == "selective"
    lines = ax.get_lines()
    assert [ln.get_label() for ln in lines][-1] == "perfect ranking"
    curve = M.risk_coverage_curve(uncertainty=unc, correct=correct)
    np.testing.assert_allclose(lines[0].get_xdata(), curve.coverage.numpy())
    np.testing.assert_allclose(lines[0].get_ydata(), 100 * curve.risk.numpy())
    area = 100 * float(M.aurc(uncertainty=unc, correct=correct))
    assert lines[0].get_label() == f"entropy (AURC {area:.2f}%)"
    # the perfect ranking: zero risk until every correct prediction is accepted
    best = lines[-1].get_ydata()
    n_correct = int(correct.sum())
    assert best[:n_correct].max() == 0 and best[-1] == pytest.approx(100 * (1 - n_correct / 400))
    # one pair, and a bad argument
    assert plots.risk_coverage_plot((unc, correct)).axes[0].get_lines()[0].get_label().startswith(
        "model (AURC")
    with pytest.raises(TypeError, match="`curves` to be a non-empty mapping"):
        plots.risk_coverage_plot([])
