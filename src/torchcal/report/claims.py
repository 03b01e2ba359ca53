"""The rule engine of the papers' claims: each claim tested seed by seed on evaluated runs, and
the report's section that shows the verdicts.

A claim (:class:`Claim`) compares runs of the same seed (and the same data set and model) and
either holds or fails on that seed; its verdict, "holds on k of n seeds", is computed here from
the runs' results, never written by hand.  A seed enters a claim only when every loss the claim
needs has a run with that seed; a claim with no such seed is "not tested".  The claims
themselves, the seed papers', are data of the benchmarks that test them
(:mod:`torchcal.experiments.claims`): the caller hands them to :func:`check_claims` and to
:func:`torchcal.report.build_report` (``claims=``).

The ensemble claims (``per="seed_set"``) compare the ensemble of a set of seeds (a record with
``meta.predictor`` ``"ensemble"`` and its seeds in ``meta.members``; temperatures fitted by NLL
on validation, numbers on test) with its members' runs, one seed set at a time: every subset of
3 seeds when the results hold those ensembles
(:attr:`~torchcal.report.aggregate.Group.subsets`, the demo's with more than 3 seeds: "holds on
k of 10 seed subsets", which overlap and are not independent), else each ensemble record ("1 of
1 seed set" with 2 seeds: one observation); with fewer than 2 seeds they are "not evaluated
(needs 2 or more seeds)".

A seed (set) whose results lack a number its rule needs (:attr:`Claim.needs`) is not evaluated
rather than counted as failing; a claim that compares a loss without any run is listed under
its own heading, :data:`NEEDS_FULL`, not among the verdicts.

Beside the verdicts the section shows the direction of each loss's miscalibration: the
temperature T (> 1: over-confident, < 1: under-confident) and the mean top-1 confidence minus the
accuracy on the test set (:func:`confidence_gap`), since the losses fail in opposite directions.

>>> conf = np.array([0.9, 0.8, 0.6, 0.7]); correct = np.array([1, 0, 1, 0])
>>> round(float(conf.mean() - correct.mean()), 3)
0.25
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..metrics import confidence_gap as _confidence_gap
from ..results_file import DEFAULT_PREDICTOR
from ..run_dir import logits_filename
from .aggregate import Group, RunRecord, TestLogits, loss_label, mean_std, read_test_logits
from .tables import Cell, Table, fmt_mean_std

__all__ = [
    "section_markdown",
    "Claim",
    "ClaimResult",
    "SIMILAR_ERROR",
    "CHANCE_MARGIN",
    "AT_CHANCE",
    "GAP_KEY",
    "at_chance",
    "confidence_gap",
    "add_confidence_gaps",
    "check_claims",
    "check_claim_on_seeds",
    "claims_markdown",
    "claims_section",
    "claims_verdicts",
    "claim_table",
    "direction_table",
    "NEEDS_FULL",
    "MEMBERS",
    "MEMBERS_MIN",
    "ECE",
    "ADAECE",
    "ERR",
    "TEMP",
    "NLL",
    "TEMP_NLL",
    "POOL_THEN_CAL",
    "CAL_THEN_POOL",
    "POOL_THEN_CAL_NLL",
    "CAL_THEN_POOL_NLL",
]

#: "Similar error": within this many percentage points of cross-entropy's test error.
SIMILAR_ERROR = 3.0
#: A model whose test accuracy is below chance (1 / classes) plus this margin is "at chance":
#: a claim is not evaluated on it (a coin toss is no evidence either way).
CHANCE_MARGIN = 0.05
#: The key a part's numbers carry (1.0) when its model is at chance (:func:`at_chance`).
AT_CHANCE = "at_chance"
#: The flattened results key of the test set's mean confidence minus accuracy (pre T).
GAP_KEY = "test.pre.conf_minus_acc"

#: The flattened results keys the claims read: pre-T test ECE, AdaECE, error and NLL, and the
#: grid-ECE temperature.
ECE, ADAECE, ERR, TEMP = "test.pre.ece", "test.pre.adaptive_ece", "test.pre.error", \
    "temperature.grid_ece"
NLL = "test.pre.nll"
#: An ensemble's test ECE after "pool then calibrate" (grid-ECE T fitted on its validation
#: logits) and after "calibrate then pool" (each member's own grid-ECE T, then pooled): shown
#: beside the claims' numbers, labelled "grid ECE"; the rules use the NLL-fitted ones.
POOL_THEN_CAL, CAL_THEN_POOL = "test.post.grid_ece.ece", "test.post.calibrate_then_pool.ece"
#: The same with NLL-fitted temperatures (the ensemble papers' fit): the ensemble claims' rule.
POOL_THEN_CAL_NLL = "test.post.nll.ece"
CAL_THEN_POOL_NLL = "test.post.calibrate_then_pool_nll.ece"
TEMP_NLL = "temperature.nll"
#: The prefix of a seed-set claim's numbers that are the mean over the ensemble's members.
MEMBERS = "members."
#: The prefix of the smallest value over the ensemble's members (its best member's NLL).
MEMBERS_MIN = "members_min."
_ENSEMBLE = "ensemble"


def confidence_gap(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean top-1 softmax confidence minus top-1 accuracy: > 0 over-, < 0 under-confident.

    ``gap = mean_i max_k softmax(z_i)_k - mean_i [argmax_k z_ik == y_i]``
    (:func:`torchcal.metrics.confidence_gap` of the logits in float64, as a float).

    >>> z = np.log(np.array([[0.9, 0.1], [0.6, 0.4]])); y = np.array([0, 1])
    >>> round(confidence_gap(z, y), 3)
    0.25
    """
    z = torch.as_tensor(np.asarray(logits, dtype=np.float64))
    return float(_confidence_gap(logits=z, labels=np.asarray(labels)))


