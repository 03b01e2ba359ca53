"""Compare two runs of one benchmark (e.g. ``torchcal demo --full`` packed and ``--no-pack``):
per loss, the mean over seeds of each headline number in both, the difference against the seeds'
spread, and every claim's verdict in both.

A number "moves beyond the seeds' spread" when the two means differ by more than the larger of
the two standard deviations over seeds (the spread one more seed could move a mean by).

Usage::

    python benchmarks/compare_runs.py A/results.csv B/results.csv [--names packed,unpacked]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from torchcal.report.aggregate import group_runs, runs_from_results_csv
from torchcal.report.claims import check_claims

# (key of results.csv, label, scale): the README front table's numbers
NUMBERS = (("test.pre.ece", "ECE pre T %", 100), ("test.post.grid_ece.ece", "ECE post T %", 100),
           ("test.pre.adaptive_ece", "AdaECE pre T %", 100),
           ("test.pre.conf_minus_acc", "conf - acc %", 100), ("test.pre.error", "error %", 100),
           ("temperature.grid_ece", "T", 1))


def _groups(path: str):
    return {g.loss: g for g in group_runs(runs_from_results_csv(Path(path).read_text()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--names", default="A,B")
    args = ap.parse_args()
    na, nb = args.names.split(",")
    ga, gb = _groups(args.a), _groups(args.b)
    moved = []
    print(f"| loss | number | {na} | {nb} | difference | larger std |")
    print("|---|---|---:|---:|---:|---:|")
    for loss in ga:
        if loss not in gb:
            continue
        for key, label, scale in NUMBERS:
            a, b = ga[loss], gb[loss]
            ma, mb = a.mean.get(key), b.mean.get(key)
            if ma is None or mb is None:
                continue
            spread = max(a.std.get(key, 0.0), b.std.get(key, 0.0))
            diff = mb - ma
            flag = abs(diff) > spread
            if flag:
                moved.append(f"{a.label} {label}: {ma * scale:.2f} vs {mb * scale:.2f}")
            print(f"| {a.label} | {label} | {ma * scale:.2f} ± {a.std.get(key, 0) * scale:.2f} | "
                  f"{mb * scale:.2f} ± {b.std.get(key, 0) * scale:.2f} | {diff * scale:+.2f}"
                  f"{' **beyond**' if flag else ''} | {spread * scale:.2f} |")
    print()
    print(f"Numbers whose means differ by more than the seeds' spread: {len(moved)}")
    for m in moved:
        print(f"- {m}")
    print()
    print(f"| claim | {na} | {nb} |")
    print("|---|---|---|")
    ca = check_claims(list(ga.values()))
    cb = {r.claim.key: r for r in check_claims(list(gb.values()))}
    same = True
    for r in ca:
        o = cb[r.claim.key]
        same &= (r.k, r.n) == (o.k, o.n)
        print(f"| {r.claim.key} | {r.verdict} | {o.verdict} |")
    print()
    print("Verdicts: " + ("the same" if same else "DIFFERENT"))


if __name__ == "__main__":
    main()
