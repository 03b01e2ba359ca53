"""Downloads with published checksums, and safe archive extraction.

Every file torchcal may fetch is listed in :data:`RESOURCES` with its official URL and published
MD5.  Sources of the checksums:

* CIFAR-10 / CIFAR-100 python tarballs: torchvision ``torchvision/datasets/cifar.py``
  (``tgz_md5``); CIFAR-10's also in REFERENCE §6.
* SVHN ``train_32x32.mat`` / ``test_32x32.mat``: torchvision ``torchvision/datasets/svhn.py``
  (``split_list``).
* Tiny-ImageNet ``tiny-imagenet-200.zip``: the MD5 used by the public Tiny-ImageNet dataset
  classes (e.g. Avalanche's ``avalanche/benchmarks/datasets/tiny_imagenet``), 248,100,043 bytes.
* CIFAR-10-C ``CIFAR-10-C.tar``: Zenodo record 2535967 (Hendrycks & Dietterich 2019), as listed
  on Zenodo.

Downloads are atomic and resume-safe: bytes go to ``<file>.part`` (continued with an HTTP
``Range`` request when the server supports it), the MD5 is checked, and only then is the file
moved into place with :func:`os.replace`.  A file that is present is never trusted blindly: its
MD5 is verified before use (``verify=False`` skips that, e.g. for locally re-packed archives).
"""

from __future__ import annotations

import contextlib
import hashlib
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from .._io import fsync_dir, is_within
from ..errors import ChecksumError, DataNotFoundError

__all__ = ["Resource", "RESOURCES", "md5sum", "download_url", "extract_archive", "fetch_resource",
           "data_lock"]


@dataclass(frozen=True)
class Resource:
    """An official file: where it comes from and its published MD5."""

    filename: str
    url: str
    md5: str
    description: str


