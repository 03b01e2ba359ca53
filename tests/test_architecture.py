"""The architecture rules, measured from the source by ``tools/check_architecture.py`` (``ast``
only; its docstring has the layer diagram), so that they stay true: imports only point down the
layers, ``argparse`` only under ``cli/``, no function body over 80 lines, each run-directory file
name in ``torchcal/run_dir.py`` only, every import inside a function says why, no private module or
name of another unit is imported, no package's modules import one another in a circle, and no
module imports a private name of another module of its package; ``errors.py`` and
``_registry.py`` import the standard library only, the command line's entry modules import no
command, torch, scikit-learn or matplotlib to start, scikit-learn is imported at module level only
by the command line and matplotlib only inside functions; every TrainConfig field declares its
constraint, ``validate`` checks no field by hand and the command line lists no field names;
every exception or warning class is defined in ``errors.py`` (and the modules of ``_io/`` but
``jsonio.py`` import the standard library only); no function takes more than 10
parameters (but the few excepted, each with its reason); and no module but
``train/stacks.py`` reads a stack beyond the ``Stack`` protocol or tests which stack it is; a
name is imported from the module that defines it and ``__all__`` lists only its own names.  Each checker is also shown to fail
on a small package written here.

The source root can be overridden with the ``TORCHCAL_SRC`` environment variable (e.g. to check
another checkout).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_architecture",
                                               ROOT / "tools" / "check_architecture.py")
arch = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = arch
_spec.loader.exec_module(arch)

SRC = Path(os.environ.get("TORCHCAL_SRC", ROOT / "src"))


@pytest.fixture(scope="module")
def result():
    return arch.check(SRC)


def test_source_found():
    mods = dict(arch.modules(SRC))
    assert "torchcal" in mods and "torchcal.errors" in mods, f"no torchcal package under {SRC}"
    assert "torchcal.run_dir" in mods


def test_imports_only_point_down(result):
    assert not result["layers"], "imports that point up a layer:\n" + "\n".join(result["layers"])


def test_argparse_only_under_cli(result):
    assert not result["argparse"], "argparse outside cli/:\n" + "\n".join(result["argparse"])


def test_no_function_body_over_80_lines(result):
    assert not result["function length"], "\n".join(result["function length"])


def test_run_directory_names_only_in_runs(result):
    assert not result["run-directory names"], "\n".join(result["run-directory names"])


def test_deferred_imports_say_why(result):
    assert not result["deferred imports"], "\n".join(result["deferred imports"])


def test_no_private_import_across_units(result):
    assert not result["private imports"], "\n".join(result["private imports"])


def test_no_private_name_across_the_modules_of_a_package(result):
    assert not result["private names inside a package"], \
        "\n".join(result["private names inside a package"])


def test_no_circular_imports_inside_a_package(result):
    assert not result["circular imports"], "\n".join(result["circular imports"])


def test_train_config_is_declared_in_one_place(result):
    assert result["config declarations"] == []


_CONFIG_OK = """\
class Group:
    lr: float = identity(0.1, check=POSITIVE)


class TrainConfig:
    epochs: int = schedule(3, check=POSITIVE_INT, cli=Flag("--epochs", "n", type=int))
    group: Group = plugin(Group)

    def validate(self):
        check_fields(self)
        if self.group.lr > self.epochs:  # a cross-field check
            raise ValueError("...")
        return self
