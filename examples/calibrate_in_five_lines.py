"""Calibrate a classifier from its saved logits: metrics, then a temperature, in five lines.

The five lines (between the ``--8<--`` markers, which the documentation's Getting started page
includes) need only two ``.npz`` files holding ``logits`` (N, C) and ``labels`` (N,): the ones
``torchcal eval`` writes to ``RUN_DIR/logits/``, or any saved with ``np.savez`` or
:func:`torchcal.logits_file.save_logits` from any framework. To make the example self-contained, it
first writes such files for an over-confident model whose labels follow ``softmax(z / 2.5)``, so
the temperature found should be close to 2.5.

Run:  python examples/calibrate_in_five_lines.py     (about a second on a CPU; no download)
      python examples/calibrate_in_five_lines.py --logits-dir runs/my-run/logits   (your own)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

# --8<-- [start:imports]
import torchcal.metrics as M
from torchcal.logits_file import load_logits, save_logits
from torchcal.posthoc import TemperatureScaling

# --8<-- [end:imports]


def write_overconfident_logits(out_dir: Path, *, n: int = 5000, n_classes: int = 10,
                               true_temperature: float = 2.5, seed: int = 0) -> None:
    """Write ``val.npz`` and ``test.npz``: logits ``z`` whose labels follow ``softmax(z / T)``."""
    g = torch.Generator().manual_seed(seed)
    for split in ("val", "test"):
        z = torch.randn(n, n_classes, generator=g) * 3
        y = torch.multinomial(torch.softmax(z / true_temperature, dim=1), 1, generator=g).squeeze(1)
        save_logits(out_dir / f"{split}.npz", z, y)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logits-dir", type=Path, default=None,
                        help="a directory with val.npz and test.npz (default: write a synthetic pair)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        logits_dir = args.logits_dir
        if logits_dir is None:
            logits_dir = Path(tmp)
            write_overconfident_logits(logits_dir)

        # --8<-- [start:five-lines]
        val_logits, val_labels = load_logits(logits_dir / "val.npz")
        test_logits, test_labels = load_logits(logits_dir / "test.npz")
        print("ECE before:", M.ece(logits=test_logits, labels=test_labels).item())
        ts = TemperatureScaling(method="grid_ece").fit(val_logits, val_labels)
        print("T =", ts.temperature_, "ECE after:", M.ece(logits=ts.transform(test_logits), labels=test_labels).item())
        # --8<-- [end:five-lines]

    return {
        "ece_before": M.ece(logits=test_logits, labels=test_labels).item(),
        "ece_after": M.ece(logits=ts.transform(test_logits), labels=test_labels).item(),
        "temperature": ts.temperature_,
    }


if __name__ == "__main__":
    main()
