"""Griffe extension for torchcal's docstrings (the documentation build's only; nothing imports it).

torchcal's docstrings are Google style (what mkdocstrings parses) with four reStructuredText
habits that Markdown renders badly. For the site only, this extension rewrites:

* a Sphinx role (``:func:`ece```, ``:class:`~torchcal.metrics.CalibrationMeter```) into a
  cross-reference, the name resolved as Python resolves it (the docstring's own object, then its
  parents up to the package, then an absolute dotted path): a link when the object is on a page
  of the site, plain code when it is not (a private helper, an object of another library). A role
  naming a torchcal object that does not exist is logged as a warning, so
  ``mkdocs build --strict`` fails on it;
* a bare doctest block (``>>>`` lines outside an ``Examples:`` section) into a fenced ``pycon``
  block (inside an ``Examples:`` section mkdocstrings does this itself);
* a literal block (a paragraph ending in ``::``) and a ``.. code-block:: LANG`` directive into
  a fenced block, and ``.. math::`` into a display formula;
* a simple table (``=====  =====`` rules) into a Markdown table;

and it reads a ``#:`` comment block right above a module-level constant as the constant's
docstring (Sphinx's convention, which the sources use). A name of a public module's ``__all__``
(a direct child of ``torchcal``, or a module of ``torchcal.integrations``) without a docstring is
logged as a warning: mkdocstrings would leave it out of the API reference silently.
"""

from __future__ import annotations

import builtins
import re
from typing import Any

from griffe import (
    Alias,
    AliasResolutionError,
    CyclicAliasError,
    Docstring,
    Extension,
    Module,
    Object,
    logger,
)

_ROLE = re.compile(r":(?:py:)?(func|class|meth|mod|attr|data|exc|obj):`(~?)([\w.]+)`")
_SECTION = re.compile(r"^(Examples?|Args|Arguments|Parameters|Returns|Raises|Yields|Attributes|"
                      r"Note|Notes|Warning|Warnings|See Also|References)\s*:\s*$")
