"""``cswap max-batch``: the largest batch each policy trains on this GPU.

Example:
    $ cswap max-batch --model resnet50 --policies none,cswap --memory-limit 16GiB
"""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from cswap.commands import fail

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``max-batch`` to the ``cswap`` command."""

    @app.command("max-batch")
    def max_batch_command(
        model: str = typer.Option("resnet50", help="Model name."),
        policies: str = typer.Option("none,swap,compress-swap,cswap,compress-keep", "--policies", "--policy",
                                     help="Comma-separated policies to compare."),
        memory_limit: Optional[str] = typer.Option(None, help="Emulate a smaller GPU, e.g. 16GiB."),
        resolution: Optional[int] = typer.Option(None, help="Input resolution (default: the model's)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Binary-search the largest batch that trains under each policy (needs a GPU)."""
        from cswap.maxbatch import max_batch, parse_bytes

        console = Console()
        try:
            limit = parse_bytes(memory_limit) if memory_limit else None
            chosen = [p.strip() for p in policies.split(",") if p.strip()]
            result = max_batch(model, chosen, memory_limit_bytes=limit, resolution=resolution)
        except (ValueError, RuntimeError) as error:
            raise fail(error) from None
        baseline = result.get("none")
        if as_json:
            print(json.dumps({"model": model, "memory_limit_bytes": limit, "max_batch": result}))
            return
        table = Table(title=f"Largest batch of {model}" + (f" in {memory_limit}" if memory_limit else ""))
        for column in ("policy", "max batch", "vs none"):
            table.add_column(column, justify="right")
        for policy, batch in result.items():
            table.add_row(policy, str(batch), f"{batch / baseline:.2f}x" if baseline else "-")
        console.print(table)
