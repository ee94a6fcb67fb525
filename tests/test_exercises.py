"""Exercises come from solutions. These tests judge the repository's exercises, not a learner's
work: an exercise whose stubs a learner has filled in is read from git's HEAD instead."""

import re
import subprocess

import pytest

from mla_lab import exercises, steps
from mla_lab.grade import grade
from mla_lab.steps import REPO


def repository_text(path, expected: str) -> str:
    text = path.read_text() if path.exists() else ""
    if text.count(exercises.STUB) >= expected.count(exercises.STUB):
        return text
    committed = subprocess.run(
        ["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True
    )
    return committed.stdout if committed.returncode == 0 else text


def test_exercises_are_in_sync_with_solutions():
    problems = exercises.out_of_sync(read=repository_text)
    assert not problems, "run `python -m mla_lab exercises --force` and commit:\n" + "\n".join(problems)


def test_every_exercise_has_a_solution_with_regions_and_a_stub():
    expected = exercises.expected_exercises()
    for step in steps.exercises():
        solution = step.source("solution")
        text = expected[step.source("exercise")]
        assert "BEGIN SOLUTION" in solution.read_text()
        assert exercises.STUB in text, f"{step.filename} has no stub"
        assert not exercises.stub_lines(solution)
        assert "BEGIN SOLUTION" not in text


def test_stripping_replaces_regions_with_a_stub_and_keeps_the_rest():
    text = "a\n  // BEGIN SOLUTION: add b\n  secret();\n  // END SOLUTION\nz\n"
    out = exercises.strip_solutions(text, "ex09", "solutions/x.cu")
    assert "secret" not in out
    assert "  // TODO(ex09): add b\n  MLA_NOT_IMPLEMENTED();\nz\n" in out
    assert out.splitlines()[2] == "a"


@pytest.mark.parametrize(
    "text, error",
    [
        ("x\n", "no BEGIN SOLUTION"),
        ("// BEGIN SOLUTION\n", "never closed"),
        ("// END SOLUTION\n", "without BEGIN"),
        ("// BEGIN SOLUTION\n// BEGIN SOLUTION\n// END SOLUTION\n", "inside another"),
    ],
)
def test_bad_markers_are_reported(text, error):
    with pytest.raises(exercises.MarkerError, match=error):
        exercises.strip_solutions(text, "ex09", "solutions/x.cu")


def test_generate_never_overwrites_a_learners_work(tmp_path, monkeypatch):
    monkeypatch.setattr(exercises, "EXERCISES_DIR", tmp_path)
    step = steps.exercises()[0]
    monkeypatch.setattr(
        exercises, "expected_exercises", lambda: {tmp_path / step.filename: "blank\n"}
    )
    (tmp_path / step.filename).write_text("my work\n")
    with pytest.raises(exercises.MarkerError, match="--force"):
        exercises.generate()
    assert exercises.generate(force=True) == [tmp_path / step.filename]


@pytest.mark.parametrize("exercise", [s.exercise for s in steps.exercises()])
def test_grading_a_stub_says_not_implemented_yet(exercise, capsys, tmp_path, monkeypatch):
    for path, text in exercises.expected_exercises().items():  # the blank exercises, whatever
        (tmp_path / path.name).write_text(text)  # a learner has done in exercises/
    monkeypatch.setattr(steps, "EXERCISES_DIR", tmp_path)
    result = grade(exercise, "exercise")
    assert result.status == "not implemented"
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and "not implemented yet" in printed and "line" in printed


def test_without_a_gpu_the_grader_still_compiles_and_names_the_compilers_errors(tmp_path, monkeypatch):
    """A learner with nvcc and no GPU hears about their code: the compiler's own errors (file and
    line), or that it compiles, with registers and spills."""
    from mla_lab import build

    monkeypatch.setattr(build, "run_problem", lambda: "no CUDA GPU is visible to torch")
    monkeypatch.setattr(steps, "EXERCISES_DIR", tmp_path)
    if build.nvcc() is None:
        pytest.skip("nvcc not found")
    solved = steps.get("ex01").source("solution").read_text()
    (tmp_path / "01_naive.cu").write_text(solved)
    result = grade("ex01", "exercise", quiet=True)
    assert result.status == "no gpu", result.line
    assert "compiles for sm_80 and sm_90" in result.line and "0 bytes of spills" in result.line
    assert "cannot run here (no CUDA GPU is visible to torch)" in result.line
    # the classic slip: a float stored into a bf16 output without mla::from_float<T>
    broken = re.sub(r"out\[idx\] = [^;]+;", "out[idx] = 0.0f;", solved)
    assert broken != solved
    (tmp_path / "01_naive.cu").write_text(broken)
    result = grade("ex01", "exercise", quiet=True)
    assert result.status == "build failed"
    assert re.search(r"01_naive\.cu\(\d+\): error: no operator \"=\"", result.line), result.line
    assert "__nv_bfloat16 = float" in result.line
