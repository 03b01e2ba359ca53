"""Tests of the shared foundation: input validation, the loss registry and protocol, the CLI shell."""

import sys

import numpy as np
import pytest
import torch
from torch import nn

from torchcal._validation import (
    as_tensor,
    check_finite,
    check_labels,
    check_nonneg_finite,
    check_positive_int,
    resolve_probs,
)
from torchcal.functional._loss_utils import check_loss_args, reduce_loss, target_log_probs
from torchcal.losses import base
from torchcal.losses._registry import create_loss, list_losses, register_loss


def test_resolve_probs_exactly_one():
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match="exactly one of `logits` or `probs`, got both"):
        resolve_probs(logits=z, probs=z.softmax(1))
    with pytest.raises(ValueError, match="got neither"):
        resolve_probs()


def test_resolve_probs_softmax_and_dtype():
    z = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    p = resolve_probs(logits=z)
    assert p.dtype == torch.float64
    assert torch.allclose(p[1, 0], torch.tensor(np.e / (np.e + 1), dtype=torch.float64))
    ph = resolve_probs(logits=z.half())
    assert ph.dtype == torch.float16
    pn = resolve_probs(logits=np.zeros((2, 4), dtype=np.float32))
    assert torch.equal(pn, torch.full((2, 4), 0.25))


@pytest.mark.parametrize(
    "kwargs, exc, msg",
    [
        ({"probs": torch.tensor([[0.5, 0.6]])}, ValueError, "sum to 1"),
        ({"probs": torch.tensor([[1.5, -0.5]])}, ValueError, r"lie in \[0, 1\]"),
        ({"logits": torch.tensor([[float("nan"), 0.0]])}, ValueError, "finite"),
        ({"logits": torch.tensor([[float("inf"), 0.0]])}, ValueError, "finite"),
        ({"logits": torch.zeros(0, 3)}, ValueError, "non-empty"),
        ({"logits": torch.zeros(3)}, ValueError, "2-D"),
        ({"logits": torch.zeros(3, 1)}, ValueError, "at least 2 classes"),
        ({"logits": torch.zeros(3, 2, dtype=torch.long)}, TypeError, "floating dtype"),
        ({"logits": "abc"}, TypeError, "torch.Tensor or numpy.ndarray"),
    ],
)
def test_resolve_probs_bad_input(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        resolve_probs(**kwargs)


def test_resolve_probs_tolerance_accepts_rounding():
    p = torch.tensor([[0.3333, 0.3333, 0.3334]])
    assert resolve_probs(probs=p) is p


def test_check_labels():
    y = check_labels(np.array([0, 2, 1], dtype=np.int32), n=3, num_classes=3)
    assert y.dtype == torch.int64 and y.tolist() == [0, 2, 1]
    with pytest.raises(TypeError, match="integer dtype"):
        check_labels(torch.tensor([0.0, 1.0]), n=2, num_classes=2)
    with pytest.raises(ValueError, match=r"in \[0, 1\], got values in \[0, 2\]"):
        check_labels(torch.tensor([0, 2]), n=2, num_classes=2)
    with pytest.raises(ValueError, match="have 3 entries"):
        check_labels(torch.tensor([0, 1]), n=3, num_classes=2)
    with pytest.raises(ValueError, match="1-D"):
        check_labels(torch.zeros(2, 2, dtype=torch.long), n=2, num_classes=2)


def test_scalar_checks():
    assert check_positive_int(3, "n_bins") == 3
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="Expected `n_bins` to be a positive integer"):
            check_positive_int(bad, "n_bins")
    assert check_nonneg_finite(0, "gamma") == 0.0
    for bad in (-0.1, float("nan"), float("inf"), None):
        with pytest.raises(ValueError, match="`gamma`"):
            check_nonneg_finite(bad, "gamma")
    with pytest.raises(ValueError, match="2 NaN/Inf"):
        check_finite(torch.tensor([1.0, float("nan"), float("-inf")]), "x")
    assert as_tensor([1, 2], "x").tolist() == [1, 2]


