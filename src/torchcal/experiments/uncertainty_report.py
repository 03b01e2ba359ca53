"""The uncertainty benchmark's report: tables, figures, the papers' claims, the README block.

Everything here reads the units' results (:func:`torchcal.experiments.uncertainty.run_unit`)
and nothing else.  The claims and how each verdict is computed per seed:

* **Kirchhof et al. 2024**
  - ``kirchhof_unseen``: on the unseen classes the head's R-AUROC (recall@1 correctness) is
    above both the classifier's max-probability and its entropy.
  - ``kirchhof_share``: the head keeps most of its upstream R-AUROC on unseen classes: its
    R-AUROC above chance on the unseen classes is more than half of its R-AUROC above chance
    upstream (recall@1 on both sides: ``(R_unseen - 0.5) / (R_up - 0.5) > 0.5``).  That share
    and the raw share ``R_unseen / R_up`` are printed beside the paper's, like for like: 89%
    above chance and 96% raw (0.758 / 0.791).
  - ``kirchhof_cache``: a head epoch from the cache is at least 20x faster than one that
    recomputes the embeddings (one backbone pass over the fit set plus the head epoch).
  - ``kirchhof_stopgrad``: the classifier trained with a joint head behind the stop-gradient
    gives the same test logits as the one trained without (largest difference at most 1e-6).
* **Kendall et al. 2018**
  - ``kendall_frontier``: no fixed weighting of the grid has both a higher test accuracy and a
    lower translation RMSE than the learned weighting.
  - ``kendall_noise``: with noise added to the regression targets, the learned weight ratio
    ``w_translation / w_class`` is lower than without.
* **Normalised conformal intervals** (Lei et al. 2018; the regression section,
  :mod:`torchcal.experiments.uncertainty_regression`)
  - ``regression_normalized``: on the arm whose head predicts a variance per sample
    (``"learned variance"``), normalised conformal intervals (residual / σ) are narrower on
    test than split intervals (absolute residual), both conformalised on the validation split
    to 90% and both covering at least ``1 - alpha - COVERAGE_SLACK`` of the test targets (equal
    coverage: the width is compared at the coverage both promise).  It fails when the learned
    variance does not rank the errors (an uninformative σ makes the normalised interval the
    split one scaled, no narrower), or when an interval misses its coverage.

A claim about a model's predictions is not evaluated on a seed whose model is at chance (test
accuracy within :data:`~torchcal.report.claims.CHANCE_MARGIN`, 5 points, of 1 / classes: the
Kendall models on MNIST-1D's 10 classes, the Kirchhof backbone on its 5 upstream classes): its
verdict says "not evaluated (model at chance)" instead of counting a coin toss as evidence (a
--quick run's Kendall model at 12% accuracy printed "holds on 1 of 1").
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

from ..report.claims import AT_CHANCE, Claim, at_chance, check_claim_on_seeds
from .uncertainty_regression import ALPHA, LEARNED_VARIANCE

__all__ = ["CLAIMS", "seed_numbers", "claim_verdicts", "kirchhof_table", "kendall_table",
           "regression_table", "REGRESSION_COLUMNS", "COVERAGE_SLACK",
           "timing_table",
           "results_rows", "rows_csv", "write_figures", "report_markdown", "readme_block",
           "verdict_lines", "beyond_lines",
           "README_BEGIN", "README_END", "replace_readme_block"]

_KIRCHHOF, _KENDALL = "Kirchhof et al. 2024", "Kendall et al. 2018"
_LEI = "Lei et al. 2018"
#: How far below ``1 - alpha`` a conformal interval's test coverage may fall by chance before the
#: regression claim fails (the calibration split's 1,000 and the test split's 4,000 points give
#: a coverage sd of about 0.01).
COVERAGE_SLACK = 0.025


def _equal_coverage_narrower(n: dict[str, dict[str, float]]) -> bool:
    r = n["regression"]
    floor = 1 - r["alpha"] - COVERAGE_SLACK
    # relative 1e-9: the same interval computed two ways (a constant σ) is not "narrower"
    return (r["normalized width"] < r["split width"] * (1 - 1e-9)
            and r["split coverage"] >= floor
            and r["normalized coverage"] >= floor)



def _cols(part: str, *names: str) -> tuple[tuple[str, str, str], ...]:
    return tuple((part, n, n) for n in names)


#: The claims, the same :class:`~torchcal.report.claims.Claim` objects as the calibration
#: benchmark's: each compares *parts* of one seed's units (``kirchhof``, ``kendall_grid``,
#: ``kendall_noise``: :func:`seed_numbers`) instead of losses.
CLAIMS: tuple[Claim, ...] = (
    Claim("kirchhof_unseen", _KIRCHHOF,
          "on unseen classes the pretrained head's R-AUROC beats max-probability and entropy",
          ("kirchhof",), lambda n: n["kirchhof"]["head"] > n["kirchhof"]["max-prob"]
          and n["kirchhof"]["head"] > n["kirchhof"]["entropy"],
          _cols("kirchhof", "head", "max-prob", "entropy")),
    Claim("kirchhof_share", _KIRCHHOF,
          "the head keeps most of its upstream R-AUROC on unseen classes",
          ("kirchhof",), lambda n: n["kirchhof"]["share above chance"] > 0.5,
          _cols("kirchhof", "share above chance", "raw share", "upstream", "unseen")),
    Claim("kirchhof_cache", _KIRCHHOF,
          "training from the cache is at least 20x faster than recomputing embeddings",
          ("kirchhof",), lambda n: n["kirchhof"]["speed-up"] >= 20,
          _cols("kirchhof", "speed-up"), skill=False),
    Claim("kirchhof_stopgrad", _KIRCHHOF, "with the stop-gradient the classifier is unchanged",
          ("kirchhof",), lambda n: n["kirchhof"]["max abs logit difference"] <= 1e-6,
          _cols("kirchhof", "max abs logit difference"), skill=False),
    Claim("kendall_frontier", _KENDALL,
          "no fixed weighting of the grid beats the learned weighting on both tasks at once",
          ("kendall_grid",), lambda n: n["kendall_grid"]["dominating fixed weightings"] == 0,
          _cols("kendall_grid", "kendall accuracy", "kendall RMSE",
                "dominating fixed weightings")),
    Claim("kendall_noise", _KENDALL,
          "a task whose target is made noisier gets a lower learned weight",
          ("kendall_noise",),
          lambda n: n["kendall_noise"]["ratio noisy"] < n["kendall_noise"]["ratio clean"],
          _cols("kendall_noise", "ratio clean", "ratio noisy")),
    Claim("regression_normalized", _LEI,
          "with a learned variance, normalised conformal intervals are narrower than split "
          "intervals at the same 90% coverage",
          ("regression",), _equal_coverage_narrower,
          _cols("regression", "split width", "normalized width", "split coverage",
                "normalized coverage")),
)
#: The paper's R-AUROC (recall@1) of its head on unseen classes and upstream (Kirchhof et al.
#: 2024): a raw share of 96%, 89% above chance (``(0.758 - 0.5) / (0.791 - 0.5)``).
PAPER_R_UNSEEN, PAPER_R_UP = 0.758, 0.791
SETTINGS = (("upstream", "r_auroc_correct", "upstream test (classes 0-4)", "classifier"),
            ("upstream", "r_auroc_recall", "upstream test (classes 0-4)", "recall@1"),
            ("unseen classes", "r_auroc_recall", "unseen classes 5-9", "recall@1"),
            ("shifted generator", "r_auroc_correct", "shifted generator (classes 0-4)",
             "classifier"),
            ("shifted generator", "r_auroc_recall", "shifted generator (classes 0-4)",
             "recall@1"))
METHODS = (("head", "head"), ("max_prob", "max-prob"), ("entropy", "entropy"),
           ("embedding_norm", "emb. norm"))
README_BEGIN = ("<!-- uncertainty-demo: generated from {path} by "
                "torchcal.experiments.uncertainty_report; do not edit -->")
README_END = "<!-- /uncertainty-demo -->"


def _ok(units: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [u for u in units if u.get("kind") == kind and not u.get("error")]


def _value(res: dict[str, Any], method: str, key: str) -> float:
    if method == "head":
        v = res.get(key)
    else:
        v = res.get("baselines", {}).get(method, {}).get(key)
    return math.nan if v is None else float(v)


def _ms(values: list[float], digits: int = 3) -> str:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.fmean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def _mean(values: list[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.fmean(vals) if vals else math.nan


# ------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------
def kirchhof_table(units: list[dict[str, Any]], arm: str = "validation") -> str:
    """R-AUROC of the head fitted on ``arm`` and of the baselines, mean ± sd over seeds."""
    ks = [u for u in _ok(units, "kirchhof") if arm in u["heads"]]
    lines = ["| setting | correctness | " + " | ".join(m[1] for m in METHODS) + " |",
             "|---|---|" + "---|" * len(METHODS)]
    for key, metric, label, corr in SETTINGS:
        cells = [_ms([_value(u["heads"][arm][key], m, metric) for u in ks]) for m, _ in METHODS]
        lines.append(f"| {label} | {corr} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timing_table(units: list[dict[str, Any]]) -> str:
    """Cache speed-up, stop-gradient check and backbone accuracy per seed."""
    lines = ["| seed | upstream accuracy | backbone pass (s) | head epoch from cache (s) | "
             "speed-up | max abs logit difference, joint vs plain |", "|---|---|---|---|---|---|"]
    for u in sorted(_ok(units, "kirchhof"), key=lambda u: u["seed"]):
        t = u["timing"]
        lines.append(f"| {u['seed']} | {100 * u['upstream_accuracy']:.1f}% | "
                     f"{t['backbone_pass']:.4f} | {t['head_epoch_from_cache']:.4f} | "
                     f"{t['speedup']:.2f}x | {u['stopgrad_max_abs_logit_diff']:.3g} |")
    return "\n".join(lines)


def _arm_order(units: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for u in _ok(units, "kendall"):
        if u["arm"] not in seen:
            seen.append(u["arm"])
    return seen


def kendall_table(units: list[dict[str, Any]]) -> str:
    """Per arm: weights (class, translation), test accuracy and RMSE, mean ± sd over seeds."""
    ks = _ok(units, "kendall")
    lines = ["| weighting | weights (class, translation) | test accuracy (%) | "
             "translation RMSE (samples) | seeds |", "|---|---|---|---|---|"]
    for arm in _arm_order(units):
        us = [u for u in ks if u["arm"] == arm]
        w1, w2 = (_mean([u["weights"][i] for u in us]) for i in (0, 1))
        acc = _ms([100 * u["test"]["accuracy"] for u in us], 1)
        lines.append(f"| {arm} | ({w1:.3g}, {w2:.3g}) | {acc} | "
                     f"{_ms([u['test']['rmse'] for u in us], 2)} | {len(us)} |")
    return "\n".join(lines)


#: The regression table's numbers: (section key, header, digits).
REGRESSION_COLUMNS = (("sigma_scale", "σ scale", 2), ("ence_before", "ENCE", 3),
                      ("ence_after", "ENCE after σ scaling", 3), ("nll_before", "NLL", 3),
                      ("nll_after", "NLL after σ scaling", 3),
                      ("split coverage", "split coverage", 3), ("split width", "split width", 2),
                      ("normalized coverage", "normalised coverage", 3),
                      ("normalized width", "normalised width", 2),
                      ("CQR coverage", "CQR coverage", 3), ("CQR width", "CQR width", 2))


def regression_table(units: list[dict[str, Any]]) -> str:
    """Per arm with a variance: its calibration before and after σ scaling and its conformal
    intervals' test coverage and width (translation samples), mean ± sd over seeds; empty when
    no arm has the section."""
    ks = [u for u in _ok(units, "kendall") if u.get("regression")]
    if not ks:
        return ""
    lines = ["| arm | variance | " + " | ".join(h for _k, h, _d in REGRESSION_COLUMNS) + " |",
             "|---|---|" + "---|" * len(REGRESSION_COLUMNS)]
    for arm in _arm_order(ks):
        us = [u["regression"] for u in ks if u["arm"] == arm]
        cells = [_ms([r[k] for r in us], d) for k, _h, d in REGRESSION_COLUMNS]
        lines.append(f"| {arm} | {us[0]['variance']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def results_rows(units: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Long-format rows (part, seed, arm, setting, method, metric, value) of every number."""
    rows: list[dict[str, Any]] = []
    for u in _ok(units, "kirchhof"):
        for arm, sets in u["heads"].items():
            for setting, res in sets.items():
                for m, _ in METHODS:
                    for metric in ("r_auroc_correct", "r_auroc_recall"):
                        v = _value(res, m, metric)
                        if not math.isnan(v):
                            rows.append({"part": "kirchhof", "seed": u["seed"],
                                         "arm": f"fit on {arm}", "setting": setting,
                                         "method": m, "metric": metric, "value": v})
        for k, v in {**u["timing"], "stopgrad_max_abs_logit_diff":
                     u["stopgrad_max_abs_logit_diff"],
                     "upstream_accuracy": u["upstream_accuracy"]}.items():
            rows.append({"part": "kirchhof", "seed": u["seed"], "arm": "", "setting": "",
                         "method": "", "metric": k, "value": v})
    for u in _ok(units, "kendall"):
        vals = {"test_accuracy": u["test"]["accuracy"], "test_rmse": u["test"]["rmse"],
                "weight_class": u["weights"][0], "weight_translation": u["weights"][1]}
        vals.update({f"regression {k}": v for k, v in (u.get("regression") or {}).items()
                     if isinstance(v, float)})
        for k, v in vals.items():
            rows.append({"part": "kendall", "seed": u["seed"], "arm": u["arm"], "setting": "",
                         "method": "", "metric": k, "value": v})
    return rows


