"""``torchcal calibrate``: fit a post-hoc calibrator on saved logits.

The numbers printed are held out: on ``--test``'s logits, or (without ``--test``) 5-fold
cross-validated on the fitted logits; the fit's own (in-sample) numbers are kept in the
``--out`` file as ``val.in_sample``, never printed as an improvement.

Example::

    torchcal calibrate runs/c10-r50-focal/logits/val.npz --test runs/c10-r50-focal/logits/test.npz
"""

from __future__ import annotations

import argparse
import contextlib
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.base import clone

from .. import posthoc
from .._io import exclusive_lock
from ..errors import ResultsFileError
from ..logits_file import load_logits
from ..metrics import adaptive_ece, ece, error, nll
from ..posthoc import CalibrationFitError
from ..results_file import write_calibration
from ..run_dir import RunDir
from ._args import PERCENT_NOTE, nonneg_float, pct
from ._args import fmt as _fmt

__all__ = ["register"]


_METHODS = ("grid_ece", "grid_adaece", "grid_nll", "nll", "vector", "matrix", "dirichlet",
            "isotonic", "histogram")


#: The folds of the held-out numbers printed when no --test is given.
CV_FOLDS = 5


def _make_calibrator(method: str, n_bins: int, lam: Any = None, mu: Any = None):
    if method not in ("matrix", "dirichlet") and (lam, mu) != (None, None):
        raise ValueError(f"Expected --lam/--mu only with --method matrix or dirichlet (the ODIR "
                         f"penalties), got them with --method {method}")
    if method in ("grid_ece", "grid_adaece", "grid_nll", "nll"):
        return posthoc.TemperatureScaling(method=method, n_bins=n_bins)
    if method == "vector":
        return posthoc.VectorScaling()
    penalties = {"lam": "cv" if lam is None else lam, "mu": "cv" if mu is None else mu}
    if method == "matrix":
        return posthoc.MatrixScaling(reg="odir", **penalties)
    if method == "dirichlet":
        return posthoc.DirichletCalibration(**penalties)
    if method == "isotonic":
        return posthoc.IsotonicCalibration()
    return posthoc.HistogramBinning(n_bins=n_bins)


def _held_out_proba(cal: Any, z: np.ndarray, y: np.ndarray) -> torch.Tensor:
    """Cross-validated calibrated probabilities (N, C): each of ``CV_FOLDS`` folds
    (:func:`torchcal.posthoc.cv_folds`) calibrated by a copy of ``cal`` fitted on the other
    folds, with ``lam``/``mu`` fixed at the values ``cal`` chose (its own search is not
    repeated per fold).  The copies' warnings are dropped: the fit on all the data gave them."""
    zt, yt = torch.as_tensor(z).double(), torch.as_tensor(y)  # float64: no 0 probabilities
    fixed = {k: getattr(cal, f"{k}_") for k in ("lam", "mu") if getattr(cal, k, None) == "cv"}
    out = torch.empty(zt.shape, dtype=torch.float64)
    folds = posthoc.cv_folds(len(yt), CV_FOLDS)
    for i, test in enumerate(folds):
        train = torch.cat(folds[:i] + folds[i + 1:])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            part = clone(cal).set_params(**fixed).fit(zt[train], yt[train])
            out[test] = torch.as_tensor(part.predict_proba(zt[test])).double()
    return out


def _calib_metrics(cal, logits, labels, n_bins: int, probs: Any = None) -> dict[str, float]:
    """ECE, AdaECE, NLL and error of ``cal``'s probabilities (``probs`` when given; the
    uncalibrated softmax when ``cal`` is None)."""
    if probs is not None:
        p = probs
    elif cal is not None:
        p = torch.as_tensor(cal.predict_proba(logits)).double()
    else:
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


