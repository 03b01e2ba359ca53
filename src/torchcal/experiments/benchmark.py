"""A benchmark as data: its recipe and runs, its sizes, its claims and its report prose.

A :class:`Benchmark` names a training recipe, the loss tag that selects its losses from the
loss registry (``tags={"demo"}`` on a loss's ``@register_loss``: adding a loss to the library
touches no file here), per-loss arguments, its sizes (:class:`Profile`: ``default``, ``quick``,
``full``), the claims its report tests, where its committed full run's results live (the
verdicts the report quotes are computed from them, never written as constants), the prose of
its report (``intro``) and the job function that executes one run.  Benchmarks are registered
by name (:func:`register_benchmark`, :func:`get_benchmark`), as losses and models are.

A benchmark whose units are not the calibration losses' training runs (the uncertainty suite,
:mod:`torchcal.experiments.uncertainty`) names a :class:`BenchmarkKind`: how its jobs are made
from a profile and how its report is written.  :func:`~torchcal.experiments.run_demo` runs every
benchmark the same way: one lock on its output directory, a fresh directory by default, the
jobs through the one runner (:func:`~torchcal.experiments.runner.run_sweep`) and its executors,
report.md and report.html written by the report engine (:mod:`torchcal.report.build`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._registry import Registry
from ..data import DATASETS
from ..losses import LOSSES, list_losses
from ..report.aggregate import group_runs, runs_from_results_csv
from ..report.claims import Claim, check_claims
from ..train import TrainConfig, get_recipe
from .training import run_pack_job

__all__ = ["Profile", "Benchmark", "BenchmarkKind", "IntroContext", "BENCHMARKS", "register_benchmark", "get_benchmark",
           "list_benchmarks", "KINDS", "DEFAULT_KIND", "tagged_losses", "committed_verdicts", "committed_note",
           "PROFILE_NAMES", "size_help", "data_options_help"]

#: The sizes every benchmark defines: ``default``, ``quick`` (a smoke test), ``full`` (the
#: published schedule).
PROFILE_NAMES = ("default", "quick", "full")
# where the repository's committed results are looked up (a source checkout; an installed
# wheel has no docs/ and its reports omit the committed run's verdicts)
_REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Profile:
    """One size of a benchmark.

    Attributes:
        seeds: the seeds trained.
        epochs: epochs per run (None: the recipe's; milestones keep the recipe's fractions).
        losses: the losses trained (None: every registered loss with the benchmark's tag).
        measured: the wall time measured for this size, for the command line's help.
    """

    seeds: tuple[int, ...]
    epochs: int | None = None
    losses: tuple[str, ...] | None = None
    measured: str | None = None


class BenchmarkKind:
    """How :func:`~torchcal.experiments.run_demo` runs a benchmark (``Benchmark.kind``): the
    benchmark's settings, its jobs and its report.  ``run_demo`` does the rest for every kind:
    the lock on the output directory, a fresh directory by default, the executor and the runner
    (skipping or resuming finished work belongs to the job functions, as for training runs).
    The calibration benchmarks' kind (one training run per loss and seed, the report of
    :func:`torchcal.report.build_report`), the default, is
    :data:`torchcal.experiments.TRAINING_RUNS`; the uncertainty suite's is
    :data:`torchcal.experiments.UNCERTAINTY_SUITE`.

    Attributes:
        unit: what one job is called in messages ("1 unit(s) failed").
    """

    unit = "unit"

    def suite(self, bench: Benchmark) -> str:
        """The ``torchcal demo --suite`` that runs ``bench`` (default: its own name)."""
        return bench.name

    def command(self, bench: Benchmark) -> str:
        """The command that runs ``bench``, for the progress bar."""
        return f"torchcal demo --suite {bench.suite}"

    def resolve(self, cfg: Any, bench: Benchmark) -> Any:
        """``cfg`` (a :class:`~torchcal.experiments.DemoConfig`) with its seeds (and whatever
        else the kind uses) filled from ``bench``'s profile (``cfg.profile``); raises
        ``ValueError`` for a setting the benchmark does not take."""
        raise NotImplementedError

    def plan(self, cfg: Any, bench: Benchmark, out: Path) -> tuple[list, list[Any]]:
        """The :class:`~torchcal.experiments.runner.Job` s of the resolved ``cfg`` into ``out``
        and the units they run, one per unit (a job may run several units: a pack of training
        runs, whose units are TrainConfigs, reports one outcome per run, :meth:`collect`)."""
        raise NotImplementedError

    def collect(self, jobs: Sequence[Any], results: Sequence[dict[str, Any]]) -> list[Any]:
        """The units' results from the jobs' ``results`` (one per job, in their order): by
        default the jobs' results themselves (one unit per job); the training runs' kind reads
        one outcome per run of each pack."""
        return list(results)

    def report(self, cfg: Any, bench: Benchmark, out: Path, specs: list[Any],
               results: list[Any], seconds: float
               ) -> tuple[Any, list[tuple[str, str]]]:
        """Write the report into ``out`` from the units' ``results`` (one per spec, in their
        order): the report (``DemoResult.report``) and the failed units as ``(name, error)``
        pairs; ``seconds``: the wall time so far."""
        raise NotImplementedError

    def summary(self, result: Any) -> str:
        """What ``torchcal demo`` prints after the run (``result``: a
        :class:`~torchcal.experiments.DemoResult`)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: everything :func:`torchcal.experiments.run_demo` needs besides the user's
    knobs.

    Attributes:
        name: registry name (``--benchmark`` of ``torchcal demo``).
        title: the report's title, after ``torchcal demo:``.
        recipe: the training recipe (:func:`torchcal.train.get_recipe`; "" for a kind that
            names its own recipes).
        profiles: ``{"default" | "quick" | "full": Profile}`` (a benchmark of another kind:
            the kind's profile objects, each with its ``seeds``).
        summary: one sentence on the benchmark for the command line's help.
        tag: the loss registry tag selecting the losses of a profile without ``losses``.
        loss_kwargs: per-loss hyperparameters the benchmark sets (registry defaults otherwise).
        data_kwargs: options of the recipe's data set the benchmark sets (declared options of
            its registered data set, :mod:`torchcal.data.registry`; digits: ``noise_std``),
            under the user's ``data_kwargs``.
        claims: the papers' claims the report tests (:mod:`torchcal.report.claims`).
        committed_results: the repository path of the committed ``full`` run's results.csv.
        committed_note: a remark the report adds to the committed run's verdicts (a re-run).
        verdict_labels: ``{claim key: short label}`` of the verdicts the report quotes.
        excluded: ``{loss tag: why}``, the report's reason for a registered loss not trained.
        intro: ``intro(context) -> str``, the report's prose above its tables, a few lines
            (context: an :class:`IntroContext`).
        appendix: ``appendix(context) -> str``, the report's appendix (Markdown, after the
            runs): the details the intro leaves out.
        prebuild_data: build the data once before the runs (cheap or generated data: the
            data options are checked, and generated data is cached once, not by every worker).
        job_fn: the job function of one pack of runs
            (:func:`~torchcal.experiments.training.run_pack_job`; a run alone is a pack of one).
        kind: how its jobs are made and its report written (:class:`BenchmarkKind`; default
            the calibration benchmarks' training runs per loss and seed,
            :data:`torchcal.experiments.TRAINING_RUNS`).
    """

    name: str
    title: str
    recipe: str
    profiles: Mapping[str, Any]
    summary: str = ""
    tag: str = "demo"
    loss_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    data_kwargs: Mapping[str, Any] = field(default_factory=dict)
    claims: Sequence[Claim] = ()
    committed_results: str | None = None
    committed_note: str = ""
    verdict_labels: Mapping[str, str] = field(default_factory=dict)
    excluded: Mapping[str, str] = field(default_factory=dict)
    intro: Callable[[Any], str] | None = None
    appendix: Callable[[Any], str] | None = None
    prebuild_data: bool = True
    job_fn: Callable[[Mapping[str, Any]], dict[str, Any]] = run_pack_job
    kind: BenchmarkKind = None  # type: ignore[assignment] - None: KINDS' DEFAULT_KIND

    def __post_init__(self) -> None:
        missing = [p for p in PROFILE_NAMES if p not in self.profiles]
        if missing:
            raise ValueError(f"Expected `profiles` to define {PROFILE_NAMES}, missing {missing}")
        if self.kind is None:
            object.__setattr__(self, "kind", KINDS.get(DEFAULT_KIND))
        if not isinstance(self.kind, BenchmarkKind):
            raise TypeError("Expected `kind` to be a BenchmarkKind (default: the calibration "
                            "benchmarks' training runs per loss and seed, torchcal.experiments."
                            f"TRAINING_RUNS), got {type(self.kind).__name__}")

    @property
    def suite(self) -> str:
        """The ``torchcal demo --suite`` that runs it: ``calibration`` (chosen by ``--benchmark``)
        for the calibration benchmarks, else its own name (its kind's)."""
        return self.kind.suite(self)

    def profile(self, name: str) -> Profile:
        """The profile ``name`` (``default``, ``quick`` or ``full``)."""
        return self.profiles[name]

    def losses(self, profile: str = "default") -> list[str]:
        """The registered losses a profile trains, in the registry's table order."""
        tagged = tagged_losses(self.tag)
        chosen = self.profiles[profile].losses
        return tagged if chosen is None else [n for n in chosen if n in tagged]

    def exclusion(self, loss: str) -> str:
        """Why the registered ``loss`` is not one of this benchmark's tagged losses."""
        for tag in sorted(LOSSES.entry(loss).tags):
            if tag in self.excluded:
                return self.excluded[tag]
        return f"its registry entry has no `{self.tag}` tag"


def tagged_losses(tag: str) -> list[str]:
    """The registered losses whose registry entry carries ``tag``, in table order."""
    return list_losses(tag=tag)


def committed_verdicts(benchmark: Benchmark) -> dict[str, tuple[str, int, int]] | None:
    """``{claim key: (label, holds on k, of n seeds)}`` computed from the benchmark's committed
    results.csv (None when it has none or the file is not in this installation); ``n`` counts
    seed sets for an ensemble claim.  A claim the committed run cannot test (an ensemble claim
    on a run written before ensembles were reported) is left out."""
    if not benchmark.committed_results:
        return None
    path = _REPO_ROOT / benchmark.committed_results
    if not path.is_file():
        return None
    runs = runs_from_results_csv(path.read_text(encoding="utf-8"))
    got = {r.claim.key: (r.k, r.n) for r in check_claims(group_runs(runs), benchmark.claims)
           if r.n}
    return {key: (label, *got[key]) for key, label in benchmark.verdict_labels.items()
            if key in got}


def committed_note(benchmark: Benchmark) -> str:
    """The committed full run's verdicts as a labelled Markdown paragraph of their own (the
    report shows it in a box at the head of its claims, so that they are never read as the
    run's own); "" when the benchmark has no committed run here."""
    verdicts = committed_verdicts(benchmark)
    if not verdicts:
        return ""
    where = benchmark.committed_results.rsplit("/", 1)[0]
    note = f" ({benchmark.committed_note})" if benchmark.committed_note else ""
    return (f"**The committed full run's verdicts, not this run's:** `torchcal demo --benchmark "
            f"{benchmark.name} --full`, {len(benchmark.profile('full').seeds)} seeds on the "
            f"recipe's schedule, committed in {where} (the README's table): "
            + "; ".join(f"{t} {k} of {n}" for t, k, n in verdicts.values()) + " seeds"
            + (" (the ensemble claims: seed sets, each an ensemble of 3 of the seeds when there "
               "are more than 3, the subsets overlapping)"
               if any(c.per == "seed_set" and c.key in verdicts for c in benchmark.claims) else "")
            + f"{note}.")


@dataclass
class IntroContext:
    """What a benchmark's report prose is written from.

    Attributes:
        benchmark: the benchmark.
        config: the demo's resolved settings (a :class:`~torchcal.experiments.demo.DemoConfig`).
        train_config: the TrainConfig of the first run (the effective recipe).
        losses: the losses trained.
        loss_kwargs: ``{loss: hyperparameters the benchmark or the user set}``.
        n_jobs: runs of this invocation; ``skipped``: of them already finished before it.
        seconds: wall time up to the report; ``failed``: ``(run_dir, error)`` of failed runs.
    """

    benchmark: Benchmark
    config: Any
    train_config: TrainConfig
    losses: Sequence[str]
    loss_kwargs: Mapping[str, Mapping[str, Any]]
    n_jobs: int = 0
    seconds: float = 0.0
    failed: Sequence[tuple[str, str]] = ()
    skipped: int = 0


#: The benchmark kinds by name.  The default kind (``Benchmark(kind=None)``),
#: :data:`torchcal.experiments.TRAINING_RUNS`, is defined and registered by
#: torchcal.experiments.demo, which imports this module: the first lookup imports it.
KINDS: Registry[BenchmarkKind] = Registry("benchmark kind",
                                          modules=("torchcal.experiments.demo",))
DEFAULT_KIND = "training-runs"


#: The modules that register the built-in benchmarks, in their registration order.
BUILTIN_MODULES = ("torchcal.experiments.calibration", "torchcal.experiments.uncertainty")


#: The benchmark table (``torchcal demo --benchmark NAME``); its first lookup imports
#: :data:`BUILTIN_MODULES` (not torchcal.experiments' import: a demo worker needs none of them,
#: its start-up time).  A module registers its benchmarks while it is imported, and
#: uncertainty imports calibration first: the order is BUILTIN_MODULES' whichever module is
#: imported first.
BENCHMARKS: Registry[Benchmark] = Registry("benchmark", modules=BUILTIN_MODULES)


def register_benchmark(benchmark: Benchmark) -> Benchmark:
    """Add ``benchmark`` to :data:`BENCHMARKS` under its name; returns it."""
    with BENCHMARKS.without_loading():  # a registration is no lookup: no built-in module
        order = len(BENCHMARKS.names()) if benchmark.name not in BENCHMARKS else None
        return BENCHMARKS.register(benchmark.name, benchmark, order=order)


def get_benchmark(name: str) -> Benchmark:
    """The benchmark registered as ``name``; an unknown name raises ``ValueError`` naming
    ``benchmark`` and the valid names."""
    if name not in BENCHMARKS:
        raise ValueError(f"Expected `benchmark` to be one of {', '.join(list_benchmarks())}, "
                         f"got {name!r}")
    return BENCHMARKS.get(name)


def list_benchmarks(suite: str | None = None) -> list[str]:
    """The registered benchmark names, in registration order; ``suite``: only those of that
    ``torchcal demo --suite`` (``"calibration"``: those chosen by ``--benchmark``)."""
    return [n for n in BENCHMARKS.ordered()
            if suite is None or BENCHMARKS.get(n).suite == suite]


def size_help() -> dict[str, str]:
    """Help texts of ``torchcal demo``'s size options (``description``, ``quick``, ``full``,
    ``seeds``, ``epochs``, ``losses``), read from the calibration benchmarks' profiles."""
    names = list_benchmarks("calibration")
    benches = {n: get_benchmark(n) for n in names}

    def sizes(profile: str, what: str) -> str:
        parts = []
        for n, b in benches.items():
            p = b.profile(profile)
            v = {"seeds": len(p.seeds), "epochs": p.epochs or "the recipe's",
                 "losses": ",".join(p.losses) if p.losses else "every demo loss"}[what]
            parts.append(f"{n} {v}")
        return "; ".join(parts)

    def measured(profile: str) -> str:
        m = [f"{n}: {b.profile(profile).measured}" for n, b in benches.items()
             if b.profile(profile).measured]
        return f" ({'; '.join(m)})" if m else ""

    def default_size(b: Benchmark) -> str:
        p = b.profile("default")
        n_losses = len(p.losses) if p.losses else len(b.losses("full"))
        epochs = f"{p.epochs} epochs" if p.epochs else "the recipe's epochs"
        return f"{n_losses} losses x {len(p.seeds)} seeds x {epochs}"

    return {
        "description": "The embedded benchmarks: " + "; ".join(
            f"{n}: {b.summary}, by default {default_size(b)}" for n, b in benches.items())
            + measured("default") + ". Runs "
            "train in parallel worker processes (or as Ray tasks), are evaluated before and "
            "after temperature scaling and reported in the papers' table format with figures "
            "and the section \"The papers' claims on this benchmark\".",
        "quick": f"a smoke test: seeds {sizes('quick', 'seeds')}; epochs "
                 f"{sizes('quick', 'epochs')}{measured('quick')}",
        "full": f"every demo loss, the recipe's full schedule: seeds {sizes('full', 'seeds')}"
                f"{measured('full')}",
        "seeds": f"number of seeds or a list such as 0,3,7 (default: {sizes('default', 'seeds')})",
        "epochs": f"epochs, milestones kept at the recipe's fractions (default: "
                  f"{sizes('default', 'epochs')})",
        "losses": f"comma-separated registry names (default: {sizes('default', 'losses')})",
    }


def data_options_help() -> str:
    """The declared options of each calibration benchmark's data set (the data set registry),
    for ``torchcal demo --data-arg``'s help."""
    out = []
    for name in list_benchmarks("calibration"):
        ds = get_recipe(get_benchmark(name).recipe).dataset
        opts = ", ".join(o.name for o in DATASETS.get(ds).options)
        out.append(f"{name}: {opts or 'none'}")
    return "; ".join(out)
