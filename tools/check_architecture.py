"""Measure torchcal's architecture rules from the source (``ast`` only; torchcal is not imported).

    python tools/check_architecture.py [SRC]      # SRC defaults to ./src; exit 1 on a violation

It prints one line per rule with its count, then every violation:

1. **layers**: imports only point down (a module may import its own layer and the layers below)::

       L7  cli/
       L6  experiments/
       L5  train/  report/  integrations/   (siblings: never importing each other)
       L4  evaluate.py  logits_file.py  results_file.py  run_dir.py  ensemble.py
       L3  losses/  posthoc/  uncertainty/  regression/  conformal/  plot.py
       L2  metrics/  functional/  models/  data/
       L1  errors.py  _validation.py  _io/  _registry.py  _signals.py

   Every import counts, including those inside functions and ``if TYPE_CHECKING:`` blocks.
2. **argparse** is imported only under ``cli/``.
3. **function length**: no function body is longer than 80 lines (from its first statement,
   docstring included, to its last line).
4. **run-directory names**: each file name of a run directory (``config.json``, ``log.jsonl``,
   ``results.json``, ``checkpoints/last.pt``, ...) appears in one module only,
   ``torchcal/run_dir.py``.  Counted: every string literal (f-string parts included) that holds a
   file name, and every directory name joined with ``/`` or ``joinpath``; not counted:
   docstrings and the ``help=`` / ``description=`` / ``epilog=`` text of the command line
   (and the help lines of ``torchcal --help``, ``cli.COMMAND_HELP``).
5. **deferred imports**: an import inside a function says why it is not at the top of the
   module (an optional dependency, start-up time, a platform) in a comment on its line or
   above it (one comment may head a block of adjacent imports).
6. **private imports**: no module imports a leading-underscore name from another unit of
   torchcal (``from ..functional._common import x``, ``from ..losses.adafocal import _f``,
   ``import torchcal.metrics._common``): a unit's private modules and names are its own, and
   what another unit needs is public there.  The layer-1 modules ``_validation``, ``_io`` and
   ``_registry`` are private to users but shared by every unit, so they are excepted; dunder
   names (``__version__``) are not private.
7. **circular imports**: no module imports, directly or through other modules of its package,
   a module of its own package that imports it back (``train/build.py`` -> ``config.py`` ->
   ``multitask.py`` -> ``build.py``).  Every import counts, those inside functions too (a
   deferred import hides a circle, it does not remove it); a package's ``__init__`` is not
   counted (it re-exports its modules).

8. **private names inside a package**: no module imports a leading-underscore name from
   another module of its own package (``from .trainer import _build``,
   ``from ._loss_utils import _as_index``, ``from ..data.digits import _check_seed``), nor
   reads one through a sibling module it imports (``from . import basic`` then
   ``basic._brier_apply``): what a sibling module needs is public there.  A leading-underscore
   *module* (``functional/_loss_utils.py``, ``data/_base.py``) is its package's shared
   internals: its siblings import it (``from . import _loss_utils``) and its public names
   (``from ._base import split_indices``), never its underscore names.

9. **standard library only**: ``torchcal/errors.py``, ``_registry.py`` and ``_signals.py`` import
   nothing but the standard library and each other, anywhere in the module (the exception
   types and the registries are read by every process, ``torchcal --version`` included).
   The modules of ``torchcal/_io/`` but ``jsonio.py`` (tensors and arrays to JSON: numpy,
   torch) import nothing but the standard library, those two and one another: file handling
   needs no third-party package.  (Importing one of them runs ``_io/__init__.py``, which
   imports ``jsonio``: they are no start-up modules of rule 10.)
10. **start-up imports**: the modules ``torchcal --version`` / ``--help`` load
    (``torchcal/__init__.py``, ``__main__.py``, ``cli/__init__.py``, ``cli/__main__.py``,
    ``cli/_args.py``) import at module level only the standard library, one another and the
    modules of rule 9: a sub-command's module, a benchmark, a data set, torch, scikit-learn or
    matplotlib is imported when a command runs, never to start.
11. **heavy imports**: scikit-learn is imported at module level only under ``cli/`` (the
    library imports it inside the functions that use it, so that a worker that trains and
    evaluates a run never pays its 2 s: isotonic regression, the digits data set); matplotlib
    only inside the functions that draw (never at module level).
12. **config declarations**: the training configuration is declared in one place
    (``torchcal/train/config.py``).  Every field of ``TrainConfig`` and of its plug-in groups
    (the classes it holds with ``plugin(Group)``) is declared with a role helper
    (``identity``/``schedule``/``runtime``) that names its constraint, ``check=``, or is
    ``plugin(...)``; ``TrainConfig.validate`` checks no field by hand (it calls ``check_fields``
    and none of ``check_scalar``, ``Interval``, ``Options``, ``SequenceOf``, ``isinstance`` or
    the constraints the fields declare); and no module under ``cli/`` holds a hand-written
    list of field names (a list, tuple or set literal, or a dict of string-to-string entries,
    nested ones included, whose strings name 3 or more TrainConfig fields): the command line
    reads the fields' ``cli=`` declarations.
13. **exception classes**: every exception and warning class is defined in
    ``torchcal/errors.py`` (and re-exported where it is raised).  A class is one when a base,
    resolved by name, is: a name ending in ``Error``, ``Exception`` or ``Warning``
    (``pickle.UnpicklingError`` too), a built-in exception (``StopIteration``,
    ``KeyboardInterrupt``), a class defined in ``errors.py``, or such a class of the same
    module.  Classes made at run time by ``type(...)`` are not seen: the one torchcal makes
    (the post-hoc calibrators' ``NotFittedError`` that is also scikit-learn's) must, because
    ``errors.py`` imports no scikit-learn.

14. **parameters**: no function takes more than 10 parameters (``self`` / ``cls`` and
    ``*args`` / ``**kwargs`` not counted); a function with more settings takes a frozen options
    object (``build_report(..., options=ReportOptions(...))``, its fields also keywords).
    ``MANY_PARAMETERS`` lists the few excepted, each with its reason.
15. **one unit of work** (issue 49): a run is its ``TrainConfig`` and a sweep's work goes through
    one pack sequence.  (a) A ``Pack`` is constructed only in ``torchcal/train/packs.py``
    (``form_packs``: packs are formed in one place); (b) ``train_lanes`` (the packed engine of
    one pack) is called only from ``torchcal/train/packs.py`` (every pack trains through
    ``train_pack`` or ``train_packed``); (c) no class is named ``RunSpec`` and no parameter or
    return annotation names ``RunSpec`` or is a union of a ``TrainConfig`` and a ``Mapping`` /
    ``dict`` (one configuration type, no two-way signatures); (d) under ``experiments/``,
    ``train_pack`` is called only by the one job function of training runs
    (``torchcal.experiments.training.run_pack_job``) and the uncertainty suite's units, and
    no module there removes or judges a run directory itself (``shutil.rmtree``,
    ``clear_run_dir``, ``is_stale``, ``is_finished``): one locking rule, one staleness rule.
16. **stack protocol**: no module but ``torchcal/train/stacks.py`` uses more of a stack than
    the ``Stack`` protocol declared there (its annotated attributes and its methods): in a
    function, a parameter annotated ``Stack`` (also ``Stack | None``, ``Optional[Stack]``, a
    string) is read only through the protocol's names (``stack.X``, ``getattr(stack, "X")``),
    and so is an attribute of ``self`` a method set from such a parameter (or annotated
    ``Stack``); and no module but ``stacks.py`` tests an object against a class of
    ``stacks.py`` other than a protocol (``isinstance``, ``issubclass``, ``type(x) is C``): the
    engine and the compiled step call the stack's strategies, they do not ask which stack it
    is.  Not seen: a stack reached through an unannotated name or a plain local alias.
17. **one home per name**: a name is imported from the module that defines it, never through
    another module that imported it (``from ..evaluate import load_logits`` where
    ``load_logits`` is ``logits_file.py``'s), and a module's ``__all__`` lists only the names
    it defines.  Excepted: a package's ``__init__.py`` (the package's public face, what it
    re-exports is its API), the facades of ``FACADES`` (``functional/blocks.py``: the loss
    authors' building blocks, public names of the functional package's private modules, and
    ``losses/base.py``'s hyperparameter constraints, whose home ``_validation`` is private), and
    the exception and warning classes of ``errors.py`` that rule 13 re-exports where they are
    raised (listed in ``__all__`` there; imported from ``errors``).  Only names defined at a
    module's top level (``def``, ``class``, assignments) count as defined there.
``tests/test_architecture.py`` runs these checks (and checks that each checker can fail).
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

LAYERS = {
    "cli": 7,
    "__main__": 7,
    "experiments": 6,
    "train": 5,
    "report": 5,
    "integrations": 5,
    "evaluate": 4,
    "logits_file": 4,
    "results_file": 4,
    "run_dir": 4,
    "ensemble": 4,
    "llm": 4,
    "losses": 3,
    "posthoc": 3,
    "uncertainty": 3,
    "regression": 3,
    "conformal": 3,
    "plot": 3,
    "metrics": 2,
    "functional": 2,
    "models": 2,
    "data": 2,
    "errors": 1,
    "_validation": 1,
    "_io": 1,
    "_registry": 1,
    "_signals": 1,
}
# The package root (``torchcal/__init__.py``) re-exports the library; it sits just under
# experiments/ and cli/.
ROOT_LAYER = 5.5
# Siblings in one layer that must not import each other (layer 5 only; layers 2 and 3 may).
SIBLINGS_APART = {"train", "report", "integrations"}
MAX_FUNCTION_LINES = 80
# The run directory's file and directory names, and their one owner.
RUN_FILES = ("config.json", "log.jsonl", "results.json", "results-best.json", "last.pt",
             "best.pt", "head.pt", "val.npz", "test.npz")
RUN_DIRS = ("checkpoints", "logits", "logits-best", "tensorboard", "uncertainty")
RUN_DIR_OWNER = "torchcal.run_dir"
HELP_KEYWORDS = {"help", "description", "epilog", "usage"}
# Module-level names whose strings are command-line help too (the lines of `torchcal --help`).
HELP_NAMES = {"COMMAND_HELP"}
# Private by name, shared by every unit: the layer-1 modules.
SHARED_PRIVATE = {"_validation", "_io", "_registry", "_signals"}
# Rule 9: modules that import the standard library only (and one another).
STDLIB_ONLY = {"torchcal.errors", "torchcal._registry", "torchcal._signals"}
# Rule 9 too: the modules of _io/ that import the standard library, STDLIB_ONLY and one another
# only (jsonio imports numpy and torch).
IO_STDLIB_ONLY = {f"torchcal._io.{m}" for m in ("atomic", "bounded", "links", "lock", "temp",
                                                 "verified")}
# Rule 10: the modules `torchcal --version` loads; at module level they import the standard
# library, one another and STDLIB_ONLY only.
STARTUP = {"torchcal", "torchcal.__main__", "torchcal.cli", "torchcal.cli.__main__",
           "torchcal.cli._args"}
# Rule 11: scikit-learn at module level only from this layer up (cli/); matplotlib never.
SKLEARN_MIN_LAYER = 7
# Rule 12: the module declaring the training configuration, its class, the helpers that
# declare a field, and what validate() must not call (a check written by hand).
CONFIG_MODULE = "torchcal.train.config"
CONFIG_CLASS = "TrainConfig"
ROLE_HELPERS = {"identity", "schedule", "runtime"}
PLUGIN_HELPER = "plugin"
HAND_CHECKS = {"check_scalar", "Interval", "Options", "SequenceOf", "isinstance"}
MAX_FIELD_NAMES_IN_CLI = 2

# Rule 13: the one module that defines exception and warning classes.
ERRORS_MODULE = "torchcal.errors"
EXCEPTION_SUFFIXES = ("Error", "Exception", "Warning")
BUILTIN_EXCEPTIONS = frozenset(name for name, obj in vars(builtins).items()
                               if isinstance(obj, type) and issubclass(obj, BaseException))

# Rule 14: the most parameters a function takes (self/cls, *args and **kwargs not counted),
# and the functions excepted ((module, qualified name) -> why).
MAX_PARAMETERS = 10
#: rule 17: the modules that re-export other modules' names, and which (None: any); a package's
#: ``__init__`` is one by definition.  ``functional/blocks.py``: the loss authors' building
#: blocks, public names of the functional package's private modules; ``losses/base.py``: the
#: hyperparameter constraints a loss class declares (docs/guide/losses.md), whose home,
#: ``_validation``, is private to users.
FACADES: dict[str, frozenset[str] | None] = {
    "torchcal.functional.blocks": None,
    "torchcal.losses.base": frozenset({"Interval", "Options", "SequenceOf"}),
}
STACKS_MODULE = "torchcal.train.stacks"  # rule 16: the Stack protocol and the stacks
STACK_PROTOCOL = "Stack"
MANY_PARAMETERS = {
    ("torchcal.losses.adafocal", "AdaFocalLoss.__init__"):
        "a loss's hyper-parameters are its constructor's keywords, as for every registered "
        "loss: build_loss(name, **kwargs), --loss-kwargs and config.json's loss_kwargs build "
        "it from one dict, checked by _parameter_constraints",
    ("torchcal.metrics.meter", "CalibrationMeter.__init__"):
        "a torchmetrics-style metric: num_classes, n_bins, adaptive and topk are positional "
        "in its public signature, sync_dist/process_group the torchmetrics keywords",
    ("torchcal.plot", "reliability_diagram"):
        "public and keyword-only: logits, probs and labels are one input given two ways, "
        "the rest matplotlib's usual drawing keywords (ax, title, path, legend)",
}

# Rule 15: the module that forms and trains packs, its engine entry, the one job function of
# training runs and the other modules of experiments/ that may call train_pack.
PACKS_MODULE = "torchcal.train.packs"
PACK_CLASS = "Pack"
PACK_ENGINE = "train_lanes"
JOB_FUNCTION = ("torchcal.experiments.training", "run_pack_job")
TRAIN_PACK_CALLERS = {"torchcal.experiments.uncertainty"}
RUN_DIR_JUDGES = {"rmtree", "clear_run_dir", "is_stale", "is_finished"}


def modules(src: Path) -> list[tuple[str, Path]]:
    """``(dotted module name, path)`` of every module of the torchcal package under ``src``."""
    out = []
    for path in sorted((src / "torchcal").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def unit(module: str) -> str | None:
    """The top-level unit of a ``torchcal`` module name (``torchcal.train.cli`` -> ``train``)."""
    parts = module.split(".")
    if parts[0] != "torchcal":
        return None
    return parts[1] if len(parts) > 1 else ""


def layer(u: str) -> float:
    if u == "":
        return ROOT_LAYER
    if u not in LAYERS:
        raise AssertionError(f"torchcal.{u} is in no layer; add it to LAYERS in {__file__}")
    return LAYERS[u]


def from_target(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name of a ``from ... import`` in ``module`` (relative levels
    resolved)."""
    if not node.level:
        return node.module or ""
    is_pkg = path.name == "__init__.py"
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: Path, tree: ast.AST) -> list[tuple[int, str]]:
    """Every module ``module`` imports (absolute names), with line numbers."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = from_target(module, path, node)
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


def layer_violations(module: str, path: Path, tree: ast.AST, rel: Path
                     ) -> tuple[list[str], list[str]]:
    """(upward imports, argparse imports outside cli/) of one module."""
    upward, argparse_uses = [], []
    u = unit(module)
    lay = layer(u)
    for lineno, target in imports(module, path, tree):
        if target.split(".")[0] == "argparse" and u != "cli":
            argparse_uses.append(f"{rel}:{lineno} imports argparse")
        tu = unit(target)
        if tu is None or tu == u:
            continue
        if tu == "":  # ``import torchcal`` / ``from torchcal import x``: the root package
            if u != "" and lay < ROOT_LAYER:
                upward.append(f"{rel}:{lineno} ({u}, L{lay}) imports the torchcal root")
            continue
        tl = layer(tu)
        if tl > lay:
            upward.append(f"{rel}:{lineno} ({u}, L{lay}) imports {target} (L{tl})")
        elif tl == lay and {u, tu} <= SIBLINGS_APART:
            upward.append(f"{rel}:{lineno} ({u}) imports its sibling {target}")
    return upward, argparse_uses


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(module: str, path: Path, tree: ast.AST, rel: Path) -> list[str]:
    """Imports of a leading-underscore module or name of another torchcal unit."""
    u = unit(module)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = from_target(module, path, node)
            pairs = [(target, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            pairs = [(a.name, None) for a in node.names]
        else:
            continue
        for target, name in pairs:
            parts = target.split(".")
            if parts[0] != "torchcal":
                continue
            full = parts[1:] + ([name] if name and name != "*" else [])
            tu = full[0] if full else ""
            if tu == u or tu in SHARED_PRIVATE:
                continue
            bad = [p for p in full if _private(p)]
            if bad:
                shown = f"{target}.{name}" if name else target
                out.append(f"{rel}:{node.lineno} ({u or 'torchcal'}) imports {shown}")
    return out


def private_names_across_modules(module: str, path: Path, tree: ast.AST, rel: Path,
                                 mods: Collection[str]) -> list[str]:
    """Rule 8: leading-underscore names of another module of the same package (``mods``: every
    module name), imported (``from .x import _y``) or read through an imported sibling module
    (``from . import x`` then ``x._y``).  Importing a module, private or not, is no violation."""
    u = unit(module)
    out = []
    siblings: dict[str, str] = {}  # local name -> a module of the package imported whole
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            siblings.update((a.asname, a.name) for a in node.names
                            if a.asname and unit(a.name) == u and a.name != module)
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        target = from_target(module, path, node)
        if unit(target) != u:
            continue
        for a in node.names:
            if f"{target}.{a.name}" in mods:  # a module (``from . import _loss_utils``)
                siblings[a.asname or a.name] = f"{target}.{a.name}"
            elif target != module and _private(a.name):
                out.append(f"{rel}:{node.lineno} ({u}) imports {a.name} from {target}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in siblings and _private(node.attr)):
            out.append(f"{rel}:{node.lineno} ({u}) uses {node.attr} of {siblings[node.value.id]}")
    return out


def long_functions(tree: ast.AST, rel: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions of one module whose body is longer than ``limit`` lines."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.body[0].lineno + 1
            if n > limit:
                out.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return out


def _parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    """The named parameters of ``fn``: ``*args`` and ``**kwargs`` not counted, nor a method's
    first parameter (``self`` / ``cls``)."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    static = any(getattr(d, "id", None) == "staticmethod" for d in fn.decorator_list)
    if in_class and not static and names[:1] and a.posonlyargs + a.args:
        names = names[1:]
    return len(names)


