"""cswap.training.data: digits and synthetic datasets (shapes, values, splits, determinism, learnability), build_dataset."""

from __future__ import annotations

import math
import textwrap
import warnings

import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from torch.utils.data import TensorDataset

from cswap.training import data
from cswap.training.data import DatasetSplit

NUM_DIGITS = 1797


def _flat(dataset: TensorDataset) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = dataset.tensors
    return images.reshape(len(images), -1), labels


def _linear_test_accuracy(split: DatasetSplit) -> float:
    x_train, y_train = _flat(split.train)
    x_test, y_test = _flat(split.test)
    model = LogisticRegression(max_iter=300).fit(x_train.numpy(), y_train.numpy())
    return float(model.score(x_test.numpy(), y_test.numpy()))


@pytest.mark.parametrize(("image_size", "channels"), [(32, 3), (8, 1), (20, 2), (4, 1)])
def test_digits_shapes_and_dtypes(image_size, channels):
    split = data.digits(image_size=image_size, channels=channels)
    assert (split.num_classes, split.image_size, split.channels) == (10, image_size, channels)
    for dataset in split:
        images, labels = dataset.tensors
        assert images.shape[1:] == (channels, image_size, image_size)
        assert images.dtype == torch.float32 and labels.dtype == torch.int64
        assert images.is_contiguous() and torch.isfinite(images).all()
        assert torch.equal(images, images[:, :1].expand_as(images))
    assert len(split.train) + len(split.test) == NUM_DIGITS


@pytest.mark.parametrize("image_size", [8, 32])
def test_digits_are_standardised_with_training_statistics(image_size):
    split = data.digits(image_size=image_size)
    train, test = split.train.tensors[0], split.test.tensors[0]
    assert train.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert train.std().item() == pytest.approx(1.0, abs=1e-5)
    assert abs(test.mean().item()) < 0.1 and test.std().item() == pytest.approx(1.0, abs=0.1)


def test_digits_at_8x8_are_the_real_images_scaled_to_unit_range():
    split = data.digits(image_size=8, channels=1)
    images = torch.cat([split.train.tensors[0], split.test.tensors[0]]).reshape(NUM_DIGITS, 64)
    levels = images.unique()
    step = (levels[1:] - levels[:-1]).min()
    # Raw pixels are integers 0..16 mapped affinely onto [0, 1] before standardising.
    assert ((levels.max() - levels.min()) / step).item() == pytest.approx(16.0, abs=1e-3)
    ints = ((images - levels.min()) / step).round().to(torch.int64)
    raw = torch.from_numpy(load_digits().data).to(torch.int64)
    assert sorted(map(tuple, ints.tolist())) == sorted(map(tuple, raw.tolist()))


@pytest.mark.parametrize("test_fraction", [0.1, 0.2, 0.5])
def test_digits_split_sizes_and_stratification(test_fraction):
    split = data.digits(image_size=8, channels=1, test_fraction=test_fraction)
    expected_test = math.ceil(test_fraction * NUM_DIGITS)
    assert len(split.test) == expected_test and len(split.train) == NUM_DIGITS - expected_test
    all_counts = torch.bincount(torch.from_numpy(load_digits().target), minlength=10)
    test_counts = torch.bincount(split.test.tensors[1], minlength=10)
    assert (test_counts - test_fraction * all_counts).abs().max().item() <= 1.0


def test_digits_determinism_by_seed():
    a, b, c = (data.digits(image_size=8, seed=s) for s in (3, 3, 4))
    for x, y in zip(a.train.tensors + a.test.tensors, b.train.tensors + b.test.tensors):
        assert torch.equal(x, y)
    assert not torch.equal(a.test.tensors[1], c.test.tensors[1])


def test_digits_labels_match_images():
    assert _linear_test_accuracy(data.digits(image_size=8, channels=1)) > 0.9


def test_split_unpacks_like_a_pair():
    split = data.synthetic(num_samples=40, image_size=4, num_classes=2)
    train, test = split
    assert train is split.train and test is split.test


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"test_fraction": 0.0}, "test_fraction must lie strictly between 0 and 1"),
        ({"test_fraction": 1.5}, "test_fraction must lie strictly between 0 and 1"),
        ({"test_fraction": 0.001}, r"2 test, but a stratified split needs at least 10"),
        ({"image_size": 0}, "image_size must be a positive int"),
        ({"channels": 2.5}, "channels must be a positive int"),
    ],
)
def test_digits_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.digits(**kwargs)


