"""Rich progress bars for training: one bar per epoch with loss, samples/s, memory and offload figures.

Example:
    >>> from rich.console import Console
    >>> with EpochProgress(Console(quiet=True), enabled=True, epochs=1, steps=2) as bars:
    ...     bars.update(0, 0, loss=2.3, samples_per_s=100.0, memory_bytes=1 << 20, offloaded_bytes=0, ratio=1.0)
"""

from __future__ import annotations

from types import TracebackType
from collections.abc import Iterable

from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

__all__ = ["FIGURES", "EpochProgress", "epoch_figures", "format_bytes"]


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


#: What the figures under each epoch's bar mean; the summary table of ``cswap train`` uses the same words.
FIGURES = ("mean loss", "samples/s", "peak memory", "offloaded this epoch", "ratio")


def epoch_figures(*, mean_loss: float, samples_per_s: float, memory_bytes: int, offloaded_bytes: int,
                  ratio: float) -> str:
    """The labelled figures of one epoch so far, as one line that may wrap between figures.

    Example:
        >>> epoch_figures(mean_loss=2.25, samples_per_s=100.0, memory_bytes=1 << 20, offloaded_bytes=0, ratio=1.0)
        'mean loss 2.2500 · 100.0 samples/s · peak memory 1.0 MiB · offloaded this epoch 0 B · ratio 1.00x'
    """
    return (f"mean loss {mean_loss:.4f} · {samples_per_s:.1f} samples/s · peak memory {format_bytes(memory_bytes)} · "
            f"offloaded this epoch {format_bytes(offloaded_bytes)} · ratio {ratio:.2f}x")


class _BarThenFigures(Progress):
    """Each task as its bar on one line, then its figures below, wrapped at word breaks (never cut)."""

    def get_renderables(self) -> Iterable[RenderableType]:
        for task in self.tasks:
            yield self.make_tasks_table([task])
            yield Padding(Text(task.fields.get("figures", ""), overflow="fold"), (0, 0, 0, 2))


class EpochProgress:
    """A progress bar per epoch (1-based, as in the summary table) with its figures on the line below.

    A no-op when ``enabled`` is False (non-zero ranks, tests). The figures are those of the epoch so
    far: the mean loss of its batches, samples/s, peak memory, bytes offloaded in this epoch and
    the compression ratio; the summary table at the end shows the same figures per epoch.

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
        self._progress = _BarThenFigures(
            TextColumn("[bold]epoch {task.fields[epoch]}/{task.fields[epochs]}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TextColumn("batches"),
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
        """Mark iteration ``step`` of ``epoch`` (0-based; shown 1-based) done with the epoch's figures so far.

        Args:
            loss: the mean loss of the epoch's batches so far.
            offloaded_bytes: bytes offloaded in this epoch so far.
        """
        if not self._enabled:
            return
        fields = {
            "epoch": epoch + 1, "epochs": self._epochs,
            "figures": epoch_figures(mean_loss=loss, samples_per_s=samples_per_s, memory_bytes=memory_bytes,
                                     offloaded_bytes=offloaded_bytes, ratio=ratio),
        }
        if epoch not in self._tasks:
            self._tasks[epoch] = self._progress.add_task("train", total=self._steps, **fields)
        self._progress.update(self._tasks[epoch], completed=step + 1, **fields)
