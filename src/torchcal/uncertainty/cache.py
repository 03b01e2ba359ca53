"""An on-disk cache of a frozen backbone's embeddings, logits and labels.

Training an uncertainty head on a frozen backbone only needs the backbone's outputs, so the
backbone runs once (optionally for several augmented passes) and the head trains from the cache:
the paper reports about 180x faster head training this way.

Layout of a cache directory::

    PATH/manifest.json     schema, shapes, dtypes, sha256 per array, backbone and data identity
    PATH/manifest.json.sha256   the manifest's own SHA-256 (:func:`torchcal._io.write_verified`)
    PATH/embeddings.npy    float32 (R, D)   R = n_samples * n_passes, rows pass-major
    PATH/logits.npy        float32 (R, C)
    PATH/labels.npy        int64   (R,)

The arrays are plain ``.npy`` files opened memory-mapped (``np.load(mmap_mode="r")``), so a cache
larger than memory can be read in batches.  A cache is built in a temporary sibling directory
and moved into place with ``os.replace`` only when complete, so a crash never leaves a
half-written cache under ``PATH``.  Opening verifies shapes, dtypes and (by default) checksums;
a truncated or modified file raises :class:`CacheError`.  The manifest records the identity of
the backbone (class name + sha256 of its ``state_dict``) and of the data, so a cache built from
other weights or other data is recognised as stale (:class:`StaleCacheError`, or rebuilt).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .._io import (
    check_sha256,
    fsync_dir,
    read_json,
    sha256_file,
    staged_temp_dir,
    write_verified,
)
from .._validation import check_positive_int, with_settings
from ..errors import CacheError, StaleCacheError

__all__ = [
    "CacheError",
    "StaleCacheError",
    "EmbeddingCache",
    "CacheOptions",
    "model_identity",
    "data_identity",
    "CACHE_SCHEMA",
]

CACHE_SCHEMA = "torchcal.embedding_cache/1"
_ARRAYS = {"embeddings": np.float32, "logits": np.float32, "labels": np.int64}


# ------------------------------------------------------------------------------------------
# identities
# ------------------------------------------------------------------------------------------
def _hash_tensor(h: Any, t: torch.Tensor) -> None:
    t = t.detach().to("cpu").contiguous().reshape(-1)
    h.update(f"{t.dtype}|{t.numel()}|".encode())
    if t.numel():
        h.update((t if t.dtype == torch.uint8 else t.view(torch.uint8)).numpy())  # no copy


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def model_identity(model: nn.Module) -> dict[str, str]:
    """``{"class": "pkg.Module", "state_sha256": hex}`` of a module's class and ``state_dict``
    (names, dtypes, shapes and bytes of every parameter and buffer).

    Example:
        >>> m = nn.Linear(2, 1)
        >>> with torch.no_grad():
        ...     _ = m.weight.fill_(1.0), m.bias.fill_(0.0)
        >>> ident = model_identity(m)
        >>> ident["class"], len(ident["state_sha256"])
        ('torch.nn.modules.linear.Linear', 64)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected `model` to be a torch.nn.Module, got {type(model).__name__}")
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode() + b"|" + str(tuple(t.shape)).encode() + b"|")
        _hash_tensor(h, t)
    return {"class": _class_name(model), "state_sha256": h.hexdigest()}


def _is_array_dataset(data: Any) -> bool:
    return isinstance(getattr(data, "data", None), torch.Tensor) and isinstance(
        getattr(data, "labels", None), torch.Tensor
    )


