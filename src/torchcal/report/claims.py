"""The seed papers' qualitative claims, tested seed by seed on evaluated runs.

Each claim compares runs of the same seed (and the same data set and model) and either holds or
fails on that seed; its verdict, "holds on k of n seeds", is computed here from the runs'
results, never written by hand.  A seed enters a claim only when every loss the claim needs has
a run with that seed; a claim with no such seed is "not tested".

The claims (pre-temperature test metrics; "similar error" means within
:data:`SIMILAR_ERROR` = 3 percentage points of cross-entropy's test error):

* Mukhoti et al. 2020 (NeurIPS): cross-entropy is over-confident, T > 1 (grid-ECE temperature on
  validation); focal loss (γ=3) and FLSD-53 each give a lower ECE than cross-entropy at similar
  error.
* Ghosh et al. 2022 (NeurIPS): AdaFocal gives the lowest AdaECE of the focal family of its tables
  (focal γ=3, FLSD-53, AdaFocal), at error similar to cross-entropy's.
* Lin et al. 2025: BSCE-GRA gives a lower ECE than cross-entropy and than BSCE without gradient
  weighting.
* Tao et al. 2023 (ICML): dual focal gives a lower ECE than focal.

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

from ..errors import ResultsFileError
from ..evaluate import DEFAULT_PREDICTOR, load_logits
from ..losses import LOSSES
from ..metrics import confidence_gap as _confidence_gap
from ..runs import logits_filename
from .aggregate import Group, RunRecord, loss_label
from .tables import Cell, Table, fmt_mean_std

__all__ = [
    "CLAIMS",
    "Claim",
    "ClaimResult",
    "SIMILAR_ERROR",
    "GAP_KEY",
    "confidence_gap",
    "add_confidence_gaps",
    "check_claims",
    "check_claim_on_seeds",
    "claims_markdown",
    "claims_section",
    "claim_table",
    "direction_table",
]

#: "Similar error": within this many percentage points of cross-entropy's test error.
SIMILAR_ERROR = 3.0
#: The flattened results key of the test set's mean confidence minus accuracy (pre T).
GAP_KEY = "test.pre.conf_minus_acc"

ECE, ADAECE, ERR, TEMP = "test.pre.ece", "test.pre.adaptive_ece", "test.pre.error", \
    "temperature.grid_ece"


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


def add_confidence_gaps(runs: Sequence[RunRecord]) -> None:
    """Add :data:`GAP_KEY` to each run's flattened numbers from its saved test logits (runs
    without readable ``logits/test.npz`` are left without it)."""
    for r in runs:
        if GAP_KEY in r.flat:
            continue
        p = r.logits_dir / logits_filename("test")
        if not p.is_file():
            continue
        try:
            z, y = load_logits(p)
        except ResultsFileError:
            continue
        r.flat[GAP_KEY] = confidence_gap(z, y)


@dataclass(frozen=True)
class Claim:
    """One paper's claim: ``check(numbers by loss) -> (holds, shown numbers)`` on one seed."""

    key: str
    source: str
    text: str
    losses: tuple[str, ...]
    check: Callable[[Mapping[str, Mapping[str, float]]], bool]
    columns: tuple[tuple[str, str, str], ...]  # (loss, metric key, header)


def _lt(a: float, b: float) -> bool:
    return not (math.isnan(a) or math.isnan(b)) and a < b


def _similar_error(n: Mapping[str, Mapping[str, float]], loss: str) -> bool:
    d = abs(n[loss][ERR] - n["ce"][ERR])
    return not math.isnan(d) and 100.0 * d <= SIMILAR_ERROR


def _lower_at_similar_error(loss: str) -> Callable[[Mapping[str, Mapping[str, float]]], bool]:
    return lambda n: _lt(n[loss][ECE], n["ce"][ECE]) and _similar_error(n, loss)


def _adafocal_lowest(n: Mapping[str, Mapping[str, float]]) -> bool:
    return (_lt(n["adafocal"][ADAECE], n["focal"][ADAECE])
            and _lt(n["adafocal"][ADAECE], n["flsd53"][ADAECE]) and _similar_error(n, "adafocal"))


def _cols(losses: Sequence[str], key: str, name: str) -> tuple[tuple[str, str, str], ...]:
    return tuple((loss, key, f"{loss_label(loss)} {name}") for loss in losses)


