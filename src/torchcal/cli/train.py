"""``torchcal train``: train a classifier from a recipe with any registered loss.

Examples::

    torchcal train --recipe digits-mlp --loss flsd53 --out runs/digits-flsd53
    torchcal train --recipe cifar10-resnet50 --loss focal --loss-arg gamma=3 \\
        --data-root ~/data --download --out runs/c10-r50-focal
    torchcal train --out runs/c10-r50-focal --resume            # continue a killed run

One process owns a run directory: a second ``train`` (or ``eval``, ...) of the same directory
fails at once, naming the process that holds it.  Ctrl-C prints the command that continues the
run; resuming a finished run trains nothing and says so.
    torchrun --nproc_per_node 4 -m torchcal train --recipe cifar100-wrn26-10 --loss adafocal ...
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .._io import read_json, read_lock_command
from .._registry import unknown_name
from ..errors import TorchcalError
from ..losses import list_losses
from ..models import list_models
from ..run_dir import RunDir
from ..train.config import TrainConfig, changed_fields, cli_fields
from ..train.evaluation import read_config
from ..train.pack_commit import reconcile_staged
from ..train.recipes import get_recipe, list_recipes
from ..train.trainer import train
from ._args import PERCENT_NOTE, parse_loss_args, parse_loss_args_per_loss, pct

__all__ = ["register", "config_from_args"]


def _recipe_help() -> str:
    return ", ".join(list_recipes())


def _loss_help() -> str:
    try:
        names = list_losses()
    except Exception:  # pragma: no cover - a broken loss module must not break --help
        names = []
    return ", ".join(names) if names else "see torchcal.losses.list_losses()"


def _model_help() -> str:
    return ", ".join(list_models())


def _declared_flags(args: argparse.Namespace, cfg: TrainConfig) -> dict[str, Any]:
    """The fields of ``cfg`` that the declared flags of the command line set
    (:func:`~torchcal.train.config.cli_fields`): ``{"epochs": 3, "multitask": MultitaskConfig(...)}``
    (a plug-in's group is ``cfg``'s with the given fields replaced)."""
    upd: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for path, flag in cli_fields(type(cfg)):
        v = getattr(args, flag.dest, None)
        if flag.switch:
            if not v:
                continue
            v = flag.const
        elif v is None:
            continue
        elif flag.convert is not None:
            v = flag.convert(v)
        if len(path) == 1:
            upd[path[0]] = v
        else:  # a plug-in group's field (cli_fields goes one level deep)
            groups.setdefault(path[0], {})[path[1]] = v
    for name, kw in groups.items():
        upd[name] = dataclasses.replace(getattr(cfg, name), **kw)
    return upd


def config_from_args(args: argparse.Namespace):
    """The :class:`TrainConfig` a ``torchcal train`` command line describes."""
    out = Path(args.out)
    if args.resume and RunDir(out).config.is_file():
        cfg = read_config(out)
        if args.recipe and cfg.recipe and args.recipe != cfg.recipe:
            raise TorchcalError(f"--recipe {args.recipe} differs from the run's recipe "
                                f"{cfg.recipe!r} in {str(out)!r}")
    else:
        if not args.recipe:
            if args.resume:
                raise TorchcalError(_nothing_to_resume(out))
            raise TorchcalError("--recipe is required (one of: " + _recipe_help() + ")")
        cfg = get_recipe(args.recipe)
    upd: dict[str, Any] = {"out_dir": str(out), "resume": bool(args.resume)}
    if args.loss is not None:
        upd["loss"] = args.loss
        if args.loss != cfg.loss:
            upd["loss_kwargs"] = {}
    if args.loss_arg:
        loss = upd.get("loss", cfg.loss)
        upd["loss_kwargs"] = {**upd.get("loss_kwargs", cfg.loss_kwargs),
                              **parse_loss_args_per_loss(args.loss_arg, [loss]).get(loss, {})}
    if args.model is not None:
        upd["model"] = args.model
        if args.model != cfg.model:
            upd["model_kwargs"] = {}
    if args.model_arg:
        upd["model_kwargs"] = {**upd.get("model_kwargs", cfg.model_kwargs),
                               **parse_loss_args(args.model_arg, "--model-arg")}
    if args.data_arg:
        upd["data_kwargs"] = {**cfg.data_kwargs, **parse_loss_args(args.data_arg, "--data-arg")}
    upd.update(_declared_flags(args, cfg))
    cfg = dataclasses.replace(cfg, **upd)
    if not isinstance(cfg, TrainConfig):  # pragma: no cover
        raise TypeError("internal: recipe did not give a TrainConfig")

    if cfg.loss not in list_losses():
        raise TorchcalError(unknown_name("loss", cfg.loss, list_losses()))
    if cfg.model not in list_models():
        raise TorchcalError(unknown_name("model", cfg.model, list_models()))
    return cfg.validate()


def _nothing_to_resume(out: Path) -> str:
    """Why ``--resume`` without ``--recipe`` cannot go on, and exactly what to run instead."""
    if not out.exists():
        return (f"Nothing to resume: {str(out)!r} does not exist. Start a new run with --recipe "
                f"(one of: {_recipe_help()}), e.g. torchcal train --recipe digits-mlp "
                f"--out {shlex.quote(str(out))}")
    recorded = read_lock_command(out)  # the command of a process killed before config.json
    lead = (f"Cannot resume {str(out)!r} without --recipe: it has no {RunDir(out).config.name} "
            "(its run was stopped before saving its settings, so no epoch was trained)")
    if recorded and " train " in f" {recorded} " and "--recipe" in recorded:
        again = recorded if "--resume" in recorded.split() else recorded + " --resume"
        return f"{lead}. Run its command again: {again}"
    return (f"{lead}. Pass the --recipe (one of: {_recipe_help()}) and options of the original "
            f"command, e.g. torchcal train --recipe digits-mlp --out {shlex.quote(str(out))} "
            "--resume")


def _finished(cfg) -> bool:
    """Whether ``cfg.out_dir`` holds all ``cfg.epochs`` epochs and their evaluation (or needs
    none) of a run with ``cfg``'s identity: a resume would train nothing.  A changed identity
    field is not "finished": the trainer refuses it, naming the fields."""
    rdir = RunDir(cfg.out_dir)
    if not rdir.has_checkpoint("last"):
        return False
    try:
        meta = read_json(rdir.results(), what="Results file").get("meta", {})
        done = int(meta.get("epoch")) == cfg.epochs and meta.get("checkpoint") == "last"
        old = read_config(cfg.out_dir)
    except (OSError, ValueError, TypeError, AttributeError, TorchcalError):
        return False
    return done and not changed_fields(old, cfg)["identity"]


def _interrupt_hint(args: argparse.Namespace) -> str | None:
    """After Ctrl-C: the exact command that continues the run."""
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    out = Path(args.out)
    rdir = RunDir(out)
    for t in threading.enumerate():  # an epoch writer still committing: its files count
        if t.name == "torchcal-epoch-writer" and t is not threading.current_thread():
            t.join(timeout=30)
    if rdir.checkpoint_dir.is_dir():
        # a kill between staging checkpoints/next.pt and moving it onto last.pt: the next start
        # finishes that move before it looks for last.pt, so the epoch is kept (and a command
        # without --resume would be refused); finish it now, as the trainer would
        with contextlib.suppress(Exception):  # the hint must not hide the interruption
            reconcile_staged([out])
    if rdir.has_checkpoint("last"):  # what the trainer refuses without --resume
        return ("finished epochs are kept; continue with: torchcal train --out "
                f"{shlex.quote(args.out)} --resume")
    argv = list(getattr(args, "argv", None) or [])
    return ("no epoch was saved yet; start it again with: "
            + shlex.join(["torchcal", *argv] if argv else ["torchcal", "train", "..."]))


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

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not (dist.is_available()
                                                            and dist.is_initialized()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _cmd_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if cfg.resume and _finished(cfg):  # every rank sees the same files
        if rank0:
            print(f"torchcal train: nothing was trained: {cfg.out_dir} already holds all "
                  f"{cfg.epochs} epochs and their {RunDir(cfg.out_dir).results().name} (raise "
                  "--epochs to train further)")
        return 0
    if cfg.resume and rank0 and not RunDir(cfg.out_dir).has_checkpoint("last"):
        print(f"torchcal train: nothing to resume in {cfg.out_dir}; starting a new run")
    summary = train(cfg)
    _print_summary(cfg, summary, rank0)
    _exit_distributed_worker()
    return 0


def _print_summary(cfg, summary: dict[str, Any], rank0: bool) -> None:
    if not rank0:
        return
    if cfg.multitask.tasks:
        _print_multitask(cfg, summary)
        return
    f = summary["final"]
    start = int(summary.get("resumed_from") or 0)
    if start >= cfg.epochs:
        print(f"torchcal train: nothing was trained: {cfg.out_dir} already held all {cfg.epochs} "
              "epochs (raise --epochs to train further); its last epoch:")
    else:
        what = f"epochs {start + 1}-{cfg.epochs}" if start else f"{cfg.epochs} epochs"
        print(f"trained {cfg.recipe or cfg.dataset} with {cfg.loss} for {what} in "
              f"{summary['seconds']:.1f}s:", end="")
    print(f" val ECE {pct(f.get('val_ece'))}, test ECE {pct(f.get('test_ece'))}, test error "
          f"{pct(f.get('test_error'))}")
    res = summary.get("results")
    if res:
        post = res["test"]["post"].get("grid_ece", {})
        print(f"post-T (grid_ece, T={res['temperatures'].get('grid_ece', float('nan')):.2f}) "
              f"test ECE {pct(post.get('ece'))}; results: {RunDir(cfg.out_dir).results()}")


def _print_multitask(cfg, summary: dict[str, Any]) -> None:
    res = summary["results"]["multitask"]  # the block of the run's common results.json
    w = ", ".join(f"{v:.3g}" for v in res["weights"])
    mt = cfg.multitask
    print(f"trained {cfg.recipe or cfg.dataset} ({mt.tasks[0]} + {mt.tasks[1]}, "
          f"{mt.task_weighting}) for {cfg.epochs} epochs in {summary['seconds']:.1f}s: test "
          f"accuracy {pct(res['test']['accuracy'])}, {mt.tasks[1]} RMSE "
          f"{res['test']['rmse']:.3f}; task weights ({w}); results: "
          f"{RunDir(cfg.out_dir).results()}")


def _add_declared_flags(p: argparse.ArgumentParser, cls: type = TrainConfig) -> None:
    """The options that the fields of ``cls`` declare (``cli=``), in field order, a group's
    under its title: one declaration per option (docs/guide/architecture.md)."""
    groups: dict[str, Any] = {}
    for _, flag in cli_fields(cls):
        where = p if flag.group is None else groups.get(flag.group)
        if where is None:
            where = groups[flag.group] = p.add_argument_group(flag.group)
        if flag.switch:
            where.add_argument(flag.option, dest=flag.dest, action="store_true", help=flag.help)
        else:
            where.add_argument(flag.option, dest=flag.dest, type=flag.type, choices=flag.choices,
                               metavar=flag.metavar, help=flag.help)


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
               "  torchcal train --out runs/c10 --resume\n\n"
               "One process owns RUN_DIR while it trains: a second train/eval of it fails at once "
               "naming the\nholder's pid. Ctrl-C prints the command that continues the run.\n"
               + PERCENT_NOTE)
    p.add_argument("--recipe", help=f"named recipe with the papers' settings: {_recipe_help()}")
    p.add_argument("--loss", help="training loss (registry name; default: the recipe's, ce). "
                                  f"One of: {_loss_help()}")
    p.add_argument("--loss-arg", action="append", metavar="[LOSS:]KEY=VALUE",
                   help="loss hyperparameter, repeatable: LOSS:KEY=VALUE as in `torchcal demo` "
                        "(e.g. --loss-arg focal:gamma=3), or KEY=VALUE for the one loss trained; "
                        "values are parsed as JSON when possible")
    p.add_argument("--model", help="model (registry name) instead of the recipe's, e.g. "
                                   "resnet20 or small_cnn to try a CIFAR recipe on a CPU. "
                                   f"One of: {_model_help()}")
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE",
                   help="model constructor argument, repeatable (e.g. --model-arg width=8 for "
                        "small_cnn); values are parsed as JSON when possible")
    p.add_argument("--data-arg", action="append", metavar="KEY=VALUE",
                   help="data set option, repeatable (e.g. --data-arg noise_std=0.3 for digits, "
                        "--data-arg verify=false to skip the MD5 check of present archives)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory to write")
    p.add_argument("--resume", action="store_true",
                   help="continue RUN_DIR from checkpoints/last.pt (its config.json is reused; "
                        "options given here override it)")
    _add_declared_flags(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_train, interrupt_hint=_interrupt_hint)
