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

Every public name of the modules is re-exported here (``from torchcal._io import X``).  A
name is looked up in the module that defines it: to replace one (a test's monkeypatch), set it
there (``torchcal._io.jsonio.MAX_JSON_BYTES``), or in the module that imported it
(``torchcal._io.verified.atomic_write_bytes``).
"""

from __future__ import annotations

from .atomic import (
    TEMP_RE,
    append_text,
    atomic_write_bytes,
    atomic_write_files,
    atomic_write_text,
    atomic_writer,
    fsync_dir,
    fsync_file,
    new_temp_file,
    signals_deferred,
    write_error,
)
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
from .temp import make_temp_dir, remove_stale_temp_dirs, remove_stale_temp_files, staged_temp_dir
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
    "new_temp_file",
    "make_temp_dir",
    "staged_temp_dir",
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
