"""The objective: representative tensors, real CPU timing, failures as inf, no tuning on the simulator."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

import cswap.tuner.objective as objective_module
from cswap.tuner.objective import KernelObjective, check_tunable, representative_tensor

NBYTES = 1 << 14  # tiny: these tests check values, not speed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int32, torch.bool])
@pytest.mark.parametrize("density", [0.5, 0.1])
def test_representative_tensor_has_the_size_and_density(dtype: torch.dtype, density: float) -> None:
    t = representative_tensor(dtype, 1 << 16, density=density, seed=3)
    assert t.dtype == dtype and t.dim() == 1
    assert t.numel() * t.element_size() == 1 << 16
    assert abs(float((t != 0).float().mean()) - density) < 0.03
    if dtype.is_floating_point:
        assert float(t.min()) >= 0.0  # post-ReLU
    assert torch.equal(t, representative_tensor(dtype, 1 << 16, density=density, seed=3))


def test_representative_tensor_bad_input() -> None:
    with pytest.raises(ValueError, match="density is 1.5"):
        representative_tensor("float32", 64, density=1.5)
    with pytest.raises(ValueError, match="unsupported dtype 'complex64'"):
        representative_tensor("complex64", 64)
    assert representative_tensor(torch.float64, 3).numel() == 1  # at least one element


@pytest.mark.parametrize("op", ["compress", "decompress"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_objective_times_valid_configs(op: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel really runs (and round-trips); its seconds come from an injected timer."""
    timings = iter([3e-3, 1e-3, 2e-3, 7e-3, 5e-3, 6e-3])
    ran: list[object] = []

    def time_call_s(call, device) -> float:
        ran.append(call())
        return next(timings)

    monkeypatch.setattr(objective_module, "time_call_s", time_call_s)
    objective = KernelObjective("cpu", op, dtype, NBYTES, repeats=3)
    assert objective.kernel == f"zvc.cpu.{op}"
    seconds = [objective(params) for params in ({"threads": 1, "chunk_words": 16},
                                                {"threads": os.cpu_count() or 1, "chunk_words": 1024})]
    assert objective.failures == {}
    assert seconds == [2e-3, 6e-3]  # the median of each config's three timings
    assert len(ran) == 6 and all(result is not None for result in ran)


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"threads": 1, "chunk_words": 0}, "chunk_words is 0"),
        ({"threads": (os.cpu_count() or 1) + 1, "chunk_words": 32}, "threads is"),
        ({"threads": 1, "warps": 4}, "unknown keys \\['warps'\\]"),
    ],
)
def test_a_config_that_cannot_launch_scores_inf(params: dict[str, int], problem: str) -> None:
    objective = KernelObjective("cpu", "compress", "float32", NBYTES, repeats=1)
    assert objective(params) == math.inf
    (message,) = objective.failures.values()
    assert "ValueError" in message and problem.replace("\\", "") in message
    assert objective({"threads": 1, "chunk_words": 32}) < math.inf  # and the next config still runs


def test_a_config_with_wrong_output_scores_inf(monkeypatch: pytest.MonkeyPatch) -> None:
    real_compress = objective_module.compress

    def lossy(t, **kwargs):
        packed = real_compress(t, **kwargs)
        return dataclasses.replace(packed, values=packed.values ^ 1)

    monkeypatch.setattr(objective_module, "compress", lossy)
    objective = KernelObjective("cpu", "compress", "int32", NBYTES, repeats=1)
    assert objective({"threads": 1, "chunk_words": 32}) == math.inf
    assert "did not round-trip bit-exactly" in next(iter(objective.failures.values()))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown op 'squash'"):
        KernelObjective("cpu", "squash", "float32", NBYTES)
    with pytest.raises(ValueError, match="unknown kernel 'zvc.torch.compress'"):
        KernelObjective("torch", "compress", "float32", NBYTES)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        KernelObjective("cpu", "compress", "float32", NBYTES, repeats=0)


def test_cuda_is_never_tuned_on_the_simulator_or_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    with pytest.raises(RuntimeError, match="refusing to tune zvc.cuda under the Numba CUDA simulator"):
        check_tunable("cuda")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="torch sees no GPU.*--backend cpu"):
        KernelObjective("cuda", "compress", "float32", NBYTES)
    assert check_tunable("cpu") == torch.device("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("op", ["compress", "decompress"])
def test_cuda_objective_on_a_gpu(op: str) -> None:
    objective = KernelObjective("cuda", op, "float32", 1 << 20, repeats=3)
    assert objective.tensor.is_cuda
    block = f"{op}_block"
    assert 0.0 < objective({block: 256}) < 1.0, objective.failures
    assert objective({block: 2000}) == math.inf
    assert f"{block} is 2000" in next(iter(objective.failures.values()))
