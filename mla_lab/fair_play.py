"""What a correct-looking kernel must also do, checked by the grader after the shape matrix passes.

A kernel can match float64 on every shape and still be unfit to ship: it may overwrite an input
it was lent, hand back an earlier call's output, launch on a stream of its own (so that the
caller's next kernel races it), or post a time no real computation reaches. Each check answers
None when the kernel plays fair, else one line naming the rule and the fix. The first two run on
any device (tests/test_fair_play.py feeds them planted Python kernels on the CPU); the stream
check needs a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import check
from .problem import Shape, make_inputs, oracle

NAMES = ("hidden", "w_down", "w_up_k", "w_up_v")


def inputs_untouched(kernel: Callable, shape: Shape, dtype: torch.dtype, device: str | torch.device) -> str | None:
    """The inputs are the caller's: after a call each must hold exactly what it held before."""
    inputs = make_inputs(shape, dtype, device, seed=11)
    before = [t.clone() for t in inputs]
    check.run_poisoned(kernel, inputs, shape.heads, shape)
    changed = [name for name, old, new in zip(NAMES, before, inputs) if not torch.equal(old, new)]
    if changed:
        return (f"modified its inputs ({', '.join(changed)}): a kernel may only write `out`; keep scratch "
                "values in registers, shared memory or the workspace")
    return None


def output_not_carried_over(kernel: Callable, shape: Shape, dtype: torch.dtype,
                            device: str | torch.device) -> str | None:
    """Two calls into the same output, on new input values at the same addresses: the second
    output must be the new inputs' projection (not a result kept from the first call, by a cache
    keyed on addresses or a static buffer)."""
    inputs = make_inputs(shape, dtype, device, seed=21)
    fresh = make_inputs(shape, dtype, device, seed=22)
    out = torch.full(shape.out_shape, float("nan"), dtype=dtype, device=device)
    kernel(*inputs, shape.heads, out=out)
    first = out.clone()
    for kept, new in zip(inputs, fresh):
        kept.copy_(new)
    out.fill_(float("nan"))
    kernel(*inputs, shape.heads, out=out)
    verdict = check.compare(out, oracle(fresh, shape.heads), dtype, shape, check.tolerance(kernel, dtype))
    if verdict.ok:
        return None
    if bool(out.isnan().all()):
        return ("wrote nothing on a second call with new inputs at the same addresses (a result kept from the "
                "first call?): compute on every call, keep nothing between calls")
    if torch.equal(out, first):
        return ("returned the first call's output on a second call with new inputs at the same addresses: compute "
                "on every call, keep nothing between calls")
    return f"was wrong on a second call with new inputs at the same addresses: {verdict.problem}"


def on_current_stream(kernel: Callable, shape: Shape, dtype: torch.dtype) -> str | None:
    """The kernel runs on torch.cuda.current_stream(): queued behind a long wait on a side stream
    made current, its output must not appear before the wait ends.

    A watcher stream reads the output while the wait runs. Whether that read came before the wait
    ended is told by two events' timestamps, not by the host's clock: a slow host launch (a first
    call, a busy CPU) must not pass for a kernel that jumped the queue. A read that came too late to
    tell is tried again behind a longer wait."""
    inputs = make_inputs(shape, dtype, "cuda", seed=31)
    side, watcher = torch.cuda.Stream(), torch.cuda.Stream()
    for cycles in (200_000_000, 800_000_000, 3_200_000_000):  # about 0.1, 0.4 and 1.6 s at GPU clocks
        out = torch.full(shape.out_shape, float("nan"), dtype=dtype, device="cuda")
        wait_over = torch.cuda.Event(enable_timing=True)
        read_done = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            wait_over.record()
            kernel(*inputs, shape.heads, out=out)
        # torch's streams do not wait for one another, so the watcher sees whatever was written by now.
        with torch.cuda.stream(watcher):
            written = out.isfinite().any()
            read_done.record()
        torch.cuda.synchronize()
        if read_done.elapsed_time(wait_over) > 0:  # the read finished while the wait still ran
            if bool(written):
                return ("wrote its output before the work queued ahead of it on the current stream finished: "
                        "launch on the stream the binding passes (torch.cuda.current_stream()), not stream 0 or "
                        "a stream of your own")
            return None
    return None


def faster_than_floor(median_us: float, floor_us: float | None) -> str | None:
    """A time below the roofline floor (the fewest bytes at the measured copy rate, or the FLOPs at
    the measured matmul rate) is a kernel that skipped work, or a timing that missed it."""
    if floor_us is not None and median_us < floor_us:
        return (f"timed at {median_us:.2f} us, below the roofline floor of {floor_us:.2f} us on this GPU: no "
                "kernel that does all the work can be that fast; check that every call computes every output")
    return None


def precision_note(dtype: torch.dtype, rel_error: float, fp32_math: str) -> str:
    """For an fp32 kernel held to fp32's tolerance whose error is the size TF32 gives: say so."""
    if dtype == torch.float32 and fp32_math == "fp32" and check.TOLERANCE[dtype] < rel_error <= check.TF32_TOLERANCE:
        return (f"; an error of {rel_error:.1e} is what TF32 gives (operands rounded to 10 bits): this step's fp32 "
                "path must keep fp32's accuracy (FFMA, or three TF32 passes)")
    return ""