def rows_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["part", "seed", "arm", "setting", "method", "metric",
                                        "value"], lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "value": repr(float(r["value"]))})
    return buf.getvalue()


# ------------------------------------------------------------------------------------------
# claims
# ------------------------------------------------------------------------------------------
def _kirchhof_numbers(u: dict[str, Any]) -> dict[str, float]:
    """One seed's numbers of the Kirchhof claims (the part ``kirchhof``)."""
    h = u["heads"]["validation"]
    unseen, up = h["unseen classes"], h["upstream"]
    head, mp, en = (_value(unseen, m, "r_auroc_recall") for m in ("head", "max_prob", "entropy"))
    r_up = _value(up, "head", "r_auroc_recall")
    return {"head": head, "max-prob": mp, "entropy": en,
            "share above chance": (head - 0.5) / (r_up - 0.5) if r_up > 0.5 else math.nan,
            "raw share": head / r_up, "upstream": r_up, "unseen": head,
            "speed-up": u["timing"]["speedup"],
            "max abs logit difference": u["stopgrad_max_abs_logit_diff"],
            # upstream: the backbone's classes 0-4
            AT_CHANCE: float(at_chance(u.get("upstream_accuracy", math.nan), 5))}


def _kendall_numbers(units: list[dict[str, Any]], seed: int) -> dict[str, dict[str, float]]:
    """One seed's numbers of the Kendall claims: the parts ``kendall_grid`` (the learned
    weighting against the fixed grid) and ``kendall_noise`` (its weight ratios with and without
    target noise), each present when the seed has the arms it needs."""
    by_arm = {u["arm"]: u for u in _ok(units, "kendall") if u["seed"] == seed}
    out: dict[str, dict[str, float]] = {}
    k = by_arm.get("kendall")
    if k is None:
        return _regression_only(by_arm)
    acc, rmse = k["test"]["accuracy"], k["test"]["rmse"]
    grid = [u for a, u in by_arm.items() if a.startswith("fixed ")]
    beaters = [u["arm"] for u in grid if u["test"]["accuracy"] > acc and u["test"]["rmse"] < rmse]
    if grid:
        out["kendall_grid"] = {"kendall accuracy": acc, "kendall RMSE": rmse,
                               "dominating fixed weightings": len(beaters),
                               AT_CHANCE: float(at_chance(acc, 10))}  # MNIST-1D's 10 classes
    lv = by_arm.get(LEARNED_VARIANCE)
    if lv is not None and lv.get("regression"):
        out["regression"] = {**lv["regression"],
                             AT_CHANCE: float(at_chance(lv["test"]["accuracy"], 10))}
    noisy = by_arm.get("kendall, noisy target")
    if noisy is not None:
        out["kendall_noise"] = {"ratio clean": k["weights"][1] / k["weights"][0],
                                "ratio noisy": noisy["weights"][1] / noisy["weights"][0],
                                AT_CHANCE: float(at_chance(acc, 10)
                                                 or at_chance(noisy["test"]["accuracy"], 10))}
    return out


