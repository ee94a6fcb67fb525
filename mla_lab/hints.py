"""Hints between "stuck" and "the full solution", in three levels, for each part of an exercise.

Each solution region carries its first two levels as comments under its BEGIN SOLUTION line:

    // BEGIN SOLUTION: what the learner must write (the exercise's TODO line)
    // HINT 1: the idea
    // HINT 2: the skeleton: which indices, which barrier, which invariant
    ...the solution...
    // END SOLUTION

Level 3 is the solution of one part. `python -m mla_lab exercises` drops the whole region from
exercises/, hints included, so an exercise file never gives them away.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import exercises, steps

_HINT = re.compile(r"^\s*// HINT ([12]): (.*)$")


@dataclass
class Part:
    todo_line: int  # where the part's TODO is in exercises/
    hints: dict[int, str]  # level 1 and 2
    solution: list[str]


def parts(exercise: str) -> list[Part]:
    """The parts of an exercise, in file order, read from its solution's marked regions."""
    step = steps.get(exercise)
    found: list[Part] = []
    solution = step.source("solution")
    text, origin = solution.read_text(), str(solution.relative_to(steps.REPO))
    for kind, line in exercises.marked_lines(text, origin):
        if kind == "begin":
            found.append(Part(0, {}, []))
        elif kind == "inside":
            hint = _HINT.match(line)
            if hint:
                found[-1].hints[int(hint[1])] = hint[2]
            else:
                found[-1].solution.append(line)
    # Where each TODO is in the blank exercise (a learner's edits may have moved it since).
    blank = exercises.strip_solutions(text, step.exercise, origin)
    stubs = [n for n, line in enumerate(blank.splitlines(), 1) if exercises.STUB in line]
    for part, line in zip(found, stubs):
        part.todo_line = line - 1  # the TODO comment sits on the line above its stub
    return found


def hint(exercise: str, level: int = 1, part: int | None = None, quiet: bool = False) -> str:
    """Level 1 (the idea) or 2 (the skeleton) for every part, or for one; level 3, the solution of
    one part (the first unless `part` says which). Printed unless quiet; returned either way."""
    if level not in (1, 2, 3):
        raise ValueError("level is 1 (the idea), 2 (the skeleton) or 3 (the solution of one part)")
    found = parts(exercise)
    step = steps.get(exercise)
    where = step.source("exercise").relative_to(steps.REPO)
    if part is not None and not 1 <= part <= len(found):
        raise ValueError(f"{exercise} has parts 1 to {len(found)}")
    if level == 3:
        number = part or 1
        chosen = found[number - 1]
        lines = [f"{exercise}, part {number} of {len(found)} ({where}:{chosen.todo_line}), the solution:",
                 *chosen.solution]
        if number < len(found):
            lines.append(f"(the next part: mla_lab.hint({exercise!r}, 3, part={number + 1}))")
    else:
        numbers = [part] if part else range(1, len(found) + 1)
        title = "the idea" if level == 1 else "the skeleton"
        lines = [f"{exercise}, {title}:"]
        lines += [f"  part {n} of {len(found)} ({where}:{found[n - 1].todo_line}): {found[n - 1].hints[level]}"
                  for n in numbers]
    text = "\n".join(lines)
    if not quiet:
        print(text)
    return text
