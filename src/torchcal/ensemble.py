"""Ensembles as predictors: deep ensembles from run directories or saved logits, and MC dropout.

Conventions (those of :mod:`torchcal.metrics.members`, which computes the scores):

* an ensemble is its members' logits ``member_logits`` of shape (S, N, C): S members (runs,
  seeds) or stochastic forward passes, on the same N samples in the same order;
* its prediction is the **mean of the members' probabilities** ``pbar = (1/S) sum_s
  softmax(z_s)`` (Lakshminarayanan et al. 2017), and its "logits" are ``log pbar``
  (:attr:`Ensemble.logits`, float64): softmax of them gives ``pbar`` back, so every metric,
  calibrator and plot of torchcal takes an ensemble as it takes a model;
* "pool then calibrate": fit a calibrator on :attr:`Ensemble.logits` of a validation split;
  "calibrate then pool": calibrate each member's logits, then :func:`from_logits` of them;
* MC dropout (Gal & Ghahramani 2016): :func:`mc_dropout` runs the model S times with its
  dropout layers sampling and every other layer in eval mode (BatchNorm uses its running
  statistics), and returns the (S, N, C) logits, an ensemble of S samples.

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> ens = from_logits([torch.randn(5, 3, generator=g) for _ in range(4)],
    ...                   labels=torch.tensor([0, 1, 2, 0, 1]))
    >>> ens.member_logits.shape, ens.logits.shape
    (torch.Size([4, 5, 3]), torch.Size([5, 3]))
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ._io import remove_stale_temp_files
from ._validation import as_tensor, check_labels, check_positive_int
from .errors import ResultsFileError
from .evaluate import compute_metrics, evaluate_logits
from .logits_file import load_logits, save_logits
from .metrics import members as scores
from .posthoc import TemperatureScaling
from .results_file import read_results, write_results
from .run_dir import RunDir

__all__ = ["Ensemble", "from_logits", "from_run_dirs", "evaluate_ensemble", "mc_dropout",
           "DROPOUT_TYPES", "CALIBRATE_THEN_POOL", "CALIBRATE_THEN_POOL_NLL", "SEED_SUBSET_SIZE",
           "seed_subsets"]

#: The key of "calibrate then pool" in an ensemble's results: ``test.post.<key>`` holds the
#: metrics of the pooled members, each divided by its own grid-ECE temperature, and
#: ``temperatures.<key>`` the mean of those temperatures.
CALIBRATE_THEN_POOL = "calibrate_then_pool"
#: The same with each member's NLL-fitted temperature (Guo et al. 2017's fit, the one the
#: ensemble papers use); ``meta.member_temperatures_nll`` holds each.
CALIBRATE_THEN_POOL_NLL = "calibrate_then_pool_nll"
#: The members of each seed subset an ensemble claim is tested on (:func:`seed_subsets`).
SEED_SUBSET_SIZE = 3


def seed_subsets(seeds: Iterable[int], size: int = SEED_SUBSET_SIZE) -> list[tuple[int, ...]]:
    """Every subset of ``size`` of ``seeds`` (sorted, in lexicographic order); with fewer than
    ``size`` seeds (but 2 or more) the one set of them all; with fewer than 2, none.

    The subsets overlap (with 5 seeds and size 3, each seed is in 6 of the 10): they say how a
    result depends on which seeds are pooled, they are not independent replications.

    >>> len(seed_subsets(range(5))), seed_subsets([1, 0]), seed_subsets([0])
    (10, [(0, 1)], [])
    """
    size = check_positive_int(size, "size")
    s = sorted({int(x) for x in seeds})
    if len(s) < 2:
        return []
    return list(itertools.combinations(s, min(size, len(s))))

#: The modules :func:`mc_dropout` switches to sampling (train mode).
DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                 nn.FeatureAlphaDropout)


@dataclass(frozen=True)
class Ensemble:
    """S members' logits on the same N samples (see the module's conventions).

    Attributes:
        member_logits: (S, N, C) float tensor.
        labels: (N,) int64 labels, or None.
        names: one name per member (its run directory, or ``"member 0"``, ...).
    """

    member_logits: torch.Tensor
    labels: torch.Tensor | None
    names: tuple[str, ...]

    @property
    def size(self) -> int:
        """The number of members S."""
        return int(self.member_logits.shape[0])

    @property
    def logits(self) -> torch.Tensor:
        """The ensemble's (N, C) float64 "logits" ``log pbar`` (log of the mean probabilities)."""
        return scores.pooled_log_probs(member_logits=self.member_logits)

    @property
    def probs(self) -> torch.Tensor:
        """The ensemble's (N, C) float64 probabilities ``pbar``."""
        return self.logits.exp()

    def scores(self) -> dict[str, torch.Tensor]:
        """Per-sample (N,) float64 uncertainties: ``predictive_entropy``,
        ``expected_entropy``, ``mutual_information`` and ``disagreement``."""
        names = ("predictive_entropy", "expected_entropy", "mutual_information", "disagreement")
        return {k: getattr(scores, k)(member_logits=self.member_logits) for k in names}


