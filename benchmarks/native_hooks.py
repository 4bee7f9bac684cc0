"""What moving a swap hook's pack and unpack out of Python buys: the essential swap in C++ against the same in Python.

``benchmarks/hooks.py`` measures the runtime's hooks against ``save_on_cpu`` and two Python
baselines: the keyed floor (the least a keyed swap hook in Python does) and the essential swap
(that floor plus what a swap hook must do to be safe to train with). Both are already most of the
way to the issue's 1.25x of ``save_on_cpu`` on ``many-small``, so whether a runtime's hooks can meet
it depends on where they run. This script builds the essential swap with its pack and unpack in C++
(``benchmarks/native/keyed_swap.cpp``, compiled with ``torch.utils.cpp_extension.load_inline``: a
C++ compiler and ninja are needed), checks that its gradients equal plain PyTorch's bit for bit,
and times it interleaved, round by round, with plain PyTorch, ``save_on_cpu`` and the two Python
baselines, on one torch thread.

Output: one JSON line for the build (its seconds), then one per run (median iteration seconds,
the ratio to plain and to ``save_on_cpu``; for the C++ run its host peak). Before timing, the C++
run must have counted host bytes and released all of them once the iteration ends.

Example:
    $ python benchmarks/native_hooks.py --rounds 21 > benchmarks/results/cpu-$(date +%F)/native-hooks.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hooks  # the sibling benchmark: its workloads and Python baselines

__all__ = ["NativeEssentialSwap", "build", "main"]

SOURCE = Path(__file__).resolve().parent / "native" / "keyed_swap.cpp"


def build() -> tuple[Any, float]:
    """The compiled extension and the seconds its build took (cached by torch between runs)."""
    from torch.utils.cpp_extension import load_inline

    started = time.perf_counter()
    module = load_inline("cswap_bench_keyed_swap", cpp_sources=[SOURCE.read_text()], extra_cflags=["-O2"], verbose=False)
    return module, time.perf_counter() - started


class NativeEssentialSwap:
    """:class:`hooks.EssentialSwap` with its pack and unpack in C++ (``native``: :func:`build`'s
    module); the guards and slots come from one pass over ``model`` on ``x``, as there."""

    def __init__(self, native: Any, model: torch.nn.Module, x: torch.Tensor) -> None:
        self.native = native
        self.hooks = native.KeyedSwap()

        def learn(t: torch.Tensor) -> torch.Tensor:
            strided = t.layout is torch.strided
            movable = strided and not (t.requires_grad and t.is_leaf)
            base = t._base
            if movable and base is not None and base.requires_grad and base.is_leaf:
                movable = False
            self.hooks.add_guard(list(t.shape), t.dtype, torch.empty_like(t) if strided else torch.empty(0), movable)
            return t

        with torch.autograd.graph.saved_tensors_hooks(learn, lambda t: t):
            hooks._step(model, x)

    def __call__(self) -> AbstractContextManager[None]:
        return self._installed()

    @contextmanager
    def _installed(self) -> Iterator[None]:
        self.hooks.begin()
        with torch.autograd.graph.saved_tensors_hooks(self.hooks.pack, self.native.unpack):
            yield
        self.hooks.drain()  # what died in backward


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``: equal only where every bit is (NaN-safe, -0.0-sensitive)."""
    return t.detach().contiguous().view(-1).view(torch.uint8)


def _check(run: NativeEssentialSwap, model: torch.nn.Module, x: torch.Tensor) -> int:
    """Gradients equal plain PyTorch's bit for bit, every moved byte released after the iteration;
    returns the host peak."""
    hooks._step(model, x)
    expected = [p.grad.clone() for p in model.parameters()]
    with run():
        hooks._step(model, x)
    for a, p in zip(expected, model.parameters(), strict=True):
        if not torch.equal(_bits(a), _bits(p.grad)):
            raise AssertionError("the C++ hook's gradients differ from plain PyTorch's")
    if run.hooks.host_bytes != 0 or run.hooks.peak_host_bytes <= 0:
        raise AssertionError(f"host bytes after the iteration {run.hooks.host_bytes}, peak {run.hooks.peak_host_bytes}")
    return int(run.hooks.peak_host_bytes)


def measure(workload: hooks.Workload, rounds: int, native: Any) -> list[dict[str, object]]:
    """Median iteration seconds of plain, ``save_on_cpu``, the two Python baselines and the C++ one."""
    model, x = workload.build()
    runs: dict[str, Callable[[], AbstractContextManager[None]]] = {
        "plain": nullcontext,
        "save_on_cpu": torch.autograd.graph.save_on_cpu,
        "keyed floor": hooks.KeyedFloor(model, x),
        "essential swap": hooks.EssentialSwap(model, x),
    }
    cpp = NativeEssentialSwap(native, model, x)
    peak = _check(cpp, model, x)
    runs["essential swap in C++"] = cpp
    for context in runs.values():
        for _ in range(4):
            with context():
                hooks._step(model, x)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, context in runs.items():
            started = time.perf_counter()
            with context():
                hooks._step(model, x)
            times[name].append(time.perf_counter() - started)
    plain = statistics.median(times["plain"])
    on_cpu = statistics.median(times["save_on_cpu"])
    rows: list[dict[str, object]] = []
    for name, values in times.items():
        median = statistics.median(values)
        row: dict[str, object] = {"workload": workload.name, "run": name, "rounds": rounds, "median_s": round(median, 6),
                                  "vs_plain": round(median / plain, 3), "vs_save_on_cpu": round(median / on_cpu, 3)}
        if name == "essential swap in C++":
            row["peak_host_bytes"] = peak
        row.update(torch_threads=torch.get_num_threads(), cpus=os.cpu_count(), torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds (medians over them)")
    parser.add_argument("--workloads", default="many-small,few-large", help="comma-separated workload names")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    native, build_s = build()
    print(json.dumps({"build_s": round(build_s, 2), "source": str(SOURCE.relative_to(SOURCE.parents[2]))}), flush=True)
    chosen = args.workloads.split(",")
    for workload in (w for w in hooks.WORKLOADS if w.name in chosen):
        for row in measure(workload, args.rounds, native):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
