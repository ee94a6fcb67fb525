"""A step's next change, prepared on the CPU, kept or rejected by one GPU run.

A candidate is a patch against its step's source, `kernels/candidates/NN_what.patch` (NN: the
step). The text above its diff says what it changes, why, and what it predicts, and ends with the
two lines read here:

    Points: v2_lite@1 bf16, v2_lite@16 bf16, v3_tp8@1 bf16
    Keep: 0.2 us faster at v2_lite@16 bf16

A candidate that takes a step to shapes it did not take before names the step it must beat there:
"Keep: 2 us faster than step 6 at v2_lite@64 bf16" times step 6 beside it at every point and
measures the gain against step 6 (at such a point the step as it stands runs its fallback). One
that needs wgmma in a step built for sm_90 says "Arch: sm_90a": it is built for that target, and
kept, the step's target in mla_lab/steps.py changes with it.

`python -m mla_lab candidates` (`make gpu-candidates`, on a GPU) applies each patch to a copy of
this checkout's step and checks it on the whole shape matrix (float64 reference, odd shapes,
NaN-poisoned outputs, fresh inputs), then checks and times it beside the step as it stands, eager
and cuBLAS, at its points, in one process (`mla_lab.ab`). Its rule, written before the run,
then keeps it where its median is at least that much lower at that point and it is slower
(outside the spread) at none of its points, and rejects it otherwise, or where it is wrong. Each
outcome is printed as soon as it is known: one that hangs leaves those before it reported. A kept
candidate becomes the step (`git apply kernels/candidates/NAME.patch`, then `make gpu-results`); a
rejected one becomes a line in the step's notes, and its patch is deleted. Kept candidates whose
sweep could not run on the same machine wait in kernels/candidates/kept/ as one diff that makes
them the step, with the dispatcher's and the tests' changes (`kept_changes`), to land with a
sweep. The tests apply every patch and every kept diff and compile the result with nvcc, so a
change that no longer fits its step fails there, not on the GPU; a patch also on top of its step's
kept diff, which the next GPU run applies before it judges the patch.

A probe is a patch with "Probe: what it times" in place of the rule: a copy of the step cut short
on purpose (its outputs are wrong), timed unchecked beside the step and cuBLAS at its points, to
see where the step's time goes before the next change is written. It is never judged or applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import ab, check, steps, sweep

CANDIDATES_DIR = steps.KERNELS_DIR / "candidates"
FIELD = re.compile(r"^(Points|Keep|Probe|Arch): *(.*)$", re.M)
ARCHES = {"sm_90a": steps.HOPPER_ARCH_FLAGS}  # the targets a candidate may ask for in place of its step's
KEEP = re.compile(r"^(?P<gain>\d+(?:\.\d+)?) us faster (?:than step (?P<rival>\d+) )?at (?P<point>.+)$")
TARGET = re.compile(r"^\+\+\+ b/(\S+)", re.M)


class CandidateProblem(ab.ABProblem):
    """A candidate that cannot be read or applied: one line naming the file and the fix."""


@dataclass(frozen=True)
class Candidate:
    path: Path
    step: steps.Step
    target: str  # the step's source, as the patch names it (kernels/12_weight_stream.cu)
    points: tuple[str, ...]
    keep_point: str | None  # None for a probe
    keep_gain_us: float | None
    point_shapes: tuple[tuple, ...]  # each point as (name, shape, dtype), as ab.compare takes them
    probe: str | None = None  # what a probe times
    rival: steps.Step | None = None  # the step whose time the gain is measured against, if not its own
    arch: str | None = None  # the target it is built for ("sm_90a"), where not its step's

    @property
    def arch_flags(self) -> tuple[str, ...] | None:
        return ARCHES[self.arch] if self.arch else None

    @property
    def built_as(self) -> steps.Step:
        """Its step, with the candidate's target where it names one: what the candidate is built as."""
        return dataclasses.replace(self.step, arch_flags=self.arch_flags) if self.arch else self.step

    @property
    def against(self) -> str:
        """The rival step its rule names, as its column in the table reads (only where it names one)."""
        return f"step {self.rival.number}"

    @property
    def name(self) -> str:
        return self.path.stem

    @classmethod
    def load(cls, path: Path) -> Candidate:
        text = path.read_text()
        header = text[:text.find("\n--- ")] if "\n--- " in text else text

        def problem(what: str) -> CandidateProblem:
            return CandidateProblem(f"{path.name}: {what}")

        try:
            step = steps.get(int(path.name[:2]))
        except (KeyError, ValueError):
            raise problem("its name must begin with the step's number, as in 12_what.patch") from None
        fields = dict(FIELD.findall(header))
        arch = fields.pop("Arch", "").strip() or None
        if arch and arch not in ARCHES:
            raise problem(f'its "Arch: {arch}" is no target a candidate may ask for; it may ask for '
                          f'{", ".join(ARCHES)}')
        if set(fields) not in ({"Points", "Keep"}, {"Points", "Probe"}):
            raise problem('above its diff it needs the lines "Points: POINT, POINT" and "Keep: X us faster at POINT" '
                          '(or, for a probe, "Probe: what it times")')
        points = tuple(p.strip() for p in fields["Points"].split(","))
        point_shapes = tuple(ab.parsed_points(points))
        targets = set(TARGET.findall(text))
        expected = str(step.source().relative_to(steps.REPO))
        if targets != {expected}:
            raise problem(f"it must patch {expected} (as b/{expected}) and nothing else; it patches {sorted(targets)}")
        if "Probe" in fields:
            return cls(path, step, expected, points, None, None, point_shapes, fields["Probe"].strip(), arch=arch)
        keep = KEEP.match(fields["Keep"].strip())
        if keep is None or keep["point"] not in points:
            raise problem('its rule must read "Keep: X us faster at POINT" (or "... faster than step N at POINT"), '
                          'POINT one of its Points')
        try:
            rival = steps.get(int(keep["rival"])) if keep["rival"] else None
        except ValueError:
            raise problem(f"its rule names step {keep['rival']}, which the course does not have") from None
        return cls(path, step, expected, points, keep["point"], float(keep["gain"]), point_shapes, rival=rival,
                   arch=arch)


