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
