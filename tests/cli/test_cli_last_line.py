"""The command line's last line of defence (issue 33, 4-5): any exception ends in one line
naming the command and the cause (memory exhaustion with the size asked), ``--debug`` keeps the
traceback; bad logits files are named for what they are; an unknown option is reported by its
sub-command with the nearest option and that sub-command's help."""

from __future__ import annotations

import os

import numpy as np
import pytest

from torchcal import posthoc
from torchcal.cli import main
from torchcal.logits_file import save_logits

_ALLOC = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
          "memory: you tried to allocate 3200000000000 bytes. Error code 12 (Cannot allocate "
          "memory)")


def _one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture
def val(tmp_path):
    rng = np.random.default_rng(0)
    return str(save_logits(tmp_path / "val.npz", rng.normal(size=(40, 3)).astype(np.float32),
                           rng.integers(0, 3, 40)))


@pytest.mark.parametrize(("exc", "expected"), [
    (RuntimeError(_ALLOC), "torchcal calibrate: error: out of memory: an array of 2.9 TiB "
                           "(3,200,000,000,000 bytes) was asked for"),
    (MemoryError(), "torchcal calibrate: error: out of memory: an allocation failed"),
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total)"),
     "torchcal calibrate: error: out of memory: an array of 20.00 GiB was asked for"),
    (KeyError("weight"), "torchcal calibrate: error: unexpected KeyError: 'weight' (a bug: run "
                         "again with --debug for the traceback and report it)"),
])
def test_any_exception_is_one_line_naming_command_and_cause(val, monkeypatch, capsys, exc,
                                                            expected):
    """`calibrate --method matrix` at C = 20,000 and `uncertainty fit --width 100000000` ended
    in a RuntimeError traceback (only TorchcalError, OSError and ValueError were caught)."""
    def fit(self, *a, **k):
        raise exc

    monkeypatch.setattr(posthoc.MatrixScaling, "fit", fit)
    assert _one_line(capsys, ["calibrate", val, "--method", "matrix"]).startswith(expected)


def test_debug_keeps_the_traceback(val, monkeypatch):
    def fit(self, *a, **k):
        raise RuntimeError(_ALLOC)

    monkeypatch.setattr(posthoc.MatrixScaling, "fit", fit)
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        main(["calibrate", val, "--method", "matrix", "--debug"])


def test_a_real_allocation_failure_is_one_line(tmp_path, capsys):
    """The real thing, without exhausting memory: a uncertainty head of width 1e12 asks torch
    for terabytes at once, which fails at once."""
    from torchcal.uncertainty import UncertaintyHead

    with pytest.raises(RuntimeError) as info:
        UncertaintyHead(8, width=10 ** 12)
    from torchcal.cli import describe_failure

    msg = describe_failure(info.value)
    assert msg.startswith("out of memory: an array of ") and " TiB (" in msg, msg


def test_non_zip_npz_does_not_echo_numpys_pickle_advice(tmp_path, capsys):
    bad = tmp_path / "val.npz"
    bad.write_text("logits,labels\n1,0\n")
    err = _one_line(capsys, ["calibrate", str(bad)])
    assert "allow_pickle" not in err and "pickle" not in err, err
    assert f"Logits file '{bad}' is not an .npz archive (not a zip archive)" in err, err
    npy = tmp_path / "one.npz"
    np.save(tmp_path / "one.npy", np.zeros(3))
    os.replace(tmp_path / "one.npy", npy)
    assert "(a single .npy array)" in _one_line(capsys, ["calibrate", str(npy)])
    (tmp_path / "empty.npz").write_bytes(b"")
    assert "(an empty file)" in _one_line(capsys, ["calibrate", str(tmp_path / "empty.npz")])


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this system")
def test_link_to_dev_zero_is_not_said_to_be_missing(tmp_path, capsys):
    link = tmp_path / "val.npz"
    link.symlink_to("/dev/zero")
    err = _one_line(capsys, ["calibrate", str(link)])
    assert "does not exist" not in err
    assert "is not a regular file (a directory, FIFO, device or socket)" in err, err
    broken = tmp_path / "gone.npz"
    broken.symlink_to(tmp_path / "nowhere.npz")
    assert "does not exist (a broken symbolic link to" in _one_line(capsys, ["calibrate",
                                                                           str(broken)])


@pytest.mark.parametrize(("argv", "expected"), [
    (["train", "--lossss", "x"],
     "torchcal train: error: Unknown option '--lossss'; did you mean '--loss' or '--loss-arg'? "
     "(see `torchcal train --help`)"),
    (["train", "--recipe", "digits-mlp", "--out", "x", "--lossss", "x"],
     "torchcal train: error: Unknown option '--lossss'; did you mean '--loss' or '--loss-arg'?"),
    (["uncertainty", "fit", "RUN", "--widht", "3"],
     "torchcal uncertainty fit: error: Unknown option '--widht'; did you mean '--width'? "
     "(see `torchcal uncertainty fit --help`)"),
    (["calibrate", "v.npz", "--methd", "nll"],
     "torchcal calibrate: error: Unknown option '--methd'; did you mean '--method'?"),
    (["calibrate", "v.npz", "stray"],
     "torchcal calibrate: error: unexpected argument(s): stray (see `torchcal calibrate --help`)"),
    (["data", "download", "cifar10", "--rot", "x"],
     "torchcal data download: error: Unknown option '--rot'; did you mean '--data-root'?"),
    (["eval", "RUN", "--zzzz"], "torchcal eval: error: Unknown option '--zzzz' (see "
                                "`torchcal eval --help`)"),
])
def test_unknown_options_are_reported_by_their_subcommand(argv, expected, capsys):
    """`torchcal train --lossss x` said "torchcal: error: unrecognized arguments ... (see
    `torchcal --help`)": the wrong program, the wrong help, no suggestion."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err
