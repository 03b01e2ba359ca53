"""Fault injection (issue 25): every artifact verified, every read bounded, every number checked.

One test (or a few) per class of fault: integrity of the files torchcal writes and trusts later,
caches that cannot be read, bounded reads of JSON, impossible metric values, low-precision
ranking, probabilities given as logits, divergence, symbolic links, recompilation, and two
messages.  Each failed before the change that fixed it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import tarfile
import warnings

import numpy as np
import pytest
import torch

from torchcal._io import (
    MAX_JSON_DEPTH,
    find_files,
    read_json,
    read_verified,
    write_verified,
)
from torchcal.cli import main
from torchcal.errors import CheckpointError, ChecksumError, DivergedError, ResultsFileError
from torchcal.results_file import (
    SCHEMA,
    read_calibration,
    read_results,
    write_calibration,
    write_results,
)


def _results(loss="ce", seed=0, ece=0.05, error=0.1, t=1.5):
    return {"schema": SCHEMA, "meta": {"dataset": "d", "model": "m", "loss": loss, "seed": seed},
            "temperatures": {"grid_ece": t},
            "test": {"pre": {"ece": ece, "nll": 0.4, "error": error},
                     "post": {"grid_ece": {"ece": ece / 2, "nll": 0.35, "error": error}}},
            "n": {"test": 100}}


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if "warn" not in line.lower()]
    assert "Traceback" not in err, err
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# integrity: one helper writes a SHA-256 beside every trusted file and checks it on read
# ------------------------------------------------------------------------------------------
def test_single_bit_flips_of_an_uncertainty_head_are_all_refused(tmp_path):
    """30 single-bit flips of head.pt: each one refused (all 30 loaded before)."""
    from torchcal.uncertainty import UncertaintyHead, load_head, save_head

    torch.manual_seed(0)
    path = tmp_path / "head.pt"
    save_head(UncertaintyHead(8, width=16), path)
    pristine = path.read_bytes()
    rng = random.Random(25)
    for _ in range(30):
        data = bytearray(pristine)
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match=r"head\.pt.*does not match its SHA-256.*fit "
                                                  r"the head again"):
            load_head(path)
    path.write_bytes(pristine)
    load_head(path)


def test_one_helper_verifies_checkpoints_heads_caches_and_calibrations(tmp_path):
    """The same writer and check (and message) for every kind of file."""
    p = write_verified(tmp_path / "x.bin", b"abc")
    assert read_verified(p) == b"abc"
    assert (tmp_path / "x.bin.sha256").read_text().endswith("  x.bin\n")
    p.write_bytes(b"abd")
    with pytest.raises(ChecksumError, match=r"x\.bin.*does not match its SHA-256 in "
                                            r"x\.bin\.sha256"):
        read_verified(p)

    out = tmp_path / "calib.json"
    from torchcal.posthoc import TemperatureScaling

    z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    ts = TemperatureScaling(method="grid_ece").fit(z, torch.tensor([0, 1, 0, 0]))
    doc = {"method": "grid_ece", "calibrator": json.loads(json.dumps(ts.to_dict())),
           "val": {"pre": {"ece": 0.1}, "post": {"ece": 0.02}}}
    write_calibration(out, doc)
    assert read_calibration(out) == doc
    text = out.read_text()
    out.write_text(text.replace("0.02", "0.01"))  # an edit, not by torchcal
    with pytest.raises(ResultsFileError, match=r"calib\.json.*does not match its SHA-256.*"
                                               r"torchcal calibrate again"):
        read_calibration(out)
    write_calibration(out, {**doc, "val": {"post": {"ece": -5}}})
    with pytest.raises(ResultsFileError, match=r"calib\.json.*`ece`.*\[0, 1\]"):
        read_calibration(out)


def test_calibrate_out_is_written_with_its_sha256(tmp_path, capsys):
    from torchcal.logits_file import save_logits

    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 200)
    z = rng.normal(size=(200, 4)) + 2 * np.eye(4)[y]  # informative logits
    save_logits(tmp_path / "val.npz", z.astype(np.float32), y)
    out = tmp_path / "calib.json"
    assert main(["calibrate", str(tmp_path / "val.npz"), "--method", "nll", "--out", str(out)]) == 0
    assert (tmp_path / "calib.json.sha256").is_file()
    assert read_calibration(out)["method"] == "nll"


# ------------------------------------------------------------------------------------------
# caches: any unreadable cache is stale (warn, regenerate), whatever the exception
# ------------------------------------------------------------------------------------------
def _tamperings(data: bytes) -> list[bytes]:
    rng = random.Random(2)
    flips = []
    for _ in range(6):
        b = bytearray(data)
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        flips.append(bytes(b))
    cuts = [data[: len(data) * k // 6] for k in range(1, 6)]
    return [*flips, *cuts, b""]


def test_every_tampered_mnist1d_cache_is_regenerated(tmp_path):
    """12 tamperings (6 bit flips, 5 truncations, an empty file): each is warned about and
    treated as stale, none escapes (BadZipFile / EOFError escaped before)."""
    from torchcal.data.mnist1d import _read_cache, generate_mnist1d, mnist1d_cache_path

    x, y = generate_mnist1d(20, seed=3, root=tmp_path)
    path = mnist1d_cache_path(20, 3, tmp_path)
    pristine = path.read_bytes()
    for data in _tamperings(pristine):
        path.write_bytes(data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _read_cache(path, 20, 3, False)
        if got is not None:  # a flip in a part of the zip nothing reads (e.g. a timestamp)
            assert np.array_equal(got[0], x) and np.array_equal(got[1], y)
            continue
        assert any("regenerating" in str(w.message) for w in caught), [str(w.message)
                                                                        for w in caught]
    path.write_bytes(pristine[: len(pristine) // 2])
    with pytest.warns(UserWarning, match="regenerating"):
        x2, y2 = generate_mnist1d(20, seed=3, root=tmp_path)
    assert np.array_equal(x2, x) and np.array_equal(y2, y)
    assert path.read_bytes() == pristine  # written again


# ------------------------------------------------------------------------------------------
# bounded reads of JSON that torchcal reads back
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content,match", [
    ('{"a": ' + "9" * 5000 + "}", "5,000 digits"),
    ("[" * 200_000, "nested 200,000 levels|nested 200000 levels"),
    ('{"a": Infinity}', "non-finite value Infinity"),
    ('{"a": NaN}', "non-finite value NaN"),
    ('{"a": -Infinity}', "non-finite value -Infinity"),
    ('{"a": 1e999}', "overflows"),
    (b'{"a": "\xff"}', "not UTF-8"),
])
def test_hostile_json_is_refused_with_the_file_name(tmp_path, content, match):
    p = tmp_path / "results.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ResultsFileError, match=rf"results\.json.*({match})"):
        read_results(p)


def test_deep_nesting_limit_is_exact(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    assert read_json(p) is not None
    p.write_text("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(ValueError, match="nested 65 levels deep"):
        read_json(p)
    p.write_text(json.dumps({"s": "[" * 10_000}))  # brackets inside strings do not count
    assert read_json(p) == {"s": "[" * 10_000}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifos_devices_and_huge_files_are_refused_without_reading(tmp_path, monkeypatch):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading would block forever
    with pytest.raises(ResultsFileError, match="not a regular file"):
        read_results(fifo)
    dev = tmp_path / "dev.json"
    dev.symlink_to("/dev/zero")  # would read until memory runs out
    with pytest.raises(ResultsFileError, match="not a regular file"):
        read_results(dev)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(_results()))
    monkeypatch.setattr("torchcal._io.jsonio.MAX_JSON_BYTES", 100)
    with pytest.raises(ResultsFileError, match=r"big\.json.*more than the 100"):
        read_results(big)


# ------------------------------------------------------------------------------------------
# impossible metric values
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit,match", [
    ({"ece": -5}, r"`ece` to be a number in \[0, 1\], got -5"),
    ({"error": 7.0}, r"`error` to be a number in \[0, 1\], got 7.0"),
    ({"nll": -0.5}, r"`nll` to be a number >= 0"),
    ({"ece": True}, r"`ece` to be a finite number"),
])
def test_impossible_metric_values_are_refused(tmp_path, edit, match):
    res = _results()
    res["test"]["pre"].update(edit)
    write_results(tmp_path, res)
    with pytest.raises(ResultsFileError, match=rf"results\.json.*test\.pre: expected {match}"):
        read_results(tmp_path)


def test_non_finite_temperatures_are_refused(tmp_path):
    p = tmp_path / "results.json"
    p.write_text(json.dumps(_results()).replace('"grid_ece": 1.5', '"grid_ece": 1e400'))
    with pytest.raises(ResultsFileError, match=r"results\.json.*overflows"):
        read_results(p)
    res = _results(t=0.0)
    write_results(tmp_path, res)
    with pytest.raises(ResultsFileError, match="positive number"):
        read_results(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_report_skips_and_names_each_bad_file_and_goes_on(tmp_path, capsys):
    root = tmp_path / "runs"
    for seed in range(2):
        write_results(root / "good" / f"s{seed}", _results(seed=seed))
    bad = {
        "digits": '{"schema": "torchcal.results/1", "n": ' + "1" * 5000 + "}",
        "nested": "[" * 200_000,
        "inf": json.dumps(_results()).replace('"ece": 0.05', '"ece": Infinity'),
        "neg": json.dumps(_results(ece=-5)),
        "err7": json.dumps(_results(error=7.0)),
        "tinf": json.dumps(_results()).replace('"grid_ece": 1.5', '"grid_ece": Infinity'),
    }
    for name, text in bad.items():
        (root / name).mkdir(parents=True)
        (root / name / "results.json").write_text(text)
    (root / "fifo").mkdir()
    os.mkfifo(root / "fifo" / "results.json")
    (root / "zero").mkdir()
    (root / "zero" / "results.json").symlink_to("/dev/zero")
    code = main(["report", str(root), "--out", str(tmp_path / "rep"), "--no-figures"])
    err = _one_line(capsys.readouterr().err)
    assert code == 1  # written, with skipped files
    for name in [*bad, "fifo", "zero"]:
        assert f"{os.sep}{name}{os.sep}results.json" in err, (name, err)
    doc = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert len(doc["errors"]) == len(bad) + 2
    assert [(g["n_runs"], g["mean"]["test.pre.ece"]) for g in doc["groups"]] == [(2, 0.05)]


# ------------------------------------------------------------------------------------------
# top-k error ranks on logits, exactly in every dtype
# ------------------------------------------------------------------------------------------
def _topk_reference(z64: torch.Tensor, y: torch.Tensor, k: int) -> float:
    """Float64 NumPy: a miss when k or more other classes score at least as high."""
    z, lab = z64.numpy(), y.numpy()
    z_y = z[np.arange(len(lab)), lab][:, None]
    others_at_least = (z >= z_y).sum(axis=1) - 1
    return float(np.mean(others_at_least >= k))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("c,scale", [(100, 20.0), (10, 100.0)])
def test_topk_error_ranks_on_logits_in_every_dtype(dtype, c, scale):
    from torchcal.metrics import topk_error

    g = torch.Generator().manual_seed(0)
    z = (torch.randn(2000, c, generator=g) * scale).to(dtype)
    y = torch.randint(0, c, (2000,), generator=g)
    want = _topk_reference(z.double(), y, 5)
    assert float(topk_error(logits=z, labels=y, k=5)) == pytest.approx(want, abs=1e-6)


def test_topk_error_of_the_issue_and_ties_in_probabilities():
    from torchcal.metrics import topk_error

    g = torch.Generator().manual_seed(0)
    z = (torch.randn(2000, 100, generator=g) * 20).half()
    y = torch.randint(0, 100, (2000,), generator=g)
    assert float(topk_error(logits=z, labels=y, k=5)) == pytest.approx(0.9555, abs=1e-6)
    # probabilities: ranked on them, ties count as misses (a tie at the k-th place)
    p = torch.tensor([[0.4, 0.4, 0.2], [0.5, 0.3, 0.2], [0.2, 0.4, 0.4]], dtype=torch.float64)
    assert float(topk_error(probs=p, labels=torch.tensor([0, 0, 1]), k=1)) == pytest.approx(2 / 3)


# ------------------------------------------------------------------------------------------
# calibrators warn on probabilities given as logits
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["TemperatureScaling", "VectorScaling", "HistogramBinning"])
def test_calibrators_warn_on_probabilities_given_as_logits(name):
    from torchcal import posthoc

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (300,), generator=g)
    z = torch.randn(300, 4, generator=g, dtype=torch.float64) + 3 * torch.eye(4)[y]
    probs = torch.softmax(z, 1)
    with pytest.warns(UserWarning, match="`logits` look like probabilities.*calibrator"):
        getattr(posthoc, name)().fit(probs, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        getattr(posthoc, name)().fit(torch.log(probs), y)  # log-probabilities: no warning


# ------------------------------------------------------------------------------------------
# divergence: stopped at the epoch, the run directory resumable
# ------------------------------------------------------------------------------------------
def test_a_diverging_run_stops_at_the_first_epoch_with_the_cause(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--recipe", "digits-mlp", "--epochs", "3", "--lr", "1e8",
                 "--no-grad-clip", "--no-progress", "--num-threads", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "diverged in epoch 1" in err and "lr=1e+08" in err and "--no-grad-clip" in err, err
    assert not (out / "log.jsonl").exists() or (out / "log.jsonl").read_text() == ""
    assert not (out / "results.json").exists()


def _diverging_in_epoch_2(tmp_path, monkeypatch):
    """A digits-MLP run of 3 epochs whose weights blow up in the 2nd epoch (after a good 1st);
    its config and the real ``SoloModel.step``."""
    from torchcal.train import get_recipe
    from torchcal.train.stacks import SoloModel

    real, calls = SoloModel.step, []

    def poisoned(self, *a, **kw):
        real(self, *a, **kw)
        calls.append(1)
        if len(calls) == self.n_batches + 3:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("inf"))

    monkeypatch.setattr(SoloModel, "step", poisoned)
    cfg = dataclasses.replace(get_recipe("digits-mlp"), out_dir=str(tmp_path / "run"),
                              epochs=3, progress=False, num_threads=1, device="cpu")
    return cfg, real


def test_a_run_diverging_later_keeps_its_last_good_checkpoint(tmp_path, monkeypatch):
    from torchcal.run_dir import RunDir
    from torchcal.train import train
    from torchcal.train.checkpoint import load_checkpoint
    from torchcal.train.stacks import SoloModel

    cfg, real = _diverging_in_epoch_2(tmp_path, monkeypatch)
    with pytest.raises(DivergedError, match="diverged in epoch 2: the training loss and the "
                                            "parameters became NaN/Inf.*last good checkpoint"):
        train(cfg)
    run = RunDir(cfg.out_dir)
    assert [rec["epoch"] for rec in run.read_log()] == [1]
    assert load_checkpoint(run.checkpoint())["epoch"] == 1
    monkeypatch.setattr(SoloModel, "step", real)
    out = train(dataclasses.replace(cfg, resume=True))  # from the good epoch-1 checkpoint
    assert out["resumed_from"] == 1 and out["epochs"] == 3


def test_a_diverged_run_waits_for_its_last_checkpoint_before_naming_it(tmp_path, monkeypatch):
    """The epoch writer is a thread: a run alone that diverges while its earlier epoch's files
    are still being written waits for them, so its error names the kept checkpoint (it said
    "no checkpoint was written yet" when the writer was slow, seen under load)."""
    import time

    from torchcal.run_dir import RunDir
    from torchcal.train import pack_commit, train
    from torchcal.train.checkpoint import load_checkpoint

    real_write = pack_commit.EpochWriter._write

    def slow_write(self, job):
        time.sleep(0.5)
        real_write(self, job)

    monkeypatch.setattr(pack_commit.EpochWriter, "_write", slow_write)
    cfg, _ = _diverging_in_epoch_2(tmp_path, monkeypatch)
    with pytest.raises(DivergedError, match="diverged in epoch 2: the training loss and the "
                                            "parameters became NaN/Inf.*last good checkpoint"):
        train(cfg)
    assert load_checkpoint(RunDir(cfg.out_dir).checkpoint())["epoch"] == 1


# ------------------------------------------------------------------------------------------
# symbolic links leaving a run tree or a data root
# ------------------------------------------------------------------------------------------
def test_report_does_not_follow_links_out_of_the_run_tree(tmp_path, capsys):
    mine, other = tmp_path / "mine", tmp_path / "other"
    write_results(mine / "ce" / "s0", _results())
    write_results(other / "focal" / "s0", _results(loss="focal"))
    (mine / "theirs").symlink_to(other, target_is_directory=True)  # a tree of runs
    (mine / "one").symlink_to(other / "focal" / "s0", target_is_directory=True)
    (mine / "file").mkdir()
    (mine / "file" / "results.json").symlink_to(other / "focal" / "s0" / "results.json")
    files, leaving = find_files(mine, "results.json")
    assert files == [mine / "ce" / "s0" / "results.json"]
    assert {link.name for link, _ in leaving} == {"theirs", "one", "results.json"}
    code = main(["report", str(mine), "--out", str(tmp_path / "rep"), "--no-figures"])
    cap = capsys.readouterr()
    assert code == 1
    doc = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert {g["loss"] for g in doc["groups"]} == {"ce"}, doc["groups"]
    for link in ("theirs", "one", "file"):
        assert f"{os.sep}{link}" in cap.err and "outside" in cap.err, cap.err
    # a link inside the tree is fine (found once, under its real path)
    (mine / "alias").symlink_to(mine / "ce", target_is_directory=True)
    assert find_files(mine, "results.json")[0] == [mine / "ce" / "s0" / "results.json"]

def test_extract_archive_does_not_write_through_a_link_leaving_the_data_root(tmp_path):
    from torchcal.data.download import extract_archive

    root, outside = tmp_path / "data", tmp_path / "outside"
    (root).mkdir()
    outside.mkdir()
    (root / "pkg").symlink_to(outside, target_is_directory=True)
    src = tmp_path / "src" / "pkg"
    src.mkdir(parents=True)
    (src / "payload.txt").write_text("x")
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tf:
        tf.add(src, arcname="pkg")
    with pytest.raises(ValueError, match=r"symbolic link to .*outside.*data root"):
        extract_archive(archive, root)
    assert list(outside.iterdir()) == []
    inside = root / "real"
    inside.mkdir()
    (root / "pkg").unlink()
    (root / "pkg").symlink_to(inside, target_is_directory=True)  # a link inside: followed
    extract_archive(archive, root)
    assert (inside / "payload.txt").read_text() == "x"


# ------------------------------------------------------------------------------------------
# GRA losses under torch.compile: not one compilation per shape
# ------------------------------------------------------------------------------------------
def test_gra_losses_compile_once_per_class_not_per_shape(caplog):
    import torch._dynamo
    from torch._dynamo.utils import counters

    from torchcal.losses import BSCEGRALoss, DualFocalGRALoss, FocalGRALoss

    torch._dynamo.reset()
    counters.clear()
    shapes = [(4, 3), (5, 4), (6, 5), (7, 6), (8, 7), (9, 8), (10, 9), (11, 10), (12, 11)]
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"):
        for loss in (FocalGRALoss(), BSCEGRALoss(), DualFocalGRALoss()):
            f = torch.compile(loss, backend="eager")
            for n, c in shapes:
                x = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
                y = torch.randint(0, c, (n,))
                got = f(x, y)
                torch.testing.assert_close(got, loss(x, y))
    assert "recompile_limit" not in caplog.text and "cache_size_limit" not in caplog.text
    # per class: one static and one dynamic compilation (9 before, cut at the limit of 8)
    assert counters["stats"]["unique_graphs"] <= 3 * 3, dict(counters["stats"])
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------
# two messages
# ------------------------------------------------------------------------------------------
def test_eval_best_after_select_best_by_none_says_why(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--recipe", "digits-mlp", "--epochs", "1", "--select-best-by", "none",
                 "--no-eval", "--no-progress", "--num-threads", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--checkpoint", "best"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "best.pt" in err and "--select-best-by none" in err and "--checkpoint last" in err


@pytest.mark.parametrize("fn", ["aurc", "r_auroc"])
def test_ranking_metrics_name_a_two_dimensional_correct(fn):
    from torchcal import metrics

    with pytest.raises(ValueError, match=r"`correct` to have shape \(4,\)"):
        getattr(metrics, fn)(uncertainty=torch.rand(4), correct=torch.ones(4, 2, dtype=torch.long))