def test_loss_utils_match_cross_entropy():
    torch.manual_seed(0)
    z = torch.randn(5, 4, 3, dtype=torch.float64)
    y = torch.randint(0, 4, (5, 3))
    y[0, 1] = -100
    check_loss_args(z, y, "mean")
    _, log_p_y, _, valid = target_log_probs(z, y, -100)
    for red in ("mean", "sum", "none"):
        ours = reduce_loss(-log_p_y, valid, red)
        ref = nn.functional.cross_entropy(z, y, reduction=red)
        torch.testing.assert_close(ours, ref)
    with pytest.raises(ValueError, match="target` values in"):
        target_log_probs(z, torch.full((5, 3), 4), -100)
    with pytest.raises(ValueError, match="shape"):
        check_loss_args(z, y[:, :2], "mean")
    with pytest.raises(ValueError, match="reduction"):
        check_loss_args(z, y, "avg")
    with pytest.raises(TypeError, match="integer class indices"):
        check_loss_args(z, y.double(), "mean")


def test_loss_utils_bfloat16_computes_in_float32():
    z = torch.randn(4, 3).bfloat16()
    log_p, *_ = target_log_probs(z, torch.tensor([0, 1, 2, 0]))
    assert log_p.dtype == torch.float32


def test_registry_unknown_and_kwargs():
    @register_loss("_test_dummy")
    class Dummy(base.CalibrationLoss):
        def __init__(self, gamma: float = 1.0, *, reduction="mean", ignore_index=-100):
            super().__init__(reduction=reduction, ignore_index=ignore_index)
            self.gamma = gamma

    try:
        assert "_test_dummy" in list_losses("_test_*")
        assert create_loss("_test_dummy", gamma=2.0).gamma == 2.0
        with pytest.raises(TypeError, match="unexpected argument"):
            create_loss("_test_dummy", beta=1)
        with pytest.raises(ValueError, match="Unknown loss 'nope'; expected one of"):
            create_loss("nope")
        with pytest.raises(ValueError, match="already registered"):
            register_loss("_test_dummy")(type("Other", (), {}))
        with pytest.raises(ValueError, match="reduction"):
            Dummy(reduction="avg")
    finally:
        from torchcal.losses import _registry

        _registry.LOSSES.unregister("_test_dummy")


def test_protocol_helpers_on_plain_and_stateful_losses():
    calls = []

    class Stateful(base.CalibrationLoss):
        wants_validation = True

        def set_epoch(self, epoch):
            calls.append(("epoch", epoch))

        def on_validation(self, *, logits, labels):
            calls.append(("val", logits.shape[0]))

    plain = nn.CrossEntropyLoss()
    base.loss_set_epoch(plain, 3)
    base.loss_on_validation(plain, logits=torch.zeros(2, 2), labels=torch.zeros(2, dtype=torch.long))
    assert not base.loss_wants_validation(plain)
    s = Stateful()
    base.loss_set_epoch(s, 1)
    base.loss_on_validation(s, logits=torch.zeros(4, 2), labels=torch.zeros(4, dtype=torch.long))
    assert calls == [("epoch", 1), ("val", 4)]
    assert base.published_reduction(plain) == "sum"