def many_parameters(module: str, tree: ast.AST, rel: Path, limit: int = MAX_PARAMETERS,
                    allowed: Collection[tuple[str, str]] = MANY_PARAMETERS,
                    excepted: set[tuple[str, str]] | None = None) -> list[str]:
    """Rule 14: functions of one module with more than ``limit`` parameters (``allowed``:
    ``(module, qualified name)`` of the excepted, added to ``excepted`` when found)."""
    out = []

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _parameter_count(child, in_class)
                name = f"{prefix}{child.name}"
                if n > limit and (module, name) in allowed and excepted is not None:
                    excepted.add((module, name))
                elif n > limit and (module, name) not in allowed:
                    out.append(f"{rel}:{child.lineno} {name}: {n} parameters (at most {limit}; "
                               "an options object holds the rest)")
                visit(child, f"{name}.<locals>.", False)
            else:
                visit(child, prefix, in_class)

    visit(tree, "", False)
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _strings(tree: ast.AST) -> Iterator[tuple[ast.Constant, ast.AST | None]]:
    """Every string literal with its parent node (f-string parts included), except
    docstrings and command-line help text."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in HELP_KEYWORDS:
                    skip.update(id(n) for n in ast.walk(kw.value))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            names = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)])
                     if isinstance(t, ast.Name)]
            if set(names) & HELP_NAMES:
                skip.update(id(n) for n in ast.walk(node.value))
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if (isinstance(child, ast.Constant) and isinstance(child.value, str)
                    and id(child) not in skip):
                yield child, parent


_FILE_RES = {name: re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])") for name in RUN_FILES}


def run_dir_names(tree: ast.AST) -> dict[str, list[int]]:
    """The run-directory names one module spells out: name -> line numbers."""
    found: dict[str, list[int]] = {}
    for const, parent in _strings(tree):
        for name, rx in _FILE_RES.items():
            if rx.search(const.value):
                found.setdefault(name, []).append(const.lineno)
        if const.value in RUN_DIRS and _is_path_join(const, parent):
            found.setdefault(const.value, []).append(const.lineno)
    return found


def _is_path_join(const: ast.Constant, parent: ast.AST | None) -> bool:
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div):
        return True
    return (isinstance(parent, ast.Call) and const in parent.args
            and getattr(parent.func, "attr", getattr(parent.func, "id", None))
            in {"joinpath", "join", "Path"})


def _stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


def _module_level(tree: ast.AST) -> Iterator[ast.stmt]:
    """The statements run on import: the module's, also inside its ``if`` / ``try`` / ``with``
    blocks, not inside functions or classes."""
    todo = list(getattr(tree, "body", []))
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo += [n for n in getattr(node, field, []) if isinstance(n, ast.AST)]


def import_rules(module: str, path: Path, tree: ast.AST, rel: Path, mods: Collection[str]
                 ) -> dict[str, list[str]]:
    """Rules 9-11 for one module (``mods``: every module name): ``{rule: violations}``."""
    out: dict[str, list[str]] = {"standard library only": [], "start-up imports": [],
                                 "heavy imports": []}
    if module in STDLIB_ONLY or module in IO_STDLIB_ONLY:
        allowed = STDLIB_ONLY | (IO_STDLIB_ONLY if module in IO_STDLIB_ONLY else set())
        for lineno, target in imports(module, path, tree):
            if not (_stdlib(target) or target in allowed):
                out["standard library only"].append(f"{rel}:{lineno} imports {target}")
    top = {id(n) for n in _module_level(tree)}
    u = unit(module)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        targets = [t for _l, t in imports(module, path, ast.Module(body=[node], type_ignores=[]))]
        if isinstance(node, ast.ImportFrom):
            # ``from . import train`` imports the module torchcal.cli.train
            base = from_target(module, path, node)
            targets += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
        for target in targets:
            if id(node) in top and module in STARTUP and not (
                    _stdlib(target) or target in STARTUP or target in STDLIB_ONLY):
                out["start-up imports"].append(f"{rel}:{node.lineno} imports {target} on start")
            root = target.split(".")[0]
            if id(node) in top and root == "matplotlib":
                out["heavy imports"].append(f"{rel}:{node.lineno} imports {target} at module "
                                            "level (only inside the functions that draw)")
            if (id(node) in top and root == "sklearn" and u is not None
                    and layer(u) < SKLEARN_MIN_LAYER):
                out["heavy imports"].append(f"{rel}:{node.lineno} ({u}, L{layer(u)}) imports "
                                            f"{target} at module level (only cli/ may)")
    return out


def _has_reason(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line, or on the line above it or above the block of imports
    it closes (one comment may explain several adjacent imports)."""
    i = lineno - 1
    if "#" in lines[i]:
        return True
    i -= 1
    while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
        i -= 1
    return i >= 0 and lines[i].strip().startswith("#")