_MUKHOTI = LOSSES.paper("focal")  # each claim cites its loss' paper from the registry
#: The claims, in the report's order.
CLAIMS: tuple[Claim, ...] = (
    Claim("mukhoti_ce_overconfident", _MUKHOTI,
          "cross-entropy is over-confident: its temperature T (grid search on validation ECE) "
          "is above 1.",
          ("ce",), lambda n: n["ce"][TEMP] > 1.0,
          (("ce", TEMP, "CE T"), ("ce", GAP_KEY, "CE conf − acc %"), ("ce", ERR, "CE error %"))),
    Claim("mukhoti_focal_lt_ce", _MUKHOTI,
          f"focal loss (γ=3) gives a lower pre-T ECE than cross-entropy at similar error "
          f"(within {SIMILAR_ERROR:g} points).",
          ("ce", "focal"), _lower_at_similar_error("focal"),
          _cols(("ce", "focal"), ECE, "ECE %") + _cols(("ce", "focal"), ERR, "error %")),
    Claim("mukhoti_flsd53_lt_ce", _MUKHOTI,
          f"FLSD-53 gives a lower pre-T ECE than cross-entropy at similar error "
          f"(within {SIMILAR_ERROR:g} points).",
          ("ce", "flsd53"), _lower_at_similar_error("flsd53"),
          _cols(("ce", "flsd53"), ECE, "ECE %") + _cols(("ce", "flsd53"), ERR, "error %")),
    Claim("ghosh_adafocal_lowest", LOSSES.paper("adafocal"),
          "AdaFocal gives the lowest pre-T AdaECE of the focal family (focal γ=3, FLSD-53, "
          f"AdaFocal), at error close to cross-entropy's (within {SIMILAR_ERROR:g} points).",
          ("ce", "focal", "flsd53", "adafocal"), _adafocal_lowest,
          _cols(("focal", "flsd53", "adafocal"), ADAECE, "AdaECE %")
          + _cols(("ce", "adafocal"), ERR, "error %")),
    Claim("lin_bsce_gra", LOSSES.paper("bsce_gra"),
          "BSCE-GRA gives a lower pre-T ECE than cross-entropy, and lower than BSCE without "
          "gradient weighting.",
          ("ce", "bsce", "bsce_gra"),
          lambda n: _lt(n["bsce_gra"][ECE], n["ce"][ECE]) and _lt(n["bsce_gra"][ECE], n["bsce"][ECE]),
          _cols(("ce", "bsce", "bsce_gra"), ECE, "ECE %")),
    Claim("tao_dual_focal", LOSSES.paper("dual_focal"),
          "dual focal gives a lower pre-T ECE than focal loss.",
          ("focal", "dual_focal"), lambda n: _lt(n["dual_focal"][ECE], n["focal"][ECE]),
          _cols(("focal", "dual_focal"), ECE, "ECE %")),
)


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

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def k(self) -> int:
        return sum(self.holds)

    @property
    def verdict(self) -> str:
        """``"holds on k of n seeds"``, ``"fails on every seed (0 of n)"`` or ``"not tested"``."""
        if not self.n:
            need = ", ".join(loss_label(x) for x in self.missing) or "a common seed"
            return f"not tested (no run of {need})"
        if self.k == 0:
            return f"fails on every seed (holds on 0 of {self.n})"
        return f"holds on {self.k} of {self.n} seed{'s' if self.n > 1 else ''}"

    @property
    def passed(self) -> bool:
        """Holds on every tested seed (and was tested)."""
        return self.n > 0 and self.k == self.n


def _by_loss(groups: Sequence[Group]) -> dict[str, Group]:
    out: dict[str, Group] = {}
    for g in groups:
        out.setdefault(g.loss, g)  # a second configuration of a loss is not a claim's loss
    return out


