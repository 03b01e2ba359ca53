"""Bad input gives a clear ValueError / TypeError naming the argument, for every metric."""

import numpy as np
import pytest
import torch

import torchcal.metrics as M

PROB_METRICS = [M.ece, M.mce, M.rmsce, M.ace, M.adaptive_ece, M.classwise_ece, M.nll, M.brier,
                M.error, M.topk_error, M.s99, M.reliability_curve, M.smooth_ece,
                M.smooth_reliability_curve, M.debiased_ece, M.ks_error]

Z = torch.tensor([[2.0, 0.0, -1.0], [0.1, 0.2, 0.3], [1.0, 1.0, 5.0]])
P = torch.softmax(Z, 1)
Y = torch.tensor([0, 2, 1])


def _call(fn, **kw):
    if fn is M.topk_error:
        kw.setdefault("k", 2)
    return fn(**kw)


@pytest.mark.parametrize("fn", PROB_METRICS)
def test_both_or_neither(fn):
    with pytest.raises(ValueError, match="exactly one of `logits` or `probs`, got both"):
        _call(fn, logits=Z, probs=P, labels=Y)
    with pytest.raises(ValueError, match="got neither"):
        _call(fn, labels=Y)


@pytest.mark.parametrize("fn", PROB_METRICS)
def test_shapes(fn):
    with pytest.raises(ValueError, match="`labels` to have 3 entries"):
        _call(fn, logits=Z, labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="`logits` to be 2-D"):
        _call(fn, logits=Z[0], labels=Y)
    with pytest.raises(ValueError, match="`labels` to be 1-D"):
        _call(fn, logits=Z, labels=Y[:, None])
    with pytest.raises(ValueError, match="`probs` to be non-empty"):
        _call(fn, probs=P[:0], labels=Y[:0])
    with pytest.raises(ValueError, match="at least 2 classes"):
        _call(fn, probs=torch.ones(3, 1), labels=torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("fn", PROB_METRICS)
def test_labels(fn):
    with pytest.raises(ValueError, match=r"`labels` to be in \[0, 2\], got values in \[0, 3\]"):
        _call(fn, logits=Z, labels=torch.tensor([0, 3, 1]))
    with pytest.raises(ValueError, match="`labels` to be in"):
        _call(fn, logits=Z, labels=np.array([-1, 0, 1]))
    with pytest.raises(TypeError, match="`labels` to have an integer dtype"):
        _call(fn, logits=Z, labels=Y.float())
    with pytest.raises(TypeError, match="`labels` to have an integer dtype"):
        _call(fn, logits=Z, labels=torch.tensor([True, False, True]))


@pytest.mark.parametrize("fn", PROB_METRICS)
def test_non_finite_and_bad_probs(fn):
    bad = Z.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match="`logits` to be finite, found 1 NaN/Inf"):
        _call(fn, logits=bad, labels=Y)
    bad[1, 1] = float("inf")
    with pytest.raises(ValueError, match="`logits` to be finite"):
        _call(fn, logits=bad, labels=Y)
    badp = P.clone()
    badp[0, 0] = float("nan")
    with pytest.raises(ValueError, match="`probs` to be finite"):
        _call(fn, probs=badp, labels=Y)
    badp[0, 0] = float("inf")
    with pytest.raises(ValueError, match="`probs` to be finite, found 1 NaN/Inf"):
        _call(fn, probs=badp, labels=Y)
    bad[1, 1] = float("-inf")  # a masked class is accepted (tests/metrics/test_metrics_inputs.py)
    bad[1, 0] = float("-inf")
    bad[1, 2] = float("-inf")  # but not a row with every class masked
    with pytest.raises(ValueError, match="every class of row 1 is masked"):
        _call(fn, logits=bad, labels=Y)
    with pytest.raises(ValueError, match=r"`probs` to lie in \[0, 1\], got values in \[-0\.5, 1\.5\]"):
        _call(fn, probs=torch.tensor([[1.5, -0.5, 0.0]] * 3), labels=Y)
    with pytest.raises(ValueError, match=r"`probs` to lie in \[0, 1\]"):
        _call(fn, probs=P * 1.5 - 0.2, labels=Y)
    with pytest.raises(ValueError, match="each row of `probs` to sum to 1"):
        _call(fn, probs=P * 0.9, labels=Y)
    with pytest.raises(TypeError, match="`probs` to have a floating dtype"):
        _call(fn, probs=torch.ones(3, 3, dtype=torch.long), labels=Y)
    with pytest.raises(TypeError, match="`logits` to be a torch.Tensor or numpy.ndarray"):
        _call(fn, logits="abc", labels=Y)


