"""Training an uncertainty head from an embedding cache, and evaluating it.

:func:`fit_head` follows the published recipe: AdamW with ``lr = 1e-3 * batch_size / 256``,
weight decay ``1e-4``, a cosine schedule over all steps, the pairwise :func:`ranking_loss`
against the frozen classifier's per-sample cross-entropy (or the published code's other
objectives: ``objective="mse"`` loss prediction, ``leeway``, ``unc_reg_lambda``; see
:mod:`torchcal.uncertainty.objectives`).

:func:`evaluate_head` reports R-AUROC (the AUROC of ``-u`` for predicting correctness) against

* classifier correctness (``argmax logits == label``), and
* recall@1 correctness from the embeddings: the cosine nearest neighbour (excluding the sample
  itself) has the same label; this needs no classifier, so it also measures zero-shot transfer
  to a data set with other classes (:func:`zero_shot_transfer`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .._validation import check_nonneg_finite, check_positive_int, with_settings
from ..metrics import entropy, ood_scores, r_auroc
from .cache import EmbeddingCache
from .head import UncertaintyHead, per_sample_cross_entropy
from .objectives import HEAD_OBJECTIVES, head_loss

__all__ = [
    "HeadFit",
    "HeadFitOptions",
    "fit_head",
    "predict_uncertainty",
    "recall_at_1_correct",
    "evaluate_head",
    "zero_shot_transfer",
]


class HeadFit(NamedTuple):
    """Result of :func:`fit_head`: the trained head (eval mode) and the mean loss per epoch."""

    head: UncertaintyHead
    epoch_losses: list[float]


def _as_float_tensor(x: Any, name: str) -> torch.Tensor:
    t = torch.from_numpy(np.asarray(x)) if isinstance(x, np.ndarray) else x
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"Expected `{name}` to be a tensor or array, got {type(x).__name__}")
    return t


def _unpack(data: Any, *, first_pass: bool = False,
            device: torch.device | str | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(embeddings (N, D) float, logits (N, C) or None, labels (N,) long) from a cache or a
    tuple ``(embeddings, logits, labels)`` (logits may be None)."""
    if isinstance(data, EmbeddingCache):
        emb, logits, labels = data.tensors(device)
        if first_pass and data.n_passes > 1:
            n = data.n_samples
            emb, logits, labels = emb[:n], logits[:n], labels[:n]
        return emb, logits, labels
    if isinstance(data, (tuple, list)) and len(data) == 3:
        emb = _as_float_tensor(data[0], "embeddings")
        logits = None if data[1] is None else _as_float_tensor(data[1], "logits")
        labels = _as_float_tensor(data[2], "labels")
        if device is not None:
            emb, labels = emb.to(device), labels.to(device)
            logits = None if logits is None else logits.to(device)
        if emb.ndim != 2 or not emb.is_floating_point():
            raise ValueError(f"Expected `embeddings` to be a float (N, D) tensor, got {emb.dtype} "
                             f"{tuple(emb.shape)}")
        n = emb.shape[0]
        if labels.ndim != 1 or labels.shape[0] != n or labels.is_floating_point():
            raise ValueError(f"Expected `labels` to be integer of shape ({n},), got "
                             f"{labels.dtype} {tuple(labels.shape)}")
        if logits is not None and (logits.ndim != 2 or logits.shape[0] != n):
            raise ValueError(f"Expected `logits` of shape ({n}, C), got {tuple(logits.shape)}")
        return emb, logits, labels.long()
    raise TypeError(
        "Expected an EmbeddingCache or an (embeddings, logits, labels) tuple, got "
        f"{type(data).__name__}"
    )


@dataclass(frozen=True)
class HeadFitOptions:
    """How :func:`fit_head` trains (each field also a keyword of :func:`fit_head`, which wins
    over ``options``).

    Attributes:
        epochs: passes over the cache.
        batch_size: even batch size (pairs are consecutive samples).
        lr: AdamW learning rate (default ``1e-3 * batch_size / 256``).
        weight_decay: AdamW weight decay.
        margin: ranking-loss margin.
        objective: ``"ranking"`` (the paper's pairwise hinge) or ``"mse"`` (loss prediction,
            :func:`~torchcal.uncertainty.objectives.loss_prediction_mse`).
        leeway: the ranking loss' ρ: pairs whose losses differ by less count as equal.
        unc_reg_lambda: λ of the log-uncertainty regulariser ``-λ·log(mean u)`` (0 = off).
        width: hidden width of a new head.
        depth: hidden layers of a new head.
        seed: seed of the initialisation (new heads) and of the batch order.
    """

    epochs: int = 10
    batch_size: int = 256
    lr: float | None = None
    weight_decay: float = 1e-4
    margin: float = 0.1
    objective: str = "ranking"
    leeway: float = 0.0
    unc_reg_lambda: float = 0.0
    width: int = 512
    depth: int = 2
    seed: int = 0