def _load_test(test: str, val: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``--test`` logits, refused (before anything is fitted or written) when they have
    another number of classes than the validation logits: a calibrator fitted on one
    classifier means nothing on another's outputs."""
    zt, yt = load_logits(test)
    if zt.shape[1] != num_classes:
        raise ResultsFileError(f"Expected the --test logits {test!r} to have the {num_classes} "
                               f"classes (columns) of the validation logits {val!r}, got "
                               f"{zt.shape[1]}: they come from another classifier")
    return zt, yt


def _cmd_calibrate(args: argparse.Namespace) -> int:
    src = Path(args.logits)
    if src.is_dir():  # a run directory: fit on its validation logits, test on its test logits
        rdir = RunDir(src)
        if args.test is None and rdir.logits("test").is_file():
            args.test = str(rdir.logits("test"))
        args.logits = str(rdir.logits("val"))
    zv, yv = load_logits(args.logits)
    held = _load_test(args.test, args.logits, zv.shape[1]) if args.test else None
    cal = _make_calibrator(args.method, args.n_bins, args.lam, args.mu).fit(zv, yv)
    _check_calibrator(cal)  # before anything is computed with it, printed or written
    report = {"method": args.method, "fit_on": str(args.logits),
              "calibrator": cal.to_dict() if hasattr(cal, "to_dict") else None,
              "val": {"pre": _calib_metrics(None, zv, yv, args.n_bins),
                      "in_sample": _calib_metrics(cal, zv, yv, args.n_bins)}}
    lines = [_headline(args, cal, len(yv))]
    if held is not None:
        zt, yt = held
        cal.score(zt, yt)  # held-out data: warns (one line) when worse than no calibration
        report["test"] = {"pre": _calib_metrics(None, zt, yt, args.n_bins),
                          "post": _calib_metrics(cal, zt, yt, args.n_bins)}
        lines.append(_metrics_line("test", report["test"]))
    elif len(yv) >= 2 * CV_FOLDS:  # no held-out data: cross-validated numbers, never in-sample
        report["val"]["post"] = _calib_metrics(None, zv, yv, args.n_bins,
                                               probs=_held_out_proba(cal, zv, yv))
        report["val_post"] = f"{CV_FOLDS}-fold cross-validated (held out)"
        posthoc.identity_check(type(cal).__name__, report["val"]["post"]["nll"],
                               report["val"]["pre"]["nll"], f"{CV_FOLDS}-fold cross-validated")
        lines.append(_metrics_line(f"val, {CV_FOLDS}-fold cross-validated (held out)",
                                   report["val"]))
    else:
        lines.append(f"  (no --test and fewer than {2 * CV_FOLDS} samples to cross-validate: "
                     "no held-out numbers; the fit's own data would flatter it)")
    _check_metrics(cal, report)
    print("\n".join(lines))
    if args.out:
        rdir = _run_dir_of(Path(args.out))  # writing into a run: only while no one else owns it
        with exclusive_lock(rdir) if rdir is not None else contextlib.nullcontext():
            write_calibration(args.out, report)
        print(f"wrote {args.out}")
    return 0


def _headline(args: argparse.Namespace, cal: Any, n: int) -> str:
    """``METHOD: T = ...; lam = ..., mu = ... (cross-validated); fit on FILE (N samples)``."""
    t = getattr(cal, "temperature_", None)
    head = f"{args.method}: " + (f"T = {float(t):.4f}; " if t is not None else "")
    if getattr(cal, "lam_", None) is not None and cal.reg == "odir":
        how = " (chosen by cross-validation)" if "cv" in (cal.lam, cal.mu) else ""
        head += f"lam = {cal.lam_:g}, mu = {cal.mu_:g}{how}; "
    return head + f"fit on {args.logits} ({n} samples)"


def _metrics_line(label: str, split: dict[str, Any]) -> str:
    pre, post = split["pre"], split["post"]
    return (f"  {label}: ECE {pct(pre['ece'])} -> {pct(post['ece'])}, AdaECE "
            f"{pct(pre['adaptive_ece'])} -> {pct(post['adaptive_ece'])}, NLL "
            f"{_fmt(pre['nll'])} -> {_fmt(post['nll'])}, error {pct(pre['error'])}"
            f" -> {pct(post['error'])}")


def _check_calibrator(cal: Any) -> None:
    """The fitted calibrator as its reader will rebuild it (``calibrator_from_dict``: finite
    parameters in range): a fit that went wrong never replaces a good calibration file."""
    if hasattr(cal, "to_dict"):
        try:
            posthoc.calibrator_from_dict(cal.to_dict())
        except (TypeError, ValueError) as exc:
            raise CalibrationFitError(f"the fitted {type(cal).__name__} is unusable ({exc}); "
                                   "nothing written") from exc


def _check_metrics(cal: Any, report: dict[str, Any]) -> None:
    """Finite metrics (NLL aside: a probability 0 makes it infinite) before anything is
    printed or written."""
    for split in ("val", "test"):
        for stage, metrics in report.get(split, {}).items():
            bad = [k for k, v in metrics.items() if not math.isfinite(v) and k != "nll"]
            if bad:
                raise CalibrationFitError(f"the fitted {type(cal).__name__} gives non-finite "
                                       f"{split} {stage} {', '.join(bad)}; nothing written")


def _penalty(text: str) -> float | str:
    """``cv`` or a finite number >= 0 (``--lam``, ``--mu``).

    >>> _penalty("cv"), _penalty("1e5")
    ('cv', 100000.0)
    """
    return "cv" if text == "cv" else nonneg_float(text)


def _interrupt_hint(args: argparse.Namespace) -> str:
    """After Ctrl-C or SIGTERM: whether ``--out`` was kept, and the command to run again."""
    from . import again_command  # deferred: the package imports this module's register

    if not args.out:
        kept = "nothing was written (no --out)"
    else:
        kept = (f"{args.out} is whole (the earlier file or the new one)"
                if Path(args.out).is_file() else f"no {args.out} written")
    return f"{kept}; run it again: {again_command(args)}"


def register(subparsers: Any) -> None:
    """Add ``calibrate`` to the ``torchcal`` command line."""
    F = argparse.RawDescriptionHelpFormatter
    c = subparsers.add_parser(
        "calibrate", formatter_class=F, help="fit a post-hoc calibrator on saved logits",
        description="Fit a post-hoc calibrator on LOGITS.npz (keys: logits (N, C), labels (N,); "
                    "usually a run's\nlogits/val.npz) and print the metrics before and after on held-out "
                    "data: --test's logits,\nor 5-fold cross-validation on LOGITS.npz.",
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
                        "regulariser; dirichlet: Dirichlet calibration (ODIR; for both, --lam "
                        "and --mu by cross-validation unless given); isotonic: "
                        "one-vs-rest isotonic regression; histogram: histogram binning "
                        "(default grid_ece). A calibrator whose NLL is worse than the "
                        "uncalibrated probabilities' on the held-out data (--test, or the "
                        "cross-validation) or on the validation data (matrix, dirichlet) is "
                        "named in a warning")
    c.add_argument("--test", metavar="TEST.npz",
                   help="logits to evaluate the fitted calibrator on; without it the printed "
                        f"numbers are {CV_FOLDS}-fold cross-validated on LOGITS.npz (each fold "
                        "calibrated by a fit on the others), never the fit's own data")
    c.add_argument("--lam", type=_penalty, default=None, metavar="LAM|cv",
                   help="matrix / dirichlet: the ODIR weight of W's off-diagonal entries, a "
                        "number >= 0 or cv (default: chosen by 5-fold cross-validation over "
                        "1e-2 ... 1e8)")
    c.add_argument("--mu", type=_penalty, default=None, metavar="MU|cv",
                   help="matrix / dirichlet: the ODIR weight of the bias (default cv)")
    c.add_argument("--n-bins", type=int, default=15, help="bins of ECE and the grid search")
    c.add_argument("--out", metavar="OUT.json",
                   help="write the calibrator and metrics as JSON, with its SHA-256 beside it "
                        "(OUT.json.sha256; torchcal.results_file.read_calibration verifies it)")
    c.add_argument("--debug", action="store_true", help="show tracebacks")
    c.set_defaults(func=_cmd_calibrate, interrupt_hint=_interrupt_hint)
