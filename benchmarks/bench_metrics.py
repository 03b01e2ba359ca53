"""Speed of torchcal's calibration metrics against torchmetrics and against the floor.

    python benchmarks/bench_metrics.py                 # N=1,000,000, C=100, float32
    python benchmarks/bench_metrics.py --n 100000 --repeats 3

Within each repeat the timings of a pair are taken back to back (alternating which goes first)
and the median ratio over the repeats is printed: the machine may be shared, so absolute
times are noisy but ratios measured in the same run are meaningful.

Targets (issue 2): ECE <= 0.5x torchmetrics' MulticlassCalibrationError (l1, 15 bins);
AdaECE no slower than torchmetrics' equal-width ECE; Classwise-ECE under 2 s; each is also
shown against one ``probs.max(dim=1)`` pass (the floor of any top-label metric).
"""

from __future__ import annotations

import argparse
import statistics
import time

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


if __name__ == "__main__":
    main()
