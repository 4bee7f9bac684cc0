"""What one ``cswap train`` run does: a validated, frozen configuration, from defaults, a recipe and flags.

Precedence: the defaults (:data:`cswap.training.defaults.TRAIN_DEFAULTS`), then a recipe
(``--config configs/recipes/NAME.yaml``, or just ``--config NAME`` for a shipped one), then the
flags given on the command line. A recipe is YAML whose keys are field names of
:class:`TrainConfig`; an unknown key or a bad value is an error naming the key and the file.

Example:
    >>> cfg = TrainConfig(model="vgg11", epochs=1)
    >>> cfg.policy, cfg.tune
    ('cswap', 'off')
    >>> TrainConfig(policy="fast")
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for TrainConfig
    ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from collections.abc import Mapping
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cswap.budget import parse_budget, parse_host_budget
from cswap.paths import shipped_configs_dir
from cswap.planner.actions import RUNTIME_POLICIES
from cswap.training.defaults import TRAIN_DEFAULTS as _DEFAULTS

__all__ = ["RecipeError", "TrainConfig", "check_service_url", "load_config", "recipe_path", "shipped_recipes"]

#: A runtime policy (:data:`cswap.planner.actions.RUNTIME_POLICIES`).
Policy = Literal[RUNTIME_POLICIES]  # type: ignore[valid-type]
TuneMode = Literal["off", "cached", "bo", "grid", "random"]


class RecipeError(ValueError):
    """A recipe file that cannot be used; the message names the file and the key."""


def check_service_url(url: str) -> str:
    """``url`` if it can name a ``cswap serve``: an ``http``/``https`` scheme, a host, a valid port.

    Raises:
        ValueError: naming what is wrong and what a good URL looks like.

    Example:
        >>> check_service_url("http://127.0.0.1:8765")
        'http://127.0.0.1:8765'
        >>> check_service_url("http://[::1")
        Traceback (most recent call last):
        ...
        ValueError: 'http://[::1' is not a URL (Invalid IPv6 URL); give the service as http://HOST:PORT
    """
    hint = "give the service as http://HOST:PORT"
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"{url!r} is not a URL (it holds a space or a control character); {hint}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is what raises on a bad one
    except ValueError as error:
        raise ValueError(f"{url!r} is not a URL ({error}); {hint}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{url!r} is not an http(s) URL; {hint}")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host; {hint}")
    return url


class TrainConfig(BaseModel):
    """One training run.

    Attributes:
        model: a name from ``cswap.models.MODEL_NAMES`` or ``package.module:function``.
        dataset: ``digits``, ``synthetic`` or ``package.module:function``.
        epochs: passes over the training set.
        batch_size: the global batch (split evenly across ranks under torchrun).
        lr: peak learning rate of SGD with momentum under a cosine schedule.
        momentum, weight_decay: SGD settings.
        policy: what the runtime does with saved activations.
        tune: ``off`` (codec defaults), ``cached`` (store or service only), or a search method run now on a miss.
            A ``tuner_url`` without ``tune`` means ``cached``; with ``tune="off"`` it is an error.
        tune_budget: evaluations per tuned kernel for ``bo``/``random``.
        tuner_url: a ``cswap serve`` to read configs from and publish to (``http(s)://HOST[:PORT]``).
        device: ``auto``, ``cpu`` or ``cuda``.
        amp: autocast dtype for forward, or ``off``.
        image_size: input resolution the dataset is resized to.
        width_mult: channel multiplier of the model (1.0 is the published architecture).
        train_samples: cap on training images (``None``: all).
        min_bytes: without a memory budget, tensors below it stay on the device; under one it binds
            nothing (every tensor may move when the budget needs it, a small one's copies priced with
            a fixed latency, :data:`cswap.planner.costmodel.COPY_LATENCY_S`).
        memory_budget: the most bytes of saved activations on the device: bytes, ``"512MiB"``, or a
            fraction in (0, 1] of policy ``none``'s peak (:func:`cswap.budget.parse_budget`); ``None``: no budget.
        host_memory_budget: the most bytes of saved activations' host copies held at once: bytes,
            ``"8GiB"``, or ``"auto"`` (:func:`cswap.budget.parse_host_budget`); ``None``: no host budget.
        report: JSON report path (``None``: ``runs/<model>-<policy>/report.json``).
        plots: directory for PNG plots (``None``: the report's folder, as ``<report stem>-<plot>.png``).
        seed: seeds model init, data order and dropout.
        save_model: write the trained model's ``state_dict`` here (rank 0), or ``None``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = _DEFAULTS["model"]
    dataset: str = _DEFAULTS["dataset"]
    epochs: int = Field(_DEFAULTS["epochs"], ge=1)
    batch_size: int = Field(_DEFAULTS["batch_size"], ge=1)
    lr: float = Field(_DEFAULTS["lr"], gt=0)
    momentum: float = Field(_DEFAULTS["momentum"], ge=0, lt=1)
    weight_decay: float = Field(_DEFAULTS["weight_decay"], ge=0)
    policy: Policy = _DEFAULTS["policy"]
    tune: TuneMode = _DEFAULTS["tune"]
    tune_budget: int = Field(_DEFAULTS["tune_budget"], ge=1)
    tuner_url: str | None = _DEFAULTS["tuner_url"]
    device: Literal["auto", "cpu", "cuda"] = _DEFAULTS["device"]
    amp: Literal["off", "fp16", "bf16"] = _DEFAULTS["amp"]
    image_size: int = Field(_DEFAULTS["image_size"], ge=8)
    width_mult: float = Field(_DEFAULTS["width_mult"], gt=0)
    train_samples: int | None = Field(_DEFAULTS["train_samples"], ge=1)
    min_bytes: int | None = Field(_DEFAULTS["min_bytes"], ge=0)
    memory_budget: int | float | str | None = _DEFAULTS["memory_budget"]
    host_memory_budget: int | str | None = _DEFAULTS["host_memory_budget"]
    report: Path | None = _DEFAULTS["report"]
    plots: Path | None = _DEFAULTS["plots"]
    seed: int = _DEFAULTS["seed"]
    save_model: Path | None = _DEFAULTS["save_model"]

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_in_any_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("memory_budget")
    @classmethod
    def _budget(cls, value: int | float | str | None) -> int | float | str | None:
        parse_budget(value)  # its ValueError names the value and the accepted forms
        return value

    @field_validator("host_memory_budget")
    @classmethod
    def _host_budget(cls, value: int | str | None) -> int | str | None:
        # its ValueError names the value and the forms; "auto" is read where training runs, not here
        parse_host_budget(value, limit=(1, "not read yet"))
        return value

    @field_validator("tuner_url")
    @classmethod
    def _valid_url(cls, url: str | None) -> str | None:
        return None if url is None else check_service_url(url)

    @model_validator(mode="before")
    @classmethod
    def _service_implies_lookup(cls, values: Any) -> Any:
        # A service URL does nothing with tune="off": given alone it means "look configs up there".
        if isinstance(values, Mapping) and values.get("tuner_url") is not None:
            if "tune" not in values:
                return {**values, "tune": "cached"}
            if values["tune"] == "off":
                raise ValueError(
                    "tuner_url has no effect with tune 'off': drop --tuner-url, or pass --tune cached "
                    "(look kernel configs up there) or --tune bo (also tune on a miss and publish)"
                )
        return values

    @property
    def report_path(self) -> Path:
        """Where the JSON report goes."""
        return self.report or Path("runs") / f"{self.model.replace(':', '_')}-{self.policy}" / "report.json"

    @property
    def plots_dir(self) -> Path:
        """Where the plots go: ``plots`` if given, else the report's own folder."""
        return self.plots or self.report_path.parent

    def plot_path(self, name: str) -> Path:
        """The PNG file of plot ``name``: ``PLOTS/NAME.png``, or beside the report as ``REPORT-STEM-NAME.png``.

        Beside the report the file is named after it, so two reports in one folder keep their own plots.

        Example:
            >>> TrainConfig(report=Path("runs/a.json")).plot_path("memory").as_posix()
            'runs/a-memory.png'
            >>> TrainConfig(report=Path("runs/a.json"), plots=Path("figs")).plot_path("memory").as_posix()
            'figs/memory.png'
        """
        if self.plots is not None:
            return self.plots / f"{name}.png"
        return self.report_path.parent / f"{self.report_path.stem}-{name}.png"


def shipped_recipes() -> tuple[str, ...]:
    """Names of the recipes that ship with cswap (``configs/recipes/<name>.yaml``), sorted."""
    return tuple(sorted(p.stem for p in (shipped_configs_dir() / "recipes").glob("*.yaml")))


def recipe_path(recipe: str | Path) -> Path:
    """The file of ``recipe``: a path to a YAML file, or the name of a shipped recipe (``vgg16-digits``).

    Example:
        >>> recipe_path("vgg16-digits").name
        'vgg16-digits.yaml'
    """
    path = Path(recipe)
    if path.exists() or path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        return path
    shipped = shipped_configs_dir() / "recipes" / f"{path.name}.yaml"
    if shipped.is_file():
        return shipped
    names = ", ".join(shipped_recipes()) or "none"
    raise RecipeError(f"no recipe file {str(recipe)!r} and no shipped recipe of that name; give a YAML path or one of: {names}")


def _recipe(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise RecipeError(f"cannot read recipe {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise RecipeError(f"recipe {path} is not valid YAML: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a mapping of TrainConfig keys, got {type(data).__name__}")
    return data


def load_config(recipe: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """Defaults, then ``recipe``, then ``overrides`` (entries that are ``None`` are ignored).

    Args:
        recipe: path of a YAML recipe, the name of a shipped one (:func:`shipped_recipes`), or ``None``.
        overrides: flag values from the command line.

    Raises:
        RecipeError: the recipe is unreadable, not a mapping, has an unknown key or a bad value
            (the message names the key and the file).
    """
    values: dict[str, Any] = {}
    source = "the command line"
    if recipe is not None:
        recipe = recipe_path(recipe)
        values.update(_recipe(recipe))
        source = str(recipe)
        try:
            TrainConfig(**values)
        except ValidationError as error:
            raise RecipeError(_explain(error, source)) from None
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return TrainConfig(**values)
    except ValidationError as error:
        raise RecipeError(_explain(error, source)) from None


def _explain(error: ValidationError, source: str) -> str:
    problems = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "<root>"
        if item["type"] == "extra_forbidden":
            valid = ", ".join(sorted(TrainConfig.model_fields))
            problems.append(f"unknown key {key!r} (valid keys: {valid})")
        else:
            problems.append(f"key {key!r}: {item['msg']} (got {item.get('input')!r})")
    return f"bad training config in {source}: " + "; ".join(problems)
