"""What the step labs share: a kernel's source with text edits (or as an earlier commit had it),
built as its own library, checked against float64, then timed in one process on the same inputs.

A lab is a script in experiments/stepN/ that names its kernel file, its edits and its shapes; see
experiments/step4/lab.py, experiments/step5/lab.py and experiments/step7/lab.py
(experiments/step6/lab.py, whose variants are compile-time switches in one copy, uses only
`kernel_at` and `write_source`).
"""
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from mla_lab import bench, build, check, steps
from mla_lab.problem import TOY, V2_LITE, Shape, make_inputs

# variant -> ((text in the kernel file, what replaces it), ...)
Edits = dict[str, tuple[tuple[str, str], ...]]


def kernel_at(commit: str, kernel_file: str) -> str:
    """A kernel's file (its path in the repository) as `commit` had it (the labs' "previous" variants)."""
    return subprocess.run(["git", "show", f"{commit}:{kernel_file}"], check=True,
                          capture_output=True, text=True, cwd=steps.REPO).stdout


def write_source(path: Path, text: str) -> Path:
    """Writes a variant's source, leaving the file (and so its build) alone when it is unchanged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def edited_source(kernel_file: str, name: str, edits: Edits, previous_commit: str, build_dir: Path) -> Path:
    """The kernel file (its path in the repository) with variant `name`'s edits, or as
    `previous_commit` had it ("previous"), or as commit C had it ("at_C"), written to build_dir;
    fails loudly when the kernel no longer has the text an edit replaces. "stepN" is course step
    N's own file as it is (an experiment's lab times it beside)."""
    if name.startswith("step") and name[4:].isdigit():
        return steps.get(int(name[4:])).source()
    if name == "previous":
        text = kernel_at(previous_commit, kernel_file)
    elif name.startswith("at_"):
        text = kernel_at(name.removeprefix("at_"), kernel_file)
    else:
        text = (steps.REPO / kernel_file).read_text()
    for original, replacement in edits.get(name, ()):
        if text.count(original) != 1:
            raise RuntimeError(f"{name}: {kernel_file} no longer has exactly one {original!r}")
        text = text.replace(original, replacement)
    return write_source(build_dir / f"{name}.cu", text)


def built_kernel(step: int | steps.Step, source: Path, library: str) -> steps.Kernel:
    """`source` built as library `library`, run as step `step` runs: its limits, and its nvcc
    architecture flags (an sm_90a experiment names a Step of its own, with the "a" target)."""
    as_step = step if isinstance(step, steps.Step) else steps.get(step)
    return steps.Kernel(as_step, source, build.build_step(source, library, as_step.arch_flags))


def build_and_check(step: int | steps.Step, sources: dict[str, Path], correct: Iterable[str],
                    shapes: Iterable[Shape], lab: str = "",
                    dtypes: Iterable[torch.dtype] = (torch.float32, torch.bfloat16),
                    step_of: dict[str, steps.Step] | None = None) -> dict:
    """Builds each variant as its own library (named after `lab`, by default "labNN" for step NN),
    run as step `step` runs (or as `step_of[name]`, for a variant held to other tolerances); checks
    those in `correct` (the others compute garbage on purpose) on `shapes` in `dtypes`, printing one
    line each. Returns the variants fit to time: one that fails a check or cannot launch is
    reported and left out, so that it does not cost the others' numbers."""
    print(bench.device_line(), flush=True)
    lab = lab or f"lab{(step if isinstance(step, int) else step.number):02}"
    kernels = {name: built_kernel((step_of or {}).get(name, step), source, f"{lab}_{name}")
               for name, source in sources.items()}
    for name in [n for n in correct if n in kernels]:
        try:
            verdicts = check.check_matrix(kernels[name], "cuda", tuple(shapes), tuple(dtypes))
        except RuntimeError as error:
            print(f"{name}: failed to run: {str(error).splitlines()[0]}", flush=True)
            del kernels[name]
            continue
        print(f"{name}: {check.summary(verdicts)}", *(v for v in verdicts if not v.ok), sep="\n  ", flush=True)
        if not all(v.ok for v in verdicts):
            del kernels[name]
    return kernels


def run(step: int | steps.Step, sources: dict[str, Path], correct: Iterable[str],
        timed: Iterable[tuple[str, Shape, torch.dtype]], with_peers: bool = True, digits: int = 1, after_row=None,
        shapes: Iterable[Shape] | None = None, lab: str = "",
        check_dtypes: Iterable[torch.dtype] = (torch.float32, torch.bfloat16),
        peers: dict[str, Callable] | None = None, step_of: dict[str, steps.Step] | None = None) -> int:
    """A lab's whole run: build and check the variants on `shapes` (by default the toy, the quick
    shapes and V2-Lite at 128 tokens) in `check_dtypes`, then one timing row per (label, shape,
    dtype) by `bench.compare` (the variants in `correct` checked again on that row's inputs, the
    others timed as they are; `peers`, callables taking the kernels' arguments, beside eager and
    cuBLAS); `after_row(kernels, shape, dtype)` may report more about each row; `step_of` as in
    `build_and_check`. Exits 1 when a variant in `correct` failed its checks (it is then left out
    of the timings)."""
    correct = tuple(correct)
    if shapes is None:
        shapes = (TOY, *check.QUICK_SHAPES, V2_LITE.with_tokens(1, 128))
    kernels = build_and_check(step, sources, correct, shapes, lab, check_dtypes, step_of)
    contenders = {**kernels, **(peers or {})}
    for label, shape, dtype in timed:
        timings = bench.compare(contenders, shape, dtype, with_peers=with_peers,
                                unchecked=[name for name in kernels if name not in correct])
        print(f"{label:14} " + " | ".join(f"{t.name} {t.median_us:.{digits}f}" for t in timings), flush=True)
        if after_row is not None:
            after_row(kernels, shape, dtype)
    return 0 if all(name in kernels for name in correct if name in sources) else 1


def call_for_a_profiler(step: int | steps.Step, source: Path, lab: str, shape: Shape, dtype: torch.dtype,
                        calls: int = 4) -> None:
    """Builds `source` (run as step `step` runs) and calls it `calls` times on `shape`, nothing else
    on the GPU between (for `ncu --launch-skip {calls - 1} --launch-count 1`)."""
    kernel = built_kernel(step, source, lab)
    inputs = make_inputs(shape, dtype, "cuda", 0)
    out = torch.empty(shape.out_shape, dtype=dtype, device="cuda")
    for _ in range(calls):
        kernel(*inputs, shape.heads, out=out)
    torch.cuda.synchronize()


def marks_of(kernel, shape: Shape, dtype: torch.dtype, per_block: int) -> torch.Tensor:
    """A timeline variant's marks from one call on fresh inputs: the int64 words it wrote over a
    zeroed output, `per_block` to a row (rows past the grid's blocks stay 0), as float64 on the CPU."""
    inputs = make_inputs(shape, dtype, "cuda", 0)
    out = torch.zeros(shape.out_shape, dtype=dtype, device="cuda")
    kernel(*inputs, shape.heads, out=out)
    torch.cuda.synchronize()
    words = out.view(-1).view(torch.int64)
    rows = words.numel() // per_block
    return words[: rows * per_block].view(rows, per_block).double().cpu()
