"""Run-directory hardening (issue 14): checkpoints verified by SHA-256, crafted checkpoint
fields refused naming the field, stale temp files of a killed run removed, files that respect
the umask, and a model that cannot take the data's inputs refused before anything is written."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch

from torchcal._io.verified import checksum_path
from torchcal.cli import main
from torchcal.errors import CheckpointError
from torchcal.train import get_recipe, train
from torchcal.train.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A 2-epoch digits-mlp run, written under umask 022."""
    run = tmp_path_factory.mktemp("integrity") / "run"
    cfg = dataclasses.replace(get_recipe("digits-mlp"), out_dir=str(run), epochs=2,
                              progress=False, num_threads=1, device="cpu")
    n, old = torch.get_num_threads(), os.umask(0o022)
    try:
        train(cfg)
    finally:
        torch.set_num_threads(n)
        os.umask(old)
    return run


@pytest.fixture()
def run(trained_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(trained_run, dst)
    return dst


def _one_line_error(capsys, argv, *match):
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for m in match:
        assert m in err, err
    return err


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_run_files_respect_the_umask(trained_run):
    files = [p for p in trained_run.rglob("*") if p.is_file()]
    names = {p.relative_to(trained_run).as_posix() for p in files}
    assert {"config.json", "log.jsonl", "results.json", "checkpoints/last.pt",
            "checkpoints/last.pt.sha256", "logits/test.npz"} <= names
    modes = {p.relative_to(trained_run).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in files}
    assert set(modes.values()) == {0o644}, modes


def test_checkpoint_sha256_is_written_and_sha256sum_agrees(trained_run):
    ckpt = trained_run / "checkpoints" / "last.pt"
    side = checksum_path(ckpt).read_text()
    assert side.count("\n") == 1 and side.endswith("  last.pt\n")
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--quiet", "-c", "last.pt.sha256"], cwd=ckpt.parent,
                       check=True)


def _flip_one_weight_bit(path):
    """Flip the lowest bit of the first byte of the model's first weight tensor in the file."""
    state = torch.load(path, weights_only=True)
    w = next(v for k, v in state["model"].items() if k.endswith("weight"))
    data = bytearray(path.read_bytes())
    at = bytes(data).find(w.contiguous().numpy().tobytes()[:256])
    assert at > 0
    data[at] ^= 1
    path.write_bytes(bytes(data))
    flipped = torch.load(path, weights_only=True)  # torch itself does not notice
    assert not torch.equal(next(v for k, v in flipped["model"].items() if k.endswith("weight")), w)


def test_a_flipped_bit_in_last_pt_stops_eval(run, capsys):
    ckpt = run / "checkpoints" / "last.pt"
    before = (run / "results.json").read_bytes()
    _flip_one_weight_bit(ckpt)
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        load_checkpoint(ckpt)
    _one_line_error(capsys, ["eval", str(run)], str(ckpt), "SHA-256")
    assert (run / "results.json").read_bytes() == before  # nothing overwritten
    # resuming from it is refused as well
    cfg = dataclasses.replace(get_recipe("digits-mlp"), out_dir=str(run), epochs=3,
                              progress=False, device="cpu", resume=True, evaluate=False)
    with pytest.raises(CheckpointError, match="last.pt.*SHA-256"):
        train(cfg)


def test_checkpoint_without_sha256_loads_with_a_warning(run):
    ckpt = run / "checkpoints" / "last.pt"
    checksum_path(ckpt).unlink()
    with pytest.warns(UserWarning, match=r"last\.pt.*no last\.pt\.sha256"):
        state = load_checkpoint(ckpt)
    assert state["epoch"] == 2
    save_checkpoint(ckpt, {k: v for k, v in state.items() if k != "format"})  # verified again
    load_checkpoint(ckpt)


