"""CUDA: every metric runs on the input's device and equals the CPU result (skipped without a
GPU).  The probabilities are made on the CPU and moved, so both devices bin the same values;
the remaining differences are float64 summation order (atomics)."""

import math

import pytest
import torch

import torchcal.metrics as M

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _data(dtype):
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(2000, 10, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (2000,), generator=g)
    p = torch.softmax(z, 1).to(dtype)
    return p, y


def _same(a, b, tol):
    a, b = float(a), float(b)
    assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_metrics_on_cuda_equal_cpu(dtype):
    p, y = _data(dtype)
    pc, yc = p.cuda(), y.cuda()
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    for fn in (M.ece, M.mce, M.rmsce, M.adaptive_ece, M.classwise_ece, M.nll, M.brier,
               M.error, M.topk_error):
        out = fn(probs=pc, labels=yc, validate_args=dtype != torch.float16)
        assert out.device.type == "cuda" and out.ndim == 0, fn.__name__
        _same(out.cpu(), fn(probs=p, labels=y, validate_args=False), tol)
    share, acc = M.s99(probs=pc, labels=yc, validate_args=False)
    assert share.device.type == "cuda"
    ref = M.s99(probs=p, labels=y, validate_args=False)
    _same(share.cpu(), ref[0], tol)
    _same(acc.cpu(), ref[1], tol)
    curve = M.reliability_curve(probs=pc, labels=yc, validate_args=False)
    ref_curve = M.reliability_curve(probs=p, labels=y, validate_args=False)
    assert curve.counts.device.type == "cuda"
    assert torch.equal(curve.counts.cpu(), ref_curve.counts)
    assert torch.equal(curve.edges.cpu(), ref_curve.edges)
    # CPU labels with CUDA probabilities: the result stays on the probabilities' device
    assert M.ece(probs=pc, labels=y, validate_args=False).device.type == "cuda"


def test_bootstrap_meter_and_ranking_on_cuda():
    p, y = _data(torch.float32)
    pc, yc = p.cuda(), y.cuda()
    for name in ("ece", "adaptive_ece", "classwise_ece", "nll"):
        a = M.bootstrap_ci(name, probs=pc, labels=yc, n_resamples=20, seed=1)
        b = M.bootstrap_ci(name, probs=p, labels=y, n_resamples=20, seed=1)
        assert a.low.device.type == "cuda"
        for u, v in zip(a, b, strict=True):
            _same(u.cpu(), v, 1e-6)
    meter = M.CalibrationMeter(10)
    meter.update(probs=pc[:1000], labels=yc[:1000])
    meter.update(probs=pc[1000:], labels=yc[1000:])
    out = meter.compute()
    ref = M.CalibrationMeter(10)
    ref.update(probs=p, labels=y)
    for key, value in ref.compute().items():
        assert out[key].device.type == "cuda"
        _same(out[key].cpu(), value, 1e-9)
    s = p.max(1).values.double()
    c = p.argmax(1).eq(y)
    for fn, kw in ((M.auroc, {"scores": s, "labels": c}), (M.aupr, {"scores": s, "labels": c}),
                   (M.fpr_at_tpr, {"scores": s, "labels": c}),
                   (M.aurc, {"uncertainty": -s, "correct": c}),
                   (M.r_auroc, {"uncertainty": -s, "correct": c})):
        out = fn(**{k: v.cuda() for k, v in kw.items()})
        assert out.device.type == "cuda"
        _same(out.cpu(), fn(**kw), 1e-12)


@pytest.mark.parametrize("task", ["binary", "multilabel"])
def test_binary_and_multilabel_on_cuda_equal_cpu(task):
    g = torch.Generator().manual_seed(1)
    shape = (2000,) if task == "binary" else (2000, 6)
    p = torch.rand(shape, generator=g, dtype=torch.float64)
    y = (torch.rand(shape, generator=g, dtype=torch.float64) < p).long()
    y[:30] = -100
    pc, yc = p.cuda(), y.cuda()
    for fn in (M.ece, M.mce, M.rmsce, M.adaptive_ece, M.classwise_ece, M.confidence_gap):
        out = fn(probs=pc, labels=yc, task=task)
        assert out.device.type == "cuda", fn.__name__
        _same(out.cpu(), fn(probs=p, labels=y, task=task), 1e-12)
    n = None if task == "binary" else 6
    gpu, cpu = M.CalibrationMeter(n, task=task), M.CalibrationMeter(n, task=task)
    gpu.update(probs=pc, labels=yc)
    cpu.update(probs=p, labels=y)
    for key, value in gpu.compute().items():
        assert value.device.type == "cuda"
        _same(value.cpu(), cpu.compute()[key], 1e-12)
