"""Speed of torchcal's calibration metrics against torchmetrics and against the floor.

    python benchmarks/bench_metrics.py                 # N=1,000,000, C=100, float32
    python benchmarks/bench_metrics.py --n 100000 --repeats 3

Within each repeat the timings of a pair are taken back to back (alternating which goes first)
and the median ratio over the repeats is printed: the machine may be shared, so absolute
times are noisy but ratios measured in the same run are meaningful.

Targets (issue 2): ECE <= 0.5x torchmetrics' MulticlassCalibrationError (l1, 15 bins);
AdaECE no slower than torchmetrics' equal-width ECE; Classwise-ECE under 2 s; each is also
shown against one ``probs.max(dim=1)`` pass (the floor of any top-label metric).

Then (``--peer-n``, default 100,000 samples) the metrics that have a reference implementation
against it on the same probabilities: ``smooth_ece`` vs ``relplot.smECE``, ``debiased_ece`` vs
``calibration.get_calibration_error`` (uncertainty-calibration), ``ks_error`` vs the spline
paper's NumPy code; each pair is checked to agree before it is timed (skipped when the
reference package is not installed).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import numpy as np
import torch

import torchcal.metrics as M


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--c", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--peer-n", type=int, default=100_000,
                    help="samples for the comparison with the reference implementations")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from torchmetrics.functional.classification import multiclass_calibration_error

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(args.n, args.c, generator=g), dim=1)  # float32
    labels = torch.randint(0, args.c, (args.n,), generator=g)
    print(f"N={args.n:,} C={args.c} float32, torch {torch.__version__}, "
          f"threads={torch.get_num_threads()}, repeats={args.repeats}")

    candidates = {
        "floor: probs.max(dim=1)": lambda: probs.max(dim=1),
        "torchmetrics ECE (l1, 15 bins)": lambda: multiclass_calibration_error(
            probs, labels, num_classes=args.c, n_bins=15, norm="l1"),
        "torchcal ece": lambda: M.ece(probs=probs, labels=labels),
        "torchcal ece (validate_args=False)": lambda: M.ece(
            probs=probs, labels=labels, validate_args=False),
        "torchcal adaptive_ece": lambda: M.adaptive_ece(probs=probs, labels=labels),
        "torchcal classwise_ece": lambda: M.classwise_ece(probs=probs, labels=labels),
        "torchcal classwise_ece (validate_args=False)": lambda: M.classwise_ece(
            probs=probs, labels=labels, validate_args=False),
    }
    # exactness check before timing: ours vs torchmetrics on this data
    ours = M.ece(probs=probs, labels=labels).item()
    theirs = candidates["torchmetrics ECE (l1, 15 bins)"]().item()
    print(f"ECE torchcal {ours:.8f}  torchmetrics {theirs:.8f}  |diff| {abs(ours - theirs):.2e}")
    for fn in candidates.values():  # warm-up
        fn()

    names = list(candidates)
    times: dict[str, list[float]] = {k: [] for k in names}
    pairs = [("torchcal ece", "torchmetrics ECE (l1, 15 bins)"),
             ("torchcal ece (validate_args=False)", "torchmetrics ECE (l1, 15 bins)"),
             ("torchcal adaptive_ece", "torchmetrics ECE (l1, 15 bins)")]
    ratios: dict[tuple[str, str], list[float]] = {p: [] for p in pairs}
    floor_ratios: dict[str, list[float]] = {k: [] for k in names[1:]}
    for r in range(args.repeats):
        order = names if r % 2 == 0 else names[::-1]
        # a floor measurement right before (or after) each candidate
        for name in order:
            if name == names[0]:
                continue
            if r % 2 == 0:
                f = _time(candidates[names[0]])
                t = _time(candidates[name])
            else:
                t = _time(candidates[name])
                f = _time(candidates[names[0]])
            times[name].append(t)
            times[names[0]].append(f)
            floor_ratios[name].append(t / f)
        for a, b in pairs:
            if r % 2 == 0:
                ta, tb = _time(candidates[a]), _time(candidates[b])
            else:
                tb, ta = _time(candidates[b]), _time(candidates[a])
            ratios[(a, b)].append(ta / tb)

    print(f"\n{'metric':46s} {'median s':>9s} {'x floor':>8s}")
    for name in names:
        fr = statistics.median(floor_ratios[name]) if name in floor_ratios else 1.0
        print(f"{name:46s} {statistics.median(times[name]):9.3f} {fr:8.2f}")
    print("\nratios measured back to back (median over repeats):")
    targets = {pairs[0]: 0.5, pairs[1]: 0.5, pairs[2]: 1.0}
    for (a, b), vals in ratios.items():
        med = statistics.median(vals)
        ok = "OK" if med <= targets[(a, b)] else "MISSED"
        print(f"  {a} / {b}: {med:.3f}  (target <= {targets[(a, b)]}: {ok})")
    cw = statistics.median(times["torchcal classwise_ece"])
    print(f"  torchcal classwise_ece: {cw:.3f} s  (target < 2 s: {'OK' if cw < 2 else 'MISSED'})")
    peers(args.peer_n, args.c, args.repeats)


def _top1_np(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 confidence and correctness in NumPy (the references' own first step)."""
    pred = p.argmax(axis=1)
    return p[np.arange(len(p)), pred], (pred == y).astype(np.float64)


