"""Experiment tracking: a run's per-epoch record mirrored to TensorBoard.

``log.jsonl`` stays the record of a run (the report, resume and the tests read it);
:class:`TensorBoardLogger` only mirrors each epoch's line into TensorBoard event files through
``torch.utils.tensorboard``, so that a user can watch a run with ``tensorboard --logdir RUN``.

Tags: a log key ``<split>_<metric>`` (``train``, ``val``, ``test``) becomes ``<split>/<metric>``
(``val_ece`` -> ``val/ece``); the learning rate is ``lr``; the loss' inspectable state (the log's
``loss_state``) becomes ``loss_state/gamma`` for a scalar γ and ``loss_state/gamma_bin_<b>`` (two
digits) for AdaFocal's per-bin γ, so that TensorBoard draws the γ-per-bin history as one group;
every other numeric key keeps its name.  Non-numeric and missing (``None``) values are skipped;
NaN and ±Inf are written as they are (TensorBoard shows them).  The step is the record's
``epoch`` (1-based, as in ``log.jsonl``).

On ``--resume`` the logger is opened with ``purge_step`` = the first epoch trained again, so that
TensorBoard drops the events of epochs the killed run logged after its last checkpoint, as the
trainer drops those lines of ``log.jsonl``.

``tensorboard`` is an optional dependency (``pip install "torchcal[tensorboard]"``); it is
imported when a logger is created, and its absence is a one-line error naming the extra.

>>> scalars = tensorboard_scalars({"epoch": 3, "lr": 0.1, "val_ece": 0.02, "test_nll": None,
...                                "loss_state": {"gammas": [1.0, 2.5]}})
>>> scalars
{'lr': 0.1, 'val/ece': 0.02, 'loss_state/gamma_bin_00': 1.0, 'loss_state/gamma_bin_01': 2.5}
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from .._validation import check_scalar
from ..errors import TorchcalError

__all__ = [ "TensorBoardLogger", "tensorboard_scalars", "tensorboard_available"]


_SPLITS = ("train", "val", "test")
#: keys of a log line that are not scalars to plot
_SKIP = frozenset({"epoch"})
#: the log's loss-state key (``runs.LOSS_STATE_KEY``)
_LOSS_STATE = "loss_state"


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _tag(key: str) -> str:
    split, sep, metric = key.partition("_")
    return f"{split}/{metric}" if sep and split in _SPLITS and metric else key


def tensorboard_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars (tag -> value) of one ``log.jsonl`` line, in the record's order
    (see the module docstring for the tags)."""
    out: dict[str, float] = {}
    for key, v in record.items():
        if key in _SKIP:
            continue
        if key == _LOSS_STATE and isinstance(v, dict):
            for name, s in v.items():
                if name == "bin_edges":  # the edges move with the data; γ is what is tracked
                    continue
                label = "gamma" if name in ("gammas", "gamma") else name
                if _is_number(s):
                    out[f"{_LOSS_STATE}/{label}"] = float(s)
                elif isinstance(s, (list, tuple)):
                    width = max(2, len(str(len(s) - 1)))
                    for b, g in enumerate(s):
                        if _is_number(g):
                            out[f"{_LOSS_STATE}/{label}_bin_{b:0{width}d}"] = float(g)
        elif _is_number(v):
            out[_tag(key)] = float(v)
    return out


def tensorboard_available() -> bool:
    """Whether ``torch.utils.tensorboard`` can be used (the ``tensorboard`` package is
    installed)."""
    try:
        import tensorboard  # noqa: F401  (optional dependency: only probed)
    except ImportError:
        return False
    return True


class TensorBoardLogger:
    """Mirror a run's per-epoch ``log.jsonl`` lines into TensorBoard event files.

    Args:
        log_dir: directory of the event files (the harness uses ``RUN/tensorboard``).
        purge_step: on resume, the first epoch trained again; events at or after it written by
            an earlier process are dropped (``SummaryWriter(purge_step=...)``).

    Raises:
        TorchcalError: ``tensorboard`` is not installed.
    """

    def __init__(self, log_dir: str | os.PathLike, purge_step: int | None = None) -> None:
        if not tensorboard_available():
            raise TorchcalError("--tensorboard needs the `tensorboard` package: pip install "
                              "\"torchcal[tensorboard]\" (or pip install tensorboard)")
        # optional dependency, imported only when tracking is asked for
        from torch.utils.tensorboard import SummaryWriter

        check_scalar(purge_step, "purge_step", int, min_val=0, allow_none=True)
        self.log_dir = os.fspath(log_dir)
        self._writer = SummaryWriter(log_dir=self.log_dir, purge_step=purge_step)

    def log_epoch(self, record: dict[str, Any]) -> None:
        """Write the scalars of one ``log.jsonl`` line at step ``record["epoch"]``."""
        step = record.get("epoch")
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"Expected the record's `epoch` to be an integer, got {step!r}")
        for tag, v in tensorboard_scalars(record).items():
            self._writer.add_scalar(tag, v, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
