"""Calibration benchmark: the default ``torchcal demo`` configuration, checked against the papers.

Runs the demo (every applicable loss, 5 seeds, 100 epochs on noisy digits; or reads an existing
demo directory with ``--from DIR``) and prints, per loss, ECE / CE's ECE (per seed, same seed's
CE), the ECE before and after temperature scaling and the optimal temperatures.  Then checks the
qualitative claims of the focal-calibration papers at this scale and prints PASS/FAIL for each:

1. cross-entropy is over-confident: the grid-ECE temperature T > 1 on every seed;
2. focal, FLSD-53, dual focal and BSCE-GRA have a lower ECE than CE on every seed;
3. their test accuracy is within 2 points of CE's (mean over seeds).

Further orderings the papers claim (post-T FLSD-53/focal below post-T CE, dual focal below focal,
AdaFocal below FLSD-53 on AdaECE, the GRA variants below their base losses) are printed as
"agrees" / "DIFFERS", informational only, followed by the noise floor of the ECE estimate.

Usage::

    python benchmarks/bench_calibration.py [--workers 2] [--out DIR] [--from DIR] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

CLAIM_LOSSES = ("focal", "flsd53", "dual_focal", "bsce_gra")


def _by_loss_seed(runs):
    table = {}
    for r in runs:
        table.setdefault(r.meta["loss"], {})[r.meta.get("seed")] = r
    return table


def _ece_noise_floor(runs, draws: int = 20, n_bins: int = 15) -> float:
    """Mean ECE of a perfectly calibrated model with each run's post-T test confidences."""
    from torchcal.evaluate import load_logits

    rng = np.random.default_rng(0)
    vals = []
    for r in runs:
        p = r.run_dir / "logits" / "test.npz"
        if not p.is_file():
            continue
        z, _ = load_logits(p)
        z = z.astype(np.float64) / float(r.results["temperatures"].get("grid_ece", 1.0))
        e = np.exp(z - z.max(1, keepdims=True))
        conf = (e / e.sum(1, keepdims=True)).max(1)
        b = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
        csum = np.bincount(b, conf, minlength=n_bins)
        for _ in range(draws):
            correct = rng.random(conf.size) < conf
            asum = np.bincount(b, correct.astype(float), minlength=n_bins)
            vals.append(np.abs(asum - csum).sum() / conf.size)
    return float(np.mean(vals)) if vals else math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="demo output directory (default: a fresh one)")
    ap.add_argument("--from", dest="from_dir", default=None,
                    help="use the runs of an existing demo directory instead of training")
    ap.add_argument("--quick", action="store_true", help="the --quick demo (claims not meaningful)")
    args = ap.parse_args(argv)

    from torchcal.report.aggregate import load_runs

    t0 = time.perf_counter()
    if args.from_dir:
        root = Path(args.from_dir)
        wall = None
    else:
        from torchcal.cli.demo import DemoConfig, run_demo

        res = run_demo(DemoConfig(workers=args.workers, out=Path(args.out) if args.out else None,
                                  quick=args.quick))
        root, wall = res.out_dir, res.seconds
        print(res.report.text)
    loaded = load_runs([root / "runs" if (root / "runs").is_dir() else root])
    for p, m in loaded.errors:
        print(f"skipped {p}: {m}", file=sys.stderr)
    runs = _by_loss_seed(loaded.runs)
    if "ce" not in runs:
        print("FAIL: no cross-entropy runs to compare against")
        return 1
    seeds = sorted(runs["ce"])

    def val(r, key):
        d = r.results
        for part in key.split("."):
            d = d[part]
        return float(d)

    print(f"\nCalibration benchmark on noisy digits: {len(runs)} losses x seeds {seeds}"
          + (f", demo wall time {wall:.0f} s" if wall is not None else "") + "\n")
    hdr = (f"{'loss':<16}{'ECE%':>7}{'ECE/CE':>8}{'min..max':>12}{'postT ECE%':>11}{'AdaECE%':>9}"
           f"{'err%':>7}{'T grid_ece':>11}{'T grid_adaece':>14}{'T nll':>7}")
    print(hdr)
    print("-" * len(hdr))
    ratios = {}
    from torchcal.report.aggregate import LOSS_ORDER

    order = sorted(runs, key=lambda n: (LOSS_ORDER.index(n) if n in LOSS_ORDER else len(LOSS_ORDER), n))
    for loss in order:
        by_seed = runs[loss]
        common = [s for s in seeds if s in by_seed]
        if not common:
            continue
        r = np.array([val(by_seed[s], "test.pre.ece") / val(runs["ce"][s], "test.pre.ece") for s in common])
        ratios[loss] = r

        def m(key, scale=1.0, by_seed=by_seed, common=common):
            return np.mean([val(by_seed[s], key) for s in common]) * scale

        print(f"{loss:<16}{m('test.pre.ece', 100):>7.2f}{r.mean():>8.2f}{f'{r.min():.2f}..{r.max():.2f}':>12}"
              f"{m('test.post.grid_ece.ece', 100):>11.2f}{m('test.pre.adaptive_ece', 100):>9.2f}"
              f"{m('test.pre.error', 100):>7.2f}{m('temperatures.grid_ece'):>11.2f}"
              f"{m('temperatures.grid_adaece'):>14.2f}{m('temperatures.nll'):>7.2f}")

    print("\nClaims (papers: Mukhoti et al. 2020, Tao et al. 2023, Lin et al. 2025):")
    results = []
    ts = [val(runs["ce"][s], "temperatures.grid_ece") for s in seeds]
    results.append((all(t > 1 for t in ts),
                    f"CE over-confident, grid-ECE T > 1 on every seed: T = {', '.join(f'{t:.1f}' for t in ts)}"))
    for loss in CLAIM_LOSSES:
        if loss not in ratios:
            results.append((False, f"{loss}: no runs"))
            continue
        r = ratios[loss]
        results.append((bool((r < 1).all()),
                        f"{loss} ECE below CE's on every seed: ECE/CE per seed = "
                        + ", ".join(f"{x:.2f}" for x in r)))
        ce_acc = np.mean([1 - val(runs["ce"][s], "test.pre.error") for s in seeds])
        common = [s for s in seeds if s in runs[loss]]
        acc = np.mean([1 - val(runs[loss][s], "test.pre.error") for s in common])
        results.append((abs(acc - ce_acc) * 100 <= 2.0,
                        f"{loss} accuracy within 2 points of CE: {100 * acc:.2f}% vs {100 * ce_acc:.2f}% "
                        f"({100 * (acc - ce_acc):+.2f})"))
    for ok, msg in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {msg}")
    # further claims of the papers, printed as agree/differ (not PASS/FAIL: at this scale the
    # ordering among calibration losses is within the seed-to-seed spread)
    print("\nFurther orderings claimed by the papers (informational, mean over common seeds):")

    def mean_of(loss, key):
        return np.mean([val(runs[loss][s], key) for s in seeds if s in runs[loss]])

    comparisons = [
        ("flsd53", "ce", "test.post.grid_ece.ece", "FLSD-53 post-T ECE below CE post-T (Mukhoti et al. 2020)"),
        ("focal", "ce", "test.post.grid_ece.ece", "focal post-T ECE below CE post-T (Mukhoti et al. 2020)"),
        ("dual_focal", "focal", "test.pre.ece", "dual focal ECE below focal (Tao et al. 2023)"),
        ("adafocal", "flsd53", "test.pre.adaptive_ece",
         "AdaFocal AdaECE (equal-mass, its paper's metric) below FLSD-53 (Ghosh et al. 2022)"),
        ("bsce_gra", "bsce", "test.pre.ece", "BSCE-GRA ECE below BSCE (Lin et al. 2025)"),
        ("focal_gra", "focal", "test.pre.ece", "focal-GRA ECE below focal (Lin et al. 2025)"),
    ]
    for a, b, key, what in comparisons:
        if a not in runs or b not in runs:
            continue
        ma, mb = 100 * mean_of(a, key), 100 * mean_of(b, key)
        print(f"  {'agrees' if ma < mb else 'DIFFERS'}  {what}: {ma:.2f}% vs {mb:.2f}%")
    # the caveat the issue asks to state honestly: the noise floor of the ECE estimate
    post = {loss: np.mean([val(b[s], "test.post.grid_ece.ece") for s in b]) for loss, b in runs.items()}
    floor = _ece_noise_floor([r for b in runs.values() for r in b.values()])
    print(f"\nAfter temperature scaling the losses sit at {100 * min(post.values()):.2f}..."
          f"{100 * max(post.values()):.2f}% ECE (mean over seeds). A perfectly calibrated model with "
          f"the same post-T confidences would still show {100 * floor:.2f}% ECE on a test set of this "
          "size (labels resampled from its own confidences, 15 bins; and the 5 noisy copies of each "
          "test image are not independent): post-T differences of that order are noise.")
    print(f"Total time {time.perf_counter() - t0:.0f} s. Output: {root}")
    n_fail = sum(not ok for ok, _ in results)
    print(f"{len(results) - n_fail}/{len(results)} claims PASS")
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
