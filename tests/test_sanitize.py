"""The sanitizer lane's one-line answers, read from compute-sanitizer's report format (the
examples below follow the manual's memcheck and racecheck demos), and its refusal without a GPU."""

from pathlib import Path

import pytest

from mla_lab import build, sanitize

MEMCHECK = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at void naive_kernel<float>(const float *, const float *, float *, long)+0x2d0 in /repo/exercises/01_naive.cu:42
=========     by thread (31,0,0) in block (3,0,0)
=========     Address 0x7f0000000ffc is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========
========= ERROR SUMMARY: 1 error
"""
RACECHECK = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at void tiled_kernel<float>(Problem<float>)+0x8f0 in /repo/exercises/03_tiled.cu:88
=========     and Read access at void tiled_kernel<float>(Problem<float>)+0x990 in /repo/exercises/03_tiled.cu:95 [1024 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
CLEAN = """========= COMPUTE-SANITIZER
step 5 (tensor_cores): 18/18 checks passed, worst rel. error 2.4e-03
========= ERROR SUMMARY: 0 errors
"""


def test_the_first_error_is_one_line_with_its_file_and_line():
    assert sanitize.first_error(MEMCHECK) == "Invalid __global__ write of size 4 bytes at /repo/exercises/01_naive.cu:42"
    assert sanitize.first_error(RACECHECK) == (
        "Error: Race reported between Write access at /repo/exercises/03_tiled.cu:88")
    assert sanitize.first_error(CLEAN) is None


@pytest.mark.skipif(build.run_problem() is None, reason="a GPU is visible")
def test_without_a_gpu_the_lane_says_why_in_one_line(capsys):
    results = sanitize.sanitize("ex05", "solution", quiet=False)
    printed = capsys.readouterr().out.strip()
    assert [r.tool for r in results] == list(sanitize.TOOLS) and all(r.status == "failed" for r in results)
    assert "\n" not in printed and printed.startswith("ex05 under compute-sanitizer: cannot run here")


def test_a_stub_is_not_sanitized_but_named_unfinished(capsys):
    results = sanitize.sanitize("ex05", "exercise", quiet=False)
    assert all(r.status == "not implemented" for r in results)
    assert capsys.readouterr().out.strip() == "ex05 under compute-sanitizer: not implemented yet: fill in its TODO stubs first"


def test_a_tool_out_of_time_takes_its_target_down_with_it(tmp_path, monkeypatch):
    """compute-sanitizer starts the checked program as a child of its own: killing the tool alone
    left that child running on the GPU, slowing every later kernel. A stand-in tool that starts a
    long-lived child and waits: when its time is up, neither may survive."""
    pid_file = tmp_path / "target.pid"
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pid_file}\nwait\n")
    tool.chmod(0o755)
    monkeypatch.setattr(sanitize, "sanitizer", lambda: str(tool))
    result = sanitize.run_tool("racecheck", sanitize.steps.get("ex01"), "solution", seconds=2)
    assert result.status == "timed out" and result.line == "racecheck: did not finish in 2 s"
    stat = Path(f"/proc/{int(pid_file.read_text())}/stat")
    # gone, or a zombie waiting for init to reap it (the state after the name's closing parenthesis)
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