def from_logits(member_logits: Any, labels: Any = None, *,
                names: Sequence[str] | None = None) -> Ensemble:
    """An :class:`Ensemble` from the members' logits: an (S, N, C) array or a sequence of S
    (N, C) arrays (torch or NumPy, each member's predictions on the same samples in the same
    order), with optional (N,) labels.

    >>> ens = from_logits(torch.zeros(2, 4, 3), labels=[0, 1, 2, 0])
    >>> ens.size, ens.names
    (2, ('member 0', 'member 1'))
    """
    if isinstance(member_logits, (list, tuple)):
        if not member_logits:
            raise ValueError("Expected `member_logits` to hold at least one member, got none")
        parts = [as_tensor(z, f"member_logits[{i}]") for i, z in enumerate(member_logits)]
        for i, z in enumerate(parts[1:], 1):
            if z.shape != parts[0].shape:
                raise ValueError(
                    f"Expected every member's logits to have the shape of member 0 "
                    f"{tuple(parts[0].shape)}, got {tuple(z.shape)} for member {i}"
                )
        member_logits = torch.stack(parts)
    z = scores.check_member_logits(member_logits)
    y = None if labels is None else check_labels(labels, n=z.shape[1], num_classes=z.shape[2])
    if names is None:
        names = [f"member {i}" for i in range(z.shape[0])]
    names = tuple(str(n) for n in names)
    if len(names) != z.shape[0]:
        raise ValueError(f"Expected one name per member ({z.shape[0]}), got {len(names)}")
    return Ensemble(member_logits=z, labels=y, names=names)


def from_run_dirs(run_dirs: Iterable[str | os.PathLike], split: str = "test", *,
                  checkpoint: str = "last") -> Ensemble:
    """The ensemble of the runs' saved predictions ``RUN_DIR/logits/<split>.npz`` (written by
    ``torchcal train`` / ``eval``; ``checkpoint="best"`` reads ``logits-best/``).

    ``split`` is ``"val"``, ``"test"`` or ``"ood_<name>"``.  The runs must have predicted the
    same samples in the same order: their labels must be equal (else ``ValueError`` naming the
    first run that differs); members are named by their run directory.  The ensemble's
    ``labels`` are None when the saved labels are not class indices (an OOD set stores -1).
    """
    dirs = [RunDir(d) for d in run_dirs]
    if not dirs:
        raise ValueError("Expected `run_dirs` to name at least one run directory, got none")
    members, labels = [], None
    for rdir in dirs:
        z, y = load_logits(rdir.logits(split, checkpoint))
        if labels is not None and (y.shape != labels.shape or not np.array_equal(y, labels)):
            raise ValueError(
                f"Expected every run to hold the same {split!r} samples in the same order, but "
                f"the labels of {str(rdir.path)!r} differ from those of {str(dirs[0].path)!r}"
            )
        members.append(z)
        labels = y if labels is None else labels
    stacked = np.stack(members)
    if labels.size and not (labels.min() >= 0 and labels.max() < stacked.shape[2]):
        labels = None  # an OOD set's placeholder labels (-1): not class indices
    return from_logits(stacked, labels, names=[str(rdir.path) for rdir in dirs])


