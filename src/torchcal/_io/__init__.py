"""File input and output, the one implementation every torchcal writer and reader uses: a
package of small modules, each owning one concern.

* :mod:`.atomic`: atomic writes (temporary file, fsync, replace), appends, and write errors
  that name the file.
* :mod:`.lock`: :func:`exclusive_lock`, one process owning a directory while it writes there.
* :mod:`.verified`: files written with their SHA-256 beside them and checked on every read.
* :mod:`.bounded`: reads of regular files of bounded size.
* :mod:`.jsonio`: conversion to plain JSON and the one bounded reader of JSON.
* :mod:`.links`: no write, lock or walk through a symbolic link that leaves its tree.
* :mod:`.temp`: temporary directories, and the stale temporary files a killed process left.

Every name is re-exported here, so that ``from torchcal._io import X`` works as it did when
``_io`` was one module.  Setting a name here (a test's ``monkeypatch.setattr(torchcal._io,
"atomic_write_bytes", ...)``) sets it in each module of the package that uses that function
or constant, as it did then (:class:`_Package`).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from . import atomic, bounded, jsonio, links, lock, temp, verified
from .atomic import (
    TEMP_RE,
    append_text,
    atomic_write_bytes,
    atomic_write_files,
    atomic_write_text,
    atomic_writer,
    fsync_dir,
    fsync_file,
    signals_deferred,
    write_error,
)
from .atomic import new_temp_file as _new_temp_file  # noqa: F401 - its name when _io was one module
from .bounded import read_bytes_bounded
from .jsonio import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_JSON_INT_DIGITS,
    atomic_write_json,
    json_text,
    parse_json,
    read_json,
    to_jsonable,
)
from .links import check_own_path, file_kind, find_files, is_within
from .lock import LOCK_NAME, exclusive_lock, read_lock_command
from .temp import make_temp_dir, remove_stale_temp_dirs, remove_stale_temp_files
from .verified import (
    check_listed,
    check_sha256,
    checksum_path,
    read_digests,
    read_verified,
    replace_verified,
    sha256_file,
    write_verified,
)

__all__ = [
    "fsync_dir",
    "atomic_writer",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "atomic_write_files",
    "json_text",
    "append_text",
    "fsync_file",
    "signals_deferred",
    "make_temp_dir",
    "remove_stale_temp_files",
    "remove_stale_temp_dirs",
    "exclusive_lock",
    "read_lock_command",
    "LOCK_NAME",
    "write_error",
    "to_jsonable",
    "checksum_path",
    "sha256_file",
    "write_verified",
    "replace_verified",
    "read_verified",
    "check_sha256",
    "check_listed",
    "read_digests",
    "read_bytes_bounded",
    "parse_json",
    "read_json",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
    "is_within",
    "find_files",
    "file_kind",
    "check_own_path",
    "TEMP_RE",
]

_MODULES = (atomic, bounded, jsonio, links, lock, temp, verified)
# names of this package that a module of it holds under another name
_ALIASES = {"_new_temp_file": "new_temp_file"}
_MISSING = object()


class _Package(types.ModuleType):
    """The type of this package: setting one of its names (``torchcal._io.MAX_JSON_BYTES =
    100``) also sets it in each of its modules that holds the same object under that name
    (or under the name :data:`_ALIASES` gives), so that every function of the package sees
    the new value, as when ``_io`` was one module.  A new name is set here only."""

    def __setattr__(self, name: str, value: Any) -> None:
        old = self.__dict__.get(name, _MISSING)
        if old is not _MISSING:
            inner = _ALIASES.get(name, name)
            for module in _MODULES:
                if module.__dict__.get(inner, _MISSING) is old:
                    setattr(module, inner, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
