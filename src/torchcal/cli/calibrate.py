"""``torchcal calibrate``: fit a post-hoc calibrator on saved logits.

Example::

    torchcal calibrate runs/c10-r50-focal/logits/val.npz --test runs/c10-r50-focal/logits/test.npz
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

import torch

from .. import posthoc
from .._io import exclusive_lock
from ..evaluate import load_logits, write_calibration
from ..metrics import adaptive_ece, ece, error, nll
from ..runs import RunDir
from ._args import PERCENT_NOTE, pct
from ._args import fmt as _fmt

__all__ = ["register"]


_METHODS = ("grid_ece", "grid_adaece", "grid_nll", "nll", "vector", "matrix", "dirichlet",
            "isotonic", "histogram")


def _make_calibrator(method: str, n_bins: int):
    if method in ("grid_ece", "grid_adaece", "grid_nll", "nll"):
        return posthoc.TemperatureScaling(method=method, n_bins=n_bins)
    if method == "vector":
        return posthoc.VectorScaling()
    if method == "matrix":
        return posthoc.MatrixScaling(reg="odir")
    if method == "dirichlet":
        return posthoc.DirichletCalibration()
    if method == "isotonic":
        return posthoc.IsotonicCalibration()
    return posthoc.HistogramBinning(n_bins=n_bins)


def _calib_metrics(cal, logits, labels, n_bins: int) -> dict[str, float]:

    p = torch.as_tensor(cal.predict_proba(logits)).double() if cal is not None else None
    if p is None:
        p = torch.softmax(torch.as_tensor(logits).double(), 1)
    y = torch.as_tensor(labels)
    return {"ece": float(ece(probs=p, labels=y, n_bins=n_bins, validate_args=False)),
            "adaptive_ece": float(adaptive_ece(probs=p, labels=y, n_bins=n_bins,
                                               validate_args=False)),
            "nll": float(nll(probs=p, labels=y, validate_args=False)),
            "error": float(error(probs=p, labels=y, validate_args=False))}


def _run_dir_of(path: Path) -> Path | None:
    """The run directory ``path`` lies in (``RUN/x.json``, ``RUN/sub/x.json``), or None."""
    for d in list(path.resolve().parents)[:2]:
        if RunDir(d).looks_like_run():
            return d
    return None


def _cmd_calibrate(args: argparse.Namespace) -> int:
    src = Path(args.logits)
    if src.is_dir():  # a run directory: fit on its validation logits, test on its test logits
        run = RunDir(src)
        if args.test is None and run.logits("test").is_file():
            args.test = str(run.logits("test"))
        args.logits = str(run.logits("val"))
    zv, yv = load_logits(args.logits)
    cal = _make_calibrator(args.method, args.n_bins).fit(zv, yv)
    report: dict[str, Any] = {"method": args.method, "fit_on": str(args.logits),
                              "calibrator": cal.to_dict() if hasattr(cal, "to_dict") else None,
                              "val": {"pre": _calib_metrics(None, zv, yv, args.n_bins),
                                      "post": _calib_metrics(cal, zv, yv, args.n_bins)}}
    t = getattr(cal, "temperature_", None)
    head = f"{args.method}: " + (f"T = {float(t):.4f}; " if t is not None else "")
    lines = [head + f"fit on {args.logits} ({len(yv)} samples)"]
    for split in ("val", "test"):
        if split == "test":
            if not args.test:
                continue
            zt, yt = load_logits(args.test)
            # held-out data: warns (one line) when the calibrator is worse than none there
            cal.score(zt, yt)
            report["test"] = {"pre": _calib_metrics(None, zt, yt, args.n_bins),
                              "post": _calib_metrics(cal, zt, yt, args.n_bins)}
        pre, post = report[split]["pre"], report[split]["post"]
        lines.append(f"  {split}: ECE {pct(pre['ece'])} -> {pct(post['ece'])}, AdaECE "
                     f"{pct(pre['adaptive_ece'])} -> {pct(post['adaptive_ece'])}, NLL "
                     f"{_fmt(pre['nll'])} -> {_fmt(post['nll'])}, error {pct(pre['error'])}"
                     f" -> {pct(post['error'])}")
    print("\n".join(lines))
    if args.out:
        run = _run_dir_of(Path(args.out))  # writing into a run: only while no one else owns it
        with exclusive_lock(run) if run is not None else contextlib.nullcontext():
            write_calibration(args.out, report)
        print(f"wrote {args.out}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``calibrate`` to the ``torchcal`` command line."""
    F = argparse.RawDescriptionHelpFormatter
    c = subparsers.add_parser(
        "calibrate", formatter_class=F, help="fit a post-hoc calibrator on saved logits",
        description="Fit a post-hoc calibrator on LOGITS.npz (keys: logits (N, C), labels (N,); "
                    "usually a run's\nlogits/val.npz) and print the metrics before and after; "
                    "--test applies it to other logits.",
        epilog="examples:\n  torchcal calibrate runs/c10/logits/val.npz --test "
               "runs/c10/logits/test.npz --method grid_ece --out calib.json\n"
               "  torchcal calibrate runs/c10 --method nll\n\n"
               "An --out inside a run directory is written only while no other process owns the "
               "run.\n" + PERCENT_NOTE)
    c.add_argument("logits", metavar="LOGITS.npz",
                   help="logits + labels to fit on, or a run directory (its logits/val.npz, "
                        "with --test defaulting to its logits/test.npz)")
    c.add_argument("--method", choices=_METHODS, default="grid_ece",
                   help="grid_ece / grid_adaece / grid_nll: temperature from the grid 0.1..10 "
                        "by validation ECE / AdaECE / NLL; nll: temperature minimising NLL "
                        "(LBFGS); vector: vector scaling; matrix: matrix scaling with the ODIR "
                        "regulariser; dirichlet: Dirichlet calibration (ODIR); isotonic: "
                        "one-vs-rest isotonic regression; histogram: histogram binning "
                        "(default grid_ece). A calibrator whose NLL is worse than the "
                        "uncalibrated probabilities' on the validation data (matrix, "
                        "dirichlet) or on --test is named in a warning")
    c.add_argument("--test", metavar="TEST.npz", help="logits to evaluate the fitted calibrator on")
    c.add_argument("--n-bins", type=int, default=15, help="bins of ECE and the grid search")
    c.add_argument("--out", metavar="OUT.json",
                   help="write the calibrator and metrics as JSON, with its SHA-256 beside it "
                        "(OUT.json.sha256; torchcal.evaluate.read_calibration verifies it)")
    c.add_argument("--debug", action="store_true", help="show tracebacks")
    c.set_defaults(func=_cmd_calibrate)
