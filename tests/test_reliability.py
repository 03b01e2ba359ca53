"""Reliability under attack (issue 42): nothing of the user's lost, nothing edited believed.

The file-system attacks run in a temporary tree: a lock file or a run directory that is a
symbolic link, stale run directories holding a user's files, FIFOs, directories and /dev/zero
where torchcal expects its files, checkpoints carrying pickled code, NaN weights, edited or
moved results and logits, over-large ``.npz`` archives.  One tiny run (2 epochs of the
digits MLP, a few seconds) is trained once and copied for each test."""

from __future__ import annotations

import io
import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from torchcal import errors
from torchcal._io import LOCK_NAME, exclusive_lock
from torchcal.cli import main
from torchcal.errors import CheckpointError, InUseError
from torchcal.experiments.training import benchmark_config, run_pack_job
from torchcal.train.checkpoint import load_checkpoint, save_checkpoint
from torchcal.train.packs import RunOutcome, form_packs

pytestmark = [pytest.mark.filterwarnings("ignore:OOD set"),
              pytest.mark.skipif(os.name != "posix", reason="POSIX links, FIFOs and devices")]


def _spec(run_dir, loss="ce", seed=0, epochs=2):
    return benchmark_config("digits-mlp", loss=loss, seed=seed, epochs=epochs,
                            run_dir=str(run_dir))


def run_job(config, *more):
    """The runs as the demo's job function trains them (one pack): the first run's outcome as
    a dict, or the job's own error."""
    (pack,) = form_packs([config, *more], max_lanes=1 + len(more))
    res = run_pack_job({"pack": pack})
    return res if res["error"] else RunOutcome.from_json(res["outcomes"][0]).to_json()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Finished 2-epoch runs of ce and focal (seed 0), as the demo's sweep writes them."""
    root = tmp_path_factory.mktemp("reliability")
    n = torch.get_num_threads()
    try:
        for loss in ("ce", "focal"):
            r = run_job(_spec(root / loss, loss))
            assert r["error"] is None, r.get("traceback")
    finally:
        torch.set_num_threads(n)
    return root


@pytest.fixture()
def runs(trained, tmp_path):
    dst = tmp_path / "runs"
    shutil.copytree(trained, dst)
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


