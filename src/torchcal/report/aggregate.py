"""Find evaluated runs, read their ``results.json``, group them and average over seeds.

A *run* is a directory holding ``results.json`` (written by :func:`torchcal.results_file.write_results`)
and usually ``config.json``, ``logits/`` and ``log.jsonl``.  Records are grouped by
``(dataset, model, loss, loss_kwargs, predictor)``: two focal runs with different γ are different
rows, and so are a loss's seeds (``predictor`` ``"run"``, the default) and an ensemble of them
(``"ensemble"``, see :data:`torchcal.results_file.PREDICTORS`): an ensemble is never averaged in as
one more seed.  Within that key, records are seeds of one configuration only when their
*identity* matches (``meta.identity``, the hash of every setting that changes training but the
seed: :meth:`torchcal.train.TrainConfig.identity_hash`): runs of one loss at another learning
rate are a group of their own, labelled with the settings that differ, and
:func:`identity_notes` names them and why ("runs/b/seed0 (lr 0.05) kept apart from the 3 runs
of Focal (γ=3) at lr 0.1: identity differs in lr").  A results file written before the field
gets its identity from the ``config.json`` beside it (``identity_of``, given by the command
line, which may read the training configuration); one without either has no identity: it is
grouped with the other such records of its key only, and a note says so.  A seed's run must name its integer seed (a ``"run"`` record with ``seed: null``
is refused, named in the report's skipped files).  Within a group every number is averaged over
the records (seeds): ``mean`` and the sample standard deviation (``ddof=1``; NaN for a single
record), ignoring NaN entries (an undefined metric such as ``s99_accuracy`` with no confident
sample).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import find_files, read_json
from ..errors import ResultsFileError
from ..logits_file import load_logits
from ..losses import LOSSES
from ..results_file import (
    DEFAULT_PREDICTOR,
    PREDICTORS,
    meta_from_config,
    predictor_of,
    read_results,
)
from ..run_dir import (
    CONFIG_FILE,
    RunDir,
    checkpoint_of_results_file,
    logits_dirname,
    logits_filename,
    results_filename,
)

__all__ = [
    "RunRecord",
    "Group",
    "LoadReport",
    "find_result_files",
    "load_run",
    "load_runs",
    "check_checkpoints",
    "runs_from_results_csv",
    "flatten_results",
    "group_runs",
    "mean_std",
    "loss_label",
    "group_label",
    "meta_problem",
    "LOSS_ORDER",
    "loss_rank",
    "predictor_rank",
    "identity_notes",
    "IdentityOf",
    "TestLogits",
    "read_test_logits",
]

#: How a run's identity is computed from its ``config.json`` dict (results written before
#: ``meta.identity``): ``{"identity": HASH, "identity_fields": {...}}`` or None
#: (:func:`torchcal.train.config.config_identity`, which this layer may not import).
IdentityOf = Callable[[Mapping[str, Any]], "dict[str, Any] | None"]

#: Display order and names of the registry's losses (others follow alphabetically).
#: The canonical loss order of tables and figures: the ``order`` of each registered loss
#: (:data:`torchcal.losses.LOSSES`); display names come from the same registry.
LOSS_ORDER = tuple(LOSSES.ordered())
_GREEK = {"gamma": "γ", "alpha": "α", "lam": "λ", "beta": "β"}


def _fmt_value(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def loss_label(loss: str, loss_kwargs: Mapping[str, Any] | None = None) -> str:
    """A table label: ``loss_label("focal", {"gamma": 3.0})`` -> ``'Focal (γ=3)'``.

    >>> loss_label("flsd53")
    'FLSD-53'
    >>> loss_label("adafocal", {"lam": 0.1, "n_bins": 15})
    'AdaFocal (λ=0.1, n_bins=15)'
    """
    name = LOSSES.display(loss)
    if loss_kwargs:
        args = ", ".join(f"{_GREEK.get(k, k)}={_fmt_value(v)}" for k, v in sorted(loss_kwargs.items()))
        name = f"{name} ({args})"
    return name


def group_label(loss: str, loss_kwargs: Mapping[str, Any] | None = None,
                predictor: str = DEFAULT_PREDICTOR) -> str:
    """A row label: the loss's label, followed by the predictor's name unless the row holds a
    loss's seeds (predictor ``"run"``).

    >>> group_label("ce"), group_label("focal", {"gamma": 3.0}, "ensemble")
    ('Cross-entropy', 'Focal (γ=3) · ensemble')
    """
    name = loss_label(loss, loss_kwargs)
    if predictor == DEFAULT_PREDICTOR:
        return name
    return f"{name} · {PREDICTORS.get(predictor, predictor)}"


@dataclass
class RunRecord:
    """One evaluated run: its directory, the parsed results and the flattened numbers."""

    run_dir: Path
    results_path: Path
    results: dict[str, Any]
    meta: dict[str, Any]
    flat: dict[str, float]

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """``(dataset, model, loss, loss_kwargs as JSON, predictor)``: the group of the record."""
        kw = json.dumps(self.meta.get("loss_kwargs") or {}, sort_keys=True)
        return (str(self.meta.get("dataset", "?")), str(self.meta.get("model", "?")),
                str(self.meta.get("loss", "?")), kw, self.predictor)

    @property
    def predictor(self) -> str:
        """What the record describes: ``meta.predictor``, ``"run"`` (a seed's run) if absent."""
        return str(self.meta.get("predictor") or DEFAULT_PREDICTOR)

    @property
    def seed(self) -> Any:
        return self.meta.get("seed")

    @property
    def identity(self) -> str | None:
        """The run's identity hash (``meta.identity``), None when it records none."""
        v = self.meta.get("identity")
        return v if isinstance(v, str) else None

    @property
    def checkpoint(self) -> str:
        """The evaluated checkpoint: ``meta.checkpoint``, else the results file's name."""
        c = self.meta.get("checkpoint")
        return str(c) if c else checkpoint_of_results_file(self.results_path)

    @property
    def logits_dir(self) -> Path:
        """The saved logits of this evaluation (``logits/``, or ``logits-best/`` beside
        ``results-best.json``)."""
        return self.run_dir / logits_dirname(checkpoint_of_results_file(self.results_path))


#: Each run's saved test logits by the file's path: ``{path: (logits (N, C), labels (N,))}``.
TestLogits = dict[Path, tuple[np.ndarray, np.ndarray]]


def read_test_logits(runs: Iterable[RunRecord]) -> TestLogits:
    """The saved test logits of each run that has readable ones (``logits/test.npz`` beside its
    results file; a missing or refused file is left out), read once: a report hands them to
    the claims' confidence gaps, the noise floors and the figures alike."""
    out: TestLogits = {}
    for r in runs:
        p = r.logits_dir / logits_filename("test")
        if p in out or not p.is_file():
            continue
        try:
            out[p] = load_logits(p)
        except ResultsFileError:
            continue
    return out


@dataclass
class Group:
    """Records sharing (dataset, model, loss, loss_kwargs, predictor) with per-key mean and std
    over them (over seeds for the ``"run"`` predictor)."""

    dataset: str
    model: str
    loss: str
    loss_kwargs: dict[str, Any]
    runs: list[RunRecord]
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    predictor: str = DEFAULT_PREDICTOR
    #: An ensemble group's seed-subset ensembles: records whose seeds (``meta.members``) are a
    #: proper subset of another record's of the group (the demo's ensembles of 3 of 5 seeds,
    #: on which the ensemble claims are tested).  They are not in ``runs``, ``mean`` or
    #: ``std``: the tables show the ensembles of all the seeds.
    subsets: list[RunRecord] = field(default_factory=list)
    #: The runs' identity hash (``meta.identity``; None: recorded by none of them).
    identity: str | None = None
    #: For a group kept apart from another of the same loss, arguments and predictor (another
    #: identity): the settings that tell it apart (``"lr=0.05"``); '' for the main group.
    variant: str = ""
    #: The main group of the same key that this one was kept apart from (None for the main).
    apart_from: Group | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        """The row label: :func:`group_label` of the loss, its arguments and the predictor, and
        the settings of a group kept apart (``"Focal (γ=3) · lr=0.05"``)."""
        name = group_label(self.loss, self.loss_kwargs, self.predictor)
        return f"{name} · {self.variant}" if self.variant else name

    @property
    def identity_fields(self) -> dict[str, Any]:
        """The hashed settings of the group's identity (its first run's ``meta.identity_fields``;
        {} when unknown)."""
        v = self.runs[0].meta.get("identity_fields") if self.runs else None
        return v if isinstance(v, dict) else {}

    @property
    def seeds(self) -> list[Any]:
        return [r.seed for r in self.runs]


@dataclass
class LoadReport:
    """Runs read successfully and ``(path, message)`` for every file that could not be used."""

    runs: list[RunRecord]
    errors: list[tuple[str, str]]


def find_result_files(paths: Iterable[str | os.PathLike], checkpoint: str = "last",
                      ) -> tuple[list[Path], list[tuple[str, str]]]:
    """Every ``results.json`` under ``paths`` (a path may also be a results file itself); with
    ``checkpoint="best"`` every ``results-best.json`` (``torchcal eval RUN --checkpoint best``).

    Returns the sorted, de-duplicated files and ``(path, message)`` for arguments that do not
    exist or hold no ``results.json``, and for every ``torchcal train`` run directory found
    (one holding a training ``config.json``) whose ``results.json`` is missing.
    """
    name = results_filename(checkpoint)
    how = "`torchcal eval RUN_DIR`" + ("" if checkpoint == "last" else
                                       f" --checkpoint {checkpoint}")
    found: dict[Path, None] = {}
    errors: list[tuple[str, str]] = []
    missing: dict[Path, None] = {}
    for p in paths:
        p = Path(p)
        if p.is_file():
            found[p.resolve()] = None
        elif p.is_dir():
            hits, leaving = find_files(p, name)  # links leaving the tree: named, not followed
            for link, target in leaving:
                errors.append((str(link), f"Skipped {str(link)!r}: a symbolic link to "
                               f"{str(target)!r}, outside {str(p)!r} (links that leave a run tree "
                               "are not followed; pass the target itself to report it)"))
            unevaluated = [d for d in _train_run_dirs(p) if not (d / name).is_file()]
            if not hits and not unevaluated and not leaving:
                errors.append((str(p), f"No {name} found under {str(p)!r} "
                                       f"(evaluate the run first: {how})"))
            for h in hits:
                found[h.resolve()] = None
            for d in unevaluated:
                missing[d.resolve()] = None
        else:
            errors.append((str(p), f"Run directory {str(p)!r} does not exist"))
    for d in sorted(missing):
        f = d / name
        errors.append((str(f), f"Results file {str(f)!r} does not exist: the run in {str(d)!r} "
                               f"was not evaluated or did not finish ({how})"))
    return sorted(found), errors


def _train_run_dirs(root: Path) -> list[Path]:
    """Directories under ``root`` (itself included) holding a ``torchcal train`` config.json."""
    out = []
    for c in find_files(root, CONFIG_FILE)[0]:
        try:
            d = read_json(c, what="Config file")
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and {"dataset", "model", "loss", "epochs"} <= d.keys():
            out.append(c.parent)
    return out


def flatten_results(results: Mapping[str, Any]) -> dict[str, float]:
    """Every number of a results dict under a dotted key.

    Keys: ``temperature.<method>``, ``test.pre.<metric>``, ``test.post.<method>.<metric>``,
    ``val.pre.<metric>``, ``ood.<name>.<metric>``, ``n.<split>``.

    >>> flatten_results({"temperatures": {"grid_ece": 1.5}, "test": {"pre": {"ece": 0.1}}})
    {'temperature.grid_ece': 1.5, 'test.pre.ece': 0.1}
    """
    out: dict[str, float] = {}

    def num(v: Any) -> float | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) and v is not None:
            return None
        return float("nan") if v is None else float(v)

    for m, t in (results.get("temperatures") or {}).items():
        if (v := num(t)) is not None:
            out[f"temperature.{m}"] = v

    def walk(prefix: str, d: Any) -> None:
        if isinstance(d, Mapping):
            for k, v in d.items():
                walk(f"{prefix}.{k}", v)
        elif (v := num(d)) is not None:
            out[prefix] = v

    for section in ("test", "val", "ood", "n"):
        if isinstance(results.get(section), Mapping):
            walk(section, results[section])
    return out