"""


@pytest.mark.parametrize("config, cli, expected", [
    (_CONFIG_OK, 'OPTIONS = ("--epochs", "--lr")\nmeta = {"epochs": n, "lr": x, "seed": s}\n',
     None),
    (_CONFIG_OK.replace("identity(0.1, check=POSITIVE)", "identity(0.1)"), "",
     "Group.lr declares no constraint"),
    (_CONFIG_OK.replace("schedule(3, check=POSITIVE_INT, ", "field(default=3, "), "",
     "TrainConfig.epochs declares no constraint"),
    (_CONFIG_OK.replace("        check_fields(self)\n",
                        "        check_fields(self)\n        check_scalar(self.epochs, 'e', int)\n"),
     "", "validate checks fields by hand (check_scalar)"),
    (_CONFIG_OK.replace("        check_fields(self)\n",
                        "        check_fields(self)\n        POSITIVE(self.group.lr, 'lr')\n"),
     "", "validate checks fields by hand (POSITIVE)"),
    (_CONFIG_OK.replace("        check_fields(self)\n", ""), "",
     "validate does not call check_fields"),
    (_CONFIG_OK, '_OVERRIDES = {"epochs": "epochs", "lr": "lr", "group": "group"}\n',
     "cli/x.py:1 lists TrainConfig fields by hand (epochs, group, lr)"),
    (_CONFIG_OK, 'for flag, f in (("a", "epochs"), ("b", "lr"), ("c", "group")):\n    pass\n',
     "cli/x.py:1 lists TrainConfig fields by hand"),
])
def test_config_declarations_are_found(tmp_path, config, cli, expected):
    """Rule 12 can fail: a field of TrainConfig or of a plug-in group without check=, a check
    written in validate (a shared constraint or one the fields declare), a validate that does
    not loop over the declarations, a dict or nested tuples of field names under cli/; a
    record keyed by field names and cross-field checks pass."""
    root = _package(tmp_path, "train", "")
    (root / "torchcal" / "train" / "config.py").write_text(config)
    (root / "torchcal" / "cli" / "x.py").write_text(cli)
    found = {k: v for k, v in arch.check(root).items() if v}
    if expected is None:
        assert found == {}, found
    else:
        assert list(found) == ["config declarations"], found
        assert len(found["config declarations"]) == 1, found
        assert expected in found["config declarations"][0], found


def test_circular_imports_are_found(tmp_path):
    """Two or three modules of one package importing one another (also through a deferred
    import or ``from . import x``) are a circle; imports of another package or the package's
    ``__init__`` are not."""
    root = _package(tmp_path, "train", "from .b import x\n")
    (root / "torchcal" / "train" / "b.py").write_text("def f():\n    from .c import y  # why\n")
    (root / "torchcal" / "train" / "c.py").write_text("from . import bad\n")
    (root / "torchcal" / "train" / "d.py").write_text("from . import b\nfrom .. import errors\n")
    (root / "torchcal" / "train" / "__init__.py").write_text("from .d import z\n")
    got = arch.check(root)["circular imports"]
    assert got == ["torchcal.train.b -> torchcal.train.bad -> torchcal.train.c -> "
                   "torchcal.train.b"], got
    (root / "torchcal" / "train" / "c.py").write_text("from .. import errors\n")
    assert arch.check(root)["circular imports"] == []


def test_no_function_takes_more_than_10_parameters(result):
    assert not result["parameters"], "\n".join(result["parameters"])
    assert all(len(why) > 40 for why in arch.MANY_PARAMETERS.values())  # each says why


_PARAMS = ", ".join(f"p{i}" for i in range(11))


@pytest.mark.parametrize("source, expected", [
    (f"def f({_PARAMS}):\n    pass\n", "bad.py:1 f: 11 parameters"),
    (f"def f(*, {_PARAMS}):\n    pass\n", "f: 11 parameters"),  # keyword-only count
    (f"class C:\n    def m(self, {_PARAMS}):\n        pass\n", "C.m: 11 parameters"),
    (f"class C:\n    @staticmethod\n    def m({_PARAMS}):\n        pass\n", "C.m: 11"),
    (f"def f():\n    def g({_PARAMS}):\n        pass\n", "f.<locals>.g: 11 parameters"),
    (f"async def f(a, /, {_PARAMS[4:]}):\n    pass\n", "f: 11 parameters"),  # positional-only
    ("def f(" + ", ".join(f"p{i}" for i in range(10)) + ", *args, **kw):\n    pass\n", None),
    ("class C:\n    def m(self, " + ", ".join(f"p{i}" for i in range(10)) + "):\n"
     "        pass\n", None),  # self is not counted
])
def test_many_parameters_are_found(tmp_path, source, expected):
    """Rule 12 can fail: 11 parameters, positional, keyword-only or positional-only, in a
    function, a method (self not counted), a static method or a nested function; 10 with
    ``*args`` and ``**kwargs`` pass."""
    found = {k: v for k, v in arch.check(_package(tmp_path, "metrics", source)).items() if v}
    if expected is None:
        assert not found, found
    else:
        assert list(found) == ["parameters"] and len(found["parameters"]) == 1, found
        assert expected in found["parameters"][0], found


def test_an_excepted_function_passes_and_a_stale_exception_is_found(tmp_path, monkeypatch):
    root = _package(tmp_path, "metrics", f"class C:\n    def m(self, {_PARAMS}):\n        pass\n")
    monkeypatch.setattr(arch, "MANY_PARAMETERS", {("torchcal.metrics.bad", "C.m"): "why"})
    assert not arch.check(root)["parameters"]
    (root / "torchcal" / "metrics" / "bad.py").write_text("class C:\n    def m(self):\n"
                                                          "        pass\n")
    got = arch.check(root)["parameters"]
    assert len(got) == 1 and "torchcal.metrics.bad.C.m is excepted" in got[0], got


def test_the_io_modules_but_jsonio_import_the_standard_library_only(tmp_path):
    """Rule 9 for _io/: numpy in lock.py is found (also deferred), torch in jsonio.py, the
    standard library, errors.py and a sibling module in lock.py pass."""
    root = _package(tmp_path, "metrics", "")
    io = root / "torchcal" / "_io"
    io.mkdir()
    for name in ("__init__", "atomic", "jsonio"):
        (io / f"{name}.py").write_text("")
    (io / "jsonio.py").write_text("import numpy\nimport torch\n")
    (io / "lock.py").write_text("import os\nfrom ..errors import E\nfrom .atomic import w\n")
    assert not any(arch.check(root).values())
    (io / "lock.py").write_text("def f():\n    import numpy as np  # why\n")
    got = {k: v for k, v in arch.check(root).items() if v}
    assert list(got) == ["standard library only"] and "lock.py:2 imports numpy" in \
        got["standard library only"][0], got
    assert arch.IO_STDLIB_ONLY < {m for m, _p in arch.modules(SRC)}  # the real modules


def test_script_exit_status(capsys):
    assert arch.main([str(SRC)]) == 0
    out = capsys.readouterr().out
    assert "function length: 0 violations" in out and "run-directory names: 0 violations" in out
    assert arch.main([str(SRC / "nowhere")]) == 2


def _package(tmp_path: Path, where: str, source: str) -> Path:
    pkg = tmp_path / "torchcal"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "run_dir.py").write_text('CONFIG = "config.json"\n')  # the owner may spell the names
    (pkg / "_validation.py").write_text("")
    for sub in ("train", "metrics", "report", "cli"):
        (pkg / sub).mkdir()
        (pkg / sub / "__init__.py").write_text("")
        (pkg / sub / "_own.py").write_text("")  # a private module: the package's internals
    (pkg / where / "bad.py").write_text(source)
    return tmp_path


_LONG = "def f():\n" + "    x = 1\n" * 81
_SHORT = "def f():\n" + "    x = 1\n" * 80


@pytest.mark.parametrize(
    "where, source, rule, expected",
    [
        ("metrics", "from ..train import trainer\n", "layers", "imports torchcal.train"),
        ("metrics", "def f():\n    import torchcal.report.build  # why\n", "layers",
         "imports torchcal.report.build"),
        ("metrics", "from .. import cli\n", "layers", "imports torchcal.cli"),
        ("report", "from ..train.predict import build_data\n", "layers",
         "its sibling torchcal.train.predict"),
        ("metrics", "import argparse\n", "argparse", "bad.py:1 imports argparse"),
        ("metrics", _LONG, "function length", "f: 81 lines"),
        ("metrics", _SHORT, None, None),
        ("report", 'p = run / "results.json"\n', "run-directory names", "'results.json'"),
        ("report", 'msg = f"no {x}/checkpoints/last.pt here"\n', "run-directory names",
         "'last.pt'"),
        ("train", 'ckpt = run / "checkpoints"\n', "run-directory names", "'checkpoints'"),
        ("train", 'kind = "checkpoints"\n', None, None),  # a word, not joined as a path
        ("train", 'def f():\n    """Writes RUN/config.json."""\n', None, None),  # a docstring
        ("cli", 'p.add_argument("--x", help="writes RUN/results.json")\n', None, None),
        ("report", 'name = "results.json.bak"\n', "run-directory names", "'results.json'"),
        ("metrics", "def f():\n    import numpy\n", "deferred imports", "in f: import numpy"),
        ("metrics", "def f():\n    # scipy is slow to import\n    import scipy\n", None, None),
        ("metrics", "def f():\n    import scipy  # slow\n", None, None),
        ("metrics", "def f():\n    # slow\n    import scipy\n    import numpy\n", None, None),
        ("metrics", "def f():\n    # slow\n    import scipy\n\n    import numpy\n",
         "deferred imports", "in f: import numpy"),
        ("train", "from ..metrics._common import top1\n", "private imports",
         "imports torchcal.metrics._common.top1"),
        ("train", "from ..metrics.meter import _gather\n", "private imports",
         "imports torchcal.metrics.meter._gather"),
        ("train", "import torchcal.metrics._common\n", "private imports",
         "imports torchcal.metrics._common"),
        ("train", "def f():\n    from ..metrics import _x  # why\n", "private imports",
         "imports torchcal.metrics._x"),
        ("train", "from .. import _io\n", None, None),  # a layer-1 module: shared
        ("train", "from .._validation import check_scalar\n", None, None),  # layer 1: shared
        ("metrics", "from ._own import x\n", None, None),  # its own unit's private module
        # no module shares a private name with another of its package (rule 8), in any package
        ("train", "from ._own import x\nfrom .other import _y\n",
         "private names inside a package", "imports _y from torchcal.train.other"),
        ("metrics", "from ._own import x\nfrom .other import _y\n",
         "private names inside a package", "imports _y from torchcal.metrics.other"),
        ("metrics", "from ._own import _y\n",  # a private module's underscore name
         "private names inside a package", "imports _y from torchcal.metrics._own"),
        ("metrics", "from . import _x\n",  # a name of the package's __init__, not a module
         "private names inside a package", "imports _x from torchcal.metrics"),
        ("metrics", "from . import _own\n_own._y()\n",  # read through the module
         "private names inside a package", "uses _y of torchcal.metrics._own"),
        ("metrics", "import torchcal.metrics._own as o\no._y()\n",
         "private names inside a package", "uses _y of torchcal.metrics._own"),
        ("metrics", "from . import _own\nfrom ._own import x\n_own.y()\n", None, None),
        ("report", "def f():\n    from ..report._own import y  # why\n", None, None),
        ("train", "def f():\n    from .trainer import _build  # why\n",
         "private names inside a package", "imports _build from torchcal.train.trainer"),
        ("train", "from .other import __all__\n", None, None),  # a dunder
        ("train", "from ..metrics import __version__\n", None, None),  # a dunder
        # exception and warning classes live in errors.py only (rule 12)
        ("metrics", "class Bad(ValueError):\n    pass\n", "exception classes",
         "bad.py:1 defines the exception class Bad"),
        ("train", "class Slow(UserWarning):\n    pass\n", "exception classes", "class Slow"),
        ("train", "import pickle\nclass P(pickle.UnpicklingError):\n    pass\n",
         "exception classes", "bad.py:2 defines the exception class P"),
        ("train", "def f():\n    class Stop(StopIteration):\n        pass\n",
         "exception classes", "class Stop"),  # a built-in exception, inside a function
        ("report", "from ..errors import TorchcalError\nclass Mine(TorchcalError, KeyError):\n"
         "    pass\n", "exception classes", "class Mine"),
        ("metrics", "class CalibrationError(Metric):\n    pass\n", None, None),  # a metric
        ("metrics", "class Meter(Generic[T], Base):\n    pass\n", None, None),
        ("train", "from .run import SGD\nfrom ..run_dir import RunDir\n", None, None),
    ],
)
def test_checker_catches_violations(tmp_path, where, source, rule, expected):
    """Each checker can fail: an upward import (also inside a function or as ``from .. import``),
    a layer-5 sibling import, argparse outside cli/, an 81-line function, a run-directory name
    outside run_dir.py (a literal, an f-string part, a joined directory), a private module or name
    of another unit (also as ``import`` or inside a function), a private name of another module
    of the same package (imported, or read through the imported module; in any package);
    docstrings, help text, plain words, the layer-1 modules, a package's private modules and
    their public names, and dunders pass."""
    result = arch.check(_package(tmp_path, where, source))
    found = {k: v for k, v in result.items() if v}
    if rule is None:
        assert not found, found
    else:
        assert list(found) == [rule] and len(found[rule]) == 1 and expected in found[rule][0], found


def test_no_exception_class_outside_errors(result):
    assert not result["exception classes"], "\n".join(result["exception classes"])


def test_exception_classes_are_resolved_through_errors_and_the_module(tmp_path):
    """A base named in errors.py (whatever its name) or an exception class of the same module
    makes an exception class too; errors.py itself may define them."""
    root = _package(tmp_path, "train", "from ..errors import Oops\nclass Mine(Oops):\n    pass\n"
                    "class Base(KeyboardInterrupt):\n    pass\nclass Child(Base):\n    pass\n"
                    "class Plain:\n    pass\n")
    (root / "torchcal" / "errors.py").write_text("class Oops(Exception):\n    pass\n"
                                                 "class Later(Oops):\n    pass\n")
    found = {k: v for k, v in arch.check(root).items() if v}
    assert list(found) == ["exception classes"], found
    names = [v.split(" exception class ")[1].split()[0] for v in found["exception classes"]]
    assert names == ["Mine", "Base", "Child"], found


def test_standard_library_only_start_up_and_heavy_imports_are_found(tmp_path):
    """Rules 9-11 can fail: a third-party import in errors.py (even deferred), a sub-command
    imported by the CLI's entry module at module level, scikit-learn at module level outside
    cli/, matplotlib at module level; deferred imports of a sub-command, of
    scikit-learn's data sets (with a reason) and of matplotlib pass."""
    root = _package(tmp_path, "metrics", "")
    pkg = root / "torchcal"

    def found(rel: str, source: str) -> dict[str, list[str]]:
        (pkg / rel).write_text(source)
        try:
            return {k: v for k, v in arch.check(root).items() if v}
        finally:
            (pkg / rel).write_text("")

    got = found("errors.py", "def f():\n    from sklearn.exceptions import E  # compat\n")
    assert list(got) == ["standard library only"] and "errors.py:2 imports sklearn" in \
        got["standard library only"][0], got
    assert found("errors.py", "import os\nfrom . import _registry\n") == {}
    (pkg / "cli" / "train.py").write_text("")
    got = found("cli/__init__.py", "import argparse\nfrom . import train\n")
    assert list(got) == ["start-up imports"] and "imports torchcal.cli.train on start" in \
        got["start-up imports"][0], got
    got = found("cli/__init__.py", "import torch\n")
    assert list(got) == ["start-up imports"], got
    assert found("cli/__init__.py", "from .. import errors\n"
                 "def f():\n    from . import train  # the command that runs\n") == {}
    got = found("metrics/x.py", "from sklearn.base import BaseEstimator\n")
    assert list(got) == ["heavy imports"] and "only cli/ may" in \
        got["heavy imports"][0], got
    assert found("metrics/x.py", "def f():\n    import sklearn  # its data sets\n") == {}
    got = found("report/x.py", "from sklearn.base import BaseEstimator\n")
    assert list(got) == ["heavy imports"], got
    assert found("cli/x.py", "from sklearn.base import clone\n") == {}
    got = found("report/x.py", "try:\n    import matplotlib\nexcept ImportError:\n    pass\n")
    assert list(got) == ["heavy imports"] and "matplotlib" in got["heavy imports"][0], got
    assert found("report/x.py", "def f():\n    import matplotlib  # drawing only\n") == {}



