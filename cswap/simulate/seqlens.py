"""Several sequence lengths served by one plan: the plan made for the longest, carried out at each shorter one.

Transformers are trained with dynamic padding and variable lengths, so every step has its own
shape. The runtime serves every shorter length with the plan it made for the longest length seen:
the shorter step saves the same tensors in the same order (its **structure**: per record, the
dtype and the rank), each no larger than planned, so every per-tensor decision holds and the
resident bytes stay within the budget. What that costs is time: the plan was made for the longest
length's sizes and timings, not for this one's.

* :func:`parse_seq_lens` reads ``--seq-len``: one length (``512``), a list (``128,256,512``) or a
  range (``128-1024``: its ends and the powers of two between, at most :data:`MOST_PICKED` lengths,
  :func:`pick_lengths`).
* :func:`check_same_structure` verifies that a shorter trace has the longest one's structure, every
  tensor no larger.
* :func:`serve_plan` carries out, on a shorter trace, the plan a policy or strategy ran with on the
  longest (the same action for every record, by key; the same prefetch distances and budget where
  the planner made it), and gives the queue model's result: its time, and its peak.

Comparing that time with a plan made for the shorter length itself (the same policy run on the
shorter trace) gives the cost of serving it with the longest length's plan.

Example:
    >>> parse_seq_lens("128-1024").lengths, parse_seq_lens("512,128").lengths, parse_seq_lens("512").several
    ((128, 256, 512, 1024), (128, 512), False)
    >>> pick_lengths(100, 5000)
    (100, 128, 512, 1024, 4096, 5000)
    >>> from cswap.simulate import Simulator
    >>> from cswap.simulate.lmtrace import transformer_trace
    >>> long = Simulator(transformer_trace("gpt2", seq_len=64, num_layers=1), "h100-pcie5")
    >>> short = Simulator(transformer_trace("gpt2", seq_len=32, num_layers=1), "h100-pcie5")
    >>> check_same_structure(long.trace, short.trace)
    >>> planned = long.run("swap")
    >>> served = serve_plan(short, planned)
    >>> served.actions == planned.actions, served.peak_bytes <= planned.peak_bytes
    (True, True)
    >>> served.iteration_s >= short.run("swap").iteration_s
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cswap.planner import PlanningProblem
from cswap.profile.shapes import fits
from cswap.profile.trace import Trace
from cswap.simulate.budgeted import BudgetOutcome, planning_problem, replay_plan
from cswap.simulate.engine import PolicyResult, Simulator
from cswap.simulate.strategies import STRATEGIES, Strategies

__all__ = ["MOST_PICKED", "SeqLens", "check_same_structure", "parse_seq_lens", "pick_lengths", "serve_plan", "strategy_of"]

#: The most lengths a range is simulated at: its two ends and up to four powers of two between.
MOST_PICKED = 6

_FORMS = "give tokens per sequence (512), a range from the shortest to the longest (128-1024) or a list (128,256,512)"


@dataclass(frozen=True)
class SeqLens:
    """The sequence lengths ``--seq-len`` names.

    Attributes:
        lengths: ascending, without repeats; the last is the longest, whose plan serves them all.
        given: the text as given.
        picked: how the lengths were chosen: ``"given"`` (one length or a list), or for a range
            ``"the range's ends and the powers of two between"``.
    """

    lengths: tuple[int, ...]
    given: str
    picked: str = "given"

    @property
    def longest(self) -> int:
        """The length the plan is made for."""
        return self.lengths[-1]

    @property
    def several(self) -> bool:
        """More than one length: each shorter one is served by the longest's plan."""
        return len(self.lengths) > 1


def pick_lengths(first: int, last: int, most: int = MOST_PICKED) -> tuple[int, ...]:
    """The lengths a range ``first-last`` is simulated at: both ends and the powers of two strictly
    between; where there are more than ``most - 2`` of those, ``most - 2`` of them spread evenly
    (the powers of two are evenly spread on a log scale already).

    Example:
        >>> pick_lengths(128, 1024), pick_lengths(128, 256), pick_lengths(1, 65536)
        ((128, 256, 512, 1024), (128, 256), (1, 2, 64, 1024, 32768, 65536))
    """
    if not 0 < first < last:
        raise ValueError(f"a range of lengths goes from a positive length to a longer one, got {first}-{last}")
    if most < 2:
        raise ValueError(f"a range is simulated at its two ends at least: most must be >= 2, got {most}")
    powers = [1 << k for k in range(last.bit_length()) if first < 1 << k < last]
    room = most - 2
    if len(powers) > room:
        powers = [powers[round(i * (len(powers) - 1) / (room - 1))] for i in range(room)] if room > 1 else powers[:room]
    return (first, *powers, last)


