"""The results file: ``results.json`` (schema ``"torchcal.results/1"``), written by
:func:`write_results` and read, checked, by :func:`read_results`; and ``torchcal calibrate``'s
output (:func:`write_calibration`, :func:`read_calibration`).

``results.json``::

    {"schema": "torchcal.results/1",
     "meta": {"dataset", "model", "loss", "loss_kwargs", "seed", "recipe", "epoch", "checkpoint",
              "identity", "identity_fields", "predictor", "members", ...},
     "temperatures": {"grid_ece": T, "grid_adaece": T, "grid_nll": T, "nll": T},
     "test": {"pre": {metric: value}, "post": {method: {metric: value}, ...}},
     "val": {"pre": {metric: value}},
     "ood": {name: {"auroc_entropy", "auroc_max_prob", "fpr95_entropy", "aupr_entropy",
                    "post_auroc_entropy", ...}},
     "n": {"val": int, "test": int},
     "n_bins": int, "num_classes": int,
     "logits_sha256": {split: SHA-256}}

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

A results file is written with its SHA-256 beside it and the SHA-256 of the logits files it was
computed from (``logits_sha256``); :func:`read_results` refuses a file that was edited, that
sits in another run's directory, or that was computed from other logits than those beside it,
and one holding an impossible number.  The metrics are computed by :mod:`torchcal.evaluate`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._io import (
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
from ._validation import metric_value_problem
from .errors import ResultsFileError
from .logits_file import logits_digest
from .posthoc import calibrator_from_dict
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
    "MAX_TEMPERATURE",
    "config_meta",
    "meta_from_config",
    "write_results",
    "read_results",
    "write_calibration",
    "read_calibration",
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
#: Largest temperature a results file may hold (and 1 / it the smallest): the calibrators'
#: bound on a parameter (a fitted temperature lies in [0.01, 100]).
MAX_TEMPERATURE = 1e6


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