def _common_ood_names(dirs: Sequence[RunDir], checkpoint: str) -> list[str]:
    """The OOD sets every run saved logits of (``ood_<name>.npz``), in the first run's order."""
    names = [set(d.ood_logits(checkpoint)) for d in dirs]
    return [n for n in dirs[0].ood_logits(checkpoint) if all(n in s for s in names[1:])]


def evaluate_ensemble(run_dirs: Iterable[str | os.PathLike], out_dir: str | os.PathLike | None
                      = None, *, n_bins: int = 15, checkpoint: str = "last",
                      meta: dict[str, Any] | None = None,
                      member_temperatures: dict[str, Sequence[float]] | None = None
                      ) -> dict[str, Any]:
    """Evaluate the ensemble of runs as one predictor: a ``torchcal.results/1`` document.

    The ensemble is :func:`from_run_dirs` of each split.  Every number is on the test split;
    every temperature is fitted on the validation split:

    * "pool then calibrate" (Rahaman & Thiery 2021): the temperatures are fitted on the
      ensemble's validation logits ``log pbar``; ``temperatures`` and ``test.post`` hold them
      and their metrics as for a single run (:func:`torchcal.evaluate.evaluate_logits`,
      OOD sets included: those every run saved);
    * "calibrate then pool": each member's grid-ECE temperature is fitted on its own
      validation logits, its test logits divided by it, then pooled;
      ``test.post.calibrate_then_pool`` holds the metrics, ``temperatures.calibrate_then_pool``
      the members' mean temperature and ``meta.member_temperatures`` each one;
      ``calibrate_then_pool_nll`` and ``meta.member_temperatures_nll`` the same with each
      member's NLL-fitted temperature (the fit of the ensemble papers, and of the claims).

    ``member_temperatures`` (``{"grid_ece": [T per run], "nll": [T per run]}``, in the order
    of ``run_dirs``): the members' temperatures, fitted as above by an earlier call (those of
    its ``meta``), so that the ensembles of many subsets of the same runs fit each run once.

    ``meta`` (default ``{}``) is completed with ``predictor: "ensemble"``, ``seed: None`` and
    ``members`` (when not given: the member runs' directories' names are not seeds, so give
    the seeds), and with the members' identity (``identity``, ``identity_fields``: read from
    their ``results.json``) when they share one.  Runs of different identities (another
    learning rate, another number of epochs: no seeds of one configuration) are pooled as
    asked, with a warning naming them and the settings that differ; the ensemble then
    records no identity.  With ``out_dir`` the document is written to ``OUT_DIR/results.json`` and the
    ensemble's logits (``log pbar``, float32) to ``OUT_DIR/logits/``, so that ``torchcal report``
    reads the ensemble as a run (its own row, never averaged with the seeds); the temporary
    files that a killed writer left there (``.results.json.PID-RANDOM.tmp``, ...) are removed
    first (:func:`torchcal._io.remove_stale_temp_files`).

    Raises ValueError when the runs hold other samples, or the splits have no class labels.
    """
    dirs = [RunDir(d) for d in run_dirs]
    if not dirs:
        raise ValueError("Expected `run_dirs` to name at least one run directory, got none")
    paths = [d.path for d in dirs]
    val, test = (from_run_dirs(paths, split, checkpoint=checkpoint) for split in ("val", "test"))
    if val.labels is None or test.labels is None:
        raise ValueError("Expected the runs' val and test logits to hold class labels, got "
                         "placeholder labels (an OOD set's)")
    ood = {n: from_run_dirs(paths, f"ood_{n}", checkpoint=checkpoint)
           for n in _common_ood_names(dirs, checkpoint)}
    temps = _member_temperatures(val, n_bins, member_temperatures)
    meta = {**_members_identity(dirs, checkpoint), **(meta or {}), "predictor": "ensemble", "seed": None, "checkpoint": checkpoint,
            "member_temperatures": temps["grid_ece"], "member_temperatures_nll": temps["nll"]}
    res = evaluate_logits(val_logits=val.logits, val_labels=val.labels, test_logits=test.logits,
                          test_labels=test.labels, ood_logits={n: e.logits for n, e in ood.items()},
                          n_bins=n_bins, meta=meta)
    for key, method in ((CALIBRATE_THEN_POOL, "grid_ece"), (CALIBRATE_THEN_POOL_NLL, "nll")):
        scale = torch.tensor(temps[method], dtype=test.member_logits.dtype).view(-1, 1, 1)
        pooled = from_logits(test.member_logits / scale).logits
        res["test"]["post"][key] = compute_metrics(pooled, test.labels, n_bins=n_bins)
        res["temperatures"][key] = float(np.mean(temps[method]))
    if out_dir is not None:
        rdir = RunDir(out_dir)
        for directory, patterns in rdir.stale_temp_patterns():  # a killed writer's temp files
            remove_stale_temp_files(directory, patterns)
        for split, ens in (("val", val), ("test", test), *((f"ood_{n}", e) for n, e in ood.items())):
            labels = ens.labels if ens.labels is not None else torch.full(
                (ens.logits.shape[0],), -1, dtype=torch.int64)
            save_logits(rdir.logits(split, checkpoint), ens.logits.float(), labels)
        write_results(rdir.results(checkpoint), res)
    return res


