"""torchcal._io is a package of small modules (issue 40 item 6) that keeps the one-module
interface: every name is re-exported, and setting a name on the package (a test's monkeypatch)
reaches the functions of its modules, as it did when ``_io`` was one module."""

from __future__ import annotations

import importlib

import pytest

import torchcal._io as io_pkg
from torchcal._io import atomic, jsonio, verified

MODULES = ("atomic", "bounded", "jsonio", "links", "lock", "temp", "verified")


def test_the_package_re_exports_every_public_name_of_its_modules():
    names = set()
    for name in MODULES:
        module = importlib.import_module(f"torchcal._io.{name}")
        assert module.__doc__, name  # each module says what it owns
        for public in module.__all__:
            if public == "new_temp_file":
                continue  # re-exported as _new_temp_file, its name in the one-module _io
            assert getattr(io_pkg, public) is getattr(module, public), (name, public)
        names |= set(module.__all__)
    assert set(io_pkg.__all__) == names - {"new_temp_file"}
    assert io_pkg._new_temp_file is atomic.new_temp_file


def test_a_limit_set_on_the_package_reaches_read_json(tmp_path, monkeypatch):
    p = tmp_path / "x.json"
    p.write_text('{"a": "' + "x" * 200 + '"}')
    monkeypatch.setattr(io_pkg, "MAX_JSON_BYTES", 100)
    assert jsonio.MAX_JSON_BYTES == 100
    with pytest.raises(ValueError, match="more than the 100 such a file may have"):
        io_pkg.read_json(p)
    monkeypatch.undo()
    assert jsonio.MAX_JSON_BYTES == io_pkg.MAX_JSON_BYTES == 16 << 20
    assert io_pkg.read_json(p)["a"] == "x" * 200


def test_a_function_patched_on_the_package_reaches_its_callers(tmp_path, monkeypatch):
    calls = []
    real = io_pkg.atomic_write_bytes

    def spy(path, data):
        calls.append(path)
        return real(path, data)

    monkeypatch.setattr(io_pkg, "atomic_write_bytes", spy)
    assert atomic.atomic_write_bytes is spy and verified.atomic_write_bytes is spy
    io_pkg.write_verified(tmp_path / "f.bin", b"abc")  # verified.py calls it
    io_pkg.atomic_write_text(tmp_path / "t.txt", "x")  # atomic.py calls it
    assert [p.name for p in calls] == ["f.bin", "t.txt"]
    monkeypatch.undo()
    assert atomic.atomic_write_bytes is real and verified.atomic_write_bytes is real


def test_the_old_private_name_of_the_temp_file_maker_is_patched_under_its_new_name(
        tmp_path, monkeypatch):
    made = []
    real = io_pkg._new_temp_file

    def spy(path):
        made.append(path.name)
        return real(path)

    monkeypatch.setattr(io_pkg, "_new_temp_file", spy)
    assert atomic.new_temp_file is spy
    io_pkg.atomic_write_files({tmp_path / "a.md": "a", tmp_path / "b.md": "b"})
    assert made == ["a.md", "b.md"]
    monkeypatch.undo()
    assert atomic.new_temp_file is real


def test_a_new_name_is_set_on_the_package_only(monkeypatch):
    monkeypatch.setattr(io_pkg, "something_new", 1, raising=False)
    assert io_pkg.something_new == 1
    assert not any(hasattr(importlib.import_module(f"torchcal._io.{m}"), "something_new")
                   for m in MODULES)