def _regression_only(by_arm: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    lv = by_arm.get(LEARNED_VARIANCE)
    if lv is None or not lv.get("regression"):
        return {}
    return {"regression": {**lv["regression"],
                           AT_CHANCE: float(at_chance(lv["test"]["accuracy"], 10))}}


def seed_numbers(units: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, float]]]:
    """``{seed: {part: numbers}}`` of the finished units, what the claims
    (:data:`CLAIMS`, :func:`torchcal.report.claims.check_claim_on_seeds`) are tested on."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for u in _ok(units, "kirchhof"):
        out.setdefault(u["seed"], {})["kirchhof"] = _kirchhof_numbers(u)
    for seed in sorted({u["seed"] for u in _ok(units, "kendall")}):
        parts = _kendall_numbers(units, seed)
        if parts:
            out.setdefault(seed, {}).update(parts)
    return out


def claim_verdicts(units: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One verdict per claim (:func:`~torchcal.report.claims.check_claim_on_seeds` of
    :data:`CLAIMS` on :func:`seed_numbers`): ``holds`` of ``n`` seeds, the mean of each of the
    claim's numbers, the numbers of each seed and ``at_chance``: the seeds not evaluated
    because the model was at chance."""
    numbers = seed_numbers(units)
    out = []
    for c in CLAIMS:
        res = check_claim_on_seeds(c, numbers, "mnist1d", c.losses[0])
        per_seed = [{header: nums[part][key] for part, key, header in c.columns}
                    for nums in res.numbers]
        names = [header for _p, _k, header in c.columns] if per_seed else []
        out.append({"key": c.key, "paper": c.source, "claim": c.text, "holds": res.k,
                    "n": res.n, "numbers": {k: _mean([v[k] for v in per_seed]) for k in names},
                    "per_seed": per_seed, "at_chance": len(res.at_chance)})
    return out