def unexplained_deferred_imports(tree: ast.AST, lines: list[str], rel: Path) -> list[str]:
    """Imports inside functions without a comment (on their line or the line above)."""
    out, seen = [], set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in seen:
                seen.add(node.lineno)
                if not _has_reason(lines, node.lineno):
                    out.append(f"{rel}:{node.lineno} in {fn.name}: {lines[node.lineno - 1].strip()}")
    return out


def _package_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of its own package it imports (``__init__`` modules left out)."""
    edges: dict[str, set[str]] = {}
    for module, path in mods.items():
        if path.name == "__init__.py":
            continue
        package = module.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = [t for _line, t in imports(module, path, tree)]
        for node in ast.walk(tree):  # ``from . import name``: the module ``package.name``
            if isinstance(node, ast.ImportFrom):
                base = from_target(module, path, node)
                targets += [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if (t != module and t in mods and mods[t].name != "__init__.py"
                    and t.rsplit(".", 1)[0] == package):
                edges.setdefault(module, set()).add(t)
    return edges


def import_circles(mods: dict[str, Path]) -> list[str]:
    """Each set of modules of one package that import one another in a circle (Tarjan's
    strongly connected components of :func:`_package_edges`), as ``a -> b -> ... -> a``."""
    edges = _package_edges(mods)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[str] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(" -> ".join(sorted(comp) + [min(comp)]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _call_name(node: ast.AST) -> str | None:
    """``f`` of a call ``f(...)`` or ``m.f(...)`` (None: not a call of a name)."""
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return None


def _config_classes(tree: ast.AST) -> dict[str, ast.ClassDef]:
    """TrainConfig and the plug-in group classes it holds (``plugin(Group)``), by name."""
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    if CONFIG_CLASS not in classes:
        return {}
    out = {CONFIG_CLASS: classes[CONFIG_CLASS]}
    for stmt in classes[CONFIG_CLASS].body:
        v = stmt.value if isinstance(stmt, ast.AnnAssign) else None
        if _call_name(v) == PLUGIN_HELPER and v.args and isinstance(v.args[0], ast.Name) \
                and v.args[0].id in classes:
            out[v.args[0].id] = classes[v.args[0].id]
    return out


def config_declarations(tree: ast.AST, rel: Path) -> tuple[list[str], set[str]]:
    """Rule 12 in the config module: the fields declared without ``check=`` and the hand-made
    checks of ``validate``; and every field name (of TrainConfig and its groups)."""
    problems, names, constraints = [], set(), set()
    for cls_name, cls in _config_classes(tree).items():
        for stmt in cls.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            names.add(stmt.target.id)
            helper = _call_name(stmt.value)
            check = [k.value for k in (stmt.value.keywords if helper else []) if k.arg == "check"]
            constraints |= {n.id for c in check for n in ast.walk(c) if isinstance(n, ast.Name)}
            if helper != PLUGIN_HELPER and not (helper in ROLE_HELPERS and check):
                problems.append(f"{rel}:{stmt.lineno} {cls_name}.{stmt.target.id} declares no "
                                "constraint (a role helper with check=)")
    validate = next((f for cls in _config_classes(tree).values() for f in cls.body
                     if isinstance(f, ast.FunctionDef) and f.name == "validate"), None)
    if validate is not None:
        called = {_call_name(n) for n in ast.walk(validate)} - {None}
        hand = sorted(called & (HAND_CHECKS | (constraints - {"UNCHECKED"})))
        if hand:
            problems.append(f"{rel}:{validate.lineno} validate checks fields by hand "
                            f"({', '.join(hand)}): declare the constraint with the field")
        if "check_fields" not in called:
            problems.append(f"{rel}:{validate.lineno} validate does not call check_fields")
    return problems, names


def _listed(node: ast.AST) -> list[str]:
    """The strings a literal lists: the string items of a list, tuple or set, and the keys and
    values of a dict's string-to-string entries (``{"lr": "lr"}``); not a record's keys
    (``{"dataset": config.dataset}``)."""
    if isinstance(node, ast.Dict):
        pairs = [(k, v) for k, v in zip(node.keys, node.values, strict=True)
                 if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)]
        return [c.value for kv in pairs for c in kv if isinstance(c.value, str)]
    return [e.value for e in getattr(node, "elts", [])
            if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def field_name_lists(tree: ast.AST, rel: Path, names: Collection[str]) -> list[str]:
    """Rule 12 under cli/: collection literals naming more than MAX_FIELD_NAMES_IN_CLI
    TrainConfig fields (the outermost such literal, once)."""
    out, inside = [], set()
    kinds = (ast.Dict, ast.List, ast.Tuple, ast.Set)
    for node in ast.walk(tree):  # breadth first: an outer literal before its inner ones
        if not isinstance(node, kinds) or id(node) in inside:
            continue
        found = {v for n in ast.walk(node) if isinstance(n, kinds) for v in _listed(n)} & set(names)
        if len(found) > MAX_FIELD_NAMES_IN_CLI:
            out.append(f"{rel}:{node.lineno} lists TrainConfig fields by hand "
                       f"({', '.join(sorted(found))}): declare cli= with the fields")
            inside |= {id(n) for n in ast.walk(node)}
    return out


def _base_name(node: ast.expr) -> str | None:
    """The name a class base is written with (``ValueError``, ``pickle.UnpicklingError`` ->
    ``UnpicklingError``); None for anything else (``Generic[T]``, a call)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def class_names(tree: ast.AST) -> set[str]:
    """The names of the classes a module defines (anywhere in it)."""
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def exception_classes(tree: ast.AST, rel: Path, known: Collection[str]) -> list[str]:
    """Rule 13: the exception and warning classes one module defines: a base ends in
    :data:`EXCEPTION_SUFFIXES`, is a built-in exception, is in ``known`` (the classes of
    errors.py) or is such a class of this module (followed until nothing changes)."""
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in classes:
            names = {_base_name(b) for b in node.bases} - {None}
            if node.name not in found and any(
                    n.endswith(EXCEPTION_SUFFIXES) or n in BUILTIN_EXCEPTIONS or n in known
                    or n in found for n in names):
                found.add(node.name)
                changed = True
    return [f"{rel}:{node.lineno} defines the exception class {node.name} (define it in "
            "torchcal/errors.py and import it here)" for node in classes if node.name in found]


