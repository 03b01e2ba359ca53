"""The documentation site stays true: every public name is in the API reference, every
``:::`` directive names a real object, every included file exists, every example runs, and
every ``python`` code block of README.md and the pages runs, each on its own in a fresh
namespace (as a reader copies it), with its ``--8<--`` includes expanded as the site shows them.
A block preceded by ``<!-- docs-test: continues -->`` is explicitly chained: it runs after the
block before it, in that block's namespace (one test per chain).  A block preceded by
``<!-- docs-test: skip (reason) -->`` is not run; one preceded by
``<!-- docs-test: requires MODULE ... -->`` is skipped when an optional module is missing,
except in CI, where .ci/run installs every extra and a missing one fails.

The site itself is built by ``mkdocs build --strict`` in ``.ci/run`` (it needs the ``docs``
extra); these checks need nothing beyond the test extra, so they run everywhere.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

import torchcal
from torchcal.logits_file import load_logits

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "torchcal"
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# Top-level modules that are not library API: the command line (documented by its --help and
# the user guide) and ``python -m torchcal``.
NOT_API = {"cli", "__main__"}
# Arguments that keep an example to a few seconds in the test suite (the default is none).
EXAMPLE_ARGS = {"multitask_digits.py": ["--epochs", "3"], "llm_calibration.py": ["--quick"],
                "llm_answers.py": ["--quick"]}


def public_modules() -> list[str]:
    """The modules whose ``__all__`` the API reference documents.

    Every entry of ``torchcal.__all__`` (but ``__version__``), and each module of
    ``torchcal.integrations`` (whose dependencies are optional). The docs' griffe extension
    (docs/_ext/griffe_torchcal.py) applies the same rule.
    """
    mods = [f"torchcal.{n}" for n in torchcal.__all__ if n != "__version__"]
    integrations = SRC / "integrations"
    if integrations.is_dir():
        mods += [f"torchcal.integrations.{p.stem}" for p in sorted(integrations.glob("*.py"))
                 if not p.stem.startswith("_")]
    return mods


def exported_names(module: str) -> list[str]:
    """``module.__all__``: imported, or read from the source for ``torchcal.integrations.*``
    (their frameworks are optional extras, and importing them takes seconds)."""
    if not module.startswith("torchcal.integrations."):
        return list(importlib.import_module(module).__all__)
    path = SRC.joinpath(*module.split(".")[1:]).with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(getattr(t, "id", None) == "__all__" for t in targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no literal __all__")


def directives() -> list[tuple[str, list[str] | None, str]]:
    """Every mkdocstrings ``::: identifier`` of the docs: (identifier, members or None, page)."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^:::\s+([\w.]+)\s*$", line)
            if not m:
                continue
            # the indented YAML options below the directive; only `members` matters here
            members = None
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
                opt = re.match(r"^\s+members:\s*(.*)$", lines[j])
                if opt:
                    value = opt.group(1).strip()
                    if value.startswith("["):
                        members = [v.strip(" '\"") for v in value.strip("[]").split(",") if v.strip()]
                    elif value in ("false", "False", "no"):
                        members = []
                    elif not value:
                        members = []
                        k = j + 1
                        while k < len(lines) and re.match(r"^\s+-\s+", lines[k]):
                            members.append(lines[k].split("-", 1)[1].strip().strip("'\""))
                            k += 1
                j += 1
            found.append((m.group(1), members, str(page.relative_to(ROOT))))
    return found


_DIRECTIVE = re.compile(r"<!-- docs-test: (skip|continues|requires)\b([^>]*)-->")
_INCLUDE = re.compile(r'^(\s*)--8<--\s+"([^"]+)"\s*$')


