"""A tree of fake evaluated runs for the report tests: ``ROOT/LOSS/seedK/results.json``
(:func:`test_report_aggregate.fake_results`) with random test logits (N, 5) beside each (the
``runs`` fixture of conftest.py writes one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from test_report_aggregate import fake_results  # same folder (pytest puts it on sys.path)

from torchcal.logits_file import save_logits
from torchcal.results_file import write_results


def write_runs(root: Path, losses: Sequence[str] = ("ce", "focal"), seeds: int = 1,
               n: int = 200, ece: Callable[[int, int], float] | None = None) -> Path:
    """Write ``seeds`` runs of each loss under ``root`` and return it: pre-T ECE ``ece(i,
    seed)`` for the i-th loss (default ``0.1 + 0.01 seed``), post-T ECE 0.02, T 1.5, and ``n``
    test logits ``3 N(0, 1)`` with uniform labels drawn from one generator (seed 0) in the order
    written (losses, then seeds)."""
    rng = np.random.default_rng(0)
    for i, loss in enumerate(losses):
        for seed in range(seeds):
            d = root / loss / f"seed{seed}"
            value = 0.1 + 0.01 * seed if ece is None else ece(i, seed)
            write_results(d, fake_results(loss, seed, value, 0.02, 1.5))
            z = rng.normal(size=(n, 5)).astype(np.float32) * 3
            save_logits(d / "logits" / "test.npz", z, rng.integers(0, 5, n))
    return root