def test_one_unit_of_work(result):
    assert not result["unit of work"], "\n".join(result["unit of work"])


@pytest.mark.parametrize(
    "where, name, source, expected",
    [
        ("train", "bad.py", "from .packs import Pack\np = Pack((), ())\n",
         "bad.py:2 constructs a Pack"),
        ("train", "packs.py", "class Pack:\n    pass\np = Pack()\n", None),  # its own module
        ("train", "bad.py", "from .packed import train_lanes\ntrain_lanes([])\n",
         "bad.py:2 calls train_lanes"),
        ("train", "packs.py", "from . import packed\npacked.train_lanes([])\n", None),
        ("train", "bad.py", "class RunSpec:\n    pass\n", "bad.py:1 defines RunSpec"),
        ("train", "bad.py", "def f(spec: 'RunSpec') -> None:\n    pass\n",
         "f's parameter spec names RunSpec"),
        ("train", "bad.py", "def f(c: TrainConfig | Mapping[str, Any]):\n    pass\n",
         "f's parameter c takes a TrainConfig or a mapping"),
        ("train", "bad.py", "def f(c) -> Union[TrainConfig, dict]:\n    pass\n",
         "f returns a value that takes a TrainConfig or a mapping"),
        ("train", "bad.py", "def f(c: TrainConfig, kw: Mapping[str, Any]):\n    pass\n", None),
        ("experiments", "demo.py", "def plan(p):\n    return train_pack(p)\n",
         "demo.py:2 plan calls train_pack"),
        ("experiments", "training.py", "def run_pack_job(s):\n    return train_pack(s)\n", None),
        ("experiments", "uncertainty.py", "def unit(p):\n    return train_pack(p)\n", None),
        ("experiments", "uncertainty.py", "import shutil\ndef unit(d):\n    shutil.rmtree(d)\n",
         "unit calls rmtree"),
        ("experiments", "demo.py", "def f(d, c):\n    return is_stale(d, c)\n",
         "f calls is_stale"),
        ("train", "bad.py", "def f(d, c):\n    return is_stale(d, c)\n", None),  # train/ may
    ],
)
def test_the_unit_of_work_rule_can_fail(tmp_path, where, name, source, expected):
    """Rule 15: a Pack made or trained outside train/packs.py, a RunSpec or a TrainConfig-or-
    mapping signature, train_pack called by another function of experiments/, or a run
    directory removed or judged there, each found once; the allowed places pass."""
    root = _package(tmp_path, "train", "")
    (root / "torchcal" / "train" / "bad.py").unlink()
    pkg = root / "torchcal" / where
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").touch()
    (pkg / name).write_text(source)
    found = arch.check(root)["unit of work"]
    if expected is None:
        assert found == [], found
    else:
        assert len(found) == 1 and expected in found[0], found
