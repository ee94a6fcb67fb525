"""The sanitizer lane: a kernel run under compute-sanitizer's four tools, one line per tool.

    python -m mla_lab grade ex05 --sanitize

A kernel can pass every check by luck: an out-of-bounds read that lands on a neighbour's data, a
race whose loser writes the same value, a read of memory nobody wrote that happens to hold zero.
compute-sanitizer watches every access. Each tool runs `python -m mla_lab check --quick` (small
odd shapes, one trial) on the step, and the answer is the tool's first error with its file:line
(the course builds with -lineinfo), or "clean".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import build, exercises, steps, toolkit
from .gpu_check import IMPORTABLE

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
SECONDS_PER_TOOL = 180
_FRAMING = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Saved host backtrace",
            "Program hit", "Target application returned")
_SOURCE_LINE = re.compile(r"([\w./-]+\.cuh?):(\d+)")


@dataclass
class ToolResult:
    tool: str
    status: str  # "clean", "error", "timed out", "failed", "not implemented"
    line: str


def first_error(output: str) -> str | None:
    """The first error compute-sanitizer reported, as "what happened at file:line", or None."""
    lines = [line[len("========="):].strip() for line in output.splitlines() if line.startswith("=========")]
    for index, text in enumerate(lines):
        if not text or text.startswith(_FRAMING) or text.startswith(("at ", "and ", "in ", "Host Frame", "by thread")):
            continue
        where = next((_SOURCE_LINE.search(line) for line in lines[index:index + 12] if _SOURCE_LINE.search(line)),
                     None)
        what = re.split(r" at (?=.*(?:\+0x| in ))", text)[0].strip()  # the headline, not its location
        return f"{what} at {_short(where.group(1))}:{where.group(2)}" if where else what
    return None


def _short(path: str) -> str:
    """A path in the repository as the learner knows it (exercises/05_tensor_cores.cu)."""
    try:
        return str(Path(path).resolve().relative_to(steps.REPO))
    except ValueError:
        return path


def sanitizer() -> str | None:
    """compute-sanitizer on PATH or beside the course's nvcc, or None."""
    found = shutil.which("compute-sanitizer")
    home = toolkit.compiler().home
    if found is None and home:
        candidate = Path(home) / "bin" / "compute-sanitizer"
        found = str(candidate) if candidate.exists() else None
    return found


def run_tool(tool: str, step: steps.Step, variant: str, seconds: int = SECONDS_PER_TOOL) -> ToolResult:
    command = [sanitizer(), "--tool", tool, "--print-limit", "1", "--error-exitcode", "86", sys.executable, "-m",
               "mla_lab", "check", "--quick", str(step.number), "--variant", variant]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds, cwd=steps.REPO,
                              env={**os.environ, **IMPORTABLE})
    except subprocess.TimeoutExpired:
        return ToolResult(tool, "timed out", f"{tool}: did not finish in {seconds} s")
    output = done.stdout + done.stderr
    error = first_error(output)
    if done.returncode == 0 and error is None:
        return ToolResult(tool, "clean", f"{tool}: clean")
    if done.returncode == 86 or error:
        return ToolResult(tool, "error", f"{tool}: {error or 'an error without a message'}")
    last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
    return ToolResult(tool, "failed", f"{tool}: the check itself failed ({last[0][:160]})")


def sanitize(exercise: str, variant: str | None = None, quiet: bool = False) -> list[ToolResult]:
    """Run the four tools over one exercise (the learner's file unless variant="solution")."""
    step = steps.get(exercise)
    variant = variant or steps.exercise_variant()
    problem = build.run_problem()
    if exercises.stub_lines(step.source(variant)):
        problem = "not implemented yet: fill in its TODO stubs first"
    if problem is None and sanitizer() is None:
        problem = ("compute-sanitizer not found: it ships with the CUDA toolkit, not with torch's wheels; "
                   "run where a toolkit is installed, or put its bin/ on PATH")
    if problem:
        status = "not implemented" if problem.startswith("not implemented") else "failed"
        if not quiet:
            print(f"{step.exercise} under compute-sanitizer: {problem if status != 'failed' else f'cannot run here ({problem})'}")
        return [ToolResult(tool, status, f"{tool}: {problem}") for tool in TOOLS]
    results = [run_tool(tool, step, variant) for tool in TOOLS]
    if not quiet:
        print(f"{step.exercise} under compute-sanitizer (small odd shapes, one trial):")
        for result in results:
            print(f"  {result.line}")
    return results
