"""The grader: one line that says whether an exercise is right everywhere and how fast it is."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import bench, build, check, exercises, steps
from .problem import TOY, Shape, make_inputs

DTYPES = (torch.float32, torch.bfloat16)
TIMING_SHAPE = TOY


@dataclass
class GradeResult:
    exercise: str
    status: str  # "correct", "wrong", "not implemented", "build failed", "no gpu", "needs hopper"
    line: str
    verdicts: list[check.Verdict] = field(default_factory=list)
    timings: list[bench.Timing] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "correct"

    def __str__(self) -> str:
        return self.line


def grade(
    exercise: str,
    variant: str | None = None,
    shapes: tuple[Shape, ...] = check.SHAPE_MATRIX,
    quiet: bool = False,
) -> GradeResult:
    """Grade one exercise: stubs, build, the whole shape matrix in both dtypes, then speed.

    variant: "exercise" (the learner's file, default) or "solution"; MLA_LAB_EXERCISE_SOURCE sets
    the default. Prints the verdict line (and each failing case) unless quiet.
    """
    step = steps.get(exercise)
    if step.exercise is None:
        raise ValueError(f"{step.label} is a lecture step, not an exercise")
    variant = variant or steps.exercise_variant()
    source = step.source(variant)
    shown = source.relative_to(steps.REPO) if source.is_relative_to(steps.REPO) else source
    name = f"{step.exercise} ({shown})"
    result = _grade(step, variant, source, name, shapes)
    if not quiet:
        print(result.line)
        for verdict in [v for v in result.verdicts if not v.ok][:5]:
            print(f"  {verdict}")
    return result


def _compiled_only(step: steps.Step, source, name: str, status: str, why: str) -> GradeResult:
    """Where the learner's kernel cannot run: what the compiler says of it, and why it cannot run."""
    compiled, report = build.compile_report(source, step.arch_flags, step.defines)
    if not compiled:
        return GradeResult(step.exercise, "build failed", f"{name}: did not compile:\n{report}")
    return GradeResult(step.exercise, status, f"{name}: {report}; {why}")


def _grade(step: steps.Step, variant: str, source, name: str, shapes) -> GradeResult:
    stubs = exercises.stub_lines(source)
    if stubs:
        lines = ("line " if len(stubs) == 1 else "lines ") + ", ".join(map(str, stubs))
        return GradeResult(
            step.exercise,
            "not implemented",
            f"{name}: not implemented yet: replace the TODO stubs ({lines}) with your code, "
            "then grade again",
        )
    problem = build.run_problem()
    if problem:
        return _compiled_only(step, source, name, "no gpu", f"cannot run here ({problem})")
    if step.arch_flags and torch.cuda.get_device_capability() != (9, 0):
        return _compiled_only(step, source, name, "needs hopper",
                              f"its kernel runs on sm_90 (Hopper) GPUs only, and on this "
                              f"{torch.cuda.get_device_name()} step {step.fallback}'s kernel would run instead: "
                              "nothing of yours to check or time here")
    try:
        kernel = steps.load(step, variant)
    except build.BuildError as error:
        return GradeResult(step.exercise, "build failed", f"{name}: {error}")

    verdicts = check.check_matrix(kernel, "cuda", shapes, DTYPES)
    failed = [v for v in verdicts if not v.ok]
    if failed:
        return GradeResult(
            step.exercise,
            "wrong",
            f"{name}: wrong on {len(failed)} of {len(verdicts)} checks; the smallest: "
            f"{min(failed, key=lambda v: v.shape.flops())}",
            verdicts,
        )

    contenders = {step.label: kernel}
    previous = next((s for s in steps.STEPS if s.number == step.number - 1), None)
    if previous is not None:
        contenders[previous.label] = steps.load(previous, "solution")
    # Timed in the first dtype the learner's own kernel takes at the toy (step 6 runs bf16 only;
    # in fp32 its fallback's kernel would be timed instead).
    dtype = next((d for d in DTYPES if kernel.takes_fast_path(*make_inputs(TIMING_SHAPE, d, "cuda", 0))), DTYPES[0])
    timings = bench.compare(contenders, TIMING_SHAPE, dtype, "graph")
    # Checked again after hundreds of graph replays: a kernel that is right only on its first
    # call, or only on the inputs it was timed on, fails here.
    after = check.check(kernel, TIMING_SHAPE, dtype, "cuda")
    if not after.ok:
        return GradeResult(step.exercise, "wrong", f"{name}: wrong after timing: {after}", [after])

    worst = {
        dtype: max(v.rel_error for v in verdicts if v.dtype == dtype) for dtype in DTYPES
    }
    by_name = {t.name: t.median_us for t in timings}
    mine = by_name[step.label]
    speed = [f"toy {bench.dtype_label(dtype)} {mine:.1f} us"]
    if previous is not None:
        speed.append(f"{by_name[previous.label] / mine:.2f}x step {previous.number}")
    speed.append(f"{by_name['eager'] / mine:.2f}x eager ({by_name['eager']:.1f} us)")
    errors = ", ".join(f"{worst[d]:.1e} {check.dtype_name(d)}" for d in DTYPES)
    line = (
        f"{name}: correct on {len(shapes)}/{len(shapes)} shapes x fp32 and bf16 "
        f"(worst rel. error {errors}); {', '.join(speed)} [{torch.cuda.get_device_name()}]"
    )
    return GradeResult(step.exercise, "correct", line, verdicts, timings)
