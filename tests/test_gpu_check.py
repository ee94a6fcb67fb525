"""`python -m mla_lab gpu-check --sitting SECONDS`: in a sitting shorter than the validation, no
stage starts that might not end in it, the sweep stops between points (bench --stop-after), and
what waits on a sweep cut short waits for the next sitting. The stages here are stand-ins."""

import sys

import pytest

from mla_lab import gpu_check


@pytest.fixture(autouse=True)
def logs(monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_LAB_LOGS", str(tmp_path))


def stand_in(code: int, said: str = "done") -> list[str]:
    """A stage's command that prints its arguments and `said`, then exits with `code`."""
    return [sys.executable, "-c", f"import sys; print(sys.argv[1:], {said!r}); sys.exit({code})"]


def test_a_sweep_cut_short_leaves_the_rest_of_its_part_for_the_next_sitting(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "STAGE_SECONDS", {"results": 30, "notebooks": 270})
    monkeypatch.setattr(gpu_check, "PARTS", {"results": [
        ("bench", stand_in(gpu_check.CUT_SHORT, "stopped after 470 s with 39 of 40 points"), {}),
        ("results", stand_in(0), {}),
        ("notebooks", stand_in(0), {}),
    ]})
    assert gpu_check.run(["results"], sitting=600) == 1
    out = capsys.readouterr().out
    bench_log = (tmp_path / "results-bench.log").read_text()
    assert "'--stop-after', '" in bench_log  # the sitting's time, less the longest point, went to bench
    stop_after = float(bench_log.split("'--stop-after', '")[1].split("'")[0])
    assert 600 - gpu_check.LONGEST_POINT_SECONDS - 5 < stop_after <= 600 - gpu_check.LONGEST_POINT_SECONDS
    assert "cut short" in out and out.count("waits") == 4  # results and notebooks, each in the run and the table
    assert not (tmp_path / "results-results.log").exists()


def test_a_stage_that_might_not_end_in_the_sitting_does_not_start(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "STAGE_SECONDS", {"results": 30, "notebooks": 270})
    monkeypatch.setattr(gpu_check, "PARTS", {"results": [("results", stand_in(0), {}), ("notebooks", stand_in(0), {})]})
    assert gpu_check.run(["results"], sitting=200) == 1
    out = capsys.readouterr().out
    assert (tmp_path / "results-results.log").exists() and not (tmp_path / "results-notebooks.log").exists()
    assert "no time" in out and "it takes up to 270 s" in out


def test_without_a_sitting_every_stage_runs_as_before(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "PARTS", {"results": [("bench", stand_in(0), {}), ("notebooks", stand_in(0), {})]})
    assert gpu_check.run(["results"]) == 0
    assert "--stop-after" not in (tmp_path / "results-bench.log").read_text()


def test_a_round_that_fails_leaves_the_sweep_waiting(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "round_folder", lambda: tmp_path)
    monkeypatch.setattr(gpu_check, "PARTS", {
        "round": lambda: [("round", stand_in(0), {}), ("round-memcheck", stand_in(1, "1 error"), {})],
        "results": [("bench", stand_in(0), {}), ("results", stand_in(0), {})]})
    assert gpu_check.run(["round", "results"]) == 1
    out = capsys.readouterr().out
    assert out.count("for every stage of the round to pass") == 4  # bench and results, in the run and the table
    assert not (tmp_path / "results-bench.log").exists()


def test_a_later_sitting_of_a_round_replays_it_and_runs_only_the_stages_that_did_not_pass(monkeypatch, tmp_path, capsys):
    folder = tmp_path / "round"
    folder.mkdir()
    monkeypatch.setattr(gpu_check, "round_folder", lambda: folder)
    monkeypatch.setattr(gpu_check, "STAGE_SECONDS", {"round": 10, "round-check": 10, "round-tests": 500})
    monkeypatch.setattr(gpu_check, "PARTS", {"round": lambda: [
        ("round", stand_in(0, "replayed"), {}), ("round-check", stand_in(0), {}), ("round-tests", stand_in(0), {})]})
    monkeypatch.setitem(gpu_check.PARTS, "results", [("bench", stand_in(0), {})])
    assert gpu_check.run(["round", "results"], sitting=100) == 1  # the tests do not fit this sitting
    assert "for every stage of the round to pass" in capsys.readouterr().out  # so the sweep waits too
    assert (folder / "passed-round-check").exists() and not (folder / "passed-round-tests").exists()
    (tmp_path / "round-round.log").unlink()
    assert gpu_check.run(["round"]) == 0
    out = capsys.readouterr().out
    assert "passed in an earlier sitting of this round" in out
    assert (tmp_path / "round-round.log").exists()  # the replay runs at every sitting
    assert not (folder / "passed-round").exists()


def test_a_round_checks_sanitizes_and_tests_the_steps_its_changes_touch(monkeypatch):
    from mla_lab import candidates

    monkeypatch.setattr(candidates, "all_candidates", lambda: [candidates.Candidate.load(p) for p in
                                                               sorted(candidates.CANDIDATES_DIR.glob("12_*.patch"))][:1])
    monkeypatch.setattr(candidates, "kept_changes", lambda: [])
    if not candidates.all_candidates():
        pytest.skip("kernels/candidates/ holds no step 12 candidate to stand in for a round")
    stages = {name: command for name, command, _ in gpu_check.round_stages()}
    assert list(stages)[0] == "round" and stages["round"][-2:] == ["candidates", "--round"]
    assert stages["round-check"][-2:] == ["check", "12"]
    assert [stages[f"round-{tool}"][-3:] for tool in gpu_check.SANITIZERS] == [["check", "--quick", "12"]] * 4
    assert stages["round-tests"][-2:] == ["-k", "step12_ or step12] or step12- or dispatch"]
    monkeypatch.setattr(candidates, "all_candidates", lambda: [])
    assert [name for name, _, _ in gpu_check.round_stages()] == ["round"]  # nothing to land: nothing to check


def test_nbval_waits_for_notebooks_that_had_no_time_in_the_sitting(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "STAGE_SECONDS", {"notebooks": 270, "nbval": 60})
    monkeypatch.setattr(gpu_check, "PARTS", {"results": [("notebooks", stand_in(0), {}), ("nbval", stand_in(0), {})]})
    assert gpu_check.run(["results"], sitting=200) == 1
    out = capsys.readouterr().out
    assert "for the notebooks to run in this sitting" in out
    assert not (tmp_path / "results-nbval.log").exists()


def writes(path: str, text: str) -> list[str]:
    """A stage's command that writes TEXT into PATH under its working directory."""
    return [sys.executable, "-c", f"import pathlib; p = pathlib.Path({path!r}); p.parent.mkdir(exist_ok=True); "
                                  f"p.write_text({text!r})"]


def test_a_later_sitting_of_a_round_puts_back_what_its_passed_results_stages_wrote(monkeypatch, tmp_path, capsys):
    """A GPU machine's working tree is a fresh copy of the checkout at each sitting: the sweep and the
    notebooks that passed in one sitting are neither run again in the next nor lost."""
    tree, folder = tmp_path / "tree", tmp_path / "round"
    tree.mkdir()
    folder.mkdir()
    (tree / "README.md").write_text("the checkout's table")
    monkeypatch.setattr(gpu_check, "REPO", tree)
    monkeypatch.setattr(gpu_check, "round_folder", lambda: folder)
    monkeypatch.setattr(gpu_check, "PARTS", {
        "round": lambda: [("round", stand_in(0, "replayed"), {})],
        "results": [("bench", writes("results/gpu.json", "swept"), {}),
                    ("notebooks", writes("notebooks/08.ipynb", "executed"), {}),
                    ("nbval", stand_in(1, "1 failed"), {})]})
    assert gpu_check.run(["round", "results"]) == 1
    (tree / "results" / "gpu.json").unlink()  # the next sitting's fresh copy of the checkout
    (tree / "notebooks" / "08.ipynb").unlink()
    (tmp_path / "results-nbval.log").unlink()
    capsys.readouterr()
    assert gpu_check.run(["round", "results"]) == 1
    out = capsys.readouterr().out
    assert out.count("passed in an earlier sitting of this round") == 4  # bench and notebooks, run and table
    assert (tree / "results" / "gpu.json").read_text() == "swept"
    assert (tree / "notebooks" / "08.ipynb").read_text() == "executed"
    assert (tree / "README.md").read_text() == "the checkout's table"  # written by no stage: not kept
    assert (tmp_path / "results-nbval.log").exists()  # what failed runs again
    assert not (folder / "passed-nbval").exists()


def test_results_stages_outside_a_round_run_at_every_sitting(monkeypatch, tmp_path):
    folder = tmp_path / "round"
    folder.mkdir()
    monkeypatch.setattr(gpu_check, "REPO", tmp_path)
    monkeypatch.setattr(gpu_check, "round_folder", lambda: folder)
    monkeypatch.setattr(gpu_check, "PARTS", {"results": [("bench", stand_in(0), {})]})
    assert gpu_check.run(["results"]) == 0
    assert not list(folder.iterdir())