def _numbers_text(numbers: dict[str, float]) -> str:
    parts = []
    for k, v in numbers.items():
        if k == "speed-up":
            parts.append(f"{k} {v:.2f}x")
        elif k == "dominating fixed weightings":
            parts.append(f"{k} {v:.1f} per seed")
        elif "share" in k:
            parts.append(f"{k} {100 * v:.0f}%")
        elif k == "max abs logit difference":
            parts.append(f"{k} {v:.3g}")
        else:
            parts.append(f"{k} {v:.3f}")
    return ", ".join(parts)


def verdict_lines(verdicts: list[dict[str, Any]], *, evidence: bool = True) -> list[str]:
    """``- Paper: claim: holds on k of n seeds (numbers, means over seeds).``"""
    tag = "" if evidence else " (smoke test: not evidence)"
    lines = []
    for v in verdicts:
        fails = ", fails" if v["n"] and v["holds"] == 0 else ""
        chance = v.get("at_chance", 0)
        if not v["n"]:
            why = "model at chance" if chance else "no finished unit"
            lines.append(f"- {v['paper']}: {v['claim']}: **not evaluated ({why})**{tag}.")
            continue
        skipped = f", {chance} seed(s) not evaluated (model at chance)" if chance else ""
        numbers = _numbers_text(v["numbers"])
        if v["key"] == "kirchhof_share":  # like for like: the paper's shares beside ours
            numbers = _with_paper_shares(numbers)
        lines.append(f"- {v['paper']}: {v['claim']}: **holds on {v['holds']} of {v['n']} "
                     f"seeds**{fails}{skipped}{tag} ({numbers}; means over seeds).")
    return lines


