"""The run directory: the one owner of its layout and of its file names.

A run directory (``torchcal train --out RUN_DIR``) holds::

    RUN_DIR/
      config.json              the TrainConfig, plus num_classes / input_shape / world_size
      log.jsonl                one JSON object per epoch (see LOG_KEYS below)
      checkpoints/last.pt      the last epoch's training state (+ last.pt.sha256)
      checkpoints/best.pt      the best epoch by the validation ``select_best_by`` metric
      logits/{val,test,ood_<name>}.npz      the last checkpoint's predictions
      results.json             their metrics (schema ``torchcal.results/1``)
      logits-best/, results-best.json       the same for ``torchcal eval --checkpoint best``
      tensorboard/             TensorBoard event files (``--tensorboard``)
      uncertainty/head.pt (+ head.pt.sha256), uncertainty/results.json, uncertainty/cache/
                               ``torchcal uncertainty fit / eval`` and their embedding cache

Every other module asks :class:`RunDir` (or the functions below) for these paths, so that the
layout is written down here once.  The epoch log's γ history of a stateful loss is the
``loss_state`` object of each log line (:data:`LOSS_STATE_KEY`, e.g. AdaFocal's per-bin
``gammas`` and ``bin_edges``); :func:`read_log` reads it back.

>>> rdir = RunDir("runs/a")
>>> rdir.results("best").as_posix(), rdir.logits("test").as_posix(), rdir.checkpoint().as_posix()
('runs/a/results-best.json', 'runs/a/logits/test.npz', 'runs/a/checkpoints/last.pt')
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._io import (
    LOCK_NAME,
    TEMP_RE,
    append_text,
    atomic_write_json,
    atomic_write_text,
    fsync_file,
    parse_json,
    read_bytes_bounded,
    read_json,
    to_jsonable,
)

__all__ = [
    "RunDir",
    "CHECKPOINTS",
    "CONFIG_FILE",
    "LOG_FILE",
    "CHECKPOINT_DIR",
    "TENSORBOARD_DIR",
    "UNCERTAINTY_DIR",
    "LOSS_STATE_KEY",
    "REPORT_RESULTS_FILE",
    "results_filename",
    "logits_dirname",
    "checkpoint_of_results_file",
    "read_log",
    "logits_filename",
    "OWN_NAMES",
]

#: The checkpoints a run can be evaluated from: the last epoch's (what the papers report, and
#: what ``torchcal train`` evaluates) and the best by the validation metric.
CHECKPOINTS = ("last", "best")
#: The run's configuration: the TrainConfig plus num_classes, input_shape and world_size.
CONFIG_FILE = "config.json"
#: The epoch log: one JSON object per line and epoch.
LOG_FILE = "log.jsonl"
#: Largest ``log.jsonl`` torchcal reads back (a 350-epoch AdaFocal log is under 1 MB).
MAX_LOG_BYTES = 256 << 20
#: The folder of ``last.pt`` and ``best.pt`` (each with a ``.sha256`` beside it).
CHECKPOINT_DIR = "checkpoints"
#: The folder of the TensorBoard event files (``torchcal train --tensorboard``).
TENSORBOARD_DIR = "tensorboard"
#: The folder of ``torchcal uncertainty``'s head, results and embedding cache.
UNCERTAINTY_DIR = "uncertainty"
_RESULTS_FILE = "results.json"
_LOGITS_DIR = "logits"
_CHECKPOINT_SUFFIX = ".pt"
_HEAD_FILE = "head.pt"
#: The file name of a report's own machine-readable results (``torchcal report --out``).
REPORT_RESULTS_FILE = _RESULTS_FILE
#: The key of a log line holding the loss's inspectable state (γ history of AdaFocal & co.).
LOSS_STATE_KEY = "loss_state"
_OOD_PREFIX = "ood_"
_CACHE_NAMES = ("manifest.json", "manifest.json.sha256", "*.npy")
#: torchcal's own file names in a run directory, by folder (relative, ``""`` the run directory
#: itself): what clearing a stale or broken run removes (:meth:`RunDir.clear`).  Anything else
#: (a user's notes, an analysis folder, any symbolic link: torchcal never writes one) stays.
OWN_NAMES: dict[str, tuple[str, ...]] = {
    "": ("config.json", "log.jsonl", "results.json", "results-best.json", "results*.json.sha256"),
    "checkpoints": ("last.pt", "best.pt", "last.pt.sha256", "best.pt.sha256"),
    "logits": ("*.npz", "*.npz.sha256"),
    "logits-best": ("*.npz", "*.npz.sha256"),
    "tensorboard": ("events.out.tfevents.*",),
    "uncertainty": ("head.pt", "head.pt.sha256", "results.json", "results.json.sha256"),
    "uncertainty/cache": _CACHE_NAMES,
}


def _check_checkpoint(checkpoint: str) -> str:
    if checkpoint not in CHECKPOINTS:
        raise ValueError(f"Expected `checkpoint` to be one of {', '.join(CHECKPOINTS)}, got "
                         f"{checkpoint!r}")
    return checkpoint


def results_filename(checkpoint: str = "last") -> str:
    """The results file of a checkpoint's evaluation: ``results.json`` for the last epoch's,
    ``results-<checkpoint>.json`` for another, so that evaluating ``best`` never replaces the
    last epoch's results.

    >>> results_filename(), results_filename("best")
    ('results.json', 'results-best.json')
    """
    if _check_checkpoint(checkpoint) == "last":
        return _RESULTS_FILE
    stem, suffix = os.path.splitext(_RESULTS_FILE)
    return f"{stem}-{checkpoint}{suffix}"


def logits_dirname(checkpoint: str = "last") -> str:
    """The logits directory of a checkpoint's evaluation (``logits``, ``logits-best``).

    >>> logits_dirname(), logits_dirname("best")
    ('logits', 'logits-best')
    """
    return _LOGITS_DIR if _check_checkpoint(checkpoint) == "last" else f"{_LOGITS_DIR}-{checkpoint}"


def checkpoint_of_results_file(path: str | os.PathLike) -> str:
    """The checkpoint a results file's name stands for (``results-best.json`` -> ``"best"``;
    ``results.json`` and any other name -> ``"last"``).

    >>> checkpoint_of_results_file("runs/a/results-best.json")
    'best'
    """
    name = Path(path).name
    for c in CHECKPOINTS:
        if name == results_filename(c):
            return c
    return "last"


def logits_filename(split: str) -> str:
    """The file of a split's saved logits in a logits directory (``val``, ``test`` or
    ``ood_<name>`` for an OOD set).

    >>> logits_filename("test"), logits_filename("ood_svhn")
    ('test.npz', 'ood_svhn.npz')
    """
    return f"{split}.npz"


class RunDir:
    """The paths of one run directory (nothing is created until something is written).

    Args:
        path: the run directory (``--out`` of ``torchcal train``).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # --- paths ---------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        """``config.json``."""
        return self.path / CONFIG_FILE

    @property
    def log(self) -> Path:
        """``log.jsonl``: one JSON object per epoch."""
        return self.path / LOG_FILE

    @property
    def checkpoint_dir(self) -> Path:
        """``checkpoints/``."""
        return self.path / CHECKPOINT_DIR

    def checkpoint(self, which: str = "last") -> Path:
        """``checkpoints/<which>.pt`` (``which`` is ``"last"`` or ``"best"``)."""
        return self.checkpoint_dir / f"{_check_checkpoint(which)}{_CHECKPOINT_SUFFIX}"

    def results(self, checkpoint: str = "last") -> Path:
        """``results.json`` (``results-best.json`` for the best checkpoint)."""
        return self.path / results_filename(checkpoint)

    def logits_dir(self, checkpoint: str = "last") -> Path:
        """``logits/`` (``logits-best/`` for the best checkpoint)."""
        return self.path / logits_dirname(checkpoint)

    def logits(self, split: str, checkpoint: str = "last") -> Path:
        """``logits/<split>.npz``: ``split`` is ``val``, ``test`` or ``ood_<name>``."""
        return self.logits_dir(checkpoint) / logits_filename(split)

    def ood_logits(self, checkpoint: str = "last") -> dict[str, Path]:
        """The saved OOD logits files, by OOD set name (sorted)."""
        d = self.logits_dir(checkpoint)
        return {p.stem[len(_OOD_PREFIX):]: p for p in sorted(d.glob(f"{_OOD_PREFIX}*.npz"))}

    @property
    def tensorboard(self) -> Path:
        """``tensorboard/``: the event files of ``--tensorboard``."""
        return self.path / TENSORBOARD_DIR

    @property
    def uncertainty_head(self) -> Path:
        """``uncertainty/head.pt``: the default output of ``torchcal uncertainty fit``."""
        return self.path / UNCERTAINTY_DIR / _HEAD_FILE

    @property
    def uncertainty_cache(self) -> Path:
        """``uncertainty/cache/``: the default embedding cache of ``torchcal uncertainty``."""
        return self.path / UNCERTAINTY_DIR / "cache"

    @property
    def uncertainty_results(self) -> Path:
        """``uncertainty/results.json``: the default output of ``torchcal uncertainty eval``."""
        return self.path / UNCERTAINTY_DIR / _RESULTS_FILE

    # --- state -----------------------------------------------------------------------------
    def has_checkpoint(self, which: str = "last") -> bool:
        """Whether ``checkpoints/<which>.pt`` exists."""
        return self.checkpoint(which).is_file()

    def looks_like_run(self) -> bool:
        """Whether the directory holds a training run (a config or a checkpoints folder)."""
        return self.config.is_file() or self.checkpoint_dir.is_dir()

    def stale_temp_patterns(self) -> list[tuple[Path, tuple[str, ...]]]:
        """(directory, file patterns) whose temporary files a killed run may have left."""
        return [(self.path, (CONFIG_FILE, _RESULTS_FILE, results_filename("best"), LOG_FILE,
                             "results*.json.sha256")),
                (self.checkpoint_dir, (f"*{_CHECKPOINT_SUFFIX}", f"*{_CHECKPOINT_SUFFIX}.sha256")),
                (self.logits_dir(), ("*.npz", "*.npz.sha256")),
                (self.logits_dir("best"), ("*.npz", "*.npz.sha256"))]

    def clear(self) -> list[Path]:
        """Remove the files torchcal wrote here (:data:`OWN_NAMES`, and the temporary files of
        its atomic writes to them), keeping the lock file of the directory's owner; folders
        left empty go.  Nothing is followed: a symbolic link stays, as does every file or
        folder of another name (a user's).

        Returns:
            The paths kept (a kept folder counts once, its content is not listed).
        """
        kept: list[Path] = []
        _clear(self.path, "", kept)
        return sorted(kept)

    # --- config.json and log.jsonl -------------------------------------------------------
    def read_config(self) -> dict[str, Any]:
        """``config.json`` as a dict (``FileNotFoundError`` / ``ValueError`` when missing / bad)."""
        d = read_json(self.config, what="Config file")  # bounded (torchcal._io.read_json)
        if not isinstance(d, dict):
            raise ValueError(f"{str(self.config)!r} is not a JSON object")
        return d

    def write_config(self, config: Mapping[str, Any]) -> Path:
        """Write ``config.json`` atomically (non-finite floats as ``null``)."""
        return atomic_write_json(self.config, dict(config))

    def append_log(self, record: Mapping[str, Any], *, fsync: bool = True) -> None:
        """Append one epoch's record to ``log.jsonl`` (flushed; fsynced unless ``fsync=False``,
        for a writer that fsyncs the log with its next checkpoint, :meth:`sync_log`)."""
        append_text(self.log, json.dumps(to_jsonable(dict(record)), allow_nan=False) + "\n",
                    fsync=fsync)

    def sync_log(self) -> None:
        """Make the log's appended lines durable (fsync)."""
        fsync_file(self.log)

    def read_log(self) -> list[dict[str, Any]]:
        """The epoch records of ``log.jsonl`` (``[]`` without a log; a torn last line is skipped)."""
        return read_log(self.log)

    def truncate_log(self, keep_epochs: int) -> None:
        """Keep the log lines of epochs ``<= keep_epochs`` (a resumed run rewrites the rest)."""
        if not self.log.exists():
            return
        kept = [line for line, rec in _log_lines(self.log) if int(rec.get("epoch", 0)) <= keep_epochs]
        atomic_write_text(self.log, "".join(line + "\n" for line in kept))


