"""Regression intervals on scikit-learn's diabetes data: calibrate a learned variance, then
conformal intervals with a coverage guarantee.

A small torch MLP with a Gaussian head (mean and log-variance, trained on the Gaussian NLL) and
a second one with a quantile head (the 5 %, 50 % and 95 % quantiles, trained on the pinball
loss) are fitted on 200 patients.  121 held-out patients calibrate, 121 more test:

1. the Gaussian's test NLL, CRPS, ENCE and quantile calibration error before and after
   :class:`~torchcal.regression.SigmaScaling` and :class:`~torchcal.regression.IsotonicRecalibration`;
2. 90 % intervals (alpha = 0.1): split conformal, normalised (residual / sigma), CQR and CV+
   (a ridge regression refitted on 10 folds), with their test coverage and mean width;
3. Mondrian (per sex) intervals: coverage within each group;
4. the coverage of split, normalised and CQR intervals over 1,000 random re-splits of the 242
   held-out patients into calibration and test halves (the guarantee is an average over such
   draws: mean >= 0.9; 1,000 splits put the Monte Carlo error of the mean near 0.001, 200
   near 0.003, as large as the margin 110/122 - 0.9 = 0.0016 itself);
5. two figures in the current directory: ``regression_reliability.png`` (expected against
   observed central-interval coverage) and ``sigma_reliability.png`` (RMSE against predicted
   spread per std bin), before and after sigma scaling.

Run:  python examples/regression_diabetes.py      (about 10 s on one CPU thread; the data ship
with scikit-learn, nothing is downloaded)
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_diabetes
from sklearn.linear_model import Ridge
from torch import nn

from torchcal.conformal import ConformalRegressor, conformal_quantile, cv_plus
from torchcal.conformal.regression import conformity_scores, interval_bounds, interval_parts
from torchcal.regression import (
    Gaussian,
    IsotonicRecalibration,
    Quantiles,
    SigmaScaling,
    crps,
    ence,
    gaussian_nll,
    interval_coverage,
    interval_width,
    quantile_calibration_error,
    regression_reliability_diagram,
    sigma_reliability_diagram,
)

ALPHA = 0.1
LEVELS = (ALPHA / 2, 0.5, 1 - ALPHA / 2)  # the quantile head's levels
N_TRAIN, N_CAL = 200, 121  # the remaining 121 patients are the test set
GRID = [k / 100 for k in range(1, 100)]  # quantile levels to compare Gaussian and isotonic


def mlp(n_in: int, n_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(n_in, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, n_out))


def train(net: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, epochs: int) -> None:
    """Full-batch AdamW (200 rows: one batch)."""
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-2)
    for _ in range(epochs):
        loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def gaussian_head(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, log-variance) of a (N, 2) output, Kendall et al.'s head."""
    return out[:, 0], out[:, 1].clamp(-10, 10)


def quantile_head(out: torch.Tensor) -> torch.Tensor:
    """(N, 3) non-crossing quantiles: the median and two softplus offsets below / above it."""
    med = out[:, 0]
    return torch.stack([med - F.softplus(out[:, 1]), med, med + F.softplus(out[:, 2])], 1)


def pinball(q: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    tau = torch.tensor(LEVELS, dtype=q.dtype)
    diff = y.unsqueeze(1) - q
    return torch.maximum(tau * diff, (tau - 1) * diff).mean()


def load(seed: int):
    """Standardised inputs, targets in the data's unit (a disease-progression score), and the
    seeded train / calibration / test indices."""
    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.float32)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    tr, cal, te = perm[:N_TRAIN], perm[N_TRAIN:N_TRAIN + N_CAL], perm[N_TRAIN + N_CAL:]
    x = (x - x[tr].mean(0)) / x[tr].std(0)
    sex = (x[:, 1] > 0).long()  # the data's second column: two values, one per sex
    return x, y, sex, tr, cal, te


