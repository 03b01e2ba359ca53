"""Pretrained uncertainty heads (Kirchhof et al. 2024).

* :class:`UncertaintyHead`: an MLP reading a frozen backbone's embedding through a stop-gradient;
  :func:`ranking_loss`: the pairwise hinge it is trained with (with the published ``leeway``);
  :func:`loss_prediction_mse` and :func:`log_uncertainty_regularizer`: the published code's
  loss-prediction objective and log-uncertainty regulariser (:mod:`.objectives`).
* :class:`EmbeddingCache`: the backbone's embeddings, logits and labels computed once and stored
  on disk (memory-mapped, checksummed, atomically built, stale/corrupt caches detected);
  :class:`CacheOptions`: how :meth:`EmbeddingCache.build` embeds.
* :func:`fit_head` (AdamW + cosine from the cache; :class:`HeadFitOptions`), :func:`evaluate_head` (R-AUROC against
  classifier correctness and recall@1 correctness), :func:`zero_shot_transfer`.
* ``torchcal uncertainty fit | eval RUN_DIR`` (:mod:`torchcal.cli.uncertainty`).
"""

from ..errors import CacheError, StaleCacheError
from .cache import CacheOptions, EmbeddingCache, data_identity, model_identity
from .fit import (
    HeadFit,
    HeadFitOptions,
    evaluate_head,
    fit_head,
    predict_uncertainty,
    recall_at_1_correct,
    zero_shot_transfer,
)
from .head import UncertaintyHead, load_head, per_sample_cross_entropy, ranking_loss, save_head
from .objectives import HEAD_OBJECTIVES, head_loss, log_uncertainty_regularizer, loss_prediction_mse

__all__ = [
    "UncertaintyHead",
    "ranking_loss",
    "loss_prediction_mse",
    "log_uncertainty_regularizer",
    "head_loss",
    "HEAD_OBJECTIVES",
    "per_sample_cross_entropy",
    "save_head",
    "load_head",
    "EmbeddingCache",
    "CacheOptions",
    "CacheError",
    "StaleCacheError",
    "model_identity",
    "data_identity",
    "HeadFit",
    "HeadFitOptions",
    "fit_head",
    "evaluate_head",
    "predict_uncertainty",
    "recall_at_1_correct",
    "zero_shot_transfer",
]
