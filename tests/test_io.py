"""torchcal._io: atomic writes respect the umask, name the file on a full disk, and stale
temporary files of killed writers are removed (only those)."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys

import pytest

from torchcal._io import (
    append_text,
    atomic_write_bytes,
    atomic_write_json,
    atomic_writer,
    make_temp_dir,
    remove_stale_temp_files,
)


@pytest.fixture()
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_atomic_writes_respect_the_umask(tmp_path, umask022):
    a = atomic_write_bytes(tmp_path / "a.bin", b"x")
    b = atomic_write_json(tmp_path / "sub" / "b.json", {"k": 1})
    with open(tmp_path / "plain.txt", "w") as f:  # what any other writer gets
        f.write("x")
    assert _mode(a) == _mode(b) == _mode(tmp_path / "plain.txt") == 0o644
    os.umask(0o027)
    assert _mode(atomic_write_bytes(tmp_path / "a.bin", b"y")) == 0o640
    assert _mode(make_temp_dir(tmp_path, ".d-")) == 0o750


def _disk_full(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    target.write_text("old")
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(OSError) as e:
        atomic_write_json(target, {"a": 1})
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC
    assert str(target) in msg and "disk is full" in msg, msg
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "results.json"]
    with pytest.raises(OSError, match="disk is full.*log.jsonl"):
        append_text(tmp_path / "log.jsonl", "{}\n")


def test_other_write_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="boom"), atomic_writer(tmp_path / "x.bin") as f:
        f.write(b"partial")
        raise ValueError("boom")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError, match=r"cannot write .*'d'|Is a directory: .*d|'[^']*d' is a directory"):
        atomic_write_bytes(tmp_path / "d", b"x")  # a directory stands where the file goes


def test_only_stale_temp_files_of_the_given_names_are_removed(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        names = {
            ".last.pt.abc_12xy.tmp": False,               # mkstemp name of an older version
            f".last.pt.{dead.pid}-0a1b2c3d.tmp": False,   # its writer was killed
            f".best.pt.{os.getpid()}-00ff00ff.tmp": False,  # a reused pid (this process)
            f".last.pt.{live.pid}-0a1b2c3d.tmp": True,    # a live writer's: kept
            ".notes.txt.abcdefgh.tmp": True,              # not one of the names
            "last.pt": True, "keep.tmp": True, ".last.pt.tmp": True,
        }
        for n in names:
            (tmp_path / n).write_bytes(b"x")
        removed = remove_stale_temp_files(tmp_path, ["last.pt", "best.pt"])
        assert sorted(p.name for p in removed) == sorted(n for n, k in names.items() if not k)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, k in names.items() if k)
        assert remove_stale_temp_files(tmp_path / "absent") == []
    finally:
        live.kill()
        live.wait()


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
@pytest.mark.parametrize("write", ["writer", "files"])
def test_a_signal_delivered_as_the_temporary_file_is_created_leaves_no_file(
        tmp_path, monkeypatch, write):
    """A SIGTERM that arrives while the temporary file is created was raised right after
    ``os.open`` returned, before the writer knew the file's name: the file stayed behind (the
    report killed twenty times found ``.summary.csv.PID-RANDOM.tmp``, about 1 run in 10 under
    load).  The file is now created and named with the signal held back."""
    import torchcal._io.atomic as atomic
    from torchcal._signals import sigterm_interrupts

    real = atomic.new_temp_file

    def created_then_signalled(path):
        out = real(path)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives with the file just made
        return out

    monkeypatch.setattr(atomic, "new_temp_file", created_then_signalled)
    with pytest.raises(KeyboardInterrupt), sigterm_interrupts():
        if write == "writer":
            atomic_write_bytes(tmp_path / "a.bin", b"abc")
        else:
            atomic.atomic_write_files({tmp_path / "a.md": "# a", tmp_path / "b.md": "# b"})
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_a_signal_delivered_as_a_staged_folder_is_made_leaves_no_folder(tmp_path, monkeypatch):
    """The same for the staged folders (a report's figures, an embedding cache): made with the
    signal held back, the folder is removed, not left behind."""
    import torchcal._io.temp as temp
    from torchcal._io import staged_temp_dir
    from torchcal._signals import sigterm_interrupts

    real = temp.make_temp_dir

    def made_then_signalled(parent, prefix):
        out = real(parent, prefix)
        os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(temp, "make_temp_dir", made_then_signalled)
    with pytest.raises(KeyboardInterrupt), sigterm_interrupts(), \
            staged_temp_dir(tmp_path, ".figures.tmp-"):
        pass
    assert list(tmp_path.iterdir()) == []