def expand_includes(code: str) -> str:
    """``--8<-- "path:section"`` lines replaced by the included text, as pymdownx.snippets
    does for the site (base paths: the repository and docs/; sections dedented)."""
    out = []
    for line in code.splitlines():
        m = _INCLUDE.match(line)
        if not m:
            out.append(line)
            continue
        path, _, section = m.group(2).partition(":")
        target = next(base / path for base in (ROOT, DOCS) if (base / path).is_file())
        text = target.read_text(encoding="utf-8")
        if section:
            text = text.split(f"--8<-- [start:{section}]", 1)[1].split(
                f"--8<-- [end:{section}]", 1)[0]
            text = text.split("\n", 1)[1].rsplit("\n", 1)[0]  # the marker lines' own rest
        out.append(textwrap.dedent(text).rstrip("\n"))
    return "\n".join(out)


def code_blocks(page: Path) -> list[tuple[int, str, list[str], bool]]:
    """The runnable ``python`` fences of a page: (line number, code with includes expanded,
    modules required, continues the previous block)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            m = _DIRECTIVE.match(prev.strip())
            kind, arg = (m.group(1), m.group(2)) if m else ("", "")
            if kind != "skip":
                code = expand_includes("\n".join(lines[start:end]))
                blocks.append((start + 1, code, arg.split() if kind == "requires" else [],
                               kind == "continues"))
            i = end
        i += 1
    return blocks


def code_chains(page: Path) -> list[tuple[int, list[tuple[int, str]], list[str]]]:
    """A page's blocks grouped into chains: a block and the ``continues`` blocks after it, as
    (first line, [(line, code)], modules required)."""
    chains: list[tuple[int, list[tuple[int, str]], list[str]]] = []
    for line, code, requires, continues in code_blocks(page):
        if continues:
            assert chains, f"{page.name}:{line}: `continues` with no block before it"
            chains[-1][1].append((line, code))
            chains[-1][2].extend(requires)
        else:
            chains.append((line, [(line, code)], list(requires)))
    return chains


DOC_FILES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
CHAINS = [(page, chain) for page in DOC_FILES for chain in code_chains(page)]


def resolve(identifier: str):
    """The Python object a dotted identifier names (import the longest module prefix)."""
    parts = identifier.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(identifier)


def test_every_top_level_module_is_public_or_excluded():
    """A new sub-package must be added to ``torchcal.__all__`` (and so to the API reference)."""
    names = {m.name for m in pkgutil.iter_modules(torchcal.__path__) if not m.name.startswith("_")}
    unlisted = names - set(torchcal.__all__) - NOT_API - {"integrations"}
    assert not unlisted, f"add {sorted(unlisted)} to torchcal.__all__ or to NOT_API"


@pytest.mark.parametrize("module", public_modules())
def test_every_public_name_is_in_the_api_reference(module):
    names = exported_names(module)
    assert names, f"{module}.__all__ is empty"
    covered: set[str] = set()
    for ident, members, _ in directives():
        if ident == module:
            covered |= set(names if members is None else members)
        elif ident.startswith(module + ".") and ident.count(".") == module.count(".") + 1:
            covered.add(ident.rsplit(".", 1)[1])
    missing = [n for n in names if n not in covered]
    # a name shadowed by its own submodule (``torchcal.data.prepare``) is rendered from the
    # submodule: accept any directive naming the same object
    if missing:
        mod = None if module.startswith("torchcal.integrations.") else importlib.import_module(module)
        if mod is not None:
            objs = {}
            for ident, _, _ in directives():
                try:
                    objs[id(resolve(ident))] = ident
                except (ImportError, AttributeError):
                    pass
            missing = [n for n in missing if id(getattr(mod, n)) not in objs]
    assert not missing, f"not in the API reference (docs/api/): {module}.{missing}"


def test_every_directive_names_a_real_object():
    bad = []
    for ident, _, page in directives():
        module_part = ident.split(".")
        if module_part[:2] == ["torchcal", "integrations"]:
            continue  # optional dependencies; the strict docs build resolves these statically
        try:
            resolve(ident)
        except (ImportError, AttributeError) as exc:
            bad.append(f"{page}: ::: {ident} ({exc})")
    assert not bad, "\n".join(bad)


def test_every_api_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(DOCS).as_posix() for p in sorted((DOCS / "api").glob("*.md"))]
    assert pages
    assert [p for p in pages if p not in nav] == []


def test_every_snippet_include_exists():
    """``--8<--`` includes (the examples, the demo table) point at files and sections that exist."""
    includes = []
    for page in sorted(DOCS.rglob("*.md")):
        for m in re.finditer(r'--8<--\s+"([^"]+)"', page.read_text(encoding="utf-8")):
            includes.append((page, m.group(1)))
    assert includes
    for page, spec in includes:
        path, _, section = spec.partition(":")
        target = next((base / path for base in (ROOT, DOCS) if (base / path).is_file()), None)
        assert target is not None, f"{page.name} includes a missing file {path}"
        if section:
            text = target.read_text(encoding="utf-8")
            assert f"--8<-- [start:{section}]" in text and f"--8<-- [end:{section}]" in text, \
                f"{page.name} includes a missing section {spec}"


@pytest.mark.parametrize("page, chain", CHAINS, ids=[
    f"{page.relative_to(ROOT).as_posix()}:{chain[0]}" for page, chain in CHAINS])
def test_code_block_runs(page, chain, tmp_path, monkeypatch):
    """Each block (with the blocks it explicitly continues) runs on its own, in a fresh
    namespace and an empty working directory."""
    monkeypatch.chdir(tmp_path)  # blocks may write files (run directories, caches)
    _first, blocks, requires = chain
    for module in requires:
        if os.environ.get("CI"):
            importlib.import_module(module)
        else:
            pytest.importorskip(module, reason=f"{page.name} needs the optional {module}")
    namespace: dict = {"__name__": "__docs__"}
    for line, code in blocks:
        exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)


def test_readme_and_every_page_with_python_have_blocks_collected():
    """The collector sees README.md's tour, the getting-started page's first block (an
    include) and a chained block, so a change of syntax cannot silently drop them."""
    pages = {p.relative_to(ROOT).as_posix() for p, _ in CHAINS}
    assert {"README.md", "docs/getting-started.md", "docs/guide/metrics.md"} <= pages
    first = code_chains(DOCS / "getting-started.md")[0][1][0][1]
    assert "--8<--" not in first and "load_logits(" in first
    fences = sum(p.read_text(encoding="utf-8").count("```python") for p in DOC_FILES)
    skipped = sum(p.read_text(encoding="utf-8").count("<!-- docs-test: skip") for p in DOC_FILES)
    assert sum(len(c[1]) for _, c in CHAINS) == fences - skipped


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script, tmp_path):
    """Every script under examples/ runs as a user would run it (a fresh interpreter)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                          os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(script), *EXAMPLE_ARGS.get(script.name, [])],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip(), f"{script.name} printed nothing"


def test_calibrate_in_five_lines_finds_the_temperature():
    """The Getting started example: labels follow softmax(z / 2.5), so T is about 2.5 and the
    test ECE drops (checked against the metric computed here independently of the example)."""
    spec = importlib.util.spec_from_file_location("calibrate_example",
                                                  ROOT / "examples" / "calibrate_in_five_lines.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main([])
    assert out["temperature"] == pytest.approx(2.5, abs=0.3)
    assert out["ece_before"] > 0.2 and out["ece_after"] < 0.05
    # ECE from its definition on the example's own test logits (15 equal-width bins)
    with tempfile.TemporaryDirectory() as tmp:
        mod.write_overconfident_logits(Path(tmp))
        z, y = (torch.as_tensor(a) for a in load_logits(Path(tmp) / "test.npz"))
    p = torch.softmax(z.double(), 1)
    conf, pred = p.max(1)
    bins = torch.clamp(torch.ceil(conf * 15).long() - 1, 0, 14)
    gap = sum(abs((pred[bins == b] == y[bins == b]).double().sum() - conf[bins == b].sum())
              for b in range(15)) / len(y)
    assert out["ece_before"] == pytest.approx(gap.item(), abs=1e-5)
