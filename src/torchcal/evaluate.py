"""Evaluation from saved logits: logits -> post-hoc temperatures -> metrics -> ``results.json``.

Logits are the interchange format (DESIGN.md): training writes ``RUN_DIR/logits/{val,test}.npz``
and ``ood_<name>.npz`` (the logits file, :mod:`torchcal.logits_file`); this module fits the
temperatures and computes the metrics of the ``torchcal.results/1`` document (the results
file, :mod:`torchcal.results_file`, whose docstring describes it) that ``torchcal report``
aggregates.  Nothing here needs the model.  The files' readers and writers live in those two
modules (``torchcal.logits_file.load_logits``, ``torchcal.results_file.read_results``, ...).

Metric keys are those of :meth:`torchcal.metrics.CalibrationMeter.compute`; values are
fractions (0..1), never percent.  A metric that is undefined (``s99_accuracy`` when no sample
reaches 0.99 confidence) is NaN in memory and ``null`` in the JSON file.  Every post-hoc
method's temperature is kept; tables use ``grid_ece`` (and ``grid_adaece`` for equal-mass ECE).

OOD detection treats the OOD set as the positive class for AUROC and AUPR; ``fpr95_*`` is
the literature's FPR on OOD at 95% TPR of in-distribution.  Scores: the softmax entropy
(``*_entropy``) and the negative log maximum probability (``*_max_prob``, float64 from the
logits, so that confident samples never tie); ``post_*`` entries use
the logits divided by the ``grid_ece`` temperature.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from ._validation import as_tensor, check_finite, check_labels, check_positive_int
from .logits_file import load_logits
from .metrics import CalibrationMeter, aupr, auroc, fpr_at_tpr, ood_scores
from .posthoc import fit_temperatures
from .results_file import METRIC_KEYS, SCHEMA, TEMPERATURE_METHODS, meta_from_config, write_results
from .run_dir import RunDir

__all__ = ["compute_metrics", "ood_metrics", "evaluate_logits", "evaluate_saved_logits"]


def _check_logits(x: Any, name: str, num_classes: int | None = None) -> torch.Tensor:
    t = as_tensor(x, name)
    if not t.is_floating_point():
        raise TypeError(f"Expected `{name}` to have a floating dtype, got {t.dtype}")
    if t.ndim != 2 or t.shape[0] == 0:
        raise ValueError(f"Expected `{name}` to be non-empty 2-D of shape (N, C), got shape {tuple(t.shape)}")
    if num_classes is not None and t.shape[1] != num_classes:
        raise ValueError(
            f"Expected `{name}` to have {num_classes} classes (columns) like `val_logits`, got {t.shape[1]}"
        )
    if t.shape[1] < 2:
        raise ValueError(f"Expected `{name}` to have at least 2 classes (columns), got {t.shape[1]}")
    check_finite(t, name)
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return t


def compute_metrics(logits: Any, labels: Any, *, n_bins: int = 15) -> dict[str, float]:
    """Every :class:`~torchcal.metrics.CalibrationMeter` metric of ``logits`` as Python floats.

    ``topk_error`` is the top-5 error (NaN when C < 5).
    """
    z = _check_logits(logits, "logits")
    y = check_labels(labels, n=z.shape[0], num_classes=z.shape[1], device=z.device)
    # the logits are complete here: never sync with other ranks (this may run on rank 0 alone)
    meter = CalibrationMeter(z.shape[1], n_bins=n_bins, adaptive=True, topk=5, sync_dist=False)
    meter.update(logits=z, labels=y)
    out = meter.compute()
    return {k: float(out[k]) for k in METRIC_KEYS if k in out}


def ood_metrics(id_logits: Any, ood_logits: Any, *, temperature: float | None = None) -> dict[str, float]:
    """OOD detection: AUROC and AUPR with the OOD set as the positive class, FPR@95 as the
    literature reports it (FPR on OOD at 95% TPR of in-distribution,
    :func:`~torchcal.metrics.fpr_at_tpr`'s default ``convention="id_positive"``).

    Returns ``auroc_entropy``, ``auroc_max_prob``, ``fpr95_entropy``, ``fpr95_max_prob``,
    ``aupr_entropy``, ``aupr_max_prob`` (fractions).  Scores: softmax entropy and
    ``-log max_c p_c`` (float64, the ranking of ``-max_c p_c`` without ties) of
    ``logits / temperature`` (``temperature=None`` means 1).
    """
    zi = _check_logits(id_logits, "id_logits")
    zo = _check_logits(ood_logits, "ood_logits", zi.shape[1])
    if temperature is not None:
        zi, zo = zi / temperature, zo / temperature
    out: dict[str, float] = {}
    for score in ("entropy", "max_prob"):
        s, labels = ood_scores(id_logits=zi, ood_logits=zo, score=score)
        out[f"auroc_{score}"] = float(auroc(scores=s, labels=labels))
        out[f"fpr95_{score}"] = float(fpr_at_tpr(scores=s, labels=labels, tpr=0.95))
        out[f"aupr_{score}"] = float(aupr(scores=s, labels=labels))
    return out


def evaluate_logits(
    *,
    val_logits: Any,
    val_labels: Any,
    test_logits: Any,
    test_labels: Any,
    ood_logits: Mapping[str, Any] | None = None,
    n_bins: int = 15,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Fit every temperature on the validation logits and measure the test (and OOD) logits.

    Args:
        val_logits: validation logits (N_v, C), used to fit the temperatures
            (:func:`torchcal.posthoc.fit_temperatures`).
        val_labels: validation labels (N_v,).
        test_logits: test logits (N_t, C).
        test_labels: test labels (N_t,).
        ood_logits: optional ``{name: logits (N_o, C)}`` of out-of-distribution sets.
        n_bins: bins of every binned metric and of the grid temperature searches.
        meta: run description copied into ``results["meta"]`` (dataset, model, loss, seed, ...).

    Returns:
        The ``torchcal.results/1`` dict described in the module docstring (floats; NaN where a
        metric is undefined).

    Example (confidence e²/(1+e²) = 0.881 everywhere, accuracy 0.75, so ECE = 0.131; the grid
    temperature 1.8 brings the confidence to 0.752):
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
        >>> y = torch.tensor([0, 1, 0, 0])
        >>> r = evaluate_logits(val_logits=z, val_labels=y, test_logits=z, test_labels=y)
        >>> r["temperatures"]["grid_ece"], round(r["test"]["pre"]["ece"], 4), r["test"]["pre"]["error"]
        (1.8, 0.1308, 0.25)
        >>> round(r["test"]["post"]["grid_ece"]["ece"], 4)
        0.0023
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    zv = _check_logits(val_logits, "val_logits")
    C = zv.shape[1]
    zt = _check_logits(test_logits, "test_logits", C)
    yv = check_labels(val_labels, n=zv.shape[0], num_classes=C, name="val_labels", device=zv.device)
    yt = check_labels(test_labels, n=zt.shape[0], num_classes=C, name="test_labels", device=zt.device)
    ood = dict(ood_logits or {})
    ood_t = {str(k): _check_logits(v, f"ood_logits[{k!r}]", C) for k, v in ood.items()}

    temps = fit_temperatures(zv, yv, n_bins=n_bins)
    temperatures = {m: float(temps[m]) for m in TEMPERATURE_METHODS if m in temps}
    for m, t in temps.items():
        temperatures.setdefault(str(m), float(t))

    test_pre = compute_metrics(zt, yt, n_bins=n_bins)
    test_post = {m: compute_metrics(zt / t, yt, n_bins=n_bins) for m, t in temperatures.items()}
    val_pre = compute_metrics(zv, yv, n_bins=n_bins)

    t_grid = temperatures.get("grid_ece")
    ood_out: dict[str, dict[str, float]] = {}
    for name, zo in ood_t.items():
        d = ood_metrics(zt, zo)
        if t_grid is not None:
            d.update({f"post_{k}": v for k, v in ood_metrics(zt, zo, temperature=t_grid).items()})
        d["n"] = int(zo.shape[0])
        ood_out[name] = d

    return {
        "schema": SCHEMA,
        "meta": dict(meta or {}),
        "temperatures": temperatures,
        "test": {"pre": test_pre, "post": test_post},
        "val": {"pre": val_pre},
        "ood": ood_out,
        "n": {"val": int(zv.shape[0]), "test": int(zt.shape[0])},
        "n_bins": n_bins,
        "num_classes": int(C),
    }


def evaluate_saved_logits(
    run_dir: str | os.PathLike, *, n_bins: int = 15, meta: Mapping[str, Any] | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Evaluate the saved logits of a run directory and (by default) write ``results.json``
    (no model needed; :func:`torchcal.train.evaluate_checkpoint` runs the model first).

    Reads ``RUN_DIR/logits/val.npz``, ``test.npz`` and every ``ood_<name>.npz``; ``meta``
    defaults to the fields of ``RUN_DIR/config.json`` (dataset, model, loss, loss_kwargs, seed,
    recipe, epochs) when that file exists.
    """
    rdir = RunDir(run_dir)
    zv, yv = load_logits(rdir.logits("val"))
    zt, yt = load_logits(rdir.logits("test"))
    ood = {name: load_logits(p)[0] for name, p in rdir.ood_logits().items()}
    if meta is None:
        meta = meta_from_config(rdir.config) if rdir.config.exists() else {}
    res = evaluate_logits(val_logits=zv, val_labels=yv, test_logits=zt, test_labels=yt,
                          ood_logits=ood, n_bins=n_bins, meta=meta)
    if write:
        write_results(rdir.path, res)
    return res
