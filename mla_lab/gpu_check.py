"""The whole GPU validation in three parts, ending with a short table: what ran, whether it
passed, how long it took, its last line. Measured stages on an H100: the GPU tests 2 minutes, the
sweep 6 to 7 (8 on an H200), the notebooks 2 to 4, nbval 2 to 3, the lane 2, profiles under 1. Where
a sitting is shorter than a part, give its length: `--sitting SECONDS` starts no stage that
might not end in time, and the sweep stops between points, keeping them in build/sweep/ for the
next sitting (bring that folder along to another machine); run the same command again to go on.

  validate  every step checked on the shape matrix, the GPU tests (the known-wrong kernels of
            tests/wrong_kernels/ among them), the grader over every solution (correct) and every
            stub (not implemented yet), compute-sanitizer's four tools
  lane      the sanitizer lane a learner runs (`grade exNN --sanitize`) over every solution and stub
  results   the benchmark sweep into results/<device>.json, the README table and plots, Nsight
            Compute's profiles into results/profiles/ (where the counters can be read), every
            notebook executed in place, then nbval over the notebooks
  round     what kernels/candidates/ holds, landed (mla_lab.candidates.play_round): the kept diffs
            and the candidates kept by their rules applied to the working tree, then the steps they
            change checked, sanitized and GPU-tested. Run before `results` (`make gpu-round`), so that
            the sweep times the steps as landed; where a round stage fails, `results` waits.

`make gpu-check` runs validate, lane and results; `make gpu-validate`, `make gpu-lane` and `make
gpu-results` one each, and `python -m mla_lab gpu-check --only STAGE ...` the stages named. Logs go
to $MLA_LAB_LOGS (default build/gpu-check/), one file per stage. A round's stages that passed, and
the results stages run with it, are not run again in a later sitting of the same round: its first
stage replays the landed changes into that sitting's fresh working tree, and puts back what the
results stages that passed wrote (kept in the round's folder, under outputs/).
"""

from __future__ import annotations

import os
import shutil
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
ROUND_SANITIZER_SECONDS = 150  # a round's steps' quick shapes: step 12's took well under that on an H100
ALL_STEPS = [str(s.number) for s in STEPS]

