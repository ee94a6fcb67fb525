"""The whole GPU validation in three parts, ending with a short table: what ran, whether it
passed, how long it took, its last line. Measured stages on an H100: the GPU tests 2 minutes, the
sweep 6 to 7 (8 on an H200), the notebooks 2 to 4, nbval 2 to 3, the lane 2, profiles under 1. Where
a sitting is shorter than a part, run its stages in turns with --only; a sweep cut short goes on
from its checkpoint (build/sweep/) when the bench stage runs again on the same sources.

  validate  every step checked on the shape matrix, the GPU tests (the known-wrong kernels of
            tests/wrong_kernels/ among them), the grader over every solution (correct) and every
            stub (not implemented yet), compute-sanitizer's four tools
  lane      the sanitizer lane a learner runs (`grade exNN --sanitize`) over every solution and stub
  results   the benchmark sweep into results/<device>.json, the README table and plots, Nsight
            Compute's profiles into results/profiles/ (where the counters can be read), every
            notebook executed in place, then nbval over the notebooks

`make gpu-check` runs all three; `make gpu-validate`, `make gpu-lane` and `make gpu-results` one each, and
`python -m mla_lab gpu-check --only STAGE ...` the stages named. Logs go to $MLA_LAB_LOGS
(default build/gpu-check/), one file per stage.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from .steps import REPO, STEPS

PYTHON = sys.executable
MLA = [PYTHON, "-m", "mla_lab"]
SOLUTIONS = {"MLA_LAB_EXERCISE_SOURCE": "solution"}
# compute-sanitizer slows a kernel by 10-1000x: small odd shapes, one trial, and a limit per tool.
SANITIZER_SECONDS = 240
ALL_STEPS = [str(s.number) for s in STEPS]

# The notebooks' kernels start in notebooks/: they find mla_lab through PYTHONPATH where it is not installed.
IMPORTABLE = {"PYTHONUNBUFFERED": "1",
              "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

PARTS = {
    "validate": [
        ("doctor", MLA + ["doctor"], {}),
        ("check", MLA + ["check"], {}),
        ("gpu-tests", [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"], SOLUTIONS),
        ("grade-solutions", MLA + ["grade", "--all", "--variant", "solution"], {}),
        ("grade-stubs", MLA + ["grade", "--all", "--variant", "exercise", "--expect-stubs"], {}),
        *((f"{tool}", ["timeout", str(SANITIZER_SECONDS), "compute-sanitizer", "--tool", tool, "--print-limit", "10",
                       "--error-exitcode", "1", *MLA, "check", "--quick", *ALL_STEPS], {})
          for tool in ("memcheck", "initcheck", "racecheck", "synccheck")),
    ],
    # The sanitizer lane as a learner runs it (python -m mla_lab grade exNN --sanitize), over every
    # solution, then over the stubs (each answers "not implemented yet").
    "lane": [
        ("lane-solutions", MLA + ["grade", "--all", "--sanitize", "--variant", "solution"], {}),
        ("lane-stubs", MLA + ["grade", "--all", "--sanitize", "--variant", "exercise", "--expect-stubs"], {}),
    ],
    "results": [
        ("bench", MLA + ["bench", "--resume", "--command-line", "make gpu-results"], {}),
        ("results", MLA + ["results"], {}),
        ("profile", MLA + ["profile"], {}),
        ("notebooks", MLA + ["notebooks"], SOLUTIONS),
        ("nbval", [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
                   "notebooks"], SOLUTIONS),
    ],
}


def run(parts: list[str], only: list[str] | None = None) -> int:
    logs = Path(os.environ.get("MLA_LAB_LOGS", REPO / "build" / "gpu-check"))
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for part in parts:
        for name, command, env in PARTS[part]:
            if only and name not in only:
                continue
            start = time.perf_counter()
            log = logs / f"{part}-{name}.log"
            with open(log, "w") as out:
                code = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                      env={**os.environ, **IMPORTABLE, **env}).returncode
            seconds = time.perf_counter() - start
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            status = "ok" if code == 0 else ("timed out" if code == 124 else f"FAILED ({code})")
            rows.append((part, name, status, seconds, lines[-1][:90] if lines else ""))
            print(f"{part:9} {name:17} {status:11} {seconds:6.0f} s  {rows[-1][4]}", flush=True)
    print(f"\n{'part':9} {'stage':17} {'status':11} {'time':>8}  last line of its log ({logs})")
    for part, name, status, seconds, last in rows:
        print(f"{part:9} {name:17} {status:11} {seconds:6.0f} s  {last}")
    return 0 if all(row[2] == "ok" for row in rows) else 1
