"""Slow per-sample references written from the formulas of REFERENCE.md §2 (plain Python
loops over floats; no torchcal code), used by the metrics tests."""

from __future__ import annotations

import math

import torch


def edges_in_dtype(n_bins, dtype):
    """Equal-width edges k/B computed in ``dtype``, as Python floats (the documented rule)."""
    return [float(torch.tensor(k, dtype=dtype) / n_bins) for k in range(n_bins + 1)]


def equal_width_bin(x, n_bins, dtype):
    """#{k in 1..B-1 : e_k < x}: right-closed bins, 0 in the first bin, 1.0 in the last."""
    e = edges_in_dtype(n_bins, dtype)
    return sum(1 for k in range(1, n_bins) if e[k] < x)


def equal_mass_interior(values, n_bins):
    s = sorted(values)
    n = len(s)
    return [s[max((k * n) // n_bins - 1, 0)] for k in range(1, n_bins)]


def equal_mass_bin(x, interior):
    return sum(1 for e in interior if e < x)


def top1(probs):
    """Per-sample (confidence, prediction) as Python floats / ints (first index on ties)."""
    out = []
    for row in probs.tolist():
        best = 0
        for c in range(1, len(row)):
            if row[c] > row[best]:
                best = c
        out.append((row[best], best))
    return out


def top_label_errors(probs, labels, n_bins, *, equal_mass=False):
    """(ECE, MCE, RMSCE) by the formulas, bins from the per-sample rules above."""
    dtype = probs.dtype
    tl = top1(probs)
    ys = labels.tolist()
    confs = [c for c, _ in tl]
    interior = equal_mass_interior(confs, n_bins) if equal_mass else None
    bins = [[] for _ in range(n_bins)]
    for (c, pred), y in zip(tl, ys, strict=True):
        b = equal_mass_bin(c, interior) if equal_mass else equal_width_bin(c, n_bins, dtype)
        bins[b].append((c, 1.0 if pred == y else 0.0))
    n = len(ys)
    ece = 0.0
    mce = 0.0
    ms = 0.0
    for content in bins:
        if not content:
            continue
        nb = len(content)
        conf_b = math.fsum(c for c, _ in content) / nb
        acc_b = math.fsum(a for _, a in content) / nb
        gap = abs(acc_b - conf_b)
        ece += nb / n * gap
        ms += nb / n * gap * gap
        mce = max(mce, gap)
    return ece, mce, math.sqrt(ms)


def classwise_ece(probs, labels, n_bins):
    dtype = probs.dtype
    rows = probs.tolist()
    ys = labels.tolist()
    n, c = len(rows), len(rows[0])
    total = 0.0
    for k in range(c):
        bins = [[] for _ in range(n_bins)]
        for row, y in zip(rows, ys, strict=True):
            bins[equal_width_bin(row[k], n_bins, dtype)].append((row[k], 1.0 if y == k else 0.0))
        ece_k = 0.0
        for content in bins:
            if content:
                nb = len(content)
                conf_b = math.fsum(p for p, _ in content) / nb
                acc_b = math.fsum(a for _, a in content) / nb
                ece_k += nb / n * abs(acc_b - conf_b)
        total += ece_k
    return total / c


def nll(probs, labels):
    return math.fsum(-math.log(row[y]) for row, y in zip(probs.tolist(), labels.tolist(),
                                                          strict=True)) / len(labels)


def brier(probs, labels):
    total = []
    for row, y in zip(probs.tolist(), labels.tolist(), strict=True):
        total.append(math.fsum((p - (1.0 if c == y else 0.0)) ** 2 for c, p in enumerate(row)))
    return math.fsum(total) / len(total)
