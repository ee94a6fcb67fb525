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
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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
    # A session of its own, so that a run out of time goes down whole: compute-sanitizer's target
    # process outlives a killed compute-sanitizer, and a kernel left spinning on the GPU shares it
    # with every later kernel (long ones then ran about 3x slower).
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=steps.REPO,
                             env={**os.environ, **IMPORTABLE}, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return ToolResult(tool, "timed out", f"{tool}: did not finish in {seconds} s")
    error = first_error(output)
    if child.returncode == 0 and error is None:
        return ToolResult(tool, "clean", f"{tool}: clean")
    if child.returncode == 86 or error:
        return ToolResult(tool, "error", f"{tool}: {error or 'an error without a message'}")
    last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
    return ToolResult(tool, "failed", f"{tool}: the check itself failed ({last[0][:160]})")


def _why_not(step: steps.Step, variant: str) -> str | None:
    if exercises.stub_lines(step.source(variant)):
        return "not implemented yet: fill in its TODO stubs first"
    problem = build.run_problem()
    if problem is None and sanitizer() is None:
        problem = ("compute-sanitizer not found: it ships with the CUDA toolkit, not with torch's wheels; "
                   "run where a toolkit is installed, or put its bin/ on PATH")
    return problem


def sanitize_many(names: list[str], variant: str | None = None, quiet: bool = False) -> list[list[ToolResult]]:
    """Every tool over every exercise named (the learner's files unless variant="solution"), the
    runs side by side: each is a process of its own and mostly waits on the GPU."""
    variant = variant or steps.exercise_variant()
    chosen = [steps.get(name) for name in names]
    problems = {step.number: _why_not(step, variant) for step in chosen}
    for step in chosen:
        if problems[step.number] is None:
            steps.load(step, variant)  # built once here, not by four children at once
    with ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 2) // 2))) as pool:
        runs = {(step.number, tool): pool.submit(run_tool, tool, step, variant)
                for step in chosen if problems[step.number] is None for tool in TOOLS}
        answers = []
        for step in chosen:
            problem = problems[step.number]
            if problem:
                status = "not implemented" if problem.startswith("not implemented") else "failed"
                if not quiet:
                    print(f"{step.exercise} under compute-sanitizer: "
                          f"{problem if status != 'failed' else f'cannot run here ({problem})'}", flush=True)
                answers.append([ToolResult(tool, status, f"{tool}: {problem}") for tool in TOOLS])
                continue
            results = [runs[step.number, tool].result() for tool in TOOLS]
            if not quiet:
                print(f"{step.exercise} under compute-sanitizer (small odd shapes, one trial):", flush=True)
                for result in results:
                    print(f"  {result.line}", flush=True)
            answers.append(results)
    return answers


def sanitize(exercise: str, variant: str | None = None, quiet: bool = False) -> list[ToolResult]:
    """The four tools over one exercise."""
    return sanitize_many([exercise], variant, quiet)[0]