def load_run(results_path: str | os.PathLike, identity_of: IdentityOf | None = None
             ) -> RunRecord:
    """Read one run; ``meta`` comes from ``results.json`` and falls back to ``config.json``
    (a run's identity too, computed by ``identity_of`` from that file, when the results file
    records none).

    Raises :class:`~torchcal.errors.ResultsFileError` naming the bad file.
    """
    results_path = Path(results_path)
    res = read_results(results_path)
    run_dir = results_path.parent
    meta = dict(res.get("meta") or {})
    cfg_path = RunDir(run_dir).config
    if cfg_path.exists():
        for k, v in meta_from_config(cfg_path).items():
            meta.setdefault(k, v)
        if meta.get("identity") is None and identity_of is not None \
                and predictor_of(meta) == DEFAULT_PREDICTOR:
            cfg = read_json(cfg_path, what="Config file", error=ResultsFileError)
            found = identity_of(cfg) if isinstance(cfg, dict) else None
            meta.update(found or {})
    if not meta.get("loss"):
        raise ResultsFileError(
            f"Results file {str(results_path)!r} names no loss (neither meta.loss nor a {CONFIG_FILE})"
        )
    if meta.get("loss_kwargs") is not None and not isinstance(meta["loss_kwargs"], dict):
        raise ResultsFileError(
            f"Results file {str(results_path)!r} is malformed: meta.loss_kwargs is not an object"
        )
    problem = meta_problem(meta)
    if not problem and predictor_of(meta) == DEFAULT_PREDICTOR and meta.get("seed") is None:
        problem = (f"meta.seed is {'null' if 'seed' in meta else 'missing'}: a seed's run "
                   "(meta.predictor 'run', the default) needs its integer seed; a record that "
                   f"pools runs says what it is in meta.predictor (one of {', '.join(PREDICTORS)})")
    if problem:
        raise ResultsFileError(f"Results file {str(results_path)!r} is malformed: {problem}")
    return RunRecord(run_dir=run_dir, results_path=results_path, results=res, meta=meta,
                     flat=flatten_results(res))


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_MAX_KWARGS_TEXT = 200
_IDENTITY_RE = re.compile(r"^[0-9a-f]{12}$")
_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_]{0,63})?$")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain_value(v: Any, depth: int = 0) -> bool:
    """A loss hyperparameter that can be shown as is: a finite number, a bool, None, a short
    name, or a short list/object of those."""
    if v is None or isinstance(v, bool) or isinstance(v, int):
        return True
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, str):
        return bool(_NAME_RE.match(v))
    if depth < 2 and isinstance(v, list):
        return len(v) <= 32 and all(_plain_value(x, depth + 1) for x in v)
    if depth < 2 and isinstance(v, dict):
        return len(v) <= 32 and all(isinstance(k, str) and _KEY_RE.match(k)
                                    and _plain_value(x, depth + 1) for k, x in v.items())
    return False


