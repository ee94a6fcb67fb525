import pytest

from mla_lab import exercises, steps
from mla_lab.grade import grade


def test_exercises_are_in_sync_with_solutions():
    problems = exercises.out_of_sync()
    assert not problems, "run `python -m mla_lab exercises`:\n" + "\n".join(problems)


def test_every_exercise_has_a_solution_with_regions_and_a_stub():
    for step in steps.exercises():
        solution, exercise = step.source("solution"), step.source("exercise")
        assert "BEGIN SOLUTION" in solution.read_text()
        assert exercises.stub_lines(exercise), f"{exercise.name} has no stub left"
        assert not exercises.stub_lines(solution)
        assert "BEGIN SOLUTION" not in exercise.read_text()


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
def test_grading_a_stub_says_not_implemented_yet(exercise, capsys):
    result = grade(exercise, "exercise")
    assert result.status == "not implemented"
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and "not implemented yet" in printed and "line" in printed
