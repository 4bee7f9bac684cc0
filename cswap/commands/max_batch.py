"""``cswap max-batch``: the largest batch each policy trains on this GPU, or, without one, the
largest whose plan fits (planned on meta traces, never run: :mod:`cswap.training.maxbatch`).

Example:
    $ cswap max-batch --model resnet50 --policies all --memory-limit 16GiB
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
                                     help="Comma-separated policies to compare, or 'all'."),
        memory_limit: Optional[str] = typer.Option(None, help="Emulate a smaller GPU, e.g. 16GiB (needed without a GPU)."),
        resolution: Optional[int] = typer.Option(None, help="Input resolution (default: the model's)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Binary-search the largest batch under each policy: measured on a GPU, planned without one."""
        import torch

        from cswap.training.maxbatch import max_batch, parse_bytes

        console = Console()
        planned = not torch.cuda.is_available()
        extra: dict[str, object] = {}
        try:
            limit = parse_bytes(memory_limit) if memory_limit else None
            chosen = [p.strip() for p in policies.split(",") if p.strip()]
            if planned:
                from cswap.training.maxbatch import planned_max_batch
                from cswap.planner import POLICY_ACTIONS

                if limit is None:
                    raise ValueError("without a GPU the batch is planned, not measured: give --memory-limit, e.g. 16GiB")
                chosen = list(POLICY_ACTIONS) if chosen == ["all"] else chosen
                outcome = planned_max_batch(model, chosen, limit, resolution=resolution or 224)
                result = outcome.batches
                extra = {k: v for k, v in outcome.to_dict().items() if k not in ("model", "memory_limit_bytes", "max_batch")}
            else:
                if chosen == ["all"]:
                    from cswap.options import POLICIES

                    chosen = list(POLICIES)
                result = max_batch(model, chosen, memory_limit_bytes=limit, resolution=resolution)
                extra = {"method": "measured"}
        except (ValueError, RuntimeError) as error:
            raise fail(error) from None
        baseline = result.get("none")
        if as_json:
            print(json.dumps({"model": model, "memory_limit_bytes": limit, "max_batch": result, **extra}))
            return
        how = (
            f"planned on meta traces, not run (no GPU): weights, gradients, {extra['optimizer']} state and a "
            f"{extra['workspace_bytes'] / 2**30:.2f} GiB workspace counted"
            if planned
            else "measured on this GPU"
        )
        table = Table(title=f"Largest batch of {model}" + (f" in {memory_limit}" if memory_limit else "") + f" ({how})")
        for column in ("policy", "max batch", "vs none"):
            table.add_column(column, justify="right")
        for policy, batch in result.items():
            table.add_row(policy, str(batch), f"{batch / baseline:.2f}x" if baseline else "-")
        console.print(table)