def test_no_module_reads_a_stack_beyond_the_protocol(result):
    assert not result["stack protocol"], "\n".join(result["stack protocol"])


_STACKS = """from typing import Protocol
class Stack(Protocol):
    policy: object
    def graph(self): ...
class PackedModel:
    policy = None
    params = {}
    def graph(self): ...
def f(s: Stack):
    return isinstance(s, PackedModel) and s.params  # the stacks module may
"""


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from .stacks import PackedModel\ndef f(s):\n    return isinstance(s, PackedModel)\n",
         "bad.py:3 tests an object against PackedModel"),
        ("from . import stacks\ndef f(s):\n    return issubclass(s, (int, stacks.PackedModel))\n",
         "bad.py:3 tests an object against PackedModel"),
        ("def f(s):\n    return type(s) is PackedModel\n", "bad.py:2 tests an object against"),
        ("def f(stack: Stack):\n    return stack.params\n",
         "bad.py:2 reads stack.params, which the Stack protocol"),
        ("def f(x, *, stack: 'Stack | None' = None):\n    return getattr(stack, 'params')\n",
         "bad.py:2 reads stack.params"),
        ("def f(s: Optional[stacks.Stack]):\n    return s.graph().params, s.opt\n",
         "bad.py:2 reads s.opt"),
        ("class C:\n    def __init__(self, pack: Stack):\n        self.pack, self.n = pack, 1\n"
         "    def g(self):\n        return self.pack.params\n", "bad.py:5 reads self.pack.params"),
        ("class C:\n    def __init__(self, s):\n        self.pack: Stack = s\n"
         "    def g(self):\n        return self.pack.models\n", "bad.py:5 reads self.pack.models"),
        # the protocol's names, a protocol class, other objects and other attributes pass
        ("def f(stack: Stack):\n    return stack.graph().params, stack.policy.stop\n", None),
        ("def f(stack: Stack):\n    return isinstance(stack, Stack)\n", None),
        ("def f(x):\n    return x.params, isinstance(x, PackedModels)\n", None),
        ("class C:\n    def __init__(self, pack: Stack, n):\n        self.pack, self.n = pack, n\n"
         "    def g(self):\n        return self.pack.graph(), self.n.params\n", None),
    ],
)
def test_stack_protocol_violations_are_found(tmp_path, source, expected):
    """Rule 15 can fail: a test against a stack class (``isinstance``, ``issubclass``, in a
    tuple, through the module, ``type(x) is``), a read beyond the protocol of a parameter
    annotated ``Stack`` (also a string, ``| None``, ``Optional``, ``getattr``, keyword-only)
    or of an attribute of ``self`` set from one or annotated ``Stack``; the stacks module
    itself, the protocol's names, the protocol class and other objects pass."""
    root = _package(tmp_path, "train", source)
    (root / "torchcal" / "train" / "stacks.py").write_text(_STACKS)
    found = {k: v for k, v in arch.check(root).items() if v}
    if expected is None:
        assert not found, found
    else:
        assert list(found) == ["stack protocol"] and len(found["stack protocol"]) == 1, found
        assert expected in found["stack protocol"][0], found
    (root / "torchcal" / "train" / "stacks.py").unlink()  # no stacks module: no rule 15
    assert not arch.check(root)["stack protocol"]