def parse_seq_lens(value: str | int | None) -> SeqLens | None:
    """Read ``--seq-len``: ``None`` (the model's own), one length, a comma-separated list, or a
    range ``A-B`` with ``A < B`` (:func:`pick_lengths`).

    Raises:
        ValueError: a value that is none of these (saying which forms are), a length that is not
            positive, or a range whose first length is not below its last.

    Example:
        >>> parse_seq_lens("256, 128,256")
        SeqLens(lengths=(128, 256), given='256, 128,256', picked='given')
        >>> parse_seq_lens("512-128")
        Traceback (most recent call last):
        ...
        ValueError: --seq-len 512-128: a range goes from the shortest length to the longest, e.g. 128-512
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"--seq-len {value!r} is not a length: {_FORMS}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"--seq-len {value}: a length must be a positive number of tokens")
        return SeqLens((value,), str(value))
    text = str(value).strip()
    ranged = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if ranged:
        first, last = int(ranged.group(1)), int(ranged.group(2))
        if first < 1:
            raise ValueError(f"--seq-len {text}: a length must be a positive number of tokens")
        if first >= last:
            hint = f"{last}-{first}" if first > last else f"{first} for one length"
            raise ValueError(f"--seq-len {text}: a range goes from the shortest length to the longest, e.g. {hint}")
        return SeqLens(pick_lengths(first, last), str(value), "the range's ends and the powers of two between")
    items = [item.strip() for item in text.split(",")]
    if not text or not all(re.fullmatch(r"\d+", item) for item in items):
        raise ValueError(f"--seq-len {str(value)!r} is not a length: {_FORMS}")
    lengths = tuple(sorted({int(item) for item in items}))
    if lengths[0] < 1:
        raise ValueError(f"--seq-len {text}: a length must be a positive number of tokens")
    return SeqLens(lengths, str(value))


def check_same_structure(longest: Trace, shorter: Trace, what: str = "") -> None:
    """Check that ``shorter`` saves the tensors ``longest`` does, in the same order, each with the
    same dtype, rank and producer, no larger in any dimension, and moved or not alike, as a plan
    made on ``longest`` needs to serve it: the runtime's structure (:mod:`cswap.profile.shapes`:
    dtype and rank per pack, every shape :func:`~cswap.profile.shapes.fits` the planned one), and
    the same producer per record, which a meta trace names.

    ``what``: how to name the shorter trace in the error (``"at 128 tokens"``).

    Raises:
        ValueError: the first difference, naming the record.
    """
    where = f" {what}" if what else ""
    if len(shorter.tensors) != len(longest.tensors):
        raise ValueError(
            f"the trace{where} saves {len(shorter.tensors)} tensors, the longest length's {len(longest.tensors)}: "
            "its plan cannot serve it (the model's structure changes with the length)"
        )
    for index, (big, small) in enumerate(zip(longest.tensors, shorter.tensors)):
        same = small.dtype == big.dtype and small.producer == big.producer and small.offloadable == big.offloadable
        if not same or not fits(tuple(small.shape), tuple(big.shape)) or small.nbytes > big.nbytes:
            raise ValueError(
                f"record {index} of the trace{where} ({small.producer or 'no producer'}: {small.dtype} {tuple(small.shape)}) "
                f"differs from the longest length's ({big.producer or 'no producer'}: {big.dtype} {tuple(big.shape)}): "
                "its plan cannot serve it (the model's structure changes with the length)"
            )


def strategy_of(result: PolicyResult) -> str | None:
    """The strategy whose plan ``result`` carried out (:data:`cswap.simulate.strategies.STRATEGIES`):
    its policy, or for ``cswap`` the strategy its plan came from (``"ac-full plan"``); else None.

    Example:
        >>> from dataclasses import replace
        >>> from cswap.simulate import Simulator, meta_trace
        >>> result = Simulator(meta_trace("vgg11", 2, 32, width_mult=0.125), "v100-pcie3").run("swap")
        >>> strategy_of(result), strategy_of(replace(result, policy="cswap", plan="ac-full plan"))
        (None, 'ac-full')
    """
    if result.policy in STRATEGIES:
        return result.policy
    name = result.plan.removesuffix(" plan")
    return name if result.plan.endswith(" plan") and name in STRATEGIES else None


def serve_plan(
    shorter: Simulator,
    planned: PolicyResult | BudgetOutcome,
    problem: PlanningProblem | None = None,
    strategies: Strategies | None = None,
) -> PolicyResult:
    """The queue model's result of carrying out, on ``shorter``'s trace, the plan ``planned`` ran with
    on a longer trace of the same structure (:func:`check_same_structure`; check it first).

    Every record takes the action it took there, by key. A plan from the budgeted planner keeps its
    prefetch distances and its budget (the queue model holds it: :func:`cswap.simulate.budgeted.replay_plan`);
    a fixed strategy's (checkpointing, offloading, also as ``cswap``'s plan) runs with its regions and
    prefetch on ``shorter``'s trace; anything else (a policy without a budget, the recompute knapsack)
    runs as it ran there, with the simulator's own prefetch.

    Args:
        shorter: the simulator of the shorter trace.
        planned: what ran on the longer trace: a :class:`PolicyResult` without a budget, or a feasible
            :class:`~cswap.simulate.budgeted.BudgetOutcome` under one.
        problem: :func:`cswap.simulate.budgeted.planning_problem` of ``shorter``, when the caller has it.
        strategies: the strategies on ``shorter``, when the caller has them.

    Raises:
        ValueError: an infeasible outcome (there is no plan to serve with), or actions that do not
            match ``shorter``'s trace.
    """
    if isinstance(planned, BudgetOutcome):
        if planned.result is None:
            raise ValueError(f"{planned.policy} has no plan within the budget: there is nothing to serve shorter lengths with")
        result, budget_plan = planned.result, planned.plan
    else:
        result, budget_plan = planned, None
    strategy = strategy_of(result)
    if strategy is not None and not STRATEGIES[strategy].budgeted:
        strategies = strategies or Strategies(shorter)
        return strategies.carry_out(strategy, result.actions, policy=result.policy, label=result.plan)
    if budget_plan is not None:
        problem = problem or planning_problem(shorter)[0]
        return replay_plan(shorter, problem, budget_plan, result.policy, result.plan, actions=result.actions)
    return shorter.run_plan(result.actions, policy=result.policy, plan=result.plan)
