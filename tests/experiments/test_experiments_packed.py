"""Packed sweeps: the demo's runs trained in packs give the runs' files and numbers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from torchcal.experiments import DemoConfig, run_demo
from torchcal.experiments.runner import failed_result
from torchcal.experiments.training import (
    benchmark_config,
    outcomes_of,
    pack_job,
    run_pack_job,
)
from torchcal.results_file import read_results
from torchcal.train.packs import RunOutcome, form_packs

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _changed(config, **fields):
    """A run resolved again with other benchmark settings (loss arguments, overrides)."""
    kw = dict(loss=config.loss, seed=config.seed, run_dir=config.out_dir,
              loss_kwargs=config.loss_kwargs, epochs=config.epochs, n_bins=config.n_bins,
              data_kwargs=config.data_kwargs)
    return benchmark_config(config.recipe, **{**kw, **fields})


TINY = dict(seeds=(0, 1), epochs=2, losses=("ce", "adafocal"), progress=False,
            benchmark="digits", figures=False)


def _sizes(packs):
    return [len(p.configs) for p in packs]


def test_form_packs_sizes_and_lanes(demo_configs):
    default = demo_configs(DemoConfig(), Path("/x"))  # 7 losses x 2 seeds
    packs = form_packs(default)
    assert _sizes(packs) == [4, 4, 3, 3]  # at most CPU_PACK_SIZE = 5, an even number of packs
    # seed-major, dealt round robin: pack k holds runs k, k + 4, ... (a hand count)
    assert [p.positions for p in packs] == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10), (3, 7, 11)]
    runs = [c.out_dir for p in packs for c in p.configs]
    assert sorted(runs) == sorted(c.out_dir for c in default)  # each run once
    job = pack_job(packs[0])
    assert [r["run_dir"] for r in job.labels["pack"]] == [c.out_dir for c in packs[0].configs]
    assert job.spec["pack"] is packs[0] and job.fn is run_pack_job and job.n_runs == 4
    assert _sizes(form_packs(demo_configs(DemoConfig(full=True), Path("/x")))) == [5] * 14
    assert _sizes(form_packs(default[:2])) == [1, 1]  # two packs of one: unpacked runs
    assert _sizes(form_packs(default, max_lanes=1)) == [1] * 14  # --no-pack
    assert _sizes(form_packs(default, max_lanes=4)) == [4, 4, 3, 3]
    cuda = [_changed(c, overrides={"device": "cuda"}) for c in default]
    assert _sizes(form_packs(cuda)) == [14] and pack_job(form_packs(cuda)[0]).resources.gpus == 1
    other = [_changed(c, overrides={"lr": 0.05}) if i % 2 else c for i, c in enumerate(default[:8])]
    for p in form_packs(other):  # two learning rates: never in one pack
        assert len({c.lr for c in p.configs}) == 1
    with pytest.raises(ValueError, match="`max_lanes`"):
        form_packs(default, max_lanes=0)
    with pytest.raises(TypeError, match="TrainConfig"):
        form_packs([{"loss": "ce"}])


def _nothing(spec):
    return {}


def test_the_progress_bar_counts_runs_not_packs(demo_configs, capsys):
    """The default demo: 14 runs in 4 packs; the bar said "0/4 runs" (issue 33)."""
    import dataclasses

    from torchcal.experiments import LocalExecutor, run_sweep

    jobs = [dataclasses.replace(j, fn=_nothing)
            for j in map(pack_job, form_packs(demo_configs(DemoConfig(), Path("/x"))))]
    assert len(jobs) == 4 and sum(j.n_runs for j in jobs) == 14
    run_sweep(jobs, LocalExecutor(workers=1), progress=True)
    err = capsys.readouterr().err
    assert "0/14 runs" in err and "14/14 runs" in err and "/4 runs" not in err, err


def test_outcomes_of_reports_every_run_of_a_dead_pack(demo_configs):
    jobs = [pack_job(p) for p in
            form_packs(demo_configs(DemoConfig(**dict(TINY, seeds=(0, 1, 2))), Path("/x")))]
    assert [j.n_runs for j in jobs] == [3, 3]
    dead = failed_result(jobs[0], "worker process died: killed")
    ok = {"error": None, "outcomes": [RunOutcome(c.out_dir, c.loss, c.seed).to_json()
                                      for c in jobs[1].spec["pack"].configs]}
    flat = outcomes_of(jobs, [dead, ok])
    assert len(flat) == 6 and all(isinstance(o, RunOutcome) for o in flat)
    assert [o.error for o in flat] == ["worker process died: killed"] * 3 + [None] * 3
    assert [o.run_dir for o in flat[:3]] == [c.out_dir for c in jobs[0].spec["pack"].configs]


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


def test_run_pack_job_skips_finished_and_reports_bad_runs(demo_configs, tmp_path):
    configs = demo_configs(DemoConfig(out=tmp_path, **dict(TINY, epochs=1)), tmp_path)[:3]
    configs[2] = _changed(configs[2], loss_kwargs={"not_an_argument": 1})
    (pack,) = form_packs(configs, max_lanes=3)
    res = run_pack_job({"pack": pack})
    assert res["error"] is None and len(res["outcomes"]) == 3
    outs = [RunOutcome.from_json(o) for o in res["outcomes"]]
    assert [o.error is None for o in outs] == [True, True, False]
    assert "not_an_argument" in outs[2].error and outs[0].lanes == 3
    (again,) = form_packs(configs[:2], max_lanes=2)
    outs = [RunOutcome.from_json(o) for o in run_pack_job({"pack": again})["outcomes"]]
    assert [o.skipped for o in outs] == [True, True] and outs[0].lanes == 0
    # a job that cannot train its pack at all is one error, each run failed by outcomes_of
    bad = run_pack_job({"pack": "not a pack"})
    assert "Expected `pack` to be a Pack" in bad["error"]