# The notebooks' kernels start in notebooks/: they find mla_lab through PYTHONPATH where it is not installed.
IMPORTABLE = {"PYTHONUNBUFFERED": "1",
              "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

SANITIZERS = ("memcheck", "initcheck", "racecheck", "synccheck")


def sanitized(tool: str, seconds: int, numbers: list[str]) -> list[str]:
    """compute-sanitizer's TOOL over `check --quick` of the steps NUMBERS, stopped after SECONDS."""
    return ["timeout", str(seconds), "compute-sanitizer", "--tool", tool, "--print-limit", "10", "--error-exitcode", "1",
            *MLA, "check", "--quick", *numbers]


def round_stages() -> list[tuple[str, list[str], dict]]:
    """The round's stages, for the steps that kernels/candidates/ changes (read before they land)."""
    from . import candidates

    changed = {c.step.number for c in candidates.all_candidates()}
    for diff in candidates.kept_changes():
        changed |= {s.number for s in STEPS if str(s.source().relative_to(REPO)) in candidates.files_changed_by(diff)}
    numbers = [str(n) for n in sorted(changed)]
    if not numbers:
        return [("round", MLA + ["candidates", "--round"], {})]
    # A step's own GPU tests and those parametrized over steps: test_stepN_..., [stepN] and [stepN-...].
    tests = " or ".join([f"step{n}{end}" for n in numbers for end in ("_", "]", "-")] + ["dispatch"])
    return [
        ("round", MLA + ["candidates", "--round"], {}),
        ("round-check", MLA + ["check", *numbers], {}),
        *((f"round-{tool}", sanitized(tool, ROUND_SANITIZER_SECONDS, numbers), {}) for tool in SANITIZERS),
        ("round-tests", [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/test_gpu.py",
                         "-k", tests], SOLUTIONS),
    ]


PARTS = {
    "validate": [
        ("doctor", MLA + ["doctor"], {}),
        ("check", MLA + ["check"], {}),
        ("gpu-tests", [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"], SOLUTIONS),
        ("grade-solutions", MLA + ["grade", "--all", "--variant", "solution"], {}),
        ("grade-stubs", MLA + ["grade", "--all", "--variant", "exercise", "--expect-stubs"], {}),
        *((f"{tool}", sanitized(tool, SANITIZER_SECONDS, ALL_STEPS), {}) for tool in SANITIZERS),
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
    "round": round_stages,  # read when it runs: what kernels/candidates/ holds then
}
DEFAULT_PARTS = ["validate", "lane", "results"]


# Seconds allowed a stage in a sitting (--sitting): above the times measured on an H100 or H200 where
# the docstring gives one (GPU tests, notebooks, nbval, lane, profiles), a generous guess for the
# rest. A stage with less time left than this waits for the next sitting instead of being killed.
STAGE_SECONDS = {"doctor": 30, "check": 120, "gpu-tests": 180, "grade-solutions": 120, "grade-stubs": 60,
                 **{tool: SANITIZER_SECONDS for tool in SANITIZERS},
                 "lane-solutions": 180, "lane-stubs": 120, "results": 30, "profile": 90, "notebooks": 270,
                 "nbval": 240,
                 # A round on an H100 (three candidates judged, step 12 checked, sanitized, GPU-tested): 215 s.
                 "round": 240, "round-check": 60, **{f"round-{tool}": 90 for tool in SANITIZERS}, "round-tests": 120}
# The sweep's longest point (V3 at 16384 tokens) with room to spare: a sitting's sweep starts no
# point later than this before the sitting ends. A sweep's record keeps each point's seconds.
LONGEST_POINT_SECONDS = 100
CUT_SHORT = 3  # bench's exit code when --stop-after ended it between points
# What the results stages write into the working tree, which a GPU machine replaces at each sitting.
OUTPUTS = ("README.md", "results", "notebooks")


def run(parts: list[str], only: list[str] | None = None, sitting: float | None = None) -> int:
    """The stages of `parts` (or those named in `only`), each into its log, then the table. With
    `sitting` (seconds), no stage starts that might not end in time: the sweep stops between points
    and keeps them for the next sitting (bench --resume --stop-after), and the stages after a sweep
    cut short wait for it. Returns 0 when every stage ran and passed."""
    logs = Path(os.environ.get("MLA_LAB_LOGS", REPO / "build" / "gpu-check"))
    logs.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + sitting if sitting is not None else None
    rows = []
    sweep_cut_short = round_unpassed = notebooks_unrun = False
    in_round = "round" in parts

    def report(part: str, name: str, status: str, seconds: float, last: str) -> None:
        rows.append((part, name, status, seconds, last))
        print(f"{part:9} {name:17} {status:11} {seconds:6.0f} s  {last}", flush=True)

    for part in parts:
        stages = PARTS[part]() if callable(PARTS[part]) else PARTS[part]
        for name, command, env in stages:
            if only and name not in only:
                continue
            left = deadline - time.perf_counter() if deadline is not None else None
            if sweep_cut_short and part == "results":
                report(part, name, "waits", 0, "for the sweep: run this sitting again to go on with it")
                continue
            if round_unpassed and part == "results":
                report(part, name, "waits", 0, "for every stage of the round to pass: it would time what did not")
                continue
            if name == "nbval" and notebooks_unrun:  # it compares the notebooks' stored outputs with this code
                report(part, name, "waits", 0, "for the notebooks to run in this sitting: their outputs are older")
                continue
            # The round's first stage replays its changes into this sitting's tree: it always runs.
            remembered = (part == "round" and name != "round") or (in_round and part == "results")
            passed = round_folder() / f"passed-{name}" if remembered else None
            if passed is not None and passed.exists():
                report(part, name, "done", 0, "passed in an earlier sitting of this round")
                continue
            if left is not None:
                needs = LONGEST_POINT_SECONDS + 30 if name == "bench" else STAGE_SECONDS.get(name, 0)
                if left < needs:
                    report(part, name, "no time", 0, f"{left:.0f} s left of the sitting, it takes up to {needs} s")
                    round_unpassed |= part == "round"
                    notebooks_unrun |= name == "notebooks"
                    continue
                if name == "bench":
                    command = [*command, "--stop-after", f"{left - LONGEST_POINT_SECONDS:.0f}"]
            start, started_at = time.perf_counter(), time.time()
            log = logs / f"{part}-{name}.log"
            with open(log, "w") as out:
                try:
                    code = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                          env={**os.environ, **IMPORTABLE, **env}, timeout=left).returncode
                except subprocess.TimeoutExpired:
                    code = 124
            seconds = time.perf_counter() - start
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            if name == "bench" and code == CUT_SHORT:
                status, sweep_cut_short = "cut short", True
            else:
                status = "ok" if code == 0 else ("timed out" if code == 124 else f"FAILED ({code})")
            if part == "round":
                round_unpassed |= status != "ok"
            if status == "ok" and name == "round":
                restore_outputs()
            if status == "ok" and passed is not None:
                if part == "results":
                    keep_outputs(started_at - 1)  # file times lag the clock by up to a tick
                passed.touch()
            report(part, name, status, seconds, lines[-1][:90] if lines else "")
    print(f"\n{'part':9} {'stage':17} {'status':11} {'time':>8}  last line of its log ({logs})")
    for part, name, status, seconds, last in rows:
        print(f"{part:9} {name:17} {status:11} {seconds:6.0f} s  {last}")
    return 0 if all(row[2] in ("ok", "done") for row in rows) else 1


def keep_outputs(since: float) -> None:
    """Copy what a results stage wrote into the working tree (the files under OUTPUTS changed since
    `since`, a time.time()) into the round's folder, for the round's later sittings."""
    for top in OUTPUTS:
        for path in [REPO / top] if (REPO / top).is_file() else sorted((REPO / top).rglob("*")):
            if path.is_file() and path.stat().st_mtime >= since:
                kept = round_folder() / "outputs" / path.relative_to(REPO)
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, kept)


def restore_outputs() -> None:
    """Put back into the working tree what the round's earlier sittings' results stages wrote."""
    kept = round_folder() / "outputs"
    for path in sorted(kept.rglob("*")) if kept.exists() else []:
        if path.is_file():
            target = REPO / path.relative_to(kept)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def round_folder() -> Path:
    """Where a round keeps what it landed (mla_lab.candidates.ROUND), and here which stages passed."""
    from .candidates import ROUND

    return ROUND