def test_a_kill_between_the_writes_leaves_a_verifiable_checkpoint(tmp_path, monkeypatch):
    """save_checkpoint lists the new digest before replacing the file: a kill just before or
    just after the replace leaves a pair that verifies."""
    from torchcal._io import verified as C  # the one writer of verified files (write_verified)

    p = tmp_path / "last.pt"
    save_checkpoint(p, {"model": {}, "epoch": 1, "config": {}})
    real = C.atomic_write_bytes

    def killed(path, data):
        raise KeyboardInterrupt  # the process dies before the checkpoint's rename

    monkeypatch.setattr(C, "atomic_write_bytes", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(p, {"model": {}, "epoch": 2, "config": {}})
    assert checksum_path(p).read_text().count("\n") == 2
    assert load_checkpoint(p)["epoch"] == 1

    calls = []

    def killed_after(path, data):  # the checkpoint is replaced, then the process dies
        calls.append(path)
        real(path, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(C, "atomic_write_bytes", killed_after)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(p, {"model": {}, "epoch": 3, "config": {}})
    assert load_checkpoint(p)["epoch"] == 3


@pytest.mark.parametrize("field,value", [
    ("num_classes", 10 ** 12), ("num_classes", 7), ("num_classes", "10"),
    ("input_shape", [-5]), ("input_shape", "64"), ("epoch", -1),
    ("rng", {"torch": torch.zeros(3, dtype=torch.uint8)}), ("rng", "garbage"),
])
def test_crafted_checkpoint_fields_name_the_field(run, capsys, field, value):
    ckpt = run / "checkpoints" / "last.pt"
    state = load_checkpoint(ckpt)
    state[field] = value
    save_checkpoint(ckpt, {k: v for k, v in state.items() if k != "format"})  # a valid SHA-256
    with pytest.raises(CheckpointError, match=f"invalid '{field}'"):
        load_checkpoint(ckpt)
    _one_line_error(capsys, ["eval", str(run)], str(ckpt), f"'{field}'")


def test_garbage_rng_of_the_right_shape_is_refused_at_resume(run):
    """A torch generator state of the right size but invalid content is found when it is
    restored: CheckpointError naming 'rng', and the global generators stay as they were."""
    from torchcal.train.checkpoint import restore_rng_state, rng_state_tensors

    good = rng_state_tensors()
    bad = dict(good, torch=torch.zeros_like(good["torch"]))
    torch.manual_seed(3)
    expect = torch.rand(2)
    torch.manual_seed(3)
    with pytest.raises(CheckpointError, match="'rng'"):
        restore_rng_state(bad)
    assert torch.equal(torch.rand(2), expect)


@pytest.mark.filterwarnings("ignore:Resuming")
def test_stale_temp_files_are_removed_on_resume(run):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [run / "checkpoints" / ".last.pt.k3x_9abz.tmp",  # mkstemp name of an older version
             run / "checkpoints" / f".best.pt.{dead.pid}-0badf00d.tmp",
             run / f".results.json.{dead.pid}-12345678.tmp",
             run / "logits" / ".test.npz.abcdefgh.tmp"]
    foreign = [run / "checkpoints" / ".notes.txt.abcdefgh.tmp", run / "mine.tmp",
               run / "sub" / ".last.pt.abcdefgh.tmp"]
    for p in stale + foreign:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"\0" * 1000)
    cfg = dataclasses.replace(get_recipe("digits-mlp"), out_dir=str(run), epochs=3,
                              progress=False, device="cpu", resume=True, evaluate=False)
    n = torch.get_num_threads()
    try:
        assert train(cfg)["resumed_from"] == 2
    finally:
        torch.set_num_threads(n)
    assert [p for p in stale if p.exists()] == []
    assert all(p.exists() for p in foreign)
    assert sorted(run.rglob("*.tmp")) == sorted(foreign)


def test_model_that_cannot_take_the_inputs_is_refused_before_writing(tmp_path, capsys):
    out = tmp_path / "r"
    _one_line_error(capsys, ["train", "--recipe", "digits-mlp", "--model", "resnet20",
                             "--epochs", "1", "--no-progress", "--device", "cpu",
                             "--out", str(out)], "'resnet20'", "(64,)", "'digits'")
    assert not out.exists()


def test_full_disk_during_eval_is_one_line_naming_the_file(run, capsys, monkeypatch):
    import errno

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    err = _one_line_error(capsys, ["eval", str(run)], "disk is full",
                          str(run / "logits" / "val.npz"))
    assert "[Errno 28]" in err
    assert not list(run.rglob("*.tmp"))
