"""What the saved-tensor hooks cost per saved tensor: every policy against plain PyTorch and ``save_on_cpu``.

A transformer micro-batch saves hundreds to thousands of tensors, many of them small, and whatever
the hooks spend per tensor in Python is host time the device waits for. Two workloads on the CPU,
one torch thread:

* ``many-small``: an MLP of ``--blocks`` Linear+ReLU blocks of width 32 at batch 8 (about three
  saved tensors per block, each under a kilobyte): the per-tensor overhead dominates;
* ``few-large``: 8 Linear+ReLU blocks of width 1024 at batch 256 (a mebibyte per tensor): the
  copies dominate.

Runs, each one optimizer-free forward+backward: plain PyTorch; ``torch.autograd.graph.save_on_cpu()``
(on a CPU device an identity hook: ``tensor.cpu()`` returns the tensor itself, so it copies
nothing); ``copying offload``, the copies ``save_on_cpu`` makes with a GPU (one host copy per saved
tensor, one copy back per read) and nothing else; ``keyed floor`` (:class:`KeyedFloor`), the
least a keyed swap hook in Python does, a floor for any such hook; ``essential swap``
(:class:`EssentialSwap`), that floor with what a swap hook needs to be safe to train with (guard,
never-move checks, deduplication, slots held until released, host and resident bytes counted);
when a policy that recomputes without a budget is measured, ``checkpoint per block``
(:func:`checkpointed_copy`: torch's composable checkpoint on each block of a copy of the model,
what ``ac-full`` does with torch alone; each runtime's row then also gives its ratio to it);
and ``cswap.Runtime`` under every runtime policy with ``min_bytes=0`` (every tensor goes through
the plan), without a budget and with ``memory_budget=0.5``; a runtime that may recompute runs on a copy of the model
of its own (it attaches hooks to the modules it recomputes, which would tax the other runs on a
shared one), the others on the model itself. Each runtime is warmed up past its profiling
iterations first; then the runs take turns, one iteration each per round in an order shuffled per
round (what a run leaves behind slows the next one), so that load on the machine hits all alike,
and each reports the median of its rounds.

Output: one JSON line per (workload, run): median iteration seconds, the ratio to plain and to
``save_on_cpu`` of the same round set, saved tensors per iteration, microseconds per saved tensor
over plain, and for the runtimes the hooks' own time per pack and unpack from their counters (the
median of the rounds': a garbage collection landing in one hook would swamp a mean) and what a
profiling iteration costs against a planned one.
A budget a policy cannot meet is reported with its least budget instead of a time.

One process's figures move by several percent from one process to the next on the same code
(where its memory lands, the machine's load at the time): ``--processes N`` runs the whole
measurement in N fresh processes, one after another, each in its own shuffled order, and reports
per run the median over them of each figure (the ratios taken within each process, against its
own baselines), with the least and most ratio to ``save_on_cpu`` among them.

Example:
    $ python benchmarks/hooks.py --rounds 15 --json > benchmarks/results/cpu-$(date +%F)/hooks.jsonl
    $ python benchmarks/hooks.py --rounds 9 --processes 5 --workloads many-small --json
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

import cswap
from cswap.budget import BudgetError
from cswap.planner.actions import RECOMPUTING_POLICIES, RUNTIME_POLICIES

__all__ = ["WORKLOADS", "EssentialSwap", "KeyedFloor", "Workload", "combine", "copying_offload", "main", "measure"]


@dataclass(frozen=True)
class Workload:
    """An MLP of ``blocks`` Linear+ReLU blocks of ``width`` at ``batch``.

    Example:
        >>> Workload("tiny", blocks=2, width=4, batch=1).build()[0](torch.zeros(1, 4)).shape
        torch.Size([1, 4])
    """

    name: str
    blocks: int
    width: int
    batch: int

    def build(self, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
        """The model and one input batch."""
        torch.manual_seed(seed)
        model = nn.Sequential(*(nn.Sequential(nn.Linear(self.width, self.width), nn.ReLU()) for _ in range(self.blocks)))
        return model, torch.randn(self.batch, self.width)


WORKLOADS = (Workload("many-small", blocks=300, width=32, batch=8), Workload("few-large", blocks=8, width=1024, batch=256))


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


def _saved_per_iteration(model: nn.Module, x: torch.Tensor) -> int:
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _step(model, x)
    return count


@dataclass
class _Run:
    name: str
    policy: str | None
    budget: float | None
    context: Callable[[], AbstractContextManager[None]]
    model: nn.Module
    runtime: cswap.Runtime | None = None
    error: BudgetError | None = None
    profiling_s: list[float] = field(default_factory=list)


def _copy_out(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty_like(tensor)
    host.copy_(tensor)
    return host


def copying_offload() -> AbstractContextManager[None]:
    """``save_on_cpu`` as it runs with a GPU: a host copy per saved tensor and a copy back per read.

    On a CPU device ``save_on_cpu`` copies nothing (``tensor.cpu()`` and ``.to("cpu")`` return the
    tensor itself), so it is an identity hook there; this baseline does the copies the runtime does.

    Example:
        >>> with copying_offload():
        ...     y = torch.ones(2, requires_grad=True).exp()
        >>> torch.equal(y.grad_fn._saved_result, y.detach())
        True
    """
    return torch.autograd.graph.saved_tensors_hooks(_copy_out, torch.Tensor.clone)


class _Slot:
    """What the keyed floor's pack returns for a stored tensor: its host copy and its storage."""

    __slots__ = ("host", "storage")

    def __init__(self, host: torch.Tensor, storage: weakref.ref[torch.UntypedStorage]) -> None:
        self.host, self.storage = host, storage