def _called(node: ast.Call) -> str | None:
    """The called name: ``f`` of ``f(...)`` and of ``mod.f(...)``."""
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _annotation_problem(ann: ast.AST | None) -> str | None:
    """Why an annotation breaks rule 15(c): it names RunSpec, or unions TrainConfig with a
    Mapping or a dict."""
    if ann is None:
        return None
    text = ast.unparse(ann)
    if re.search(r"\bRunSpec\b", text):
        return f"names RunSpec ({text})"
    if re.search(r"\bTrainConfig\b", text) and re.search(r"\b(Mapping|dict|Dict)\b", text) \
            and ("|" in text or "Union" in text):
        return f"takes a TrainConfig or a mapping ({text})"
    return None


def unit_of_work(module: str, tree: ast.AST, rel: Path) -> list[str]:
    """Rule 15 for one module: where packs are made and trained, one configuration type, the
    one job function and the one staleness rule (see the module docstring)."""
    out = []
    in_experiments = unit(module) == "experiments"
    for fn in ast.walk(tree):
        if isinstance(fn, ast.ClassDef) and fn.name == "RunSpec":
            out.append(f"{rel}:{fn.lineno} defines RunSpec (a run is its TrainConfig)")
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            why = _annotation_problem(arg.annotation if arg is not None else None)
            if why:
                out.append(f"{rel}:{fn.lineno} {fn.name}'s parameter {arg.arg} {why}")
        why = _annotation_problem(fn.returns)
        if why:
            out.append(f"{rel}:{fn.lineno} {fn.name} returns a value that {why}")
        if not in_experiments:
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            name = _called(node)
            if name == "train_pack" and (module, fn.name) != JOB_FUNCTION \
                    and module not in TRAIN_PACK_CALLERS:
                out.append(f"{rel}:{node.lineno} {fn.name} calls train_pack (only the job "
                           f"function {JOB_FUNCTION[1]} and the uncertainty suite's units may)")
            if name in RUN_DIR_JUDGES:
                out.append(f"{rel}:{node.lineno} {fn.name} calls {name} (the pack sequence, "
                           "train_pack, owns locking, skipping and clearing a run directory)")
    if module != PACKS_MODULE:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called(node) == PACK_CLASS:
                out.append(f"{rel}:{node.lineno} constructs a Pack (only form_packs, in "
                           f"{PACKS_MODULE}, forms packs)")
            if isinstance(node, ast.Call) and _called(node) == PACK_ENGINE:
                out.append(f"{rel}:{node.lineno} calls {PACK_ENGINE} (a pack trains through "
                           f"{PACKS_MODULE}: train_pack or train_packed)")
    return out