_RULE = re.compile(r"^(=+)(\s+=+)+\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _lookup(obj: Object | Alias, dotted: str) -> Object | Alias | None:
    """``dotted`` resolved from ``obj``'s scope outward, ``None`` if no object has that name."""
    first, *rest = dotted.split(".")
    scope: Object | Alias | None = obj
    found = None
    while scope is not None:
        try:
            members = scope.all_members  # inherited ones too (a method of a base class)
        except (AliasResolutionError, CyclicAliasError):
            members = scope.members
        if first in members:
            found = members[first]
            break
        scope = scope.parent
    if found is None:
        return None
    for part in rest:
        try:
            members = found.all_members
        except (AliasResolutionError, CyclicAliasError):  # an object of another library
            return found
        if part not in members:
            return None
        found = members[part]
    return found


def _role_to_ref(obj: Object, match: re.Match[str], warn: bool) -> str:
    _, tilde, target = match.groups()
    target = target.lstrip(".")
    shown = target.rsplit(".", 1)[-1] if tilde else target
    found = _lookup(obj, target)
    if found is None and target.startswith("torchcal."):
        root = obj
        while root.parent is not None:
            root = root.parent
        found = _lookup(root, target.split(".", 1)[1]) if root.name == "torchcal" else None
        if found is None and warn:
            logger.warning("%s: docstring of %s names %r, which does not exist",
                           obj.filepath, obj.path, target)
            return f"`{shown}`"
    if found is None:
        if warn and target.split(".", 1)[0] not in dir(builtins) and "." not in target:
            logger.warning("%s: docstring of %s names %r, which is not in its scope",
                           obj.filepath, obj.path, target)
        return f"`{shown}`"
    try:
        path = found.path if not isinstance(found, Alias) else found.final_target.path
    except (AliasResolutionError, CyclicAliasError):  # imported from another library
        return f"`{shown}`"
    if not path.startswith("torchcal"):
        return f"`{shown}`"
    # `optional`: a link when the object is rendered somewhere, plain code when it is not
    return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'


def _parent_line(lines: list[str], i: int, indent: int) -> str | None:
    """The nearest line above ``i`` with less indentation than ``indent``."""
    for j in range(i - 1, -1, -1):
        if lines[j].strip() and _indent(lines[j]) < indent:
            return lines[j]
    return None


def _block_end(lines: list[str], start: int, indent: int, *, stop_at_blank: bool) -> int:
    end = start
    while end < len(lines):
        line = lines[end]
        if not line.strip():
            if stop_at_blank:
                break
            # a literal block goes on past blank lines while the text stays indented
            nxt = next((ln for ln in lines[end:] if ln.strip()), None)
            if nxt is None or _indent(nxt) < indent:
                break
        elif _indent(line) < indent:
            break
        end += 1
    return end


def _fence(lines: list[str], indent: int, lang: str) -> list[str]:
    pad = " " * indent
    body = [ln[indent:] if ln.strip() else "" for ln in lines]
    while body and not body[-1]:
        body.pop()
    return ["", f"{pad}```{lang}", *(pad + b if b else "" for b in body), f"{pad}```", ""]


def _table(lines: list[str], start: int) -> tuple[list[str], int] | None:
    """A reST simple table starting at ``start`` as Markdown rows, and the index after it."""
    rule = lines[start]
    indent = _indent(rule)
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", rule)]
    rows: list[list[str]] = []
    rules = 1
    i = start + 1
    while i < len(lines) and rules < 3:
        line = lines[i]
        if _RULE.match(line.strip()) and _indent(line) == indent:
            rules += 1
        elif line.strip():
            cells = []
            for k, (a, b) in enumerate(spans):
                b = len(line) if k == len(spans) - 1 else spans[k + 1][0]
                cells.append(line[a:b].strip().replace("|", "\\|"))
            rows.append(cells)
        i += 1
    if rules < 3 or not rows:
        return None
    pad = " " * indent
    out = ["", pad + "| " + " | ".join(rows[0]) + " |", pad + "|" + "---|" * len(spans)]
    out += [pad + "| " + " | ".join(r) + " |" for r in rows[1:]]
    return [*out, ""], i


def rewrite(text: str, obj: Object, *, warn: bool = True) -> str:
    """The Markdown form of one docstring (see the module docstring); ``warn``: report roles
    that name nothing (for the objects the site can render)."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if in_fence or stripped.startswith("```"):
            out.append(line)
            i += 1
            continue
        indent = _indent(line)
        if stripped.startswith(">>>"):
            parent = _parent_line(lines, i, indent)
            end = _block_end(lines, i, indent, stop_at_blank=True)
            if parent is not None and re.match(r"^\s*Examples\s*:\s*$", parent):
                out.extend(lines[i:end])  # mkdocstrings' own Examples section ("Example:" is a note)
            else:
                out.extend(_fence(lines[i:end], indent, "pycon"))
            i = end
            continue
        if stripped.startswith(".. math::") and stripped != ".. math::":  # a one-line formula
            pad = " " * indent
            out += ["", pad + "$$", pad + stripped[len(".. math::"):].strip(), pad + "$$", ""]
            i += 1
            continue
        if _RULE.match(stripped) and (table := _table(lines, i)) is not None:
            rows, i = table
            out.extend(rows)
            continue
        code_block = re.match(r"^\.\. (?:code-block|code|sourcecode)::\s*(\w*)\s*$", stripped)
        if (stripped.endswith("::") or code_block) and i + 1 < len(lines):
            body_start = i + 1
            while body_start < len(lines) and not lines[body_start].strip():
                body_start += 1
            if body_start < len(lines) and _indent(lines[body_start]) > indent:
                body_indent = _indent(lines[body_start])
                end = _block_end(lines, body_start, body_indent, stop_at_blank=False)
                body = lines[body_start:end]
                if code_block:  # ".. code-block:: python" and its indented body
                    out.extend(_fence([b[body_indent - indent:] if b.strip() else "" for b in body],
                                      indent, code_block.group(1) or "text"))
                elif stripped == ".. math::":
                    pad = " " * indent
                    out += ["", pad + "$$", *(pad + b.strip() for b in body), pad + "$$", ""]
                else:
                    head = line.rstrip()[:-1]  # "text::" -> "text:"
                    if _SECTION.match(head.strip()):  # "Examples::" is no Google section here
                        head = " " * indent + "**" + head.strip()[:-1] + "**"
                    out.append(head)
                    out.extend(_fence([b[body_indent - indent:] if b.strip() else "" for b in body],
                                      indent, "text"))
                i = end
                continue
        out.append(line)
        i += 1
    text = "\n".join(out)
    return _ROLE.sub(lambda m: _role_to_ref(obj, m, warn), text)


def _comment_docstring(obj: Object) -> None:
    """Give a module-level constant its ``#:`` comment block as docstring (when it has none)."""
    if obj.docstring is not None or not obj.is_attribute or not isinstance(obj.parent, Module):
        return
    lines = obj.lines_collection[obj.filepath] if obj.filepath in obj.lines_collection else None
    if not lines or not obj.lineno:
        return
    block: list[str] = []
    j = obj.lineno - 2
    while j >= 0 and lines[j].strip().startswith("#:"):
        block.insert(0, lines[j].strip()[2:].strip())
        j -= 1
    if block:
        obj.docstring = Docstring("\n".join(block), lineno=j + 2, parent=obj)


def _public_modules(pkg: Module) -> list[Module]:
    """The modules whose ``__all__`` the API reference documents (mirrored by tests/test_docs.py)."""
    mods = []
    for name, member in pkg.members.items():
        if isinstance(member, Module) and not name.startswith("_") and name not in ("cli",
                                                                                  "__main__"):
            mods.append(member)
            if name == "integrations":
                mods += [m for n, m in member.members.items()
                         if isinstance(m, Module) and not n.startswith("_")]
    return mods


def _check_documented(pkg: Module) -> None:
    for mod in _public_modules(pkg):
        for name in mod.exports or ():
            if not isinstance(name, str):
                continue
            member = mod.members.get(name)
            try:
                target = member.final_target if isinstance(member, Alias) else member
            except (AliasResolutionError, CyclicAliasError):
                continue  # re-exported from another library
            if target is not None and target.docstring is None:
                logger.warning("%s: %s.%s is public (in __all__) but has no docstring, so the "
                               "API reference would leave it out", target.filepath, mod.path, name)


def _walk(obj: Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not isinstance(member, Alias):
            yield from _walk(member)


class TorchcalDocstrings(Extension):
    """Rewrite every docstring of the package once it is loaded (see the module docstring)."""

    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        public = tuple(m.path for m in _public_modules(pkg)) if pkg.name == "torchcal" else ()
        for obj in _walk(pkg):
            _comment_docstring(obj)
            if obj.docstring is not None:
                # broken roles are reported where the API reference can show them: the public
                # modules and everything under them (not the command line's modules)
                warn = any(obj.path == p or obj.path.startswith(p + ".") for p in public)
                obj.docstring.value = rewrite(obj.docstring.value, obj, warn=warn)
        if pkg.name == "torchcal":
            _check_documented(pkg)
