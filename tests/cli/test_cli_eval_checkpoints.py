"""`torchcal eval --checkpoint best` never replaces the last epoch's results, and `torchcal
report` states and separates the checkpoints (issue #14 item 3)."""

from __future__ import annotations

import json
import shutil

import pytest

from torchcal.cli import main
from torchcal.errors import ResultsFileError
from torchcal.report.aggregate import check_checkpoints, load_runs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("evalck") / "run"
    assert main(["train", "--recipe", "digits-mlp", "--loss", "ce", "--epochs", "3",
                 "--out", str(d), "--no-progress", "--num-threads", "1",
                 "--select-best-by", "error"]) == 0
    return d


def test_eval_best_keeps_the_last_epochs_results(run, capsys):
    last = (run / "results.json").read_bytes()
    last_logits = (run / "logits" / "test.npz").read_bytes()
    assert main(["eval", str(run), "--checkpoint", "best", "--device", "cpu"]) == 0
    assert "results-best.json" in capsys.readouterr().out
    assert (run / "results.json").read_bytes() == last
    assert (run / "logits" / "test.npz").read_bytes() == last_logits
    best = json.loads((run / "results-best.json").read_text())
    assert best["meta"]["checkpoint"] == "best"
    assert json.loads(last)["meta"]["checkpoint"] == "last"
    assert (run / "logits-best" / "test.npz").is_file()
    # the default evaluation rewrites the last epoch's files only
    assert main(["eval", str(run), "--device", "cpu"]) == 0
    assert json.loads((run / "results-best.json").read_text()) == best


def test_report_names_the_checkpoint_and_refuses_to_mix(run, tmp_path):
    if not (run / "results-best.json").exists():
        assert main(["eval", str(run), "--checkpoint", "best", "--device", "cpu"]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "r1"), "--no-figures"]) == 0
    md = (tmp_path / "r1" / "report.md").read_text()
    runs_section = md.split("## Runs", 1)[1]
    assert "| Checkpoint |" in runs_section and "| last |" in runs_section
    assert main(["report", str(run), "--out", str(tmp_path / "r2"), "--no-figures",
                 "--checkpoint", "best"]) == 0
    assert "| best |" in (tmp_path / "r2" / "report.md").read_text().split("## Runs", 1)[1]
    # a second run whose results.json came from its best checkpoint (as `eval --checkpoint
    # best` wrote before this change): one table would mix them -> refused, unless told to
    # (older torchcal: no SHA-256 files, no logits digests; another seed, not a copy of `run`,
    # which the report would skip as a second claim of one run's identity)
    other = tmp_path / "other"
    shutil.copytree(run, other)
    for p in other.rglob("*.sha256"):
        if not p.name.endswith(".pt.sha256"):
            p.unlink()
    res = json.loads((other / "results-best.json").read_text())
    res.pop("logits_sha256", None)
    res["meta"]["seed"] = 1
    (other / "results.json").write_text(json.dumps(res))
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "seed": 1}))
    with pytest.raises(ResultsFileError, match="different checkpoints"):
        check_checkpoints(load_runs([run, other]).runs)
    assert main(["report", str(run), str(other), "--out", str(tmp_path / "r3"),
                 "--no-figures"]) != 0
    assert main(["report", str(run), str(other), "--out", str(tmp_path / "r4"), "--no-figures",
                 "--mix-checkpoints"]) == 0
    assert "| best, last |" in (tmp_path / "r4" / "report.md").read_text()


def test_report_best_lists_runs_without_a_best_evaluation(tmp_path, run):
    fresh = tmp_path / "fresh"
    shutil.copytree(run, fresh)
    for p in (fresh / "results-best.json", ):
        p.unlink(missing_ok=True)
    shutil.rmtree(fresh / "logits-best", ignore_errors=True)
    rep = load_runs([fresh], "best")
    assert not rep.runs and "--checkpoint best" in rep.errors[0][1]
