"""The grader: one line that says whether an exercise is right everywhere and how fast it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import bench, build, check, exercises, failure_map, fair_play, steps, sweep, writers
from .problem import TOY, Shape, make_inputs, oracle

DTYPES = (torch.float32, torch.bfloat16)
TIMING_SHAPE = TOY
# The step an exercise is timed beside: the one before it, except where the step before is built
# for other inputs (step 10 is fp32 prefill; decode's rival is step 6).
BASELINE_STEPS = {11: 6}
# Every exercise is timed at the toy, and those whose idea pays only at size also at the sweep
# point their idea is for: tiling and copies in flight at V2-Lite's prefill in fp32, tensor cores
# and Hopper's at the same in bf16, the decode step at one decode token.
IDEA_POINTS = {3: "v2_lite@4096 fp32", 4: "v2_lite@4096 fp32", 5: "v2_lite@4096 bf16", 6: "v2_lite@4096 bf16",
               11: "v2_lite@1 bf16"}


@dataclass
class GradeResult:
    exercise: str
    # "correct", "wrong", "breaks a rule" (mla_lab.fair_play), "not implemented", "build failed",
    # "no gpu", "needs hopper"
    status: str
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
    return _report(_grade(step, variant, source, name, shapes), quiet)


def grade_file(path, exercise: str, shapes: tuple[Shape, ...] = check.SHAPE_MATRIX, quiet: bool = False) -> GradeResult:
    """Grade any .cu file as if it were the learner's file of `exercise` (tests/wrong_kernels/ uses it)."""
    path = Path(path).resolve()
    step = steps.get(exercise)
    shown = path.relative_to(steps.REPO) if path.is_relative_to(steps.REPO) else path
    return _report(_grade(step, "exercise", path, f"{step.exercise} ({shown})", shapes), quiet)


def _report(result: GradeResult, quiet: bool) -> GradeResult:
    if not quiet:
        print(result.line)
        for verdict in [v for v in result.verdicts if not v.ok][:5]:
            print(f"  {verdict}")
    return result


def _load(step: steps.Step, variant: str, source) -> steps.Kernel:
    """The step's own file through the registry; any other file built as its own library."""
    if source == step.source(variant):
        return steps.load(step, variant)
    library = build.build_step(source, f"mla_graded_{source.stem}", step.arch_flags, step.defines)
    return steps.Kernel(step, source, library)


def _threads_of_wrong(step: steps.Step, kernel: steps.Kernel, verdict: check.Verdict) -> str:
    """For a step whose launch geometry mla_lab.writers knows: which threads wrote the wrong
    elements of a fresh run at the failing shape."""
    if step.number not in writers.KNOWN_STEPS:
        return ""
    inputs = make_inputs(verdict.shape, verdict.dtype, "cuda", seed=7)
    out = check.run_poisoned(kernel, inputs, verdict.shape.heads, verdict.shape)
    mask = failure_map.wrong_elements(out, oracle(inputs, verdict.shape.heads), check.tolerance(kernel, verdict.dtype))
    where = writers.written_by(step.number, mask.cpu(), verdict.shape, verdict.dtype, writers.Gpu.current())
    return f"; {where}" if where else ""


