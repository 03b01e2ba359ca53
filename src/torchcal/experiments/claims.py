"""The seed papers' qualitative claims as data: what each claim compares and the rule that
decides it on one seed (or one seed set).  The rule engine that tests them on evaluated runs and
renders the report's section is :mod:`torchcal.report.claims`; the benchmarks
(:mod:`torchcal.experiments.calibration`) hand these claims to the report.

Each rule tests the mechanism its claim names, and can fail for that reason: the input on
which each fails is written down in docs/guide/reproducing.md ("The claims' rules, and the input
on which each fails") and fed to it in tests/report/test_report_claim_rules.py.

The claims (pre-temperature test metrics; "similar error" means within
:data:`~torchcal.report.claims.SIMILAR_ERROR` = 3 percentage points of cross-entropy's test
error):

* Mukhoti et al. 2020 (NeurIPS): cross-entropy is over-confident, T > 1 (grid-ECE temperature on
  validation) and mean confidence above accuracy on test; focal loss (γ=3) and FLSD-53 each
  give a lower ECE than cross-entropy at similar error.
* Ghosh et al. 2022 (NeurIPS): AdaFocal gives the lowest AdaECE of the focal family of its tables
  (focal γ=3, FLSD-53, AdaFocal), at error similar to cross-entropy's.
* Lin et al. 2025: BSCE-GRA gives a lower ECE than cross-entropy and than BSCE without gradient
  weighting.
* Tao et al. 2023 (ICML): dual focal gives a lower ECE than focal.
* Mukhoti et al. 2020, OOD (:func:`mukhoti_ood_claim`, a benchmark's OOD set): focal loss and
  FLSD-53 each give a higher softmax-entropy OOD AUROC than cross-entropy.

The ensemble claims (:data:`ENSEMBLE_CLAIMS`, ``per="seed_set"``) compare the ensemble of a set
of seeds with its members' runs, one seed set at a time
(:func:`torchcal.report.claims.check_claims`):

* Lakshminarayanan et al. 2017: the cross-entropy ensemble has a lower NLL than its best member
  (below its members' mean NLL holds for every ensemble: Jensen's inequality) and a lower error
  than its members' mean.
* Rahaman & Thiery 2021 and Wen et al. 2021: the ensemble of members trained to be calibrated
  is under-confident (mean confidence below accuracy), more than its own members and more than
  the cross-entropy ensemble of the same seeds; and calibrating after pooling repairs it (with
  NLL-fitted temperatures, a pool-then-calibrate ECE below the raw ensemble's and below
  calibrate-then-pool's).  The papers' calibrated members are trained with mixup, which is not
  a loss; here they are focal loss (γ=3) and FLSD-53 (Mukhoti et al.'s calibrated losses) and,
  in a claim of its own, label smoothing (the softened labels Wen et al. name beside mixup).

A seed (set) whose results lack a number its rule needs (:attr:`Claim.needs`) is not evaluated
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from ..losses import LOSSES
from ..report.aggregate import loss_label
from ..report.claims import (
    ADAECE,
    CAL_THEN_POOL_NLL,
    ECE,
    ERR,
    GAP_KEY,
    MEMBERS,
    MEMBERS_MIN,
    NLL,
    POOL_THEN_CAL,
    POOL_THEN_CAL_NLL,
    SIMILAR_ERROR,
    TEMP,
    TEMP_NLL,
    Claim,
)

__all__ = ["CLAIMS", "ENSEMBLE_CLAIMS", "mukhoti_ood_claim"]


def _lt(a: float, b: float) -> bool:
    return not (math.isnan(a) or math.isnan(b)) and a < b


def _get(n: Mapping[str, Mapping[str, float]], loss: str, key: str) -> float:
    return n[loss].get(key, math.nan)


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


def _ensemble_beats_members(n: Mapping[str, Mapping[str, float]]) -> bool:
    """The CE ensemble's NLL below its *best* member's (below the members' mean NLL is
    Jensen's inequality, true of every ensemble) and its error below its members' mean."""
    return (_lt(_get(n, "ce", NLL), _get(n, "ce", MEMBERS_MIN + NLL))
            and _lt(_get(n, "ce", ERR), _get(n, "ce", MEMBERS + ERR)))


def _pooling_makes_underconfident(losses: Sequence[str]
                                  ) -> Callable[[Mapping[str, Mapping[str, float]]], bool]:
    """Each calibrated loss's ensemble (Rahaman & Thiery; Wen et al.): (1) conf − acc < 0,
    (2) below its members' mean conf − acc, (3) below the CE ensemble's of the same seeds, all
    before T; (4) the pool-then-calibrate ECE below the raw ensemble's and below
    calibrate-then-pool's, both with NLL-fitted temperatures."""
    def check(n: Mapping[str, Mapping[str, float]]) -> bool:
        def one(x: str) -> bool:
            gap, pooled = _get(n, x, GAP_KEY), _get(n, x, POOL_THEN_CAL_NLL)
            return (_lt(gap, 0.0) and _lt(gap, _get(n, x, MEMBERS + GAP_KEY))
                    and _lt(gap, _get(n, "ce", GAP_KEY)) and _lt(pooled, _get(n, x, ECE))
                    and _lt(pooled, _get(n, x, CAL_THEN_POOL_NLL)))
        return all(one(x) for x in losses)
    return check


def _higher_auroc(key: str) -> Callable[[Mapping[str, Mapping[str, float]]], bool]:
    return lambda n: all(_lt(_get(n, "ce", key), _get(n, x, key)) for x in ("focal", "flsd53"))


_MUKHOTI = LOSSES.paper("focal")  # each claim cites its loss' paper from the registry
#: The claims, in the report's order.
CLAIMS: tuple[Claim, ...] = (
    Claim("mukhoti_ce_overconfident", _MUKHOTI,
          "cross-entropy is over-confident: its temperature T (grid search on validation ECE) "
          "is above 1, and its mean confidence is above its accuracy on test.",
          ("ce",), lambda n: _lt(1.0, n["ce"][TEMP]) and _lt(0.0, n["ce"][GAP_KEY]),
          (("ce", TEMP, "CE T"), ("ce", GAP_KEY, "CE conf − acc %"), ("ce", ERR, "CE error %")),
          short="cross-entropy over-confident", needs=(("ce", TEMP), ("ce", GAP_KEY))),
    Claim("mukhoti_focal_lt_ce", _MUKHOTI,
          f"focal loss (γ=3) gives a lower pre-T ECE than cross-entropy at similar error "
          f"(within {SIMILAR_ERROR:g} points).",
          ("ce", "focal"), _lower_at_similar_error("focal"),
          _cols(("ce", "focal"), ECE, "ECE %") + _cols(("ce", "focal"), ERR, "error %"),
          short="focal below cross-entropy"),
    Claim("mukhoti_flsd53_lt_ce", _MUKHOTI,
          f"FLSD-53 gives a lower pre-T ECE than cross-entropy at similar error "
          f"(within {SIMILAR_ERROR:g} points).",
          ("ce", "flsd53"), _lower_at_similar_error("flsd53"),
          _cols(("ce", "flsd53"), ECE, "ECE %") + _cols(("ce", "flsd53"), ERR, "error %"),
          short="FLSD-53 below cross-entropy"),
    Claim("ghosh_adafocal_lowest", LOSSES.paper("adafocal"),
          "AdaFocal gives the lowest pre-T AdaECE of the focal family (focal γ=3, FLSD-53, "
          f"AdaFocal), at error close to cross-entropy's (within {SIMILAR_ERROR:g} points).",
          ("ce", "focal", "flsd53", "adafocal"), _adafocal_lowest,
          _cols(("focal", "flsd53", "adafocal"), ADAECE, "AdaECE %")
          + _cols(("ce", "adafocal"), ERR, "error %"),
          short="AdaFocal lowest AdaECE of the focal family"),
    Claim("lin_bsce_gra", LOSSES.paper("bsce_gra"),
          "BSCE-GRA gives a lower pre-T ECE than cross-entropy, and lower than BSCE without "
          "gradient weighting.",
          ("ce", "bsce", "bsce_gra"),
          lambda n: _lt(n["bsce_gra"][ECE], n["ce"][ECE]) and _lt(n["bsce_gra"][ECE], n["bsce"][ECE]),
          _cols(("ce", "bsce", "bsce_gra"), ECE, "ECE %"), short="BSCE-GRA below CE and BSCE"),
    Claim("tao_dual_focal", LOSSES.paper("dual_focal"),
          "dual focal gives a lower pre-T ECE than focal loss.",
          ("focal", "dual_focal"), lambda n: _lt(n["dual_focal"][ECE], n["focal"][ECE]),
          _cols(("focal", "dual_focal"), ECE, "ECE %"), short="dual focal below focal"),
)


_LAKSHMINARAYANAN = ("Lakshminarayanan et al. 2017, *Simple and Scalable Predictive Uncertainty "
                     "Estimation using Deep Ensembles* (NeurIPS)")
_RAHAMAN_WEN = ("Rahaman & Thiery 2021, *Uncertainty Quantification and Deep Ensembles* "
                "(NeurIPS); Wen et al. 2021, *Combining Ensembles and Data Augmentation Can Harm "
                "Your Calibration* (ICLR)")
_REPAIR = ("is under-confident, and more so than its own members and than the cross-entropy "
           "ensemble of the same seeds (mean confidence minus accuracy on test, before "
           "temperature scaling: below 0, below its members' mean, below the CE ensemble's); "
           "and calibrating after pooling repairs it: the pool-then-calibrate ECE is below the "
           "raw ensemble's and below calibrate-then-pool's (temperatures fitted by NLL on "
           "validation: one on the pooled prediction, or one per member before pooling).")


def _repair_cols(losses: Sequence[str]) -> tuple[tuple[str, str, str], ...]:
    out: tuple[tuple[str, str, str], ...] = (("ce", GAP_KEY, "CE ensemble conf − acc %"),)
    for x in losses:
        name = loss_label(x)
        out += ((x, MEMBERS + GAP_KEY, f"{name} members conf − acc %"),
                (x, GAP_KEY, f"{name} ensemble conf − acc %"), (x, ECE, f"{name} ensemble ECE %"),
                (x, POOL_THEN_CAL_NLL, f"{name} pool→T ECE % (NLL T)"),
                (x, CAL_THEN_POOL_NLL, f"{name} T→pool ECE % (NLL T)"),
                (x, TEMP_NLL, f"{name} pooled T (NLL)"),
                (x, POOL_THEN_CAL, f"{name} pool→T ECE % (grid-ECE T)"),
                (x, TEMP, f"{name} pooled T (grid ECE)"))
    return out


def _repair_needs(losses: Sequence[str]) -> tuple[tuple[str, str], ...]:
    return (("ce", GAP_KEY),) + tuple((x, k) for x in losses for k in (
        GAP_KEY, MEMBERS + GAP_KEY, ECE, POOL_THEN_CAL_NLL, CAL_THEN_POOL_NLL))


#: The ensemble claims, tested one seed set at a time (``per="seed_set"``): on every subset of
#: :data:`~torchcal.ensemble.SEED_SUBSET_SIZE` seeds when the results hold those ensembles
#: (:attr:`~torchcal.report.aggregate.Group.subsets`), else on each ensemble record.
ENSEMBLE_CLAIMS: tuple[Claim, ...] = (
    Claim("lakshminarayanan_ensemble", _LAKSHMINARAYANAN,
          "the ensemble of cross-entropy members (the mean of their probabilities) has a lower "
          "test NLL than its best member (below the members' mean NLL holds for every ensemble, "
          "by Jensen's inequality) and a lower test error than its members' mean.",
          ("ce",), _ensemble_beats_members,
          (("ce", MEMBERS_MIN + NLL, "CE best member NLL"), ("ce", MEMBERS + NLL, "CE members NLL"),
           ("ce", NLL, "CE ensemble NLL"),
           ("ce", MEMBERS + ERR, "CE members error %"), ("ce", ERR, "CE ensemble error %")),
          per="seed_set", short="CE ensemble below its best member",
          needs=tuple(("ce", k) for k in (NLL, ERR, MEMBERS_MIN + NLL, MEMBERS + ERR))),
    Claim("rahaman_wen_calibrated_members", _RAHAMAN_WEN,
          "the ensemble of members trained to be calibrated (focal loss γ=3 and FLSD-53, each "
          "its own ensemble) " + _REPAIR,
          ("ce", "focal", "flsd53"), _pooling_makes_underconfident(("focal", "flsd53")),
          _repair_cols(("focal", "flsd53")), per="seed_set",
          needs=_repair_needs(("focal", "flsd53")),
          short="focal and FLSD-53 ensembles more under-confident than their members and CE's, "
                "repaired by pooling first"),
    Claim("wen_label_smoothing", _RAHAMAN_WEN,
          "the ensemble of label-smoothing members (softened labels, as mixup's) " + _REPAIR,
          ("ce", "ls"), _pooling_makes_underconfident(("ls",)), _repair_cols(("ls",)),
          per="seed_set", needs=_repair_needs(("ls",)), short="label-smoothing ensemble more under-confident than its "
                                "members and CE's, repaired by pooling first"),
)


def mukhoti_ood_claim(ood: str) -> Claim:
    """Mukhoti et al. 2020's OOD claim on the OOD set ``ood`` (its saved logits'
    ``ood_<ood>`` name): focal loss (γ=3) and FLSD-53 each give a higher softmax-entropy OOD
    AUROC than cross-entropy (pre T), tested seed by seed.

    >>> mukhoti_ood_claim("mnist1d_shuffled").columns[0]
    ('ce', 'ood.mnist1d_shuffled.auroc_entropy', 'Cross-entropy AUROC %')
    """
    key = f"ood.{ood}.auroc_entropy"
    return Claim("mukhoti_ood_entropy", _MUKHOTI,
                 f"focal loss (γ=3) and FLSD-53 each detect the OOD set `{ood}` better than "
                 "cross-entropy by the entropy of their prediction: a higher entropy AUROC "
                 "(pre T; the OOD set as the positive class).",
                 ("ce", "focal", "flsd53"), _higher_auroc(key),
                 _cols(("ce", "focal", "flsd53"), key, "AUROC %"),
                 short="focal and FLSD-53 detect OOD inputs better than CE",
                 needs=tuple((x, key) for x in ("ce", "focal", "flsd53")))
