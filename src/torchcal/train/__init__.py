"""Training harness: configs, the papers' recipes, the trainer, checkpoints and evaluation.

Modules: :mod:`~torchcal.train.config` and :mod:`~torchcal.train.recipes` (what to train),
:mod:`~torchcal.train.trainer` (``train``: one run), :mod:`~torchcal.train.packs` (packs
formed once, ``form_packs``, and trained by one sequence, ``train_pack``; ``train_packed``:
several runs as packed models, :mod:`~torchcal.train.packed`), both trained by the one engine
(:mod:`~torchcal.train.engine`, whose steps take a stack of M runs; :mod:`~torchcal.train.run`
builds and resumes each run, :mod:`~torchcal.train.stacks` holds the networks),
:mod:`~torchcal.train.build` (data and model from a config, a trained model from a checkpoint),
:mod:`~torchcal.train.device`, :mod:`~torchcal.train.inference` (``predict_logits``),
:mod:`~torchcal.train.evaluation` (``evaluate_checkpoint``), :mod:`~torchcal.train.checkpoint`,
:mod:`~torchcal.train.distributed` and :mod:`~torchcal.train.tracking`.  The run directory's
layout belongs to :mod:`torchcal.run_dir`.

>>> from torchcal.train import get_recipe
>>> cfg = get_recipe("digits-mlp")
>>> cfg.model, cfg.epochs, cfg.batch_size, cfg.lr
('mlp', 100, 64, 0.05)
"""

from .build import build_data, build_model, load_model_from_run
from .checkpoint import load_checkpoint, save_checkpoint
from .config import JointHeadConfig, MultitaskConfig, TrainConfig
from .evaluation import evaluate_checkpoint
from .inference import predict_logits
from .packs import Pack, RunOutcome, form_packs, train_pack, train_packed
from .recipes import get_recipe, list_recipes, register_recipe
from .run import build_loss
from .tracking import TensorBoardLogger
from .trainer import train

__all__ = [
    "TrainConfig",
    "JointHeadConfig",
    "MultitaskConfig",
    "get_recipe",
    "list_recipes",
    "register_recipe",
    "train",
    "train_packed",
    "form_packs",
    "train_pack",
    "Pack",
    "RunOutcome",
    "build_loss",
    "build_data",
    "build_model",
    "predict_logits",
    "evaluate_checkpoint",
    "load_model_from_run",
    "save_checkpoint",
    "load_checkpoint",
    "TensorBoardLogger",
]