def all_candidates(names: list[str] | None = None) -> list[Candidate]:
    """Every candidate in kernels/candidates/, or those NAMES (file stems) in that order, each read
    and applied once to its step: one that no longer applies is named here, before any GPU work."""
    found = {path.stem: path for path in sorted(CANDIDATES_DIR.glob("*.patch"))}
    unknown = [n for n in names or [] if n not in found]
    if unknown:
        raise CandidateProblem(f"no candidate {', '.join(unknown)}; kernels/candidates/ holds "
                               f"{', '.join(found) or 'none'}")
    chosen = [Candidate.load(found[n]) for n in names or found]
    for candidate in chosen:
        with applied(candidate):
            pass
    return chosen


def _git_apply(diff: Path, root: Path, *flags: str) -> subprocess.CompletedProcess:
    # git looks no higher than ROOT for a repository, where ROOT is a folder outside the checkout.
    environment = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.parent)}
    return subprocess.run(["git", "apply", *flags, str(diff.resolve())], cwd=root, env=environment,
                          capture_output=True, text=True)


def _first_line(result: subprocess.CompletedProcess) -> str:
    said = result.stderr.strip().splitlines()
    return said[0] if said else "git apply failed"


@contextlib.contextmanager
def applied_to_copies(diff: Path, names: list[str], after: Path | None = None):
    """Yield a folder outside the checkout holding copies of the files NAMES (repository paths) with
    the diff applied (on top of the diff AFTER, where given: a kept change it must fit too), so
    that git applies it there, as patch would, not to this checkout; the folder goes afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(steps.REPO / name, Path(folder) / name)
        for each in ([after] if after else []) + [diff]:
            # Of the kept change only NAMES: the files besides them that it changes are not copied.
            only = [f"--include={name}" for name in names] if each is after else []
            result = _git_apply(each, Path(folder), *only)
            if result.returncode != 0:
                they, them = ("it is", "this source") if len(names) == 1 else ("they are", "them")
                now = f"with {after.name} applied" if each is diff and after else "now"
                raise CandidateProblem(f"{each.name} does not apply to {', '.join(names)} as {they} {now} "
                                       f"({_first_line(result)}): make it again against {them}")
        yield Path(folder)


@contextlib.contextmanager
def applied(candidate: Candidate):
    """Yield the step's source with the candidate's patch applied, in a copy outside the checkout."""
    with applied_to_copies(candidate.path, [candidate.target]) as folder:
        yield folder / candidate.target


def kept_changes() -> list[Path]:
    """The changes judged and kept but not yet swept: kernels/candidates/kept/*.diff."""
    return sorted((CANDIDATES_DIR / "kept").glob("*.diff"))


def files_changed_by(diff: Path) -> list[str]:
    """The files a diff changes, as it names them (paths in the repository)."""
    return TARGET.findall(diff.read_text())


@dataclass
class Outcome:
    candidate: Candidate
    rows: list[ab.Row]
    kept: bool
    why: str


def judge(candidate: Candidate, rows: list[ab.Row]) -> Outcome:
    """The candidate's own rule: at least its gain at its point, by the medians, over its step (or
    the rival step its rule names), and slower than its step at none."""
    slower = [r.point for r in rows if r.verdict == "slower"]
    row = next(r for r in rows if r.point == candidate.keep_point)
    baseline = row.peers[candidate.against] if candidate.rival else row.before
    gain = baseline.median_us - row.after.median_us
    than = f" than {candidate.against}" if candidate.rival else ""
    gained = f"{gain:+.2f} µs{than} at {candidate.keep_point}, {candidate.keep_gain_us:g} asked"
    if slower:
        return Outcome(candidate, rows, False, f"rejected: slower at {', '.join(slower)}; {gained}")
    if gain < candidate.keep_gain_us:
        return Outcome(candidate, rows, False, f"rejected: {gained}; slower nowhere")
    return Outcome(candidate, rows, True, f"kept: {gained}; slower nowhere")


def each_judged(chosen: list[Candidate]) -> Iterator[Outcome]:
    """Each candidate (as `all_candidates` read them) applied, built, checked and timed beside its
    step as it stands, then judged; each probe applied, built and timed, unchecked. Each outcome is
    yielded as soon as it is known, so a later candidate that hangs or outlasts the machine's time
    leaves those before it reported."""
    for candidate in chosen:
        with applied(candidate) as source, ab.built(candidate.built_as, str(source)) as after:
            if candidate.probe:
                rows = ab.compare(steps.load(candidate.step), after, list(candidate.point_shapes), checked=False)
                yield Outcome(candidate, rows, False, f"probe, timed unchecked: {candidate.probe}")
                continue
            wrong = [f"{label}: {verdict}" for label, call in sweep.ways_to_call(candidate.name, after).items()
                     for verdict in check.check_matrix(call, "cuda", trials=1) if not verdict.ok]
            if wrong:
                yield Outcome(candidate, [], False, f"rejected: {len(wrong)} checks of the shape matrix failed, "
                                                    f"the first {wrong[0]}")
                continue
            try:
                rivals = {candidate.against: steps.load(candidate.rival)} if candidate.rival else {}
                rows = ab.compare(steps.load(candidate.step), after, list(candidate.point_shapes), beside=rivals)
            except AssertionError as wrong:  # ab.compare's check against float64, at the timed points
                yield Outcome(candidate, [], False, f"rejected: {wrong}")
                continue
        yield judge(candidate, rows)


def report(outcomes: list[Outcome]) -> str:
    parts = []
    for o in outcomes:
        table = (ab.table(o.rows, f"step {o.candidate.step.number}", o.candidate.name, verdicts=not o.candidate.probe)
                 if o.rows else "")
        parts.append("\n".join(filter(None, [f"## {o.candidate.path.name}", table, f"**{o.why}**"])))
    return "\n\n".join(parts)


# ---- A round: what kernels/candidates/ holds, landed on a GPU machine in one go ----------------------
# `python -m mla_lab candidates --round` (the first stage of `make gpu-round`) applies each kept diff
# to the working tree, judges every candidate against the step with them, and applies the kept ones
# too, keeping a copy of each change it applied, in order, in build/gpu-round/. A GPU machine's working
# tree is a fresh copy of the checkout at each sitting: a later sitting of the same round replays
# those copies instead of judging again, and the checkout that commits the round replays them too
# (`--replay`), deleting the diffs and patches that are the steps now.
ROUND = steps.REPO / "build" / "gpu-round"
LANDED = "landed.txt"  # the changes applied, in order: "copy<TAB>where it came from", one a line
JUDGED = "judged"      # written once every candidate is judged: the round is whole, to be replayed


def round_landed(folder: Path = ROUND) -> list[tuple[Path, str]]:
    """The round's changes in the order applied: each copy in FOLDER and the repository path of the
    kept diff or candidate it came from."""
    manifest = folder / LANDED
    if not manifest.exists():
        return []
    return [(folder / copy, origin) for copy, origin in
            (line.split("\t") for line in manifest.read_text().splitlines() if line)]


def land(change: Path, folder: Path = ROUND, root: Path = steps.REPO) -> None:
    """Apply CHANGE (a kept diff or a kept candidate's patch) to the working tree at ROOT and keep a
    copy in FOLDER, after the round's earlier ones."""
    result = _git_apply(change, root)
    if result.returncode != 0:
        raise CandidateProblem(f"{change.name} does not apply to the working tree with the round's earlier changes "
                               f"({_first_line(result)}): judge it again in the next round")
    folder.mkdir(parents=True, exist_ok=True)
    copy = f"{len(round_landed(folder)) + 1:02d}_{change.name}"
    shutil.copyfile(change, folder / copy)
    with open(folder / LANDED, "a") as manifest:
        manifest.write(f"{copy}\t{change.resolve().relative_to(root.resolve())}\n")


def replay(folder: Path = ROUND, root: Path = steps.REPO, delete_origins: bool = False) -> list[str]:
    """Apply the round's changes in FOLDER, in order, to the working tree at ROOT (a later sitting's
    fresh copy, or the checkout that commits the round); with DELETE_ORIGINS the kept diffs and
    candidates they came from go, as they are the steps now. Returns their repository paths."""
    if not folder.exists():
        raise CandidateProblem(f"no round in {folder}: bring back build/gpu-round/ from the GPU machine that ran "
                               "`make gpu-round`")
    if not (folder / JUDGED).exists():
        raise CandidateProblem(f"{folder} holds no whole round (its judging did not end): play it again")
    origins = []
    for copy, origin in round_landed(folder):
        result = _git_apply(copy, root)
        if result.returncode != 0:
            raise CandidateProblem(f"{copy.name} (from {origin}) does not apply to {root} as it is "
                                   f"({_first_line(result)}): replay the round on the checkout it was played from")
        if delete_origins:
            (root / origin).unlink(missing_ok=True)
        origins.append(origin)
    return origins


def play_round(folder: Path = ROUND, root: Path = steps.REPO) -> Iterator[str]:
    """The round in this working tree, as lines to print: replayed where FOLDER holds a whole one,
    else played afresh (FOLDER emptied first): each kept diff applied, every candidate judged
    against the steps with them (on a GPU), each kept one applied. The judged outcomes also go to
    FOLDER/verdicts.md."""
    if (folder / JUDGED).exists():
        origins = replay(folder, root)
        yield f"replayed the round's {len(origins)} changes: {', '.join(origins) or 'none'}"
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for diff in kept_changes():
        land(diff, folder, root)
        yield f"applied {diff.name}: kept before, it lands with this round's sweep"
    outcomes = []
    for outcome in each_judged(all_candidates()):
        outcomes.append(outcome)
        yield f"\n{report([outcome])}\n"
    (folder / "verdicts.md").write_text(report(outcomes) + "\n")
    for outcome in outcomes:
        if outcome.kept:
            try:
                land(outcome.candidate.path, folder, root)
                yield f"applied {outcome.candidate.path.name}: kept"
            except CandidateProblem as clash:  # kept alone, but not on top of one kept before it
                yield f"not applied: {clash}"
    (folder / JUDGED).write_text("")
    yield f"the round landed: {', '.join(origin for _, origin in round_landed(folder)) or 'nothing'}"