def _ks_published(p: np.ndarray, y: np.ndarray) -> float:
    """The spline paper's KS error: sort, cumulative sums, the largest gap."""
    conf, correct = _top1_np(p, y)
    order = np.argsort(conf)
    n = len(conf)
    return float(np.abs(np.cumsum(conf[order]) / n - np.cumsum(correct[order]) / n).max())


def peers(n: int, c: int, repeats: int) -> None:
    """Each metric with a reference implementation, timed against it back to back."""
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(3 * torch.randn(n, c, generator=g, dtype=torch.float64), dim=1)
    labels = torch.randint(0, c, (n,), generator=g)
    p_np, y_np = probs.numpy(), labels.numpy()
    pairs = []  # every reference starts from the same (N, C) probabilities as torchcal
    relplot = _optional("relplot")
    if relplot is not None:
        pairs.append(("smooth_ece", lambda: M.smooth_ece(probs=probs, labels=labels),
                      "relplot.smECE", lambda: relplot.smECE(*_top1_np(p_np, y_np))))
    cal = _optional("calibration")
    if cal is not None:
        pairs.append(("debiased_ece", lambda: M.debiased_ece(probs=probs, labels=labels),
                      "calibration.get_calibration_error (top-label)",
                      lambda: cal.get_calibration_error(p_np, y_np, mode="top-label")))
    pairs.append(("ks_error", lambda: M.ks_error(probs=probs, labels=labels),
                  "spline paper's NumPy KS", lambda: _ks_published(p_np, y_np)))
    print(f"\nreference implementations, N={n:,} C={c} float64 (median over {repeats}):")
    for ours_name, ours, ref_name, ref in pairs:
        a, b = float(ours()), float(ref())
        t_ours, t_ref = [], []
        for r in range(repeats):
            if r % 2 == 0:
                t_ours.append(_time(ours))
                t_ref.append(_time(ref))
            else:
                t_ref.append(_time(ref))
                t_ours.append(_time(ours))
        print(f"  {ours_name:13s} {statistics.median(t_ours):7.3f} s | {ref_name} "
              f"{statistics.median(t_ref):7.3f} s | ratio "
              f"{statistics.median(t_ours) / statistics.median(t_ref):5.2f} | values "
              f"{a:.10f} vs {b:.10f} (|diff| {abs(a - b):.1e})")


def _optional(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        print(f"  ({name} is not installed: skipped)")
        return None


if __name__ == "__main__":
    main()