def fit_models(x, y, tr, epochs: int):
    """The Gaussian model and the quantile model; both predict in the target's unit."""
    m, s = y[tr].mean(), y[tr].std()
    yz = (y - m) / s
    gauss, quant = mlp(x.shape[1], 2), mlp(x.shape[1], 3)

    def nll(out, target):
        mean, log_var = gaussian_head(out)
        return F.gaussian_nll_loss(mean, target, log_var.exp())

    train(gauss, nll, x[tr], yz[tr], epochs)
    train(quant, lambda out, target: pinball(quantile_head(out), target), x[tr], yz[tr], epochs)

    @torch.no_grad()
    def predict(idx):
        mean, log_var = gaussian_head(gauss(x[idx]))
        g = Gaussian(mean * s + m, log_var=log_var + 2 * torch.log(s))
        q = Quantiles(quantile_head(quant(x[idx])) * s + m, LEVELS)
        return g, q

    return predict


def calibration_table(g_cal, y_cal, g_te, y_te) -> dict:
    """Test NLL, CRPS, ENCE and quantile calibration error before and after each calibrator."""
    ss = SigmaScaling().fit(g_cal, y_cal)
    iso = IsotonicRecalibration(levels=GRID).fit(g_cal, y_cal)
    g_ss, q_iso = ss.transform(g_te), iso.quantiles(g_te)
    rows = {}
    for name, pred in (("uncalibrated", g_te), ("sigma scaling", g_ss)):
        rows[name] = {"nll": float(gaussian_nll(pred, y_te)), "crps": float(crps(pred, y_te)),
                      "ence": float(ence(pred, y_te, n_bins=5)),
                      "qce": float(quantile_calibration_error(pred.quantiles(GRID), y_te))}
    rows["isotonic"] = {"nll": None, "crps": float(crps(q_iso, y_te)), "ence": None,
                        "qce": float(quantile_calibration_error(q_iso, y_te))}
    print(f"\n1. Calibrating the learned variance (fitted on the {len(y_cal)} calibration "
          f"patients,\n   scored on the {len(y_te)} test patients)")
    print(f"   sigma scaling: s = {ss.scale_:.3f} (the predicted std was "
          f"{'too small' if ss.scale_ > 1 else 'too large'})")
    print(f"   {'':15s} {'NLL':>7s} {'CRPS':>7s} {'ENCE':>7s} {'QCE':>7s}")
    for name, r in rows.items():
        cells = ["      -" if r[k] is None else f"{r[k]:7.3f}" for k in ("nll", "crps", "ence",
                                                                         "qce")]
        print(f"   {name:15s} {' '.join(cells)}")
    crps_grid = float(crps(g_te.quantiles(GRID), y_te))
    print("   isotonic outputs quantiles at 0.01, ..., 0.99: its CRPS is their pinball form\n"
          f"   (the same form gives {crps_grid:.3f} for the uncalibrated Gaussian). QCE: mean\n"
          "   |observed - expected| coverage of the 49 central intervals of those levels;\n"
          "   ENCE: 5 equal-mass std bins.")
    return {"sigma_scaling": ss, "rows": rows}


