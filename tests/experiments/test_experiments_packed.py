"""Packed sweeps: the demo's runs trained in packs give the runs' files and numbers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from torchcal.evaluate import read_results
from torchcal.experiments import DemoConfig, run_demo
from torchcal.experiments.packed import expand_results, pack_jobs, run_packed_job
from torchcal.experiments.runner import Job, failed_result
from torchcal.experiments.training import run_job, run_spec

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

def _changed(spec, **fields):
    """A run spec with other fields, resolved again (a resolved spec's `config` is its truth)."""
    return run_spec({**{k: v for k, v in spec.items() if k != "config"}, **fields}).to_json()


TINY = dict(seeds=(0, 1), epochs=2, losses=("ce", "adafocal"), progress=False,
            benchmark="digits", figures=False)


def _sizes(jobs):
    return [len(j.spec["members"]) if j.fn is run_packed_job else 1 for j in jobs]


def test_pack_jobs_sizes_and_members(demo_specs):
    default = demo_specs(DemoConfig(), Path("/x"))  # 7 losses x 2 seeds
    jobs = pack_jobs(default)
    assert _sizes(jobs) == [4, 4, 3, 3]  # at most CPU_PACK_SIZE = 5, an even number of packs
    runs = [r["run_dir"] for j in jobs for r in j.spec["members"]]
    assert sorted(runs) == sorted(s["run_dir"] for s in default)  # each run once
    assert [r["run_dir"] for r in jobs[0].labels["members"]] == [r["run_dir"]
                                                             for r in jobs[0].spec["members"]]
    assert _sizes(pack_jobs(demo_specs(DemoConfig(full=True), Path("/x")))) == [5] * 14
    two = pack_jobs(default[:2])  # two packs of one: unpacked runs
    assert [j.fn for j in two] == [run_job, run_job]
    cuda = [_changed(s, overrides={"device": "cuda"}) for s in default]
    with pytest.raises(ValueError, match=r"overrides\['device'\] = 'cuda' but config\['device'\]"):
        pack_jobs([dict(s, overrides={"device": "cuda"}) for s in default])  # stale config
    assert _sizes(pack_jobs(cuda)) == [14]
    other = [_changed(s, overrides={"lr": 0.05}) if i % 2 else s for i, s in enumerate(default[:8])]
    jobs = pack_jobs(other)  # two recipes: never in one pack
    for j in jobs:
        lrs = {(r.get("overrides") or {}).get("lr") for r in j.spec.get("members", [j.spec])}
        assert len(lrs) == 1


def _nothing(spec):
    return {}


def test_the_progress_bar_counts_runs_not_packs(demo_specs, capsys):
    """The default demo: 14 runs in 4 packs; the bar said "0/4 runs" (issue 33)."""
    import dataclasses

    from torchcal.experiments import LocalExecutor, run_sweep

    jobs = [dataclasses.replace(j, fn=_nothing)
            for j in pack_jobs(demo_specs(DemoConfig(), Path("/x")))]
    assert len(jobs) == 4 and sum(j.n_runs for j in jobs) == 14
    run_sweep(jobs, LocalExecutor(workers=1), progress=True)
    err = capsys.readouterr().err
    assert "0/14 runs" in err and "14/14 runs" in err and "/4 runs" not in err, err


def test_expand_results_reports_every_run_of_a_dead_pack(demo_specs):
    jobs = pack_jobs(demo_specs(DemoConfig(**dict(TINY, seeds=(0, 1, 2))), Path("/x")))
    assert _sizes(jobs) == [3, 3]
    dead = failed_result(jobs[0], "worker process died: killed")
    ok = {"error": None, "members": [{"run_dir": r["run_dir"], "error": None}
                                     for r in jobs[1].spec["members"]]}
    flat = expand_results(jobs, [dead, ok])
    assert len(flat) == 6
    assert [f["error"] for f in flat] == ["worker process died: killed"] * 3 + [None] * 3
    assert {f["run_dir"] for f in flat[:3]} == {r["run_dir"] for r in jobs[0].spec["members"]}
    single = Job("x", dict, {"run_dir": "r"})
    assert expand_results([single], [{"run_dir": "r", "error": None}]) == [
        {"run_dir": "r", "error": None}]


def _pre(out, loss, seed):
    return read_results(out / "runs" / loss / f"seed{seed}")["test"]["pre"]


def test_packed_demo_matches_unpacked_and_is_deterministic(tmp_path):
    packed = run_demo(DemoConfig(out=tmp_path / "p", workers=1, **TINY))
    assert packed.failed == [] and packed.config.pack
    assert (tmp_path / "p" / "report.md").is_file()
    spawned = run_demo(DemoConfig(out=tmp_path / "w", workers=2, **TINY))
    alone = run_demo(DemoConfig(out=tmp_path / "u", workers=1, pack=False, **TINY))
    assert spawned.failed == [] and alone.failed == []
    for loss in TINY["losses"]:
        for seed in TINY["seeds"]:
            a, b, c = (_pre(tmp_path / d, loss, seed) for d in ("p", "w", "u"))
            assert a == b or all(a[k] == b[k] or math.isnan(a[k]) for k in a)  # bit for bit
            # on the CPU a packed run is its unpacked run bit for bit (the per-member forward)
            assert a == c or all(a[k] == c[k] or math.isnan(a[k]) for k in a), (loss, seed)
    assert ((tmp_path / "p" / "results.csv").read_text()
            == (tmp_path / "u" / "results.csv").read_text())
    # a second packed demo into the same directory skips every run
    ckpt = tmp_path / "p" / "runs" / "ce" / "seed0" / "checkpoints" / "last.pt"
    before = ckpt.stat().st_mtime_ns
    again = run_demo(DemoConfig(out=tmp_path / "p", workers=1, **TINY))
    assert again.failed == [] and ckpt.stat().st_mtime_ns == before


def test_run_packed_job_skips_finished_and_reports_bad_runs(demo_specs, tmp_path):
    specs = demo_specs(DemoConfig(out=tmp_path, **dict(TINY, epochs=1)), tmp_path)[:3]
    specs[2] = _changed(specs[2], loss_kwargs={"not_an_argument": 1})
    res = run_packed_job({"members": specs})
    assert res["error"] is None and len(res["members"]) == 3
    assert [m["error"] is None for m in res["members"]] == [True, True, False]
    assert "not_an_argument" in res["members"][2]["error"]
    again = run_packed_job({"members": specs[:2]})
    assert [m["skipped"] for m in again["members"]] == [True, True]


def test_a_pack_names_its_runs_members_in_spec_labels_and_result(demo_specs):
    """One key for a pack's runs (issue 40): ``"members"`` in its job's spec and labels, as in
    its result."""
    jobs = pack_jobs(demo_specs(DemoConfig(**dict(TINY, seeds=(0, 1, 2))), Path("/x")))
    assert all(set(j.spec) == {"members"} == set(j.labels) for j in jobs)
    bad = {"run_dir": "/nowhere/r", "loss": "ce", "seed": 0}  # refused before any training
    new = run_packed_job({"members": [bad]})
    with pytest.raises(KeyError, match="members"):
        run_packed_job({"runs": [bad]})
    assert new["members"][0]["error"]