def meta_problem(meta: Mapping[str, Any]) -> str:
    """What makes a run's ``meta`` unfit to become a table label or a file name ('' if nothing).

    ``dataset``, ``model``, ``loss`` (and ``recipe``) must be names of letters, digits and
    ``_ . + -`` (at most 64 characters), ``loss_kwargs`` an object of identifiers to finite
    numbers, booleans, null, such names or short lists/objects of them, ``seed`` and ``epochs``
    integers (or null), ``predictor`` one of :data:`torchcal.results_file.PREDICTORS` (or absent),
    ``members`` a list of at most 1,000 integers (the seeds an ensemble pooled).  Results of
    torchcal always pass; a hand-edited or hostile file (Markdown or HTML in a name, a 10 kB
    label) does not.

    >>> meta_problem({"loss": "focal", "loss_kwargs": {"gamma": 3.0}, "seed": 1})
    ''
    >>> meta_problem({"loss": "ce | <b>x</b>"})
    "meta.loss must be a name of letters, digits and _ . + - (at most 64 characters), got 'ce | <b>x</b>'"
    >>> meta_problem({"loss": "ce", "predictor": "bagging"})
    "Expected meta.predictor to be one of run, ensemble, mc_dropout (or absent: a seed's run), got 'bagging'"
    """
    try:
        predictor_of(meta)
    except ResultsFileError as exc:
        return str(exc)
    members = meta.get("members")
    if members is not None and (not isinstance(members, list) or len(members) > 1000 or not all(
            isinstance(m, int) and not isinstance(m, bool) for m in members)):
        return f"meta.members must be a list of integers (the pooled seeds), got {_short(members)}"
    for key in ("dataset", "model", "loss", "recipe", "checkpoint"):
        v = meta.get(key)
        if v is None and key not in ("loss",):
            continue
        if not isinstance(v, str) or not _NAME_RE.match(v):
            return (f"meta.{key} must be a name of letters, digits and _ . + - (at most 64 "
                    f"characters), got {_short(v)}")
    kw = meta.get("loss_kwargs") or {}
    for k, v in kw.items():
        if not isinstance(k, str) or not _KEY_RE.match(k):
            return f"meta.loss_kwargs has a key that is not an identifier: {_short(k)}"
        if not _plain_value(v):
            return (f"meta.loss_kwargs[{k!r}] must be a finite number, a boolean, null, a name "
                    f"or a short list of them, got {_short(v)}")
    if len(json.dumps(kw, sort_keys=True)) > _MAX_KWARGS_TEXT:
        return f"meta.loss_kwargs is longer than {_MAX_KWARGS_TEXT} characters"
    ident, fields = meta.get("identity"), meta.get("identity_fields")
    if ident is not None and (not isinstance(ident, str) or not _IDENTITY_RE.match(ident)):
        return f"meta.identity must be a hash of 12 hex digits, got {_short(ident)}"
    if fields is not None and (not isinstance(fields, dict) or len(fields) > 500 or not all(
            isinstance(k, str) and _FIELD_RE.match(k) for k in fields)):
        return ("meta.identity_fields must be an object of setting names (the values of the "
                f"run's identity), got {_short(fields)}")
    for key in ("seed", "epochs", "epoch"):
        v = meta.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            return f"meta.{key} must be an integer or null, got {_short(v)}"
    return ""