def stack_protocol(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Rule 16, from the stacks module: the names the ``Stack`` protocol declares (annotated
    attributes and methods) and the module's classes that are no protocol (no base named
    ``Protocol``)."""
    members: set[str] = set()
    classes: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        if "Protocol" not in {_base_name(b) for b in node.bases}:
            classes.add(node.name)
        elif node.name == STACK_PROTOCOL:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
    return members, classes


def _is_stack_annotation(node: ast.expr | None) -> bool:
    """``Stack``, ``stacks.Stack``, ``"Stack"``, ``Stack | None``, ``Optional[Stack]``."""
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_stack_annotation(node.left) or _is_stack_annotation(node.right)
    if isinstance(node, ast.Subscript) and _base_name(node.value) == "Optional":
        return _is_stack_annotation(node.slice)
    return _base_name(node) == STACK_PROTOCOL


def _stack_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    return {p.arg for p in params if _is_stack_annotation(p.annotation)}


def _self_stacks(cls: ast.ClassDef) -> set[str]:
    """The attributes of ``self`` that hold a stack in ``cls``: annotated ``Stack``, or set
    from a parameter annotated ``Stack`` (``self.pack = pack``, ``self.pack, self.x = pack,
    x``)."""
    out: set[str] = set()
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = _stack_names(fn)
        for node in ast.walk(fn):
            pairs: list[tuple[ast.expr, ast.expr | None]] = []
            if isinstance(node, ast.AnnAssign) and _is_stack_annotation(node.annotation):
                pairs = [(node.target, None)]
            elif isinstance(node, ast.Assign):
                tgt, val = node.targets[0], node.value
                same = (isinstance(tgt, ast.Tuple) and isinstance(val, ast.Tuple)
                        and len(tgt.elts) == len(val.elts))
                pairs = list(zip(tgt.elts, val.elts, strict=True)) if same else [(tgt, val)]
            for t, v in pairs:
                held = v is None or (isinstance(v, ast.Name) and v.id in names)
                if (held and isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                        and t.value.id == "self"):
                    out.add(t.attr)
    return out


def _reads(node: ast.AST, names: set[str], attrs: set[str]) -> Iterator[tuple[int, str, str]]:
    """``(line, holder, name)`` of every attribute read of a stack under ``node``: ``s.X`` and
    ``getattr(s, "X")`` for ``s`` a name in ``names`` or ``self.A``, ``A`` in ``attrs``."""
    def holder(n: ast.AST) -> str | None:
        if isinstance(n, ast.Name) and n.id in names:
            return n.id
        if (isinstance(n, ast.Attribute) and n.attr in attrs and isinstance(n.value, ast.Name)
                and n.value.id == "self"):
            return f"self.{n.attr}"
        return None
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and holder(n.value):
            yield n.lineno, holder(n.value), n.attr
        elif (isinstance(n, ast.Call) and _call_name(n) == "getattr" and len(n.args) >= 2
              and holder(n.args[0]) and isinstance(n.args[1], ast.Constant)):
            yield n.lineno, holder(n.args[0]), str(n.args[1].value)


def _class_tests(tree: ast.AST, classes: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, class)`` of every ``isinstance``/``issubclass`` against, or ``type(x) is`` /
    ``==`` comparison with, one of ``classes``."""
    for n in ast.walk(tree):
        named: list[ast.expr] = []
        if (isinstance(n, ast.Call) and _call_name(n) in ("isinstance", "issubclass")
                and len(n.args) == 2):
            second = n.args[1]
            named = list(second.elts) if isinstance(second, ast.Tuple) else [second]
        elif (isinstance(n, ast.Compare) and isinstance(n.left, ast.Call)
              and _call_name(n.left) == "type"
              and all(isinstance(op, (ast.Is, ast.Eq, ast.IsNot, ast.NotEq)) for op in n.ops)):
            named = list(n.comparators)
        for c in named:
            if _base_name(c) in classes:
                yield n.lineno, str(_base_name(c))


