"""``torchcal train``, ``torchcal eval`` and ``torchcal calibrate``.

Examples::

    torchcal train --recipe digits-mlp --loss flsd53 --out runs/digits-flsd53
    torchcal train --recipe cifar10-resnet50 --loss focal --loss-arg gamma=3 \\
        --data-root ~/data --download --out runs/c10-r50-focal
    torchcal train --out runs/c10-r50-focal --resume            # continue a killed run
    torchrun --nproc_per_node 4 -m torchcal train --recipe cifar100-wrn26-10 --loss adafocal ...
    torchcal eval runs/c10-r50-focal --checkpoint best
    torchcal calibrate runs/c10-r50-focal/logits/val.npz --test runs/c10-r50-focal/logits/test.npz
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import TorchcalError

__all__ = ["register", "parse_loss_args", "config_from_args"]


def _recipe_help() -> str:
    from .recipes import list_recipes

    return ", ".join(list_recipes())


def _loss_help() -> str:
    try:
        from ..losses import list_losses

        names = list_losses()
    except Exception:  # pragma: no cover - a broken loss module must not break --help
        names = []
    return ", ".join(names) if names else "see torchcal.losses.list_losses()"


def _model_help() -> str:
    from ..models import list_models

    return ", ".join(list_models())


def parse_loss_args(items: list[str] | None, option: str = "--loss-arg") -> dict[str, Any]:
    """``["gamma=3", "lam=0.1", "name=x"]`` -> ``{"gamma": 3, "lam": 0.1, "name": "x"}``.

    Values are read as JSON when they parse (numbers, true/false, null, lists), else as strings.

    >>> parse_loss_args(["gamma=3", "alpha=0.05", "flag=true", "kind=pytorch"])
    {'gamma': 3, 'alpha': 0.05, 'flag': True, 'kind': 'pytorch'}
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise ValueError(f"Expected `{option}` as KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(val)
        except json.JSONDecodeError:
            out[key] = val
    return out


# CLI option -> TrainConfig field
_OVERRIDES = {
    "epochs": "epochs", "batch_size": "batch_size", "lr": "lr", "seed": "seed",
    "device": "device", "amp": "amp", "select_best_by": "select_best_by",
    "checkpoint_every": "checkpoint_every", "num_threads": "num_threads",
    "data_root": "data_root", "weight_decay": "weight_decay", "grad_clip": "grad_clip",
    "reduction": "reduction", "num_workers": "num_workers", "val_fraction": "val_fraction",
}


def config_from_args(args: argparse.Namespace):
    """The :class:`TrainConfig` a ``torchcal train`` command line describes."""
    from .config import TrainConfig
    from .predict import read_config
    from .recipes import get_recipe

    out = Path(args.out)
    if args.resume and (out / "config.json").is_file():
        cfg = read_config(out)
        if args.recipe and cfg.recipe and args.recipe != cfg.recipe:
            raise TorchcalError(f"--recipe {args.recipe} differs from the run's recipe "
                                f"{cfg.recipe!r} in {str(out)!r}")
    else:
        if not args.recipe:
            raise TorchcalError("--recipe is required (one of: " + _recipe_help() + ")")
        cfg = get_recipe(args.recipe)
    upd: dict[str, Any] = {"out_dir": str(out), "resume": bool(args.resume)}
    if args.loss is not None:
        upd["loss"] = args.loss
        if args.loss != cfg.loss:
            upd["loss_kwargs"] = {}
    if args.loss_arg:
        upd["loss_kwargs"] = {**upd.get("loss_kwargs", cfg.loss_kwargs),
                              **parse_loss_args(args.loss_arg)}
    if args.model is not None:
        upd["model"] = args.model
        if args.model != cfg.model:
            upd["model_kwargs"] = {}
    if args.model_arg:
        upd["model_kwargs"] = {**upd.get("model_kwargs", cfg.model_kwargs),
                               **parse_loss_args(args.model_arg, "--model-arg")}
    if args.data_arg:
        upd["data_kwargs"] = {**cfg.data_kwargs, **parse_loss_args(args.data_arg, "--data-arg")}
    for opt, fld in _OVERRIDES.items():
        v = getattr(args, opt, None)
        if v is not None:
            upd[fld] = v
    if args.no_grad_clip:
        upd["grad_clip"] = None
    for flag, fld in (("download", "download"), ("compile", "compile"),
                      ("channels_last", "channels_last"), ("uncertainty_head", "uncertainty_head")):
        if getattr(args, flag):
            upd[fld] = True
    if args.no_progress:
        upd["progress"] = False
    if args.no_eval:
        upd["evaluate"] = False
    cfg = dataclasses.replace(cfg, **upd)
    if not isinstance(cfg, TrainConfig):  # pragma: no cover
        raise TypeError("internal: recipe did not give a TrainConfig")
    from ..losses import list_losses
    from ..models import list_models

    if cfg.loss not in list_losses():
        raise TorchcalError(f"Unknown loss {cfg.loss!r}; expected one of: {_loss_help()}")
    if cfg.model not in list_models():
        raise TorchcalError(f"Unknown model {cfg.model!r}; expected one of: {_model_help()}")
    return cfg.validate()


def _fmt(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4f}"


def _exit_distributed_worker() -> None:
    """End a finished ``torchrun`` worker at once (``os._exit(0)`` after flushing).

    PyTorch 2.13's DistributedDataParallel keeps its gloo process group alive after
    ``destroy_process_group`` (its worker threads survive), and such a thread may release the
    last collective's tensors while the interpreter shuts down: it then needs the GIL and
    aborts the process ("terminate called without an active exception"), so torchrun reports a
    finished run as failed.  Everything of the run is written and fsynced by now, so the worker
    skips the interpreter shutdown.  Only for a process group that ``train`` created and
    destroyed (a torchrun launch of this command).
    """
    import sys

    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not (dist.is_available()
                                                            and dist.is_initialized()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _cmd_train(args: argparse.Namespace) -> int:
    from .trainer import train

    cfg = config_from_args(args)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if cfg.resume and rank0 and not (Path(cfg.out_dir) / "checkpoints" / "last.pt").is_file():
        print(f"torchcal train: nothing to resume in {cfg.out_dir}; starting a new run")
    summary = train(cfg)
    _print_summary(cfg, summary, rank0)
    _exit_distributed_worker()
    return 0


def _print_summary(cfg, summary: dict[str, Any], rank0: bool) -> None:
    if not rank0:
        return
    f = summary["final"]
    print(f"trained {cfg.recipe or cfg.dataset} with {cfg.loss} for {cfg.epochs} epochs in "
          f"{summary['seconds']:.1f}s: val ECE {_fmt(f.get('val_ece'))}, test ECE "
          f"{_fmt(f.get('test_ece'))}, test error {_fmt(f.get('test_error'))}")
    res = summary.get("results")
    if res:
        post = res["test"]["post"].get("grid_ece", {})
        print(f"post-T (grid_ece, T={res['temperatures'].get('grid_ece', float('nan')):.2f}) "
              f"test ECE {_fmt(post.get('ece'))}; results: {Path(cfg.out_dir) / 'results.json'}")


def _cmd_eval(args: argparse.Namespace) -> int:
    from .predict import evaluate_run

    res = evaluate_run(args.run_dir, checkpoint=args.checkpoint, data_root=args.data_root,
                       device=args.device, batch_size=args.batch_size)
    pre, post = res["test"]["pre"], res["test"]["post"].get("grid_ece", {})
    t = res["temperatures"].get("grid_ece", float("nan"))
    print(f"{args.run_dir} ({args.checkpoint}): test error {_fmt(pre.get('error'))}, "
          f"ECE {_fmt(pre.get('ece'))} -> {_fmt(post.get('ece'))} (T={t:.2f}), "
          f"AdaECE {_fmt(pre.get('adaptive_ece'))}, NLL {_fmt(pre.get('nll'))}")
    for name, d in res.get("ood", {}).items():
        print(f"  OOD {name}: AUROC(entropy) {_fmt(d.get('auroc_entropy'))}")
    print(f"wrote {Path(args.run_dir) / 'results.json'} and {Path(args.run_dir) / 'logits'}/")
    return 0


_METHODS = ("grid_ece", "grid_adaece", "grid_nll", "nll", "vector", "histogram")


def _make_calibrator(method: str, n_bins: int):
    from .. import posthoc

    if method in ("grid_ece", "grid_adaece", "grid_nll", "nll"):
        return posthoc.TemperatureScaling(method=method, n_bins=n_bins)
    if method == "vector":
        return posthoc.VectorScaling()
    return posthoc.HistogramBinning(n_bins=n_bins)


def _calib_metrics(cal, logits, labels, n_bins: int) -> dict[str, float]:
    import torch

    from ..metrics import adaptive_ece, ece, error, nll

    p = torch.as_tensor(cal.predict_proba(logits)).double() if cal is not None else None
    if p is None:
        p = torch.softmax(torch.as_tensor(logits).double(), 1)
    y = torch.as_tensor(labels)
    return {"ece": float(ece(probs=p, labels=y, n_bins=n_bins, validate_args=False)),
            "adaptive_ece": float(adaptive_ece(probs=p, labels=y, n_bins=n_bins,
                                               validate_args=False)),
            "nll": float(nll(probs=p, labels=y, validate_args=False)),
            "error": float(error(probs=p, labels=y, validate_args=False))}


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .._io import atomic_write_text
    from .._io import to_jsonable as _jsonable
    from ..evaluate import load_logits

    src = Path(args.logits)
    if src.is_dir():  # a run directory: fit on its validation logits, test on its test logits
        if args.test is None and (src / "logits" / "test.npz").is_file():
            args.test = str(src / "logits" / "test.npz")
        args.logits = str(src / "logits" / "val.npz")
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
            report["test"] = {"pre": _calib_metrics(None, zt, yt, args.n_bins),
                              "post": _calib_metrics(cal, zt, yt, args.n_bins)}
        pre, post = report[split]["pre"], report[split]["post"]
        lines.append(f"  {split}: ECE {_fmt(pre['ece'])} -> {_fmt(post['ece'])}, AdaECE "
                     f"{_fmt(pre['adaptive_ece'])} -> {_fmt(post['adaptive_ece'])}, NLL "
                     f"{_fmt(pre['nll'])} -> {_fmt(post['nll'])}, error {_fmt(pre['error'])}"
                     f" -> {_fmt(post['error'])}")
    print("\n".join(lines))
    if args.out:
        atomic_write_text(args.out, json.dumps(_jsonable(report), indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``train``, ``eval`` and ``calibrate`` to the ``torchcal`` command line."""
    F = argparse.RawDescriptionHelpFormatter
    # ---------------------------------------------------------------- train
    p = subparsers.add_parser(
        "train", formatter_class=F, help="train a classifier with a calibration loss",
        description="Train a classifier with a recipe of the papers and any registered loss.\n"
                    "Writes OUT/config.json, OUT/log.jsonl, OUT/checkpoints/{last,best}.pt and, "
                    "after the last epoch,\nOUT/logits/*.npz and OUT/results.json. Launch under "
                    "torchrun for multi-process (DDP) training.",
        epilog="examples:\n  torchcal train --recipe digits-mlp --loss flsd53 --out runs/d1\n"
               "  torchcal train --recipe cifar10-resnet50 --loss focal --loss-arg gamma=3 "
               "--data-root ~/data --out runs/c10\n"
               "  torchcal train --out runs/c10 --resume")
    p.add_argument("--recipe", help=f"named recipe with the papers' settings: {_recipe_help()}")
    p.add_argument("--loss", help="training loss (registry name; default: the recipe's, ce). "
                                  f"One of: {_loss_help()}")
    p.add_argument("--loss-arg", action="append", metavar="KEY=VALUE",
                   help="loss hyperparameter, repeatable (e.g. --loss-arg gamma=3); values are "
                        "parsed as JSON when possible")
    p.add_argument("--model", help="model (registry name) instead of the recipe's, e.g. "
                                   "resnet20 or small_cnn to try a CIFAR recipe on a CPU. "
                                   f"One of: {_model_help()}")
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE",
                   help="model constructor argument, repeatable (e.g. --model-arg width=8 for "
                        "small_cnn); values are parsed as JSON when possible")
    p.add_argument("--data-root", help="directory holding (or receiving) the data set files")
    p.add_argument("--data-arg", action="append", metavar="KEY=VALUE",
                   help="data set option, repeatable (e.g. --data-arg noise_std=0.3 for digits, "
                        "--data-arg verify=false to skip the MD5 check of present archives)")
    p.add_argument("--val-fraction", type=float,
                   help="share of the training set held out for validation (default 0.1)")
    p.add_argument("--download", action="store_true",
                   help="download missing data set files (checksums verified)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory to write")
    p.add_argument("--resume", action="store_true",
                   help="continue RUN_DIR from checkpoints/last.pt (its config.json is reused; "
                        "options given here override it)")
    p.add_argument("--epochs", type=int, help="number of epochs (recipe default otherwise)")
    p.add_argument("--batch-size", type=int, help="global batch size (split across processes)")
    p.add_argument("--lr", type=float, help="initial SGD learning rate")
    p.add_argument("--weight-decay", type=float, help="SGD weight decay")
    p.add_argument("--grad-clip", type=float, help="maximum gradient 2-norm")
    p.add_argument("--no-grad-clip", action="store_true", help="disable gradient clipping")
    p.add_argument("--reduction", choices=("published", "mean", "sum"),
                   help="loss reduction over a batch: 'published' = as the papers' code "
                        "(sum for most losses, mean for Brier)")
    p.add_argument("--seed", type=int, help="seed of initialisation, data order, augmentation")
    p.add_argument("--device", help="'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:N'")
    p.add_argument("--amp", choices=("off", "bf16", "fp16"),
                   help="mixed precision on CUDA (fp16 uses a gradient scaler)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--channels-last", action="store_true",
                   help="channels-last memory format (CUDA image models)")
    p.add_argument("--select-best-by", choices=("ece", "nll", "error", "none"),
                   help="validation metric selecting checkpoints/best.pt")
    p.add_argument("--checkpoint-every", type=int, help="write last.pt every N epochs")
    p.add_argument("--uncertainty-head", action="store_true",
                   help="jointly train an uncertainty head on the detached features "
                        "(ranking loss, own AdamW)")
    p.add_argument("--num-threads", type=int, help="torch CPU threads of this process")
    p.add_argument("--num-workers", type=int, help="DataLoader workers (folder data sets)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-eval", action="store_true",
                   help="skip writing logits/ and results.json after training")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_train)

    # ---------------------------------------------------------------- eval
    e = subparsers.add_parser(
        "eval", formatter_class=F, help="evaluate a run's checkpoint into logits and results.json",
        description="Load RUN_DIR/checkpoints/<checkpoint>.pt, save validation/test/OOD logits "
                    "to RUN_DIR/logits/*.npz\nand every metric before and after temperature "
                    "scaling to RUN_DIR/results.json.",
        epilog="example:\n  torchcal eval runs/c10 --checkpoint best --data-root ~/data")
    e.add_argument("run_dir", metavar="RUN_DIR", help="a torchcal train run directory")
    e.add_argument("--checkpoint", choices=("last", "best"), default="last",
                   help="which checkpoint: the last epoch's (default, as the papers report) or "
                        "the best by validation metric")
    e.add_argument("--data-root", help="data directory (default: the one the run used)")
    e.add_argument("--device", default="cpu", help="device to run the model on (default cpu)")
    e.add_argument("--batch-size", type=int, default=None, help="prediction batch size")
    e.add_argument("--debug", action="store_true", help="show tracebacks")
    e.set_defaults(func=_cmd_eval)

    # ---------------------------------------------------------------- calibrate
    c = subparsers.add_parser(
        "calibrate", formatter_class=F, help="fit a post-hoc calibrator on saved logits",
        description="Fit a post-hoc calibrator on LOGITS.npz (keys: logits (N, C), labels (N,); "
                    "usually a run's\nlogits/val.npz) and print the metrics before and after; "
                    "--test applies it to other logits.",
        epilog="examples:\n  torchcal calibrate runs/c10/logits/val.npz --test "
               "runs/c10/logits/test.npz --method grid_ece --out calib.json\n"
               "  torchcal calibrate runs/c10 --method nll")
    c.add_argument("logits", metavar="LOGITS.npz",
                   help="logits + labels to fit on, or a run directory (its logits/val.npz, "
                        "with --test defaulting to its logits/test.npz)")
    c.add_argument("--method", choices=_METHODS, default="grid_ece",
                   help="grid_ece / grid_adaece / grid_nll: temperature from the grid 0.1..10 "
                        "by validation ECE / AdaECE / NLL; nll: temperature minimising NLL "
                        "(LBFGS); vector: vector scaling; histogram: histogram binning "
                        "(default grid_ece)")
    c.add_argument("--test", metavar="TEST.npz", help="logits to evaluate the fitted calibrator on")
    c.add_argument("--n-bins", type=int, default=15, help="bins of ECE and the grid search")
    c.add_argument("--out", metavar="OUT.json", help="write the calibrator and metrics as JSON")
    c.add_argument("--debug", action="store_true", help="show tracebacks")
    c.set_defaults(func=_cmd_calibrate)
