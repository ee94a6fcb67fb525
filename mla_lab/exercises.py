"""Exercises are made from solutions by replacing each marked region with a stub that compiles.

In a solution file:

    // BEGIN SOLUTION: what the learner must write here
    ...the solution...
    // END SOLUTION

becomes, in exercises/ (same file name):

    // TODO(ex01): what the learner must write here
    MLA_NOT_IMPLEMENTED();

`MLA_NOT_IMPLEMENTED` (kernels/mla_common.cuh) compiles to nothing; the grader finds it in the
source and answers "not implemented yet" instead of grading an empty kernel.
"""

from __future__ import annotations

import re
from pathlib import Path

from .steps import EXERCISES_DIR, REPO, SOLUTIONS_DIR, exercises

BEGIN = re.compile(r"^(?P<indent>\s*)// BEGIN SOLUTION(?::\s*(?P<hint>.*))?$")
END = re.compile(r"^\s*// END SOLUTION\s*$")
STUB = "MLA_NOT_IMPLEMENTED();"


class MarkerError(ValueError):
    pass


def marked_lines(text: str, origin: str):
    """Each line of a solution file as ("begin", its BEGIN match), ("inside", line), ("end", line)
    or ("outside", line), after checking that the markers pair up and that there is a region."""
    regions = 0
    inside = False
    for number, line in enumerate(text.splitlines(), start=1):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise MarkerError(f"{origin}:{number}: BEGIN SOLUTION inside another region")
            inside, regions = True, regions + 1
            yield "begin", begin
        elif END.match(line):
            if not inside:
                raise MarkerError(f"{origin}:{number}: END SOLUTION without BEGIN SOLUTION")
            inside = False
            yield "end", line
        else:
            yield ("inside" if inside else "outside"), line
    if inside:
        raise MarkerError(f"{origin}: a BEGIN SOLUTION region is never closed")
    if regions == 0:
        raise MarkerError(f"{origin}: no BEGIN SOLUTION region, so the exercise would be the answer")


def strip_solutions(text: str, exercise: str, origin: str) -> str:
    """The exercise version of one solution file."""
    out: list[str] = [
        f"// Exercise {exercise}: generated from {origin} by `python -m mla_lab exercises`.",
        f"// Fill in each TODO, then grade: python -m mla_lab grade {exercise}",
    ]
    for kind, line in marked_lines(text, origin):
        if kind == "begin":
            indent, hint = line["indent"], line["hint"] or "write this part"
            out += [f"{indent}// TODO({exercise}): {hint}", f"{indent}{STUB}"]
        elif kind == "outside":
            out.append(line)
    return "\n".join(out) + "\n"


def expected_exercises() -> dict[Path, str]:
    """exercises/<file> -> the text it must have, for every exercise step in the registry."""
    expected = {}
    for step in exercises():
        solution = SOLUTIONS_DIR / step.filename
        if not solution.exists():
            raise MarkerError(f"{step.exercise} has no solution: {solution.relative_to(REPO)} is missing")
        origin = str(solution.relative_to(REPO))
        expected[EXERCISES_DIR / step.filename] = strip_solutions(
            solution.read_text(), step.exercise, origin
        )
    return expected


def _working_text(path: Path, expected: str) -> str | None:
    return path.read_text() if path.exists() else None


def out_of_sync(read=_working_text) -> list[str]:
    """What differs between exercises/ and what solutions/ generate (empty when in sync).

    read(path, expected_text) gives an exercise's text; by default the file as it is now.
    """
    expected = expected_exercises()
    problems = [
        f"{path.relative_to(REPO)} is missing or differs from its solution's stripped text"
        for path, text in expected.items()
        if read(path, text) != text
    ]
    known = {path.name for path in expected}
    problems += [
        f"{path.relative_to(REPO)} has no solution in solutions/ or no entry in mla_lab/steps.py"
        for path in sorted(EXERCISES_DIR.glob("*.cu"))
        if path.name not in known
    ]
    problems += [
        f"{path.relative_to(REPO)} is not registered as an exercise in mla_lab/steps.py"
        for path in sorted(SOLUTIONS_DIR.glob("*.cu"))
        if path.name not in known
    ]
    return problems


def generate(force: bool = False) -> list[Path]:
    """Write exercises/ from solutions/. An edited exercise is never overwritten unless force."""
    EXERCISES_DIR.mkdir(exist_ok=True)
    written = []
    for path, text in expected_exercises().items():
        if path.exists() and path.read_text() == text:
            continue
        if path.exists() and not force:
            raise MarkerError(
                f"{path.name} in exercises/ differs from its blank version (your work?); "
                "keep a copy and pass --force to overwrite it"
            )
        path.write_text(text)
        written.append(path)
    return written


def stub_lines(source: Path) -> list[int]:
    """Line numbers of the stubs still in a source file."""
    return [n for n, line in enumerate(source.read_text().splitlines(), 1) if STUB in line]
