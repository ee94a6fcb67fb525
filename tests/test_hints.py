"""Hints in three levels for every part of every exercise (mla_lab/hints.py)."""

import subprocess
import sys

import pytest

from mla_lab import exercises, hints, steps

EXERCISES = [s.exercise for s in steps.exercises()]


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_part_has_the_idea_the_skeleton_and_its_solution(exercise):
    parts = hints.parts(exercise)
    blank = steps.get(exercise).source("exercise").read_text().splitlines()
    assert len(parts) == sum(exercises.STUB in line for line in blank), "a part per TODO"
    for number, part in enumerate(parts, 1):
        assert len(part.hints.get(1, "")) > 40 and len(part.hints.get(2, "")) > 10, f"{exercise} part {number}"
        assert part.hints[1] != part.hints[2]
        assert any(line.strip() for line in part.solution), f"{exercise} part {number} has no solution"
        assert f"TODO({exercise})" in blank[part.todo_line - 1], f"{exercise} part {number}: line {part.todo_line}"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_an_exercise_file_gives_no_hint_away(exercise):
    assert "HINT" not in steps.get(exercise).source("exercise").read_text()


def test_each_level_says_more():
    idea = hints.hint("ex04", 1, quiet=True)
    skeleton = hints.hint("ex04", 2, quiet=True)
    solution = hints.hint("ex04", 3, part=3, quiet=True)
    assert idea.count("part ") == skeleton.count("part ") == 3
    assert "Double buffering" in idea and "wait_for_copies(0); __syncthreads();" in skeleton
    assert "mla::wait_for_copies(0);" in solution and "part 3 of 3" in solution
    with pytest.raises(ValueError, match="parts 1 to 3"):
        hints.hint("ex04", 3, part=4, quiet=True)


def test_the_command_line_prints_a_hint():
    out = subprocess.run([sys.executable, "-m", "mla_lab", "hint", "ex08", "2", "--part", "1"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("ex08, the skeleton:\n  part 1 of 4 (exercises/08_bulk_mma.cu:") and "barrier_init" in out
