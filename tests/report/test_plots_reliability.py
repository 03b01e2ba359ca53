"""reliability_diagram: a real PNG with the bars the reliability curve says, Agg only."""

import numpy as np
import pytest
import torch
from PIL import Image

import torchcal.metrics as M
from torchcal.report import plots


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
    heights = np.array([r.get_height() for r in top.containers[2]])
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
    solid, _gap, sparse = top.containers[:3]
    assert len(solid) == 1 and len(sparse) == 2 and sparse.get_label() == "< 20 samples"
    assert [r.get_alpha() for r in sparse] == [0.25, 0.25]
    assert sorted(t.get_text() for t in top.texts if not t.get_text().startswith("ECE")) == [
        "1", "5"]
    assert any(line.get_ydata()[0] == 20 for line in bottom.lines)  # the min_count line
    fig = plots.reliability_diagram(probs=probs, labels=labels, n_bins=10, min_count=1)
    assert len(fig.axes[0].containers) == 2  # nothing sparse
    with pytest.raises(ValueError, match="`min_count`"):
        plots.reliability_diagram(probs=probs, labels=labels, min_count=0)
