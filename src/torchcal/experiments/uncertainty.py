"""The uncertainty benchmark: Kirchhof et al. 2024 and Kendall et al. 2018 on MNIST-1D.

``torchcal demo --suite uncertainty`` runs the benchmark registered here as ``uncertainty``
(:data:`UNCERTAINTY`: ``run_demo(DemoConfig(benchmark="uncertainty"))``, the calibration demo's
run function, lock, output directory and runner; its kind makes the jobs and writes the report).
It runs two experiments per seed, each a unit of work (a job function of this module, called
with a JSON-able spec in a worker process):

**Pretrained uncertainty heads** (Kirchhof, Collier, Oh & Kasneci, "Pretrained Visual
Uncertainties", 2024; :func:`kirchhof_unit`).  The MNIST-1D paper's CNN (recipe ``mnist1d-cnn``:
SGD 0.1, momentum 0.9, weight decay 5e-4, batch 128, the recipe's milestones as fractions of the
epochs) is trained on the *upstream* classes 0-4 (MNIST-1D with generator parameters, seed 42).
Its embeddings of the held-out validation split are cached (:class:`EmbeddingCache`) and an
uncertainty head (512-512 MLP, the paper's ranking loss, AdamW ``1e-3 * batch / 256``, cosine,
batch 256) is trained from the cache.  The head is evaluated, unchanged, on the upstream test
split, on the *unseen* classes 5-9 (zero-shot: recall@1 correctness from the embeddings) and on a
*shifted generator* (correlated noise 0.6, iid noise 0.1, shear 2.0; classes 0-4), each beside
the baselines that apply (the classifier's max-probability and entropy, the url code's embedding
norm).  The same backbone is trained a second time with a jointly trained head behind the
stop-gradient (``joint_head.enabled``) to compare the two classifiers' logits; and the time of
a head epoch from the cache is compared with a head epoch that recomputes the embeddings.

**Multi-task uncertainty weighting** (Kendall, Gal & Cipolla, CVPR 2018; :func:`kendall_unit`).
Recipe ``mnist1d-multitask``: one trunk, the digit (cross-entropy) and the generator's
translation (standardised, mean squared error), AdamW 3e-3 cosine.  Arms: a grid of fixed
weightings ``(1, w)``, Kendall's learned weighting, Kendall's weighting with noise of
standard deviation 1 (standardised units) added to the training translation targets, and
:data:`LEARNED_VARIANCE`: a head predicting a mean and a variance per sample (Gaussian NLL,
``regression_variance="sample"``, equal weights).  Every arm with a variance gets the
regression section (:mod:`torchcal.experiments.uncertainty_regression`): the variance calibrated
by σ scaling, and split, normalised and CQR conformal intervals.

Sizes are in :data:`PROFILES` (chosen from measured per-unit costs before any claim was looked
at: ``benchmarks/results/uncertainty_sizing.md``).  Every unit skips work already done in its
directory (finished training runs, valid caches), so rerunning a command continues it.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write_json, atomic_write_text
from ..data import load_splits
from ..report.build import write_report_pages
from ..train import get_recipe, load_model_from_run
from ..train.build import build_data
from ..train.config import JointHeadConfig, TrainConfig
from ..train.device import resolve_device
from ..train.packs import Pack, form_packs, train_pack
from ..uncertainty import EmbeddingCache, evaluate_head, fit_head
from . import calibration  # noqa: F401 - its benchmarks registered first (their order)
from . import uncertainty_report as rep
from .benchmark import Benchmark, BenchmarkKind, register_benchmark
from .demo import DemoConfig
from .runner import Job
from .uncertainty_regression import LEARNED_VARIANCE, regression_section

__all__ = ["SUMMARY_FILE", "UNCERTAINTY", "UNCERTAINTY_SUITE", "write_suite_report", "UncertaintyProfile",
           "PROFILES", "SHIFT", "UPSTREAM", "DOWNSTREAM", "GRID_DEFAULT", "suite_specs",
           "suite_jobs", "kirchhof_unit", "kendall_unit", "run_unit"]

#: The suite's summary file (every unit's result, the claims' verdicts) in its output directory.
SUMMARY_FILE = "suite_results.json"
#: The upstream classes the backbone and the head are trained on, and the unseen ones.
UPSTREAM, DOWNSTREAM = "0-4", "5-9"
#: The shifted generator setting (classes 0-4): the scouting's, 2.4x / 5x / 2.7x the defaults.
SHIFT = {"corr_noise_scale": 0.6, "iid_noise_scale": 0.1, "shear_scale": 2.0}
#: Fixed weightings (1, w) of the default grid.
GRID_DEFAULT = (0.1, 0.3, 1.0, 3.0, 10.0)
#: The recipe's milestones (150 and 250 of 350 epochs) as fractions of a shortened schedule.
_MILESTONE_FRACTIONS = [150 / 350, 250 / 350]


@dataclass(frozen=True)
class UncertaintyProfile:
    """The sizes of one run of the suite."""

    seeds: tuple[int, ...]
    backbone_epochs: int
    upstream_sizes: tuple[int, int, int]  # train, val (the head's fit set), test
    head_epochs: int
    head_width: int
    mt_epochs: int
    mt_sizes: tuple[int, int, int]
    grid: tuple[float, ...]
    target_noise: float = 1.0
    extra_arms: bool = False  # single-task arms, Kendall at the trunk's lr, head fitted on train
    width: int = 64
    mt_width: int = 64
    evidence: bool = True
    notes: dict[str, str] = field(default_factory=dict)


#: ``quick``: a smoke test (its verdicts are not evidence); ``default``: 3 seeds, the recipe's
#: 350 backbone epochs, the default arms (about 135 s estimated on 2 idle cores); ``full``: every
#: arm (a 7-point grid, single-task arms, Kendall at the trunk's learning rate, a head fitted on
#: the training split), 5 seeds (about 4.5 minutes estimated).  Estimates from per-unit CPU
#: times measured before any verdict was read: ``benchmarks/results/uncertainty_sizing.md``.
PROFILES: dict[str, UncertaintyProfile] = {
    "quick": UncertaintyProfile(
        seeds=(0,), backbone_epochs=8, upstream_sizes=(600, 400, 600), head_epochs=10,
        head_width=128, mt_epochs=4, mt_sizes=(600, 200, 600), grid=(0.1, 1.0, 10.0),
        width=32, mt_width=32, evidence=False),
    "default": UncertaintyProfile(
        seeds=(0, 1, 2), backbone_epochs=350, upstream_sizes=(2000, 2000, 4000),
        head_epochs=50, head_width=512, mt_epochs=25, mt_sizes=(4000, 1000, 4000),
        grid=GRID_DEFAULT),
    "full": UncertaintyProfile(
        seeds=(0, 1, 2, 3, 4), backbone_epochs=350, upstream_sizes=(2000, 2000, 4000),
        head_epochs=50, head_width=512, mt_epochs=25, mt_sizes=(4000, 1000, 4000),
        grid=(0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0), extra_arms=True),
}


# ------------------------------------------------------------------------------------------
# the units of work
# ------------------------------------------------------------------------------------------
def _kendall_arms(p: UncertaintyProfile) -> list[dict[str, Any]]:
    arms = [{"arm": f"fixed 1:{w:g}", "weighting": "equal" if w == 1 else f"fixed:1,{w:g}",
             "fixed": [1.0, float(w)]} for w in p.grid]
    arms += [{"arm": "kendall", "weighting": "kendall"},
             {"arm": "kendall, noisy target", "weighting": "kendall",
              "target_noise": p.target_noise},
             {"arm": LEARNED_VARIANCE, "weighting": "equal", "regression_variance": "sample"}]
    if p.extra_arms:
        arms += [{"arm": "kendall, trunk lr", "weighting": "kendall", "log_var_lr": 3e-3},
                 {"arm": "class only", "weighting": "fixed:1,0", "fixed": [1.0, 0.0]},
                 {"arm": "translation only", "weighting": "fixed:0,1", "fixed": [0.0, 1.0]}]
    return arms


def suite_specs(profile: str | UncertaintyProfile, out: str | Path, data_root: str | Path,
                seeds: tuple[int, ...] | None = None, device: str = "cpu"
                ) -> list[dict[str, Any]]:
    """The JSON-able specs of every unit of the suite, Kirchhof's first (the longest); every
    unit trains on ``device`` (``"auto"``: CUDA when available, as ``torchcal train``)."""
    p = PROFILES[profile] if isinstance(profile, str) else profile
    out, root = Path(out), str(data_root)
    seeds = tuple(seeds) if seeds is not None else p.seeds
    sizes = dataclasses.asdict(p)
    specs = [{"kind": "kirchhof", "seed": s, "dir": str(out / "kirchhof" / f"seed{s}"),
              "data_root": root, "profile": sizes, "device": device} for s in seeds]
    for s in seeds:
        for arm in _kendall_arms(p):
            slug = "".join(c if c.isalnum() else "_" for c in arm["arm"]).strip("_")
            specs.append({"kind": "kendall", "seed": s, "data_root": root, "profile": sizes,
                          "dir": str(out / "kendall" / f"{slug}_seed{s}"), "device": device,
                          **arm})
    return specs


def run_unit(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one unit (the job function of every unit): its result, with ``error`` None, or the
    error's traceback (a unit reports its failure instead of raising)."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    try:
        fn = {"kirchhof": kirchhof_unit, "kendall": kendall_unit}[spec["kind"]]
        res = fn(spec)
        res["error"] = None
    except Exception:  # noqa: BLE001 - reported in the result, shown by the report
        res = {"error": traceback.format_exc()}
    res.update({k: spec[k] for k in ("kind", "seed") if k in spec})
    if "arm" in spec:
        res["arm"] = spec["arm"]
    res["unit_seconds"] = time.perf_counter() - t0
    return res


def kendall_unit(spec: dict[str, Any]) -> dict[str, Any]:
    """One two-task run (:mod:`torchcal.train.multitask`) by the one sequence
    (:func:`~torchcal.train.packs.train_pack`); a finished run's verified results are used."""
    p = spec["profile"]
    n_train, n_val, n_test = p["mt_sizes"]
    recipe = get_recipe("mnist1d-multitask")
    mt = dataclasses.replace(recipe.multitask, task_weighting=spec["weighting"],
                             target_noise=float(spec.get("target_noise", 0.0)),
                             regression_variance=spec.get("regression_variance", "task"))
    if "log_var_lr" in spec:
        mt = dataclasses.replace(mt, log_var_lr=float(spec["log_var_lr"]))
    cfg = dataclasses.replace(
        recipe, out_dir=spec["dir"], seed=int(spec["seed"]),
        data_root=spec["data_root"], epochs=int(p["mt_epochs"]), progress=False, resume=True,
        model_kwargs={"width": int(p["mt_width"])}, multitask=mt,
        data_kwargs={"with_params": True, "n_train": n_train, "n_val": n_val, "n_test": n_test})
    if spec.get("device", "cpu") != "cpu":  # a CPU run keeps the recipe's config (reused)
        cfg = dataclasses.replace(cfg, device=spec["device"])
    (outcome,) = train_pack(_alone(cfg), keep_results=True)
    if outcome.error:
        raise RuntimeError(f"Run {outcome.run_dir!r} failed: {outcome.traceback or outcome.error}")
    res = dict(outcome.results["multitask"])
    if outcome.skipped:  # finished by an earlier command: its verified results.json
        res["reused"] = True
    res["regression"] = regression_section(res)
    del res["predictions"]  # in the run's results.json; the suite keeps the section's numbers
    return res