@pytest.mark.parametrize("fn", [M.ece, M.mce, M.rmsce, M.ace, M.adaptive_ece, M.classwise_ece,
                                M.reliability_curve, M.debiased_ece])
@pytest.mark.parametrize("n_bins", [0, -3, 2.5, True, "15"])
def test_n_bins(fn, n_bins):
    with pytest.raises(ValueError, match="`n_bins` to be a positive integer"):
        fn(logits=Z, labels=Y, n_bins=n_bins)


def test_k_and_threshold():
    with pytest.raises(ValueError, match="`k` to be at most the number of classes C=3, got 4"):
        M.topk_error(logits=Z, labels=Y, k=4)
    with pytest.raises(ValueError, match="`k` to be a positive integer"):
        M.topk_error(logits=Z, labels=Y, k=0)
    for t in (0.0, 1.5, float("nan"), "x"):
        with pytest.raises(ValueError, match="`threshold` to be a number in"):
            M.s99(logits=Z, labels=Y, threshold=t)


def test_validate_args_false_skips_value_checks_only():
    # row sums are not checked, but shapes and labels still are
    M.ece(probs=P * 0.9, labels=Y, validate_args=False)
    with pytest.raises(ValueError, match="`labels` to be in"):
        M.ece(probs=P, labels=torch.tensor([0, 5, 1]), validate_args=False)