def fit_head(
    data: EmbeddingCache | tuple,
    *,
    head: UncertaintyHead | None = None,
    options: HeadFitOptions | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
    **settings: Any,
) -> HeadFit:
    """Train an :class:`UncertaintyHead` on cached embeddings with the ranking loss (default).

    The whole cache is loaded to ``device`` once; every epoch draws a new permutation (from
    ``seed``) and visits it in batches of ``batch_size`` (a final partial batch is trimmed to an
    even size).  Target: the per-sample cross-entropy of the cached logits.

    Args:
        data: an :class:`EmbeddingCache` or ``(embeddings (N, D), logits (N, C), labels (N,))``.
        head: a head to continue training (default: a new ``UncertaintyHead(D, width, depth)``).
        options: how to train (:class:`HeadFitOptions`; default: its defaults).
        device: where to train (default: the head's device, else CPU).
        progress: show a tqdm progress bar.
        **settings: fields of :class:`HeadFitOptions` (``epochs=3``, ``lr=1e-3``, ...),
            replacing those of ``options``.

    Returns:
        :class:`HeadFit` ``(head in eval mode, mean loss per epoch)``.

    Raises:
        TypeError: a keyword that is no field of :class:`HeadFitOptions`.
    """
    o = with_settings(options, HeadFitOptions(), settings, "fit_head")
    width, depth, seed = o.width, o.depth, o.seed
    epochs, batch_size, lr, weight_decay, loss_kw = _check_fit_args(
        o.epochs, o.batch_size, o.lr, o.weight_decay, o.objective, o.margin, o.leeway,
        o.unc_reg_lambda)
    if device is None:
        device = next(head.parameters()).device if head is not None else torch.device("cpu")
    device = torch.device(device)
    emb, target = _training_data(data, device)
    n, d = emb.shape
    head = _init_head(head, d, width=width, depth=depth, seed=seed)
    head.to(device).train()

    bs = min(batch_size, n - n % 2)
    full, rest = divmod(n, bs)
    steps_per_epoch = full + (1 if rest >= 2 else 0)
    total = steps_per_epoch * epochs
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    gen = torch.Generator().manual_seed(int(seed))
    bar = _progress_bar(total) if progress else None
    epoch_losses: list[float] = []
    try:
        for epoch in range(epochs):
            perm = torch.randperm(n, generator=gen).to(device)
            running = _train_epoch(head, emb, target, perm, bs, steps_per_epoch, opt, sched,
                                   loss_kw, bar)
            epoch_losses.append(float(running) / steps_per_epoch)
            if bar is not None:
                bar.set_postfix(epoch=epoch + 1, loss=f"{epoch_losses[-1]:.4f}")
    finally:
        if bar is not None:
            bar.close()
    head.eval()
    return HeadFit(head, epoch_losses)


def _check_fit_args(epochs: int, batch_size: int, lr: float | None, weight_decay: float,
                    objective: str, margin: float, leeway: float, unc_reg_lambda: float,
                    ) -> tuple[int, int, float, float, dict[str, Any]]:
    """Validate :func:`fit_head`'s settings; return them with the loss settings as kwargs."""
    epochs = check_positive_int(epochs, "epochs")
    batch_size = check_positive_int(batch_size, "batch_size")
    if batch_size < 2 or batch_size % 2:
        raise ValueError(f"Expected `batch_size` to be even and >= 2 (pairs), got {batch_size}")
    weight_decay = check_nonneg_finite(weight_decay, "weight_decay")
    if objective not in HEAD_OBJECTIVES:
        raise ValueError(f"Expected `objective` to be one of {HEAD_OBJECTIVES}, got {objective!r}")
    margin = check_nonneg_finite(margin, "margin")
    leeway = check_nonneg_finite(leeway, "leeway")
    unc_reg_lambda = check_nonneg_finite(unc_reg_lambda, "unc_reg_lambda")
    lr = 1e-3 * batch_size / 256 if lr is None else lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"Expected `lr` to be a positive finite number, got {lr!r}")
    loss_kw = {"objective": objective, "margin": margin, "leeway": leeway,
               "unc_reg_lambda": unc_reg_lambda}
    return epochs, batch_size, lr, weight_decay, loss_kw