def _alone(cfg: TrainConfig) -> Pack:
    """``cfg`` as a pack of one (:func:`~torchcal.train.packs.form_packs`: a multi-task run, a
    joint head or a lone backbone are never packed with another run)."""
    (pack,) = form_packs([cfg], max_lanes=1)
    return pack


def _backbone_config(spec: dict[str, Any], out: Path, joint: bool):
    p = spec["profile"]
    n_train, n_val, n_test = p["upstream_sizes"]
    epochs = int(p["backbone_epochs"])
    return dataclasses.replace(
        get_recipe("mnist1d-cnn"), out_dir=str(out), seed=int(spec["seed"]), epochs=epochs,
        milestone_fractions=list(_MILESTONE_FRACTIONS), data_root=spec["data_root"],
        model_kwargs={"width": int(p["width"])}, eval_test_every=0, evaluate=False,
        select_best_by="none", checkpoint_every=max(epochs // 10, 1), progress=False,
        num_threads=1, device=spec.get("device", "cpu"), resume=True,
        joint_head=JointHeadConfig(enabled=joint),
        data_kwargs={"classes": UPSTREAM, "n_train": n_train, "n_val": n_val,
                     "n_test": n_test})


@torch.no_grad()
def _logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits on the CPU of ``x`` (on the CPU) through ``model`` (on its device)."""
    model.eval()
    dev = next(model.parameters()).device
    return torch.cat([model(x[s:s + 1024].float().to(dev)).cpu()
                      for s in range(0, x.shape[0], 1024)])


@torch.no_grad()
def _forward_seconds(model: torch.nn.Module, x: torch.Tensor, batch: int) -> float:
    """The fastest of three backbone passes over ``x`` (embeddings and logits, as the cache's
    build does): what recomputing the embeddings costs per head epoch."""
    model.eval()
    dev = next(model.parameters()).device
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for s in range(0, x.shape[0], batch):
            h = model.forward_features(x[s:s + batch].float().to(dev))
            model.fc(h)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return best


def _eval_sets(cfg) -> dict[str, Any]:
    """The test splits the head is evaluated on: upstream, unseen classes, shifted generator."""
    kw = dict(cfg.data_kwargs)
    seed = cfg.data_seed
    return {"upstream": build_data(cfg).test,
            "unseen classes": load_splits("mnist1d", cfg.data_root, seed=seed,
                                          **{**kw, "classes": DOWNSTREAM}).test,
            "shifted generator": load_splits("mnist1d", cfg.data_root, seed=seed,
                                             **{**kw, **SHIFT}).test}


def _cache(path: Path, model, data, name: str, cfg) -> EmbeddingCache:
    return EmbeddingCache.build(
        path, model, data, transform=lambda x: x.float(), batch_size=256,
        device=next(model.parameters()).device,
        data_id={"dataset": "mnist1d", "set": name, "data_kwargs": dict(cfg.data_kwargs),
                 "data_seed": cfg.data_seed}, on_stale="rebuild", progress=False)


def _train_or_resume(cfg: TrainConfig) -> None:
    """Train ``cfg`` by the one sequence (:func:`~torchcal.train.packs.train_pack`: its run
    directory locked; a finished run kept, an unfinished one resumed, one of other settings,
    :func:`~torchcal.train.packs.is_stale`, e.g. another profile's sizes, trained afresh, never
    extended); raises the run's error."""
    (outcome,) = train_pack(_alone(cfg))
    if outcome.error:
        raise RuntimeError(f"Run {outcome.run_dir!r} failed: {outcome.traceback or outcome.error}")


def kirchhof_unit(spec: dict[str, Any]) -> dict[str, Any]:
    """One seed of the pretrained-uncertainty experiment (see the module docstring)."""
    p = spec["profile"]
    d = Path(spec["dir"])
    plain_cfg, joint_cfg = (_backbone_config(spec, d / n, j)
                            for n, j in (("backbone", False), ("backbone_joint", True)))
    for cfg in (plain_cfg, joint_cfg):
        _train_or_resume(cfg)
    dev = str(resolve_device(plain_cfg.device))
    model, _ = load_model_from_run(plain_cfg.out_dir, device=dev)
    joint, _ = load_model_from_run(joint_cfg.out_dir, device=dev)
    splits = build_data(plain_cfg)
    sets = _eval_sets(plain_cfg)
    up_x = sets["upstream"].data
    diff = float((_logits(model, up_x) - _logits(joint, up_x)).abs().max())
    caches = {k: _cache(d / "cache" / k.replace(" ", "_"), model, v, k, plain_cfg)
              for k, v in sets.items()}
    fit_sets = {"validation": splits.val}
    if p["extra_arms"]:
        fit_sets["train"] = splits.train
    heads: dict[str, Any] = {}
    timing: dict[str, float] = {}
    for arm, data in fit_sets.items():
        cache = _cache(d / "cache" / f"fit_{arm}", model, data, f"fit_{arm}", plain_cfg)
        t0 = time.perf_counter()
        fit = fit_head(cache, epochs=int(p["head_epochs"]), batch_size=256,
                       width=int(p["head_width"]), seed=int(spec["seed"]), progress=False)
        seconds = time.perf_counter() - t0
        if arm == "validation":
            timing = {"head_epoch_from_cache": seconds / int(p["head_epochs"]),
                      "backbone_pass": _forward_seconds(model, data.data, 256)}
        heads[arm] = {k: evaluate_head(fit.head, c) if k != "unseen classes"
                      else evaluate_head(fit.head, c, classifier=False)
                      for k, c in caches.items()}
    timing["speedup"] = (timing["backbone_pass"] + timing["head_epoch_from_cache"]) \
        / timing["head_epoch_from_cache"]
    return {"heads": heads, "timing": timing, "stopgrad_max_abs_logit_diff": diff,
            "upstream_accuracy": float((_logits(model, up_x).argmax(1)
                                        == sets["upstream"].labels).double().mean()),
            "fit_rows": len(splits.val)}


# ------------------------------------------------------------------------------------------
# the suite: a benchmark of run_demo
# ------------------------------------------------------------------------------------------
def write_suite_report(units: list[dict[str, Any]], out: Path, profile: str,
                       p: UncertaintyProfile, seconds: float, command: str,
                       figures: bool = True) -> dict[str, Any]:
    """Write report.md and report.html (figures embedded; both by the report engine's
    :func:`~torchcal.report.build.write_report_pages`), suite_results.json, results.csv and the
    figures (``figures=False``: none, ``--no-figures``) of a finished suite; returns the summary
    (suite_results.json's content)."""
    figures = rep.write_figures(units, out) if figures else []
    sizes = dataclasses.asdict(p)
    summary = {"schema": "torchcal.uncertainty_suite/1", "profile": profile,
               "profile_sizes": sizes, "seconds": seconds, "command": command,
               "claims": rep.claim_verdicts(units), "units": units}
    atomic_write_json(out / SUMMARY_FILE, summary)
    atomic_write_text(out / "results.csv", rep.rows_csv(rep.results_rows(units)))
    md = rep.report_markdown(units, profile=profile, p=sizes, figures=figures, seconds=seconds,
                             command=command)
    write_report_pages(out, f"torchcal demo --suite uncertainty ({profile})", md)
    return summary


def suite_jobs(specs: list[dict[str, Any]], fn=run_unit) -> list[Job]:
    """The units as jobs of the experiments layer's runner (:func:`run_sweep`), each running
    ``fn(spec)`` (:func:`run_unit`)."""
    jobs = []
    for s in specs:
        name = f"{s['kind']} seed {s['seed']}" + (f" {s['arm']}" if "arm" in s else "")
        labels = {k: s[k] for k in ("kind", "seed", "arm") if k in s}
        jobs.append(Job(name, fn, s, labels=labels))
    return jobs


# the DemoConfig fields of the calibration benchmarks, with their options of `torchcal demo`
_CALIBRATION_ONLY = {"epochs": "--epochs", "losses": "--losses",
                     "adafocal_lam": "--adafocal-lam", "data_kwargs": "--data-arg",
                     "loss_kwargs": "--loss-arg"}


class _UncertaintySuite(BenchmarkKind):
    """The suite's kind: a benchmark's profiles are :class:`UncertaintyProfile` s; its jobs the
    units of :func:`suite_specs` (data in ``out/data``, every unit on ``--device``: the
    ``device`` of ``DemoConfig.overrides``, default the CPU), its report
    :func:`write_suite_report`'s."""

    def resolve(self, cfg: Any, bench: Benchmark) -> Any:
        """The profile's seeds (or ``cfg.seeds``); the calibration benchmarks' options and
        training settings other than the device refused."""
        for name, flag in _CALIBRATION_ONLY.items():
            if getattr(cfg, name) not in (None, {}, ()):
                raise ValueError(f"Expected no {flag} with --suite {bench.suite} (an option of "
                                 "the calibration benchmarks)")
        # options the suite has no use for are refused, not silently ignored
        if cfg.n_bins != DemoConfig.n_bins:
            raise ValueError(f"Expected no --n-bins with --suite {bench.suite} (its metrics "
                             "are rankings and AUROCs, not binned)")
        if not cfg.pack:
            raise ValueError(f"Expected no --no-pack with --suite {bench.suite} (its units "
                             "train one run at a time)")
        extra = sorted(set(cfg.overrides) - {"device"})
        if extra:
            raise ValueError(f"Expected no --train-arg with --suite {bench.suite} (its units "
                             f"set their own training settings), got {extra}")
        seeds = bench.profile(cfg.profile).seeds if cfg.seeds is None else tuple(cfg.seeds)
        if not seeds:
            raise ValueError("Expected `seeds` to hold at least one seed, got none")
        return dataclasses.replace(cfg, seeds=seeds)

    @staticmethod
    def _sizes(cfg: Any, bench: Benchmark) -> UncertaintyProfile:
        return dataclasses.replace(bench.profile(cfg.profile), seeds=tuple(cfg.seeds))

    def plan(self, cfg: Any, bench: Benchmark, out: Path) -> tuple[list, list[dict[str, Any]]]:
        specs = suite_specs(self._sizes(cfg, bench), out, out / "data",
                            device=cfg.overrides.get("device", "cpu"))
        return suite_jobs(specs, fn=bench.job_fn), specs

    def report(self, cfg: Any, bench: Benchmark, out: Path, specs: list[dict[str, Any]],
               results: list[dict[str, Any]], seconds: float
               ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        command = cfg.command or f"torchcal demo --suite {bench.suite} --{cfg.profile}"
        summary = write_suite_report(results, out, cfg.profile, self._sizes(cfg, bench),
                                     seconds, command, figures=cfg.figures)
        return summary, [(r["name"], r["error"]) for r in results if r.get("error")]

    def summary(self, result: Any) -> str:
        """The claims' verdicts, the lines beyond them and where the report went."""
        s, out = result.report, result.out_dir
        lines = ["## The papers' claims on this benchmark", "",
                 *rep.verdict_lines(s["claims"], evidence=s["profile_sizes"]["evidence"])]
        beyond = rep.beyond_lines(s["units"])
        if beyond:
            lines += ["", "Beyond the claims (computed from the same units):", "", *beyond]
        return "\n".join(lines + [
            "", f"report: {out / 'report.md'}",
            f"        {out / 'report.html'} (figures embedded)  ({s['seconds']:.0f} s, profile "
            f"{s['profile']})"])


#: The uncertainty suite's kind: its units of work and its report.
UNCERTAINTY_SUITE: BenchmarkKind = _UncertaintySuite()

#: ``torchcal demo --suite uncertainty``: the suite as a registered benchmark of
#: :func:`~torchcal.experiments.run_demo`, its profiles :data:`PROFILES`.
UNCERTAINTY = register_benchmark(Benchmark(
    name="uncertainty", title="uncertainty heads and multi-task weighting on MNIST-1D",
    recipe="", profiles=PROFILES, tag="", claims=rep.CLAIMS, prebuild_data=False,
    summary="Kirchhof et al. 2024's pretrained uncertainty heads and Kendall et al. 2018's "
            "multi-task weighting on MNIST-1D", job_fn=run_unit, kind=UNCERTAINTY_SUITE))