def _members_identity(dirs: Sequence[RunDir], checkpoint: str) -> dict[str, Any]:
    """``{"identity", "identity_fields"}`` the member runs share (from their results files),
    {} when a member records none; a warning names the runs when their identities differ."""
    found: dict[str, list[RunDir]] = {}
    fields: dict[str, dict[str, Any]] = {}
    for d in dirs:
        try:
            meta = read_results(d.results(checkpoint)).get("meta") or {}
        except (OSError, ResultsFileError):
            return {}
        ident = meta.get("identity")
        if not isinstance(ident, str):
            return {}
        found.setdefault(ident, []).append(d)
        fields[ident] = meta.get("identity_fields") if isinstance(
            meta.get("identity_fields"), dict) else {}
    if len(found) == 1:
        (ident,) = found
        return {"identity": ident, "identity_fields": fields[ident]}
    keys = sorted({k for f in fields.values() for k in f
                   if len({json.dumps(x.get(k), sort_keys=True) for x in fields.values()}) > 1})
    sets = "; ".join(f"{', '.join(str(d.path) for d in ds)} ("
                     + (", ".join(f"{k} {json.dumps(fields[i].get(k))}" for k in keys) or i) + ")"
                     for i, ds in found.items())
    warnings.warn(f"Pooling runs of different identities, no seeds of one configuration: {sets}"
                  + (f": identity differs in {', '.join(keys)}" if keys else "")
                  + "; the ensemble records no identity", UserWarning, stacklevel=3)
    return {}


def _member_temperatures(val: Ensemble, n_bins: int,
                         given: dict[str, Sequence[float]] | None) -> dict[str, list[float]]:
    """Each member's grid-ECE and NLL temperature on its validation logits, or ``given``."""
    if given is None:
        return {m: [float(TemperatureScaling(method=m, n_bins=n_bins).fit(z, val.labels)
                          .temperature_) for z in val.member_logits] for m in ("grid_ece", "nll")}
    out = {}
    for m in ("grid_ece", "nll"):
        ts = [float(t) for t in given.get(m, ())]
        if len(ts) != val.size or not all(t > 0 for t in ts):
            raise ValueError(f"Expected `member_temperatures[{m!r}]` to hold one positive "
                             f"temperature per run ({val.size}), got {list(given.get(m, ()))}")
        out[m] = ts
    return out


