"""The calibration benchmarks of ``torchcal demo`` (MNIST-1D, noisy digits) and their report prose.

* ``mnist1d`` (default): the MNIST-1D paper's 1-D CNN (recipe ``mnist1d-cnn``, the CIFAR papers'
  full recipe) on 2,000 / 2,000 / 8,000 generated MNIST-1D signals, the papers' regime (the
  network fits its training set; cross-entropy is over-confident at about 6% test error).  Every
  loss at its published defaults (AdaFocal λ=1).  The default run trains the losses the claims
  compare (:data:`CLAIM_LOSSES`) for 2 seeds on the recipe's 350 epochs (milestones 150, 250),
  so its verdicts are in the papers' regime (147-148 s measured on 2 idle cores with the
  one engine's packs, target 150 s); ``full`` trains every loss tagged ``demo`` on the recipe's 350
  epochs for 5 seeds.
* ``digits``: the 64-256-256-10 MLP (recipe ``digits-mlp``) on scikit-learn's 8×8 digits with
  Gaussian pixel noise, every ``demo`` loss, 5 seeds × 100 epochs, AdaFocal at λ=0.1
  (:data:`ADAFOCAL_NOTE`).

MNIST-1D's default size is the smallest run in the papers' regime: the recipe's whole schedule,
the 7 claim losses and 2 seeds (the least for a seed-wise verdict and an ensemble), 14 runs in
two packs of 7 on 2 cores (``torchcal demo --epochs 350 --seeds 2``, which was 60 epochs x 3
seeds until the packed engine brought it under 150 s; benchmarks/results/packed_engine.md).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..losses import LOSSES, list_losses
from ..models.small import MLP
from ..report.aggregate import loss_label
from ..train import TrainConfig, get_recipe
from ..train.build import build_data
from .benchmark import Benchmark, IntroContext, Profile, register_benchmark
from .claims import CLAIMS, ENSEMBLE_CLAIMS, mukhoti_ood_claim
from .demo import TRAINING_RUNS

__all__ = ["ADAFOCAL_LAM", "ADAFOCAL_NOTE", "adafocal_note", "DEMO_LOSS_KWARGS", "CLAIM_LOSSES", "calibration_intro", "calibration_appendix", "MNIST1D",
           "DIGITS"]

#: The losses the papers' claims compare (:data:`torchcal.experiments.claims.CLAIMS`), table order.
CLAIM_LOSSES: tuple[str, ...] = tuple(sorted({x for c in CLAIMS for x in c.losses},
                                             key=LOSSES.rank))

#: AdaFocal's update rate λ in the noisy-digits benchmark (see :data:`ADAFOCAL_NOTE`); MNIST-1D
#: uses the paper's λ=1 (the registry default).
ADAFOCAL_LAM = 0.1
ADAFOCAL_NOTE = (
    "The validation split holds 180 images × 5 noisy copies, about 60 samples per equal-mass "
    "bin, and on this noisy data the network stays over-confident on validation in most bins for "
    "the whole run, so the multiplicative update γ_b ← γ_b·exp(λ·(C_b − A_b)) compounds epoch "
    "after epoch: λ only sets how fast γ runs into γ_max=20. Measured sweep (5 seeds × 100 epochs; "
    "bins whose final γ sits at γ_max out of 15; mean test ECE): λ=1: 6–11 bins on every seed, ECE "
    "4.4%; λ=0.5: 4–9 bins on every seed, 4.9%; λ=0.3: 4–9 bins on every seed, 6.8%; λ=0.2: γ_max "
    "reached on 4 of 5 seeds, 8.6%; λ=0.15: on 3 of 5 seeds, 10.0%; λ=0.1: on no seed (largest "
    "final γ 12.1), 11.7%. λ=0.1 is the largest tested value that keeps every γ inside "
    "[γ_min, γ_max] on every seed; the price is a slower correction (AdaFocal stays somewhat "
    "over-confident, T≈1.5). Saturation did not collapse accuracy here (mean test error 32.4–32.6% "
    "for every λ), so `--adafocal-lam 1` is a fair alternative when pinned bins are acceptable."
)

#: Loss hyperparameters of the calibration benchmarks (the papers' values: LS α=0.05 and focal
#: γ=3 as in Mukhoti et al. 2020's tables).
DEMO_LOSS_KWARGS: dict[str, dict[str, Any]] = {
    "ls": {"alpha": 0.05},
    "focal": {"gamma": 3.0},
}

_VARIANT = "a variant from the published code, outside the demo's table of the seed methods"
#: Why a registered loss without the ``demo`` tag is not trained, by its tag.
_EXCLUDED = {
    "cifar-schedule": "an epoch schedule of the 350-epoch CIFAR recipe (γ=5 for epochs < 100, "
                      "then γ=3)",
    "variant": _VARIANT,
}


def _exclusion(bench: Benchmark, loss: str, epochs: int) -> str:
    """Why ``loss`` is not trained, with what the CIFAR schedule would be on this run's epochs.

    >>> _exclusion(MNIST1D, "flsc531", 15)[-53:]
    'then γ=3): on this 15-epoch run, focal γ=5 throughout'
    """
    why = bench.exclusion(loss)
    if why == _EXCLUDED["cifar-schedule"] and epochs <= 100:
        why += f": on this {epochs}-epoch run, focal γ=5 throughout"
    return why


def adafocal_note(lam: float, dataset: str = "digits") -> str:
    """The report's sentence on AdaFocal's λ: which value was used and why (:data:`ADAFOCAL_NOTE`
    on noisy digits; MNIST-1D uses the paper's λ=1).

    >>> adafocal_note(1.0, "mnist1d")[:41]
    "AdaFocal uses the paper's λ=1 (its regist"

    >>> adafocal_note(0.1)[:54]
    "AdaFocal uses λ=0.1 instead of the paper's λ=1 (the de"
    >>> adafocal_note(1.0)[:41]
    "AdaFocal uses the paper's λ=1 (set by the"
    """
    if dataset != "digits":
        if lam == 1:
            return ("AdaFocal uses the paper's λ=1 (its registry default), with γ updated once per "
                    "epoch from the validation set's equal-mass bins.")
        return (f"AdaFocal uses λ={lam:g} (set by the user; the paper's and this benchmark's "
                "default is λ=1).")
    if lam == ADAFOCAL_LAM:
        lead = f"AdaFocal uses λ={lam:g} instead of the paper's λ=1 (the demo's default). Why: "
    elif lam == 1:
        lead = (f"AdaFocal uses the paper's λ=1 (set by the user; the demo's default is "
                f"λ={ADAFOCAL_LAM:g}). Why the default differs: ")
    else:
        lead = (f"AdaFocal uses λ={lam:g} (set by the user; the paper's λ is 1, the demo's default "
                f"λ={ADAFOCAL_LAM:g}). Why the default differs from the paper: ")
    return lead + ADAFOCAL_NOTE


def _hyper_text(loss: str, kwargs: Mapping[str, Any]) -> str:
    """``'Focal: gamma=3'`` from the registry entry's signature defaults and ``kwargs``."""
    try:
        sig = inspect.signature(LOSSES.get(loss))
        params = {k: p.default for k, p in sig.parameters.items()
                  if k not in ("self", "reduction", "ignore_index", "validate_args")
                  and p.default is not inspect.Parameter.empty and p.default is not None}
    except (TypeError, ValueError):
        params = {}
    params.update(kwargs)
    if not params and loss.startswith("flsd"):
        return f"{loss_label(loss)} (sample-dependent γ preset of Mukhoti et al. 2020)"
    args = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
    return f"{loss_label(loss)}" + (f" ({args})" if args else "")


def _pct(f: float) -> str:
    return f"{round(100 * f, 1):g}%"


#: What a failed data build raises (a missing file, a bad option): the prose then says less.
_DESCRIBE_ERRORS = (OSError, ValueError, TypeError, ImportError, RuntimeError)


def _data_info(tc: TrainConfig) -> tuple[dict[str, Any], int, tuple[int, ...]] | None:
    """The data's ``info``, number of classes and input shape (the splits are built: their
    sizes are the data set's own), None when they cannot be built here (the prose says less;
    the runs report the error)."""
    try:
        splits = build_data(tc)
    except _DESCRIBE_ERRORS:
        return None
    shape = tuple(int(x) for x in (splits.input_shape or ()))
    return dict(getattr(splits, "info", {}) or {}), int(splits.num_classes), shape


def _mlp_text(tc: TrainConfig, num_classes: int, shape: tuple[int, ...]) -> str:
    """``"MLP 64-256-256-10"``: the registered MLP's widths, read from the config and the MLP's
    signature (nothing built)."""
    kw = dict(tc.model_kwargs)
    hidden = kw.get("hidden", inspect.signature(MLP).parameters["hidden"].default)
    n_in = kw.get("in_features", math.prod(shape) if shape else
                  inspect.signature(MLP).parameters["in_features"].default)
    return "MLP " + "-".join(str(int(w)) for w in (n_in, *hidden, num_classes))


def _model_and_info(tc: TrainConfig) -> tuple[str, dict[str, Any]]:
    """The model's description and the data's ``info``, from the config, the model registry
    and the data's splits (no model is built; the widths are the MLP's)."""
    data = _data_info(tc)
    if data is None:
        return f"`{tc.model}`", {}
    info, num_classes, shape = data
    model_txt = _mlp_text(tc, num_classes, shape) if tc.model == "mlp" else f"`{tc.model}`"
    return model_txt, info


def _digits_data_text(tc: TrainConfig, info: Mapping[str, Any], cfg: Any) -> str:
    if not info:
        return f"data set `{tc.dataset}`."
    fr = info.get("split", (0.6, 0.1, 0.3))
    n_img = info.get("images", {})
    k = info.get("n_copies", 5)
    std = info.get("noise_std", cfg.data_kwargs.get("noise_std", 0.5))
    return (
        "scikit-learn's 8×8 digits (1,797 images, 10 classes), pixels scaled to [0, 1] with "
        f"fixed Gaussian noise (std {std:g}, drawn once per image: the idea of CIFAR-10-C's "
        "Gaussian noise), so that the network overfits and cross-entropy becomes "
        "over-confident as on CIFAR. Each seed draws its own stratified "
        f"{'/'.join(f'{100 * f:g}' for f in fr)} train/validation/test split "
        f"({n_img.get('train', '?')} / {n_img.get('val', '?')} / {n_img.get('test', '?')} "
        "images), noise and initialisation; validation and test images come in "
        f"{k} independent noisy copies.")


def _mnist1d_data_text(tc: TrainConfig, info: Mapping[str, Any], cfg: Any) -> str:
    n = dict(info.get("sizes") or {})  # load_mnist1d_splits' info: {"train": n, ...}
    sizes = " / ".join(f"{v:,}" if isinstance(v, int) else "?"
                       for v in (n.get(k) for k in ("train", "val", "test")))
    return (
        "MNIST-1D (Greydanus & Kobak, ICML 2024): 1-D signals of length 40 generated locally "
        "from ten templates (the `mnist1d` package's own generator, its default arguments), "
        f"{sizes} train/validation/test signals, the same data for every seed; a training "
        "set small enough that the network fits it, as a ResNet fits CIFAR-10, and a test "
        "set large enough for an ECE noise floor well below 1%.")


def _mnist1d_model_text(tc: TrainConfig) -> str:
    return ("the MNIST-1D paper's 1-D CNN (`mnist1d_cnn`: 3 convolutions of width "
            f"{tc.model_kwargs.get('width', 64)}, then a linear layer)")


def _schedule_note(ctx: IntroContext) -> str:
    """The shortened-schedule warning (the committed full run's verdicts are in a block of
    their own at the head of the claims: :func:`~torchcal.experiments.benchmark.committed_note`)."""
    tc, full_epochs = ctx.train_config, int(get_recipe(ctx.config.recipe).epochs)
    if tc.epochs == full_epochs:
        return ""
    lead = ("**A smoke test (`--quick`), not evidence:**" if ctx.config.quick
            else "**Shortened schedule:**")
    return (f"{lead} {tc.epochs} of the recipe's {full_epochs} epochs (milestones at the same "
            "fractions); every loss ends less fitted, and AdaFocal gets fewer γ updates, so "
            "the verdicts above say what this run shows, not whether the papers hold; `--full` "
            "runs the recipe's schedule.")


def _training_text(tc: TrainConfig) -> str:
    """The optimiser and schedule of the runs, in one line."""
    ms = tc.effective_milestones()
    if ms:
        fr_txt = ", ".join(_pct(m / tc.epochs) for m in ms)
        sched = (f"lr ×{tc.lr_gamma:g} at epoch{'s' if len(ms) > 1 else ''} "
                 f"{', '.join(map(str, ms))} ({fr_txt})")
    else:
        sched = "constant lr"
    return (f"SGD, momentum {tc.momentum:g}{', Nesterov' if tc.nesterov else ''}, lr {tc.lr:g}, "
            f"weight decay {tc.weight_decay:g}, batch {tc.batch_size}, {tc.epochs} epochs, {sched}"
            + (f", gradient clipping at {tc.grad_clip:g}" if tc.grad_clip else ""))


def _untrained(ctx: IntroContext) -> dict[str, list[str]]:
    """``{why not trained: [registered losses]}`` of the registered losses this run leaves out."""
    left = [n for n in list_losses() if n not in ctx.losses]
    bench = ctx.benchmark
    tagged = set(bench.losses("full"))
    subset = bench.profile("default").losses is not None and not ctx.config.full
    out: dict[str, list[str]] = {}
    for n in left:
        why = ("trained by `--full` (the default trains the losses the claims compare, to fit "
               "its time budget)" if n in tagged and subset
               else "not in the demo list" if n in tagged
               else _exclusion(bench, n, ctx.train_config.epochs))
        out.setdefault(why, []).append(n)
    return out


def _ensembles_text(cfg: Any) -> str:
    """The intro's line on the losses' ensembles: the seeds pooled and the split of each step.

    >>> _ensembles_text(type("C", (), {"seeds": (0,)}))[:40]
    '- **Ensembles:** none (one seed; `--seed'
    """
    if len(cfg.seeds) < 2:
        return ("- **Ensembles:** none (one seed; `--seeds 0,1` or more adds each loss's "
                "ensemble, and its claims are not evaluated with one seed).")
    return ("- **Ensembles:** per loss, the mean of the probabilities of its seeds "
            f"{', '.join(map(str, cfg.seeds))} (those whose run finished; the table \"Ensembles\" "
            "names the seeds pooled), its own row \"· ensemble\", never averaged with the seeds. "
            "Temperatures fitted on the validation split, either on the pooled ensemble (pool "
            "then calibrate) or on each member before pooling (calibrate then pool); every "
            "number on the test split.")


def calibration_intro(ctx: IntroContext, *, data_text: Callable, ood_text: str,
                      model_text: Callable | None = None) -> str:
    """The report's prose above the tables of a calibration benchmark: the setting in a few
    lines (the details are in :func:`calibration_appendix`)."""
    cfg, tc = ctx.config, ctx.train_config
    model_txt = model_text(tc) if model_text is not None else _model_and_info(tc)[0]
    recipe = f"recipe `{cfg.recipe}`" + (", with changes" if cfg.overrides or cfg.data_kwargs else "")
    n_left = sum(map(len, _untrained(ctx).values()))
    lines = [
        f"- **Benchmark:** {ctx.benchmark.summary}; data, OOD set and every hyperparameter in "
        "the appendix.",
        f"- **Model and training:** {model_txt}; {recipe}: {_training_text(tc)}.",
        f"- **Seeds:** {', '.join(map(str, cfg.seeds))}. **Losses:** "
        + ", ".join(loss_label(n, ctx.loss_kwargs.get(n)) for n in ctx.losses)
        + (f" ({n_left} other registered losses not trained: see the appendix)." if n_left else "."),
        f"- **Evaluation:** temperatures fitted on each run's validation logits, metrics on its "
        f"test logits ({cfg.n_bins} bins), OOD detection by softmax entropy.",
        _ensembles_text(cfg),
        f"- **Wall time** up to this report: {ctx.seconds:.0f} s, {cfg.workers} worker "
        "process(es) × 1 thread"
        + (f"; {ctx.skipped} of {ctx.n_jobs} runs were already finished (an earlier demo in this "
           "directory), so this is not the demo's time." if ctx.skipped else "."),
    ]
    note = _schedule_note(ctx)
    if note:
        lines += ["", note.strip()]
    if ctx.failed:
        lines += ["", "**Failed runs:**", ""] + [f"- `{d}`: {e}" for d, e in ctx.failed]
    return "\n".join(lines)


def calibration_appendix(ctx: IntroContext, *, data_text: Callable, ood_text: str,
                         model_text: Callable | None = None) -> str:
    """The report's appendix of a calibration benchmark: the data, the OOD set, every
    hyperparameter, AdaFocal's λ, and a table of the registered losses not trained (why)."""
    tc = ctx.train_config
    _model, info = _model_and_info(tc)
    lines = ["## Appendix: the setting in full", "",
             f"**Data.** {data_text(tc, info, ctx.config)}", "", ood_text, "",
             "**Losses, with every hyperparameter** (registry defaults unless the benchmark or "
             "the user sets them): "
             + "; ".join(_hyper_text(n, ctx.loss_kwargs.get(n, {})) for n in ctx.losses) + "."]
    if "adafocal" in ctx.losses:
        lam = ctx.loss_kwargs.get("adafocal", {}).get("lam", 1.0)
        lines += ["", "**AdaFocal:** " + adafocal_note(float(lam), ctx.benchmark.name)]
    untrained = _untrained(ctx)
    if untrained:
        lines += ["", "**Registered losses not trained in this run**", "",
                  "| Losses | Why not trained |", "|---|---|"]
        lines += [f"| {', '.join(loss_label(n) for n in names)} | {why} |"
                  for why, names in untrained.items()]
    return "\n".join(lines)


_MNIST1D_OOD = ("**OOD set:** MNIST-1D's shuffled variant (the package's `shuffle_seq`: each "
                "signal's time steps permuted, the same values in another order; "
                "`torchcal.data.load_mnist1d_ood`); AUROC treats it as the positive class. "
                "It plays the role SVHN plays for the CIFAR-10 models of Mukhoti et al. 2020, "
                "kept for that role on three grounds, settled before its verdict was computed: "
                "SVHN is an input of the same shape and value range as the training data that "
                "holds none of its classes, and a shuffled signal is exactly that (the same 40 "
                "values, so no amplitude or range cue, and no template's shape); it is "
                "generated locally like the training data (no download, the same for every "
                "seed); and the set of the runs' saved logits already holds it, so the verdict "
                "is computed from the committed run without re-training. Pure noise or a "
                "constant signal, the alternatives a generator offers, differ from the training "
                "signals in their statistics and would be detected by every loss alike.")
_DIGITS_OOD = ("**OOD set:** 1,000 noisy 8×8 patches of the two photographs bundled with "
               "scikit-learn (a temple and a flower), in grey, downscaled 4× so that a patch "
               "holds edges and texture at the scale of a digit's strokes, min-max scaled to "
               "[0, 1] with the same pixel noise (`torchcal.data.digits.load_digits_ood`): the "
               "same input format and corruption as the digits, but no digit; AUROC treats it "
               "as the positive class.")

#: The MNIST-1D benchmark's claims: the seed papers' (:data:`CLAIMS`), Mukhoti et al.'s OOD
#: claim on the shuffled signals (SVHN's role, see ``_MNIST1D_OOD``) and the ensemble claims.
MNIST1D_CLAIMS = (*CLAIMS, mukhoti_ood_claim("mnist1d_shuffled"), *ENSEMBLE_CLAIMS)

MNIST1D = register_benchmark(Benchmark(
    name="mnist1d", title="calibration on MNIST-1D", recipe="mnist1d-cnn",
    summary="the MNIST-1D paper's 1-D CNN on generated MNIST-1D signals with the CIFAR papers' "
            "recipe (mnist1d-cnn), every loss at its published defaults (AdaFocal λ=1)",
    profiles={
        "default": Profile(seeds=(0, 1), epochs=None, losses=CLAIM_LOSSES,
                           measured="about 150 s measured on 2 idle cores"),
        "quick": Profile(seeds=(0,), epochs=15, losses=CLAIM_LOSSES,
                         measured="14 s measured on 2 idle cores"),
        "full": Profile(seeds=(0, 1, 2, 3, 4), epochs=None,
                        measured="9 minutes measured on 2 idle cores"),
    },
    loss_kwargs=DEMO_LOSS_KWARGS, claims=MNIST1D_CLAIMS,
    committed_results="docs/results/mnist1d/results.csv",
    committed_note="packed runs equal their --no-pack runs bit for bit on the CPU; earlier "
                   "committed runs (the former engine, other CPUs) held AdaFocal on 2, 3 and 5 "
                   "of 5, BSCE-GRA on 3 and 5 of 5: docs/results/mnist1d/RUN.md, RERUN.md",
    verdict_labels={
        "mukhoti_ce_overconfident": "CE over-confident",
        "mukhoti_focal_lt_ce": "focal below CE",
        "mukhoti_flsd53_lt_ce": "FLSD-53 below CE",
        "ghosh_adafocal_lowest": "AdaFocal lowest AdaECE of the focal family",
        "lin_bsce_gra": "BSCE-GRA below CE and BSCE",
        "tao_dual_focal": "dual focal below focal",
        "mukhoti_ood_entropy": "focal and FLSD-53 above CE in entropy OOD AUROC",
        "lakshminarayanan_ensemble": "CE ensemble below its best member in NLL and its "
                                     "mean member in error",
        "rahaman_wen_calibrated_members": "focal and FLSD-53 ensembles more under-confident "
                                          "than their members and CE's, repaired by "
                                          "pool-then-calibrate (NLL T)",
        "wen_label_smoothing": "label-smoothing ensemble more under-confident than its members "
                               "and CE's, repaired by pool-then-calibrate (NLL T)",
    },
    excluded=_EXCLUDED, kind=TRAINING_RUNS,
    intro=functools.partial(
        calibration_intro, data_text=_mnist1d_data_text, model_text=_mnist1d_model_text,
        ood_text=_MNIST1D_OOD),
    appendix=functools.partial(
        calibration_appendix, data_text=_mnist1d_data_text, model_text=_mnist1d_model_text,
        ood_text=_MNIST1D_OOD),
))

DIGITS = register_benchmark(Benchmark(
    name="digits", title="calibration on noisy digits", recipe="digits-mlp",
    summary=f"the noisy-digits MLP benchmark (the recipe's 100 epochs, AdaFocal "
            f"λ={ADAFOCAL_LAM:g})",
    profiles={
        "default": Profile(seeds=(0, 1, 2, 3, 4)),
        "quick": Profile(seeds=(0, 1), epochs=30),
        "full": Profile(seeds=(0, 1, 2, 3, 4)),
    },
    loss_kwargs={**DEMO_LOSS_KWARGS, "adafocal": {"lam": ADAFOCAL_LAM}},
    data_kwargs={"noise_std": 0.5},  # a declared option of the digits data set
    claims=(*CLAIMS, *ENSEMBLE_CLAIMS), excluded=_EXCLUDED, kind=TRAINING_RUNS,
    intro=functools.partial(calibration_intro, data_text=_digits_data_text, ood_text=_DIGITS_OOD),
    appendix=functools.partial(
        calibration_appendix, data_text=_digits_data_text,
        ood_text=_DIGITS_OOD),
))
