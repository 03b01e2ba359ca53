"""``run_demo``: a registered benchmark's runs, trained by the sweep runner, then its report.

Every benchmark runs through :func:`run_demo`: its kind (:class:`~torchcal.experiments.
benchmark.BenchmarkKind`) makes its jobs and writes its report, ``run_demo`` owns the output
directory (one run at a time, a fresh one by default) and runs the jobs.  The calibration
benchmarks' kind, :data:`TRAINING_RUNS`, is this module's: one training run per loss and seed,
each resolved once here into its TrainConfig
(:func:`~torchcal.experiments.training.benchmark_config`), the packs formed once
(:func:`~torchcal.train.packs.form_packs`), one job per pack.
Runs are trained by an executor (default: worker processes of this machine, spawn, one thread
each; or a Ray cluster, :class:`~torchcal.experiments.ray_executor.RayExecutor`); each run is
evaluated through the same path as real runs (saved logits -> temperatures -> metrics ->
``results.json``) and the runs are aggregated by :func:`torchcal.report.build_report`.

Determinism: a run depends only on its (loss, seed, settings): each worker uses one thread and
the trainer seeds everything from the run's seed, so the same command gives the same numbers
whatever the number of workers or the executor.

Interruption: the demo owns its ``out`` directory (and each job its run directory) while it
runs.  Running the same command with the same ``out`` continues where it stopped: finished runs
are skipped, unfinished ones resume from their last checkpoint (written every tenth of the
epochs), runs of other settings (a changed identity or schedule field) are trained afresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import sys
import time
import warnings
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import exclusive_lock
from .._registry import unknown_name
from .._validation import check_scalar
from ..data import DATASETS
from ..ensemble import SEED_SUBSET_SIZE, evaluate_ensemble, seed_subsets
from ..errors import ResultsFileError
from ..losses import list_losses
from ..report.build import FIGURE_FORMATS, build_report, figure_set, prepare_report_dir
from ..results_file import meta_from_config
from ..run_dir import RunDir
from ..train import TrainConfig, get_recipe
from ..train.build import build_data
from ..train.config import config_identity
from ..train.packs import RunOutcome, form_packs
from ..train.run import build_loss
from .benchmark import (
    DEFAULT_KIND,
    KINDS,
    Benchmark,
    BenchmarkKind,
    IntroContext,
    committed_note,
    get_benchmark,
)
from .runner import Executor, Job, LocalExecutor, run_sweep
from .training import benchmark_config, outcomes_of, pack_job

# the calibration benchmarks (torchcal.experiments.calibration) name TRAINING_RUNS as their
# kind; the package imports them before any benchmark is looked up
__all__ = ["DemoConfig", "DemoResult", "applicable_losses", "resolve",
           "run_demo", "default_out", "intro_text", "appendix_text",
           "verdict_label", "seed_ensembles", "ENSEMBLES_DIR", "TRAINING_RUNS", "debug_env",
           "DEBUG_ENV"]

#: The demo's directory of the losses' ensembles (``OUT/ensembles/<loss>/``).
ENSEMBLES_DIR = "ensembles"


@dataclass
class DemoConfig:
    """Settings of :func:`run_demo` (the command line's knobs)."""

    seeds: tuple[int, ...] | None = None  # None: the profile's (quick/full/default)
    epochs: int | None = None  # None: the profile's (quick/full/default)
    losses: tuple[str, ...] | None = None  # None: the profile's
    workers: int = 2
    out: Path | None = None  # None: a fresh directory under ./torchcal-demo/
    n_bins: int = 15
    adafocal_lam: float | None = None  # None: the benchmark's (digits 0.1, MNIST-1D the paper's 1)
    loss_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-loss overrides
    # declared options of the benchmark's data set (torchcal.data.registry), over the
    # benchmark's own (digits: noise_std 0.5): MNIST-1D n_train, ...; digits noise_std, n_copies
    data_kwargs: dict[str, Any] = field(default_factory=dict)
    progress: bool = True
    quick: bool = False
    figures: bool | str = True
    figure_format: str = "svg"  # the default figures' format: svg or png (torchcal.report)
    recipe: str | None = None  # None: the benchmark's
    benchmark: str = "mnist1d"  # a registered benchmark (torchcal.experiments.list_benchmarks)
    full: bool = False  # every tagged loss, the recipe's schedule, 5 seeds
    overrides: dict[str, Any] = field(default_factory=dict)  # extra TrainConfig fields
    pack: bool = True  # train runs that share a model and a recipe as packs (--no-pack: off)
    command: str = ""  # the command line, for a report that quotes it (the uncertainty suite's)
    @property
    def profile(self) -> str:
        """The benchmark's profile these settings select: ``quick``, ``full`` or ``default``."""
        if self.quick and self.full:
            raise ValueError("Expected at most one of `quick` and `full`, got both")
        return "full" if self.full else "quick" if self.quick else "default"


@dataclass
class DemoResult:
    """What :func:`run_demo` returns: the output directory, the built report (the calibration
    benchmarks': a ``ReportOutput``; another kind's: what its ``report`` returns, the
    uncertainty suite's summary dict), the failed runs as ``(run_dir or unit name, error)``
    pairs, the wall time in seconds and the configuration used (resolved)."""

    out_dir: Path
    report: Any  # torchcal.report.build.ReportOutput, or the benchmark kind's report
    failed: list[tuple[str, str]]
    seconds: float
    config: DemoConfig


def applicable_losses(dataset: str = "mnist1d") -> list[str]:
    """The registered losses tagged for the benchmark (table order): its ``full`` list."""
    return get_benchmark(dataset).losses("full")


def resolve(cfg: DemoConfig) -> DemoConfig:
    """``cfg`` with every None filled from its benchmark's profile (default, quick or full)."""
    bench = get_benchmark(cfg.benchmark)
    return bench.kind.resolve(cfg, bench)


def _resolve(cfg: DemoConfig, bench: Benchmark) -> DemoConfig:
    name = cfg.profile
    prof = bench.profile(name)
    lam = bench.loss_kwargs.get("adafocal", {}).get("lam")
    return dataclasses.replace(
        cfg,
        seeds=cfg.seeds if cfg.seeds is not None else prof.seeds,
        epochs=cfg.epochs if cfg.epochs is not None else prof.epochs,
        losses=cfg.losses or tuple(bench.losses(name)),
        recipe=cfg.recipe or bench.recipe,
        data_kwargs={**bench.data_kwargs, **cfg.data_kwargs},
        adafocal_lam=cfg.adafocal_lam if cfg.adafocal_lam is not None else lam,
    )


def _loss_kwargs(cfg: DemoConfig, bench: Benchmark, loss: str) -> dict[str, Any]:
    kw = dict(bench.loss_kwargs.get(loss, {}))
    if loss == "adafocal" and cfg.adafocal_lam is not None:
        kw["lam"] = float(cfg.adafocal_lam)
    kw.update(cfg.loss_kwargs.get(loss, {}))
    return kw


#: Set to ``1`` (``torchcal demo --debug``): a failed run's traceback is printed, not one line.
DEBUG_ENV = "TORCHCAL_DEBUG"


@contextlib.contextmanager
def debug_env(debug: bool) -> Iterator[None]:
    """``TORCHCAL_DEBUG=1`` (:data:`DEBUG_ENV`) for the block when ``debug`` (``torchcal demo
    --debug``): the demo then prints each failed run's traceback."""
    if not debug:
        yield
        return
    old = os.environ.get(DEBUG_ENV)
    os.environ[DEBUG_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = old


def default_out() -> Path:
    """A fresh directory ``./torchcal-demo/YYYYmmdd-HHMMSS[-k]`` (not created)."""
    base = Path.cwd() / "torchcal-demo"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    p = base / stamp
    k = 1
    while p.exists():
        k += 1
        p = base / f"{stamp}-{k}"
    return p


def _run_configs(cfg: DemoConfig, bench: Benchmark, out: Path) -> list[TrainConfig]:
    """The demo's runs, seed-major, each resolved once
    (:func:`~torchcal.experiments.training.benchmark_config`)."""
    kwargs = {loss: _loss_kwargs(cfg, bench, loss) for loss in cfg.losses}
    return [benchmark_config(cfg.recipe, loss=loss, loss_kwargs=kwargs[loss], seed=int(seed),
                             run_dir=str(out / "runs" / loss / f"seed{seed}"),
                             epochs=cfg.epochs, n_bins=int(cfg.n_bins),
                             data_kwargs=cfg.data_kwargs, overrides=cfg.overrides)
            for seed in cfg.seeds for loss in cfg.losses]


def _context(cfg: DemoConfig, configs: Sequence[TrainConfig],
             bench: Benchmark | None = None, **kw: Any) -> IntroContext:
    """The prose's context; ``bench`` given, ``cfg`` is already resolved against it."""
    if bench is None:
        bench = get_benchmark(cfg.benchmark)
        cfg = _resolve(cfg, bench)
    return IntroContext(
        benchmark=bench, config=cfg, train_config=configs[0],
        losses=list(cfg.losses), loss_kwargs={n: _loss_kwargs(cfg, bench, n) for n in cfg.losses},
        n_jobs=len(configs), **kw)


def intro_text(cfg: DemoConfig, configs: Sequence[TrainConfig], *, seconds: float = 0.0,
               failed: list[tuple[str, str]] | None = None, skipped: int = 0,
               bench: Benchmark | None = None) -> str:
    """The benchmark's report prose for the runs ``configs`` of ``cfg`` (a few lines);
    ``bench``: the benchmark ``cfg`` was resolved against (looked up when None)."""
    ctx = _context(cfg, configs, bench, seconds=seconds, failed=failed or [], skipped=skipped)
    return ctx.benchmark.intro(ctx) if ctx.benchmark.intro is not None else ""


def appendix_text(cfg: DemoConfig, configs: Sequence[TrainConfig],
                  bench: Benchmark | None = None) -> str:
    """The benchmark's report appendix for the runs ``configs`` of ``cfg``: the setting in
    full and the registered losses not trained, with why."""
    ctx = _context(cfg, configs, bench)
    return ctx.benchmark.appendix(ctx) if ctx.benchmark.appendix is not None else ""


def verdict_label(cfg: DemoConfig, configs: Sequence[TrainConfig],
                  resolved: bool = False) -> str:
    """What every verdict line of a shortened run says beside "Verdict" ("" on the recipe's
    schedule): ``--quick`` is a smoke test whose verdicts are not evidence.  ``resolved``:
    ``cfg`` is already resolved (:func:`resolve`)."""
    cfg = cfg if resolved else resolve(cfg)
    epochs, full = configs[0].epochs, int(get_recipe(cfg.recipe).epochs)
    if epochs == full:
        return ""
    if cfg.quick:
        return f"--quick smoke test, {epochs} of {full} epochs: not evidence"
    return f"shortened schedule, {epochs} of {full} epochs"


def _check_settings(configs: list[TrainConfig], bench: Benchmark) -> None:
    """Raise ValueError for settings no run could train with (data set options its
    registration does not declare or allow, bad loss arguments; the other fields are checked
    once per run by :func:`~torchcal.train.packs.form_packs`).

    Each distinct loss is built here once (microseconds), besides the one build per run in
    the worker that trains it: a bad ``--loss-arg`` then stops the demo with one line before
    any worker starts, instead of failing every run of that loss in the workers."""
    tc = configs[0]
    DATASETS.get(tc.dataset).check(tc.data_kwargs)
    seen = set()
    for c in configs:
        if c.loss not in seen:
            seen.add(c.loss)
            build_loss(c)
    if bench.prebuild_data:  # checks the data options as the runs will use them; generated
        # data (MNIST-1D) is generated (and cached) here once, not by every worker at once
        try:
            build_data(tc)
        except TypeError as exc:
            raise ValueError(str(exc)) from exc


def _check(cfg: DemoConfig) -> None:
    if not cfg.seeds:
        raise ValueError("Expected `seeds` to hold at least one seed, got none")
    figure_set(cfg.figures)  # the report's settings are checked before anything trains
    if cfg.figure_format not in FIGURE_FORMATS:
        raise ValueError(f"Expected `figure_format` to be one of {FIGURE_FORMATS}, got "
                         f"{cfg.figure_format!r}")
    check_scalar(cfg.workers, "workers", int, min_val=1)
    check_scalar(cfg.epochs, "epochs", int, min_val=1, allow_none=True)
    known = set(list_losses())
    bad = [n for n in cfg.losses if n not in known]
    if bad:
        raise ValueError("; ".join(unknown_name("loss", n, known) for n in bad))
    extra = sorted(set(cfg.loss_kwargs) - set(cfg.losses))
    if extra:
        raise ValueError(f"Loss arguments given for {extra}, which the demo does not train "
                         f"(training: {', '.join(cfg.losses)})")


class _TrainingRuns(BenchmarkKind):
    """The calibration benchmarks' kind: one training run per (loss, seed), packed by default,
    the report of :func:`~torchcal.report.build_report` with the seeds' ensembles."""

    unit = "run"

    def resolve(self, cfg: DemoConfig, bench: Benchmark) -> DemoConfig:
        cfg = _resolve(cfg, bench)
        _check(cfg)
        return cfg

    def command(self, bench: Benchmark) -> str:
        return "torchcal demo"

    def suite(self, bench: Benchmark) -> str:
        return "calibration"

    def plan(self, cfg: DemoConfig, bench: Benchmark, out: Path
             ) -> tuple[list[Job], list[TrainConfig]]:
        configs = _run_configs(cfg, bench, out)  # each run resolved once, here
        # the packs are formed here, once (each config checked once); --no-pack: packs of one
        packs = form_packs(configs, max_lanes=None if cfg.pack else 1)
        _check_settings(configs, bench)  # a bad knob is one error here, not one per run
        return [pack_job(p, fn=bench.job_fn) for p in packs], configs

    def collect(self, jobs: Sequence[Job], results: Sequence[dict[str, Any]]
                ) -> list[RunOutcome]:
        return outcomes_of(jobs, results)

    def report(self, cfg: DemoConfig, bench: Benchmark, out: Path, configs: list[TrainConfig],
               results: list[RunOutcome], seconds: float) -> tuple[Any, list[tuple[str, str]]]:
        failed = [(o.run_dir, o.error) for o in results if o.error]
        debug = os.environ.get(DEBUG_ENV) == "1"  # the traceback only with --debug
        for o in results:
            if o.error:
                print(f"torchcal demo: run {o.run_dir} failed: "
                      + (f"\n{o.traceback or o.error}" if debug else
                         " ".join(str(o.error).split())), file=sys.stderr)
        intro = intro_text(cfg, configs, seconds=seconds, failed=failed,
                           skipped=sum(o.skipped for o in results), bench=bench)
        pooled = {x for c in bench.claims if c.per == "seed_set" for x in c.losses}
        ensembles = seed_ensembles(configs, out, n_bins=cfg.n_bins, failed=failed,
                                   subset_losses=pooled)
        label = verdict_label(cfg, configs, resolved=True)
        rep = build_report([str(c.out_dir) for c in configs] + ensembles, out,
                           title=f"torchcal demo: {bench.title}",
                           intro=intro, appendix=appendix_text(cfg, configs, bench),
                           n_bins=cfg.n_bins,
                           figures=cfg.figures, figure_format=cfg.figure_format,
                           claims=tuple(bench.claims) or False,
                           verdict_label=label, preface=committed_note(bench) if label else "",
                           identity_of=config_identity)
        return rep, failed


#: The calibration benchmarks' kind, the default of ``Benchmark.kind``
#: (:mod:`torchcal.experiments.calibration` names it); what ``torchcal demo`` prints after
#: their runs is the command line's (the report's tail, as ``torchcal report`` prints it), so
#: it has no ``summary``.
TRAINING_RUNS: BenchmarkKind = KINDS.register(DEFAULT_KIND, _TrainingRuns())


def run_demo(cfg: DemoConfig | None = None, executor: Executor | None = None) -> DemoResult:
    """Run a registered benchmark (``cfg.benchmark``) and write its report; returns where
    everything went.

    Its kind (``Benchmark.kind``; the calibration benchmarks': :data:`TRAINING_RUNS`) resolves
    the settings, makes
    the jobs and writes the report; the jobs run through the runner with ``executor`` (default
    ``LocalExecutor(workers=cfg.workers)``), in ``cfg.out`` (default: a fresh directory,
    :func:`default_out`), which this call owns while it runs (a second run into it is refused
    at once, :class:`~torchcal.errors.InUseError`).
    """
    t_start = time.perf_counter() - _process_age()
    cfg = cfg or DemoConfig()
    bench = get_benchmark(cfg.benchmark)  # looked up once; the workers get resolved configs
    kind = bench.kind
    cfg = kind.resolve(cfg, bench)
    out = Path(cfg.out) if cfg.out is not None else default_out()
    # one demo per out directory at a time; that of an earlier demo is continued (its finished
    # runs are skipped, its unfinished ones resumed), its old figures removed
    with exclusive_lock(out, what="Demo directory"):
        prepare_report_dir(out, "out")
        jobs, units = kind.plan(cfg, bench, out)
        executor = executor if executor is not None else LocalExecutor(workers=cfg.workers)
        desc = kind.command(bench)
        results = kind.collect(jobs, run_sweep(jobs, executor, progress=cfg.progress,
                                               desc=desc))
        rep, failed = kind.report(cfg, bench, out, units, results,
                                  time.perf_counter() - t_start)
    return DemoResult(out_dir=out, report=rep, failed=failed,
                      seconds=time.perf_counter() - t_start, config=cfg)


def seed_ensembles(configs: Sequence[TrainConfig], out: Path, *, n_bins: int = 15,
                   failed: list[tuple[str, str]] = (),
                   subset_losses: Collection[str] = ()) -> list[Path]:
    """Per loss with 2 or more evaluated seeds (runs of ``configs`` with a results file, not in
    ``failed``): the ensemble of those seeds, evaluated and written to
    ``OUT/ensembles/<loss>/`` (:func:`torchcal.ensemble.evaluate_ensemble`: temperatures fitted
    on validation, numbers on test, both "pool then calibrate" and "calibrate then pool"),
    marked ``predictor="ensemble"`` with its seeds in ``meta.members``.  For each loss of
    ``subset_losses`` (those the ensemble claims compare) with more seeds than
    :data:`~torchcal.ensemble.SEED_SUBSET_SIZE`, also the ensemble of every subset of that many
    seeds (:func:`~torchcal.ensemble.seed_subsets`; 10 of 3 with 5 seeds), in
    ``OUT/ensembles/<loss>/subsets/<seeds>/``: the seed sets the claims are tested on.  Returns
    the ensembles' directories; an ensemble that cannot be built (runs that predicted other
    samples) is reported on stderr and left out.

    Only the seeds of one configuration are pooled: runs of a loss whose identity differs
    (:func:`torchcal.train.config.config_identity` of their config: another learning rate,
    another number of epochs...) are kept apart from the loss's main set (the most runs), named
    with the reason in a warning, and pooled among themselves in
    ``OUT/ensembles/<loss>-<identity>/``."""
    bad = {str(d) for d, _e in failed}
    by_loss: dict[str, list[dict[str, Any]]] = {}
    for c in configs:
        run_dir = str(c.out_dir)
        if run_dir not in bad and RunDir(run_dir).results().is_file():
            by_loss.setdefault(c.loss, []).append({"run_dir": run_dir, "loss": c.loss,
                                                   "seed": c.seed,
                                                   **(config_identity(c) or {})})
    dirs = []
    for loss, runs in by_loss.items():
        for name, done in _identity_sets(loss, runs):
            dirs += _ensembles_of(loss, name, done, out, n_bins=n_bins,
                                  subsets=loss in subset_losses)
    return dirs


def _identity_sets(loss: str, runs: list[dict[str, Any]]) -> list[tuple[str, list[dict]]]:
    """The runs of ``loss`` split by identity: ``(directory name, runs)``, the main set (most
    runs, then the first run directory) named ``loss``, each other ``loss-<identity>`` and
    named in a warning with the settings that differ."""
    sets: dict[Any, list[dict[str, Any]]] = {}
    for r in runs:
        sets.setdefault(r.get("identity"), []).append(r)
    order = sorted(sets.values(), key=lambda rs: (-len(rs), min(str(r["run_dir"]) for r in rs)))
    main = order[0]
    out = [(loss, main)]
    for rs in order[1:]:
        a, b = main[0].get("identity_fields") or {}, rs[0].get("identity_fields") or {}
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        def values(f: dict[str, Any], diff: list[str] = diff) -> str:
            return ", ".join(f"{k} {json.dumps(f.get(k))}" for k in diff)
        names = ", ".join(str(r["run_dir"]) for r in rs)
        why = (f" ({values(b)}) kept apart from the {len(main)} runs of {loss} at {values(a)}: "
               f"identity differs in {', '.join(diff)}") if diff else (
            f" kept apart from the {len(main)} runs of {loss}: identity "
            f"{rs[0].get('identity') or 'unknown'}, theirs {main[0].get('identity') or 'unknown'}")
        warnings.warn(f"{names}{why}; not pooled into one ensemble",
                      UserWarning, stacklevel=3)
        out.append((f"{loss}-{rs[0].get('identity') or 'unknown'}", rs))
    return out


def _ensembles_of(loss: str, name: str, done: list[dict[str, Any]], out: Path, *, n_bins: int,
                  subsets: bool) -> list[Path]:
    """The ensemble of the seeds ``done`` of one configuration of ``loss`` (2 or more) in
    ``OUT/ensembles/<name>/`` and, with ``subsets``, those of every subset of
    :data:`~torchcal.ensemble.SEED_SUBSET_SIZE` of them (:func:`seed_ensembles`)."""
    dirs: list[Path] = []
    if len(done) < 2:
        return dirs
    done = sorted(done, key=lambda j: j["seed"])
    sets = [(out / ENSEMBLES_DIR / name, done)]
    if subsets and len(done) > SEED_SUBSET_SIZE:
        by_seed = {int(j["seed"]): j for j in done}
        sets += [(out / ENSEMBLES_DIR / name / "subsets" / "-".join(map(str, s)),
                  [by_seed[x] for x in s]) for s in seed_subsets(by_seed)]
    temps: dict[str, dict[str, float]] = {}  # {method: {run_dir: T}} of the first
    for ens_dir, members in sets:
        meta = meta_from_config(RunDir(members[0]["run_dir"]).config)
        meta.update(members=[int(j["seed"]) for j in members],
                    **{k: members[0][k] for k in ("identity", "identity_fields")
                       if k in members[0]})
        given = {m: [t[j["run_dir"]] for j in members] for m, t in temps.items()} or None
        try:
            res = evaluate_ensemble([j["run_dir"] for j in members], ens_dir,
                                    n_bins=n_bins, meta=meta, member_temperatures=given)
        except (ValueError, ResultsFileError) as exc:
            print(f"torchcal demo: no ensemble of {loss} (seeds "
                  f"{', '.join(map(str, meta['members']))}): {exc}", file=sys.stderr)
            if not temps:
                break  # the subsets' runs are the same runs
            continue
        if not temps:  # the ensemble of all the seeds: each run's temperatures, once
            temps = {m: dict(zip((j["run_dir"] for j in members), res["meta"][key],
                                 strict=True))
                     for m, key in (("grid_ece", "member_temperatures"),
                                    ("nll", "member_temperatures_nll"))}
        dirs.append(ens_dir)
    return dirs


def _process_age() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere 0, the time from
    :func:`run_demo`'s call), so that the demo's wall time includes the interpreter's start-up."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