@pytest.mark.parametrize(
    ("num_samples", "image_size", "channels", "num_classes"),
    [(512, 32, 3, 10), (100, 1, 1, 2), (63, 7, 2, 3), (40, 64, 1, 4)],
)
def test_synthetic_shapes_and_balance(num_samples, image_size, channels, num_classes):
    split = data.synthetic(num_samples, image_size, channels, num_classes)
    assert (split.num_classes, split.image_size, split.channels) == (num_classes, image_size, channels)
    images = torch.cat([split.train.tensors[0], split.test.tensors[0]])
    labels = torch.cat([split.train.tensors[1], split.test.tensors[1]])
    assert images.shape == (num_samples, channels, image_size, image_size)
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    counts = torch.bincount(labels, minlength=num_classes)
    assert counts.max() - counts.min() <= 1
    assert len(split.test) == math.ceil(0.2 * num_samples)


def test_synthetic_is_learnable_by_a_linear_model():
    split = data.synthetic()
    assert _linear_test_accuracy(split) > 0.8  # chance is 0.1


def test_synthetic_without_noise_is_one_pattern_per_class():
    split = data.synthetic(num_samples=60, image_size=8, num_classes=3, noise_std=0.0)
    images, labels = split.train.tensors
    for label in range(3):
        members = images[labels == label]
        assert torch.equal(members, members[:1].expand_as(members))
    assert not torch.equal(images[labels == 0][0], images[labels == 1][0])


def test_synthetic_determinism_by_seed():
    a, b, c = (data.synthetic(num_samples=50, image_size=8, seed=s) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.train.tensors + a.test.tensors, b.train.tensors + b.test.tensors))
    assert not torch.equal(a.train.tensors[0], c.train.tensors[0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_classes": 0}, "num_classes must be a positive int"),
        ({"noise_std": -1.0}, "noise_std must be a finite float >= 0"),
        ({"num_samples": 20, "num_classes": 10}, r"16 train and 4 test.*at least 10"),
    ],
)
def test_synthetic_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.synthetic(**kwargs)


@pytest.mark.parametrize("name", data.DATASET_NAMES)
def test_build_dataset_by_name(name):
    kwargs = {"image_size": 8, "channels": 1, "seed": 5}
    built = data.build_dataset(name, **kwargs)
    direct = getattr(data, name)(**kwargs)
    assert built.num_classes == direct.num_classes
    assert all(torch.equal(x, y) for x, y in zip(built.train.tensors, direct.train.tensors))


def test_build_dataset_errors():
    with pytest.raises(ValueError, match=r"unknown dataset 'cifar10': choose one of digits, synthetic"):
        data.build_dataset("cifar10")
    with pytest.raises(ValueError, match=r"dataset 'digits' does not take 'num_samples'"):
        data.build_dataset("digits", num_samples=10)


USER_MODULE = "cswap_test_user_datasets"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / f"{USER_MODULE}.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import Dataset, TensorDataset
        from cswap.training.data import synthetic

        class _ListDataset(Dataset):
            def __init__(self, items):
                self.items = items

            def __len__(self):
                return len(self.items)

            def __getitem__(self, index):
                return self.items[index]

        def as_split(seed=0):
            return synthetic(num_samples=30, image_size=4, num_classes=3, seed=seed)

        def as_pair(image_size):
            x = torch.zeros(6, 2, image_size, image_size)
            return TensorDataset(x, torch.tensor([0, 4, 1, 1, 0, 2])), TensorDataset(x[:2], torch.tensor([5, 0]))

        def generic_pair():
            items = [(torch.ones(1, 3, 3), label) for label in (0, 1, 2)]
            return _ListDataset(items), _ListDataset(items[:1])

        def non_square():
            x = torch.zeros(2, 1, 3, 5)
            return TensorDataset(x, torch.tensor([0, 1])), TensorDataset(x, torch.tensor([0, 1]))

        def wrong_type():
            return [1, 2, 3]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return USER_MODULE


def test_user_dataset_returning_a_split(user_module):
    with pytest.warns(UserWarning, match=r"does not accept image_size; ignoring \(it accepts: seed\)"):
        split = data.build_dataset(f"{user_module}:as_split", seed=7, image_size=32)
    assert torch.equal(split.train.tensors[0], data.synthetic(30, 4, num_classes=3, seed=7).train.tensors[0])


def test_user_dataset_returning_a_pair_is_described(user_module):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split = data.build_dataset(f"{user_module}:as_pair", image_size=5)
    assert (split.num_classes, split.image_size, split.channels) == (6, 5, 2)
    generic = data.build_dataset(f"{user_module}:generic_pair")
    assert (generic.num_classes, generic.image_size, generic.channels) == (3, 3, 1)


def test_user_dataset_errors(user_module):
    with pytest.raises(ValueError, match=r"expected square images.*got \(1, 3, 5\).*DatasetSplit"):
        data.build_dataset(f"{user_module}:non_square")
    with pytest.raises(TypeError, match=r"returned a list; it must return a cswap.training.data.DatasetSplit"):
        data.build_dataset(f"{user_module}:wrong_type")
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_pkg_xyz'"):
        data.build_dataset("no_such_pkg_xyz:load")