def test_every_name_is_imported_from_its_home(result):
    assert not result["one home per name"], "\n".join(result["one home per name"])


@pytest.mark.parametrize(
    "source, expected",
    [
        # a name imported through a module that only imported it
        ("from .home import f\n__all__ = []\n", None),
        ("from .via import f\n", "bad.py:1 imports f through torchcal.metrics.via"),
        ("from torchcal.metrics.via import f, g\n", "imports f through torchcal.metrics.via"),
        ("def h():\n    from .via import f  # why\n", "bad.py:2 imports f through"),
        # __all__ lists only what the module defines
        ("from .home import f\n__all__ = ['f']\n", "bad.py:2 lists f in __all__"),
        ("from .home import f\n__all__ = []\n__all__ += ['f']\n", "bad.py:3 lists f"),
        ("def f():\n    pass\nX = 1\n__all__ = ['f', 'X']\n", None),
        ("try:\n    import numpy\n    Y = 1\nexcept ImportError:\n    Y = 0\n__all__ = ['Y']\n",
         None),
        # what the module defines, a package __init__, a facade and errors' classes pass
        ("from .via import g\n", None),
        ("from . import f\n", None),
        ("from ..functional.blocks import f\n", None),
        ("from ..errors import Oops\n__all__ = ['Oops']\n", None),
    ],
)
def test_one_home_violations_are_found(tmp_path, source, expected):
    """Rule 17 can fail: a name imported through a module that imported it (relative,
    absolute, deferred), an ``__all__`` entry (``=`` or ``+=``) the module does not define;
    the module's own definitions (also inside ``try``), a package ``__init__``, a facade of
    ``FACADES`` and the exception classes of ``errors.py`` pass."""
    root = _package(tmp_path, "metrics", source)
    pkg = root / "torchcal"
    (pkg / "errors.py").write_text("class Oops(Exception):\n    pass\n")
    (pkg / "metrics" / "home.py").write_text("def f():\n    pass\n")
    (pkg / "metrics" / "via.py").write_text("from .home import f\n\n\ndef g():\n    return f\n")
    (pkg / "metrics" / "__init__.py").write_text("from .home import f\n__all__ = ['f']\n")
    (pkg / "functional").mkdir()
    (pkg / "functional" / "__init__.py").write_text("")
    (pkg / "functional" / "blocks.py").write_text("from ..metrics.home import f\n__all__ = ['f']\n")
    found = arch.check(root)["one home per name"]
    if expected is None:
        assert found == [], found
    else:
        assert len(found) == 1 and expected in found[0], found