def load_runs(paths: Iterable[str | os.PathLike], checkpoint: str = "last", *,
              identity_of: IdentityOf | None = None) -> LoadReport:
    """Find and read every run under ``paths`` (the evaluations of ``checkpoint``, see
    :func:`find_result_files`); a bad file is recorded, never fatal.  ``identity_of``: how a
    run whose results record no identity gets it from its ``config.json`` (:func:`load_run`;
    ``torchcal report`` gives :func:`torchcal.train.config.config_identity`)."""
    files, errors = find_result_files(paths, checkpoint)
    runs: list[RunRecord] = []
    for f in files:
        try:
            runs.append(load_run(f, identity_of))
        except ResultsFileError as exc:
            if _is_report_file(f):  # the results.json of a report (e.g. a demo's top level)
                continue  # or of `torchcal uncertainty eval` (RUN_DIR/uncertainty/)
            errors.append((str(f), str(exc)))
    runs = _one_per_identity(runs, errors)
    return LoadReport(runs=runs, errors=errors)


def _one_per_identity(runs: list[RunRecord], errors: list[tuple[str, str]]) -> list[RunRecord]:
    """Skip (as ``errors``) a seed's run claiming the identity (dataset, model, loss, loss
    arguments, identity hash, seed) of one read before it (a copied run directory is no second
    seed), and a
    run whose ``n_bins`` differs from most runs' (its binned metrics are not comparable and
    the report states one number of bins)."""
    seen: dict[tuple[Any, ...], Path] = {}
    kept: list[RunRecord] = []
    for r in runs:
        ident = (*r.key, r.identity, r.seed)
        if r.predictor == DEFAULT_PREDICTOR and ident in seen:
            errors.append((str(r.results_path), f"claims the run {r.key[2]} seed {r.seed} that "
                           f"{str(seen[ident])!r} already is (a copied run directory?): skipped"))
            continue
        seen.setdefault(ident, r.results_path)
        kept.append(r)
    bins = [r.results.get("n_bins") for r in kept]
    common = max(bins, key=bins.count) if bins else None
    out = []
    for r, b in zip(kept, bins, strict=True):
        if b != common:
            errors.append((str(r.results_path), f"has n_bins {b} while the other runs have "
                           f"{common}: its binned metrics are not comparable: skipped"))
        else:
            out.append(r)
    return out