class KeyedFloor:
    """The least a keyed swap hook written in Python does: per saved tensor a look-up of what a
    first pass found at its position (a parameter, a second save of a stored tensor, or a tensor
    to store), a storage check for the second saves, one copy into a slot allocated up front and
    one copy back. No guard, no never-move checks beyond the first pass, no accounting, no
    budget, no prefetch: a floor for hooks in Python, not something to train with.

    Example:
        >>> model, x = Workload("tiny", blocks=2, width=4, batch=1).build()
        >>> floor = KeyedFloor(model, x)
        >>> with floor():
        ...     _step(model, x)
        >>> len(floor.kinds), sorted(set(kind for kind, _ in floor.kinds))
        (5, ['dup', 'param', 'store'])
    """

    def __init__(self, model: nn.Module, x: torch.Tensor) -> None:
        self.kinds: list[tuple[str, Any]] = []
        first: dict[tuple[int, int], int] = {}

        def learn(t: torch.Tensor) -> torch.Tensor:
            base = t._base
            if (t.requires_grad and t.is_leaf) or (base is not None and base.requires_grad and base.is_leaf):
                self.kinds.append(("param", None))
            else:
                where = (t.untyped_storage()._cdata, t.storage_offset())
                if where in first:
                    self.kinds.append(("dup", first[where]))
                else:
                    first[where] = len(self.kinds)
                    self.kinds.append(("store", torch.empty_like(t)))
            return t

        with torch.autograd.graph.saved_tensors_hooks(learn, lambda t: t):
            _step(model, x)

    def __call__(self) -> AbstractContextManager[None]:
        kinds = self.kinds
        stored: dict[int, _Slot] = {}
        position = [0]

        def pack(t: torch.Tensor) -> Any:
            key = position[0]
            position[0] = key + 1
            kind, what = kinds[key]
            if kind == "param":
                return t
            if kind == "dup":
                slot = stored.get(what)
                if slot is not None and slot.storage() is t.untyped_storage():
                    return slot
            host = what if kind == "store" else torch.empty_like(t)
            host.copy_(t)
            slot = stored[key] = _Slot(host, weakref.ref(t.untyped_storage()))
            return slot

        def unpack(packed: Any) -> torch.Tensor:
            return packed.host.clone() if type(packed) is _Slot else packed

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class _Entry:
    """What the essential swap's pack returns for a stored tensor; on death it posts its position
    and bytes, so that its slot and host bytes are released at the next hook."""

    __slots__ = ("key", "host", "storage", "nbytes", "shape", "stride", "handles", "reads", "held_out", "sink", "__weakref__")

    def __init__(self, key: int, host: torch.Tensor, storage: weakref.ref[torch.UntypedStorage], nbytes: int,
                 sink: collections.deque[tuple[int, int]]) -> None:
        self.key, self.host, self.storage, self.nbytes, self.sink = key, host, storage, nbytes, sink
        self.shape, self.stride = host.shape, host.stride()
        self.handles, self.reads, self.held_out = 1, 0, None

    def __del__(self) -> None:
        self.sink.append((self.key, self.nbytes))