def at_chance(accuracy: float, n_classes: int) -> bool:
    """Whether a test accuracy is within :data:`CHANCE_MARGIN` of chance, ``1 / n_classes``
    (NaN counts as at chance).

    >>> at_chance(0.12, 10), at_chance(0.60, 10)
    (True, False)
    """
    return not accuracy >= 1.0 / n_classes + CHANCE_MARGIN


def _run_at_chance(run: RunRecord) -> bool:
    """A run whose test error puts it at chance (unknown class count or error: not known to)."""
    c, err = run.results.get("num_classes"), run.flat.get(ERR, math.nan)
    return isinstance(c, int) and c > 1 and not math.isnan(err) and at_chance(1.0 - err, c)


def add_confidence_gaps(runs: Sequence[RunRecord], test_logits: TestLogits | None = None) -> None:
    """Add :data:`GAP_KEY` to each run's flattened numbers from its saved test logits (runs
    without readable ``logits/test.npz`` are left without it).  ``test_logits``: the runs'
    test logits already read (:func:`~torchcal.report.aggregate.read_test_logits`: a report
    reads them once); None reads them here."""
    todo = [r for r in runs if GAP_KEY not in r.flat]
    logits = read_test_logits(todo) if test_logits is None else test_logits
    for r in todo:
        zy = logits.get(r.logits_dir / logits_filename("test"))
        if zy is not None:
            r.flat[GAP_KEY] = confidence_gap(*zy)