def runs_from_results_csv(csv_text: str) -> list[RunRecord]:
    """The runs of a report's ``results.csv`` (one row per record, fractions; written by
    :func:`torchcal.report.tables.runs_csv`), read back without their run directories, so that
    a committed ``results.csv`` can be grouped and its claims checked again.  A file without
    the ``predictor`` column (written before it) holds seeds' runs only; ``members`` (an
    ensemble's seeds, space-separated) becomes ``meta.members``.

    >>> rows = "dataset,model,loss,loss_kwargs,seed,run_dir,test.pre.ece\\nd,m,ce,{},0,r,0.04\\n"
    >>> r = runs_from_results_csv(rows)[0]
    >>> r.key, r.seed, r.flat
    (('d', 'm', 'ce', '{}', 'run'), 0, {'test.pre.ece': 0.04})
    """
    reader = csv.DictReader(io.StringIO(csv_text))
    need = ("dataset", "model", "loss", "loss_kwargs", "seed", "run_dir")
    if not reader.fieldnames or not set(need) <= set(reader.fieldnames):
        raise ValueError(f"Expected `csv_text` to be a torchcal results.csv (columns "
                         f"{', '.join(need)}, ...), got columns {reader.fieldnames}")
    runs = []
    for row in reader:
        seed: Any = row["seed"]
        if seed.lstrip("-").isdigit():
            seed = int(seed)
        meta = {"dataset": row["dataset"], "model": row["model"], "loss": row["loss"],
                "loss_kwargs": json.loads(row["loss_kwargs"] or "{}"), "seed": seed,
                "predictor": row.get("predictor") or DEFAULT_PREDICTOR}
        if meta["seed"] == "":
            meta["seed"] = None
        if row.get("identity"):
            meta["identity"] = row["identity"]
        members = (row.get("members") or "").split()
        if members:
            if not all(m.lstrip("-").isdigit() for m in members):
                raise ValueError(f"Expected the `members` column to hold space-separated integer "
                                 f"seeds, got {row['members']!r:.60}")
            meta["members"] = [int(m) for m in members]
        problem = meta_problem(meta)
        if problem:
            raise ValueError(f"Expected `csv_text` rows of torchcal results, got a row with {problem}")
        flat = {}
        for k, v in row.items():
            if k in need or k in ("predictor", "members", "identity") or v in ("", None):
                continue
            try:
                flat[k] = float(v)
            except ValueError:
                continue
        runs.append(RunRecord(run_dir=Path(row["run_dir"]),
                              results_path=Path(row["run_dir"]) / results_filename(),
                              results={}, meta=meta, flat=flat))
    return runs


