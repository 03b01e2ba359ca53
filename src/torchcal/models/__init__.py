"""torchcal.models: the papers' CIFAR / Tiny-ImageNet / ImageNet architectures and small nets.

A registry in the style of timm: :func:`create_model` builds a model by name,
:func:`list_models` lists the names.  Every model has ``forward(x) -> logits``,
``forward_features(x) -> (N, num_features)`` (the pre-logit embedding), ``.num_features`` and
``.fc`` (the final ``nn.Linear``), with ``forward(x) == fc(forward_features(x))``.
The CIFAR nets keep the module names of the papers' published code, so their checkpoints load
after :func:`adapt_state_dict` (``linear`` -> ``fc``, ``module.`` prefix stripped).

==================  ==========================================================  ==============
name                architecture                                                params (C=10)
==================  ==========================================================  ==============
resnet50            CIFAR ResNet-50 (bottleneck [3,4,6,3], 3x3 stem, no pool)     23,520,842
resnet110           the papers' "ResNet-110" (bottleneck [3,4,26,3])              45,864,522
wrn26_10            Wide-ResNet-26-10 (post-activation, no dropout)               36,481,434
densenet121         DenseNet-121 for CIFAR (growth 32, compression 0.5)            6,956,298
resnet50_tiny       Tiny-ImageNet ResNet-50 (AdaptiveAvgPool2d(2), 8192 -> C)     25,138,952 (C=200)
imagenet_resnet50   standard ImageNet ResNet-50                                   25,557,032 (C=1000)
resnet20            small CIFAR ResNet-20 (basic blocks 16/32/64)                    272,474
small_cnn           3-block CNN for any image size                                   94,762
mlp                 64-256-256-C MLP (the digits benchmark)                           85,002
mnist1d_cnn         MNIST-1D paper's 1-D CNN (3 convs of width 64, stride 2, fc)      28,298
==================  ==========================================================  ==============
"""

from __future__ import annotations

from . import densenet, mnist1d, resnet, small, wide_resnet  # noqa: F401  (fill the registry)
from ._registry import MODELS, adapt_state_dict, create_model, list_models, register_model
from .densenet import DenseNet
from .mnist1d import MNIST1DCNN
from .resnet import BasicBlock, Bottleneck, CifarResNet, ImageNetResNet
from .small import MLP, SmallCNN
from .wide_resnet import WideResNet

__all__ = [
    "create_model",
    "list_models",
    "register_model",
    "MODELS",
    "adapt_state_dict",
    "CifarResNet",
    "ImageNetResNet",
    "BasicBlock",
    "Bottleneck",
    "WideResNet",
    "DenseNet",
    "MLP",
    "SmallCNN",
    "MNIST1DCNN",
    "count_parameters",
]


def count_parameters(model) -> int:
    """Number of parameters of ``model`` (trainable or not).

    >>> count_parameters(create_model("mlp", 10))
    85002
    """
    return sum(p.numel() for p in model.parameters())
