"""One generic registry with metadata, behind the loss, model and recipe tables.

Every table of named things (``torchcal.losses``, ``torchcal.models``, the training recipes) is
a :class:`Registry`: names are non-empty lower-case strings, registering the same object twice
is a no-op and another object under a taken name is an error, lookups of unknown names raise
the registry's error naming the close valid names ("did you mean"), else listing them all.
Each entry carries metadata that reports and command lines read instead of keeping their own
copies:

* ``display``: the human name in tables and figures (default: the registered name);
* ``order``: the canonical position in tables (entries without one come after, by name);
* ``paper``: where the method comes from, as the report cites it (free text, e.g.
  "Mukhoti et al. 2020, *Calibrating Deep Neural Networks using Focal Loss* (NeurIPS)").
* ``tags``: free-form labels that select entries (e.g. the losses a benchmark trains:
  :meth:`Registry.tagged`).

>>> reg = Registry("widget")
>>> @reg.register("b", display="Bee", order=2)
... def make_b(): return "b"
>>> _ = reg.register("a", lambda: "a", display="Ay", order=1)
>>> reg.names(), reg.ordered(), reg.display("b"), reg.get("a")()
(['a', 'b'], ['a', 'b'], 'Bee', 'a')
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "Entry", "unknown_name"]

T = TypeVar("T")


def unknown_name(kind: str, name: Any, valid: Iterable[str]) -> str:
    """The message for an unknown ``name``: "did you mean" the close valid names (difflib) when
    there are some, else every valid name.

    >>> unknown_name("loss", "focall", ["ce", "focal", "flsd53"])
    "Unknown loss 'focall'; did you mean 'focal'?"
    >>> unknown_name("loss", "xyz", ["focal", "ce"])
    "Unknown loss 'xyz'; expected one of: ce, focal"
    """
    valid = sorted(valid)
    close = difflib.get_close_matches(str(name), valid, n=3, cutoff=0.6)
    if close:
        return f"Unknown {kind} {name!r}; did you mean {' or '.join(map(repr, close))}?"
    return f"Unknown {kind} {name!r}; expected one of: {', '.join(valid)}"


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered object and its metadata."""

    name: str
    obj: T
    display: str
    order: float | None = None
    paper: str | None = None
    tags: frozenset[str] = frozenset()


class Registry(Generic[T]):
    """A table of named objects with metadata.

    Args:
        kind: what the entries are, for messages ("loss", "model", "recipe").
        error: the exception class of an unknown name (default ``ValueError``).
        loader: called before every lookup, e.g. to import the modules that register the
            built-in entries.
        modules: the modules that register the built-in entries, imported in this order before
            every lookup (on the first one, not when the table is made: a process that never
            looks anything up never imports them); a lookup made while they are being imported
            (a module registering its entries) imports nothing.
    """

    def __init__(self, kind: str, *, error: type[Exception] = ValueError,
                 loader: Callable[[], None] | None = None, modules: Sequence[str] = ()) -> None:
        self.kind = kind
        self.error = error
        self._loader = loader
        self._modules = tuple(modules)
        self._importing = False
        self._entries: dict[str, Entry[T]] = {}

    def _load(self) -> None:
        if self._modules and not self._importing:
            self._importing = True
            try:
                for name in self._modules:
                    import_module(name)
            finally:
                self._importing = False
        if self._loader is not None:
            self._loader()

    @contextlib.contextmanager
    def without_loading(self) -> Iterator[Registry[T]]:
        """Within it, a lookup imports none of ``modules`` (a registration that reads the table,
        made while those modules may be importing)."""
        was, self._importing = self._importing, True
        try:
            yield self
        finally:
            self._importing = was

    def register(self, name: str, obj: T | None = None, *, display: str | None = None,
                 order: float | None = None, paper: str | None = None,
                 tags: Iterable[str] = ()) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, a decorator that does."""
        if not isinstance(name, str) or not name or name != name.lower():
            raise ValueError(f"Expected `name` to be a non-empty lower-case string, got {name!r}")
        if display is not None and (not isinstance(display, str) or not display):
            raise ValueError(f"Expected `display` to be a non-empty string, got {display!r}")
        if isinstance(tags, str) or not all(isinstance(t, str) and t for t in tags):
            raise ValueError(f"Expected `tags` to be an iterable of non-empty strings, got {tags!r}")
        tag_set = frozenset(tags)

        def add(o: T) -> T:
            old = self._entries.get(name)
            if old is not None:
                if old.obj is not o:
                    raise ValueError(f"{self.kind.capitalize()} {name!r} is already registered")
                return o  # the same object again (a module imported twice): a no-op
            self._entries[name] = Entry(name, o, display or name, order, paper, tag_set)
            return o

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a no-op when it is not registered); for tests and plug-ins."""
        self._entries.pop(name, None)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def names(self, pattern: str | None = None) -> list[str]:
        """Sorted names, optionally filtered by a shell-style ``pattern`` (case-sensitive)."""
        self._load()
        names = sorted(self._entries)
        if pattern is not None:
            names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        return names

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name`` (the registry's error, :func:`unknown_name`, if unknown)."""
        self._load()
        if name not in self._entries:
            raise self.error(unknown_name(self.kind, name, self._entries))
        return self._entries[name]

    def get(self, name: str) -> T:
        """The object registered as ``name``."""
        return self.entry(name).obj

    def display(self, name: str) -> str:
        """The display name of ``name`` (``name`` itself when it is not registered)."""
        self._load()
        e = self._entries.get(name)
        return e.display if e is not None else name

    def paper(self, name: str) -> str | None:
        """The ``paper`` of ``name`` (the registry's error, listing the valid names, if unknown)."""
        return self.entry(name).paper

    def rank(self, name: str) -> tuple[float, str]:
        """Sort key of the canonical order: ``order``, then name; unordered/unknown names last."""
        self._load()
        e = self._entries.get(name)
        return (e.order if e is not None and e.order is not None else float("inf"), name)

    def ordered(self) -> list[str]:
        """Every name in the canonical order."""
        return sorted(self.names(), key=self.rank)

    def tagged(self, tag: str) -> list[str]:
        """The names whose entry carries ``tag``, in the canonical order.

        >>> reg = Registry("widget")
        >>> _ = reg.register("b", object(), order=1, tags={"demo"})
        >>> _ = reg.register("a", object(), order=2, tags=("demo", "extra"))
        >>> _ = reg.register("c", object())
        >>> reg.tagged("demo"), reg.tagged("extra"), reg.tagged("none")
        (['b', 'a'], ['a'], [])
        """
        return [n for n in self.ordered() if tag in self._entries[n].tags]