def check_checkpoints(runs: Iterable[RunRecord], allow_mixed: bool = False) -> None:
    """Refuse a table (one data set and model) whose runs were evaluated from different
    checkpoints (``last`` and ``best``), unless ``allow_mixed``.

    Raises:
        ResultsFileError: naming, per checkpoint, the runs of the mixed table.
    """
    if allow_mixed:
        return
    tables: dict[tuple[str, str], dict[str, list[str]]] = {}
    for r in runs:
        d, m = r.key[:2]
        tables.setdefault((d, m), {}).setdefault(r.checkpoint, []).append(str(r.results_path))
    for (d, m), by in tables.items():
        if len(by) > 1:
            detail = "; ".join(f"{c}: {', '.join(sorted(ps))}" for c, ps in sorted(by.items()))
            raise ResultsFileError(
                f"The runs of {d}/{m} were evaluated from different checkpoints ({detail}); "
                "report one checkpoint (--checkpoint) or pass --mix-checkpoints")


def _is_report_file(path: Path) -> bool:
    """Whether ``path`` starts like the ``results.json`` of a report or of ``uncertainty eval``
    (read as bytes: a file that is not UTF-8 is a bad run file, not a crash)."""
    if not path.is_file():  # a FIFO or a device: never opened (it could block or never end)
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(200)
    except OSError:
        return False
    return any(f'"schema": "torchcal.{kind}/'.encode() in head
               for kind in ("report", "uncertainty_results"))


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """NaN-ignoring mean, sample std (ddof=1, NaN below two values) and count.

    >>> mean_std([1.0, 2.0, 3.0, float("nan")])
    (2.0, 1.0, 3)
    """
    a = np.asarray(values, dtype=np.float64)
    a = a[~np.isnan(a)]
    n = int(a.size)
    if n == 0:
        return math.nan, math.nan, 0
    m = float(a.mean())
    s = float(a.std(ddof=1)) if n > 1 else math.nan
    return m, s, n


