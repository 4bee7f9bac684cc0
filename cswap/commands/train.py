"""``cswap train``: real training under a policy, tuning the kernels first when asked.

Example:
    $ cswap train --model vgg16 --dataset digits --epochs 2 --policy cswap --tune bo
    $ torchrun --nproc_per_node=2 -m cswap.train --model vgg11 --device cpu
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from cswap.commands import fail, warnings_as_lines
from cswap.training.defaults import TRAIN_DEFAULTS

__all__ = ["register", "train_command"]

#: What ``--help`` says for options whose default is "not set" (the config's ``None``).
_UNSET_DEFAULTS: dict[str, str] = {
    "tuner_url": "no service",
    "train_samples": "all",
    "min_bytes": "the runtime's",
    "memory_budget": "no budget",
    "host_memory_budget": "no host budget",
    "report": "runs/MODEL-POLICY/report.json",
    "plots": "beside the report",
    "save_model": "not saved",
}


def _default(name: str) -> str:
    """The value ``--help`` shows for option ``name``: the run's default (:data:`cswap.training.defaults.TRAIN_DEFAULTS`,
    :class:`~cswap.training.config.TrainConfig`'s), the one used when neither the flag nor a recipe sets it (the
    flag itself defaults to ``None`` so that a recipe's value can win). Read from the plain table, not the
    config, so that printing the help imports no pydantic.

    Example:
        >>> _default("model"), _default("epochs"), _default("plots")
        ('vgg16', '2', 'beside the report')
    """
    value = TRAIN_DEFAULTS[name]
    return _UNSET_DEFAULTS[name] if value is None else str(value)


def train_command(
    model: Optional[str] = typer.Option(None, show_default=_default("model"), help="Model name (cswap.models.MODEL_NAMES) or package.module:function."),
    dataset: Optional[str] = typer.Option(None, show_default=_default("dataset"), help="digits, synthetic, or package.module:function."),
    epochs: Optional[int] = typer.Option(None, show_default=_default("epochs"), help="Passes over the training set."),
    batch_size: Optional[int] = typer.Option(None, show_default=_default("batch_size"), help="Global batch size (split across torchrun ranks)."),
    lr: Optional[float] = typer.Option(None, show_default=_default("lr"), help="Peak learning rate (SGD, momentum, cosine schedule)."),
    policy: Optional[str] = typer.Option(None, show_default=_default("policy"), help="none | swap | compress-swap | cpu-compress-swap | cswap | compress-keep | recompute | capuchin | ac-full."),
    tune: Optional[str] = typer.Option(None, show_default=_default("tune"), help="off | cached | bo | grid | random (cached when only --tuner-url is given)."),
    tune_budget: Optional[int] = typer.Option(None, show_default=_default("tune_budget"), help="Evaluations per tuned kernel (bo, random)."),
    tuner_url: Optional[str] = typer.Option(None, show_default=_default("tuner_url"), help="A running `cswap serve` (http://HOST:PORT) to read configs from and publish to; implies --tune cached."),
    device: Optional[str] = typer.Option(None, show_default=_default("device"), help="auto | cpu | cuda."),
    amp: Optional[str] = typer.Option(None, show_default=_default("amp"), help="off | fp16 | bf16 autocast."),
    image_size: Optional[int] = typer.Option(None, show_default=_default("image_size"), help="Input resolution."),
    width_mult: Optional[float] = typer.Option(None, show_default=_default("width_mult"), help="Channel multiplier of the model."),
    train_samples: Optional[int] = typer.Option(None, show_default=_default("train_samples"), help="Use only this many training images."),
    min_bytes: Optional[int] = typer.Option(None, show_default=_default("min_bytes"), help="Without --memory-budget, saved tensors below this many bytes stay on the device; under a budget it binds nothing: any tensor may move when the budget needs it, a small one's copies priced with a fixed latency each way (cswap.planner.costmodel.COPY_LATENCY_S)."),
    memory_budget: Optional[str] = typer.Option(None, show_default=_default("memory_budget"), help="Most bytes of saved activations on the device: 512MiB, 2GiB, bytes, or a fraction of policy none's peak (0.5)."),
    host_memory_budget: Optional[str] = typer.Option(None, show_default=_default("host_memory_budget"), help="Most bytes of saved activations' host copies held at once: 8GiB, bytes, or auto (half the cgroup limit, else of the available RAM)."),
    report: Optional[Path] = typer.Option(None, show_default=_default("report"), help="JSON report path."),
    plots: Optional[Path] = typer.Option(None, show_default=_default("plots"), help="Directory for PNG plots."),
    seed: Optional[int] = typer.Option(None, show_default=_default("seed"), help="Random seed."),
    save_model: Optional[Path] = typer.Option(None, show_default=_default("save_model"), help="Write the trained state_dict here."),
    config: Optional[Path] = typer.Option(None, show_default="no recipe", help="A recipe: a YAML file, or the name of a shipped one (vgg16-digits, resnet18-digits, policies-synthetic)."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Train a model under a policy and write a report with plots."""
    from cswap.training.loop import OutOfMemoryAdvice, train
    from cswap.training.config import RecipeError, load_config

    console = Console()
    overrides = {
        "model": model, "dataset": dataset, "epochs": epochs, "batch_size": batch_size, "lr": lr, "policy": policy,
        "tune": tune, "tune_budget": tune_budget, "tuner_url": tuner_url, "device": device, "amp": amp,
        "image_size": image_size, "width_mult": width_mult, "train_samples": train_samples, "min_bytes": min_bytes,
        "memory_budget": memory_budget, "host_memory_budget": host_memory_budget, "report": report, "plots": plots, "seed": seed, "save_model": save_model,
    }
    try:
        with warnings_as_lines():
            cfg = load_config(config, overrides)
            train(cfg, console=console, show_progress=progress)
    except (RecipeError, ValueError, RuntimeError, OutOfMemoryAdvice, OSError) as error:
        raise fail(error) from None


def register(app: typer.Typer) -> None:
    """Add ``train`` to the ``cswap`` command."""
    app.command("train")(train_command)