# --- 1. a lock file that is a link: its target is never truncated -------------------------
def test_a_linked_lock_file_is_refused_and_its_target_kept(runs, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    (runs / "ce" / LOCK_NAME).symlink_to(notes)
    _one_line_error(capsys, ["eval", str(runs / "ce")], "symbolic link", LOCK_NAME)
    assert notes.read_text() == "my notes\n"
    with pytest.raises(errors.UnsafePathError, match="symbolic link"):
        with exclusive_lock(runs / "ce"):
            pass
    assert notes.read_text() == "my notes\n"


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory"])
def test_a_lock_file_that_is_no_file_is_named(tmp_path, kind):
    d = tmp_path / "run"
    d.mkdir()
    lock = d / LOCK_NAME
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "dev_zero":
        lock.symlink_to("/dev/zero")
    else:
        lock.mkdir()
    expected = {"fifo": "FIFO", "dev_zero": "symbolic link", "directory": "a directory"}[kind]
    with pytest.raises(errors.UnsafePathError, match=expected) as info:
        with exclusive_lock(d):
            pass
    assert "Errno" not in str(info.value) and LOCK_NAME in str(info.value)


def test_a_busy_lock_names_the_holder_without_errno(tmp_path):
    import subprocess
    import sys
    d = tmp_path / "run"
    code = ("import sys, time; from torchcal._io import exclusive_lock\n"
            "with exclusive_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(30)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(InUseError) as info:
            with exclusive_lock(d, what="Demo directory"):
                pass
        msg = str(info.value)
        assert "Errno" not in msg and f"process {p.pid} (-c " in msg, msg
    finally:
        p.kill()
        p.wait()


# --- 2. a run directory that is a link: its target is not emptied -------------------------
def test_a_linked_run_directory_is_refused_and_its_target_kept(runs, tmp_path):
    user = tmp_path / "mine"
    (user / "checkpoints").mkdir(parents=True)
    (user / "precious.txt").write_text("keep me")
    (user / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    shutil.rmtree(runs / "ce")
    (runs / "ce").symlink_to(user, target_is_directory=True)
    res = run_job(_spec(runs / "ce"))
    assert res["error"] is not None and "symbolic link" in res["error"], res
    assert sorted(p.name for p in user.rglob("*")) == ["checkpoints", "last.pt", "precious.txt"]
    assert (user / "precious.txt").read_text() == "keep me"


# --- 3. a stale run directory keeps the files torchcal did not write ----------------------
def test_a_stale_run_keeps_the_users_files_and_names_them(runs):
    run = runs / "ce"
    (run / "notes.txt").write_text("mine")
    (run / "analysis").mkdir()
    (run / "analysis" / "plot.py").write_text("print(1)")
    (run / "logits" / "mine.csv").write_text("a,b")
    with pytest.warns(UserWarning, match=r"kept 3 files torchcal did not write") as rec:
        res = run_job(_spec(run, epochs=3))  # other settings: stale, trained afresh
    assert res["error"] is None, res.get("traceback")
    assert not res["skipped"]
    assert "notes.txt" in str(rec[0].message) and "analysis/" in str(rec[0].message)
    assert (run / "notes.txt").read_text() == "mine"
    assert (run / "analysis" / "plot.py").read_text() == "print(1)"
    assert (run / "logits" / "mine.csv").read_text() == "a,b"
    assert json.loads((run / "results.json").read_text())["meta"]["epoch"] == 3


def test_a_corrupt_checkpoint_of_an_unfinished_run_says_it_is_retrained(runs):
    run = runs / "ce"
    (run / "results.json").unlink()  # unfinished
    (run / "notes.txt").write_text("mine")
    ckpt = run / "checkpoints" / "last.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    (run / "checkpoints" / "last.pt.sha256").unlink()
    with pytest.warns(UserWarning, match=r"retrained from epoch 0.*kept 1 file torchcal"):
        res = run_job(_spec(run))
    assert res["error"] is None, res.get("traceback")
    assert (run / "notes.txt").read_text() == "mine"
    assert load_checkpoint(ckpt)["epoch"] == 2


def test_clearing_a_run_never_follows_links_inside_it(runs, tmp_path):
    from torchcal.train.packs import clear_run_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "last.pt").write_bytes(b"user's")
    run = runs / "ce"
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(outside, target_is_directory=True)
    (run / "results.json").unlink()
    (run / "results.json").symlink_to(outside / "last.pt")
    with pytest.warns(UserWarning, match="kept 2 files"):
        clear_run_dir(run)
    assert (outside / "last.pt").read_bytes() == b"user's"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "results.json"]


# --- 4. eval of NaN weights replaces nothing -----------------------------------------------
def test_eval_of_nan_weights_leaves_the_run_as_it_was(runs, capsys):
    run = runs / "ce"
    ckpt = run / "checkpoints" / "last.pt"
    state = load_checkpoint(ckpt)
    state["model"] = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                      for k, v in state["model"].items()}
    state.pop("format")
    save_checkpoint(ckpt, state)  # a matching .sha256: only the numbers are wrong
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()
              and not p.name.endswith(".pt") and not p.name.endswith(".pt.sha256")}
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    after = {p: p.read_bytes() for p in before}
    assert after == before
    assert not [p for p in run.rglob("*.tmp")]


# --- 15/16. a checkpoint that is no file, or carries code, is named for what it is ---------
@pytest.mark.parametrize("kind,expected", [
    ("fifo", "is a FIFO"), ("directory", "is a directory"),
    ("dev_zero", "is a character device (through a symbolic link to '/dev/zero')"),
    ("missing", "does not exist"),
])
def test_a_checkpoint_that_is_no_file_is_named(runs, capsys, kind, expected):
    ckpt = runs / "ce" / "checkpoints" / "last.pt"
    ckpt.unlink()
    if kind == "fifo":
        os.mkfifo(ckpt)
    elif kind == "directory":
        ckpt.mkdir()
    elif kind == "dev_zero":
        ckpt.symlink_to("/dev/zero")
    _one_line_error(capsys, ["eval", str(runs / "ce")], expected)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_checkpoint_holding_code_is_refused_without_unsafe_advice(runs, capsys):
    ckpt = runs / "ce" / "checkpoints" / "last.pt"
    (runs / "ce" / "checkpoints" / "last.pt.sha256").unlink()
    buf = io.BytesIO()
    torch.save({"format": "torchcal.checkpoint/1", "model": _Payload()}, buf)
    ckpt.write_bytes(buf.getvalue())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        err = _one_line_error(capsys, ["eval", str(runs / "ce")], "holds Python code",
                              "posix.system")
    assert "weights_only" not in err and "corrupt" not in err, err


