"""``cswap demo``: compress the real activations of a small CNN and print the ratio per layer.

Example:
    $ cswap demo --batch-size 32
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from cswap.commands import fail

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["register", "run_demo"]


def _digits_batch(batch_size: int, size: int) -> torch.Tensor:
    """Real images: scikit-learn's 8x8 digits, upsampled to ``size`` and given 3 channels."""
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    images = torch.tensor(load_digits().images[:batch_size], dtype=torch.float32) / 16.0
    images = nn.functional.interpolate(images.unsqueeze(1), size=(size, size), mode="bilinear")
    return images.expand(-1, 3, -1, -1).contiguous()


def _small_cnn() -> nn.Sequential:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )


def run_demo(
    batch_size: int = 64,
    backend: str | None = None,
    console: Console | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[dict[str, object]]:
    """Run the forward pass, compress each layer's output, check the round trip, print a table.

    Each layer's output is compressed once untimed before three timed calls (the median is shown),
    so the first row does not include the codec's JIT compilation (about half a second) or
    first-touch allocations.

    Args:
        batch_size: images in the forward pass.
        backend: codec backend (``None``: from the device).
        console: where the table goes (default: stdout).
        clock: seconds now (default ``time.perf_counter``).

    Returns:
        One row per layer: ``layer, shape, nbytes, compressed_nbytes, ratio, sparsity, compress_s``.

    Example:
        >>> rows = run_demo(batch_size=2, console=Console(quiet=True))
        >>> [row["layer"] for row in rows][:2], rows[1]["sparsity"] > 0
        (['0:Conv2d', '1:ReLU'], True)
    """
    # torch loads here, not with the command line: `cswap --help` stays quick
    import torch

    from cswap.codecs import compress, decompress

    console = console or Console()
    torch.manual_seed(0)
    model = _small_cnn().eval()
    x = _digits_batch(batch_size, 32)
    rows: list[dict[str, object]] = []
    with torch.no_grad():
        for index, layer in enumerate(model):
            x = layer(x)
            compress(x, backend=backend)  # warm-up: JIT compilation and first-touch allocations stay untimed
            times = []
            for _ in range(3):  # the median: one call alone may wait on another process for the CPU
                start = clock()
                packed = compress(x, backend=backend)
                times.append(clock() - start)
            seconds = sorted(times)[1]
            if not torch.equal(decompress(packed, backend=backend).view(torch.uint8), x.contiguous().view(torch.uint8)):
                raise AssertionError(f"round trip of layer {index} changed bits")
            rows.append(
                {
                    "layer": f"{index}:{type(layer).__name__}",
                    "shape": tuple(x.shape),
                    "nbytes": packed.original_nbytes,
                    "compressed_nbytes": packed.compressed_nbytes,
                    "ratio": packed.ratio,
                    "sparsity": 1.0 - packed.density,
                    "compress_s": seconds,
                }
            )
    table = Table(title=f"ZVC on the activations of a small CNN (digits, batch {batch_size})")
    for column in ("layer", "shape", "MiB", "ratio", "sparsity", "compress ms"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["layer"]), str(row["shape"]), f"{row['nbytes'] / 2**20:.2f}",
            f"{row['ratio']:.2f}x", f"{row['sparsity']:.1%}", f"{row['compress_s'] * 1e3:.2f}",
        )
    console.print(table)
    return rows


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the ``cswap`` command."""

    @app.command("demo")
    def demo(
        batch_size: int = typer.Option(64, help="Images in the forward pass."),
        backend: str = typer.Option(None, help="Codec backend: torch, cpu or cuda (default: from the device)."),
    ) -> None:
        """Compress the real activations of a small CNN and print the compression ratio per layer."""
        try:
            run_demo(batch_size=batch_size, backend=backend)
        except (ValueError, RuntimeError) as error:
            raise fail(error) from None
