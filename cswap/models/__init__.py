"""CNNs for training under cswap, in plain ``torch.nn`` (no torchvision).

Every model runs at ImageNet's 224x224 and at inputs as small as 32x32 (adaptive pooling keeps the
classifier's shape independent of the input), scales its channels with ``width_mult`` so tests can
build tiny variants, and uses out-of-place ReLUs so that every tensor autograd saves keeps its
version. At ``width_mult=1`` the parameter counts equal torchvision's published ones.

``build`` also takes a user's own model as ``"package.module:function"``.

Example:
    >>> import torch
    >>> from cswap import models
    >>> model = models.build("resnet18", num_classes=10, width_mult=0.25)
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    >>> models.count_parameters("resnet18")
    11689512
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from cswap._userfn import call_accepting, is_spec, load_callable
from cswap.models.alexnet import AlexNet, alexnet
from cswap.models.googlenet import GoogLeNet, googlenet
from cswap.models.mobilenet import MobileNetV2, mobilenet_v2
from cswap.models.resnet import ResNet, resnet18, resnet50
from cswap.models.squeezenet import SqueezeNet, squeezenet1_1
from cswap.models.vgg import VGG, vgg11, vgg16, vgg19

__all__ = [
    "MODELS",
    "MODEL_NAMES",
    "AlexNet",
    "GoogLeNet",
    "MobileNetV2",
    "ModelInfo",
    "ResNet",
    "SqueezeNet",
    "VGG",
    "alexnet",
    "build",
    "count_parameters",
    "describe",
    "googlenet",
    "input_size",
    "mobilenet_v2",
    "resnet18",
    "resnet50",
    "squeezenet1_1",
    "vgg11",
    "vgg16",
    "vgg19",
]


@dataclass(frozen=True)
class ModelInfo:
    """What the registry knows about a built-in model.

    Args:
        name: the name :func:`build` takes.
        family: the module it lives in (``vgg``, ``resnet``, ...).
        reference: the paper that defines it.
        input_size: the image side it was designed for, in pixels.
        builder: the function :func:`build` calls.
    """

    name: str
    family: str
    reference: str
    input_size: int
    builder: Callable[..., nn.Module]


_INFOS = (
    ModelInfo(
        "alexnet", "alexnet", "Krizhevsky et al., NeurIPS 2012; single-tower form of arXiv:1404.5997", 224, alexnet
    ),
    ModelInfo("vgg11", "vgg", "Simonyan & Zisserman, ICLR 2015, configuration A", 224, vgg11),
    ModelInfo("vgg16", "vgg", "Simonyan & Zisserman, ICLR 2015, configuration D", 224, vgg16),
    ModelInfo("vgg19", "vgg", "Simonyan & Zisserman, ICLR 2015, configuration E", 224, vgg19),
    ModelInfo("resnet18", "resnet", "He et al., CVPR 2016", 224, resnet18),
    ModelInfo("resnet50", "resnet", "He et al., CVPR 2016 (stride on the 3x3, v1.5)", 224, resnet50),
    ModelInfo("mobilenet_v2", "mobilenet", "Sandler et al., CVPR 2018", 224, mobilenet_v2),
    ModelInfo("squeezenet1_1", "squeezenet", "Iandola et al., arXiv:1602.07360, v1.1", 224, squeezenet1_1),
    ModelInfo(
        "googlenet", "googlenet", "Szegedy et al., CVPR 2015 (Inception v1, no auxiliary heads)", 224, googlenet
    ),
)

#: Built-in model name -> builder ``(num_classes, width_mult, **kwargs) -> nn.Module``.
MODELS: Mapping[str, Callable[..., nn.Module]] = MappingProxyType({info.name: info.builder for info in _INFOS})

#: The names :func:`build` accepts besides ``"package.module:function"``.
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)

_BUILD_DEFAULTS: Mapping[str, Any] = MappingProxyType({"num_classes": 1000, "width_mult": 1.0})


def _unknown(name: str) -> ValueError:
    return ValueError(
        f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}, "
        "or give your own as 'package.module:function'"
    )


def build(name: str, num_classes: int = 1000, width_mult: float = 1.0, **kwargs: Any) -> nn.Module:
    """Build a model by name, with fresh (untrained) weights.

    Args:
        name: one of :data:`MODEL_NAMES`, or ``"package.module:function"`` for a user's own builder,
            which is called with those of ``num_classes``, ``width_mult`` and ``kwargs`` it accepts
            (a warning names any non-default argument it does not accept).
        num_classes: outputs of the last layer.
        width_mult: scales the channel counts (and hidden classifier widths); 0.125-0.25 gives tiny
            models for tests. MobileNetV2 rounds its channels to multiples of 8, at least 8.
        **kwargs: family options, e.g. ``dropout``, ``batch_norm`` (VGG), ``zero_init_residual``
            (ResNet), ``branch3_kernel_size`` (GoogLeNet).

    Raises:
        ValueError: unknown name (the message lists the valid ones), an option the model does not
            take, a bad ``num_classes`` / ``width_mult``, or a spec whose import fails.
        TypeError: a user's builder that returns something other than an ``nn.Module``.

    Example:
        >>> build("vgg16", num_classes=10, width_mult=0.125).classifier[-1].out_features
        10
    """
    if not isinstance(name, str):
        raise ValueError(f"model name must be a str, got {type(name).__name__}")
    arguments = {"num_classes": num_classes, "width_mult": width_mult, **kwargs}
    if is_spec(name):
        model = call_accepting(load_callable(name, what="model"), arguments, _BUILD_DEFAULTS, what=f"model {name!r}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model {name!r} returned a {type(model).__name__}; it must return a torch.nn.Module")
        return model
    builder = MODELS.get(name)
    if builder is None:
        raise _unknown(name)
    accepted = tuple(inspect.signature(builder).parameters)
    unexpected = sorted(set(kwargs) - set(accepted))
    if unexpected:
        raise ValueError(
            f"model {name!r} does not take {', '.join(map(repr, unexpected))}; it takes {', '.join(accepted)}"
        )
    return builder(**arguments)


def count_parameters(name: str, num_classes: int = 1000, width_mult: float = 1.0, **kwargs: Any) -> int:
    """Number of parameters of ``build(name, ...)``, counted on the meta device (no memory, no forward).

    Example:
        >>> count_parameters("vgg16")
        138357544
    """
    with torch.device("meta"):
        model = build(name, num_classes=num_classes, width_mult=width_mult, **kwargs)
    return sum(p.numel() for p in model.parameters())


def input_size(name: str) -> int:
    """The image side, in pixels, a model was designed for (224 for every built-in model and for specs).

    Raises:
        ValueError: unknown name, listing the valid ones.
    """
    if isinstance(name, str) and is_spec(name):
        return 224
    for info in _INFOS:
        if info.name == name:
            return info.input_size
    raise _unknown(name)


def describe() -> tuple[ModelInfo, ...]:
    """The built-in models, in :data:`MODEL_NAMES` order."""
    return _INFOS
