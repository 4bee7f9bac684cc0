"""Image classification datasets that need no download: scikit-learn's digits, and synthetic images.

Each builder returns a :class:`DatasetSplit`: the train and test ``TensorDataset`` (float32 images of
shape ``(channels, image_size, image_size)``, int64 labels) plus what a model needs to know about
them. A split unpacks like a pair, so ``train, test = digits()`` works too.

``build_dataset`` also takes a user's own dataset as ``"package.module:function"``.

Example:
    >>> split = digits(image_size=32, channels=3)
    >>> len(split.train), len(split.test), split.num_classes
    (1437, 360, 10)
    >>> images, labels = split.train.tensors
    >>> images.shape, images.dtype, labels.dtype
    (torch.Size([1437, 3, 32, 32]), torch.float32, torch.int64)
    >>> train, test = synthetic(num_samples=100, image_size=16, channels=1, num_classes=4)
    >>> train[0][0].shape
    torch.Size([1, 16, 16])
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, TensorDataset

from cswap._userfn import call_accepting, is_spec, load_callable

__all__ = ["DATASET_NAMES", "DatasetSplit", "build_dataset", "digits", "synthetic"]

#: The names :func:`build_dataset` accepts besides ``"package.module:function"``.
DATASET_NAMES: tuple[str, ...] = ("digits", "synthetic")


@dataclass(frozen=True)
class DatasetSplit:
    """A train/test pair of image datasets and their shape.

    Iterating yields ``train`` then ``test``, so the split unpacks like a tuple.

    Args:
        train: the training set; items are ``(image, label)`` with image ``(channels, image_size, image_size)``.
        test: the held-out set, same layout.
        num_classes: labels lie in ``[0, num_classes)``.
        image_size: image height and width, in pixels.
        channels: image channels.
    """

    train: Dataset
    test: Dataset
    num_classes: int
    image_size: int
    channels: int

    def __post_init__(self) -> None:
        for field in ("num_classes", "image_size", "channels"):
            _check_positive_int(field, getattr(self, field))

    def __iter__(self) -> Iterator[Dataset]:
        return iter((self.train, self.test))


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_fraction(test_fraction: float, num_samples: int, num_classes: int) -> None:
    if not (isinstance(test_fraction, (int, float)) and 0.0 < test_fraction < 1.0):
        raise ValueError(f"test_fraction must lie strictly between 0 and 1 (e.g. 0.2), got {test_fraction!r}")
    # The same arithmetic as sklearn's train_test_split, so the message can name the fix.
    num_test = math.ceil(test_fraction * num_samples)
    num_train = num_samples - num_test
    if min(num_test, num_train) < num_classes:
        raise ValueError(
            f"test_fraction={test_fraction} splits {num_samples} samples into {num_train} train and {num_test} "
            f"test, but a stratified split needs at least {num_classes} (one per class) on each side; "
            "use more samples or a test_fraction nearer 0.5"
        )


def _split(labels: torch.Tensor, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded train/test indices."""
    indices = np.arange(len(labels))
    train_idx, test_idx = train_test_split(
        indices, test_size=test_fraction, stratify=labels.numpy(), random_state=seed, shuffle=True
    )
    return train_idx, test_idx


def digits(image_size: int = 32, channels: int = 3, test_fraction: float = 0.2, seed: int = 0) -> DatasetSplit:
    """scikit-learn's handwritten digits (1797 real 8x8 images, 10 classes), as CNN-ready tensors.

    Pixels are scaled to [0, 1], resized with bilinear interpolation to ``image_size`` (so values stay
    in [0, 1]), standardised with the training set's mean and standard deviation, and repeated to
    ``channels``. The split is stratified by class and fixed by ``seed``.

    Args:
        image_size: output height and width, in pixels.
        channels: output channels (the grey image repeated).
        test_fraction: share of the samples held out, stratified by class.
        seed: fixes the split.

    Example:
        >>> split = digits(image_size=8, channels=1, test_fraction=0.5)
        >>> len(split.train), len(split.test)
        (898, 899)
    """
    _check_positive_int("image_size", image_size)
    _check_positive_int("channels", channels)
    bunch = load_digits()
    labels = torch.from_numpy(bunch.target).to(torch.int64)
    num_classes = int(labels.max()) + 1
    _check_fraction(test_fraction, len(labels), num_classes)
    images = torch.from_numpy(bunch.images).to(torch.float32).div_(16.0).unsqueeze(1)
    if image_size != images.shape[-1]:
        images = F.interpolate(
            images, size=(image_size, image_size), mode="bilinear", align_corners=False, antialias=image_size < 8
        )
    train_idx, test_idx = _split(labels, test_fraction, seed)
    train_pixels = images[torch.from_numpy(train_idx)]
    images = (images - train_pixels.mean()) / train_pixels.std()
    images = images.expand(-1, channels, -1, -1).contiguous()
    return _make_split(images, labels, train_idx, test_idx, num_classes)