def intervals(pred_cal, y_cal, pred_te, y_te, x, y, tr, cal, te) -> dict:
    """Split / normalised / CQR / CV+ intervals at ALPHA: test coverage and mean width."""
    (g_cal, q_cal), (g_te, q_te) = pred_cal, pred_te
    out = {}
    lo, hi = g_te.interval(ALPHA)  # the model's own 90 % interval, for comparison
    out["Gaussian's own interval"] = (float(interval_coverage((lo, hi), y_te)),
                                      float(interval_width((lo, hi), y_te)))
    for name, score, pc, pt in (("split (absolute)", "absolute", g_cal.mean, g_te.mean),
                                ("normalized", "normalized", g_cal, g_te),
                                ("CQR", "cqr", q_cal, q_te)):
        cr = ConformalRegressor(alpha=ALPHA, score=score).fit(pc, y_cal)
        lo, hi = cr.predict_interval(pt)
        out[name] = (float(interval_coverage((lo, hi), y_te)), float(interval_width((lo, hi),
                                                                                    y_te)))

    # CV+: a ridge regression refitted on 10 folds of the 321 train + calibration patients
    def fit_predict(x_train, y_train, x_eval):
        return Ridge(alpha=1.0).fit(x_train, y_train).predict(x_eval)

    trval = torch.cat([tr, cal])
    xa, ya = x.numpy(), y.numpy()
    lo, hi = cv_plus(fit_predict, xa[trval], ya[trval], xa[te], alpha=ALPHA, n_folds=10,
                     random_state=0)
    out["CV+ (ridge, 10 folds)"] = (float(interval_coverage((lo, hi), ya[te])),
                                    float(interval_width((lo, hi), ya[te])))
    # split conformal with the same ridge (trained on the 200, calibrated on the 121)
    ridge = Ridge(alpha=1.0).fit(xa[tr], ya[tr])
    cr = ConformalRegressor(alpha=ALPHA).fit(ridge.predict(xa[cal]), ya[cal])
    lo, hi = cr.predict_interval(ridge.predict(xa[te]))
    out["split (ridge)"] = (float(interval_coverage((lo, hi), ya[te])),
                            float(interval_width((lo, hi), ya[te])))
    print(f"\n2. Intervals at alpha = {ALPHA} (target 90 % coverage) on the {len(te)} test "
          f"patients\n   (the target's standard deviation is {float(y.std()):.1f})")
    print(f"   {'method':28s} {'coverage':>8s} {'mean width':>10s}")
    for name, (cov, width) in out.items():
        print(f"   {name:28s} {cov:8.3f} {width:10.1f}")
    return out


def mondrian(g_cal, y_cal, g_te, y_te, sex_cal, sex_te) -> dict:
    """Pooled against per-sex (Mondrian) thresholds: coverage within each group."""
    pooled = ConformalRegressor(alpha=ALPHA, score="normalized").fit(g_cal, y_cal)
    per = ConformalRegressor(alpha=ALPHA, score="normalized").fit(g_cal, y_cal, groups=sex_cal)
    lo_p, hi_p = pooled.predict_interval(g_te)
    lo_m, hi_m = per.predict_interval(g_te, groups=sex_te)
    print("\n3. Mondrian (one threshold per sex), normalized score")
    print(f"   {'group':6s} {'n cal':>5s} {'n test':>6s} {'pooled cov':>10s} "
          f"{'Mondrian cov':>12s} {'threshold':>9s}")
    out = {}
    for i, label in enumerate(per.groups_.tolist()):
        k = sex_te == label
        cov_p = float(interval_coverage((lo_p[k], hi_p[k]), y_te[k]))
        cov_m = float(interval_coverage((lo_m[k], hi_m[k]), y_te[k]))
        print(f"   {label:<6d} {int(per.group_counts_[i]):5d} {int(k.sum()):6d} {cov_p:10.3f} "
              f"{cov_m:12.3f} {float(per.threshold_[i]):9.3f}")
        out[label] = (cov_p, cov_m)
    return out


def resplits(preds, y_pool, n_splits: int, seed: int) -> dict:
    """Coverage of split / normalised / CQR intervals over random calibration / test halves of
    the pooled held-out patients: every split at once, as a (B, n) batch (no Python loop over
    splits)."""
    n = y_pool.numel()
    n_cal = n // 2
    perm = torch.rand(n_splits, n, generator=torch.Generator().manual_seed(seed)).argsort(1)
    cal_idx, te_idx = perm[:, :n_cal], perm[:, n_cal:]
    print(f"\n4. Coverage over {n_splits} random calibration / test splits of the {n} held-out "
          f"patients\n   ({n_cal} calibration, {n - n_cal} test each);\n   the guarantee: mean >= "
          f"{1 - ALPHA:.2f}, and <= 1 - alpha + 1/(n_cal + 1) = "
          f"{1 - ALPHA + 1 / (n_cal + 1):.3f} without ties")
    k = math.ceil((n_cal + 1) * (1 - ALPHA))
    print(f"   (exact expectation for continuous scores: k / (n_cal + 1) = {k}/{n_cal + 1} = "
          f"{k / (n_cal + 1):.4f})")
    print(f"   {'method':18s} {'mean cov':>8s} {'+- s.e.':>7s} {'sd':>6s} {'min':>6s} "
          f"{'max':>6s} {'mean width':>10s}")
    out = {}
    for name, score, pred in preds:
        parts = interval_parts(pred, score, ALPHA)
        s = conformity_scores(parts, y_pool.to(parts.lo.dtype))  # (n,)
        q = conformal_quantile(s[cal_idx], ALPHA, dim=1)  # (B,) one threshold per split
        sub = parts._replace(lo=parts.lo[te_idx], hi=parts.hi[te_idx],
                             scale=None if parts.scale is None else parts.scale[te_idx])
        lo, hi = interval_bounds(sub, q.unsqueeze(1))  # (B, n_test)
        yt = y_pool[te_idx]
        cov = ((lo <= yt) & (yt <= hi)).double().mean(1)
        width = (hi - lo).double().mean()
        se = float(cov.std()) / math.sqrt(n_splits)
        out[name] = float(cov.mean())
        print(f"   {name:18s} {cov.mean():8.4f} {se:7.4f} {cov.std():6.3f} {cov.min():6.3f} "
              f"{cov.max():6.3f} {width:10.1f}")
    ok = all(v >= 1 - ALPHA for v in out.values())
    print(f"   every mean coverage >= {1 - ALPHA:.2f}: {ok}")
    return out