def test_cli_help_and_no_command(capsys):
    from torchcal.cli import main

    assert main([]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert "torchcal" in capsys.readouterr().out


def test_bin_index_compares_float32_values_against_float64_edges_exactly():
    from torchcal.metrics.binning import bin_index

    edge = torch.tensor([0.5 + 2.0**-30], dtype=torch.float64)  # not representable in float32
    v = torch.tensor([0.5], dtype=torch.float32)  # below the edge, but equal to it in float32
    assert bin_index(v, edge).tolist() == [0]
    assert bin_index(v, edge, right_closed=False).tolist() == [0]
    v_up = torch.nextafter(v, torch.tensor(1.0))  # above the edge
    assert bin_index(v_up, edge).tolist() == [1]


def test_calibration_loss_rejects_non_integer_ignore_index():
    with pytest.raises(TypeError, match="Expected `ignore_index` to be an integer, got 'a'"):
        base.CalibrationLoss(ignore_index="a")


def test_package_metadata_as_the_issue_asks():
    # pyproject: Python >= 3.10, the dependencies of DESIGN.md (pillow: JPEG decoding of
    # Tiny-ImageNet, and matplotlib needs it anyway), extras `test` with pytest, hypothesis and
    # torchmetrics, `lightning` and `hf` (transformers + accelerate), MIT licence, ruff settings; py.typed shipped in the package
    import pathlib
    import re

    import torchcal

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (the development machines)
    root = pathlib.Path(__file__).resolve().parents[1]
    cfg = tomllib.loads((root / "pyproject.toml").read_text())
    proj = cfg["project"]
    assert proj["requires-python"] == ">=3.10"

    def names(reqs):
        return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in reqs}

    # + markdown-it-py: report.html rendered from the report's Markdown (issue 26)
    assert names(proj["dependencies"]) == {"torch", "numpy", "scipy", "matplotlib", "tqdm",
                                           "scikit-learn", "pillow", "mnist1d", "markdown-it-py"}
    assert {"pytest", "hypothesis", "torchmetrics"} <= names(proj["optional-dependencies"]["test"])
    assert names(proj["optional-dependencies"]["lightning"]) == {"lightning"}
    assert names(proj["optional-dependencies"]["hf"]) == {"transformers", "accelerate"}
    assert "MIT" in str(proj["license"]) and "MIT License" in (root / "LICENSE").read_text()
    assert cfg["tool"]["ruff"]["target-version"] == "py310"
    assert (pathlib.Path(torchcal.__file__).parent / "py.typed").is_file()
    assert "py.typed" in cfg["tool"]["setuptools"]["package-data"]["torchcal"]


def test_ci_runs_the_readme_test_command_and_fails_with_it(tmp_path):
    # .ci/run installs torch==2.13.0 only when torch is missing, then runs the README's test
    # command under `set -e`, so a failing test fails the script; after it comes only the
    # documentation build (`mkdocs build --strict`, the README's Documentation section) and the
    # built site's browser check (tests/test_docs_site.py, which needs the docs extra)
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    commands = [ln.strip() for b in blocks for ln in b.splitlines()
                if "pytest" in ln and not ln.lstrip().startswith("#")]
    assert commands, "no test command in the README"
    ci = (root / ".ci" / "run").read_text()
    lines = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert "set -euo pipefail" in lines
    assert commands[0] in lines
    after = lines[lines.index(commands[0]) + 1:]
    assert all("mkdocs build --strict" in ln
               or ln == "python -m pytest tests/test_docs_site.py -p no:randomly -q"
               for ln in after), after
    assert any("import torch" in ln and "pip install torch==2.13.0" in ln for ln in lines)
    # the test command installs the optional integrations too (their tests fail in CI without
    # them), with the installed torch held fixed by a constraint generated from its version,
    # in POSIX sh (issue 33: `-c <(...)` needed bash): the constraint is written to a file
    steps = [s.strip() for s in commands[0].split("&&")]
    assert len(steps) == 3 and steps[2] == "python -m pytest -n 2", steps
    assert steps[0].endswith("> torch-pin.txt") and "torch.__version__.split('+')[0]" in steps[0]
    assert steps[1] == 'pip install -e ".[test,lightning,hf]" -c torch-pin.txt', steps
    assert "<(" not in commands[0] and "/torch-pin.txt" in (root / ".gitignore").read_text()
    # dash (POSIX sh, no bash extensions) parses it; its first step writes the pin file
    import shutil
    import subprocess

    sh = shutil.which("dash") or shutil.which("sh")
    assert subprocess.run([sh, "-n", "-c", commands[0]]).returncode == 0
    # the constraint it writes (torch==X.Y.Z, local label dropped) holds the installed build,
    # +cpu included, so pip keeps it instead of fetching another one
    specifiers = pytest.importorskip("packaging.specifiers")
    subprocess.run([sh, "-c", steps[0].replace("python ", f"{sys.executable} ", 1)],
                   cwd=tmp_path, check=True)
    pin = (tmp_path / "torch-pin.txt").read_text().strip()
    assert re.fullmatch(r"torch==[0-9][0-9.]*", pin), pin
    assert specifiers.SpecifierSet(pin[len("torch"):]).contains(torch.__version__)