def data_identity(data: Any, data_id: Any = None) -> dict[str, Any]:
    """Identity of a data source: class, length and, for in-memory tensors (an ``ArrayDataset``
    or an ``(x, y)`` pair), the sha256 of the inputs and labels.  For other datasets (read lazily
    from disk) pass ``data_id`` (any JSON-serialisable value naming the data) to make stale
    detection reliable.
    """
    ident: dict[str, Any] = {"class": _class_name(data)}
    tensors: tuple[torch.Tensor, torch.Tensor] | None = None
    if _is_array_dataset(data):
        tensors = (data.data, data.labels)
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        tensors = (torch.as_tensor(data[0]), torch.as_tensor(data[1]))
    if tensors is not None:
        h = hashlib.sha256()
        for t in tensors:
            h.update(str(tuple(t.shape)).encode())
            _hash_tensor(h, t)
        ident["n"] = int(tensors[1].shape[0])
        ident["sha256"] = h.hexdigest()
    else:
        try:
            ident["n"] = len(data.dataset) if isinstance(data, torch.utils.data.DataLoader) else len(data)
        except TypeError:
            ident["n"] = None
    if data_id is not None:
        ident["data_id"] = json.loads(json.dumps(data_id, default=str))
    return ident


def _callable_name(fn: Callable | None) -> str | None:
    if fn is None:
        return None
    f = getattr(fn, "func", fn)  # functools.partial
    name = getattr(f, "__qualname__", None) or type(f).__qualname__
    return f"{getattr(f, '__module__', '?')}.{name}"


# ------------------------------------------------------------------------------------------
# file helpers
# ------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------
# data iteration
# ------------------------------------------------------------------------------------------
def _batches_of(data: Any, batch_size: int) -> tuple[int, Callable[[], Iterator[tuple[Any, Any]]]]:
    """(n, factory of an iterator of (x, y) batches in order) for the supported data sources."""
    if _is_array_dataset(data) or (isinstance(data, (tuple, list)) and len(data) == 2):
        if _is_array_dataset(data):
            x_all, y_all = data.data, data.labels
        else:
            x_all, y_all = data
            x_all = torch.as_tensor(x_all) if isinstance(x_all, np.ndarray) else x_all
            y_all = torch.as_tensor(y_all) if isinstance(y_all, np.ndarray) else y_all
            if not isinstance(x_all, torch.Tensor) or not isinstance(y_all, torch.Tensor):
                raise TypeError("Expected `data` as (inputs, labels) to hold tensors or arrays")
        if y_all.ndim != 1 or x_all.shape[0] != y_all.shape[0]:
            raise ValueError(
                f"Expected `data` labels of shape (N,) matching the inputs' first dimension, got "
                f"inputs {tuple(x_all.shape)} and labels {tuple(y_all.shape)}"
            )
        n = int(y_all.shape[0])

        def it_arrays():
            for s in range(0, n, batch_size):
                yield x_all[s:s + batch_size], y_all[s:s + batch_size]

        return n, it_arrays
    if isinstance(data, torch.utils.data.DataLoader):
        if not isinstance(data.sampler, torch.utils.data.SequentialSampler):
            raise ValueError(
                "Expected `data` DataLoader to iterate in order (shuffle=False); the cache stores "
                "rows in data-set order"
            )
        return len(data.dataset), lambda: iter(data)
    if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False)
        return len(data), lambda: iter(loader)
    raise TypeError(
        "Expected `data` to be an ArrayDataset, an (inputs, labels) pair, a map-style Dataset or an "
        f"in-order DataLoader, got {type(data).__name__}"
    )