def _training_data(data: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Float embeddings (N, D) and the classifier's per-sample cross-entropy (N,) to train on."""
    emb, logits, labels = _unpack(data, device=device)
    if logits is None:
        raise ValueError("Expected `logits` to train the head (its target is the classifier's loss)")
    n = emb.shape[0]
    if n < 2:
        raise ValueError(f"Expected at least 2 samples to train the head, got {n}")
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= logits.shape[1]:
        raise ValueError(
            f"Expected `labels` in [0, {logits.shape[1] - 1}] (the classifier's classes), got "
            f"values in [{lo}, {hi}]"
        )
    target = per_sample_cross_entropy(logits, labels)
    return emb.float(), target


def _init_head(head: UncertaintyHead | None, d: int, *, width: int, depth: int,
               seed: int) -> UncertaintyHead:
    """A new seeded ``UncertaintyHead(d, width, depth)``, or ``head`` checked to take width d."""
    if head is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = UncertaintyHead(d, width=width, depth=depth)
    elif not isinstance(head, UncertaintyHead):
        raise TypeError(f"Expected `head` to be an UncertaintyHead, got {type(head).__name__}")
    elif head.in_features != d:
        raise ValueError(f"Expected `head` with in_features={d} (the cache's embedding width), "
                         f"got {head.in_features}")
    return head


def _progress_bar(total: int) -> Any:
    """A tqdm bar over the ``total`` optimiser steps of :func:`fit_head`."""
    return tqdm(total=total, desc="uncertainty head", unit="step", leave=False)


def _train_epoch(head: UncertaintyHead, emb: torch.Tensor, target: torch.Tensor,
                 perm: torch.Tensor, bs: int, steps: int, opt: torch.optim.Optimizer,
                 sched: Any, loss_kw: dict[str, Any], bar: Any) -> torch.Tensor:
    """One epoch of ``steps`` optimiser steps over ``perm`` in even batches; the summed loss."""
    running = torch.zeros((), device=perm.device)
    for s in range(steps):
        idx = perm[s * bs:(s + 1) * bs]
        idx = idx[: idx.shape[0] - idx.shape[0] % 2]
        loss = head_loss(head(emb[idx]), target[idx], **loss_kw)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        running += loss.detach()
        if bar is not None:
            bar.update(1)
    return running


@torch.no_grad()
def predict_uncertainty(head: UncertaintyHead, embeddings: torch.Tensor,
                        batch_size: int = 8192) -> torch.Tensor:
    """The head's uncertainties for (N, D) embeddings, shape (N,), in eval mode, batched."""
    batch_size = check_positive_int(batch_size, "batch_size")
    was = head.training
    head.eval()
    try:
        dev = next(head.parameters()).device
        outs = [head(embeddings[s:s + batch_size].to(dev))
                for s in range(0, embeddings.shape[0], batch_size)]
    finally:
        head.train(was)
    return torch.cat(outs) if outs else torch.zeros(0, device=dev)


@torch.no_grad()
def recall_at_1_correct(embeddings: torch.Tensor, labels: torch.Tensor,
                        chunk_size: int = 2048) -> torch.Tensor:
    """Whether each sample's cosine nearest neighbour (excluding itself) has its label.

    Vectorised over chunks of at most ``chunk_size`` queries; the chunk shrinks so that the
    ``chunk x N`` similarity block stays under 2**25 entries (128 MB in float32).  Exact ties in
    similarity resolve to the lowest index.

    Args:
        embeddings: (N, D), N >= 2.
        labels: (N,) integer labels.

    Returns:
        (N,) bool on the embeddings' device.

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 1.0]])
        >>> recall_at_1_correct(z, torch.tensor([0, 0, 1, 0]))
        tensor([ True,  True, False, False])
    """
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    if embeddings.ndim != 2 or embeddings.shape[0] < 2:
        raise ValueError(f"Expected `embeddings` of shape (N, D) with N >= 2, got "
                         f"{tuple(embeddings.shape)}")
    if labels.ndim != 1 or labels.shape[0] != embeddings.shape[0]:
        raise ValueError(f"Expected `labels` of shape ({embeddings.shape[0]},), got "
                         f"{tuple(labels.shape)}")
    work = embeddings if embeddings.dtype == torch.float64 else embeddings.float()
    z = nn.functional.normalize(work, dim=1)
    labels = labels.to(z.device)
    n = z.shape[0]
    chunk_size = max(1, min(chunk_size, (1 << 25) // n))
    out = torch.empty(n, dtype=torch.bool, device=z.device)
    for s in range(0, n, chunk_size):
        q = z[s:s + chunk_size]
        sim = q @ z.T
        rows = torch.arange(q.shape[0], device=z.device)
        sim[rows, rows + s] = -math.inf
        nn_idx = sim.argmax(dim=1)
        out[s:s + q.shape[0]] = labels[nn_idx] == labels[s:s + q.shape[0]]
    return out


def _safe_r_auroc(uncertainty: torch.Tensor, correct: torch.Tensor) -> float:
    """R-AUROC, NaN when every prediction is correct or every one is wrong."""
    k = int(correct.sum())
    if k == 0 or k == correct.shape[0]:
        return float("nan")
    return float(r_auroc(uncertainty=uncertainty, correct=correct))


def evaluate_head(
    head: UncertaintyHead,
    data: EmbeddingCache | tuple,
    *,
    classifier: bool | None = None,
    recall: bool = True,
    baselines: bool = True,
    batch_size: int = 8192,
    chunk_size: int = 2048,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """R-AUROC of a head's uncertainties on cached embeddings.

    For a multi-pass cache only the first pass is used (augmented copies of a sample would be
    each other's nearest neighbours).

    Args:
        head: a fitted :class:`UncertaintyHead`.
        data: an :class:`EmbeddingCache` or ``(embeddings, logits or None, labels)``.
        classifier: compute classifier-correctness metrics (default: when logits are present and
            every label is one of the classifier's classes; pass False for another data set
            whose labels merely happen to be in range).
        recall: compute recall@1-correctness metrics (labels < 0 disable them).
        baselines: also report the R-AUROC of the classifier's own max-probability
            (``1 - max_prob``) and entropy uncertainties, and of the embedding norm
            (``1 / ||z||``, the url code's ``embed-norm`` uncertainty, which needs no classifier).

    Returns:
        dict with ``n``, ``mean_uncertainty`` and, as computed, ``accuracy``, ``r_auroc_correct``,
        ``recall_at_1``, ``r_auroc_recall`` and ``baselines`` ``{"max_prob": {...}, "entropy":
        {...}, "embedding_norm": {...}}`` (same keys).  R-AUROC is NaN when all (or no) predictions are correct.
    """
    emb, logits, labels = _unpack(data, first_pass=True, device=device)
    u = predict_uncertainty(head, emb, batch_size).double()
    res: dict[str, Any] = {"n": int(emb.shape[0]), "mean_uncertainty": float(u.mean())}
    labels = labels.to(u.device)
    has_labels = bool((labels >= 0).all())
    if classifier is None:
        classifier = logits is not None and has_labels and int(labels.max()) < logits.shape[1]
    if classifier and logits is None:
        raise ValueError("Expected logits for classifier-correctness metrics (classifier=True)")
    base_scores = _baseline_scores(emb, logits, u.device) if baselines else {}
    base_res: dict[str, dict[str, float]] = {k: {} for k in base_scores}
    if classifier:
        correct = logits.to(u.device).argmax(1) == labels
        res["accuracy"] = float(correct.double().mean())
        res["r_auroc_correct"] = _safe_r_auroc(u, correct)
        for k, v in base_scores.items():
            base_res[k]["r_auroc_correct"] = _safe_r_auroc(v, correct)
    if recall and has_labels and emb.shape[0] >= 2:
        rc = recall_at_1_correct(emb, labels, chunk_size).to(u.device)
        res["recall_at_1"] = float(rc.double().mean())
        res["r_auroc_recall"] = _safe_r_auroc(u, rc)
        for k, v in base_scores.items():
            base_res[k]["r_auroc_recall"] = _safe_r_auroc(v, rc)
    base_res = {k: v for k, v in base_res.items() if v}
    if base_res:
        res["baselines"] = base_res
    return res


def _baseline_scores(emb: torch.Tensor, logits: torch.Tensor | None,
                     device: torch.device) -> dict[str, torch.Tensor]:
    """The baselines' uncertainties: the classifier's max-prob score and entropy (when
    there are logits) and the url code's embedding norm ``1 / ||z||``.

    The max-prob score is ``-log max_c p_c`` in float64 from the logits (the ranking of
    ``1 - max_prob``, which only ranks here): ``1 - softmax(z).amax()`` ties every row whose
    margin exceeds about 37 in float64 (issue 39)."""
    out: dict[str, torch.Tensor] = {}
    if logits is not None:
        lg = logits.to(device)
        # ood_scores needs a non-empty OOD set: the same rows, whose scores are dropped
        out["max_prob"] = ood_scores(id_logits=lg, ood_logits=lg[:1], score="max_prob")[0][:-1]
        out["entropy"] = entropy(logits=lg.float(), validate_args=False).double()
    out["embedding_norm"] = 1 / emb.to(device).double().norm(dim=1).clamp_min(1e-300)
    return out


def zero_shot_transfer(
    head: UncertaintyHead, datasets: Mapping[str, EmbeddingCache | tuple], **kwargs: Any
) -> dict[str, dict[str, Any]]:
    """Evaluate one head, unchanged, on other data sets embedded by the same backbone.

    Correctness is recall@1 from the embeddings (the data sets' classes need not be the
    classifier's); classifier-correctness metrics are off unless ``classifier=True`` is passed.
    Returns ``{name: evaluate_head(...) result}``.
    """
    kwargs.setdefault("classifier", False)
    return {name: evaluate_head(head, d, **kwargs) for name, d in datasets.items()}
