"""One step as another commit had it, beside this checkout's: the A/B that keeps or rejects a change.

    python -m mla_lab ab 6 --against 2633931
    python -m mla_lab ab 6 --against HEAD --points "v2_lite@1 bf16" "v2_lite@4096 bf16"
    python -m mla_lab ab 10 --against build/old_09.cu    (a copy without history: the older source as a file)

The step at REV comes from a checkout of REV (`mla_lab.sass.worktree`) and is built as REV's own
registry says (its architectures and definitions, `mla_lab.sass.registry_of`), against REV's course
headers, into a library of its own. Where the checkout has no history (a GPU machine lent a copy of
the working tree knows its HEAD only), the older source comes as a file, `git show REV:PATH > FILE`
made where the history is, and is built beside this checkout's headers as this checkout's registry
builds the step. This checkout's source is built as the course builds it. At each point
`bench.measure` checks both against float64 (NaN-poisoned output, fresh random inputs), then times
them beside eager and cuBLAS in interleaved rounds of CUDA-graph replays, one process, one GPU,
their inputs rotated past the L2 as the sweep rotates them (a decode call's weights come from
DRAM: warm in L2, cuBLAS's fp32 took 7.3 µs at one V2-Lite token on an H100, 9.5 rotated). A step
that prepares its weights once (steps 9 and 10, fp32) is timed both without and with them
prepared, outside the timing. The table gives each median with its p10-p90 and says
whether the new one is faster or slower outside that spread.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from . import bench, build, sass, steps, sweep

# Few tokens to prefill at the three real widths: where the decode, split and prefill paths run.
DEFAULT_SHAPES = ("v2_lite@1", "v2_lite@128", "v2_lite@512", "v2_lite@4096", "v3_tp8@1", "v3_tp8@300",
                  "v3_tp8@4096", "v3@64", "v3@1000")


class ABProblem(RuntimeError):
    """A commit, step or point the A/B cannot use: one line that says which, and what to give."""


def _git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=steps.REPO, capture_output=True, text=True)
    if result.returncode != 0:
        said = result.stderr.strip().splitlines()
        raise ABProblem(f"git {' '.join(args)}: {said[-1] if said else 'failed'}")
    return result.stdout


def commit_of(rev: str) -> str:
    """The full commit hash REV names (a branch, a tag, HEAD~2, a short hash)."""
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except ABProblem:
        raise ABProblem(f"{rev!r} is not a commit of this repository (git log --oneline lists them); where the "
                        "checkout has no history, give the older source as a file: git show REV:PATH > FILE, "
                        "then --against FILE") from None


@contextlib.contextmanager
def source_at(rev: str, step: steps.Step):
    """Yield (source, arch_flags, defines): the step's .cu as REV had it, in a checkout of REV beside
    REV's course headers, and how REV's registry built it. `build` adds this checkout's kernels/ with
    -I, so a solution's source is copied into REV's kernels/, where its quoted includes look first."""
    commit = commit_of(rev)
    scratch = steps.REPO / "build"  # ignored by git; inside the checkout, as the course's sources are
    scratch.mkdir(exist_ok=True)
    with sass.worktree(commit, scratch) as tree:
        try:
            built = sass.registry_of(tree).get(step.number)
        except subprocess.CalledProcessError:
            raise ABProblem(f"{rev}'s registry (mla_lab/steps.py) could not be read there: give a newer commit") from None
        if built is None:
            raise ABProblem(f"{rev} has no step {step.number}")
        source = Path(built["source"])
        beside = tree / "kernels" / source.name
        if source != beside:
            shutil.copyfile(source, beside)
        yield beside, tuple(f for f in built["flags"] if f.startswith("-gencode")), tuple(built["defines"])


@contextlib.contextmanager
def source_in_file(path: Path, step: steps.Step):
    """Yield (source, arch_flags, defines) for an older source of the step kept as a file: a copy of
    it beside a copy of this checkout's kernels/ (its quoted includes look there first), built as
    this checkout's registry builds the step; the copies are removed afterwards."""
    scratch = steps.REPO / "build"
    scratch.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        kernels = Path(folder) / "kernels"
        shutil.copytree(steps.KERNELS_DIR, kernels)
        beside = kernels / step.filename
        shutil.copyfile(path, beside)
        yield beside, step.arch_flags, step.defines


def older_source(against: str, step: steps.Step):
    """`source_in_file` where AGAINST is a file, else `source_at` the commit it names."""
    return source_in_file(Path(against), step) if Path(against).is_file() else source_at(against, step)


def label_of(against: str) -> str:
    """What names the older form in its library: the commit, or the file's contents."""
    if Path(against).is_file():
        return hashlib.sha256(Path(against).read_bytes()).hexdigest()[:12]
    return commit_of(against)[:12]