def _with_paper_shares(numbers: str) -> str:
    """The Kirchhof share numbers with the paper's beside each: 89% above chance, 96% raw.

    >>> _with_paper_shares("share above chance 43%, raw share 74%, upstream 0.700")
    'share above chance 43% (paper: 89%), raw share 74% (paper: 96%), upstream 0.700'
    """
    above = (PAPER_R_UNSEEN - 0.5) / (PAPER_R_UP - 0.5)
    raw = PAPER_R_UNSEEN / PAPER_R_UP
    parts = numbers.split(", ")
    for i, part in enumerate(parts):
        if part.startswith("share above chance "):
            parts[i] = f"{part} (paper: {100 * above:.0f}%)"
        elif part.startswith("raw share "):
            parts[i] = f"{part} (paper: {100 * raw:.0f}%)"
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------
# figures
# ------------------------------------------------------------------------------------------
def _frontier_figure(units: list[dict[str, Any]], path: Path) -> None:
    """Test accuracy against translation RMSE: the fixed grid (a line) and Kendall's points."""
    import matplotlib.pyplot as plt  # deferred: matplotlib's import cost, only for figures

    ks = _ok(units, "kendall")
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    grid = []
    for arm in _arm_order(units):
        if arm.endswith(" only"):  # single-task anchors (in the table): they would stretch the
            continue               # axes far beyond the two-task points
        us = [u for u in ks if u["arm"] == arm]
        x = [u["test"]["rmse"] for u in us]
        y = [100 * u["test"]["accuracy"] for u in us]
        pt = (_mean(x), _mean(y), statistics.stdev(x) if len(x) > 1 else 0.0,
              statistics.stdev(y) if len(y) > 1 else 0.0)
        if arm.startswith("fixed "):
            grid.append((arm, *pt))
            continue
        style = {"kendall": ("*", "C3", 14), "kendall, noisy target": ("X", "C1", 10),
                 LEARNED_VARIANCE: ("s", "C4", 8)}.get(arm, ("D", "C2", 8))
        ax.errorbar(pt[0], pt[1], xerr=pt[2], yerr=pt[3], fmt=style[0], color=style[1],
                    ms=style[2], capsize=3, label=arm, zorder=3)
    if grid:
        grid.sort(key=lambda g: g[1])
        ax.errorbar([g[1] for g in grid], [g[2] for g in grid], xerr=[g[3] for g in grid],
                    yerr=[g[4] for g in grid], fmt="o-", color="C0", capsize=3,
                    label="fixed weights CE : MSE", zorder=2)
        for arm, x, y, *_ in grid:
            ax.annotate(arm.replace("fixed ", ""), (x, y), textcoords="offset points",
                        xytext=(6, 4), fontsize=8)
    ax.set_xlabel("translation RMSE on the test set (samples; lower is better)")
    ax.set_ylabel("digit accuracy on the test set (%; higher is better)")
    n = len({u["seed"] for u in ks})
    ax.set_title(f"Kendall et al. 2018 on MNIST-1D: fixed weights vs learned\n(mean ± sd over "
                 f"{n} seed{'s' if n != 1 else ''}; upper left is better)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _rauroc_figure(units: list[dict[str, Any]], path: Path) -> None:
    """R-AUROC of the head and the baselines, upstream and in the two transfer settings."""
    import matplotlib.pyplot as plt  # deferred: matplotlib's import cost, only for figures

    ks = [u for u in _ok(units, "kirchhof") if "validation" in u["heads"]]
    fig, ax = plt.subplots(figsize=(7.6, 4.4))
    width = 0.2
    lowest = 0.4
    labels = [f"{label.split(' (')[0]}\n{corr}" for _, _, label, corr in SETTINGS]
    for j, (m, mlabel) in enumerate(METHODS):
        means, sds = [], []
        for key, metric, *_ in SETTINGS:
            vals = [_value(u["heads"]["validation"][key], m, metric) for u in ks]
            vals = [v for v in vals if not math.isnan(v)]
            means.append(_mean(vals) if vals else math.nan)
            sds.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
        lowest = min([lowest] + [m - 0.05 for m in means if not math.isnan(m)])
        xs = [i + (j - 1.5) * width for i in range(len(SETTINGS))]
        ax.bar(xs, means, width, yerr=sds, capsize=2, label=mlabel, color=f"C{j}")
    ax.axhline(0.5, color="k", lw=0.8, ls="--")
    ax.text(-0.45, 0.505, "chance", ha="left", va="bottom", fontsize=8)
    ax.set_xticks(range(len(SETTINGS)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(lowest, 1.0)
    ax.set_ylabel("R-AUROC (higher is better)")
    n = len(ks)
    ax.set_title("Kirchhof et al. 2024 on MNIST-1D: a head fitted on held-out upstream data, "
                 f"evaluated zero-shot\n(R-AUROC, mean ± sd over {n} seed{'s' if n != 1 else ''})",
                 fontsize=10)
    ax.legend(fontsize=8, ncol=4, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_figures(units: list[dict[str, Any]], out: Path) -> list[str]:
    """Write the two figures that have data; their file names."""
    names = []
    if _ok(units, "kendall"):
        _frontier_figure(units, out / "kendall_frontier.png")
        names.append("kendall_frontier.png")
    if _ok(units, "kirchhof"):
        _rauroc_figure(units, out / "kirchhof_rauroc.png")
        names.append("kirchhof_rauroc.png")
    return names


# ------------------------------------------------------------------------------------------
# report.md and the README block
# ------------------------------------------------------------------------------------------
def _setting(p: dict[str, Any], profile: str) -> str:
    n_tr, n_va, n_te = p["upstream_sizes"]
    m_tr, m_va, m_te = p["mt_sizes"]
    grid = ", ".join(f"{w:g}" for w in p["grid"])
    return f"""Profile `{profile}`: seeds {', '.join(str(s) for s in p['seeds'])}.  Data: MNIST-1D
generated by torchcal's copy of the `mnist1d` transform chain (signals equal to the package's
bit for bit), generator seed 42, with each signal's generator parameters.

**Kirchhof et al. 2024 (pretrained uncertainty heads).**  The MNIST-1D paper's CNN (width
{p['width']}) is trained on the upstream classes 0-4 ({n_tr:,} signals; recipe `mnist1d-cnn`,
SGD 0.1, {p['backbone_epochs']} epochs, learning rate x0.1 at 150/350 and 250/350 of them).  Its
embeddings of the held-out validation split ({n_va:,} signals of classes 0-4 it never trained
on) are cached, and an uncertainty head ({p['head_width']}-{p['head_width']} MLP, ranking loss,
AdamW 1e-3, batch 256, cosine, {p['head_epochs']} epochs) is trained from the cache.  The head is
then evaluated unchanged on {n_te:,} test signals of the upstream classes, of the unseen classes
5-9 (zero-shot: correctness is recall@1 of the embeddings, since the classifier has no such
classes) and of a shifted generator (correlated noise 0.6, iid noise 0.1, shear 2.0 instead of
0.25, 0.02, 0.75; classes 0-4).  Baselines: the classifier's max-probability and entropy (over
its 5 classes, also on the unseen classes, as the url code's class-entropy), and the url code's
embedding-norm uncertainty 1/||z||.  R-AUROC: the AUROC of the uncertainty for telling wrong
from right predictions.  A second backbone is trained with a joint head behind the
stop-gradient.

**Kendall et al. 2018 (multi-task uncertainty weighting).**  Recipe `mnist1d-multitask`: one
CNN trunk (width {p['mt_width']}), a classification head (the digit) and a regression head (the
generator's translation of the signal, 0..47 samples, standardised on the training split),
{m_tr:,} training / {m_te:,} test signals, AdamW 3e-3 with a cosine schedule, {p['mt_epochs']}
epochs.  Fixed weightings (1, w) of CE and MSE for w in {{{grid}}}; Kendall's learned weighting
(log-variances initialised at 0, their own learning rate 0.05); and Kendall's weighting with
Gaussian noise of standard deviation {p['target_noise']:g} (standardised units) added to the
training translations.  RMSE in samples of the translation."""


def beyond_lines(units: list[dict[str, Any]]) -> list[str]:
    """Computed lines on what the claims do not cover (the strongest baseline, the cache's
    cost structure)."""
    ks = [u for u in _ok(units, "kirchhof") if "validation" in u["heads"]]
    if not ks:
        return []

    def cmp(key: str, metric: str, method: str) -> tuple[int, float, float]:
        pairs = [(_value(u["heads"]["validation"][key], "head", metric),
                  _value(u["heads"]["validation"][key], method, metric)) for u in ks]
        return sum(h > b for h, b in pairs), _mean([h for h, _ in pairs]), _mean(
            [b for _, b in pairs])

    n = len(ks)
    k1, h1, b1 = cmp("unseen classes", "r_auroc_recall", "embedding_norm")
    k2, h2, b2 = cmp("upstream", "r_auroc_correct", "max_prob")
    share = _mean([u["timing"]["backbone_pass"] / u["timing"]["head_epoch_from_cache"]
                   for u in ks])
    return [
        f"- On the unseen classes the url code's embedding-norm baseline (1/||z||) scores "
        f"{b1:.3f} against the head's {h1:.3f}: the head is above it on {k1} of {n} seeds.",
        f"- Upstream, where the classifier's classes apply, the head ({h2:.3f}) is above the "
        f"classifier's max-probability ({b2:.3f}) on {k2} of {n} seeds.",
        f"- A backbone pass over the fit set costs {100 * share:.0f}% of a head epoch from the "
        "cache: the small 1-D CNN is far cheaper than the 512-512 head, so the cache saves "
        "little here (the paper's 180x is for image backbones on a GPU)."]


def report_markdown(units: list[dict[str, Any]], *, profile: str, p: dict[str, Any],
                    figures: list[str], seconds: float, command: str) -> str:
    """The report of one suite run."""
    verdicts = claim_verdicts(units)
    failed = [u for u in units if u.get("error")]
    parts = [f"# torchcal demo --suite uncertainty ({profile})", "",
             f"Command: `{command}`; {seconds:.0f} s.", ""]
    if not p["evidence"]:
        parts += ["**`--quick` is a smoke test: tiny sizes, its verdicts are not evidence.**",
                  ""]
    parts += ["## Setting", "", _setting(p, profile), "",
              "## The papers' claims on this benchmark", "",
              *verdict_lines(verdicts, evidence=p["evidence"]), ""]
    beyond = beyond_lines(units)
    if beyond:
        parts += ["Beyond the claims (computed from the same units):", "", *beyond, ""]
    parts += ["## Pretrained uncertainty head: R-AUROC (mean ± sd over seeds)", "",
              kirchhof_table(units), ""]
    if any("train" in u.get("heads", {}) for u in _ok(units, "kirchhof")):
        parts += ["The same head fitted on the classifier's own training split instead (its "
                  "ranking targets are losses of fitted samples):", "",
                  kirchhof_table(units, "train"), ""]
    parts += ["## Cache and stop-gradient", "", timing_table(units), "",
              "## Multi-task weighting (test set, mean ± sd over seeds)", "",
              kendall_table(units), ""]
    reg = regression_table(units)
    if reg:
        parts += ["## Regression: the learned variance calibrated, conformal intervals (test, "
                  "mean ± sd over seeds)", "",
                  "Validation (the calibration split) fits σ scaling and the conformal "
                  f"thresholds at alpha = {ALPHA}; coverage and mean width (translation "
                  "samples) on test.  ENCE (Levi et al. 2022, 10 equal-mass σ bins) and NLL "
                  "(translation samples) of the predictive Gaussian.", "", reg, ""]
    if figures:
        parts += ["## Figures", ""] + [f"![{f}]({f})" for f in figures] + [""]
    if failed:
        parts += ["## Units that failed", ""]
        parts += [f"- {u.get('kind')} seed {u.get('seed')} {u.get('arm', '')}: "
                  f"`{u['error'].strip().splitlines()[-1]}`" for u in failed] + [""]
    return "\n".join(parts)


def readme_block(summary: dict[str, Any], path: str) -> str:
    """The README's "What the uncertainty demo shows" block from a committed results.json."""
    units = summary["units"]
    lines = [README_BEGIN.format(path=path), "",
             f"`torchcal demo --suite uncertainty --{summary['profile']}` "
             f"({len(summary['profile_sizes']['seeds'])} seeds; "
             f"[report]({Path(path).parent.as_posix()}/report.md)):", "",
             "| experiment | head | max-prob | entropy |", "|---|---|---|---|"]
    ks = [u for u in _ok(units, "kirchhof") if "validation" in u["heads"]]
    for key, metric, label, corr in SETTINGS[1:3]:
        cells = [_ms([_value(u["heads"]["validation"][key], m, metric) for u in ks])
                 for m in ("head", "max_prob", "entropy")]
        lines.append(f"| R-AUROC, {label} ({corr}) | " + " | ".join(cells) + " |")
    lines += ["", *verdict_lines(claim_verdicts(units),
                                 evidence=summary["profile_sizes"]["evidence"]), "", README_END]
    return "\n".join(lines)


def replace_readme_block(readme: str, block: str) -> str:
    """``readme`` with its uncertainty block replaced by ``block``."""
    start = readme.index(README_BEGIN.split("{path}")[0])
    end = readme.index(README_END) + len(README_END)
    return readme[:start] + block + readme[end:]