def _default_embed(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not callable(getattr(model, "forward_features", None)):
        raise TypeError(
            f"Expected `model` ({type(model).__name__}) to have forward_features(x) (and fc) as "
            "torchcal models do; otherwise pass `embed=lambda model, x: (embeddings, logits)`"
        )
    z = model.forward_features(x)
    fc = getattr(model, "fc", None)
    logits = fc(z) if isinstance(fc, nn.Module) else model(x)
    return z, logits


def _check_build_args(model: nn.Module, n_passes: int, batch_size: int, on_stale: str,
                      augment: Callable | None) -> tuple[int, int]:
    """Validate :meth:`EmbeddingCache.build`'s arguments; return ``(n_passes, batch_size)``."""
    n_passes = check_positive_int(n_passes, "n_passes")
    batch_size = check_positive_int(batch_size, "batch_size")
    if on_stale not in ("rebuild", "error"):
        raise ValueError(f"Expected `on_stale` to be 'rebuild' or 'error', got {on_stale!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected `model` to be a torch.nn.Module, got {type(model).__name__}")
    if n_passes > 1 and augment is None:
        warnings.warn("n_passes > 1 without `augment` stores identical copies of every row",
                      stacklevel=3)
    return n_passes, batch_size


def _model_device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    """``device``, or by default the device of the model's first parameter (else CPU)."""
    if device is None:
        p = next(iter(model.parameters()), None)
        device = p.device if p is not None else torch.device("cpu")
    return torch.device(device)


def _input_pipeline(augment: Callable[..., torch.Tensor] | None,
                    transform: Callable[[torch.Tensor], torch.Tensor] | None,
                    device: torch.device, seed: int) -> Callable[[Any], torch.Tensor]:
    """A function moving an input batch to ``device``, then augmenting and transforming it."""
    gen = None
    aug_takes_gen = False
    if augment is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
        try:
            aug_takes_gen = "generator" in inspect.signature(augment).parameters
        except (TypeError, ValueError):  # pragma: no cover - builtins
            aug_takes_gen = False

    def prep(x: Any) -> torch.Tensor:
        x = torch.as_tensor(x).to(device, non_blocking=True)
        if augment is not None:
            x = augment(x, generator=gen) if aug_takes_gen else augment(x)
        if transform is not None:
            x = transform(x)
        elif not x.is_floating_point():
            x = x.float()
        return x

    return prep


def _embed_batch(model: nn.Module, embed_fn: Callable, x: torch.Tensor,
                 y: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(embeddings (B, D) float32, logits (B, C) float32, labels (B,) int64)`` on the CPU."""
    z, logits = embed_fn(model, x)
    z = z.detach().float().reshape(z.shape[0], -1).cpu().numpy()
    logits = logits.detach().float().cpu().numpy()
    y = torch.as_tensor(y).long().cpu().numpy()
    return z, logits, y


def _open_arrays(tmp: Path, rows: int, dim: int, num_classes: int) -> dict[str, np.memmap]:
    """Create the writable ``.npy`` memmaps of a cache with ``rows`` rows in ``tmp``."""
    return {
        "embeddings": np.lib.format.open_memmap(
            tmp / "embeddings.npy", mode="w+", dtype=np.float32, shape=(rows, dim)),
        "logits": np.lib.format.open_memmap(
            tmp / "logits.npy", mode="w+", dtype=np.float32, shape=(rows, num_classes)),
        "labels": np.lib.format.open_memmap(
            tmp / "labels.npy", mode="w+", dtype=np.int64, shape=(rows,)),
    }


def _embed_all(tmp: Path, model: nn.Module, make_iter: Callable[[], Iterator[tuple[Any, Any]]],
               prep: Callable[[Any], torch.Tensor], embed_fn: Callable, *, n: int, n_passes: int,
               progress: bool) -> dict[str, np.memmap]:
    """Run ``model`` over ``n_passes`` passes of the data into the memmaps in ``tmp``."""
    arrays: dict[str, np.memmap] = {}
    rows = n * n_passes
    bar = None
    if progress:
        bar = tqdm(total=rows, desc="embedding cache", unit="img", leave=False)
    pos = 0
    with torch.no_grad():
        for _ in range(n_passes):
            for x, y in make_iter():
                z, logits, y = _embed_batch(model, embed_fn, prep(x), y)
                b = z.shape[0]
                if not arrays:
                    arrays = _open_arrays(tmp, rows, z.shape[1], logits.shape[1])
                if pos + b > rows or logits.shape[0] != b or y.shape[0] != b:
                    raise ValueError(
                        "Expected the data to yield as many rows as its length "
                        f"({n}) with one embedding, logit row and label per input"
                    )
                arrays["embeddings"][pos:pos + b] = z
                arrays["logits"][pos:pos + b] = logits
                arrays["labels"][pos:pos + b] = y
                pos += b
                if bar is not None:
                    bar.update(b)
    if bar is not None:
        bar.close()
    if pos != rows:
        raise ValueError(f"Expected the data to yield {rows} rows, got {pos}")
    return arrays


_CHECK_ROWS = 1 << 16  # rows per chunk of the value checks (memory-mapped arrays)


def value_problem(arrays: dict[str, np.ndarray]) -> str:
    """The first impossible value of a cache's arrays ('' if none): NaN/Inf embeddings or
    logits, labels below -1 (-1: unknown, as an OOD set's; labels may exceed the backbone's
    classes: a transfer set's classes are its own).  Read in chunks of ``_CHECK_ROWS`` rows,
    so a memory-mapped cache larger than memory can be checked.

    >>> value_problem({"embeddings": np.zeros((2, 3), np.float32),
    ...                "logits": np.array([[0, np.nan]], np.float32), "labels": np.zeros(2)})
    "'logits' holds 1 NaN/Inf value(s)"
    """
    for name in ("embeddings", "logits"):
        arr = arrays[name]
        bad = sum(int((~np.isfinite(arr[i:i + _CHECK_ROWS])).sum())
                  for i in range(0, arr.shape[0], _CHECK_ROWS))
        if bad:
            return f"{name!r} holds {bad:,} NaN/Inf value(s)"
    labels = arrays["labels"]
    lo = min((int(labels[i:i + _CHECK_ROWS].min()) for i in range(0, len(labels), _CHECK_ROWS)),
             default=0)
    return f"'labels' go down to {lo} (expected class indices >= 0, or -1 for unknown)" if (
        lo < -1) else ""


def _row_problem(manifest: dict[str, Any]) -> str:
    """A manifest whose row counts disagree with each other or with the data identity it
    records ('' if none): rows = n_samples * n_passes, n_samples = the data's length."""
    try:
        rows, n, passes = (int(manifest[k]) for k in ("rows", "n_samples", "n_passes"))
        data_n = manifest["identity"]["data"].get("n")
    except (KeyError, TypeError, ValueError, AttributeError):
        return "its row counts or data identity are missing or malformed"
    if n < 1 or passes < 1 or rows != n * passes:
        return f"it lists {rows} rows for {n} samples x {passes} passes"
    if data_n is not None and data_n != n:
        return f"it holds {n} samples of data whose identity records {data_n}"
    return ""


@dataclass(frozen=True)
class CacheOptions:
    """How :meth:`EmbeddingCache.build` embeds its data (each field also a keyword of
    :meth:`~EmbeddingCache.build`, which wins over ``options``).

    Attributes:
        transform: applied to every input batch on ``device`` after augmentation (e.g.
            normalisation of uint8 images).
        augment: ``augment(x, generator=g) -> x`` applied on every pass (e.g.
            ``torchcal.data.augment.random_crop_flip``); ``None`` for clean inputs.
        n_passes: number of passes over the data (several only make sense with ``augment``).
        batch_size: backbone batch size.
        data_id: extra JSON-serialisable identity of the data (recommended for data read
            from disk, whose contents are not hashed).
        embed: ``embed(model, x) -> (embeddings (B, D), logits (B, C))`` override.
        on_stale: ``"rebuild"`` or ``"error"``.
        seed: seed of the augmentation generator.
    """

    transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    augment: Callable[..., torch.Tensor] | None = None
    n_passes: int = 1
    batch_size: int = 256
    data_id: Any = None
    embed: Callable[[nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    on_stale: str = "rebuild"
    seed: int = 0


# ------------------------------------------------------------------------------------------
# the cache
# ------------------------------------------------------------------------------------------
class EmbeddingCache:
    """A verified, memory-mapped embedding cache (see the module docstring for the layout).

    Open an existing cache with ``EmbeddingCache(path)`` (or :meth:`open`); create one with
    :meth:`build`.  Rows are ``n_passes`` consecutive copies of the data set (pass-major).

    Attributes:
        path: the cache directory.
        manifest: the parsed ``manifest.json``.
        embeddings, logits, labels: read-only ``np.memmap`` arrays (R, D), (R, C), (R,).
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True) -> None:
        self.path = Path(path)
        man_path = self.path / "manifest.json"
        if not self.path.is_dir():
            raise CacheError(f"Embedding cache {str(self.path)!r} does not exist")
        if not man_path.is_file():
            raise CacheError(f"Embedding cache {str(self.path)!r} has no manifest.json")
        manifest = read_json(man_path, what="Embedding cache manifest", error=CacheError,
                             verified=True, hint="rebuild the cache")
        if not isinstance(manifest, dict) or manifest.get("schema") != CACHE_SCHEMA:
            raise CacheError(
                f"{str(man_path)!r} is not a {CACHE_SCHEMA} manifest "
                f"(schema {manifest.get('schema') if isinstance(manifest, dict) else None!r})"
            )
        self.manifest = manifest
        arrays = manifest.get("arrays")
        if not isinstance(arrays, dict) or set(arrays) != set(_ARRAYS):
            raise CacheError(f"Embedding cache manifest {str(man_path)!r} lists no valid arrays")
        problem = _row_problem(manifest)  # the values, not only the checksums
        if problem:
            raise CacheError(f"Embedding cache {str(self.path)!r} is inconsistent: {problem}; "
                             "rebuild the cache")
        rows = manifest.get("rows")
        for name in _ARRAYS:
            self._open_array(name, arrays[name], rows, verify)
        problem = value_problem({n: getattr(self, n) for n in _ARRAYS}) if verify else ""
        if problem:
            raise CacheError(f"Embedding cache {str(self.path)!r} holds impossible values: "
                             f"{problem}; rebuild the cache")

    def _open_array(self, name: str, meta: dict[str, Any], rows: Any, verify: bool) -> None:
        try:
            file, shape, dtype, digest = meta["file"], tuple(meta["shape"]), meta["dtype"], meta["sha256"]
        except (KeyError, TypeError) as exc:
            raise CacheError(f"Embedding cache manifest entry for {name!r} is malformed") from exc
        fpath = self.path / file
        if Path(file).name != file:
            raise CacheError(f"Embedding cache manifest names an unsafe file {file!r}")
        if not fpath.is_file():
            raise CacheError(f"Embedding cache {str(self.path)!r} is missing {file}")
        if verify:
            check_sha256(fpath, digest, what="Embedding cache file", where="manifest.json",
                         error=CacheError, hint="rebuild the cache")
        try:
            arr = np.load(fpath, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise CacheError(
                f"Embedding cache file {str(fpath)!r} is truncated or not a .npy array: {exc}"
            ) from exc
        if tuple(arr.shape) != shape or str(arr.dtype) != dtype or np.dtype(dtype) != _ARRAYS[name]:
            raise CacheError(
                f"Embedding cache file {str(fpath)!r} holds {arr.dtype} {tuple(arr.shape)}, the "
                f"manifest says {dtype} {shape}"
            )
        if not shape or shape[0] != rows:
            raise CacheError(f"Embedding cache array {name!r} has {shape[:1]} rows, expected {rows}")
        setattr(self, name, arr)

    # -------------------------------------------------------------------------------- info
    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True,
             expect: dict[str, Any] | None = None) -> EmbeddingCache:
        """Open and verify a cache; with ``expect`` (an identity dict as :meth:`identity_of`
        returns) raise :class:`StaleCacheError` if the cache was built from something else."""
        cache = cls(path, verify=verify)
        if expect is not None:
            cache.check_identity(expect)
        return cache

    def __len__(self) -> int:
        return int(self.manifest["rows"])

    @property
    def dim(self) -> int:
        """Embedding width D."""
        return int(self.embeddings.shape[1])

    @property
    def num_classes(self) -> int:
        return int(self.logits.shape[1])

    @property
    def n_samples(self) -> int:
        return int(self.manifest["n_samples"])

    @property
    def n_passes(self) -> int:
        return int(self.manifest["n_passes"])

    @property
    def identity(self) -> dict[str, Any]:
        return self.manifest["identity"]

    @staticmethod
    def identity_of(model: nn.Module, data: Any, *, data_id: Any = None, n_passes: int = 1,
                    augment: Callable | None = None, transform: Callable | None = None) -> dict[str, Any]:
        """The identity a cache built with these arguments records (compare with ``.identity``)."""
        return {
            "backbone": model_identity(model),
            "data": data_identity(data, data_id),
            "n_passes": int(n_passes),
            "augment": _callable_name(augment),
            "transform": _callable_name(transform),
        }

    def check_identity(self, expected: dict[str, Any]) -> None:
        """Raise :class:`StaleCacheError` naming the parts of the identity that differ."""
        mine = self.identity
        diff = sorted(k for k in set(mine) | set(expected) if mine.get(k) != expected.get(k))
        if diff:
            raise StaleCacheError(
                f"Embedding cache {str(self.path)!r} is stale: its {', '.join(diff)} differ(s) from "
                "the requested one; rebuild it (on_stale='rebuild') or delete the directory"
            )

    def __repr__(self) -> str:
        return (f"EmbeddingCache({str(self.path)!r}, rows={len(self)}, dim={self.dim}, "
                f"num_classes={self.num_classes}, n_passes={self.n_passes})")

    # -------------------------------------------------------------------------------- read
    def tensors(self, device: torch.device | str | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All rows as tensors ``(embeddings float32 (R, D), logits float32 (R, C), labels int64
        (R,))`` on ``device`` (default CPU); loads the whole cache into memory."""
        out = tuple(torch.from_numpy(np.array(getattr(self, n))) for n in _ARRAYS)
        if device is not None:
            out = tuple(t.to(device) for t in out)
        return out  # type: ignore[return-value]

    def batches(self, batch_size: int, *, shuffle: bool = False, seed: int | None = None,
                drop_last: bool = False, device: torch.device | str | None = None,
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(embeddings, logits, labels)`` batches read from the memory-mapped files
        (only one batch in memory at a time); ``shuffle`` draws a permutation from ``seed``."""
        batch_size = check_positive_int(batch_size, "batch_size")
        r = len(self)
        if shuffle:
            order = np.random.default_rng(seed).permutation(r)
        stop = (r // batch_size) * batch_size if drop_last else r
        for s in range(0, stop, batch_size):
            if shuffle:
                idx = np.sort(order[s:s + batch_size])  # sorted: sequential disk access
                parts = [getattr(self, n)[idx] for n in _ARRAYS]
            else:
                parts = [np.array(getattr(self, n)[s:s + batch_size]) for n in _ARRAYS]
            ts = [torch.from_numpy(p) for p in parts]
            if device is not None:
                ts = [t.to(device) for t in ts]
            yield ts[0], ts[1], ts[2]

    # -------------------------------------------------------------------------------- build
    @classmethod
    def build(
        cls,
        path: str | os.PathLike,
        model: nn.Module,
        data: Any,
        *,
        options: CacheOptions | None = None,
        device: torch.device | str | None = None,
        progress: bool = False,
        **settings: Any,
    ) -> EmbeddingCache:
        """Run a frozen ``model`` over ``data`` once under ``no_grad`` and store the results.

        If ``path`` already holds a valid cache with the same identity (backbone weights, data,
        passes, augmentation) it is reused without running the model.  A cache with another
        identity, or a corrupt one, is rebuilt (``on_stale="rebuild"``) or rejected
        (``on_stale="error"``: :class:`StaleCacheError` / :class:`CacheError`).

        Args:
            path: cache directory (created; its parent must be writable).
            model: the frozen backbone + classifier; by default ``embed`` uses
                ``model.forward_features(x)`` and ``model.fc`` (torchcal models).
            data: an ``ArrayDataset`` (``.data``, ``.labels``), an ``(inputs, labels)`` pair,
                a map-style ``Dataset`` of ``(x, y)`` or an in-order ``DataLoader``.
            options: how to build it (:class:`CacheOptions`; default: its defaults).
            device: where the model runs (default: the model's device).
            progress: show a tqdm progress bar.
            **settings: fields of :class:`CacheOptions` (``n_passes=2``, ``seed=1``, ...),
                replacing those of ``options``.

        Raises:
            TypeError: a keyword that is no field of :class:`CacheOptions`.
        """
        o = with_settings(options, CacheOptions(), settings, "EmbeddingCache.build")
        transform, augment, data_id, embed, seed = (o.transform, o.augment, o.data_id, o.embed,
                                                    o.seed)
        n_passes, batch_size = _check_build_args(model, o.n_passes, o.batch_size, o.on_stale,
                                                 augment)
        on_stale = o.on_stale
        path = Path(path)
        identity = cls.identity_of(model, data, data_id=data_id, n_passes=n_passes,
                                   augment=augment, transform=transform)
        if path.exists():
            cached = cls._reuse(path, identity, on_stale)
            if cached is not None:
                return cached
        n, make_iter = _batches_of(data, batch_size)
        if n == 0:
            raise ValueError("Expected `data` to hold at least one sample, got 0")
        device = _model_device(model, device)
        prep = _input_pipeline(augment, transform, device, seed)

        path.parent.mkdir(parents=True, exist_ok=True)
        was_training = model.training
        model.eval()
        try:
            # removed unless published (an error, Ctrl-C: a cache there is unchanged)
            with staged_temp_dir(path.parent, f".{path.name}.tmp-") as tmp:
                arrays = _embed_all(tmp, model, make_iter, prep, embed or _default_embed,
                                    n=n, n_passes=n_passes, progress=progress)
                problem = value_problem(arrays)  # checked before it replaces anything
                if problem:
                    raise CacheError(f"Embedding cache not built at {str(path)!r}: the "
                                     f"backbone's outputs are unusable ({problem}); a cache "
                                     "there is unchanged")
                _write_manifest(tmp, arrays, n=n, n_passes=n_passes, identity=identity)
                _publish(tmp, path)
        finally:
            model.train(was_training)
        return cls(path, verify=False)

    @classmethod
    def _reuse(cls, path: Path, identity: dict[str, Any], on_stale: str) -> EmbeddingCache | None:
        """The valid, current cache at ``path``, else None (or raise if ``on_stale="error"``)."""
        try:
            return cls.open(path, expect=identity)
        except CacheError as exc:
            if on_stale == "error":
                raise
            warnings.warn(f"{exc}; rebuilding", stacklevel=3)
        return None


def _write_manifest(tmp: Path, arrays: dict[str, np.memmap], *, n: int, n_passes: int,
                    identity: dict[str, Any]) -> None:
    """Flush and checksum the filled ``arrays``, then write and fsync ``tmp/manifest.json``."""
    meta: dict[str, Any] = {}
    for name, arr in arrays.items():
        arr.flush()
        shape, dtype = list(arr.shape), str(arr.dtype)
        fpath = tmp / f"{name}.npy"
        fsync_dir(fpath)
        meta[name] = {"file": fpath.name, "shape": shape, "dtype": dtype,
                      "sha256": sha256_file(fpath)}
    arrays.clear()
    manifest = {
        "schema": CACHE_SCHEMA,
        "rows": n * n_passes,
        "n_samples": n,
        "n_passes": n_passes,
        "arrays": meta,
        "identity": identity,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }
    write_verified(tmp / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))
    fsync_dir(tmp)


def _publish(tmp: Path, path: Path) -> None:
    """Move the finished ``tmp`` directory to ``path`` (replacing an old cache)."""
    trash = None
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise CacheError(f"Cannot build an embedding cache at {str(path)!r}: it is a file")
        trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.replace(path, trash / "old")
    try:
        os.replace(tmp, path)
    except BaseException:
        if trash is not None:  # put the old cache back
            os.replace(trash / "old", path)
            shutil.rmtree(trash, ignore_errors=True)
        raise
    fsync_dir(path.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
