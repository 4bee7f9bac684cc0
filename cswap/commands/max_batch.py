"""``cswap max-batch``: the largest batch each policy trains on this GPU, or, without one, the
largest whose plan fits (planned on meta traces, never run: :mod:`cswap.training.maxbatch`).

A transformer (a preset such as ``llama-3-8b``, ``hf:<model_type>``, a config path) is always
planned: the micro-batch of ``--seq-len`` tokens, with AdamW's state counted
(:func:`cswap.training.maxbatch.planned_max_batch_transformer`).

Planned, ``--policies`` takes the strategies users pick instead of a policy too
(:mod:`cswap.simulate.strategies`: ``ac-full``, ``offload-all``, ...), with the same accounting;
``all`` is every policy and every strategy that can run on the model.

Several sequence lengths (``--seq-len 128-1024`` or ``128,256,512,1024``): the plan for the longest
serves every shorter one and every tensor is no larger there, so the longest binds: the batch is
the one found at the longest length, and each policy's plan at its batch is simulated at every
length (``lengths``: per length, ``iteration_s`` per policy; a column per length in the table).

Example:
    $ cswap max-batch --model resnet50 --policies all --memory-limit 16GiB
    $ cswap max-batch --model llama-3.2-1b --seq-len 2048 --dtype bfloat16 --mixed-precision --memory-limit 80GiB
    $ cswap max-batch --model llama-3.2-1b --seq-len 512-4096 --memory-limit 80GiB
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
        model: str = typer.Option(
            "resnet50",
            help="An image model, a transformer preset (gpt2, gpt2-xl, llama-3.2-1b, llama-3-8b, bert-base, bert-large, "
            "gpt3-175b-layer), hf:<model_type>, a transformer config path, or package.module:function.",
        ),
        policies: str = typer.Option(
            "none,swap,compress-swap,cswap,compress-keep",
            "--policies",
            "--policy",
            help="Comma-separated policies and strategies (ac-full, ac-selective, offload-all, offload-all+ac, "
            "megatron-offload, recompute-knapsack, ilp-kro; planned only) to compare, or 'all'.",
        ),
        memory_limit: Optional[str] = typer.Option(None, help="Emulate a smaller GPU, e.g. 16GiB (needed without a GPU)."),
        resolution: Optional[int] = typer.Option(None, help="Input resolution (default: the model's)."),
        seq_len: Optional[str] = typer.Option(
            None,
            help="Tokens per sequence of a transformer (default: the preset's); several, as a range (128-1024: its ends "
            "and the powers of two between, at most 6) or a list (128,256,512): the batch is the longest length's, "
            "whose plan serves the others, and its time at each length is shown.",
        ),
        layers: Optional[int] = typer.Option(None, min=1, help="Transformer layers, replacing the preset's."),
        attention: Optional[str] = typer.Option(None, help="Transformer attention: sdpa or eager (default: sdpa)."),
        dtype: Optional[str] = typer.Option(None, help="A transformer's weights, gradients and activations (default: bfloat16)."),
        mixed_precision: bool = typer.Option(
            False, "--mixed-precision", help="A 16-bit transformer keeps float32 master weights too (4 more bytes a parameter)."
        ),
        compressibility: str = typer.Option(
            "all-minilm-l6-v2",
            help="What exponent coding and bit-packing give each kind of a transformer's saved tensors: a profile in "
            "configs/compressibility/ (measured on a trained model) or a YAML path; 'none' for ZVC alone.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Binary-search the largest batch under each policy: measured on a GPU, planned without one.

        A transformer is always planned, counting its weights, gradients and AdamW's two float32
        moments, plus float32 master weights with --mixed-precision.

        With several --seq-len lengths the batch is searched at the longest (it binds: the plan for it
        serves every shorter length, where no tensor is larger), and "ms at N" is the simulated
        iteration of each policy's plan for the longest length, at its largest batch, carried out at
        N tokens."""
        import torch

        from cswap.training.maxbatch import max_batch, parse_bytes

        from cswap.simulate.modeltrace import is_transformer_model, unknown_model
        from cswap.simulate.seqlens import parse_seq_lens

        console = Console()
        try:
            lengths = parse_seq_lens(seq_len)
        except ValueError as error:
            raise fail(error) from None
        longest = None if lengths is None else lengths.longest
        transformer = is_transformer_model(model, longest)
        planned = transformer or not torch.cuda.is_available()
        extra: dict[str, object] = {}
        try:
            if lengths is not None and lengths.several and not transformer:
                raise ValueError(
                    f"--seq-len {lengths.given} names several sequence lengths, which only a transformer model has; {model!r} is "
                    "not one (give a transformer preset such as gpt2, hf:<model_type> or a config path)"
                )
            limit = parse_bytes(memory_limit) if memory_limit else None
            chosen = [p.strip() for p in policies.split(",") if p.strip()]
            if not transformer:
                from cswap import models
                from cswap._userfn import is_spec

                given = [
                    flag
                    for flag, value in (("--layers", layers), ("--attention", attention), ("--dtype", dtype))
                    if value is not None
                ]
                if given or mixed_precision:
                    raise ValueError(
                        f"{', '.join(given) or '--mixed-precision'} apply to transformers; {model!r} is an image model"
                    )
                if model not in models.MODEL_NAMES and not is_spec(model):
                    raise unknown_model(model)
            if transformer:
                from cswap.training.maxbatch import planned_max_batch_transformer

                if limit is None and torch.cuda.is_available():
                    limit = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
                if limit is None:
                    raise ValueError("without a GPU the batch is planned, not measured: give --memory-limit, e.g. 16GiB")
                outcome = planned_max_batch_transformer(
                    model,
                    chosen,
                    limit,
                    seq_len=longest,
                    dtype=dtype or "bfloat16",
                    attention=attention or "sdpa",
                    num_layers=layers,
                    mixed_precision=mixed_precision,
                    served_seq_lens=lengths.lengths[:-1] if lengths is not None else (),
                    compressibility=compressibility,
                )
                result = outcome.batches
                extra = {k: v for k, v in outcome.to_dict().items() if k not in ("model", "memory_limit_bytes", "max_batch")}
                if lengths is not None and lengths.several:
                    extra["seq_lens"] = {
                        "given": lengths.given,
                        "lengths": list(lengths.lengths),
                        "picked": lengths.picked,
                        "served_by": lengths.longest,
                    }
            elif planned:
                from cswap.training.maxbatch import planned_max_batch

                if limit is None:
                    raise ValueError("without a GPU the batch is planned, not measured: give --memory-limit, e.g. 16GiB")
                outcome = planned_max_batch(model, chosen, limit, resolution=resolution or 224)
                result = outcome.batches
                extra = {k: v for k, v in outcome.to_dict().items() if k not in ("model", "memory_limit_bytes", "max_batch")}
            else:
                from cswap.options import POLICIES

                if chosen == ["all"]:
                    chosen = list(POLICIES)
                priced = [name for name in chosen if name not in POLICIES]
                if priced:
                    raise ValueError(
                        f"{', '.join(priced)} cannot run on this GPU (the simulator prices the strategies, the runtime does not "
                        f"carry them out): measure the runtime's policies ({', '.join(POLICIES)}), or plan a strategy with "
                        "--memory-limit on a machine without a GPU"
                    )
                result = max_batch(model, chosen, memory_limit_bytes=limit, resolution=resolution)
                extra = {"method": "measured"}
        except (ValueError, RuntimeError, ImportError) as error:
            raise fail(error) from None
        baseline = result.get("none")
        if as_json:
            print(json.dumps({"model": model, "memory_limit_bytes": limit, "max_batch": result, **extra}))
            return
        if transformer:
            how = (
                f"planned on meta traces, not run: {extra['parameters']:,} parameters with {extra['optimizer']}, and a "
                f"{extra['workspace_bytes'] / 2**30:.2f} GiB workspace counted"
            )
            what = f"{model} micro-batch of {extra['seq_len']}-token sequences"
        else:
            how = (
                f"planned on meta traces, not run (no GPU): weights, gradients, {extra['optimizer']} state and a "
                f"{extra['workspace_bytes'] / 2**30:.2f} GiB workspace counted"
                if planned
                else "measured on this GPU"
            )
            what = f"batch of {model}"
        served = {row["seq_len"]: row["iteration_s"] for row in extra.get("lengths") or []}  # type: ignore[attr-defined]
        if served:
            picked = extra["seq_lens"]
            how += (
                f"; at each length, each policy's plan for {picked['served_by']} tokens at its batch"  # type: ignore[index]
                + (f"; lengths from {picked['given']}: {picked['picked']}" if picked["picked"] != "given" else "")  # type: ignore[index]
            )
        # A line of its own above the table: as the table's title it would wrap to the table's few columns.
        title = f"Largest {what}" + (f" in {memory_limit}" if memory_limit else "") + f" ({how})"
        table = Table()
        for column in ("policy or strategy", "max batch", "vs none", *(f"ms at {n}" for n in served)):
            table.add_column(column, justify="right")
        for policy, batch in result.items():
            times = [served[n].get(policy) for n in served]
            table.add_row(
                policy,
                str(batch),
                f"{batch / baseline:.2f}x" if baseline else "-",
                *("-" if t is None else f"{t * 1e3:.1f}" for t in times),
            )
        console.print(title, markup=False, highlight=False)
        console.print(table)
        for name, why in dict(extra.get("skipped") or {}).items():  # type: ignore[call-overload]
            console.print(f"skipped {name}: {why}", markup=False, highlight=False)
