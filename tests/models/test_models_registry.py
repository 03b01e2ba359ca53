"""Model registry, shapes, the forward == fc(forward_features) contract and exact parameter
counts (REFERENCE §6), counted on the meta device so no big tensor is allocated."""

from __future__ import annotations

import pytest
import torch

from torchcal.models import count_parameters, create_model, list_models


@pytest.fixture(autouse=True)
def _one_thread():
    # Small convolutions: one thread is faster than several on a shared 2-core machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


ALL = ["densenet121", "imagenet_resnet50", "mlp", "mnist1d_cnn", "resnet110", "resnet20",
       "resnet50", "resnet50_tiny", "small_cnn", "wrn26_10"]

# (name, num_classes, parameters): REFERENCE §6 and the standard ImageNet ResNet-50.
COUNTS = [
    ("resnet50", 10, 23_520_842),
    ("resnet50", 100, 23_705_252),
    ("resnet110", 10, 45_864_522),
    ("resnet110", 100, 46_048_932),
    ("wrn26_10", 10, 36_481_434),
    ("wrn26_10", 100, 36_539_124),
    ("densenet121", 10, 6_956_298),
    ("densenet121", 100, 7_048_548),
    ("resnet50_tiny", 200, 25_138_952),
    ("imagenet_resnet50", 1000, 25_557_032),
    ("mlp", 10, 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10),
]


def test_list_models():
    assert list_models() == ALL
    assert list_models("wrn*") == ["wrn26_10"]


@pytest.mark.parametrize("name,num_classes,expected", COUNTS)
def test_parameter_counts(name, num_classes, expected):
    with torch.device("meta"):
        model = create_model(name, num_classes)
    assert count_parameters(model) == expected
    assert model.fc.out_features == num_classes
    assert model.fc.in_features == model.num_features


def test_unknown_model_lists_valid_names():
    with pytest.raises(ValueError, match="Unknown model 'resnet51'.*resnet50"):
        create_model("resnet51", 10)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10"])
def test_bad_num_classes(bad):
    with pytest.raises(ValueError, match="`num_classes`"):
        create_model("mlp", bad)


# Output shapes of the registered (large) models, on the meta device: shapes propagate through
# every layer without allocating or computing anything.
META_SHAPES = [
    ("resnet50", 10, (2, 3, 32, 32), 2048),
    ("resnet110", 100, (2, 3, 32, 32), 2048),
    ("wrn26_10", 10, (2, 3, 32, 32), 640),
    ("densenet121", 100, (2, 3, 32, 32), 1024),
    ("resnet50_tiny", 200, (2, 3, 64, 64), 8192),
    ("imagenet_resnet50", 1000, (2, 3, 224, 224), 2048),
]


@pytest.mark.parametrize("name,num_classes,shape,num_features", META_SHAPES)
def test_output_shapes_meta(name, num_classes, shape, num_features):
    with torch.device("meta"):
        model = create_model(name, num_classes)
        x = torch.empty(shape)
        assert model(x).shape == (shape[0], num_classes)
        assert model.forward_features(x).shape == (shape[0], num_features)
    assert model.num_features == num_features


def _small_variants():
    from torchcal.models import Bottleneck, CifarResNet, DenseNet, ImageNetResNet, WideResNet

    return [
        ("resnet20", lambda: create_model("resnet20", 10), (2, 3, 32, 32), 64),
        ("small_cnn", lambda: create_model("small_cnn", 7), (2, 3, 32, 32), 128),
        ("mlp", lambda: create_model("mlp", 10), (3, 64), 256),
        ("mnist1d_cnn", lambda: create_model("mnist1d_cnn", 10), (3, 40), 320),
        ("bottleneck", lambda: CifarResNet(Bottleneck, [1, 1, 1, 1], 10, widths=(8, 8, 8, 8), pool_size=2),
         (2, 3, 32, 32), 128),
        ("wrn", lambda: WideResNet(8, 1, 10), (2, 3, 32, 32), 64),
        ("densenet", lambda: DenseNet((2, 2, 2, 2), 8, 0.5, 10), (2, 3, 32, 32), 32),
        ("imagenet", lambda: ImageNetResNet((1, 1, 1, 1), 5), (1, 3, 64, 64), 2048),
    ]


@pytest.mark.parametrize("case", _small_variants(), ids=lambda c: c[0])
def test_forward_equals_fc_of_features(case):
    _, build, shape, num_features = case
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn(shape)
    with torch.no_grad():
        out = model(x)
        feats = model.forward_features(x)
    assert feats.shape == (shape[0], num_features) and model.num_features == num_features
    assert out.shape == (shape[0], model.fc.out_features)
    torch.testing.assert_close(model.fc(feats), out)


def test_wrn_depth_validation():
    from torchcal.models import WideResNet

    with pytest.raises(ValueError, match="`depth`"):
        WideResNet(depth=27)


def test_resnet110_depth():
    # [3, 4, 26, 3] bottleneck blocks, each 3 convolutions: 3 * 36 + stem + fc = 110 layers.
    with torch.device("meta"):
        m = create_model("resnet110", 10)
    n_blocks = [len(getattr(m, f"layer{i}")) for i in range(1, 5)]
    assert n_blocks == [3, 4, 26, 3]
    convs = [mod for name, mod in m.named_modules()
             if isinstance(mod, torch.nn.Conv2d) and "shortcut" not in name]
    assert len(convs) + 1 == 110


def test_tiny_resnet_pool():
    with torch.device("meta"):
        m = create_model("resnet50_tiny", 200)
    assert m.fc.in_features == 8192
    assert m.pool.output_size == 2


