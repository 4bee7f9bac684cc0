"""Runtime options: defaults from configs/default.yaml, overrides, and errors that name the problem."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

import cswap
from cswap.options import DEFAULTS_ENV, FILE_OPTIONS, POLICIES, RuntimeOptions, default_options_path, load_options
from cswap.training.config import TrainConfig

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


def test_defaults_come_from_the_shipped_yaml() -> None:
    assert default_options_path() == SHIPPED
    expected = yaml.safe_load(SHIPPED.read_text())["runtime"]
    options = load_options()
    assert set(expected) == set(FILE_OPTIONS)
    for name, value in expected.items():
        assert getattr(options, name) == value, name
    assert options.model is options.time_model is options.launch_lookup is options.logistic_model is None


def test_defaults_load_from_any_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_options().min_bytes == yaml.safe_load(SHIPPED.read_text())["runtime"]["min_bytes"]


def test_keyword_options_override_the_file() -> None:
    rt = cswap.Runtime("compress-keep", device="cpu", min_bytes=123, prefetch_bytes=0, backend="torch", d2h_gbps=3.5)
    assert (rt.policy, rt.options.min_bytes, rt.options.prefetch_bytes, rt.backend, rt.options.d2h_gbps) == (
        "compress-keep", 123, 0, "torch", 3.5)
    assert rt.device == torch.device("cpu")
    assert isinstance(rt.options, RuntimeOptions)


def test_auto_backend_is_cpu_on_cpu() -> None:
    assert cswap.Runtime("swap", device="cpu").backend == "cpu"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_is_accepted(policy: str) -> None:
    assert cswap.Runtime(policy, device="cpu", model=torch.nn.Linear(2, 2)).policy == policy


def test_unknown_options_are_named_with_the_valid_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown Runtime options 'min_byte', 'prefetch'; valid options are .*min_bytes.*prefetch_bytes"):
        cswap.Runtime("swap", min_byte=0, prefetch=1)


def test_unknown_policy_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="policy='vdnn'.*none, swap, cpu-compress-swap, compress-swap, cswap, compress-keep"):
        cswap.Runtime("vdnn")


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("min_bytes", -1, "min_bytes=-1.*int >= 0"),
        ("min_bytes", 1.5, "min_bytes=1.5.*int >= 0"),
        ("prefetch_bytes", True, "prefetch_bytes=True"),
        ("decider", "neural", "decider='neural'.*cost-model, logistic"),
        ("backend", "gpu", "backend='gpu'.*auto, torch, cpu, cuda"),
        ("device", "tpu:0:1", "device='tpu:0:1'.*device name"),
        ("arena_slack", -0.5, "arena_slack=-0.5"),
        ("d2h_gbps", 0, "d2h_gbps=0.*positive number"),
        ("paper_size", "yes", "paper_size='yes'.*true or false"),
        ("model", "vgg16", "model='vgg16'.*nn.Module"),
        ("time_model", object(), "time_model=.*compress_s"),
        ("launch_lookup", 3, "launch_lookup=3.*callable"),
    ],
)
def test_bad_values_name_the_option(name: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_options(**{name: value})


def test_logistic_decider_needs_its_model() -> None:
    with pytest.raises(ValueError, match="decider='logistic' needs logistic_model"):
        load_options(decider="logistic")


def test_backend_must_match_the_device() -> None:
    with pytest.raises(ValueError, match="backend 'cuda' compresses GPU tensors.*backend='cpu'"):
        cswap.Runtime("swap", device="cpu", backend="cuda")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "defaults.yaml"
    path.write_text(text)
    return path


def _shipped_with(old: str, new: str) -> str:
    text = SHIPPED.read_text()
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(
    "text, message",
    [
        ("runtime: [unclosed", "not valid YAML"),
        ("- a list\n", "expected a mapping with a 'runtime' mapping"),
        ("other: {}\n", "expected a mapping with a 'runtime' mapping"),
        (None, "unknown key runtime.min_byte; valid keys are"),
        ("missing", "missing key runtime.min_bytes"),
        ("bad-type", r"runtime.min_bytes is 'lots': must be an int >= 0"),
        ("bad-policy", r"runtime.policy is 'fastest': choose one of"),
    ],
)
def test_malformed_defaults_name_the_file_and_key(tmp_path: Path, text: str | None, message: str) -> None:
    if text is None:
        text = _shipped_with("  min_bytes:", "  min_byte:")
    elif text == "missing":
        text = "\n".join(line for line in SHIPPED.read_text().splitlines() if not line.startswith("  min_bytes:"))
    elif text == "bad-type":
        text = _shipped_with("min_bytes: 262144", "min_bytes: lots")
    elif text == "bad-policy":
        text = _shipped_with("policy: cswap", "policy: fastest")
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as error:
        load_options(path)
    assert str(path) in str(error.value)


def test_missing_defaults_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"cannot read the runtime defaults .*{DEFAULTS_ENV}"):
        load_options(tmp_path / "absent.yaml")


def test_defaults_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _shipped_with("policy: cswap", "policy: compress-keep"))
    monkeypatch.setenv(DEFAULTS_ENV, str(path))
    assert default_options_path() == path
    assert cswap.Runtime(device="cpu").policy == "compress-keep"
    assert os.environ[DEFAULTS_ENV] == str(path)


def test_runtime_signature_shows_every_option_with_the_defaults_files_value() -> None:
    from cswap.options import FILE_OPTIONS, OBJECT_OPTIONS
    from cswap.paths import shipped_configs_dir

    shipped = yaml.safe_load((shipped_configs_dir() / "default.yaml").read_text())["runtime"]
    parameters = inspect.signature(cswap.Runtime).parameters
    assert {name: parameters[name].default for name in FILE_OPTIONS} == shipped
    assert all(parameters[name].default is None for name in OBJECT_OPTIONS)
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in (*FILE_OPTIONS, *OBJECT_OPTIONS) if name != "policy")


def test_runtime_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"unknown Runtime option 'prefetch'; valid options are .*prefetch_bytes"):
        cswap.Runtime("swap", device="cpu", prefetch=0)


def test_runtime_keywords_left_at_their_default_follow_the_defaults_file(tmp_path, monkeypatch) -> None:
    from cswap.paths import shipped_configs_dir

    custom = tmp_path / "defaults.yaml"
    custom.write_text(re.sub(r"min_bytes: \d+", "min_bytes: 123", (shipped_configs_dir() / "default.yaml").read_text()))
    monkeypatch.setenv("CSWAP_RUNTIME_CONFIG", str(custom))
    assert cswap.Runtime("swap", device="cpu").options.min_bytes == 123
    assert cswap.Runtime("swap", device="cpu", min_bytes=7).options.min_bytes == 7


@pytest.mark.parametrize(("given", "policy"), [("Swap", "swap"), (" CSWAP ", "cswap"), ("Compress-Keep", "compress-keep")])
def test_a_policy_is_read_in_any_case(given: str, policy: str) -> None:
    assert load_options(policy=given).policy == policy
    assert cswap.Runtime(given, device="cpu").policy == policy
    assert TrainConfig(policy=given).policy == policy


def test_a_misspelt_policy_suggests_the_close_one() -> None:
    with pytest.raises(ValueError, match=r"invalid Runtime option policy='swp': did you mean 'swap'\? choose one of none, swap"):
        load_options(policy="swp")