def _inputs(x_or_loader: Any) -> Iterator[torch.Tensor]:
    """The input batches: one tensor, or each batch of an iterable (a tensor, or the first
    element of a tuple / list batch such as ``(x, y)``)."""
    if isinstance(x_or_loader, (torch.Tensor, np.ndarray)):
        yield as_tensor(x_or_loader, "x_or_loader")
        return
    for i, batch in enumerate(x_or_loader):
        if isinstance(batch, (tuple, list)) and batch:
            batch = batch[0]
        if not isinstance(batch, torch.Tensor):
            raise TypeError(f"Expected each batch of `x_or_loader` to be a tensor or a (x, y, "
                            f"...) tuple, got {type(batch).__name__} at batch {i}")
        yield batch


@contextlib.contextmanager
def _dropout_sampling(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode with its dropout modules in train mode; modes restored after."""
    modes = {m: m.training for m in model.modules()}
    dropouts = [m for m in model.modules() if isinstance(m, DROPOUT_TYPES)]
    if not dropouts:
        kinds = ", ".join(t.__name__ for t in DROPOUT_TYPES)
        raise ValueError(
            f"Expected `model` to contain a dropout module ({kinds}), found none in "
            f"{type(model).__name__}: MC dropout would repeat the same prediction"
        )
    try:
        model.eval()
        for m in dropouts:
            m.train()
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


def _forked_rng(device: torch.device | str, seed: int | None) -> Any:
    """A context that restores the CPU RNG (and ``device``'s, for CUDA) on exit; a no-op for
    ``seed=None`` (the passes then draw from the global RNG, as any forward pass does)."""
    if seed is None:
        return contextlib.nullcontext()
    dev = torch.device(device)
    cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] \
        if dev.type == "cuda" else []
    return torch.random.fork_rng(devices=cuda)


@torch.no_grad()
def mc_dropout(model: nn.Module, x_or_loader: Any, *, samples: int = 10,
               seed: int | None = None, device: torch.device | str | None = None
               ) -> torch.Tensor:
    """MC-dropout logits (S, N, C): ``samples`` forward passes with dropout sampling.

    Every module of ``model`` is in eval mode (BatchNorm uses its running statistics, no
    statistics are updated) except the dropout modules (:data:`DROPOUT_TYPES`), which sample a
    fresh mask per pass; the modules' modes are restored afterwards.  Dropout written as
    ``F.dropout(x, training=self.training)`` follows its module's mode, so it stays off: make
    it an ``nn.Dropout`` module.  For each batch the S passes run back to back.

    Args:
        model: the network; its output per batch is the (B, C) logits.
        x_or_loader: one input tensor (N, ...) or an iterable of batches (tensors, or tuples
            whose first element is the input, as a ``DataLoader`` of ``(x, y)`` yields).
        samples: S, the number of passes (>= 1).
        seed: seed of the dropout masks (the global RNG is forked, so the caller's random
            state is untouched); None draws from the global RNG.
        device: where to run the model (default: the device of its first parameter, else CPU).

    Returns:
        (S, N, C) logits on ``device``, in the model's output dtype.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
        >>> z = mc_dropout(net, torch.randn(6, 4), samples=5, seed=0)
        >>> z.shape, net.training
        (torch.Size([5, 6, 3]), True)
    """
    samples = check_positive_int(samples, "samples")
    if device is None:
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
    out = []
    with _forked_rng(device, seed), _dropout_sampling(model):
        if seed is not None:
            torch.manual_seed(int(seed))
        for x in _inputs(x_or_loader):
            x = x.to(device)
            out.append(torch.stack([model(x) for _ in range(samples)]))
    if not out:
        raise ValueError("Expected `x_or_loader` to yield at least one batch, got none")
    return torch.cat(out, dim=1)
