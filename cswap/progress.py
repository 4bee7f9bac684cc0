"""Rich progress bars for training: one bar per epoch with loss, samples/s, memory and offload figures.

Example:
    >>> from rich.console import Console
    >>> with EpochProgress(Console(quiet=True), enabled=True, epochs=1, steps=2) as bars:
    ...     bars.update(0, 0, loss=2.3, samples_per_s=100.0, memory_bytes=1 << 20, offloaded_bytes=0, ratio=1.0)
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["EpochProgress", "format_bytes"]


def format_bytes(nbytes: float) -> str:
    """``1536`` -> ``'1.5 KiB'``.

    Example:
        >>> format_bytes(3 << 20)
        '3.0 MiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


class EpochProgress:
    """A progress bar per epoch; a no-op when ``enabled`` is False (non-zero ranks, tests).

    Args:
        console: where to draw.
        enabled: draw at all.
        epochs: number of epochs (one task each, created when the epoch starts).
        steps: iterations per epoch.
    """

    def __init__(self, console: Console, enabled: bool, epochs: int, steps: int) -> None:
        self._enabled = enabled
        self._epochs = epochs
        self._steps = steps
        self._tasks: dict[int, TaskID] = {}
        self._progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}/{task.fields[epochs]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TextColumn("{task.fields[samples_per_s]:.1f} samples/s"),
            TextColumn("mem {task.fields[memory]}"),
            TextColumn("offloaded {task.fields[offloaded]}"),
            TextColumn("ratio {task.fields[ratio]:.2f}x"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )

    def __enter__(self) -> EpochProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.__exit__(kind, error, tb)

    def update(self, epoch: int, step: int, *, loss: float, samples_per_s: float, memory_bytes: int,
               offloaded_bytes: int, ratio: float) -> None:
        """Mark iteration ``step`` of ``epoch`` done with the figures to show."""
        if not self._enabled:
            return
        fields = {
            "epoch": epoch + 1, "epochs": self._epochs, "loss": loss, "samples_per_s": samples_per_s,
            "memory": format_bytes(memory_bytes), "offloaded": format_bytes(offloaded_bytes), "ratio": ratio,
        }
        if epoch not in self._tasks:
            self._tasks[epoch] = self._progress.add_task("train", total=self._steps, **fields)
        self._progress.update(self._tasks[epoch], completed=step + 1, **fields)