def synthetic(
    num_samples: int = 512,
    image_size: int = 32,
    channels: int = 3,
    num_classes: int = 10,
    seed: int = 0,
    *,
    test_fraction: float = 0.2,
    noise_std: float = 1.0,
) -> DatasetSplit:
    """Random images whose class is learnable: a class-dependent smooth pattern plus Gaussian noise.

    Each class has a prototype drawn from a standard normal at 4x4 (or ``image_size`` if smaller) and
    resized bilinearly to ``image_size``; a sample is its class's prototype plus noise of standard
    deviation ``noise_std``. Classes are balanced (``num_samples // num_classes`` or one more each)
    and the split is stratified; everything is fixed by ``seed``.

    Args:
        num_samples: total samples, train and test together.
        image_size: height and width, in pixels.
        channels: image channels.
        num_classes: number of classes.
        seed: fixes prototypes, noise, labels and split.
        test_fraction: share of the samples held out, stratified by class.
        noise_std: per-pixel noise; larger makes the task harder.

    Example:
        >>> split = synthetic(num_samples=64, image_size=8, channels=2, num_classes=4)
        >>> split.train.tensors[0].shape
        torch.Size([51, 2, 8, 8])
    """
    for name, value in (
        ("num_samples", num_samples),
        ("image_size", image_size),
        ("channels", channels),
        ("num_classes", num_classes),
    ):
        _check_positive_int(name, value)
    if not (isinstance(noise_std, (int, float)) and math.isfinite(noise_std) and noise_std >= 0):
        raise ValueError(f"noise_std must be a finite float >= 0, got {noise_std!r}")
    _check_fraction(test_fraction, num_samples, num_classes)
    generator = torch.Generator().manual_seed(seed)
    coarse = min(4, image_size)
    prototypes = torch.randn(num_classes, channels, coarse, coarse, generator=generator)
    if coarse != image_size:
        prototypes = F.interpolate(prototypes, size=(image_size, image_size), mode="bilinear", align_corners=False)
    labels = (torch.arange(num_samples) % num_classes)[torch.randperm(num_samples, generator=generator)]
    noise = torch.randn(num_samples, channels, image_size, image_size, generator=generator)
    images = prototypes[labels] + noise_std * noise
    train_idx, test_idx = _split(labels, test_fraction, seed)
    return _make_split(images, labels, train_idx, test_idx, num_classes)


def _make_split(
    images: torch.Tensor, labels: torch.Tensor, train_idx: np.ndarray, test_idx: np.ndarray, num_classes: int
) -> DatasetSplit:
    train_idx_t, test_idx_t = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    return DatasetSplit(
        train=TensorDataset(images[train_idx_t], labels[train_idx_t]),
        test=TensorDataset(images[test_idx_t], labels[test_idx_t]),
        num_classes=num_classes,
        image_size=images.shape[-1],
        channels=images.shape[1],
    )


_BUILTINS: Mapping[str, Any] = MappingProxyType({"digits": digits, "synthetic": synthetic})


def _labels(dataset: Dataset) -> torch.Tensor:
    """All labels of ``dataset``, read cheaply where the dataset exposes them."""
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1]
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return torch.as_tensor(targets)
    return torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))])  # type: ignore[arg-type]


def _infer_split(spec: str, train: Dataset, test: Dataset) -> DatasetSplit:
    """Describe a user's ``(train, test)`` pair from its first image and its labels."""
    image = train[0][0]
    if not (isinstance(image, torch.Tensor) and image.dim() == 3 and image.shape[1] == image.shape[2]):
        shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise ValueError(
            f"dataset {spec!r}: expected square images as (channels, size, size) tensors, got {shape}; "
            "return a cswap.training.data.DatasetSplit to describe other data"
        )
    labels = torch.cat([_labels(train).reshape(-1), _labels(test).reshape(-1)])
    if labels.numel() == 0 or labels.is_floating_point() or int(labels.min()) < 0:
        raise ValueError(f"dataset {spec!r}: labels must be non-negative class indices")
    return DatasetSplit(
        train=train,
        test=test,
        num_classes=int(labels.max()) + 1,
        image_size=int(image.shape[-1]),
        channels=int(image.shape[0]),
    )


def build_dataset(name: str, **kwargs: Any) -> DatasetSplit:
    """Build a dataset by name.

    Args:
        name: ``"digits"``, ``"synthetic"``, or ``"package.module:function"`` for a user's own builder,
            called with those of ``kwargs`` it accepts; it returns a :class:`DatasetSplit` or a
            ``(train, test)`` pair of datasets of ``(image, label)`` items, described from the first
            image and the labels.
        **kwargs: the builder's arguments, e.g. ``image_size``, ``channels``, ``seed``.

    Raises:
        ValueError: unknown name (the message lists the valid ones), an argument the builder does
            not take, or a spec whose import fails.
        TypeError: a user's builder that returns something else.

    Example:
        >>> build_dataset("synthetic", num_samples=40, image_size=8, num_classes=2).num_classes
        2
    """
    if not isinstance(name, str):
        raise ValueError(f"dataset name must be a str, got {type(name).__name__}")
    if is_spec(name):
        result = call_accepting(load_callable(name, what="dataset"), kwargs, {}, what=f"dataset {name!r}")
        if isinstance(result, DatasetSplit):
            return result
        if isinstance(result, (tuple, list)) and len(result) == 2 and all(isinstance(d, Dataset) for d in result):
            return _infer_split(name, result[0], result[1])
        raise TypeError(
            f"dataset {name!r} returned a {type(result).__name__}; it must return a cswap.training.data.DatasetSplit "
            "or a (train, test) pair of torch Datasets"
        )
    builder = _BUILTINS.get(name)
    if builder is None:
        raise ValueError(
            f"unknown dataset {name!r}: choose one of {', '.join(DATASET_NAMES)}, "
            "or give your own as 'package.module:function'"
        )
    accepted = tuple(inspect.signature(builder).parameters)
    unexpected = sorted(set(kwargs) - set(accepted))
    if unexpected:
        raise ValueError(
            f"dataset {name!r} does not take {', '.join(map(repr, unexpected))}; it takes {', '.join(accepted)}"
        )
    return builder(**kwargs)