def stack_boundary(tree: ast.AST, rel: Path, members: Collection[str],
                   classes: Collection[str]) -> list[str]:
    """Rule 16 in one module (not the stacks module): reads of a stack beyond the protocol's
    ``members``, and tests against the stacks module's ``classes``."""
    out = [f"{rel}:{line} tests an object against {name}, a class of torchcal/train/stacks.py "
           "(call the stack's protocol and its strategies instead)"
           for line, name in _class_tests(tree, set(classes))]
    seen: set[tuple[int, str, str]] = set()
    for node in ast.walk(tree):
        attrs = _self_stacks(node) if isinstance(node, ast.ClassDef) else set()
        if attrs:
            seen.update(_reads(node, set(), attrs))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = _stack_names(node)
            if names:
                seen.update(_reads(node, names, set()))
    out += [f"{rel}:{line} reads {holder}.{name}, which the Stack protocol "
            f"(torchcal/train/stacks.py) does not declare"
            for line, holder, name in sorted(seen) if name not in members]
    return out


def _top_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's top-level statements, also those inside a top-level ``if`` / ``try``."""
    for n in body:
        if isinstance(n, ast.If):
            yield from _top_statements(n.body + n.orelse)
        elif isinstance(n, ast.Try):
            yield from _top_statements(n.body + [s for h in n.handlers for s in h.body]
                                       + n.orelse + n.finalbody)
        else:
            yield n


