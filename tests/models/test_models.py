"""cswap.models: exact architectures (parameter counts), shapes at 32 and 224, gradients, errors, user specs."""

from __future__ import annotations

import math
import textwrap
import warnings

import pytest
import torch
from torch import nn

from cswap import models
from cswap.models.googlenet import INCEPTION_SETTING
from cswap.models.mobilenet import make_divisible

#: torchvision's published parameter counts (``weights.meta["num_params"]``), GoogLeNet without aux heads.
PUBLISHED_PARAMS = {
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "mobilenet_v2": 3_504_872,
    "squeezenet1_1": 1_235_496,
    "googlenet": 6_624_904,
}

#: Side of the feature map entering the global pool (the output stride of each architecture).
POOL_INPUT_SIDE = {
    224: {"alexnet": 6, "vgg11": 7, "vgg16": 7, "vgg19": 7, "resnet18": 7, "resnet50": 7,
          "mobilenet_v2": 7, "squeezenet1_1": 13, "googlenet": 7},
    32: dict.fromkeys(PUBLISHED_PARAMS, 1),
}

#: Channels entering the classifier at width_mult=1 (SqueezeNet has no fully connected layer).
FEATURE_CHANNELS = {"alexnet": 256, "vgg11": 512, "vgg16": 512, "vgg19": 512, "resnet18": 512,
                    "resnet50": 2048, "mobilenet_v2": 1280, "googlenet": 1024}

#: Side of the adaptive pool's output, whatever the input size.
CLASSIFIER_POOL_SIDE = {"alexnet": 6, "vgg11": 7, "vgg16": 7, "vgg19": 7}


@pytest.fixture(autouse=True)
def _one_thread():
    # These tensors are tiny: one thread is faster than waking an OpenMP team, most of all on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _global_pool(model: nn.Module) -> nn.AdaptiveAvgPool2d:
    return [m for m in model.modules() if isinstance(m, nn.AdaptiveAvgPool2d)][-1]


def test_registry_lists_every_model():
    assert set(models.MODEL_NAMES) == set(PUBLISHED_PARAMS)
    assert tuple(info.name for info in models.describe()) == models.MODEL_NAMES
    assert all(models.input_size(name) == 224 for name in models.MODEL_NAMES)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_count_matches_published_architecture(name):
    count = models.count_parameters(name)
    assert count == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)
    assert count == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("name", ["alexnet", "resnet50", "mobilenet_v2", "googlenet"])
def test_count_on_meta_equals_count_of_real_model(name):
    model = models.build(name, num_classes=17, width_mult=0.25)
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert models.count_parameters(name, num_classes=17, width_mult=0.25) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(FEATURE_CHANNELS))
def test_classifier_input_width(name):
    with torch.device("meta"):
        model = models.build(name, num_classes=3)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears[0].in_features == FEATURE_CHANNELS[name] * CLASSIFIER_POOL_SIDE.get(name, 1) ** 2
    assert linears[-1].out_features == 3


def _grads(model: nn.Module, x: torch.Tensor, hooked: bool) -> tuple[torch.Size, dict[str, torch.Tensor]]:
    """Output shape, parameter and input gradients of one forward+backward, optionally with saved
    tensors packed as copies."""
    torch.manual_seed(1)  # same dropout masks in both runs
    x = x.clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    if hooked:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            out = model(x)
    else:
        out = model(x)
    out.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grads["input"] = x.grad.clone()
    return out.shape, grads


@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_forward_backward_small(name):
    torch.manual_seed(0)
    model = models.build(name, num_classes=7, width_mult=0.125).train()
    x = torch.randn(2, 3, 32, 32)
    shape, plain = _grads(model, x, hooked=False)
    assert shape == (2, 7)
    assert all(torch.isfinite(g).all() for g in plain.values())
    assert plain["input"].abs().sum() > 0
    # Packing copies hides any in-place write to a saved tensor from autograd's version check;
    # equal gradients show that the models never make such writes.
    _, hooked = _grads(model, x, hooked=True)
    assert plain.keys() == hooked.keys()
    for key in plain:
        torch.testing.assert_close(hooked[key], plain[key], rtol=0, atol=0, msg=f"{name}: {key}")


@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_relus_are_out_of_place(name):
    with torch.device("meta"):
        model = models.build(name, width_mult=0.125)
    relus = [m for m in model.modules() if isinstance(m, (nn.ReLU, nn.ReLU6))]
    assert relus and not any(m.inplace for m in relus)


@pytest.mark.parametrize("size", [32, 224])
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_output_shape_and_output_stride(name, size):
    torch.manual_seed(0)
    model = models.build(name, num_classes=5, width_mult=0.125).eval()
    seen: list[torch.Size] = []
    _global_pool(model).register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    with torch.no_grad():
        out = model(torch.randn(1, 3, size, size))
    assert out.shape == (1, 5)
    assert seen[0][-2:] == (POOL_INPUT_SIDE[size][name],) * 2


