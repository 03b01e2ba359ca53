"""The data set and OOD set tables: a data set is a loader, its declared options and its
default OOD sets, registered by name as losses, models and recipes are.

:func:`torchcal.data.load_splits` and :func:`torchcal.data.load_ood` look the name up here,
check the keywords against the declared :class:`DataOption` s (an unknown keyword, or a value
outside an option's constraints, is a ``ValueError`` naming the option) and call the loader.
Training (:func:`torchcal.train.build.load_ood_sets`) evaluates a data set's
:attr:`DataSet.default_ood`, each with the options it declares (:class:`OodDefault`).  Adding a
data set is its loader and one :func:`register_dataset` call::

    register_dataset(DataSet("toy", load=load_toy, options=(DataOption("n", "samples", int, 1),),
                             summary="a toy set"))

after which ``load_splits("toy", n=100)``, ``TrainConfig(dataset="toy", data_kwargs={"n": 100})``
and every command that trains a TrainConfig use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._registry import Registry
from .._validation import check_scalar

__all__ = ["DataOption", "DataSet", "OodSet", "OodDefault", "DATASETS", "OOD_SETS",
           "register_dataset", "register_ood_set", "check_options"]


@dataclass(frozen=True)
class DataOption:
    """A keyword a data set accepts, with its constraints.

    Attributes:
        name: the keyword.
        doc: what it does, for help texts.
        type: ``int`` or ``float`` (checked with bounds), ``bool``, ``str``, or None (any value;
            the loader checks it).
        min_val, max_val: bounds of a number (None: unbounded).
        choices: the allowed values (None: any).
    """

    name: str
    doc: str = ""
    type: type | None = None
    min_val: float | None = None
    max_val: float | None = None
    choices: tuple[Any, ...] | None = None

    def check(self, value: Any) -> Any:
        """``value`` checked against the constraints (``ValueError`` naming the option).

        >>> DataOption("noise_std", type=float, min_val=0.0).check(-1.0)
        Traceback (most recent call last):
        ...
        ValueError: Expected `noise_std` to be a finite non-negative number, got -1.0
        """
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"Expected `{self.name}` to be one of "
                             f"{', '.join(map(repr, self.choices))}, got {value!r}")
        if self.type in (int, float):
            return check_scalar(value, self.name, self.type, min_val=self.min_val,
                                max_val=self.max_val)
        if self.type in (bool, str) and not isinstance(value, self.type):
            what = "true or false" if self.type is bool else "a string"
            raise ValueError(f"Expected `{self.name}` to be {what}, got {value!r}")
        return value


def check_options(kind: str, name: str, options: Sequence[DataOption],
                  kw: Mapping[str, Any]) -> dict[str, Any]:
    """``kw`` checked against the declared ``options`` of the ``kind`` ("data set", "OOD set")
    ``name``: an undeclared keyword or a value outside an option's constraints raises
    ``ValueError`` naming it.

    >>> check_options("data set", "toy", [DataOption("n", type=int, min_val=1)], {"m": 1})
    Traceback (most recent call last):
    ...
    ValueError: Unexpected keyword(s) for data set 'toy': m; accepted: n
    """
    allowed = [o.name for o in options]
    extra = sorted(set(kw) - set(allowed))
    if extra:
        raise ValueError(f"Unexpected keyword(s) for {kind} {name!r}: {', '.join(extra)}; "
                         f"accepted: {', '.join(allowed) or 'none'}")
    by_name = {o.name: o for o in options}
    return {k: by_name[k].check(v) for k, v in kw.items()}


@dataclass(frozen=True)
class OodDefault:
    """An OOD set a data set is evaluated on by default.

    Attributes:
        name: the OOD set (:data:`OOD_SETS`).
        kwargs: its fixed options (CIFAR-10-C: ``corruption``, ``severity``).
        seeded: it gets the run's data seed (else its own default seed).
        shared: options of the data set passed on to it (digits: ``noise_std``).
    """

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    seeded: bool = False
    shared: tuple[str, ...] = ()

    def options(self, seed: int, data_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The keywords of :func:`torchcal.data.load_ood` for a run of ``seed`` and
        ``data_kwargs`` (before the run's own ``ood_kwargs``)."""
        kw: dict[str, Any] = {"seed": seed} if self.seeded else {}
        kw.update({k: v for k, v in data_kwargs.items() if k in self.shared})
        kw.update(self.kwargs)
        return kw


@dataclass(frozen=True)
class DataSet:
    """A registered data set.

    Attributes:
        name: registry name (``TrainConfig.dataset``, :func:`~torchcal.data.load_splits`).
        load: ``load(root, *, download, seed, val_fraction, **options) -> DataSplits``
            (``root``: the data root, already resolved; unused by generated sets).
        options: the keywords it accepts, with their constraints.
        default_ood: the OOD sets a run on it is evaluated on.
        summary: one line for listings and help texts.
    """

    name: str
    load: Callable[..., Any]
    options: tuple[DataOption, ...] = ()
    default_ood: tuple[OodDefault, ...] = ()
    summary: str = ""

    def check(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        """``kw`` checked against the declared options (:func:`check_options`)."""
        return check_options("data set", self.name, self.options, kw)


@dataclass(frozen=True)
class OodSet:
    """A registered OOD set: ``load(root, *, download, seed, **options) -> ArrayDataset``."""

    name: str
    load: Callable[..., Any]
    options: tuple[DataOption, ...] = ()
    summary: str = ""

    def check(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        """``kw`` checked against the declared options (:func:`check_options`)."""
        return check_options("OOD set", self.name, self.options, kw)


#: The data set table (``torchcal data list``, ``TrainConfig.dataset``); torchcal's own sets
#: are registered by :mod:`torchcal.data.builtin`, imported with :mod:`torchcal.data`.
DATASETS: Registry[DataSet] = Registry("data set")
#: The OOD set table.
OOD_SETS: Registry[OodSet] = Registry("OOD set")


def register_dataset(dataset: DataSet) -> DataSet:
    """Add ``dataset`` to :data:`DATASETS` under its name; returns it."""
    return DATASETS.register(dataset.name, dataset)


def register_ood_set(ood: OodSet) -> OodSet:
    """Add ``ood`` to :data:`OOD_SETS` under its name; returns it."""
    return OOD_SETS.register(ood.name, ood)