class EssentialSwap:
    """What a keyed swap hook in Python must do to be safe to train with, and nothing a runtime
    adds beyond it: the keyed floor plus, per saved tensor, a guard on the shape and dtype a first
    pass found at its position, the never-move checks (a parameter, a view of one, another
    layout), deduplication by storage, offset and version with the view matched, a slot that is
    not reused while an entry of an earlier iteration still holds it, host bytes counted from the
    copy to the entry's death (with their peak), and a rebuilt tensor counted resident until its
    storage dies. No lock, no timing, no budget, no prefetch, no streams: it stands between the
    keyed floor and a runtime, to tell what the runtime's further promises cost.

    Example:
        >>> model, x = Workload("tiny", blocks=2, width=4, batch=1).build()
        >>> essential = EssentialSwap(model, x)
        >>> with essential():
        ...     _step(model, x)
        >>> essential.peak_host_bytes, essential.host_bytes, essential.resident_bytes
        (48, 0, 0)
    """

    def __init__(self, model: nn.Module, x: torch.Tensor) -> None:
        self.guards: list[tuple[torch.Size, torch.dtype, torch.Tensor] | None] = []

        def learn(t: torch.Tensor) -> torch.Tensor:
            movable = t.layout is torch.strided and not (t.requires_grad and t.is_leaf)
            base = t._base
            if movable and base is not None and base.requires_grad and base.is_leaf:
                movable = False
            self.guards.append((t.shape, t.dtype, torch.empty_like(t)) if movable else None)
            return t

        with torch.autograd.graph.saved_tensors_hooks(learn, lambda t: t):
            _step(model, x)
        self.held: set[int] = set()
        self.released: collections.deque[tuple[int, int]] = collections.deque()
        self.dead: collections.deque[weakref.ref[torch.UntypedStorage]] = collections.deque()
        self.handed: dict[weakref.ref[torch.UntypedStorage], int] = {}
        self.host_bytes = self.peak_host_bytes = self.resident_bytes = 0

    def _drain(self) -> None:
        while self.released:
            key, nbytes = self.released.popleft()
            self.held.discard(key)
            self.host_bytes -= nbytes
        while self.dead:
            self.resident_bytes -= self.handed.pop(self.dead.popleft(), 0)

    def __call__(self) -> AbstractContextManager[None]:
        guards, held, released, dead, handed = self.guards, self.held, self.released, self.dead, self.handed
        dedupe: dict[tuple[int, int, int], weakref.ref[_Entry]] = {}
        position = [0]

        def pack(t: torch.Tensor) -> Any:
            key = position[0]
            position[0] = key + 1
            guard = guards[key] if key < len(guards) else None
            if guard is None or t.dtype is not guard[1] or t.shape != guard[0] or t.layout is not torch.strided:
                return t.detach()
            if released or dead:
                self._drain()
            storage = t.untyped_storage()
            where = (storage._cdata, t.storage_offset(), t._version)
            ref = dedupe.get(where)
            entry = ref() if ref is not None else None
            if entry is not None and entry.storage() is storage and entry.shape == t.shape and entry.stride == t.stride():
                entry.handles += 1
                return entry
            base = t._base
            if (type(t) is not torch.Tensor or (t.requires_grad and t.is_leaf) or key in held
                    or (base is not None and base.requires_grad and base.is_leaf) or not t.is_contiguous()):
                return t.detach()
            host = guard[2]
            host.copy_(t)
            held.add(key)
            nbytes = host.numel() * host.element_size()
            entry = _Entry(key, host, weakref.ref(storage), nbytes, released)
            dedupe[where] = weakref.ref(entry)
            self.host_bytes += nbytes
            if self.host_bytes > self.peak_host_bytes:
                self.peak_host_bytes = self.host_bytes
            return entry

        def unpack(packed: Any) -> torch.Tensor:
            if type(packed) is not _Entry:
                return packed
            out = packed.held_out
            if out is None:
                if released or dead:
                    self._drain()
                out = packed.host.clone()
                handed[weakref.ref(out.untyped_storage(), dead.append)] = packed.nbytes
                self.resident_bytes += packed.nbytes
            packed.reads += 1
            packed.held_out = out if packed.reads < packed.handles else None
            return out

        return self._installed(pack, unpack)

    @contextmanager
    def _installed(self, pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
        self._drain()  # what died in backward


def _runs(model: nn.Module, x: torch.Tensor, policies: tuple[str, ...], budgets: tuple[float | None, ...]) -> list[_Run]:
    """Every run: on ``model`` itself, but for a runtime that may recompute, on a copy of its own
    (same weights): it attaches hooks to the modules it recomputes, which would tax every other run
    on a shared model, and a copy is not the original's equal either (its memory lies elsewhere:
    1-4% apart here), so only those runs take one."""
    runs = [
        _Run("plain", None, None, nullcontext, model),
        _Run("save_on_cpu", None, None, torch.autograd.graph.save_on_cpu, model),
        _Run("copying offload", None, None, copying_offload, model),
        _Run("keyed floor", None, None, KeyedFloor(model, x), model),
        _Run("essential swap", None, None, EssentialSwap(model, x), model),
    ]
    if any(policy in RECOMPUTING_POLICIES for policy in policies):
        runs.append(_Run(CHECKPOINT_RUN, None, None, nullcontext, checkpointed_copy(model)))
    for budget in budgets:
        for policy in policies:
            own = model
            rt = cswap.Runtime(policy, device="cpu", min_bytes=0, model=own, memory_budget=budget)
            if rt.recomputes:
                own = copy.deepcopy(model)
                rt = cswap.Runtime(policy, device="cpu", min_bytes=0, model=own, memory_budget=budget)
            suffix = "" if budget is None else f" @{budget}"
            runs.append(_Run(f"{policy}{suffix}", policy, budget, rt.iteration, own, rt))
    return runs


#: The yardstick of the policies that recompute without a budget (:func:`checkpointed_copy`: what ``ac-full`` does with torch alone).
CHECKPOINT_RUN = "checkpoint per block"


def checkpointed_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (same weights) with torch's composable checkpoint on each of its blocks:
    what ``ac-full`` does to the workload's model with torch alone. On a copy, as its hooks would
    tax every other run on a shared model.

    Example:
        >>> model, x = Workload("tiny", blocks=2, width=4, batch=1).build()
        >>> torch.equal(checkpointed_copy(model)(x), model(x))
        True
    """
    from torch.distributed._composable import checkpoint

    own = copy.deepcopy(model)
    for block in own.children():
        checkpoint(block)
    return own


def _warm_up(run: _Run, x: torch.Tensor, iterations: int) -> None:
    for _ in range(iterations):
        profiled = run.runtime.stats().profiled_iterations if run.runtime is not None else 0
        started = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with run.context():
                    _step(run.model, x)
        except BudgetError as error:
            run.error = error
            return
        if run.runtime is not None and run.runtime.stats().profiled_iterations > profiled:
            run.profiling_s.append(time.perf_counter() - started)


def measure(workload: Workload, rounds: int, policies: tuple[str, ...] = RUNTIME_POLICIES,
            budgets: tuple[float | None, ...] = (None, 0.5), warmup: int = 4, seed: int = 0) -> list[dict[str, object]]:
    """Median iteration seconds of every run on ``workload``, interleaved over ``rounds`` (in an order
    shuffled per round from ``seed``)."""
    model, x = workload.build()
    saved = _saved_per_iteration(model, x)
    runs = _runs(model, x, policies, budgets)
    for run in runs:
        _warm_up(run, x, warmup)
    timed = [run for run in runs if run.error is None]
    times: dict[str, list[float]] = {run.name: [] for run in timed}
    # per round, the hooks' own microseconds per pack and per unpack: a median of rounds, as a
    # garbage collection that lands in one hook would swamp a mean
    hook_us: dict[str, list[tuple[float, float]]] = {run.name: [] for run in timed if run.runtime is not None}
    # Each round takes the runs in a new order (seeded): what a run leaves behind (the allocator's
    # free lists, caches after a compressing run's large buffers) slows the next one, and in a
    # fixed order it would always slow the same one.
    shuffle = random.Random(seed).shuffle
    for _ in range(rounds):
        order = list(timed)
        shuffle(order)
        for run in order:
            start = run.runtime.stats() if run.runtime is not None else None
            started = time.perf_counter()
            with run.context():
                _step(run.model, x)
            times[run.name].append(time.perf_counter() - started)
            if run.runtime is not None and start is not None:
                end = run.runtime.stats()
                hook_us[run.name].append(((end.pack_s - start.pack_s) / max(end.packed_tensors - start.packed_tensors, 1) * 1e6,
                                          (end.unpack_s - start.unpack_s) / max(end.unpacks - start.unpacks, 1) * 1e6))
    plain = statistics.median(times["plain"])
    on_cpu = statistics.median(times["save_on_cpu"])
    copying = statistics.median(times["copying offload"])
    checkpointed = statistics.median(times[CHECKPOINT_RUN]) if CHECKPOINT_RUN in times else None
    rows: list[dict[str, object]] = []
    for run in runs:
        row: dict[str, object] = {"workload": workload.name, "run": run.name, "policy": run.policy, "memory_budget": run.budget,
                                  "saved_tensors": saved, "rounds": rounds}
        if run.error is not None:
            row.update(infeasible=True, least_budget_fraction=run.error.minimum_fraction)
        else:
            median = statistics.median(times[run.name])
            row.update(
                median_s=round(median, 6),
                vs_plain=round(median / plain, 3),
                vs_save_on_cpu=round(median / on_cpu, 3),
                vs_copying_offload=round(median / copying, 3),
                us_per_saved_tensor_over_plain=round((median - plain) / saved * 1e6, 2),
            )
            if checkpointed is not None:
                row.update(vs_checkpoint_per_block=round(median / checkpointed, 3))
            if run.runtime is not None:
                row.update(
                    pack_us=round(statistics.median(p for p, _ in hook_us[run.name]), 2),
                    unpack_us=round(statistics.median(u for _, u in hook_us[run.name]), 2),
                    profiled_iterations=run.runtime.stats().profiled_iterations,
                )
            if run.profiling_s:
                # the last profiling iteration of the warm-up (the first also pays one-off set-up)
                row.update(profiling_s=round(run.profiling_s[-1], 6), profiling_vs_planned=round(run.profiling_s[-1] / median, 2))
        row.update(torch_threads=torch.get_num_threads(), cpus=os.cpu_count(), torch=torch.__version__,
                   python=sys.version.split()[0], date=time.strftime("%Y-%m-%d"))
        rows.append(row)
    return rows


#: The figures :func:`combine` takes the median of across processes.
COMBINED = ("median_s", "vs_plain", "vs_save_on_cpu", "vs_copying_offload", "vs_checkpoint_per_block", "us_per_saved_tensor_over_plain",
            "pack_us", "unpack_us", "profiling_s", "profiling_vs_planned")


def combine(runs: list[list[dict[str, object]]]) -> list[dict[str, object]]:
    """One row per (workload, run) from the rows of several processes (``runs``, one list each):
    the median of each figure of :data:`COMBINED`, the least and most ratio to ``save_on_cpu``, and
    how many processes measured it. A run infeasible in any process is reported infeasible, with
    the largest least budget any of them found.

    Example:
        >>> a = [{"workload": "w", "run": "swap", "median_s": 0.010, "vs_save_on_cpu": 1.2}]
        >>> b = [{"workload": "w", "run": "swap", "median_s": 0.012, "vs_save_on_cpu": 1.4}]
        >>> c = [{"workload": "w", "run": "swap", "median_s": 0.011, "vs_save_on_cpu": 1.3}]
        >>> row = combine([a, b, c])[0]
        >>> row["median_s"], row["vs_save_on_cpu"], row["vs_save_on_cpu_range"], row["processes"]
        (0.011, 1.3, [1.2, 1.4], 3)
    """
    grouped: dict[tuple[object, object], list[dict[str, object]]] = {}
    for rows in runs:
        for row in rows:
            grouped.setdefault((row["workload"], row["run"]), []).append(row)
    combined: list[dict[str, object]] = []
    for rows in grouped.values():
        out = dict(rows[0])
        out["processes"] = len(rows)
        infeasible = [row for row in rows if row.get("infeasible")]
        if infeasible:
            for name in COMBINED:
                out.pop(name, None)
            out.update(infeasible=True, least_budget_fraction=max(row["least_budget_fraction"] for row in infeasible))  # type: ignore[type-var]
        else:
            for name in COMBINED:
                values = [row[name] for row in rows if row.get(name) is not None]
                if values:
                    out[name] = round(statistics.median(values), 6)  # type: ignore[type-var]
            ratios = [row["vs_save_on_cpu"] for row in rows]
            out["vs_save_on_cpu_range"] = [min(ratios), max(ratios)]  # type: ignore[type-var]
        combined.append(out)
    return combined


def _in_processes(argv: list[str], processes: int) -> list[dict[str, object]]:
    """The rows of ``processes`` fresh runs of this script with ``argv``, one after another, combined."""
    runs = []
    for index in range(processes):
        done = subprocess.run([sys.executable, __file__, *argv, "--json", "--processes", "1", "--seed", str(index)],
                              check=True, capture_output=True, text=True)
        runs.append([json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")])
    return combine(runs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (medians over them)")
    parser.add_argument("--blocks", type=int, default=300, help="blocks of the many-small workload")
    parser.add_argument("--policies", default=",".join(RUNTIME_POLICIES), help="comma-separated runtime policies")
    parser.add_argument("--workloads", default="many-small,few-large", help="comma-separated workload names")
    parser.add_argument("--budgets", default="none,0.5", help="comma-separated memory budgets (none: without one)")
    parser.add_argument("--processes", type=int, default=1, help="fresh processes to measure in, one after another (medians over them)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rounds' shuffled order")
    parser.add_argument("--json", action="store_true", help="only the JSON lines")
    raw = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(raw)
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, not {args.processes}")
    torch.set_num_threads(1)
    policies = tuple(p for p in args.policies.split(",") if p)
    budgets = tuple(None if b == "none" else float(b) for b in args.budgets.split(",") if b)
    chosen = args.workloads.split(",")
    workloads = (Workload("many-small", blocks=args.blocks, width=32, batch=8), WORKLOADS[1])
    passed_on = [arg for arg in raw if arg != "--json"]
    for workload in (w for w in workloads if w.name in chosen):
        if args.processes > 1:
            rows = _in_processes([*_without(passed_on, "--processes"), "--workloads", workload.name], args.processes)
        else:
            rows = measure(workload, args.rounds, policies, budgets, seed=args.seed)
        for row in rows:
            print(json.dumps(row), flush=True)
        if not args.json:
            for row in rows:
                if row.get("infeasible"):
                    print(f"{workload.name:<11} {row['run']:<20} infeasible, least {row['least_budget_fraction']:.2f}", file=sys.stderr)
                else:
                    print(f"{workload.name:<11} {row['run']:<20} {row['median_s'] * 1e3:8.2f} ms  {row['vs_plain']:5.2f}x plain  "
                          f"{row['vs_save_on_cpu']:5.2f}x save_on_cpu  {row['vs_copying_offload']:5.2f}x copying  "
                          f"{row['us_per_saved_tensor_over_plain']:6.1f} us/tensor",
                          file=sys.stderr)


def _without(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its value (given as ``--option V`` or ``--option=V``), nor ``--workloads``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in (option, "--workloads"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


if __name__ == "__main__":
    main()