def test_ranking_bad_input():
    s = torch.tensor([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="both classes for AUROC, got 0 positive and 3"):
        M.auroc(scores=s, labels=torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="`labels` to contain only 0 and 1"):
        M.auroc(scores=s, labels=torch.tensor([0, 2, 1]))
    with pytest.raises(TypeError, match="`labels` to be binary integers or bools"):
        M.aupr(scores=s, labels=torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"`labels` to have shape \(3,\)"):
        M.auroc(scores=s, labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="`scores` to be finite"):
        M.auroc(scores=torch.tensor([0.1, float("nan"), 0.3]), labels=torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="`scores` to be non-empty"):
        M.auroc(scores=torch.tensor([]), labels=torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="`scores` to be 1-D"):
        M.auroc(scores=s[None], labels=torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="at least one positive for AUPR"):
        M.aupr(scores=s, labels=torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match=r"`tpr` to be a number in \(0, 1\]"):
        M.fpr_at_tpr(scores=s, labels=torch.tensor([0, 1, 1]), tpr=0.0)
    with pytest.raises(ValueError, match="both classes for FPR@TPR"):
        M.fpr_at_tpr(scores=s, labels=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="`correct` to contain only 0 and 1"):
        M.aurc(uncertainty=s, correct=torch.tensor([0, 3, 1]))
    with pytest.raises(ValueError, match="`uncertainty` to be finite"):
        M.r_auroc(uncertainty=torch.tensor([float("inf"), 0.0, 1.0]),
                  correct=torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match=r"`score` to be one of \('entropy', 'max_prob', 'energy'"):
        M.ood_auroc(id_logits=Z, ood_logits=Z, score="free_energy")
    with pytest.raises(ValueError, match="`id_logits` to be 3-D of shape \\(S, N, C\\)"):
        M.ood_auroc(id_logits=Z, ood_logits=Z, score="mutual_information")
    with pytest.raises(ValueError, match="same number of classes, got 3 and 2"):
        M.ood_auroc(id_logits=Z, ood_logits=Z[:, :2])
    with pytest.raises(ValueError, match="`ood_logits` to be finite"):
        M.ood_auroc(id_logits=Z, ood_logits=torch.full((2, 3), float("nan")))
    with pytest.raises(ValueError, match="`id_logits` to be 2-D"):
        M.ood_auroc(id_logits=Z[0], ood_logits=Z)


def test_bootstrap_and_meter_bad_input():
    with pytest.raises(ValueError, match="`metric` to be one of"):
        M.bootstrap_ci("ecee", logits=Z, labels=Y)
    with pytest.raises(TypeError, match="`metric` to be a metric name or a callable"):
        M.bootstrap_ci(3, logits=Z, labels=Y)
    with pytest.raises(ValueError, match="`n_resamples` to be a positive integer"):
        M.bootstrap_ci("ece", logits=Z, labels=Y, n_resamples=0)
    for level in (0.0, 1.0, 1.2, True):
        with pytest.raises(ValueError, match=r"`level` to be a number in \(0, 1\)"):
            M.bootstrap_ci("ece", logits=Z, labels=Y, level=level)
    with pytest.raises(ValueError, match="`n_bins` to be a positive integer"):
        M.bootstrap_ci("ece", logits=Z, labels=Y, n_bins=0)
    for seed in (1.5, "0", None):
        with pytest.raises(TypeError, match="`seed` to be an integer"):
            M.bootstrap_ci("ece", logits=Z, labels=Y, n_resamples=3, seed=seed)
    # NumPy scalars are numbers too
    a = M.bootstrap_ci("ece", logits=Z, labels=Y, n_resamples=5, level=np.float32(0.5),
                       seed=np.int64(2))
    assert a == M.bootstrap_ci("ece", logits=Z, labels=Y, n_resamples=5, level=0.5, seed=2)
    with pytest.raises(ValueError, match="`num_classes` to be a positive integer"):
        M.CalibrationMeter(0)
    with pytest.raises(ValueError, match="`num_classes` to be at least 2"):
        M.CalibrationMeter(1)
    with pytest.raises(ValueError, match="`n_bins` to be a positive integer"):
        M.CalibrationMeter(3, n_bins=0)
    with pytest.raises(ValueError, match="`topk` to be a positive integer"):
        M.CalibrationMeter(3, topk=0)
    meter = M.CalibrationMeter(4)
    with pytest.raises(ValueError, match="`logits` to have num_classes=4 columns, got 3"):
        meter.update(logits=Z, labels=Y)
    with pytest.raises(ValueError, match="at least one sample before `compute\\(\\)`"):
        meter.compute()


def test_low_precision_probs_pass_the_row_sum_check():
    # probabilities rounded to bfloat16 (or float16) are valid input: a row sum moves by up
    # to eps/2 of the dtype (bfloat16: ~0.004), beyond the float32 tolerance of 1e-3
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(3 * torch.randn(2000, 10, generator=g), 1)
    y = torch.randint(0, 10, (2000,), generator=g)
    for dtype in (torch.bfloat16, torch.float16):
        q = p.to(dtype)
        ref = M.ece(probs=q, labels=y, validate_args=False)
        assert torch.equal(M.ece(probs=q, labels=y), ref)
    assert (p.to(torch.bfloat16).float().sum(1) - 1).abs().max() > 1e-3  # the case is real
    # a real error is still caught in bfloat16, and float32 keeps the 1e-3 tolerance
    with pytest.raises(ValueError, match=r"each row of `probs` to sum to 1 \(tolerance 0.00781\)"):
        M.ece(probs=(p * 0.95).to(torch.bfloat16), labels=y)
    with pytest.raises(ValueError, match=r"tolerance 0.001\)"):
        M.ece(probs=p * 0.998, labels=y)
