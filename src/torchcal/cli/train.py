"""``torchcal train``: train a classifier from a recipe with any registered loss.

Examples::

    torchcal train --recipe digits-mlp --loss flsd53 --out runs/digits-flsd53
    torchcal train --recipe cifar10-resnet50 --loss focal --loss-arg gamma=3 \\
        --data-root ~/data --download --out runs/c10-r50-focal
    torchcal train --out runs/c10-r50-focal --resume            # continue a killed run
    torchrun --nproc_per_node 4 -m torchcal train --recipe cifar100-wrn26-10 --loss adafocal ...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from ..errors import TorchcalError
from ._args import fmt as _fmt
from ._args import parse_loss_args

__all__ = ["register", "parse_loss_args", "config_from_args"]


def _recipe_help() -> str:
    from ..train.recipes import list_recipes

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
    from ..train.config import TrainConfig
    from ..train.predict import read_config
    from ..train.recipes import get_recipe

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
    from ..train.trainer import train

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


def register(subparsers: Any) -> None:
    """Add ``train`` to the ``torchcal`` command line."""
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