def _defined(tree: ast.Module, imported: bool = False) -> set[str]:
    """Names a module defines at its top level (``def``, ``class``, assignment targets);
    ``imported``: the names its top-level imports bind instead."""
    out: set[str] = set()
    for n in _top_statements(tree.body):
        if imported:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            out.update(e.id for t in targets for e in ast.walk(t) if isinstance(e, ast.Name))
    return out


def _dunder_all(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of the string entries of a module-level ``__all__`` (``=`` / ``+=``)."""
    out = []
    for n in tree.body:
        targets = (n.targets if isinstance(n, ast.Assign) else
                   [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and \
                isinstance(n.value, (ast.List, ast.Tuple)):
            out += [(e.lineno, e.value) for e in n.value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return out


def one_home(mods: dict[str, Path], src: Path) -> list[str]:
    """Rule 17: names imported through a module that is not their home, and ``__all__``
    entries a module does not define."""
    trees = {m: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for m, p in mods.items()}
    defined = {m: _defined(t) for m, t in trees.items()}
    imported = {m: _defined(t, imported=True) - defined[m] for m, t in trees.items()}
    errors = defined.get(ERRORS_MODULE, set())
    facade: dict[str, frozenset[str] | None] = {
        **{m: None for m, p in mods.items() if p.name == "__init__.py"}, **FACADES}
    out = []
    for module, path in mods.items():
        rel, tree = path.relative_to(src), trees[module]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = from_target(module, path, node)
            if target not in mods or (target in facade and facade[target] is None):
                continue
            for alias in node.names:
                if alias.name in imported[target] and alias.name not in facade.get(target, ()):
                    out.append(f"{rel}:{node.lineno} imports {alias.name} through {target}, "
                               "which does not define it: import it from its module")
        if module in facade and facade[module] is None:
            continue
        for line, name in _dunder_all(tree):
            if name not in defined[module] and name not in errors \
                    and name not in facade.get(module, ()):
                out.append(f"{rel}:{line} lists {name} in __all__ but does not define it: "
                           "its users import it from its module")
    return out


def check(src: Path) -> dict[str, list[str]]:
    """Every violation of the rules under ``src``, by rule."""
    out: dict[str, list[str]] = {"layers": [], "argparse": [], "function length": [],
                                 "run-directory names": [], "deferred imports": [],
                                 "private imports": [], "circular imports": [],
                                 "private names inside a package": [],
                                 "standard library only": [], "start-up imports": [],
                                 "heavy imports": [], "config declarations": [],
                                 "exception classes": [],
                                 "parameters": [], "unit of work": [],
                                 "stack protocol": [], "one home per name": []}
    spelled: dict[str, list[str]] = {}
    excepted: set[tuple[str, str]] = set()  # the MANY_PARAMETERS entries that take > 10
    mods = dict(modules(src))
    errors_path = mods.get(ERRORS_MODULE)
    known = class_names(ast.parse(errors_path.read_text(encoding="utf-8"))) if errors_path else ()
    stacks_path = mods.get(STACKS_MODULE)
    protocol, stack_classes = (stack_protocol(ast.parse(stacks_path.read_text(encoding="utf-8")))
                               if stacks_path else (set(), set()))
    for module, path in mods.items():
        rel = path.relative_to(src)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        out["deferred imports"] += unexplained_deferred_imports(tree, text.split("\n"), rel)
        upward, uses = layer_violations(module, path, tree, rel)
        out["layers"] += upward
        out["argparse"] += uses
        out["function length"] += long_functions(tree, rel)
        out["parameters"] += many_parameters(module, tree, rel, allowed=MANY_PARAMETERS,
                                             excepted=excepted)
        for rule, found in import_rules(module, path, tree, rel, mods).items():
            out[rule] += found
        out["private imports"] += private_imports(module, path, tree, rel)
        out["unit of work"] += unit_of_work(module, tree, rel)
        out["private names inside a package"] += private_names_across_modules(
            module, path, tree, rel, mods)
        if module != ERRORS_MODULE:
            out["exception classes"] += exception_classes(tree, rel, known)
        if stacks_path is not None and module != STACKS_MODULE:
            out["stack protocol"] += stack_boundary(tree, rel, protocol, stack_classes)
        if module != RUN_DIR_OWNER:
            for name, lines in run_dir_names(tree).items():
                spelled.setdefault(name, []).append(f"{rel}:{','.join(map(str, lines))}")
    out["circular imports"] = import_circles(mods)
    out["one home per name"] = one_home(mods, src)
    out["config declarations"] = _config_rule(src, mods)
    out["parameters"] += [f"{m}.{name} is excepted in MANY_PARAMETERS but is no function with "
                          f"more than {MAX_PARAMETERS} parameters: remove the entry"
                          for m, name in sorted(set(MANY_PARAMETERS) - excepted) if m in mods]
    for name, where in sorted(spelled.items()):
        out["run-directory names"].append(f"{name!r} outside {RUN_DIR_OWNER}: {'; '.join(where)}")
    return out


def _config_rule(src: Path, mods: dict[str, Path]) -> list[str]:
    """Rule 12: the config module's declarations, then the field-name lists under cli/."""
    path = mods.get(CONFIG_MODULE)
    if path is None:
        return []
    problems, names = config_declarations(ast.parse(path.read_text(encoding="utf-8")),
                                          path.relative_to(src))
    for module, p in mods.items():
        if module.startswith("torchcal.cli.") or module == "torchcal.cli":
            problems += field_name_lists(ast.parse(p.read_text(encoding="utf-8")), names=names,
                                         rel=p.relative_to(src))
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "src"
    if not (src / "torchcal" / "__init__.py").is_file():
        print(f"check_architecture: no torchcal package under {str(src)!r}", file=sys.stderr)
        return 2
    result = check(src)
    for rule, problems in result.items():
        print(f"{rule}: {len(problems)} violation{'' if len(problems) == 1 else 's'}")
    for rule, problems in result.items():
        for p in problems:
            print(f"  [{rule}] {p}")
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
