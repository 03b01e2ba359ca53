"""The layer rule, checked from the source with ``ast`` so that it stays true.

Imports only point down (a module may import its own layer and the layers below)::

    L6  cli/
    L5  train/  report/  integrations/   (siblings: never importing each other)
    L4  evaluate.py  runs.py
    L3  losses/  posthoc/  uncertainty/
    L2  metrics/  functional/  models/  data/
    L1  errors.py  _validation.py  _io.py  _registry.py

and ``argparse`` is imported only under ``cli/``.  Every import counts, including those inside
functions and ``if TYPE_CHECKING:`` blocks.  The source root can be overridden with the
``TORCHCAL_SRC`` environment variable (e.g. to check another checkout).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

SRC = Path(os.environ.get("TORCHCAL_SRC", Path(__file__).resolve().parents[1] / "src"))
PKG = SRC / "torchcal"

LAYERS = {
    "cli": 6,
    "__main__": 6,
    "train": 5,
    "report": 5,
    "integrations": 5,
    "evaluate": 4,
    "runs": 4,
    "losses": 3,
    "posthoc": 3,
    "uncertainty": 3,
    "metrics": 2,
    "functional": 2,
    "models": 2,
    "data": 2,
    "errors": 1,
    "_validation": 1,
    "_io": 1,
    "_registry": 1,
}
# The package root (``torchcal/__init__.py``) re-exports the library; it sits just under cli/.
ROOT_LAYER = 5.5
# Siblings in one layer that must not import each other (layer 5 only; layers 2 and 3 may).
SIBLINGS_APART = {"train", "report", "integrations"}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def _unit(module: str) -> str | None:
    """The top-level unit of a ``torchcal`` module name (``torchcal.train.cli`` -> ``train``)."""
    parts = module.split(".")
    if parts[0] != "torchcal":
        return None
    return parts[1] if len(parts) > 1 else ""


def _layer(unit: str) -> float:
    if unit == "":
        return ROOT_LAYER
    if unit not in LAYERS:
        raise AssertionError(f"torchcal.{unit} is in no layer; add it to LAYERS in {__file__}")
    return LAYERS[unit]


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """Every module ``module`` imports (absolute names), with line numbers."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "torchcal":  # ``from torchcal import train`` names a sub-package
                subs = [a.name for a in node.names if a.name in LAYERS]
                found += [(node.lineno, f"torchcal.{name}") for name in subs]
                if len(subs) < len(node.names):
                    found.append((node.lineno, target))
            else:
                found.append((node.lineno, target))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant):
                found.append((node.lineno, str(node.args[0].value)))
    return found


def _violations() -> tuple[list[str], list[str]]:
    upward, argparse_uses = [], []
    for module, path in _modules():
        unit = _unit(module)
        layer = _layer(unit)
        rel = path.relative_to(SRC)
        for lineno, target in _imports(module, path):
            if target.split(".")[0] == "argparse" and unit != "cli":
                argparse_uses.append(f"{rel}:{lineno} imports argparse")
            tunit = _unit(target)
            if tunit is None or tunit == unit:
                continue
            if tunit == "":  # ``import torchcal`` / ``from torchcal import x``: the root package
                if unit != "" and layer < ROOT_LAYER:
                    upward.append(f"{rel}:{lineno} ({unit}, L{layer}) imports the torchcal root")
                continue
            tlayer = _layer(tunit)
            if tlayer > layer:
                upward.append(f"{rel}:{lineno} ({unit}, L{layer}) imports {target} (L{tlayer})")
            elif tlayer == layer and {unit, tunit} <= SIBLINGS_APART:
                upward.append(f"{rel}:{lineno} ({unit}) imports its sibling {target}")
    return upward, argparse_uses


def test_source_found():
    mods = dict(_modules())
    assert "torchcal" in mods and "torchcal.errors" in mods, f"no torchcal package under {SRC}"


def test_imports_only_point_down():
    upward, _ = _violations()
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_argparse_only_under_cli():
    _, uses = _violations()
    assert not uses, "argparse outside torchcal/cli/:\n" + "\n".join(uses)


@pytest.mark.parametrize(
    "where, source, expected",
    [
        ("metrics", "from ..train import trainer\n", "imports torchcal.train"),
        ("metrics", "def f():\n    import torchcal.report.build\n", "imports torchcal.report.build"),
        ("metrics", "from .. import cli\n", "imports torchcal.cli"),
        ("report", "from ..train.predict import build_data\n", "its sibling torchcal.train.predict"),
        ("metrics", "import argparse\n", None),
    ],
)
def test_checker_catches_violations(tmp_path, monkeypatch, where, source, expected):
    """The checker itself can fail: an upward import (also inside a function or as ``from ..
    import``), a layer-5 sibling import, and argparse outside cli/."""
    pkg = tmp_path / "torchcal"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    for sub in ("train", "metrics", "report"):
        (pkg / sub).mkdir()
        (pkg / sub / "__init__.py").write_text("")
    (pkg / where / "bad.py").write_text(source)
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    monkeypatch.setitem(globals(), "PKG", pkg)
    upward, uses = _violations()
    if expected is None:
        assert uses == [f"torchcal/{where}/bad.py:1 imports argparse"]
    else:
        assert len(upward) == 1 and expected in upward[0], upward
