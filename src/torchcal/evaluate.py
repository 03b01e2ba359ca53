"""Evaluation from saved logits: logits -> post-hoc temperatures -> metrics -> ``results.json``.

Logits are the interchange format (DESIGN.md): training writes ``RUN_DIR/logits/{val,test}.npz``
and ``ood_<name>.npz``; this module turns them into the ``torchcal.results/1`` document that
``torchcal report`` aggregates.  Nothing here needs the model.

``results.json`` (schema ``"torchcal.results/1"``)::

    {"schema": "torchcal.results/1",
     "meta": {"dataset", "model", "loss", "loss_kwargs", "seed", "recipe", "epoch", "checkpoint",
              "identity", "identity_fields", "predictor", "members", ...},
     "temperatures": {"grid_ece": T, "grid_adaece": T, "grid_nll": T, "nll": T},
     "test": {"pre": {metric: value}, "post": {method: {metric: value}, ...}},
     "val": {"pre": {metric: value}},
     "ood": {name: {"auroc_entropy", "auroc_max_prob", "fpr95_entropy", "aupr_entropy",
                    "post_auroc_entropy", ...}},
     "n": {"val": int, "test": int},
     "n_bins": int, "num_classes": int}

``meta.predictor`` says what the record describes (:data:`PREDICTORS`): ``"run"`` (one seed's
trained model, the default when the field is absent, so every older file reads as a run),
``"ensemble"`` (the mean of several runs' probabilities) or ``"mc_dropout"`` (one model's
dropout samples averaged).  A ``"run"`` record carries its integer ``seed``; a record of another
predictor may carry ``seed: null`` and names what it pooled in ``meta.members`` (the seeds).
``torchcal report`` groups by predictor and averages only a group's runs over seeds: an ensemble
is its own row, never one more seed.

``meta.identity`` is the run's identity hash (12 hex digits) and ``meta.identity_fields`` the
values it hashes: every setting that changes training but the seed
(:meth:`torchcal.train.TrainConfig.identity_hash`).  Seeds are counted, averaged and pooled
together only when it matches; a file written before the field gets it from the
``config.json`` beside it when ``torchcal report`` reads it.

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

import hashlib
import io
import json
import math
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._io import (
    atomic_write_bytes,
    atomic_write_text,
    check_listed,
    checksum_path,
    jsonio,
    parse_json,
    read_bytes_bounded,
    read_digests,
    read_json,
    sha256_file,
    to_jsonable,
    write_verified,
)
from ._validation import (
    as_tensor,
    check_finite,
    check_labels,
    check_positive_int,
    metric_value_problem,
)
from .errors import ResultsFileError
from .metrics import CalibrationMeter, aupr, auroc, fpr_at_tpr, ood_scores
from .posthoc import calibrator_from_dict, fit_temperatures
from .run_dir import (
    CHECKPOINTS,
    RunDir,
    checkpoint_of_results_file,
    logits_dirname,
    logits_filename,
    results_filename,
)

__all__ = [
    "SCHEMA",
    "PREDICTORS",
    "DEFAULT_PREDICTOR",
    "predictor_of",
    "METRIC_KEYS",
    "TEMPERATURE_METHODS",
    "save_logits",
    "load_logits",
    "compute_metrics",
    "ood_metrics",
    "evaluate_logits",
    "evaluate_saved_logits",
    "config_meta",
    "write_results",
    "read_results",
    "write_calibration",
    "read_calibration",
    "CHECKPOINTS",
    "results_filename",
    "logits_dirname",
    "checkpoint_of_results_file",
    "atomic_write_bytes",
    "atomic_write_text",
]

#: The ``schema`` field of every ``results.json`` this version writes.
SCHEMA = "torchcal.results/1"
#: What a results record describes (``meta.predictor``) -> its display name in tables.
#: ``"run"``: one trained model (one seed's run); ``"ensemble"``: the mean of several runs'
#: probabilities (``meta.members``: their seeds); ``"mc_dropout"``: one model with dropout active
#: at test time, its samples' probabilities averaged.
PREDICTORS = {"run": "run", "ensemble": "ensemble", "mc_dropout": "MC dropout"}
#: The predictor of a record without ``meta.predictor`` (every file written before the field).
DEFAULT_PREDICTOR = "run"
#: The metrics recorded for every split and temperature (the keys of ``CalibrationMeter.compute``).
METRIC_KEYS = (
    "ece", "adaptive_ece", "classwise_ece", "mce", "rmsce", "nll", "brier", "error",
    "topk_error", "s99_share", "s99_accuracy",
)
#: The post-hoc temperature methods fitted on the validation logits, in the order recorded.
TEMPERATURE_METHODS = ("grid_ece", "grid_adaece", "grid_nll", "nll")
# --------------------------------------------------------------------------------------------
# logits files
# --------------------------------------------------------------------------------------------
def save_logits(path: str | os.PathLike, logits: Any, labels: Any) -> Path:
    """Save ``logits`` (N, C) as float32 and ``labels`` (N,) as int64 to an ``.npz`` file, atomically,
    with its SHA-256 in ``path + ".sha256"`` (:func:`torchcal._io.write_verified`), which
    :func:`load_logits` checks.

    OOD sets may use label -1 (unknown).  Returns the path written.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> p = save_logits(d / "test.npz", np.array([[2.0, 0.0]]), np.array([0]))
    >>> z, y = load_logits(p)
    >>> z.dtype, z.tolist(), y.dtype, y.tolist()
    (dtype('float32'), [[2.0, 0.0]], dtype('int64'), [0])
    """
    z = as_tensor(logits, "logits").detach().cpu()
    if not z.is_floating_point():
        raise TypeError(f"Expected `logits` to have a floating dtype, got {z.dtype}")
    if z.ndim != 2:
        raise ValueError(f"Expected `logits` to be 2-D of shape (N, C), got shape {tuple(z.shape)}")
    y = as_tensor(labels, "labels").detach().cpu()
    if y.is_floating_point() or y.dtype == torch.bool or y.ndim != 1 or y.shape[0] != z.shape[0]:
        raise ValueError(
            f"Expected `labels` to be 1-D integers with {z.shape[0]} entries, "
            f"got dtype {y.dtype} and shape {tuple(y.shape)}"
        )

    buf = io.BytesIO()
    np.savez(buf, logits=z.float().numpy(), labels=y.long().numpy())
    return write_verified(path, buf.getvalue())  # with its SHA-256 beside it


_ZIP_MAGIC = b"PK\x03\x04"


def _check_npz_file(path: Path) -> None:
    """ResultsFileError unless ``path`` is a regular file starting as a zip archive (an
    ``.npz``): a missing file, a broken link, a directory or device (a link to ``/dev/zero``)
    and a file of another format are each named for what they are, before NumPy sees them
    (NumPy would try a non-zip file as a pickle and advise loading it unsafely)."""
    name = f"Logits file {str(path)!r}"
    if not path.exists():
        broken = f" (a broken symbolic link to {os.readlink(path)!r})" if path.is_symlink() else ""
        raise ResultsFileError(f"{name} does not exist{broken}")
    if not path.is_file():
        raise ResultsFileError(f"{name} is not a regular file (a directory, FIFO, device or "
                               "socket): expected an .npz archive of `logits` and `labels`")
    try:
        with open(path, "rb") as f:
            head = f.read(len(_ZIP_MAGIC))
    except OSError as exc:
        raise ResultsFileError(f"{name} cannot be read: {exc}") from exc
    if head != _ZIP_MAGIC:
        what = ("an empty file" if not head else "a single .npy array" if head.startswith(
            b"\x93NUM") else "not a zip archive")
        raise ResultsFileError(f"{name} is not an .npz archive ({what}): expected the `logits` "
                               "and `labels` arrays of numpy.savez / torchcal.evaluate."
                               "save_logits")


#: Largest temperature a results file may hold (and 1 / it the smallest): the calibrators'
#: bound on a parameter (a fitted temperature lies in [0.01, 100]).
MAX_TEMPERATURE = 1e6
#: Largest array a logits ``.npz`` member may declare (50,000 samples x 21,841 classes of
#: ImageNet-21k in float32 are 4.4 GB).
MAX_LOGITS_BYTES = 16 << 30
#: Largest uncompressed-to-compressed ratio of a deflated ``.npz`` member declaring more than
#: :data:`NPZ_RATIO_FROM` bytes (float logits deflate by at most ~1.2x; a member of zeros
#: deflates ~1000x: a "zip bomb"; small members, e.g. sorted labels, may deflate more).
MAX_NPZ_RATIO = 100
NPZ_RATIO_FROM = 64 << 20


def _check_npz_members(path: Path) -> None:
    """Refuse an ``.npz`` whose members would make NumPy allocate more than they hold, before
    anything is loaded: each member's declared array (shape x dtype, read from its ``.npy``
    header) must fit in the member (a header may declare 10^12 elements over 10 bytes), be
    at most :data:`MAX_LOGITS_BYTES`, and a compressed member may expand at most
    :data:`MAX_NPZ_RATIO` times."""
    name = f"Logits file {str(path)!r}"
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                ratio = info.file_size / max(info.compress_size, 1)
                if (info.compress_type != zipfile.ZIP_STORED and ratio > MAX_NPZ_RATIO
                        and info.file_size > NPZ_RATIO_FROM):
                    raise ResultsFileError(
                        f"{name} member {info.filename!r} expands {info.compress_size:,} bytes "
                        f"to {info.file_size:,} ({ratio:,.0f}x, at most {MAX_NPZ_RATIO}x "
                        "allowed): refused")
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read(f)
                    header = f.tell()
                size = math.prod(shape) * dtype.itemsize
                if size > MAX_LOGITS_BYTES or size > info.file_size - header:
                    raise ResultsFileError(
                        f"{name} member {info.filename!r} declares an array of shape "
                        f"{tuple(shape)} {dtype} ({size:,} bytes) in {info.file_size:,} bytes "
                        f"(at most {MAX_LOGITS_BYTES:,} allowed): refused")
    except ResultsFileError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError):
        return  # not a readable npz of .npy members: load_logits names what it is


def logits_digest(path: str | os.PathLike) -> str | None:
    """The SHA-256 recorded beside a logits file (the first digest of ``NAME.npz.sha256``), or
    None when it has none (or it cannot be read)."""
    try:
        return read_digests(Path(path), "Logits file", ResultsFileError)[0]
    except (OSError, ResultsFileError):
        return None


def _check_logits_digest(path: Path) -> None:
    """ResultsFileError when ``path`` has a SHA-256 file and matches none of its digests (a
    file copied over it, edited, or corrupted); nothing to check without one."""
    if not checksum_path(path).exists():
        return
    check_listed(path, what="Logits file", error=ResultsFileError,
                 hint="it was replaced or edited after torchcal wrote it; evaluate the run "
                      "again (torchcal eval RUN_DIR) to rewrite it")


def load_logits(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Load ``(logits float32 (N, C), labels int64 (N,))`` saved by :func:`save_logits`.

    Raises :class:`~torchcal.errors.ResultsFileError` naming the file when it is missing,
    unreadable, does not match the SHA-256 beside it (``NAME.npz.sha256``; a file without one,
    written by hand or by a torchcal before 0.x verified logits, is read unchecked) or does not
    hold a 2-D floating ``logits`` and matching 1-D integer ``labels``.
    """
    path = Path(path)
    _check_npz_file(path)
    _check_logits_digest(path)
    _check_npz_members(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            keys = set(f.files)
            missing = {"logits", "labels"} - keys
            if missing:
                raise ResultsFileError(
                    f"Logits file {str(path)!r} is malformed: missing array(s) {sorted(missing)} "
                    f"(found {sorted(keys)})"
                )
            z = f["logits"]
            y = f["labels"]
    except ResultsFileError:
        raise
    except Exception as exc:  # zipfile.BadZipFile, OSError, ValueError (pickled data), EOFError
        raise ResultsFileError(
            f"Logits file {str(path)!r} is malformed or truncated: {type(exc).__name__}: {exc}"
        ) from exc
    if z.ndim != 2 or not np.issubdtype(z.dtype, np.floating):
        hint = ("; a binary classifier's scores of shape (N,) are stacked into (N, 2): "
                "np.stack([np.zeros_like(z), z], 1) for logits z, "
                "np.log(np.stack([1 - p, p], 1)) for probabilities p") if z.ndim == 1 else ""
        raise ResultsFileError(
            f"Logits file {str(path)!r} is malformed: expected `logits` 2-D floating, "
            f"got dtype {z.dtype} shape {z.shape}{hint}"
        )
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or y.shape[0] != z.shape[0]:
        raise ResultsFileError(
            f"Logits file {str(path)!r} is malformed: expected `labels` 1-D integer with "
            f"{z.shape[0]} entries, got dtype {y.dtype} shape {y.shape}"
        )
    return z.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------
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
    run = RunDir(run_dir)
    zv, yv = load_logits(run.logits("val"))
    zt, yt = load_logits(run.logits("test"))
    ood = {name: load_logits(p)[0] for name, p in run.ood_logits().items()}
    if meta is None:
        meta = meta_from_config(run.config) if run.config.exists() else {}
    res = evaluate_logits(val_logits=zv, val_labels=yv, test_logits=zt, test_labels=yt,
                          ood_logits=ood, n_bins=n_bins, meta=meta)
    if write:
        write_results(run.path, res)
    return res


_META_FIELDS = ("dataset", "model", "loss", "loss_kwargs", "seed", "recipe", "epochs")


def meta_from_config(path: str | os.PathLike) -> dict[str, Any]:
    """The run-describing fields of a ``config.json`` (ResultsFileError naming the file if bad)."""
    path = Path(path)
    try:
        cfg = read_json(path, what="Config file", error=ResultsFileError)
    except FileNotFoundError as exc:
        raise ResultsFileError(f"Config file {str(path)!r} does not exist") from exc
    if not isinstance(cfg, dict):
        raise ResultsFileError(f"Config file {str(path)!r} is malformed: expected a JSON object")
    return config_meta(cfg)


def config_meta(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run-describing fields of a config dict (a ``config.json``'s, or
    ``TrainConfig.to_dict()``), in the order a results file's ``meta`` holds them: the one
    builder of a result's ``meta`` (the trainer adds the evaluated epoch and checkpoint).

    >>> config_meta({"seed": 1, "loss": "ce", "lr": 0.1})
    {'loss': 'ce', 'seed': 1}
    """
    return {k: config[k] for k in _META_FIELDS if k in config}


def predictor_of(meta: Mapping[str, Any]) -> str:
    """What a results record describes: ``meta["predictor"]``, :data:`DEFAULT_PREDICTOR` if absent.

    Raises ResultsFileError when it is not one of :data:`PREDICTORS`.

    >>> predictor_of({"seed": 0}), predictor_of({"predictor": "ensemble", "seed": None})
    ('run', 'ensemble')
    """
    p = meta.get("predictor")
    if p is None:
        return DEFAULT_PREDICTOR
    if not isinstance(p, str) or p not in PREDICTORS:
        raise ResultsFileError(f"Expected meta.predictor to be one of {', '.join(PREDICTORS)} "
                               f"(or absent: a seed's run), got {p!r:.60}")
    return p


# --------------------------------------------------------------------------------------------
# results.json
# --------------------------------------------------------------------------------------------
def write_results(run_dir: str | os.PathLike, results: Mapping[str, Any]) -> Path:
    """Write ``results`` to ``RUN_DIR/results.json`` atomically (NaN written as ``null``), with
    its SHA-256 beside it (``results.json.sha256``, :func:`torchcal._io.write_verified`) and,
    under ``logits_sha256``, the SHA-256 of each logits file it was computed from (the
    ``logits/`` or ``logits-best/`` folder beside it), which :func:`read_results` checks.

    ``run_dir`` may also be a path ending in ``.json``, written as is.
    """
    p = Path(run_dir)
    path = p if p.suffix == ".json" else RunDir(p).results()
    doc = dict(results)
    digests = _logits_digests(path)
    if digests:
        doc["logits_sha256"] = digests
    text = json.dumps(to_jsonable(doc), indent=2, allow_nan=False) + "\n"
    return write_verified(path, text.encode("utf-8"))


_RESULTS_NAMES = tuple(results_filename(c) for c in CHECKPOINTS)
_HEX64 = frozenset("0123456789abcdef")


def _logits_dir_of(results_path: Path) -> Path | None:
    """The logits folder a run's results file describes (None for a file of another name)."""
    if results_path.name not in _RESULTS_NAMES:
        return None
    return results_path.parent / logits_dirname(checkpoint_of_results_file(results_path))


def _logits_digests(results_path: Path) -> dict[str, str]:
    """``{split: SHA-256}`` of the verified logits files beside a results file."""
    d = _logits_dir_of(results_path)
    if d is None or not d.is_dir():
        return {}
    out = {}
    for f in sorted(d.glob("*.npz")):
        digest = logits_digest(f)
        if digest is not None:
            out[f.stem] = digest
    return out


def _digest_problem(path: Path, raw: bytes) -> str:
    """Why the bytes of a results file do not match its SHA-256 file ('' if they do, or
    there is none: a file of a torchcal before 0.x, read unchecked)."""
    if not checksum_path(path).exists():
        return ""
    digests = read_digests(path, "Results file", ResultsFileError)
    if hashlib.sha256(raw).hexdigest() in digests:
        return ""
    return (f"does not match its SHA-256 in {checksum_path(path).name}: it was edited after "
            "torchcal wrote it")


def _identity_problem(path: Path, res: Mapping[str, Any]) -> str:
    """Why a run's results file does not belong where it sits ('' if it does): its loss or
    seed differ from the ``config.json`` beside it, or the logits beside it are not those it
    was computed from (``logits_sha256``)."""
    meta = res.get("meta") or {}
    cfg_path = path.parent / RunDir(path.parent).config.name
    if predictor_of(meta) == DEFAULT_PREDICTOR and path.name in _RESULTS_NAMES \
            and cfg_path.is_file():
        cfg = meta_from_config(cfg_path)
        for key in ("loss", "seed"):
            if key in meta and key in cfg and meta[key] != cfg[key]:
                return (f"says {key} {meta[key]!r} but the run directory it sits in was trained "
                        f"with {key} {cfg[key]!r} ({cfg_path.name}): it belongs to another run")
    recorded = res.get("logits_sha256")
    if recorded is None:
        return ""
    if not isinstance(recorded, dict) or not all(
            isinstance(v, str) and len(v) == 64 and set(v) <= _HEX64 for v in recorded.values()):
        return "is malformed: expected logits_sha256 to map splits to SHA-256 hex digests"
    d = _logits_dir_of(path)
    for split, digest in recorded.items() if d is not None else ():
        f = d / logits_filename(str(split))
        if f.is_file() and (logits_digest(f) or sha256_file(f)) != digest:
            return (f"was computed from other logits than {str(f)!r} (their SHA-256 differ): "
                    "one of them was replaced or edited")
    return ""


def _impossible_metric(res: Mapping[str, Any]) -> str:
    """The first impossible metric value of a results document ('' if none), e.g.
    ``"test.pre: expected `ece` to be a number in [0, 1], got -5"``."""
    sections: list[tuple[str, Any]] = [("test.pre", res["test"]["pre"])]
    sections += [(f"test.post.{m}", d) for m, d in (res["test"].get("post") or {}).items()]
    if isinstance(res.get("val"), dict):
        sections += [(f"val.{k}", d) for k, d in res["val"].items() if isinstance(d, dict)]
    sections += [(f"ood.{k}", d) for k, d in (res.get("ood") or {}).items() if isinstance(d, dict)]
    for where, metrics in sections:
        for name, value in metrics.items():
            problem = metric_value_problem(str(name), value)
            if problem:
                return f"{where}: {problem}"
    return ""


_REDO = ("torchcal eval RUN_DIR, or the sweep run again, recomputes it; a sweep recomputes it "
         "by itself")


def _untrusted(path: Path, problem: str) -> ResultsFileError:
    """The refusal of a results file that was edited or moved; its ``reason`` attribute is
    the sentence without the advice (a sweep that recomputes the file says so instead)."""
    exc = ResultsFileError(f"Results file {str(path)!r} {problem}; refused ({_REDO})")
    exc.reason = f"Results file {str(path)!r} {problem}"  # type: ignore[attr-defined]
    return exc


def _nan_for_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _nan_for_none(v) for k, v in x.items()}
    return float("nan") if x is None else x


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a ``results.json`` (a file, or a run directory holding one).

    Raises :class:`~torchcal.errors.ResultsFileError` naming the file when it is missing, not
    JSON, of another schema, or lacks the ``test.pre`` metrics.  ``null`` metric values come
    back as NaN.
    """
    path = Path(path)
    if path.is_dir():
        path = RunDir(path).results()
    try:  # bounded: a regular file of at most 16 MiB, no NaN/Infinity, bounded nesting
        raw = read_bytes_bounded(path, max_bytes=jsonio.MAX_JSON_BYTES, what="Results file",
                                 error=ResultsFileError)
    except FileNotFoundError as exc:
        raise ResultsFileError(f"Results file {str(path)!r} does not exist") from exc
    except OSError as exc:
        raise ResultsFileError(f"Results file {str(path)!r} cannot be read: {exc}") from exc
    problem = _digest_problem(path, raw)
    if problem:
        raise _untrusted(path, problem)
    res = parse_json(raw, what="Results file", path=path, error=ResultsFileError)

    def bad(msg: str) -> ResultsFileError:
        return ResultsFileError(f"Results file {str(path)!r} is malformed: {msg}")

    if not isinstance(res, dict):
        raise bad("expected a JSON object")
    if res.get("schema") != SCHEMA:
        raise bad(f"expected schema {SCHEMA!r}, got {res.get('schema')!r}")
    test = res.get("test")
    if not isinstance(test, dict) or not isinstance(test.get("pre"), dict):
        raise bad("missing the 'test' -> 'pre' metrics")
    for section in ("meta", "temperatures", "val", "ood", "n"):
        if section in res and not isinstance(res[section], dict):
            raise bad(f"expected {section!r} to be an object")
    for k, v in test["pre"].items():
        if v is not None and not isinstance(v, (int, float)):
            raise bad(f"expected test.pre[{k!r}] to be a number, got {v!r}")
    for k, v in (res.get("temperatures") or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                1 / MAX_TEMPERATURE <= v <= MAX_TEMPERATURE):
            raise bad(f"expected temperatures[{k!r}] to be a positive number in "
                      f"[{1 / MAX_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {v!r}")
    for k, v in (res.get("n") or {}).items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(f"expected n[{k!r}] (a number of samples) to be a non-negative integer, "
                      f"got {v!r}")
    post = test.get("post", {})
    if not isinstance(post, dict) or not all(isinstance(v, dict) for v in post.values()):
        raise bad("expected 'test' -> 'post' to map methods to metric objects")
    problem = _impossible_metric(res)
    if problem:
        raise bad(problem)
    problem = _identity_problem(path, res)
    if problem:
        raise _untrusted(path, problem)
    res.setdefault("meta", {})
    res.setdefault("temperatures", {})
    res.setdefault("ood", {})
    res["test"] = _nan_for_none(test)
    if isinstance(res.get("val"), dict):
        res["val"] = _nan_for_none(res["val"])
    res["ood"] = _nan_for_none(res["ood"])
    return res


# --------------------------------------------------------------------------------------------
# torchcal calibrate's output
# --------------------------------------------------------------------------------------------
def write_calibration(path: str | os.PathLike, report: Mapping[str, Any]) -> Path:
    """Write ``torchcal calibrate``'s output (the calibrator's ``to_dict()`` and the metrics
    before and after) as JSON, atomically, with its SHA-256 in ``path + ".sha256"``
    (:func:`torchcal._io.write_verified`)."""
    text = json.dumps(to_jsonable(dict(report)), indent=2, allow_nan=False) + "\n"
    return write_verified(path, text.encode("utf-8"))


def read_calibration(path: str | os.PathLike) -> dict[str, Any]:
    """Read ``torchcal calibrate --out`` output, verified against its SHA-256 file and bounded
    (:func:`torchcal._io.read_json`); rebuild the calibrator with
    :func:`torchcal.posthoc.calibrator_from_dict` from its ``"calibrator"`` entry.

    Raises:
        ResultsFileError: the file is missing, does not match its SHA-256, is not bounded
            JSON, or holds an impossible metric value or a calibrator that
            :func:`~torchcal.posthoc.calibrator_from_dict` refuses (a temperature, weight or
            knot out of range; the message names the file).
    """
    path = Path(path)
    doc = read_json(path, what="Calibration file", error=ResultsFileError, verified=True,
                    hint="run torchcal calibrate again")
    if not isinstance(doc, dict):
        raise ResultsFileError(f"Calibration file {str(path)!r} is malformed: expected a JSON "
                               "object")
    for split in ("val", "test"):
        for stage, metrics in (doc.get(split) or {}).items() if isinstance(doc.get(split),
                                                                            dict) else ():
            problems = ([metric_value_problem(str(k), v) for k, v in metrics.items()]
                        if isinstance(metrics, dict) else ["expected an object of metrics"])
            problem = next((p for p in problems if p), "")
            if problem:
                raise ResultsFileError(f"Calibration file {str(path)!r} is malformed: "
                                       f"{split}.{stage}: {problem}")
    if doc.get("calibrator") is not None:  # its values too: T = 1e-300 would give NaN later
        try:
            calibrator_from_dict(doc["calibrator"])
        except (TypeError, ValueError) as exc:
            raise ResultsFileError(f"Calibration file {str(path)!r} holds an unusable "
                                   f"calibrator: {exc}; run torchcal calibrate again") from exc
    return doc
