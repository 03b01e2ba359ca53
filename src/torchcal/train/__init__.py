"""Training harness: configs, the papers' recipes, the trainer, checkpoints and evaluation.

>>> from torchcal.train import get_recipe
>>> cfg = get_recipe("digits-mlp")
>>> cfg.model, cfg.epochs, cfg.batch_size, cfg.lr
('mlp', 100, 64, 0.05)
"""

from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig
from .predict import (
    build_data,
    build_model,
    evaluate_run,
    load_model_from_run,
    predict_logits,
)
from .recipes import get_recipe, list_recipes, register_recipe
from .tracking import TensorBoardLogger
from .trainer import build_loss, train

__all__ = [
    "TrainConfig",
    "get_recipe",
    "list_recipes",
    "register_recipe",
    "train",
    "build_loss",
    "build_data",
    "build_model",
    "predict_logits",
    "evaluate_run",
    "load_model_from_run",
    "save_checkpoint",
    "load_checkpoint",
    "TensorBoardLogger",
]