def test_width_mult_scales_channels_and_hidden_widths():
    with torch.device("meta"):
        model = models.build("vgg16", num_classes=10, width_mult=0.5)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [c.out_channels for c in convs] == [32, 32, 64, 64, 128, 128, 128, 256, 256, 256, 256, 256, 256]
    assert [(layer.in_features, layer.out_features) for layer in linears] == [(256 * 49, 2048), (2048, 2048), (2048, 10)]


@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_parameters_shrink_with_width(name):
    counts = [models.count_parameters(name, num_classes=10, width_mult=w) for w in (1.0, 0.5, 0.25)]
    assert counts[0] > counts[1] > counts[2]


@pytest.mark.parametrize("name", [n for n in models.MODEL_NAMES if n != "mobilenet_v2"])
def test_tiny_width_keeps_at_least_one_channel(name):
    torch.manual_seed(0)
    model = models.build(name, num_classes=4, width_mult=0.001).eval()
    assert min(m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)) == 1
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 4)


@pytest.mark.parametrize("width_mult", [0.01, 0.125, 0.3, 1.0, 1.4])
def test_mobilenet_channels_are_multiples_of_eight(width_mult):
    with torch.device("meta"):
        model = models.build("mobilenet_v2", width_mult=width_mult)
    channels = [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert min(channels) >= 8
    assert all(c % 8 == 0 for c in channels)
    assert model.last_channel == (1280 if width_mult <= 1.0 else 1792)


@pytest.mark.parametrize(("value", "expected"), [(4, 8), (9.6, 16), (17, 16), (19, 24), (32, 32), (1792, 1792)])
def test_make_divisible_rounds_to_eight_without_losing_ten_percent(value, expected):
    assert make_divisible(value) == expected


def test_vgg_batch_norm_option():
    plain = models.build("vgg16", width_mult=0.125)
    with_bn = models.build("vgg16", width_mult=0.125, batch_norm=True)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    assert sum(isinstance(m, nn.BatchNorm2d) for m in with_bn.modules()) == 13


def test_googlenet_paper_branch_uses_5x5():
    extra = sum(s[3] * s[4] * (25 - 9) for s in INCEPTION_SETTING if s[0] != "M")
    assert models.count_parameters("googlenet", branch3_kernel_size=5) == PUBLISHED_PARAMS["googlenet"] + extra
    with pytest.raises(ValueError, match="branch3_kernel_size must be 3"):
        models.build("googlenet", branch3_kernel_size=7)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown model 'resnet19'.*resnet18.*googlenet"):
        models.build("resnet19")
    with pytest.raises(ValueError, match=r"unknown model 'lenet'.*vgg16"):
        models.input_size("lenet")


def test_unknown_option_is_named():
    with pytest.raises(ValueError, match=r"model 'resnet18' does not take 'batch_norm'.*zero_init_residual"):
        models.build("resnet18", batch_norm=True)


@pytest.mark.parametrize("width_mult", [0, -0.5, math.nan, math.inf, "1"])
def test_bad_width_mult(width_mult):
    with pytest.raises(ValueError, match="width_mult must be a positive"):
        models.build("alexnet", width_mult=width_mult)


@pytest.mark.parametrize("num_classes", [0, -3, 2.0, True])
def test_bad_num_classes(num_classes):
    with pytest.raises(ValueError, match="num_classes must be a positive int"):
        models.build("squeezenet1_1", num_classes=num_classes)


USER_MODULE = "cswap_test_user_models"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / f"{USER_MODULE}.py").write_text(textwrap.dedent("""
        from torch import nn

        def tiny(num_classes, hidden=4):
            return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

        def everything(**kwargs):
            model = nn.Linear(1, kwargs["num_classes"])
            model.received = kwargs
            return model

        def not_a_model(num_classes):
            return num_classes

        class Factory:
            @staticmethod
            def create(width_mult):
                return nn.Linear(2, max(1, int(8 * width_mult)))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return USER_MODULE


def test_user_spec_gets_the_arguments_it_accepts(user_module):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = models.build(f"{user_module}:tiny", num_classes=6, hidden=3)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 6)
    assert model[1].out_features == 3
    received = models.build(f"{user_module}:everything", num_classes=2, width_mult=0.5, extra="x").received
    assert received == {"num_classes": 2, "width_mult": 0.5, "extra": "x"}
    assert models.build(f"{user_module}:Factory.create", width_mult=0.5).out_features == 4
    assert models.input_size(f"{user_module}:tiny") == 224


def test_user_spec_warns_about_dropped_arguments(user_module):
    with pytest.warns(UserWarning, match=r"does not accept width_mult; ignoring \(it accepts: hidden, num_classes\)"):
        models.build(f"{user_module}:tiny", num_classes=6, width_mult=0.25)


def test_user_spec_errors(user_module):
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_pkg_xyz.models'.*PYTHONPATH"):
        models.build("no_such_pkg_xyz.models:net")
    with pytest.raises(ValueError, match=rf"module '{user_module}' has no attribute 'missing'"):
        models.build(f"{user_module}:missing")
    with pytest.raises(TypeError, match=r"returned a int; it must return a torch.nn.Module"):
        models.build(f"{user_module}:not_a_model")