#: Every official file torchcal can download, by key: file name, URL, published MD5, description.
RESOURCES: dict[str, Resource] = {
    "cifar10": Resource(
        "cifar-10-python.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "c58f30108f718f92721af3b95e74349a", "CIFAR-10 (python version)"),
    "cifar100": Resource(
        "cifar-100-python.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        "eb9058c3a382ffc7106e4002c42a8d85", "CIFAR-100 (python version)"),
    "svhn_train": Resource(
        "train_32x32.mat", "http://ufldl.stanford.edu/housenumbers/train_32x32.mat",
        "e26dedcc434d2e4c54c9b2d4a06d8373", "SVHN training set (cropped digits, format 2)"),
    "svhn_test": Resource(
        "test_32x32.mat", "http://ufldl.stanford.edu/housenumbers/test_32x32.mat",
        "eb5a983be6a315427106f1b164d9cef3", "SVHN test set (cropped digits, format 2)"),
    "tinyimagenet": Resource(
        "tiny-imagenet-200.zip", "http://cs231n.stanford.edu/tiny-imagenet-200.zip",
        "90528d7ca1a48142e341f4ef8d21d0de", "Tiny-ImageNet-200"),
    "cifar10c": Resource(
        "CIFAR-10-C.tar", "https://zenodo.org/records/2535967/files/CIFAR-10-C.tar",
        "56bf5dcef84df0e2308c6dcbcbbd8499", "CIFAR-10-C (Hendrycks & Dietterich 2019)"),
}

_CHUNK = 1 << 20


def md5sum(path: str | os.PathLike) -> str:
    """Hex MD5 of a file, read in 1 MiB chunks."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def download_url(url: str, path: str | os.PathLike, md5: str | None, *, timeout: float = 60.0,
                 progress: bool = False) -> Path:
    """Download ``url`` to ``path`` atomically and verify its MD5.

    If ``path`` already exists with the right MD5 nothing is fetched.  Otherwise bytes go to
    ``path + ".part"``; an existing partial file is continued with an HTTP ``Range`` request
    (restarted from zero when the server ignores it).  The MD5 of the complete file is checked
    before it is moved into place with :func:`os.replace`, so ``path`` is either absent or
    complete and verified.

    Args:
        url: http(s) or file URL.
        path: destination file.
        md5: expected hex MD5 (``None`` skips the check; only for files without a published sum).
        timeout: socket timeout in seconds.
        progress: show a tqdm bar.

    Raises:
        ChecksumError: the downloaded bytes do not match ``md5`` (the partial file is deleted).
        DataNotFoundError: the URL cannot be fetched (offline, HTTP error).
    """
    path = Path(path)
    if path.exists() and (md5 is None or md5sum(path) == md5):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    if part.exists() and md5 is not None and md5sum(part) == md5:
        # A complete download interrupted before the final rename.
        os.replace(part, path)
        fsync_dir(path.parent)
        return path
    start = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "torchcal"})
    if start > 0:
        req.add_header("Range", f"bytes={start}-")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status = getattr(resp, "status", 200)
            mode = "ab" if (start > 0 and status == 206) else "wb"
            total = resp.headers.get("Content-Length")
            bar = None
            if progress:
                bar = tqdm(total=int(total) if total else None, unit="B", unit_scale=True,
                           desc=path.name, initial=start if mode == "ab" else 0)
            with open(part, mode) as f:
                while True:
                    chunk = resp.read(_CHUNK)
                    if not chunk:
                        break
                    f.write(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
                f.flush()
                os.fsync(f.fileno())
            if bar is not None:
                bar.close()
    except urllib.error.HTTPError as e:
        if e.code == 416 and start > 0:  # the partial file is not a prefix we can continue
            part.unlink(missing_ok=True)
            return download_url(url, path, md5, timeout=timeout, progress=progress)
        raise DataNotFoundError(f"Could not download {url} to {path}: {e}") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DataNotFoundError(f"Could not download {url} to {path}: {e}") from e
    if md5 is not None:
        got = md5sum(part)
        if got != md5:
            part.unlink(missing_ok=True)
            raise ChecksumError(
                f"Downloaded file from {url} has MD5 {got}, expected the published {md5}; "
                "the partial download was deleted, try again"
            )
    os.replace(part, path)
    fsync_dir(path.parent)
    return path


def _check_member_name(name: str, archive: Path) -> PurePosixPath:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise ValueError(f"Unsafe archive member {name!r} in {archive}: absolute path")
    if ".." in p.parts:
        raise ValueError(f"Unsafe archive member {name!r} in {archive}: '..' escapes the root")
    return p


def _merge_move(src: Path, dst: Path, root: Path) -> None:
    """Move ``src`` to ``dst``: whole when ``dst`` is absent, else file by file (overwriting).

    Never writes through a symbolic link that leads out of the data root ``root`` (the
    symbolic-link policy of run trees and data roots); a file link is replaced, not written
    through (:func:`os.replace`)."""
    if dst.is_symlink() and dst.is_dir() and not is_within(dst, root):
        raise ValueError(
            f"Refusing to extract into {str(dst)!r}: it is a symbolic link to "
            f"{os.path.realpath(dst)!r}, outside the data root {str(root)!r} (torchcal does not "
            "write through links that leave the data root); remove the link or extract elsewhere")
    if not dst.exists():
        os.replace(src, dst)
        return
    if src.is_dir() and dst.is_dir():
        for child in src.iterdir():
            _merge_move(child, dst / child.name, root)
        return
    if dst.is_dir():
        raise ValueError(f"Cannot replace directory {dst} by a file from the archive")
    os.replace(src, dst)


def extract_archive(path: str | os.PathLike, root: str | os.PathLike) -> Path:
    """Extract a tar (any compression) or zip archive into ``root``, safely.

    Every member is checked before anything is written: absolute names, ``..`` components,
    symbolic or hard links, and device / FIFO members are rejected (``ValueError`` naming the
    member); so is a symbolic link already inside ``root`` that leads out of it and that a
    member would be written through.  Members are extracted into a temporary directory inside ``root`` that is then moved
    into place, so an interrupted extraction leaves no half-written tree under the final names.

    Returns:
        ``root`` as a :class:`~pathlib.Path`.
    """
    path, root = Path(path), Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".torchcal-extract-", dir=root))
    try:
        _extract_into(path, root, tmp)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError,
            OSError) as exc:  # truncated or corrupt (an unverified archive)
        if isinstance(exc, OSError) and exc.filename is not None:
            raise  # a problem of the destination (permissions, a full disk): it names the file
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"Archive {str(path)!r} is truncated or corrupt ({type(exc).__name__}: "
                         f"{msg[:120]}); delete it and download it again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _extract_into(path: Path, root: Path, tmp: Path) -> None:
    """Check every member of archive ``path``, extract into ``tmp``, move into ``root``."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            for info in infos:
                _check_member_name(info.filename, path)
                mode = (info.external_attr >> 16) & 0xFFFF
                if stat.S_ISLNK(mode):
                    raise ValueError(f"Unsafe archive member {info.filename!r} in {path}: symbolic link")
            zf.extractall(tmp)
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as tf:
            members = tf.getmembers()
            for m in members:
                _check_member_name(m.name, path)
                if m.issym() or m.islnk():
                    raise ValueError(f"Unsafe archive member {m.name!r} in {path}: link to {m.linkname!r}")
                if not (m.isfile() or m.isdir()):
                    raise ValueError(f"Unsafe archive member {m.name!r} in {path}: special file")
            if hasattr(tarfile, "data_filter"):
                tf.extractall(tmp, members=members, filter="data")
            else:  # pragma: no cover - Python < 3.11.4
                tf.extractall(tmp, members=members)
    else:
        raise ValueError(f"Expected a tar or zip archive, got {path}")
    for child in list(tmp.iterdir()):
        _merge_move(child, root / child.name, root)


@contextlib.contextmanager
def data_lock(root: str | os.PathLike, *, create: bool = False):
    """An exclusive inter-process lock on the data root (``root/.torchcal.lock``, ``flock``).

    Held while a data set is downloaded and extracted, so that several processes (DDP ranks,
    parallel jobs sharing a data root) do not write the same ``.part`` file or extraction at
    once: the first does the work, the others wait and then find the files present.  Stale
    temporary extraction folders of interrupted runs are removed under the lock.  Without
    ``fcntl`` (Windows) or when ``root`` does not exist and ``create`` is false, no lock is taken.
    """
    root = Path(root)
    if not root.is_dir():
        if not create:
            yield
            return
        root.mkdir(parents=True, exist_ok=True)
    try:
        # deferred: fcntl exists on POSIX only
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(root / ".torchcal.lock", "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            for stale in root.glob(".torchcal-extract-*"):
                shutil.rmtree(stale, ignore_errors=True)
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def fetch_resource(key: str, root: str | os.PathLike, *, download: bool, verify: bool = True,
                   expected: str | None = None, progress: bool = True) -> Path:
    """The path of the official file ``RESOURCES[key]`` inside ``root``.

    Present: its MD5 is verified (unless ``verify=False``).  Absent and ``download``: fetched
    and verified.  Absent otherwise: :class:`DataNotFoundError` saying which file to put where.

    Args:
        key: a key of :data:`RESOURCES`.
        root: the data root directory.
        download: allow a download.
        verify: check the MD5 of a file that is already present.
        expected: text naming what else would do (e.g. the extracted folder), for the message.
    """
    res = RESOURCES[key]
    root = Path(root)
    path = root / res.filename
    if path.exists():
        if verify:
            got = md5sum(path)
            if got != res.md5:
                raise ChecksumError(
                    f"{path} has MD5 {got}, but the published MD5 of {res.description} is "
                    f"{res.md5}: the file is corrupt or not the official one. Delete it "
                    f"(download=True fetches {res.url}) or pass verify=False to use it anyway"
                )
        return path
    if not download:
        alt = f", or {expected}" if expected else ""
        raise DataNotFoundError(
            f"{res.description} not found: put {res.filename} (from {res.url}) in "
            f"{root.resolve()}{alt}; or pass download=True (--download)"
        )
    try:
        return download_url(res.url, path, res.md5, progress=progress)
    except DataNotFoundError as e:
        raise DataNotFoundError(
            f"{e}. Offline? Put {res.filename} (from {res.url}) in {root.resolve()} by hand"
        ) from e