def test_mlp_flattens_images_and_small_cnn_digits():
    torch.manual_seed(0)
    m = create_model("mlp", 10).eval()
    x = torch.randn(4, 64)
    torch.testing.assert_close(m(x.reshape(4, 1, 8, 8)), m(x))
    cnn = create_model("small_cnn", 10, in_channels=1, in_features=64).eval()
    torch.testing.assert_close(cnn(x), cnn(x.reshape(4, 1, 8, 8)))
    with pytest.raises(ValueError, match="`in_features`"):
        create_model("small_cnn", 10, in_channels=1, in_features=63)


def test_models_train_step_gradients_reach_every_parameter():
    torch.manual_seed(0)
    m = create_model("resnet20", 10)
    out = m(torch.randn(4, 3, 8, 8))
    torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 3])).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_imagenet_resnet_init_is_torchvisions():
    from torchcal.models import ImageNetResNet

    torch.manual_seed(0)
    m = ImageNetResNet((1, 1, 1, 1), 10, zero_init_residual=True)
    w = m.layer2[0].conv2.weight  # 128 x 128 x 3 x 3: fan_out = 128 * 9
    assert abs(w.std().item() - (2 / (128 * 9)) ** 0.5) < 0.002
    assert torch.all(m.bn1.weight == 1) and torch.all(m.bn1.bias == 0)
    assert torch.all(m.layer1[0].bn3.weight == 0)


@pytest.mark.parametrize("name,keys", [
    ("resnet50", ["conv1.weight", "bn1.running_mean", "layer1.0.shortcut.0.weight",
                  "layer1.0.shortcut.1.weight", "layer4.2.conv3.weight", "layer4.2.bn3.bias"]),
    ("densenet121", ["conv1.weight", "dense1.0.bn1.weight", "dense1.5.conv2.weight",
                     "trans1.bn.weight", "trans3.conv.weight", "dense4.15.conv2.weight", "bn.weight"]),
    ("wrn26_10", ["conv1.weight", "bn1.weight", "layer1.0.shortcut.0.weight", "layer3.3.conv2.weight"]),
])
def test_published_module_names_and_checkpoint_adapter(name, keys):
    from torchcal.models import adapt_state_dict

    with torch.device("meta"):
        model = create_model(name, 10)
    sd = model.state_dict()
    assert all(k in sd for k in keys)
    # A checkpoint saved by the published code under DataParallel: "module." + "linear".
    published = {"module." + k.replace("fc.", "linear.", 1): v for k, v in sd.items()}
    adapted = adapt_state_dict(published)
    assert list(adapted) == list(sd)
    with torch.device("meta"):
        fresh = create_model(name, 10)
    fresh.load_state_dict(adapted, strict=True, assign=True)


# ---- the MNIST-1D paper's 1-D CNN --------------------------------------------------------------
def _paper_convbase(state: dict, x: torch.Tensor) -> torch.Tensor:
    """The paper's ConvBase forward written from its definition: three stride-2 ReLU convolutions
    (kernel 5 then 3, 3; padding 1), flatten, linear (its weights named ``linear``)."""
    F = torch.nn.functional
    h = x.view(-1, 1, x.shape[-1])
    for name in ("conv1", "conv2", "conv3"):
        h = F.relu(F.conv1d(h, state[f"{name}.weight"], state[f"{name}.bias"], stride=2, padding=1))
    return F.linear(h.reshape(h.shape[0], -1), state["linear.weight"], state["linear.bias"])


@pytest.mark.parametrize("width,expected", [(25, 5_210), (64, 28_298), (8, 858)])
def test_mnist1d_cnn_parameters_and_shapes(width, expected):
    # conv1 1*w*5 + w, conv2 and conv3 w*w*3 + w, fc (5w)*10 + 10 on 40-sample signals
    assert expected == (5 * width + width) + 2 * (3 * width * width + width) + 5 * width * 10 + 10
    model = create_model("mnist1d_cnn", 10, width=width)
    assert count_parameters(model) == expected and model.num_features == 5 * width
    x = torch.randn(3, 40)
    assert model(x).shape == (3, 10) and model.forward_features(x).shape == (3, 5 * width)
    assert torch.equal(model(x), model(x.unsqueeze(1)))


def test_mnist1d_cnn_equals_the_papers_convbase():
    from torchcal.models import adapt_state_dict

    torch.manual_seed(0)
    w = 25
    paper = {"conv1.weight": torch.randn(w, 1, 5), "conv1.bias": torch.randn(w),
             "conv2.weight": torch.randn(w, w, 3) / 5, "conv2.bias": torch.randn(w),
             "conv3.weight": torch.randn(w, w, 3) / 5, "conv3.bias": torch.randn(w),
             "linear.weight": torch.randn(10, 5 * w) / 10, "linear.bias": torch.randn(10)}
    model = create_model("mnist1d_cnn", 10, width=w).eval()
    model.load_state_dict(adapt_state_dict(paper))
    x = torch.randn(6, 40)
    with torch.no_grad():
        torch.testing.assert_close(model(x), _paper_convbase(paper, x))
        torch.testing.assert_close(model.fc(model.forward_features(x)), model(x))


@pytest.mark.parametrize("kw,shape,match", [
    ({"width": 0}, None, "`width` to be a positive integer"),
    ({"in_length": 2}, None, "`in_length` of at least 3"),
    ({}, (2, 41), r"input of shape \(N, 40\) or \(N, 1, 40\), got \(2, 41\)"),
    ({}, (2, 2, 40), r"got \(2, 2, 40\)"),
])
def test_mnist1d_cnn_bad_arguments(kw, shape, match):
    with pytest.raises(ValueError, match=match):
        model = create_model("mnist1d_cnn", 10, **kw)
        model(torch.zeros(shape))
