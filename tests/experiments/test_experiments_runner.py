"""Issue 23 item 2: one sweep runner; the unit of work is a Job with a pluggable function."""

from __future__ import annotations

import os

import pytest

from torchcal.experiments import Job, LocalExecutor, Resources, run_sweep
from torchcal.experiments.runner import failed_result


def _echo(spec):
    return {"error": None, "value": spec["x"] * 2}


def _raises(spec):
    raise RuntimeError(f"bad {spec['x']}")


def _dies(spec):
    os._exit(3)  # a worker killed mid-job (out of memory, SIGKILL)


def test_results_in_job_order_with_name_and_seconds():
    jobs = [Job(f"j{i}", _echo, {"x": i}) for i in range(3)]
    res = run_sweep(jobs, LocalExecutor(workers=1), progress=False)
    assert [r["value"] for r in res] == [0, 2, 4] and [r["name"] for r in res] == ["j0", "j1", "j2"]
    assert all(r["error"] is None and r["seconds"] >= 0 for r in res)
    assert jobs[0].resources == Resources(cpus=1.0, gpus=0.0)


def test_a_raising_job_is_reported_and_the_others_go_on():
    res = run_sweep([Job("a", _raises, {"x": 1}), Job("b", _echo, {"x": 1})],
                    LocalExecutor(workers=1), progress=False)
    assert res[0]["error"] == "RuntimeError: bad 1" and "Traceback" in res[0]["traceback"]
    assert res[1]["error"] is None


def test_a_dead_worker_fails_its_job_by_name_and_labels():
    # two jobs, so that they run in worker processes (one job runs in this process)
    res = run_sweep([Job("dies", _dies, {}, labels={"run_dir": "/r/dies"}),
                     Job("dies too", _dies, {})], LocalExecutor(workers=2), progress=False)
    r = res[0]
    assert r["name"] == "dies" and r["run_dir"] == "/r/dies"
    assert r["error"].startswith("worker process died")
    assert failed_result(Job("x", _echo, {}, labels={"seed": 1}), "lost")["seed"] == 1


def test_job_names_must_be_distinct():
    with pytest.raises(ValueError, match="distinct names"):
        run_sweep([Job("a", _echo, {"x": 1})] * 2, LocalExecutor(workers=1), progress=False)