@dataclass
class Row:
    point: str
    before: bench.Timing
    after: bench.Timing
    peers: dict[str, bench.Timing]

    @property
    def verdict(self) -> str:
        """Faster or slower outside the spread (one side's p90 below the other's p10), or inside it."""
        if self.after.high_us < self.before.low_us:
            return "faster"
        if self.after.low_us > self.before.high_us:
            return "slower"
        return "inside the spread"


def parse_point(name: str):
    """A sweep point such as "v2_lite@128 bf16": (shape, dtype)."""
    try:
        _, shape, _, dtype = sweep.point(name)
    except (KeyError, ValueError):
        raise ABProblem(f"{name!r} is not a sweep point: give a shape of {', '.join(sweep.SHAPES)} "
                        f"and a dtype, such as \"v2_lite@128 bf16\"") from None
    return shape, dtype


def run(step_key: int | str, rev: str, points: list[str]) -> list[Row]:
    """Check, then time, the step at REV (a commit, or a file holding its older source) and here at
    each point. Every argument is checked before a GPU is asked for."""
    try:
        step = steps.get(step_key)
    except (KeyError, ValueError) as unknown:
        raise ABProblem(str(unknown)) from None
    parsed = parsed_points(points)
    with built(step, rev) as before:
        return compare(before, steps.load(step), parsed)


def parsed_points(points: list[str] | tuple[str, ...]) -> list[tuple]:
    """Each sweep point as (name, shape, dtype), or ABProblem naming the first that is none."""
    return [(name, *parse_point(name)) for name in points]


@contextlib.contextmanager
def built(step: steps.Step, source: str):
    """The step as SOURCE has it (a commit, or a file holding a form of its .cu), built into a
    library of its own and loaded; the GPU is asked for only once SOURCE is found."""
    with older_source(source, step) as (path, arch_flags, defines):
        build.require_gpu()
        library = build.build_step(path, f"mla_ab_{step.number:02d}_{step.name}_{label_of(source)}", arch_flags, defines)
        yield steps.Kernel(step, path, library)


def compare(before: steps.Kernel, after: steps.Kernel, parsed: list[tuple], checked: bool = True,
            beside: dict[str, steps.Kernel] | None = None) -> list[Row]:
    """Both forms checked, then timed beside eager and cuBLAS (and the kernels `beside`, by name:
    peers like them), at each (name, shape, dtype), with their inputs rotated past the L2 as in the
    sweep; a wrong or failing form raises AssertionError. Unchecked, both are timed the same way:
    for a probe, a copy of a step cut short on purpose."""
    rows = []
    both_prepare = before.prepares_weights and after.prepares_weights
    for name, shape, dtype in parsed:
        # Steps that keep a layout of their own (fp32 only) are timed as inference calls them too.
        prepared = both_prepare and dtype == torch.float32
        suffixes = ("", sweep.PREPARED_SUFFIX) if prepared else ("",)
        ways = {**sweep.ways_to_call("before", before, prepared), **sweep.ways_to_call("after", after, prepared)}
        contenders = {**{side + s: ways[side + s] for s in suffixes for side in ("before", "after")}, **(beside or {})}
        timings = {t.name: t for t in bench.compare(contenders, shape, dtype, "graph", rotate_inputs=True,
                                                    checked=checked)}
        # Each pair popped in turn; what stays in timings, and in every row, is the peers.
        rows += [Row(name + s, timings.pop("before" + s), timings.pop("after" + s), timings) for s in suffixes]
    return rows


def table(rows: list[Row], before: str, after: str = "this checkout", verdicts: bool = True) -> str:
    """Medians with their spread, the peers, the ratio and (with `verdicts`; not for a probe, which
    is meant to be faster) whether `after` is faster or slower outside the spread."""
    def cell(t: bench.Timing) -> str:
        return f"{t.median_us:,.1f} ({t.low_us:,.1f}-{t.high_us:,.1f})"

    last = " |" if verdicts else ""
    # Peers other than the two every row has (a rival step timed beside), with their spread.
    rivals = sorted({name for r in rows for name in r.peers} - {"cuBLAS concat", "eager"})
    lines = [f"| point | {before} µs | {after} µs |{''.join(f' {n} µs |' for n in rivals)} cuBLAS concat µs | "
             f"eager µs | new / old |{last}", "|---" * (6 + len(rivals) + verdicts) + "|"]
    for r in rows:
        peer = {name: f"{t.median_us:,.1f}" for name, t in r.peers.items()}
        timed = [cell(r.before), cell(r.after), *(cell(r.peers[n]) if n in r.peers else "-" for n in rivals),
                 peer.get("cuBLAS concat", "-"), peer.get("eager", "-"), f"{r.after.median_us / r.before.median_us:.3f}"]
        lines.append(f"| {r.point} | {' | '.join(timed)} |" + (f" {r.verdict} |" if verdicts else ""))
    return "\n".join(lines)
