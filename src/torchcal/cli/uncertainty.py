"""``torchcal uncertainty fit | eval RUN_DIR``: pretrained uncertainty heads on a trained classifier.

Examples::

    torchcal uncertainty fit runs/c10-r50-focal --passes 5 --epochs 10
    torchcal uncertainty eval runs/c10-r50-focal --transfer cifar100
    torchcal uncertainty eval runs/c10-r50-focal --joint     # the head of `train --uncertainty-head`

    torchcal uncertainty fit runs/m1d --fit-split val      # a split the classifier did not fit
    torchcal uncertainty eval runs/m1d --transfer mnist1d:classes=5-9 \
        --transfer mnist1d:corr_noise_scale=0.6:iid_noise_scale=0.1:shear_scale=2

``fit`` runs the run's frozen classifier once over a split (``--fit-split``: its training split
by default, where the ranking targets are the losses of samples the classifier has fitted, or
its validation split, which it never trained on; ``--passes`` augmented passes when the data
set uses augmentation), caches embeddings/logits/labels under ``RUN_DIR/uncertainty/cache/``,
trains an :class:`~torchcal.uncertainty.UncertaintyHead` from the cache and saves it to
``RUN_DIR/uncertainty/head.pt``.  ``eval`` writes ``RUN_DIR/uncertainty/results.json``: R-AUROC
against classifier correctness and recall@1 correctness on the validation and test splits, each
beside the baselines that apply (the classifier's max-probability and entropy, the embedding
norm), OOD AUROC of the head's uncertainty on the run's OOD sets, and zero-shot transfer
(recall@1 R-AUROC) to another data set of the same input shape or to the run's own data set with
other data arguments (``DATASET:KEY=VALUE:...``, e.g. other MNIST-1D classes or generator
settings; the test split of those splits is used).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write_json, exclusive_lock, remove_stale_temp_dirs
from ..data import load_splits
from ..data.augment import normalize, random_crop_flip
from ..errors import CheckpointError, DivergedError, TorchcalError
from ..metrics import auroc, entropy
from ..run_dir import RunDir
from ..train import build_data, load_model_from_run
from ..train.build import load_ood_sets
from ..train.checkpoint import load_checkpoint
from ..train.device import resolve_device
from ..uncertainty.cache import CacheOptions, EmbeddingCache, model_identity
from ..uncertainty.fit import evaluate_head, fit_head, predict_uncertainty
from ..uncertainty.head import UncertaintyHead, load_head, save_head
from ._args import PERCENT_NOTE, parse_loss_args, plain_text
from ._args import even_int as _even_int
from ._args import nonneg_float as _nonneg_float
from ._args import positive_float as _positive_float
from ._args import positive_int as _positive_int

__all__ = ["register", "cmd_fit", "cmd_eval", "parse_transfer", "RESULTS_SCHEMA",
           "OOD_NOTE"]

#: Printed beside every OOD AUROC: what the number is and why a head may score below chance.
OOD_NOTE = (
    "OOD AUROC: how well an uncertainty separates the OOD set from the test split (50% = "
    "chance; below 50%: the OOD inputs get LOWER uncertainty than the test inputs).  The head "
    "is trained to rank the classifier's losses on in-distribution data, not to detect other "
    "inputs: Kirchhof et al. report OOD detection only as a side result, and a head can score "
    "below chance where the backbone maps OOD inputs to confident-looking embeddings.")

RESULTS_SCHEMA = "torchcal.uncertainty_results/1"


# ------------------------------------------------------------------------------------------
# shared helpers
# ------------------------------------------------------------------------------------------
def _prep_inputs(mean: Any, std: Any):
    """Normalise uint8 images with the data set's mean/std; cast other inputs to float32."""

    def prep(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8 and mean is not None:
            return normalize(x, mean, std)
        return x if x.dtype == torch.float32 else x.float()

    return prep


def _load_run(args: argparse.Namespace):
    device = resolve_device(args.device)
    model, config = load_model_from_run(args.run_dir, checkpoint=args.checkpoint, device=str(device))
    if args.data_root is not None:
        config = dataclasses.replace(config, data_root=str(args.data_root))
    for attr in ("forward_features", "num_features"):
        if not hasattr(model, attr):
            raise TorchcalError(
                f"Model {config.model!r} has no {attr}; uncertainty heads need a torchcal model "
                "with forward_features/num_features/fc"
            )
    splits = build_data(config)
    return model, config, splits, device


def _cache_root(args: argparse.Namespace) -> Path:
    return Path(args.cache_dir) if args.cache_dir else RunDir(args.run_dir).uncertainty_cache


def _build_cache(args, model, config, splits, device, name: str, data: Any, *,
                 options: CacheOptions | None = None, dataset: str | None = None):
    """Cache ``data`` under ``CACHE_DIR/name`` (``options``: the passes, augmentation and
    seed); inputs are normalised with the run's own ``splits.mean/std`` (what the backbone was
    trained on), also for OOD and transfer sets."""
    options = CacheOptions() if options is None else options
    n_passes = options.n_passes
    data_id = {"dataset": dataset or config.dataset, "split": name, "data_seed": config.data_seed,
               "seed": config.seed, "mean": splits.mean, "std": splits.std,
               "data_kwargs": dict(config.data_kwargs)}
    label = name if n_passes == 1 else f"{name}_x{n_passes}"
    remove_stale_temp_dirs(_cache_root(args), [label])  # a killed build's half-written cache
    return EmbeddingCache.build(
        _cache_root(args) / label, model, data, options=options,
        transform=_prep_inputs(splits.mean, splits.std), batch_size=args.embed_batch_size,
        device=device, data_id=data_id, on_stale=args.on_stale, progress=not args.no_progress)


def _f(v: Any) -> str:
    """An AUROC / accuracy in percent (the report's and every command's unit)."""
    return "  n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"


def _owning_run(run_dir: str) -> contextlib.AbstractContextManager:
    """Own RUN_DIR while writing its uncertainty/ files (fails at once if a training or another
    fit of it runs); a missing directory is left to the loader's error."""
    return exclusive_lock(run_dir) if Path(run_dir).is_dir() else contextlib.nullcontext()


# ------------------------------------------------------------------------------------------
# fit
# ------------------------------------------------------------------------------------------
def cmd_fit(args: argparse.Namespace) -> int:
    with _owning_run(args.run_dir):
        return _fit(args)


def _fit(args: argparse.Namespace) -> int:
    model, config, splits, device = _load_run(args)
    augment = None
    passes = args.passes
    if passes > 1:
        x = getattr(splits.train, "data", None)
        if splits.augment and isinstance(x, torch.Tensor) and x.ndim == 4:
            augment = functools.partial(random_crop_flip, padding=int(splits.padding))
        else:
            print(f"note: {config.dataset} is trained without augmentation; using 1 pass "
                  f"instead of {passes}")
            passes = 1
    fit_data = getattr(splits, args.fit_split)
    train_cache = _build_cache(args, model, config, splits, device, args.fit_split, fit_data,
                               options=CacheOptions(n_passes=passes, augment=augment,
                                                    seed=args.seed))
    fit = fit_head(train_cache, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                   weight_decay=args.weight_decay, width=args.width, depth=args.depth,
                   device=device, seed=args.seed, progress=not args.no_progress)
    out = Path(args.out) if args.out else RunDir(args.run_dir).uncertainty_head
    lr = args.lr if args.lr is not None else 1e-3 * args.batch_size / 256
    bad = [i for i, v in enumerate(fit.epoch_losses) if not math.isfinite(v)]
    if bad:  # nothing printed as a result, nothing written: a good head.pt stays
        raise DivergedError(f"the head's fit diverged: its ranking loss is "
                            f"{fit.epoch_losses[bad[0]]} from epoch {bad[0] + 1} (--lr {lr:g}); "
                            f"{out} not written; lower --lr")
    meta = {"run_dir": str(args.run_dir), "checkpoint": args.checkpoint,
            "dataset": config.dataset, "model": config.model, "loss": config.loss,
            "passes": passes, "fit_split": args.fit_split, "epochs": args.epochs, "batch_size": args.batch_size, "lr": lr,
            "weight_decay": args.weight_decay, "seed": args.seed, "rows": len(train_cache),
            "epoch_losses": fit.epoch_losses, "backbone": model_identity(model)}
    save_head(fit.head, out, meta)
    msg = (f"fitted uncertainty head on {len(train_cache)} cached {config.dataset} "
           f"{args.fit_split} rows "
           f"({passes} pass{'es' if passes > 1 else ''}), {args.epochs} epochs: ranking loss "
           f"{fit.epoch_losses[0]:.4f} -> {fit.epoch_losses[-1]:.4f}")
    print(msg)
    if args.fit_split == "val":
        print("  (no validation summary: the head was fitted on the validation split)")
    elif not args.no_val and len(splits.val) >= 2:
        val_cache = _build_cache(args, model, config, splits, device, "val", splits.val)
        r = evaluate_head(fit.head, val_cache, device=device)
        print(f"  val: R-AUROC(correct) {_f(r.get('r_auroc_correct'))}  "
              f"R-AUROC(recall@1) {_f(r.get('r_auroc_recall'))}  "
              f"[max-prob baseline {_f(r.get('baselines', {}).get('max_prob', {}).get('r_auroc_correct'))}]")
    print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------------------------------
# eval
# ------------------------------------------------------------------------------------------
def _joint_head(args: argparse.Namespace, model: Any):
    path = RunDir(args.run_dir).checkpoint(args.checkpoint)
    state = load_checkpoint(path)
    if not state.get("head"):
        raise CheckpointError(
            f"Checkpoint {str(path)!r} has no jointly trained head (train with "
            "--uncertainty-head, or fit one with `torchcal uncertainty fit`)")
    head = UncertaintyHead(int(model.num_features))
    try:
        head.load_state_dict(state["head"])
    except RuntimeError as exc:
        raise CheckpointError(f"The head in {str(path)!r} does not fit: {exc}") from exc
    return head.eval(), {"joint": True, "checkpoint": args.checkpoint}


def cmd_eval(args: argparse.Namespace) -> int:
    with _owning_run(args.run_dir):
        return _eval(args)


def _eval(args: argparse.Namespace) -> int:
    model, config, splits, device = _load_run(args)
    head, head_path, head_meta = _eval_head(args, model)
    head.to(device)

    results = _results_skeleton(args, config, head_path, head_meta)
    kw = {"device": device, "chunk_size": args.chunk_size}
    test_scores = None
    for name in args.splits:
        cache = _build_cache(args, model, config, splits, device, name, getattr(splits, name))
        results["splits"][name] = evaluate_head(head, cache, **kw)
        if name == "test":
            test_scores = _head_and_entropy(head, cache, device)

    if not args.no_ood:
        for name, ds in load_ood_sets(config, splits).items():
            cache = _build_cache(args, model, config, splits, device, f"ood_{name}", ds)
            res = evaluate_head(head, cache, classifier=False, **kw)
            if test_scores is None:
                tc = _build_cache(args, model, config, splits, device, "test", splits.test)
                test_scores = _head_and_entropy(head, tc, device)
            res.update(_ood_aurocs(test_scores, _head_and_entropy(head, cache, device)))
            results["ood"][name] = res

    for name in args.transfer:
        other = _transfer_splits(name, config, splits)
        cache = _build_cache(args, model, config, splits, device,
                             "transfer_" + "".join(c if c.isalnum() or c in "-_." else "_"
                                                   for c in name),
                             other.test, dataset=name)
        results["transfer"][name] = evaluate_head(head, cache, classifier=False, **kw)

    out = Path(args.out) if args.out else RunDir(args.run_dir).uncertainty_results
    atomic_write_json(out, results)
    _print_results(results)
    print(f"wrote {out}")
    return 0


def _eval_head(args: argparse.Namespace, model: Any):
    """(head, its file or None if joint, its metadata) to evaluate, checked against the model."""
    if args.joint:
        head, head_meta = _joint_head(args, model)
        head_path = None
    else:
        head_path = Path(args.head) if args.head else RunDir(args.run_dir).uncertainty_head
        if not head_path.is_file():
            raise TorchcalError(
                f"No uncertainty head at {str(head_path)!r}: run `torchcal uncertainty fit "
                f"{args.run_dir}` first (or pass --head / --joint)")
        head, head_meta = load_head(head_path)
    if head.in_features != int(model.num_features):
        raise TorchcalError(
            f"The head reads {head.in_features}-d embeddings, the model gives {model.num_features}")
    _check_backbone(head_path, head_meta, model)
    return head, head_path, head_meta


def _check_backbone(head_path: Path | None, head_meta: dict[str, Any], model: Any) -> None:
    """Refuse a head fitted on another backbone: the SHA-256 of the backbone's state that
    ``uncertainty fit`` recorded (``backbone.state_sha256``) against this run's model (a head
    of an older torchcal, without the record, is used as is)."""
    recorded = (head_meta.get("backbone") or {}).get("state_sha256") if isinstance(
        head_meta.get("backbone"), dict) else None
    if head_path is None or recorded is None:
        return
    got = model_identity(model)["state_sha256"]
    if got != recorded:
        raise TorchcalError(
            f"Uncertainty head {str(head_path)!r} was fitted on another backbone (its weights' "
            f"SHA-256 {str(recorded)[:16]}..., this run's {got[:16]}...): its uncertainties "
            "mean nothing on this model; fit it again with `torchcal uncertainty fit`")


def _results_skeleton(args: argparse.Namespace, config: Any, head_path: Path | None,
                      head_meta: dict[str, Any]) -> dict[str, Any]:
    """The results.json document with its meta data and empty splits/ood/transfer sections."""
    return {
        "schema": RESULTS_SCHEMA,
        "meta": {"run_dir": str(args.run_dir), "checkpoint": args.checkpoint,
                 "dataset": config.dataset, "model": config.model, "loss": config.loss,
                 "seed": config.seed, "head": str(head_path) if head_path else "joint",
                 "head_meta": {k: v for k, v in head_meta.items() if k != "epoch_losses"}},
        "splits": {}, "ood": {}, "transfer": {},
    }


def _head_and_entropy(head: Any, cache: Any, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's uncertainties and the classifier's predictive entropies on a cache's rows."""
    emb, logits, _ = cache.tensors(device)
    return predict_uncertainty(head, emb), entropy(logits=logits.float(), validate_args=False)


def _ood_aurocs(test_scores: tuple[torch.Tensor, torch.Tensor],
                ood_scores: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """AUROC of telling OOD rows from test rows by the head's uncertainty and by entropy."""
    (test_u, test_entropy), (u, entropy) = test_scores, ood_scores
    is_ood = torch.cat([torch.zeros_like(test_u, dtype=torch.long),
                        torch.ones_like(u, dtype=torch.long)])
    return {"auroc_head": float(auroc(scores=torch.cat([test_u, u]), labels=is_ood)),
            "auroc_entropy": float(auroc(scores=torch.cat([test_entropy, entropy]),
                                         labels=is_ood))}


def parse_transfer(spec: str) -> tuple[str, dict[str, Any]]:
    """``"mnist1d:classes=5-9:shear_scale=2"`` -> ``("mnist1d", {"classes": "5-9",
    "shear_scale": 2})``.

    >>> parse_transfer("digits")
    ('digits', {})
    """
    name, *items = spec.split(":")
    try:
        return name, parse_loss_args(items, "--transfer")
    except ValueError as exc:
        raise TorchcalError(f"{exc} (as DATASET[:KEY=VALUE...])") from exc


def _transfer_splits(spec: str, config: Any, splits: Any):
    """The splits of transfer data set ``spec`` (``DATASET[:KEY=VALUE...]``; the run's own data
    set keeps its data arguments under the items'), checked to have the run's input shape."""
    name, items = parse_transfer(spec)
    kw = {**dict(config.data_kwargs), **items} if name == config.dataset else items
    seed = config.data_seed if name == config.dataset and config.data_seed is not None else 1
    try:
        other = load_splits(name, config.data_root, download=False, seed=seed, **kw)
    except (TypeError, ValueError, KeyError) as exc:
        raise TorchcalError(f"Cannot load transfer data set {spec!r}: {exc}") from exc
    if tuple(other.input_shape) != tuple(splits.input_shape):
        raise TorchcalError(
            f"Transfer data set {name!r} has inputs {tuple(other.input_shape)}, the model "
            f"expects {tuple(splits.input_shape)}")
    return other


def _beside(r: dict[str, Any], key: str) -> str:
    """``head X [max-prob Y, entropy Z, embedding norm W]`` for one R-AUROC ``key``."""
    names = (("max_prob", "max-prob"), ("entropy", "entropy"), ("embedding_norm", "emb. norm"))
    base = r.get("baselines", {})
    parts = [f"{label} {_f(base[k].get(key))}" for k, label in names if key in base.get(k, {})]
    return f"head {_f(r.get(key))}" + (f" [{', '.join(parts)}]" if parts else "")


def _print_results(results: dict[str, Any]) -> None:
    """Print the per-split, OOD and zero-shot transfer summary of an eval's results, every
    head number beside the baselines that apply."""
    fitted_on = results["meta"].get("head_meta", {}).get("fit_split", "train")
    for name, r in results["splits"].items():
        note = "  (the head's training split)" if name == fitted_on else ""
        print(f"{name:>6}: n={r['n']}  accuracy {_f(r.get('accuracy'))}{note}")
        print(f"        R-AUROC(correct)  {_beside(r, 'r_auroc_correct')}")
        print(f"        R-AUROC(recall@1) {_beside(r, 'r_auroc_recall')}")
    for name, r in results["ood"].items():
        print(f"  OOD {name}: AUROC head {_f(r['auroc_head'])}, entropy {_f(r['auroc_entropy'])}")
    if results["ood"]:
        print("  " + OOD_NOTE)
    for name, r in results["transfer"].items():
        print(f"  zero-shot {name}: recall@1 {_f(r.get('recall_at_1'))}, R-AUROC(recall@1) "
              f"{_beside(r, 'r_auroc_recall')}")


# ------------------------------------------------------------------------------------------
# registration
# ------------------------------------------------------------------------------------------
def _split_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in ("train", "val", "test")]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of train,val,test, got {text!r}")
    return names


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `torchcal train` run directory")
    p.add_argument("--checkpoint", choices=("last", "best"), default="last",
                   help="which checkpoint of the run (default: last)")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda:0, ...")
    p.add_argument("--data-root", default=None, help="override the run's data root")
    p.add_argument("--cache-dir", default=None,
                   help="embedding caches (default: RUN_DIR/uncertainty/cache)")
    p.add_argument("--on-stale", choices=("rebuild", "error"), default="rebuild",
                   help="a cache built from other weights/data, or corrupt: rebuild it or stop")
    p.add_argument("--embed-batch-size", type=_positive_int, default=256,
                   help="backbone batch size when filling the cache (default 256)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def register(subparsers: Any) -> None:
    """Add ``uncertainty fit`` and ``uncertainty eval`` to the ``torchcal`` command line."""
    p = subparsers.add_parser(
        "uncertainty", help="pretrained uncertainty heads on a trained classifier (fit | eval)",
        description=plain_text(__doc__.split("\n\n")[0]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=plain_text(__doc__.split("\n\n", 1)[1]) + "\n" + PERCENT_NOTE)
    sub = p.add_subparsers(dest="uncertainty_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    f = sub.add_parser("fit", help="cache the frozen backbone's embeddings and train a head",
                       description="Cache RUN_DIR's embeddings of its training split and train "
                                   "an uncertainty head (AdamW, cosine schedule, ranking loss).")
    _common(f)
    f.add_argument("--fit-split", choices=("train", "val"), default="train",
                   help="split whose cached embeddings train the head: the classifier's training "
                        "split (default) or its validation split, which it never fitted (the "
                        "ranking targets are then losses of unseen samples)")
    f.add_argument("--passes", type=_positive_int, default=1,
                   help="augmented passes over the training split for the cache (default 1)")
    f.add_argument("--epochs", type=_positive_int, default=10, help="head epochs (default 10)")
    f.add_argument("--batch-size", type=_even_int, default=256, help="even (default 256)")
    f.add_argument("--lr", type=_positive_float, default=None,
                   help="AdamW learning rate (default 1e-3 * batch_size / 256)")
    f.add_argument("--weight-decay", type=_nonneg_float, default=1e-4)
    f.add_argument("--width", type=_positive_int, default=512, help="hidden width (default 512)")
    f.add_argument("--depth", type=_positive_int, default=2, help="hidden layers (default 2)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--no-val", action="store_true", help="skip the validation R-AUROC summary")
    f.add_argument("--out", default=None, help="head file (default RUN_DIR/uncertainty/head.pt)")
    f.set_defaults(func=cmd_fit)

    e = sub.add_parser("eval", help="R-AUROC, OOD AUROC and zero-shot transfer of a head",
                       description="Evaluate an uncertainty head on RUN_DIR's splits, its OOD "
                                   "sets and other data sets; writes RUN_DIR/uncertainty/results.json.")
    _common(e)
    src = e.add_mutually_exclusive_group()
    src.add_argument("--head", default=None,
                     help="head file (default RUN_DIR/uncertainty/head.pt)")
    src.add_argument("--joint", action="store_true",
                     help="evaluate the head trained jointly (`torchcal train --uncertainty-head`)")
    e.add_argument("--splits", type=_split_list, default=["val", "test"],
                   help="comma-separated splits to evaluate (default val,test)")
    e.add_argument("--no-ood", action="store_true", help="skip the run's OOD sets")
    e.add_argument("--transfer", action="append", default=[], metavar="DATASET[:KEY=VALUE...]",
                   help="zero-shot transfer: evaluate on DATASET's test split; KEY=VALUE items "
                        "are data arguments over the run's own (e.g. mnist1d:classes=5-9, "
                        "mnist1d:corr_noise_scale=0.6:shear_scale=2) (repeatable)")
    e.add_argument("--chunk-size", type=_positive_int, default=2048,
                   help="queries per chunk of the recall@1 nearest-neighbour search")
    e.add_argument("--out", default=None,
                   help="results file (default RUN_DIR/uncertainty/results.json)")
    e.set_defaults(func=cmd_eval)