@dataclass(frozen=True)
class Claim:
    """One paper's claim: ``check(numbers by loss) -> (holds, shown numbers)`` on one seed;
    ``short``: a few words naming it among its paper's claims (its per-seed table's title)."""

    key: str
    source: str
    text: str
    losses: tuple[str, ...]
    check: Callable[[Mapping[str, Mapping[str, float]]], bool]
    columns: tuple[tuple[str, str, str], ...]  # (loss, metric key, header)
    #: ``"seed"``: ``check`` gets each loss's run of one seed; ``"seed_set"``: each loss's
    #: ensemble of one seed set, with its members' mean under :data:`MEMBERS` + key.
    per: str = "seed"
    short: str = ""
    #: A claim about a model's skill (False: about its code or cost, e.g. a speed-up): a seed
    #: whose model is at chance is not evaluated for it.
    skill: bool = True
    #: ``(loss, key)`` numbers the rule cannot do without: a seed (set) whose results lack one
    #: (NaN or absent, e.g. results written before it was measured) is not evaluated, rather
    #: than counted as a failure (:attr:`ClaimResult.lacking`).
    needs: tuple[tuple[str, str], ...] = ()




@dataclass
class ClaimResult:
    """A claim's outcome on one (data set, model): per-seed numbers and the computed verdict."""

    claim: Claim
    dataset: str
    model: str
    seeds: list = field(default_factory=list)
    holds: list[bool] = field(default_factory=list)
    numbers: list[dict[str, dict[str, float]]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # needed losses without any run
    fewest_seeds: int = 0  # the fewest seeds among the claim's losses' runs
    at_chance: list = field(default_factory=list)  # seeds not evaluated: a model at chance
    #: An ensemble claim tested on seed subsets: the seeds they were drawn from (else empty).
    subset_of: list = field(default_factory=list)
    #: ``{seed (set): [the lacking keys]}`` not evaluated: their results lack a number the
    #: rule needs (:attr:`Claim.needs`).
    lacking: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def k(self) -> int:
        return sum(self.holds)

    @property
    def verdict(self) -> str:
        """``"holds on k of n seeds"`` (``seed sets`` for an ensemble claim), ``"fails on every
        seed (0 of n)"``, ``"not tested"``, ``"not evaluated (model at chance)"`` or, for an
        ensemble claim on fewer than 2 seeds, ``"not evaluated (needs 2 or more seeds)"``."""
        if not self.n:
            if self.at_chance:
                return "not evaluated (model at chance)"
            if self.lacking:
                keys = sorted({k for ks in self.lacking.values() for k in ks})
                return (f"not evaluated (the results lack {', '.join(keys)}: evaluated before "
                        "the rule measured it)")
            need = ", ".join(loss_label(x) for x in self.missing) or "a common seed"
            if self.missing or self.claim.per != "seed_set":
                return f"not tested (no run of {need})"
            if self.fewest_seeds < 2:
                return "not evaluated (needs 2 or more seeds)"
            return "not tested (no ensemble of a common seed set)"
        unit = self.unit
        m = len(self.at_chance)
        skipped = f"; {m} {unit}{'s' if m > 1 else ''} not evaluated (model at chance)" if m else ""
        if self.k == 0:
            return f"fails on every {unit} (holds on 0 of {self.n}{skipped})" + self.sets_note
        return f"holds on {self.k} of {self.n} {unit}{'s' if self.n > 1 else ''}" + (
            f" ({skipped[2:]})" if skipped else "") + self.sets_note

    @property
    def unit(self) -> str:
        """What the claim is tested on: ``"seed"``, ``"seed set"`` or ``"seed subset"``."""
        if self.claim.per != "seed_set":
            return "seed"
        return "seed subset" if self.subset_of else "seed set"

    @property
    def sets_note(self) -> str:
        """What an ensemble claim's count rests on ("" for a per-seed claim): overlapping
        subsets, or one set, which is one observation."""
        if self.claim.per != "seed_set" or not self.n:
            return ""
        if self.subset_of:
            size = len(self.seeds[0].split(", "))
            return (f" (ensembles of {size} of the {len(self.subset_of)} seeds "
                    f"{', '.join(map(str, self.subset_of))}; the subsets overlap, so they are "
                    "not independent)")
        if self.n == 1:
            return " (one set of seeds: one observation)"
        return ""

    @property
    def passed(self) -> bool:
        """Holds on every tested seed (and was tested)."""
        return self.n > 0 and self.k == self.n


def _by_loss(groups: Sequence[Group]) -> dict[str, Group]:
    out: dict[str, Group] = {}
    for g in groups:
        out.setdefault(g.loss, g)  # a second configuration of a loss is not a claim's loss
    return out


def _lacking(claim: Claim, nums: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The keys of :attr:`Claim.needs` that ``nums`` lacks (absent or NaN)."""
    return [f"{loss_label(x)} {k}" for x, k in claim.needs
            if math.isnan(nums.get(x, {}).get(k, math.nan))]


def check_claim_on_seeds(claim: Claim, numbers: Mapping[Any, Mapping[str, Mapping[str, float]]],
                         dataset: str = "", model: str = "") -> ClaimResult:
    """Test ``claim`` on every seed of ``numbers`` (``{seed: {part: {key: value}}}``; a part
    is what a claim compares: a loss's run, a benchmark's unit).  A seed is tested when it has
    numbers for each part the claim names (:attr:`Claim.losses`); a part no seed has is
    ``missing``.  A seed where a part's numbers say :data:`AT_CHANCE` (its model is at chance)
    is not evaluated for a claim about a model's skill (:attr:`Claim.skill`): it goes to
    ``at_chance``.  The one per-seed rule of every benchmark's claims.

    >>> c = Claim("k", "a paper", "a below b", ("a", "b"), lambda n: n["a"]["x"] < n["b"]["x"], ())
    >>> r = check_claim_on_seeds(c, {0: {"a": {"x": 1}, "b": {"x": 2}}, 1: {"a": {"x": 3}}})
    >>> r.seeds, r.holds, r.verdict
    ([0], [True], 'holds on 1 of 1 seed')
    """
    have = {x for parts in numbers.values() for x in parts}
    res = ClaimResult(claim, dataset, model, missing=[x for x in claim.losses if x not in have])
    if res.missing:
        return res
    for s in sorted(numbers, key=lambda v: (str(type(v)), v)):
        if all(x in numbers[s] for x in claim.losses):
            if claim.skill and any(numbers[s][x].get(AT_CHANCE) for x in claim.losses):
                res.at_chance.append(s)
                continue
            nums = {x: dict(numbers[s][x]) for x in claim.losses}
            if lack := _lacking(claim, nums):
                res.lacking[s] = lack
                continue
            res.seeds.append(s)
            res.holds.append(bool(claim.check(nums)))
            res.numbers.append(nums)
    return res


def check_claims(groups: Sequence[Group], claims: Sequence[Claim]) -> list[ClaimResult]:
    """Test every claim on every seed (seed set), per (data set, model) of ``groups``
    (:func:`check_claim_on_seeds` of each loss's runs by seed).

    A seed is tested when each loss of the claim has a run with that seed, and not evaluated
    (``at_chance``) when one of those runs is at chance (:func:`at_chance`).  Only the seeds'
    runs count (``predictor`` ``"run"``): an ensemble's record is not a seed.  An ensemble
    claim (``per="seed_set"``) is tested on each seed set whose ensemble (``predictor``
    ``"ensemble"``, ``meta.members``) every loss of the claim has.
    """
    results = []
    keys: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        if g.predictor in (DEFAULT_PREDICTOR, _ENSEMBLE):
            keys.setdefault((g.dataset, g.model), []).append(g)
    for (ds, model), gs in keys.items():
        by_loss = _by_loss([g for g in gs if g.predictor == DEFAULT_PREDICTOR])
        ensembles = _by_loss([g for g in gs if g.predictor == _ENSEMBLE])
        if not by_loss:
            continue
        numbers = _numbers_by_seed(by_loss)
        for c in claims:
            if c.per == "seed_set":
                res = ClaimResult(c, ds, model, missing=[x for x in c.losses if x not in by_loss])
                if not res.missing:
                    _test_seed_sets(c, res, by_loss, ensembles)
            else:
                res = check_claim_on_seeds(c, numbers, ds, model)
            if not res.missing:
                res.fewest_seeds = min(len(by_loss[x].runs) for x in c.losses)
            results.append(res)
    return results


def _numbers_by_seed(by_loss: Mapping[str, Group]) -> dict[Any, dict[str, dict[str, float]]]:
    """``{seed: {loss: the run's numbers}}`` (the claims' keys NaN where a run lacks them)."""
    numbers: dict[Any, dict[str, dict[str, float]]] = {}
    for loss, g in by_loss.items():
        for r in g.runs:
            nums = numbers.setdefault(r.seed, {})[loss] = dict(r.flat)
            for key in (ECE, ADAECE, ERR, TEMP, GAP_KEY):
                nums.setdefault(key, math.nan)
            nums[AT_CHANCE] = float(_run_at_chance(r))
    return numbers


def _seed_set_numbers(ens: RunRecord, runs: Group) -> dict[str, float]:
    """An ensemble record's numbers, with its members' mean under :data:`MEMBERS` + key and
    their smallest value under :data:`MEMBERS_MIN` + key (NaN when a member's run is not among
    ``runs``)."""
    out = dict(ens.flat)
    by_seed = {r.seed: r for r in runs.runs}
    members = [by_seed.get(m) for m in ens.meta.get("members") or ()]
    keys = {k for r in members if r is not None for k in r.flat} | set(out)
    for k in keys:
        vals = [r.flat.get(k, math.nan) if r is not None else math.nan for r in members]
        known = None not in members
        out[MEMBERS + k] = mean_std(vals)[0] if known else math.nan
        out[MEMBERS_MIN + k] = float(np.nanmin(vals)) if known and not np.isnan(vals).all() \
            else math.nan
    return out


def _seed_sets(c: Claim, ensembles: Mapping[str, Group]) -> tuple[list[dict], bool]:
    """Per loss of ``c``: ``{seed set: ensemble record}``, of the seed-subset ensembles when
    every loss has them (True), else of the ensembles themselves (False)."""
    subsets = all(x in ensembles and ensembles[x].subsets for x in c.losses)
    sets = []
    for x in c.losses:
        recs = (ensembles[x].subsets if subsets else ensembles[x].runs) if x in ensembles else []
        sets.append({tuple(sorted(r.meta.get("members") or ())): r for r in recs
                     if len(r.meta.get("members") or ()) >= 2})
    return sets, subsets


def _test_seed_sets(c: Claim, res: ClaimResult, by_loss: Mapping[str, Group],
                    ensembles: Mapping[str, Group]) -> None:
    sets, subsets = _seed_sets(c, ensembles)
    common = [s for s in sets[0] if all(s in d for d in sets[1:])]
    for s in sorted(common):
        if c.skill and any(_run_at_chance(r) for x in c.losses for r in by_loss[x].runs
                           if r.seed in s):
            res.at_chance.append(", ".join(map(str, s)))
            continue
        nums = {x: _seed_set_numbers(d[s], by_loss[x]) for x, d in zip(c.losses, sets, strict=True)}
        if lack := _lacking(c, nums):
            res.lacking[", ".join(map(str, s))] = lack
            continue
        res.seeds.append(", ".join(map(str, s)))
        res.holds.append(bool(c.check(nums)))
        res.numbers.append(nums)
    if subsets and res.seeds:
        res.subset_of = sorted({x for s in common for x in s})


def _num(key: str, v: float) -> str:
    if math.isnan(v):
        return "–"
    if key.startswith("temperature."):
        return f"{v:.1f}" if key.startswith("temperature.grid") else f"{v:.2f}"
    if key.endswith(".nll"):
        return f"{v:.3f}"
    return f"{100.0 * v:.2f}"


def claim_table(res: ClaimResult) -> Table:
    """The per-seed numbers of one claim, with ✓/✗ per seed."""
    first = "Seeds pooled" if res.claim.per == "seed_set" else "Seed"
    header = [first] + [h for _l, _k, h in res.claim.columns] + ["Holds"]
    rows = []
    for s, ok, nums in zip(res.seeds, res.holds, res.numbers, strict=True):
        rows.append([Cell(str(s))] + [Cell(_num(k, nums[loss].get(k, math.nan)))
                                      for loss, k, _h in res.claim.columns]
                    + [Cell("yes" if ok else "no")])
    what = f": {res.claim.short}" if res.claim.short else ""
    return Table(f"{_paper(res.claim)}, per {res.unit}{what} ({res.dataset} / {res.model})",
                 header, rows)


def _row_unit(g: Group) -> str:
    return "seed" if g.predictor == DEFAULT_PREDICTOR else g.predictor.replace("_", " ")


def direction_table(groups: Sequence[Group]) -> Table:
    """Per loss: pre-T ECE, T, mean confidence − accuracy and on how many seeds it is > 0."""
    header = ["Loss", "ECE pre T %", "T", "conf − acc %", "Over-confident on"]
    rows = []
    for g in groups:
        gaps = [r.flat.get(GAP_KEY, math.nan) for r in g.runs]
        known = [x for x in gaps if not math.isnan(x)]
        over = sum(x > 0 for x in known)
        rows.append([
            Cell(g.label),
            Cell(fmt_mean_std(100 * g.mean.get(ECE, math.nan), 100 * g.std.get(ECE, math.nan), 2)),
            Cell(fmt_mean_std(g.mean.get(TEMP, math.nan), g.std.get(TEMP, math.nan), 2)),
            Cell(fmt_mean_std(100 * g.mean.get(GAP_KEY, math.nan),
                              100 * g.std.get(GAP_KEY, math.nan), 2)),
            Cell(f"{over} of {len(known)} {_row_unit(g)}{'s' if len(known) > 1 else ''}"
                 if known else "–"),
        ])
    notes = ["T: grid-ECE temperature fitted on validation (T > 1: the model was over-confident "
             "on validation, T < 1: under-confident). conf − acc: mean top-1 confidence minus "
             "accuracy on the test set before temperature scaling (> 0: over-confident). "
             "mean ± std over seeds."]
    return Table(f"Over- or under-confident: {groups[0].dataset} / {groups[0].model}", header,
                 rows, notes)


def claims_section(groups: Sequence[Group], claims: Sequence[Claim],
                   heading: str = "## The papers' claims on this benchmark",
                   verdict_label: str = "", *,
                   results: Sequence[ClaimResult] | None = None) -> list[str | Table]:
    """The report section as blocks: Markdown paragraphs (str) and tables, in order; empty when
    no claim can be tested on ``groups``.  ``verdict_label`` goes on every verdict line
    ("**Verdict (LABEL): ...**"), e.g. that the run is a smoke test whose verdicts are not
    evidence, so that a line read alone says so.  ``results``: ``check_claims(groups,
    claims)`` when the caller has it already (a report computes the claims once)."""
    results = check_claims(groups, claims) if results is None else results
    if not any(r.n or r.at_chance or r.lacking for r in results):
        return []
    blocks: list[str | Table] = [
        heading,
        "Each seed paper's qualitative claim, tested on every seed of this run (pre-temperature "
        "test metrics; a seed counts when every loss the claim needs has a run with it; "
        f"\"similar error\": within {SIMILAR_ERROR:g} percentage points of cross-entropy's). "
        "The verdicts are computed from the runs' results."]
    if any(c.per == "seed_set" for c in claims):
        blocks[-1] += (
            " An ensemble claim is tested on seed sets instead: the loss's ensemble (the mean "
            "of the probabilities of the seeds pooled) against those seeds' runs, on every "
            "subset of 3 seeds when there are more than 3 (the subsets overlap, so their count "
            "is not one of independent replications); its temperatures are fitted by NLL on the "
            "validation split (the grid-ECE ones are shown beside, labelled), every number is on "
            "the test split; with fewer than 2 seeds it is not evaluated.")
    by_key: dict[tuple[str, str], list[ClaimResult]] = {}
    for r in results:
        by_key.setdefault((r.dataset, r.model), []).append(r)
    for (ds, model), rs in by_key.items():
        if len(by_key) > 1:
            blocks.append(f"### {ds} / {model}")
        label = f" ({verdict_label})" if verdict_label else ""
        for r in (r for r in rs if not r.missing):
            blocks.append(f"**{r.claim.source}:** {r.claim.text} "
                          f"**Verdict{label}: {r.verdict}.**")
            if r.n:
                blocks.append(claim_table(r))
        blocks += _needs_full(rs)
        gs = [g for g in groups if (g.dataset, g.model) == (ds, model)]
        blocks.append(direction_table(gs))
    return blocks


#: The heading of the claims a run cannot test because it trained none of a loss they compare.
NEEDS_FULL = "Needs `--full`"


def _needs_full(results: Sequence[ClaimResult]) -> list[str]:
    """The claims of ``results`` that name a loss without any run, under their own heading
    (:data:`NEEDS_FULL`), not among the verdicts."""
    missing = [r for r in results if r.missing]
    if not missing:
        return []
    out = [f"#### {NEEDS_FULL}",
           "These claims compare a loss this run did not train, so they have no verdict here: "
           "`torchcal demo --full` trains every loss (or add the loss with `--losses`)."]
    out += [f"- **{r.claim.source}:** {r.claim.text} *(no run of "
            f"{', '.join(loss_label(x) for x in r.missing)})*" for r in missing]
    return [out[0], out[1], "\n".join(out[2:])]


def claims_verdicts(groups: Sequence[Group], claims: Sequence[Claim], *,
                    results: Sequence[ClaimResult] | None = None) -> list[str]:
    """One short line per claim and (data set, model), for a terminal: the paper, the claim's
    ``short`` name (else its text) and the verdict; [] when no claim can be tested.
    ``results``: as for :func:`claims_section`.

    >>> from torchcal.report.aggregate import Group
    >>> claims_verdicts([Group("d", "m", "ce", {}, runs=[])], [])
    []
    """
    results = check_claims(groups, claims) if results is None else results
    if not any(r.n or r.at_chance or r.lacking for r in results):
        return []
    where = len({(r.dataset, r.model) for r in results}) > 1
    tested = [r for r in results if not r.missing]
    return [f"{_paper(r.claim)}, {r.claim.short or r.claim.text.rstrip('.')}"
            f"{f' ({r.dataset} / {r.model})' if where else ''}: {r.verdict}" for r in tested] + [
        f"{NEEDS_FULL.replace('`', '')}: {_paper(r.claim)}, "
        f"{r.claim.short or r.claim.text.rstrip('.')}"
        f"{f' ({r.dataset} / {r.model})' if where else ''} (no run of "
        f"{', '.join(loss_label(x) for x in r.missing)})" for r in results if r.missing]


def _paper(claim: Claim) -> str:
    """``"Mukhoti et al. 2020"`` of a claim's source."""
    return claim.source.split(",")[0].split(" (")[0]


def claims_markdown(groups: Sequence[Group], claims: Sequence[Claim],
                    heading: str = "## The papers' claims on this benchmark",
                    verdict_label: str = "") -> str:
    """The report section in Markdown (:func:`claims_section`); "" when nothing is testable."""
    return section_markdown(claims_section(groups, claims, heading, verdict_label))


def section_markdown(blocks: Sequence[str | Table]) -> str:
    """:func:`claims_section`'s blocks in Markdown ("" for none)."""
    return "\n\n".join(b.to_markdown().rstrip() if isinstance(b, Table) else b
                       for b in blocks).rstrip() + ("\n" if blocks else "")