def test_a_checkpoint_past_its_epochs_is_refused(runs):
    ckpt = runs / "ce" / "checkpoints" / "last.pt"
    state = load_checkpoint(ckpt)
    state.pop("format")
    state["epoch"] = 10 ** 12
    save_checkpoint(ckpt, state)
    with pytest.raises(CheckpointError, match=r"invalid 'epoch': expected at most the config's 2"):
        load_checkpoint(ckpt)


# --- 5/6. an edited or moved results.json or logits file is refused, or recomputed ---------
def _edit_json(path, fn):
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def test_results_and_logits_carry_sha256_sidecars(runs):
    from torchcal.results_file import read_results
    run = runs / "ce"
    assert (run / "results.json.sha256").is_file()
    assert sorted(p.name for p in (run / "logits").glob("*.sha256")) == [
        "ood_digits_ood.npz.sha256", "test.npz.sha256", "val.npz.sha256"]
    res = read_results(run)
    assert set(res["logits_sha256"]) == {"val", "test", "ood_digits_ood"}


def test_an_edited_results_file_is_refused_then_recomputed_by_the_sweep(runs):
    from torchcal.results_file import read_results
    run = runs / "ce"
    original = (run / "results.json").read_bytes()
    _edit_json(run / "results.json", lambda d: d["test"]["pre"].update(ece=0.0005, error=0.01))
    with pytest.raises(errors.ResultsFileError, match=r"edited after torchcal wrote it; refused"):
        read_results(run)
    with pytest.warns(UserWarning, match=r"edited after torchcal wrote it: recomputed"):
        res = run_job(_spec(run))
    assert res["error"] is None and not res["skipped"], res
    assert (run / "results.json").read_bytes() == original  # bit for bit


def test_a_results_file_copied_from_another_run_is_refused_then_recomputed(runs):
    from torchcal.results_file import read_results
    ce, focal = runs / "ce", runs / "focal"
    original = (ce / "results.json").read_bytes()
    for name in ("results.json", "results.json.sha256"):
        shutil.copy(focal / name, ce / name)
    with pytest.raises(errors.ResultsFileError, match=r"says loss 'focal' .* another run"):
        read_results(ce)
    with pytest.warns(UserWarning, match=r"another run: recomputed"):
        assert run_job(_spec(ce))["error"] is None
    assert (ce / "results.json").read_bytes() == original


@pytest.mark.parametrize("with_sidecar", [False, True])
def test_logits_copied_from_another_run_are_refused(runs, with_sidecar):
    from torchcal.logits_file import load_logits
    from torchcal.results_file import read_results
    ce, focal = runs / "ce", runs / "focal"
    shutil.copy(focal / "logits" / "test.npz", ce / "logits" / "test.npz")
    if with_sidecar:
        shutil.copy(focal / "logits" / "test.npz.sha256", ce / "logits" / "test.npz.sha256")
        load_logits(ce / "logits" / "test.npz")  # consistent with its sidecar ...
        with pytest.raises(errors.ResultsFileError, match=r"computed from other logits"):
            read_results(ce)  # ... but not with the results beside it
    else:
        with pytest.raises(errors.ResultsFileError, match=r"test.npz' does not match its SHA-256"):
            load_logits(ce / "logits" / "test.npz")


def test_old_runs_without_sidecars_still_read(runs):
    from torchcal.logits_file import load_logits
    from torchcal.results_file import read_results
    run = runs / "ce"
    for p in run.rglob("*.sha256"):
        if not p.name.endswith(".pt.sha256"):
            p.unlink()
    _edit_json(run / "results.json", lambda d: d.pop("logits_sha256"))
    assert read_results(run)["n"]["test"] > 0
    assert load_logits(run / "logits" / "test.npz")[0].ndim == 2


# --- 10. impossible metadata is refused ------------------------------------------------------
@pytest.mark.parametrize("edit,match", [
    (lambda d: d["temperatures"].update(grid_ece=1e30), r"temperatures\['grid_ece'\]"),
    (lambda d: d["n"].update(test=-5), r"n\['test'\] .* non-negative integer, got -5"),
])
def test_impossible_results_metadata_is_refused(runs, edit, match):
    from torchcal.results_file import read_results
    run = runs / "ce"
    (run / "results.json.sha256").unlink()  # reach the range checks
    _edit_json(run / "results.json", edit)
    with pytest.raises(errors.ResultsFileError, match=match):
        read_results(run)