def loss_rank(loss: str) -> tuple[int, str]:
    """Sort key of a loss name: the registry's order (:data:`LOSS_ORDER`), unknown names last."""
    return (LOSS_ORDER.index(loss) if loss in LOSS_ORDER else len(LOSS_ORDER), loss)


def predictor_rank(predictor: str) -> tuple[int, str]:
    """Sort key of a predictor: :data:`~torchcal.results_file.PREDICTORS`' order, unknown ones last."""
    order = list(PREDICTORS)
    return (order.index(predictor) if predictor in order else len(order), predictor)


def _split_subsets(rs: list[RunRecord]) -> tuple[list[RunRecord], list[RunRecord]]:
    """``(records, subset records)``: a pooled record whose members are a proper subset of
    another record's members is a subset record (in seed-set order)."""
    sets = [frozenset(r.meta.get("members") or ()) for r in rs]
    sub = [bool(s) and any(s < t for t in sets) for s in sets]
    if not any(sub):
        return rs, []
    subsets = sorted((r for r, x in zip(rs, sub, strict=True) if x),
                     key=lambda r: tuple(sorted(r.meta.get("members") or ())))
    return [r for r, x in zip(rs, sub, strict=True) if not x], subsets


def group_runs(runs: Iterable[RunRecord]) -> list[Group]:
    """Group records by (dataset, model, loss, loss_kwargs, predictor, identity) and average
    every number over each group's records: a loss's seeds (``predictor`` ``"run"``) are one
    group, an ensemble of them another, never averaged together; runs of another identity
    (another learning rate, another number of epochs...) are a group of their own
    (:func:`_mark_variants`: labelled with the settings that differ, named by
    :func:`identity_notes`).

    An ensemble whose seeds are a proper subset of another ensemble's of the same group goes
    to :attr:`Group.subsets`, not among the group's records (:func:`_split_subsets`).

    Groups come sorted by dataset, model, then the canonical loss order (:data:`LOSS_ORDER`),
    then loss arguments, then predictor (seeds' runs first), a key's main group before the
    groups kept apart from it; runs within a group by seed.
    """
    buckets: dict[tuple[Any, ...], list[RunRecord]] = {}
    for r in runs:
        buckets.setdefault((*r.key, r.identity), []).append(r)
    groups = []
    for (ds, model, loss, kw, predictor, identity), rs in buckets.items():
        rs = sorted(rs, key=lambda r: (str(type(r.seed)), r.seed if r.seed is not None else 0,
                                       str(r.run_dir)))
        rs, subsets = _split_subsets(rs)
        g = Group(dataset=ds, model=model, loss=loss, loss_kwargs=json.loads(kw), runs=rs,
                  predictor=predictor, subsets=subsets, identity=identity)
        keys: dict[str, None] = {}
        for r in rs:
            keys.update(dict.fromkeys(r.flat))
        for k in keys:
            m, s, n = mean_std([r.flat.get(k, math.nan) for r in rs])
            g.mean[k], g.std[k], g.count[k] = m, s, n
        groups.append(g)
    _mark_variants(groups)
    groups.sort(key=lambda g: (g.dataset, g.model, loss_rank(g.loss),
                               json.dumps(g.loss_kwargs, sort_keys=True),
                               predictor_rank(g.predictor), g.apart_from is not None, g.variant))
    return groups