def _rule_broken(kernel: steps.Kernel, dtype: torch.dtype) -> str | None:
    for problem in (
        *(fair_play.inputs_untouched(kernel, TIMING_SHAPE, d, "cuda") for d in DTYPES),
        fair_play.output_not_carried_over(kernel, TIMING_SHAPE, dtype, "cuda"),
        fair_play.on_current_stream(kernel, TIMING_SHAPE, dtype),
    ):
        if problem:
            return problem
    return None


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
        kernel = _load(step, variant, source)
    except build.BuildError as error:
        return GradeResult(step.exercise, "build failed", f"{name}: {error}")

    verdicts = check.check_matrix(kernel, "cuda", shapes, DTYPES)
    failed = [v for v in verdicts if not v.ok]
    if failed:
        smallest = min(failed, key=lambda v: v.shape.flops())
        # An input the kernel overwrote also spoils the reference it is compared with: name the cause.
        modified = fair_play.inputs_untouched(kernel, smallest.shape, smallest.dtype, "cuda")
        if modified:
            return GradeResult(step.exercise, "breaks a rule",
                               f"{name}: it {modified} (its output was wrong on {len(failed)} of {len(verdicts)} "
                               "checks, which that alone can cause)", verdicts)
        return GradeResult(
            step.exercise,
            "wrong",
            f"{name}: wrong on {len(failed)} of {len(verdicts)} checks; the smallest: {smallest}"
            f"{_threads_of_wrong(step, kernel, smallest)}"
            f"{fair_play.precision_note(smallest.dtype, smallest.rel_error, kernel.fp32_math)}",
            verdicts,
        )

    contenders = {step.label: kernel}
    previous = next((s for s in steps.STEPS if s.number == BASELINE_STEPS.get(step.number, step.number - 1)), None)
    if previous is not None:
        contenders[previous.label] = steps.load(previous, "solution")
    # Timed at the toy in the dtype of the step's idea point, else the first the learner's own
    # kernel takes there (step 6 runs bf16 only; in fp32 its fallback's kernel would be timed).
    idea = IDEA_POINTS.get(step.number)
    preferred = sorted(DTYPES, key=lambda d: idea is None or bench.dtype_label(d) != idea.split()[1])
    dtype = next((d for d in preferred if kernel.takes_fast_path(*make_inputs(TIMING_SHAPE, d, "cuda", 0))), DTYPES[0])
    broken = _rule_broken(kernel, dtype)
    if broken:
        return GradeResult(step.exercise, "breaks a rule", f"{name}: correct on every shape, but it {broken}", verdicts)
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
    stored = sweep.of_device(torch.cuda.get_device_name())  # its ceilings give the roofline floor
    ceilings = stored.meta.get("ceilings") if stored else None
    floor = bench.floor_us(TIMING_SHAPE, dtype, ceilings, step.fp32_tensor_passes) if ceilings else None
    too_fast = fair_play.faster_than_floor(by_name[step.label], floor)
    if too_fast:
        return GradeResult(step.exercise, "breaks a rule", f"{name}: correct on every shape, but it was {too_fast}",
                           verdicts, timings)
    speed = [speed_at(f"toy {bench.dtype_label(dtype)}", by_name, step, previous)]
    if idea is not None:
        _, idea_shape, _, idea_dtype = sweep.point(idea)
        idea_timings = bench.compare(contenders, idea_shape, idea_dtype, "graph")
        timings += idea_timings
        speed.append(speed_at(idea, {t.name: t.median_us for t in idea_timings}, step, previous))
    errors = ", ".join(f"{worst[d]:.1e} {check.dtype_name(d)}" for d in DTYPES)
    line = (
        f"{name}: correct on {len(shapes)}/{len(shapes)} shapes x fp32 and bf16 "
        f"(worst rel. error {errors}); {'; '.join(speed)} [{torch.cuda.get_device_name()}]"
    )
    return GradeResult(step.exercise, "correct", line, verdicts, timings)


def speed_at(point: str, by_name: dict[str, float], step: steps.Step, previous: steps.Step | None) -> str:
    """"toy fp32 42.3 us, 0.41x step 2, 0.50x eager (21.1 us)": the learner's time at one point,
    against the step before and eager timed beside it."""
    mine = by_name[step.label]
    parts = [f"{point} {mine:,.1f} us"]
    if previous is not None:
        parts.append(f"{by_name[previous.label] / mine:.2f}x step {previous.number}")
    parts.append(f"{by_name['eager'] / mine:.2f}x eager ({by_name['eager']:,.1f} us)")
    return ", ".join(parts)