def figures(g_te, g_ss, y_te, out_dir: Path) -> list[Path]:
    """Reliability diagrams before / after sigma scaling, side by side, as two PNGs."""
    # deferred: matplotlib is only needed for the figures (start-up time)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paths = []
    for name, draw in (("regression_reliability.png", regression_reliability_diagram),
                       ("sigma_reliability.png", sigma_reliability_diagram)):
        fig = Figure(figsize=(9.6, 4.8), dpi=100)
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, 2)
        kw = {"n_bins": 5} if draw is sigma_reliability_diagram else {}
        draw(g_te, y_te, ax=axes[0], title="test, uncalibrated", **kw)
        draw(g_ss, y_te, ax=axes[1], title="test, after sigma scaling", **kw)
        top = max(max(ax.get_xlim()[1], ax.get_ylim()[1]) for ax in axes)
        for ax in axes:  # one scale for both panels, so that they compare at a glance
            ax.plot([0, top], [0, top], linestyle="--", color="gray", linewidth=1)
            ax.set_xlim(0, top)
            ax.set_ylim(0, top)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--splits", type=int, default=1000)
    parser.add_argument("--out-dir", type=Path, default=Path("."),
                        help="where the two PNG figures are written (default: here)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    x, y, sex, tr, cal, te = load(args.seed)
    predict = fit_models(x, y, tr, args.epochs)
    (g_cal, q_cal), (g_te, q_te) = predict(cal), predict(te)
    y_cal, y_te = y[cal], y[te]
    print(f"diabetes: {len(y)} patients, {x.shape[1]} features; train {len(tr)}, calibration "
          f"{len(cal)}, test {len(te)};\ntest RMSE of the Gaussian model's mean "
          f"{float((g_te.mean - y_te).square().mean().sqrt()):.1f}")
    with warnings.catch_warnings():
        # a calibrator that does worse than none on its data says so: show it, once
        warnings.simplefilter("default")
        table = calibration_table(g_cal, y_cal, g_te, y_te)
    ivals = intervals((g_cal, q_cal), y_cal, (g_te, q_te), y_te, x, y, tr, cal, te)
    groups = mondrian(g_cal, y_cal, g_te, y_te, sex[cal], sex[te])
    pool = torch.cat([cal, te])
    g_pool, q_pool = predict(pool)
    cover = resplits([("split (absolute)", "absolute", g_pool.mean),
                      ("normalized", "normalized", g_pool), ("CQR", "cqr", q_pool)],
                     y[pool], args.splits, args.seed)
    paths = figures(g_te, table["sigma_scaling"].transform(g_te), y_te, args.out_dir)
    print(f"\n5. wrote {', '.join(str(p) for p in paths)}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    return {"calibration": table["rows"], "intervals": ivals, "mondrian": groups,
            "resplit_coverage": cover}


if __name__ == "__main__":
    torch.set_num_threads(1)
    np.set_printoptions(precision=4)
    main()