def _mark_variants(groups: list[Group]) -> None:
    """Of the groups sharing (dataset, model, loss, loss_kwargs, predictor) but not their
    identity, the main one (most runs; a recorded identity before none; then the first run
    directory) keeps its label; each other is marked kept apart from it, its
    :attr:`Group.variant` the settings that differ (``"lr=0.05"``), ``"identity unknown"``
    for records without one, ``"identity HASH"`` when the differing settings are unknown."""
    by_key: dict[tuple[Any, ...], list[Group]] = {}
    for g in groups:
        by_key.setdefault((g.dataset, g.model, g.loss, json.dumps(g.loss_kwargs, sort_keys=True),
                           g.predictor), []).append(g)
    for gs in by_key.values():
        if len(gs) < 2:
            continue
        gs.sort(key=lambda g: (-len(g.runs), g.identity is None,
                               min((str(r.run_dir) for r in g.runs), default="")))
        main = gs[0]
        for g in gs[1:]:
            g.apart_from = main
            diff = _differing(main, g)
            g.variant = (", ".join(f"{k}={_shown(g.identity_fields.get(k, _MISSING))}"
                                   for k in diff)
                         if diff else "identity unknown" if g.identity is None
                         else f"identity {g.identity}")
        variants = [g.variant for g in gs[1:]]
        for g in gs[1:]:  # two groups differing from the main one in the same shown way
            if variants.count(g.variant) > 1:
                g.variant += f" ({g.identity or 'no identity'})"


def _differing(a: Group, b: Group) -> list[str]:
    """The identity settings whose values differ between two groups (sorted; [] when either
    group's settings are unknown)."""
    fa, fb = a.identity_fields, b.identity_fields
    if not fa or not fb:
        return []
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, _MISSING) != fb.get(k, _MISSING))


_MISSING = object()


def _shown(v: Any) -> str:
    """A setting's value as a report shows it: compact JSON of a plain value (a number, a
    name, a short list or object of them), else ``…`` (a hand-edited file's text is never
    shown)."""
    if v is _MISSING:
        return "unset"
    if not _plain_value(v):
        return "…"
    return v if isinstance(v, str) else json.dumps(v, separators=(",", " "))


def identity_notes(groups: Sequence[Group], name: Callable[[Path], str] = str) -> list[str]:
    """One line per group kept apart from another of its loss for another identity, naming
    its runs and why, and one naming the groups of seeds that record no identity (results
    written before torchcal recorded it, with no ``config.json`` beside them):

        runs/b/seed0, runs/b/seed1 (lr 0.05) kept apart from the 2 runs of Focal (γ=3) at
        lr 0.1: identity differs in lr

    ``name``: a run directory's name in the notes (default its path)."""
    out, unknown = [], []
    for g in groups:
        runs = _named(g, name)
        if g.apart_from is not None:
            main = g.apart_from
            diff = _differing(main, g)
            n = len(main.runs)
            whose = f"the {n} run{'s' if n != 1 else ''} of {main.label}"
            if diff:
                out.append(f"{runs} ({_values(g, diff)}) kept apart from {whose} at "
                           f"{_values(main, diff)}: identity differs in {', '.join(diff)}")
            else:
                why = ("records no identity (results written before torchcal recorded one, no "
                       f"{CONFIG_FILE} beside them)" if g.identity is None else
                       f"has identity {g.identity}, they have {main.identity or 'none recorded'}")
                out.append(f"{runs} kept apart from {whose}: {why}")
        elif g.identity is None and g.predictor == DEFAULT_PREDICTOR:
            unknown.append(g)
    if unknown:
        n = sum(len(g.runs) for g in unknown)
        labels = ", ".join(g.label for g in unknown[:8]) + (", ..." if len(unknown) > 8 else "")
        out.append(f"{n} run{'s' if n != 1 else ''} ({labels}) record no identity (results "
                   f"written before torchcal recorded one, no {CONFIG_FILE} beside them): "
                   "counted as seeds of one configuration by their data set, model, loss and "
                   "its arguments only")
    return out


def _named(g: Group, name: Callable[[Path], str], most: int = 5) -> str:
    names = [name(r.run_dir) for r in g.runs]
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most
                                      else "")


def _values(g: Group, keys: Sequence[str]) -> str:
    """``"lr 0.05, momentum 0.9"``: the group's values of the settings ``keys``."""
    return ", ".join(f"{k} {_shown(g.identity_fields.get(k, _MISSING))}" for k in keys)