def _own_name(rel: str, name: str) -> bool:
    """Whether ``name`` in the run folder ``rel`` is a file torchcal writes (or the temporary
    file of one of its atomic writes)."""
    patterns = OWN_NAMES.get(rel, _CACHE_NAMES if rel.startswith("uncertainty/") else ())
    m = TEMP_RE.match(name)
    base = m["name"] if m else name
    return any(fnmatch.fnmatchcase(base, pat) for pat in patterns)


def _own_dir(rel: str) -> bool:
    """Whether the folder ``rel`` of a run directory is one torchcal makes (its caches' temporary
    folders ``uncertainty/.cache.tmp-*`` included)."""
    head, _, name = rel.rpartition("/")
    return rel in OWN_NAMES or (head.startswith("uncertainty") and ".tmp-" in name) or (
        head == "uncertainty/cache")


def _clear(directory: Path, rel: str, kept: list[Path]) -> None:
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        p = Path(entry.path)
        sub = f"{rel}/{entry.name}" if rel else entry.name
        if sub == LOCK_NAME:
            continue
        if entry.is_symlink():
            kept.append(p)
        elif entry.is_dir(follow_symlinks=False):
            if not _own_dir(sub):
                kept.append(p)
                continue
            _clear(p, sub, kept)
            try:
                p.rmdir()
            except OSError:  # a kept file inside
                pass
        elif entry.is_file(follow_symlinks=False) and _own_name(rel, entry.name):
            p.unlink(missing_ok=True)
        else:
            kept.append(p)


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON objects of a ``log.jsonl`` file, in order (``[]`` when it does not exist).

    A line that is not a JSON object (the torn last line of a killed run) is skipped.
    """
    return [rec for _, rec in _log_lines(Path(path))]


def _log_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The (line, parsed object) pairs of a JSON-lines file; lines that are no object skipped."""
    try:  # bounded: a regular file of at most MAX_LOG_BYTES; each line a bounded JSON value
        lines = read_bytes_bounded(path, max_bytes=MAX_LOG_BYTES, what="Log file",
                                   error=ValueError).decode("utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            rec = parse_json(line, what="Log line of", path=path)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append((line, rec))
    return out