def check_claim_on_seeds(claim: Claim, numbers: Mapping[Any, Mapping[str, Mapping[str, float]]],
                         dataset: str = "", model: str = "") -> ClaimResult:
    """Test ``claim`` on every seed of ``numbers`` (``{seed: {part: {key: value}}}``; a part
    is what a claim compares: a loss's run, a benchmark's unit).  A seed is tested when it has
    numbers for each part the claim names (:attr:`Claim.losses`); a part no seed has is
    ``missing``.  The one per-seed rule of every benchmark's claims.

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
            nums = {x: dict(numbers[s][x]) for x in claim.losses}
            res.seeds.append(s)
            res.holds.append(bool(claim.check(nums)))
            res.numbers.append(nums)
    return res


def check_claims(groups: Sequence[Group], claims: Sequence[Claim] = CLAIMS) -> list[ClaimResult]:
    """Test every claim on every seed, per (data set, model) of ``groups``
    (:func:`check_claim_on_seeds` of each loss's runs by seed).

    A seed is tested when each loss of the claim has a run with that seed.  Only the seeds'
    runs count (``predictor`` ``"run"``): an ensemble's record is not a seed.
    """
    results = []
    keys: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        if g.predictor == DEFAULT_PREDICTOR:
            keys.setdefault((g.dataset, g.model), []).append(g)
    for (ds, model), gs in keys.items():
        numbers: dict[Any, dict[str, dict[str, float]]] = {}
        for loss, g in _by_loss(gs).items():
            for r in g.runs:
                nums = numbers.setdefault(r.seed, {})[loss] = dict(r.flat)
                for key in (ECE, ADAECE, ERR, TEMP, GAP_KEY):
                    nums.setdefault(key, math.nan)
        results += [check_claim_on_seeds(c, numbers, ds, model) for c in claims]
    return results


def _num(key: str, v: float) -> str:
    if math.isnan(v):
        return "–"
    return f"{v:.1f}" if key == TEMP else f"{100.0 * v:.2f}"


def claim_table(res: ClaimResult) -> Table:
    """The per-seed numbers of one claim, with ✓/✗ per seed."""
    header = ["Seed"] + [h for _l, _k, h in res.claim.columns] + ["Holds"]
    rows = []
    for s, ok, nums in zip(res.seeds, res.holds, res.numbers, strict=True):
        rows.append([Cell(str(s))] + [Cell(_num(k, nums[loss].get(k, math.nan)))
                                      for loss, k, _h in res.claim.columns]
                    + [Cell("yes" if ok else "no")])
    short = res.claim.source.split(",")[0].split(" (")[0]
    return Table(f"{short}, per seed ({res.dataset} / {res.model})", header, rows)


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
            Cell(f"{over} of {len(known)} seed{'s' if len(known) > 1 else ''}" if known else "–"),
        ])
    notes = ["T: grid-ECE temperature fitted on validation (T > 1: the model was over-confident "
             "on validation, T < 1: under-confident). conf − acc: mean top-1 confidence minus "
             "accuracy on the test set before temperature scaling (> 0: over-confident). "
             "mean ± std over seeds."]
    return Table(f"Over- or under-confident: {groups[0].dataset} / {groups[0].model}", header,
                 rows, notes)


def claims_section(groups: Sequence[Group], claims: Sequence[Claim] = CLAIMS,
                   heading: str = "## The papers' claims on this benchmark",
                   verdict_label: str = "") -> list[str | Table]:
    """The report section as blocks: Markdown paragraphs (str) and tables, in order; empty when
    no claim can be tested on ``groups``.  ``verdict_label`` goes on every verdict line
    ("**Verdict (LABEL): ...**"), e.g. that the run is a smoke test whose verdicts are not
    evidence, so that a line read alone says so."""
    results = check_claims(groups, claims)
    if not any(r.n for r in results):
        return []
    blocks: list[str | Table] = [
        heading,
        "Each seed paper's qualitative claim, tested on every seed of this run (pre-temperature "
        "test metrics; a seed counts when every loss the claim needs has a run with it; "
        f"\"similar error\": within {SIMILAR_ERROR:g} percentage points of cross-entropy's). "
        "The verdicts are computed from the runs' results."]
    by_key: dict[tuple[str, str], list[ClaimResult]] = {}
    for r in results:
        by_key.setdefault((r.dataset, r.model), []).append(r)
    for (ds, model), rs in by_key.items():
        if len(by_key) > 1:
            blocks.append(f"### {ds} / {model}")
        for r in rs:
            label = f" ({verdict_label})" if verdict_label else ""
            blocks.append(f"**{r.claim.source}:** {r.claim.text} "
                          f"**Verdict{label}: {r.verdict}.**")
            if r.n:
                blocks.append(claim_table(r))
        gs = [g for g in groups if (g.dataset, g.model) == (ds, model)]
        blocks.append(direction_table(gs))
    return blocks


def claims_markdown(groups: Sequence[Group], claims: Sequence[Claim] = CLAIMS,
                    heading: str = "## The papers' claims on this benchmark",
                    verdict_label: str = "") -> str:
    """The report section in Markdown (:func:`claims_section`); "" when nothing is testable."""
    blocks = claims_section(groups, claims, heading, verdict_label)
    return "\n\n".join(b.to_markdown().rstrip() if isinstance(b, Table) else b
                       for b in blocks).rstrip() + ("\n" if blocks else "")
