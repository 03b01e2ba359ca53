"""Issue 31 item 6: ``torchcal demo --device`` for both suites, with ``torchcal train``'s values
and default (``auto``: CUDA when present; the demo's runs were forced to the CPU)."""

from __future__ import annotations

from torchcal.cli import main


def test_the_uncertainty_suite_gets_the_device(tmp_path, monkeypatch, capsys):
    import torchcal.experiments.demo as demo

    specs = []

    def sweep(jobs, *a, **k):  # nothing trains: every unit reports an error
        specs.append([j.spec for j in jobs])
        return [{"name": j.name, "error": "not run"} for j in jobs]

    monkeypatch.setattr(demo, "run_sweep", sweep)
    for argv, want in (([], "auto"), (["--device", "cpu"], "cpu")):
        assert main(["demo", "--suite", "uncertainty", "--quick", "--no-progress",
                     "--out", str(tmp_path / want), *argv]) == 1
        assert specs[-1] and {s["device"] for s in specs[-1]} == {want}


def test_the_calibration_demo_passes_the_device_to_every_run(tmp_path, monkeypatch):
    import torchcal.experiments.demo as demo

    specs = []
    monkeypatch.setattr(demo, "run_sweep", lambda jobs, *a, **k: specs.extend(jobs) or [])
    main(["demo", "--quick", "--no-progress", "--device", "cpu", "--out", str(tmp_path / "a")])
    assert specs and all(c.device == "cpu" for j in specs for c in j.spec["pack"].configs)


def test_the_device_is_named_once(tmp_path, capsys):
    assert main(["demo", "--quick", "--device", "cpu", "--train-arg", "device=cpu",
                 "--out", str(tmp_path / "a")]) == 2
    assert "give the device once" in capsys.readouterr().err
