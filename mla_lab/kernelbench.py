"""The operator as a KernelBench-style problem, and an evaluator for any `ModelNew` file.

KernelBench problems are Python files with a `Model` (the reference), module-level
`get_inputs()` and `get_init_inputs()`, and candidates define `ModelNew` with the same interface.
`kernels/kernelbench_mla.py` is such a file; `python -m mla_lab kernelbench FILE` evaluates a
candidate the way those harnesses do: seeded correctness trials with allclose, then CUDA-event
timing with the L2 cache flushed between trials, reported as speed-up over `Model`.
"""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import torch
from torch import nn

from . import steps
from .problem import TOY, make_inputs, reference

ATOL_RTOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


class Model(nn.Module):
    """hidden (B, S, D) -> reshape -> latent = @ w_down -> k, v = latent @ w_up_k, w_up_v -> stack."""

    def __init__(self, heads: int = TOY.heads) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, hidden, w_down, w_up_k, w_up_v):
        return reference(hidden, w_down, w_up_k, w_up_v, self.heads)


def get_inputs() -> list[torch.Tensor]:
    """Toy-size fp32 inputs, drawn from torch's global generator (harnesses seed it)."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    return list(make_inputs(TOY, torch.float32, "cpu", seed=seed))


def get_init_inputs() -> list[int]:
    return [TOY.heads]


def model_new(step: int | str) -> type[nn.Module]:
    """A ModelNew class whose forward runs one course step's kernel."""
    chosen = steps.get(step)

    class ModelNew(Model):
        step_name = chosen.name

        def __init__(self, heads: int = TOY.heads) -> None:
            super().__init__(heads)
            self.kernel = steps.load(chosen)

        def forward(self, hidden, w_down, w_up_k, w_up_v):
            return self.kernel(hidden, w_down, w_up_k, w_up_v, self.heads)

    ModelNew.__name__ = ModelNew.__qualname__ = f"ModelNew_{chosen.name}"
    return ModelNew


def load_file(path: str | Path):
    """Import a problem or candidate file by path, as KernelBench tools do."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def evaluate(
    candidate_file: str | Path,
    trials: int = 5,
    timing_trials: int = 100,
    dtype: torch.dtype = torch.float32,
    seed: int = 42,
) -> str:
    """Correctness over fresh seeded inputs, then timing; one summary line."""
    candidate = load_file(candidate_file)
    init = get_init_inputs()
    reference_model = Model(*init).cuda()
    new_model = candidate.ModelNew(*init).cuda()
    tolerance = ATOL_RTOL[dtype]
    for trial in range(trials):
        torch.manual_seed(seed + trial)
        inputs = [t.to("cuda", dtype) for t in get_inputs()]
        expected = reference_model(*inputs)
        got = new_model(*inputs)
        if got.shape != expected.shape or not torch.allclose(got, expected, atol=tolerance, rtol=tolerance):
            worst = (got.float() - expected.float()).abs().max().item() if got.shape == expected.shape else float("nan")
            return f"{Path(candidate_file).name}: incorrect on trial {trial} (shape {tuple(got.shape)}, max abs diff {worst:.3g})"
    torch.manual_seed(seed)
    inputs = [t.to("cuda", dtype) for t in get_inputs()]
    baseline_us = _time_with_flush(reference_model, inputs, timing_trials)
    new_us = _time_with_flush(new_model, inputs, timing_trials)
    return (
        f"{Path(candidate_file).name}: correct on {trials}/{trials} trials; "
        f"Model {baseline_us:.1f} us, ModelNew {new_us:.1f} us, speed-up {baseline_us / new_us:.2f}x "
        f"[{torch.cuda.get_device_name()}, median of {timing_trials}, L2 flushed, launched from Python]"
    )


def _time_with_flush(model: nn.Module, inputs: list[torch.Tensor], trials: int) -> float:
    """Median µs of single calls, each after overwriting a buffer larger than the L2 cache."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4 + 1, device="cuda")
    for _ in range(3):
        model(*inputs)
    times = []
    for _ in range(trials):
        flush.fill_(1.0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(*inputs)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)