# --- 9. calibrate refuses test logits of another classifier ---------------------------------
def test_calibrate_refuses_test_logits_of_other_classes(tmp_path, capsys):
    from torchcal.logits_file import save_logits
    rng = np.random.default_rng(0)
    save_logits(tmp_path / "val.npz", rng.normal(size=(40, 5)), rng.integers(0, 5, 40))
    save_logits(tmp_path / "test.npz", rng.normal(size=(40, 10)), rng.integers(0, 10, 40))
    out = tmp_path / "calib.json"
    _one_line_error(capsys, ["calibrate", str(tmp_path / "val.npz"), "--test",
                             str(tmp_path / "test.npz"), "--out", str(out)],
                    "the 5 classes", "got 10")
    assert not out.exists()


# --- 11. bounded .npz reads ------------------------------------------------------------------
def _bomb(path, n):
    """A deflated .npz whose logits member declares ``n`` float32 zeros (n * 4 bytes)."""
    import zipfile
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (n // 4, 4)})
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("logits.npy", "w", force_zip64=True) as f:
            f.write(header.getvalue())
            chunk = bytes(1 << 20)
            for _ in range(n * 4 // len(chunk)):
                f.write(chunk)
        buf = io.BytesIO()
        np.save(buf, np.zeros(n // 4, dtype=np.int64))
        zf.writestr("labels.npy", buf.getvalue())


def test_a_deflated_npz_bomb_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    from torchcal import logits_file
    from torchcal.logits_file import load_logits
    monkeypatch.setattr(logits_file, "NPZ_RATIO_FROM", 1 << 20)  # the campaign's was 8 GB
    bomb = tmp_path / "bomb.npz"
    _bomb(bomb, 4 << 20)  # 16 MiB of zeros in ~16 KiB
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(errors.ResultsFileError, match=r"bomb.npz' member 'logits.npy' expands"):
        load_logits(bomb)
    _one_line_error(capsys, ["calibrate", str(bomb)], "bomb.npz", "expands")


def test_an_npz_header_declaring_more_than_it_holds_is_refused(tmp_path):
    import zipfile

    from torchcal.logits_file import load_logits
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10 ** 9, 1000)})
    p = tmp_path / "liar.npz"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("logits.npy", header.getvalue() + bytes(16))
        zf.writestr("labels.npy", header.getvalue())
    with pytest.raises(errors.ResultsFileError,
                       match=r"liar.npz' member 'logits.npy' declares .*4,000,000,000,000 bytes"):
        load_logits(p)


# --- 8. report: a copied run is no second seed; runs of other n_bins are named ---------------
def test_report_skips_a_copied_run_and_a_run_of_other_n_bins(runs):
    from torchcal.evaluate import evaluate_saved_logits
    from torchcal.report.aggregate import group_runs, load_runs
    shutil.copytree(runs / "ce", runs / "ce_copy")
    shutil.copytree(runs / "focal", runs / "focal10")
    (runs / "focal10" / "config.json").write_text(
        (runs / "focal10" / "config.json").read_text().replace('"seed": 0', '"seed": 1'))
    evaluate_saved_logits(runs / "focal10", n_bins=10)
    rep = load_runs([runs])
    msgs = {Path(p).parent.name: m for p, m in rep.errors}
    assert set(msgs) == {"ce_copy", "focal10"}, rep.errors
    assert "claims the run ce seed 0" in msgs["ce_copy"] and "copied" in msgs["ce_copy"]
    assert "n_bins 10 while the other runs have 15" in msgs["focal10"]
    assert [(g.loss, g.seeds) for g in group_runs(rep.runs)] == [("ce", [0]), ("focal", [0])]


# --- 7. uncertainty eval refuses a head fitted on another backbone --------------------------
def test_uncertainty_eval_refuses_a_head_of_another_backbone(runs, tmp_path, capsys):
    head = tmp_path / "head.pt"
    common = ["--no-progress", "--device", "cpu", "--cache-dir", str(tmp_path / "caches")]
    capsys.readouterr()
    assert main(["uncertainty", "fit", str(runs / "ce"), "--epochs", "1", "--width", "16",
                 "--out", str(head), *common]) == 0, capsys.readouterr().err
    out = tmp_path / "r.json"
    _one_line_error(capsys, ["uncertainty", "eval", str(runs / "focal"), "--head", str(head),
                             "--no-ood", "--splits", "val", "--out", str(out),
                             "--cache-dir", str(tmp_path / "caches2"), "--no-progress",
                             "--device", "cpu"], "fitted on another backbone", str(head))
    assert not out.exists()


# --- 17. temporary files of a killed writer are removed on the next run ----------------------
_DEAD = 99_999_999  # above any pid_max: no such process


def test_a_killed_writers_temp_files_go_on_the_next_run(runs, tmp_path):
    from torchcal._io import remove_stale_temp_dirs
    run = runs / "ce"
    temps = [run / "logits" / f".val.npz.{_DEAD}-abcd1234.tmp",
             run / "logits" / f".val.npz.sha256.{_DEAD}-abcd1234.tmp",
             run / f".results.json.{_DEAD}-abcd1234.tmp",
             run / f".results.json.sha256.{_DEAD}-abcd1234.tmp"]
    for t in temps:
        t.write_bytes(b"half")
    mine = run / "logits" / ".val.npz.mine.tmp"  # not torchcal's naming: kept
    mine.write_bytes(b"mine")
    res = run_job(_spec(run))
    assert res["skipped"], res
    assert [t for t in temps if t.exists()] == [] and mine.exists()
    cache = tmp_path / "caches"
    (cache / f".val.tmp-{_DEAD}-abcd1234").mkdir(parents=True)
    (cache / f".val.tmp-{_DEAD}-abcd1234" / "logits.npy").write_bytes(b"half")
    (cache / f".val.tmp-{os.getppid()}-abcd1234").mkdir()  # a live writer's: kept
    assert [p.name for p in remove_stale_temp_dirs(cache, ["val"])] == [
        f".val.tmp-{_DEAD}-abcd1234"]
    assert sorted(p.name for p in cache.iterdir()) == [f".val.tmp-{os.getppid()}-abcd1234"]


# --- 12. a Ray address where something else answers fails at once ---------------------------
def test_a_ray_address_answered_by_a_web_server_fails_at_once(tmp_path, capsys):
    import http.server
    import threading
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # the server's log is not the command's stderr
            pass

    web = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{web.server_address[1]}"
        _one_line_error(capsys, ["demo", "--executor", "ray", "--ray-address", address,
                                 "--benchmark", "digits", "--quick", "--no-progress",
                                 "--out", str(tmp_path / "out")],
                        "is not a Ray cluster", "not HTTP/2")
    finally:
        web.shutdown()
        web.server_close()


def test_the_ray_check_waits_a_bounded_time_and_passes_a_grpc_server():
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from torchcal.experiments.ray_executor import check_ray_address
    grpc = pytest.importorskip("grpc")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        with pytest.raises(errors.TorchcalError, match=r"did not answer .* within 0.5 s"):
            check_ray_address(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
    finally:
        silent.close()
    server = grpc.server(ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        check_ray_address(f"127.0.0.1:{port}")  # Ray's GCS and Ray Client are gRPC servers
    finally:
        server.stop(None)


# --- 13/14. a failed run is one line; SIGTERM at any phase prints the command that continues --
def test_a_run_failing_inside_the_demo_is_one_line_without_debug(tmp_path, capsys):
    out = tmp_path / "demo"
    lock = out / "runs" / "focal" / "seed0" / LOCK_NAME
    lock.parent.mkdir(parents=True)
    os.mkfifo(lock)
    argv = ["demo", "--benchmark", "digits", "--losses", "ce,focal", "--seeds", "1", "--epochs",
            "2", "--workers", "1", "--no-progress", "--no-figures", "--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    failed = [ln for ln in err.splitlines() if "failed" in ln]
    assert len(failed) == 2, err
    assert "run " in failed[0] and "is a FIFO (named pipe)" in failed[0], err
    assert failed[1].endswith(f"--out {out}") and "the same command runs them again" in failed[1]
    assert main([*argv, "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_sigterm_during_start_up_prints_the_command_that_continues(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "demo"
    argv = ["demo", "--benchmark", "digits", "--losses", "ce", "--seeds", "1", "--epochs", "150",
            "--workers", "1", "--no-progress", "--no-figures", "--out", str(out)]
    src = str(Path(errors.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "torchcal", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / LOCK_NAME).exists() and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)  # the demo owns its directory: start-up, no run yet
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err  # 143: the exit status names SIGTERM
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted by SIGTERM" in err and err.strip().endswith(f"--out {out}"), err


def test_a_checkpoint_relabelled_to_another_loss_is_refused_by_eval(runs, capsys):
    run = runs / "ce"
    ckpt = run / "checkpoints" / "last.pt"
    state = load_checkpoint(ckpt)
    state.pop("format")
    state["config"]["loss"] = "focal"
    save_checkpoint(ckpt, state)  # a matching .sha256
    before = (run / "results.json").read_bytes()
    _one_line_error(capsys, ["eval", str(run)], "was trained as loss='focal'",
                    "config.json says loss='ce'")
    assert (run / "results.json").read_bytes() == before


def test_a_packed_sweep_keeps_the_users_files_of_a_stale_run(runs):
    (runs / "ce" / "notes.txt").write_text("mine")
    (runs / "focal" / "notes.txt").write_text("mine too")
    (pack,) = form_packs([_spec(runs / "ce", epochs=3), _spec(runs / "focal", "focal", epochs=3)],
                         max_lanes=2)
    with pytest.warns(UserWarning, match=r"kept 1 file torchcal did not write \('notes.txt'\)"):
        res = run_pack_job({"pack": pack})
    assert [m["error"] for m in res["outcomes"]] == [None, None], res
    assert [m["lanes"] for m in res["outcomes"]] == [2, 2]
    assert (runs / "ce" / "notes.txt").read_text() == "mine"
    assert (runs / "focal" / "notes.txt").read_text() == "mine too"


# --- 17. report pages are committed together; a killed report / ensemble writer's temp files go
def _results_tree(root):
    """Two seeds of ce evaluated from random logits (no training): what a report reads."""
    from torchcal.evaluate import evaluate_logits
    from torchcal.logits_file import save_logits
    from torchcal.results_file import write_results
    g = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 5
    for seed in (0, 1):
        d = root / "ce" / f"seed{seed}"
        z = {s: 3 * torch.randn(60, 5, generator=g) for s in ("val", "test")}
        for split, logits in z.items():
            save_logits(d / "logits" / f"{split}.npz", logits, y)
        write_results(d, evaluate_logits(
            val_logits=z["val"], val_labels=y, test_logits=z["test"], test_labels=y, n_bins=15,
            meta={"dataset": "digits", "model": "mlp", "loss": "ce", "loss_kwargs": {},
                  "seed": seed}))
    return root


_PAGES = ("report.md", "report.html", "results.json", "results.csv", "summary.csv")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full simulates a full disk")
@pytest.mark.parametrize("full_at", ["report.html", "summary.csv"])
def test_a_full_disk_during_report_leaves_every_old_page(tmp_path, monkeypatch, full_at):
    from torchcal._io import atomic
    from torchcal.report.build import build_report
    runs, out = _results_tree(tmp_path / "runs"), tmp_path / "rep"
    build_report([runs], out, title="Old report", figures=False)
    old = {name: (out / name).read_bytes() for name in _PAGES}
    real = atomic.new_temp_file

    def disk_full_at(path):  # the temp file of `full_at` writes to /dev/full: ENOSPC
        fd, tmp = real(path)
        if path.name == full_at:
            dev = os.open("/dev/full", os.O_WRONLY)
            os.dup2(dev, fd)
            os.close(dev)
        return fd, tmp

    monkeypatch.setattr(atomic, "new_temp_file", disk_full_at)
    with pytest.raises(OSError, match=f"disk is full, cannot write .*{full_at}"):
        build_report([runs], out, title="New report", figures=False)
    assert {name: (out / name).read_bytes() for name in _PAGES} == old  # all old pages
    assert sorted(p.name for p in out.iterdir()) == sorted(_PAGES)  # and no temp file
    monkeypatch.undo()
    build_report([runs], out, title="New report", figures=False)
    assert all(b"New report" in (out / n).read_bytes() for n in ("report.md", "report.html"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full simulates a full disk")
def test_a_full_disk_during_report_leaves_the_old_figures_with_the_old_pages(tmp_path,
                                                                             monkeypatch):
    """Issue 51 item 3: the figures are committed with the pages: a full disk while the pages
    are written leaves the old figures too (they used to be replaced before the pages)."""
    from torchcal._io import atomic
    from torchcal.report.build import build_report
    runs, out = _results_tree(tmp_path / "runs"), tmp_path / "rep"
    build_report([runs], out, title="Old report", n_bins=10)
    old = {p.name: p.read_bytes() for p in (out / "figures").iterdir()}
    old_pages = {name: (out / name).read_bytes() for name in _PAGES}
    assert old
    real = atomic.new_temp_file

    def disk_full_at(path):
        fd, tmp = real(path)
        if path.name == "report.html":
            dev = os.open("/dev/full", os.O_WRONLY)
            os.dup2(dev, fd)
            os.close(dev)
        return fd, tmp

    monkeypatch.setattr(atomic, "new_temp_file", disk_full_at)
    with pytest.raises(OSError, match="disk is full"):
        build_report([runs], out, title="New report", n_bins=15)
    assert {p.name: p.read_bytes() for p in (out / "figures").iterdir()} == old
    assert {name: (out / name).read_bytes() for name in _PAGES} == old_pages
    assert sorted(p.name for p in out.iterdir()) == sorted([*_PAGES, "figures"])  # no stage
    monkeypatch.undo()
    rep = build_report([runs], out, title="New report", n_bins=15)
    new = {p.name: p.read_bytes() for p in (out / "figures").iterdir()}
    assert new != old and sorted(new) == sorted(p.name for p in rep.figures)


def test_a_killed_report_writers_temp_files_go_on_the_next_report(tmp_path):
    from torchcal.report.build import build_report
    runs, out = _results_tree(tmp_path / "runs"), tmp_path / "rep"
    (out / "figures").mkdir(parents=True)
    stale = [out / f".report.md.{_DEAD}-abcd1234.tmp", out / f".results.json.{_DEAD}-abcd1234.tmp",
             out / f".summary.csv.{_DEAD}-abcd1234.tmp",
             out / "figures" / f".reliability.png.{_DEAD}-abcd1234.tmp"]
    live = out / f".report.html.{os.getppid()}-abcd1234.tmp"  # a live writer's
    users = [out / "notes.tmp", out / ".report.md.mine.tmp", out / f".notes.txt.{_DEAD}-ab.tmp",
             live]
    for p in stale + users:
        p.write_bytes(b"half")
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"mine")
    link = out / f".report.md.{_DEAD}-abcd0000.tmp"  # torchcal's name, but a link: kept
    link.symlink_to(precious)
    build_report([runs], out, figures=False)
    assert [p for p in stale if p.exists()] == []
    assert all(p.read_bytes() == b"half" for p in users)
    assert link.is_symlink() and precious.read_bytes() == b"mine"


def test_a_killed_ensemble_writers_temp_files_go_on_the_next_ensemble(tmp_path):
    from torchcal.ensemble import evaluate_ensemble
    runs = _results_tree(tmp_path / "runs")
    ens = tmp_path / "ensembles" / "ce"
    (ens / "logits").mkdir(parents=True)
    stale = [ens / f".results.json.{_DEAD}-abcd1234.tmp",
             ens / f".results.json.sha256.{_DEAD}-abcd1234.tmp",
             ens / "logits" / f".test.npz.{_DEAD}-abcd1234.tmp"]
    users = [ens / "logits" / ".test.npz.mine.tmp", ens / "notes.tmp"]
    for p in stale + users:
        p.write_bytes(b"half")
    evaluate_ensemble([runs / "ce" / "seed0", runs / "ce" / "seed1"], ens,
                      meta={"members": [0, 1]})
    assert [p for p in stale if p.exists()] == [] and all(p.exists() for p in users)
    assert (ens / "results.json").is_file()


def test_a_linked_figures_folder_is_never_followed(tmp_path, capsys):
    from torchcal.report.build import remove_stale_report_temp_files
    runs, out, mine = _results_tree(tmp_path / "runs"), tmp_path / "rep", tmp_path / "photos"
    mine.mkdir()
    keep = [mine / "holiday.png", mine / f".holiday.png.{_DEAD}-abcd1234.tmp"]
    for p in keep:
        p.write_bytes(b"mine")
    out.mkdir()
    (out / "figures").symlink_to(mine)
    assert remove_stale_report_temp_files(out) == []
    _one_line_error(capsys, ["report", str(runs), "--out", str(out), "--no-figures"],
                    "Figures directory", "symbolic link")
    assert all(p.read_bytes() == b"mine" for p in keep)
