"""Issue 23 item 2: the Ray executor.  One local Ray instance (2 CPUs) for the module; a small
sweep through it gives the local executor's results.csv bit for bit, a task killed mid-run is
retried and resumes from its checkpoint, a task that keeps dying is reported by name."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor needs `ray` (pip install torchcal[ray])")

from test_experiments_resolved import _cfg, _check_runs, parent_recipe  # noqa: E402, F401 - same folder

import torchcal  # noqa: E402
from torchcal.cli import main  # noqa: E402
from torchcal.experiments import Job, LocalExecutor, RayExecutor, pack_job, run_sweep  # noqa: E402
from torchcal.experiments.training import benchmark_config, run_pack_job  # noqa: E402
from torchcal.results_file import read_results  # noqa: E402
from torchcal.train.packs import form_packs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")
SRC = str(Path(torchcal.__file__).resolve().parents[1])  # the torchcal under test, for workers


@pytest.fixture(scope="module")
def ray_instance():
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = SRC + (os.pathsep + old if old else "")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the jobs defined here
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _pack(run_dir, loss="ce", seed=0, epochs=3):
    """One run, alone: a pack of one."""
    cfg = benchmark_config("digits-mlp", loss=loss, seed=seed, epochs=epochs,
                           data_kwargs={"noise_std": 0.5}, run_dir=str(run_dir))
    (pack,) = form_packs([cfg])
    return pack


def _dies_once_mid_run(spec):
    """``run_pack_job``, but the first attempt kills its worker process (``os._exit``) as soon
    as the run's first checkpoint exists; the retry runs ``run_pack_job`` and says where it
    resumed."""
    from torchcal.train.checkpoint import load_checkpoint

    run, marker = Path(spec["pack"].configs[0].out_dir), Path(spec["marker"])
    if marker.exists():  # the retry
        ckpt = run / "checkpoints" / "last.pt"
        at = int(load_checkpoint(ckpt)["epoch"]) if ckpt.exists() else 0
        return {**run_pack_job(spec), "resumed_at": at}

    def kill_after_first_checkpoint():
        while not (run / "checkpoints" / "last.pt").exists():
            time.sleep(0.002)
        log = run / "log.jsonl"  # written before the epoch's checkpoint
        marker.write_text(log.read_text() if log.exists() else "")
        os._exit(1)

    threading.Thread(target=kill_after_first_checkpoint, daemon=True).start()
    run_pack_job(spec)
    time.sleep(60)  # never reached before the kill: the run is long enough
    return {"error": "the worker was not killed"}


def _always_dies(spec):
    os._exit(1)


def test_ray_gives_the_local_results_csv_bit_for_bit(ray_instance, tmp_path, capsys):
    """`torchcal demo --executor ray` (the module's Ray instance) and `--executor local`."""
    argv = ["demo", "--benchmark", "digits", "--losses", "ce,focal", "--seeds", "0,1", "--epochs",
            "3", "--no-progress", "--no-figures"]
    assert main([*argv, "--workers", "1", "--out", str(tmp_path / "local")]) == 0  # in-process
    assert main([*argv, "--executor", "ray", "--out", str(tmp_path / "ray")]) == 0
    csv = {k: (tmp_path / k / "results.csv").read_text().replace(str(tmp_path / k), "OUT")
           for k in ("local", "ray")}
    assert csv["ray"] == csv["local"] and csv["ray"].count("\n") == 5
    capsys.readouterr()
    # the same command again: every run is skipped on Ray too (nothing rewritten)
    res = tmp_path / "ray" / "runs" / "ce" / "seed0" / "results.json"
    stamp = res.stat().st_mtime_ns
    assert main([*argv, "--executor", "ray", "--out", str(tmp_path / "ray")]) == 0
    assert res.stat().st_mtime_ns == stamp
    assert "4 of 4 runs were already finished" in (tmp_path / "ray" / "report.md").read_text()


def test_a_killed_task_is_retried_and_resumes_and_a_lost_one_is_named(ray_instance, tmp_path):
    epochs = 40
    killed = {"pack": _pack(tmp_path / "killed", epochs=epochs),
              "marker": str(tmp_path / "marker")}
    jobs = [Job("killed once", _dies_once_mid_run, killed,
                labels={"run_dir": str(tmp_path / "killed")}),
            Job("always dies", _always_dies, {}, labels={"run_dir": "/nowhere"}),
            pack_job(_pack(tmp_path / "fine", seed=1))]
    res = run_sweep(jobs, RayExecutor(max_retries=1), progress=False)
    first_attempt_log = (tmp_path / "marker").read_text().splitlines()
    # the killed run: retried, resumed from its checkpoint (epoch 1's log line, with its
    # timing, is the first attempt's), finished, and equal to a run never killed
    assert res[0]["error"] is None and res[0]["resumed_at"] >= 1, res[0]
    assert res[0]["outcomes"][0]["error"] is None, res[0]
    log = (tmp_path / "killed" / "log.jsonl").read_text().splitlines()
    assert len(log) == epochs and log[0] == first_attempt_log[0]
    ref = run_sweep([pack_job(_pack(tmp_path / "ref", epochs=epochs))],
                    LocalExecutor(workers=1), progress=False)
    assert ref[0]["error"] is None
    a, b = read_results(tmp_path / "killed"), read_results(tmp_path / "ref")
    assert json.dumps(a["test"], sort_keys=True) == json.dumps(b["test"], sort_keys=True)
    # the task that keeps dying: reported by name after its retries; the other runs went on
    assert res[1]["run_dir"] == "/nowhere" and "'always dies'" in res[1]["error"]
    assert "after 1 retries" in res[1]["error"]
    assert res[2]["outcomes"][0]["error"] is None and read_results(tmp_path / "fine")["meta"]["epoch"] == 3


def test_a_recipe_registered_in_the_driver_only_trains_on_ray(parent_recipe, ray_instance,
                                                              tmp_path):
    """Issue 32 item 2: the Ray tasks train the resolved TrainConfig of a recipe the
    driver registered (their torchcal does not know it), as this process does."""
    from torchcal.experiments import run_demo

    assert run_demo(_cfg(tmp_path / "ray"), RayExecutor()).failed == []
    assert run_demo(_cfg(tmp_path / "here"), LocalExecutor(workers=1)).failed == []
    assert _check_runs(tmp_path / "ray") == _check_runs(tmp_path / "here")
