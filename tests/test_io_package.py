"""torchcal._io is a package of small modules (issue 40 item 6): every public name of its
modules is re-exported from the package, and a name is looked up in the module that defines
it (a test patches it there)."""

from __future__ import annotations

import importlib

import pytest

import torchcal._io as io_pkg
from torchcal._io import jsonio

MODULES = ("atomic", "bounded", "jsonio", "links", "lock", "temp", "verified")


def test_the_package_re_exports_every_public_name_of_its_modules():
    names = set()
    for name in MODULES:
        module = importlib.import_module(f"torchcal._io.{name}")
        assert module.__doc__, name  # each module says what it owns
        for public in module.__all__:
            assert getattr(io_pkg, public) is getattr(module, public), (name, public)
        names |= set(module.__all__)
    assert set(io_pkg.__all__) == names


def test_a_limit_set_on_its_module_reaches_read_json(tmp_path, monkeypatch):
    p = tmp_path / "x.json"
    p.write_text('{"a": "' + "x" * 200 + '"}')
    monkeypatch.setattr(jsonio, "MAX_JSON_BYTES", 100)
    with pytest.raises(ValueError, match="more than the 100 such a file may have"):
        io_pkg.read_json(p)
    monkeypatch.undo()
    assert io_pkg.read_json(p)["a"] == "x" * 200
