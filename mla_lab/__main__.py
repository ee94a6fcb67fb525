"""python -m mla_lab doctor | toolkit | check | grade | hint | exercises | bench | results | sass | ab | candidates | gpu-check | kernelbench | notebooks"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def doctor(_: argparse.Namespace) -> int:
    from .build import setup_report

    print(setup_report())
    return 0


def toolkit(args: argparse.Namespace) -> int:
    from . import toolkit as cuda_toolkit

    if args.action == "install":
        return cuda_toolkit.install()
    compiler = cuda_toolkit.compiler()
    print(compiler.line())
    return 1 if compiler.problem else 0


def check_steps(args: argparse.Namespace) -> int:
    from . import build, check, steps, sweep

    build.require_gpu()
    failures = 0
    shapes, trials = (check.QUICK_SHAPES, 1) if args.quick else (check.SHAPE_MATRIX, 2)
    for key in args.steps or [s.number for s in steps.STEPS]:
        kernel = steps.load(key, args.variant)
        # A step with a layout of its own is checked twice: preparing on every call, and given the
        # weights prepared by `prepare` (here prepared afresh for each set of fresh weights).
        for label, call in sweep.ways_to_call(kernel.step.label, kernel).items():
            verdicts = check.check_matrix(call, "cuda", shapes, trials=trials)
            bad = [v for v in verdicts if not v.ok]
            failures += len(bad)
            worst = max(v.rel_error for v in verdicts)
            print(f"{label}: {len(verdicts) - len(bad)}/{len(verdicts)} checks passed, worst rel. error {worst:.1e}")
            for verdict in bad:
                print(f"  {verdict}")
    return 1 if failures else 0


def grade(args: argparse.Namespace) -> int:
    from . import steps
    from .grade import grade as grade_one

    names = [s.exercise for s in steps.exercises()] if args.all else args.exercises
    if args.sanitize:
        from .sanitize import sanitize_many

        runs = sanitize_many(names, args.variant)
        expected = "not implemented" if args.expect_stubs else "clean"
        return 0 if all(r.status == expected for tools in runs for r in tools) else 1
    results = [grade_one(name, args.variant) for name in names]
    expected = "not implemented" if args.expect_stubs else "correct"
    return 0 if all(r.status in (expected, "needs hopper") for r in results) else 1  # Hopper's own, elsewhere


def profile(args: argparse.Namespace) -> int:
    from . import profile as profiles

    if args.calls:
        profiles.calls(args.calls, args.variant)
        return 0
    from . import build

    if not args.exercise:
        build.require_gpu()
        try:
            print(f"wrote {profiles.run_all()}")
        except RuntimeError as refused:
            print(f"no profiles stored: {refused}")
            return 1
        return 0
    from . import steps
    from .grade import IDEA_POINTS

    step = steps.get(args.exercise)
    point = IDEA_POINTS.get(step.number, "toy bf16")
    problem = build.run_problem()
    try:
        if problem:
            raise RuntimeError(problem)
        yours = profiles.profile_call(step.number, point, "exercise")
        print(f"{step.exercise} (yours) at {point}:\n  {profiles.describe(yours)}")
    except RuntimeError as why:
        print(f"{step.exercise}: no profile of yours here: {why}")
    print(profiles.show_nearest(step.number, point))
    return 0


def hint(args: argparse.Namespace) -> int:
    from .hints import hint as show

    show(args.exercise, args.level, args.part)
    return 0


def exercises(args: argparse.Namespace) -> int:
    from . import exercises as ex

    if args.check:
        problems = ex.out_of_sync()
        print("\n".join(problems) or "exercises/ is in sync with solutions/")
        return 1 if problems else 0
    written = ex.generate(force=args.force)
    print("\n".join(f"wrote {p.name}" for p in written) or "exercises/ was already up to date")
    return 0


def bench(args: argparse.Namespace) -> int:
    from . import build, sweep

    build.require_gpu()
    if args.compare:
        from . import compare

        print(compare.run("solution" if args.solutions else "exercise"))
        return 0
    command = args.command_line or " ".join(["python -m mla_lab", *sys.argv[1:]])
    peers = [] if args.no_peers else [p for p in sweep.PEERS if not (args.no_compile and p == "torch.compile")]
    plan = sweep.plan(args.steps or None, args.shapes or None, args.dtypes, args.modes, peers)
    device = torch.cuda.get_device_name()
    checkpoint = sweep.checkpoint_path_for(device, plan)
    done = sweep.whole_sweep_of_these_sources(device)
    if args.resume and not checkpoint.exists() and not args.out and plan == sweep.plan() and done is not None:
        print(f"{done.relative_to(sweep.REPO)} already holds a whole sweep of these sources: nothing to go on with")
        return 0
    try:
        record = sweep.run(args.steps or None, args.shapes or None, args.dtypes, args.modes, peers=peers,
                           command=command, checkpoint=checkpoint, resume=args.resume, stop_after_s=args.stop_after)
    except sweep.SweepCutShort as cut:
        print(cut)
        return 3
    path = Path(args.out) if args.out else sweep.sweep_path_for(record.meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.to_json() + "\n")
    checkpoint.unlink(missing_ok=True)
    wrong = [r for r in record.results if r.status == "wrong"]
    for r in wrong:
        print(f"WRONG {r.name} {r.shape} {r.dtype}: {r.note}")
    print(f"wrote {path} ({len(record.results)} results, {len(wrong)} wrong); "
          "plots and the README table: python -m mla_lab results")
    return 1 if wrong else 0


def results(args: argparse.Namespace) -> int:
    from . import plots, sweep

    if args.fingerprint:
        from . import fingerprint

        print(json.dumps(fingerprint.current(), indent=1))
        return 0
    paths = [Path(p) for p in args.files] or sweep.committed_sweeps()
    if not paths:
        print("no results/*.json yet: run `python -m mla_lab bench` on a GPU first", file=sys.stderr)
        return 2
    record = sweep.newest(paths)
    source = sweep.sweep_path_for(record.meta).name
    readme = sweep.README.read_text()
    updated = sweep.readme_with_table(readme, sweep.results_table(record, with_staleness=True))
    if args.check:
        if updated != readme:
            print(f"README.md's results table is not the one {source} gives: run `python -m mla_lab results`")
            return 1
        print(f"README.md's results table matches {source}")
        return 0
    sweep.README.write_text(updated)
    print(f"README.md: results table from {source}")
    for path in paths:
        for name, figure in plots.sweep_figures(sweep.Sweep.load(path)).items():
            target = path.with_name(f"{path.stem}_{name}.png")
            figure.savefig(target, dpi=110)
            print(f"wrote {target}")
    return 0


def sass(args: argparse.Namespace) -> int:
    from . import sass as machine_code

    rows = machine_code.compare(args.against)
    for number, before, after in rows:
        print(f"step {number:>2}: {before} -> {after}  {'identical' if before == after else 'CHANGED'}")
    changed = [number for number, before, after in rows if before != after]
    print(f"SASS identical to {args.against} for every step" if not changed else
          f"SASS changed for step(s) {', '.join(map(str, changed))}: run `make gpu-check` on a GPU")
    return 1 if changed else 0


def ab(args: argparse.Namespace) -> int:
    from . import ab as before_after
    from .bench import device_line

    points = args.points or [f"{shape} {args.dtype}" for shape in before_after.DEFAULT_SHAPES]
    rows = before_after.run(args.step, args.against, points)
    print(f"{device_line()}; graph replay, median µs (p10-p90), each checked against float64 first\n")
    print(before_after.table(rows, args.against))
    return 0


def candidates(args: argparse.Namespace) -> int:
    from . import candidates as prepared

    if args.replay:
        origins = prepared.replay(delete_origins=True)
        print(f"applied the round in {prepared.ROUND} to this checkout; now the steps, deleted: "
              f"{', '.join(origins) or 'nothing'}")
        left = sorted(p.name for p in prepared.CANDIDATES_DIR.glob("*.patch"))
        if left:
            print(f"judged and not landed (verdicts in {prepared.ROUND / 'verdicts.md'}): {', '.join(left)}; "
                  "each goes once its line (a rejection with the commit that holds it, or a probe's numbers) "
                  "is in its step's notes")
        return 0
    if args.round:
        from . import build

        build.require_gpu()
        for line in prepared.play_round():
            print(line, flush=True)
        return 0
    chosen = prepared.all_candidates(args.names)
    if not chosen:
        print("kernels/candidates/ holds no candidate: nothing to apply or judge")
        return 0
    if args.list:
        for c in chosen:
            rule = (f"a probe, timed unchecked: {c.probe}" if c.probe else
                    f"kept if {c.keep_gain_us:g} µs faster{f' than {c.against}' if c.rival else ''} at "
                    f"{c.keep_point} and slower than step {c.step.number} nowhere")
            built = f"; built for {c.arch}" if c.arch else ""
            print(f"{c.path.name}: step {c.step.number}, applies; at {', '.join(c.points)}; {rule}{built}")
        return 0
    from . import build
    from .bench import device_line

    build.require_gpu()  # before the device line names a GPU
    print(f"{device_line()}; graph replay, median µs (p10-p90); candidates checked against float64 first, "
          "probes timed unchecked", flush=True)
    for outcome in prepared.each_judged(chosen):  # each reported as it is known
        print(f"\n{prepared.report([outcome])}", flush=True)
    return 0


def gpu_check(args: argparse.Namespace) -> int:
    from . import build
    from .gpu_check import DEFAULT_PARTS, run

    build.require_gpu()
    return run(args.parts or DEFAULT_PARTS, args.only, args.sitting)


def kernelbench(args: argparse.Namespace) -> int:
    from . import build
    from .kernelbench import evaluate

    build.require_gpu()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    line = evaluate(args.file, trials=args.trials, dtype=dtype)
    print(line)
    return 0 if ": correct" in line else 1


def notebooks(args: argparse.Namespace) -> int:
    from . import build
    from .notebooks import execute_in_place

    if not args.allow_cpu:
        build.require_gpu()
    print("\n".join(execute_in_place()))
    return 0


def _sweep_shapes() -> list[str]:
    from .sweep import SHAPES

    return list(SHAPES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mla_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="what this machine can build and run").set_defaults(run=doctor)

    p = sub.add_parser("toolkit", help="the CUDA compiler the course builds with; `install` gets the pip wheels of torch's CUDA")
    p.add_argument("action", nargs="?", choices=["install"], help="pip-install the matching compiler wheels")
    p.set_defaults(run=toolkit)

    p = sub.add_parser("check", help="check steps on the whole shape matrix (GPU)")
    p.add_argument("steps", nargs="*", help="step numbers or names (default: all)")
    p.add_argument("--variant", default="solution", choices=["solution", "exercise"])
    p.add_argument("--quick", action="store_true", help="small odd shapes, one trial (for sanitizers)")
    p.set_defaults(run=check_steps)

    p = sub.add_parser("grade", help="grade exercises")
    p.add_argument("exercises", nargs="*", help="e.g. ex05 (the exercise of step 5)")
    p.add_argument("--all", action="store_true", help="every exercise")
    p.add_argument("--variant", choices=["exercise", "solution"], default=None)
    p.add_argument("--expect-stubs", action="store_true", help="succeed only if all are unfilled stubs")
    p.add_argument("--sanitize", action="store_true",
                   help="run compute-sanitizer's memcheck, racecheck, synccheck and initcheck instead (GPU)")
    p.set_defaults(run=grade)

    p = sub.add_parser("profile", help="Nsight Compute profiles: every step into results/profiles/ (make profile), or one exercise (GPU)")
    p.add_argument("exercise", nargs="?", help="e.g. ex05: your kernel, where counters can be read, beside the stored one")
    p.add_argument("--variant", default="solution", choices=["solution", "exercise"], help=argparse.SUPPRESS)
    p.add_argument("--calls", help=argparse.SUPPRESS)  # the child ncu watches (mla_lab.profile.calls)
    p.set_defaults(run=profile)

    p = sub.add_parser("hint", help="a hint for an exercise: 1 the idea, 2 the skeleton, 3 one part's solution")
    p.add_argument("exercise", help="e.g. ex05")
    p.add_argument("level", nargs="?", type=int, default=1, choices=[1, 2, 3])
    p.add_argument("--part", type=int, help="only this part (level 3: which part's solution; default the first)")
    p.set_defaults(run=hint)

    p = sub.add_parser("exercises", help="make exercises/ from solutions/")
    p.add_argument("--check", action="store_true", help="only report whether they are in sync")
    p.add_argument("--force", action="store_true", help="overwrite edited exercises")
    p.set_defaults(run=exercises)

    p = sub.add_parser("bench", help="the benchmark sweep: every step and peer, checked and timed, to JSON (GPU)")
    p.add_argument("steps", nargs="*", help="step numbers or names (default: all)")
    p.add_argument("--shapes", nargs="*", metavar="SHAPE", help="sweep shapes (default: all): " + ", ".join(_sweep_shapes()))
    p.add_argument("--dtypes", nargs="*", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--modes", nargs="*", default=["graph", "stream"], choices=["graph", "stream"])
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile peer")
    p.add_argument("--no-peers", action="store_true", help="time the steps only")
    p.add_argument("--out", help="JSON file to write (default: results/<device>.json)")
    p.add_argument("--resume", action="store_true",
                   help="go on with the sweep that a time limit cut short (the same GPU model, sources and plan), "
                        "from its checkpoint in build/sweep/")
    p.add_argument("--stop-after", type=float, metavar="SECONDS",
                   help="start no point after this many seconds (the checkpoint keeps what was measured; "
                        "--resume goes on): for sittings with a time limit")
    p.add_argument("--compare", action="store_true",
                   help="your exercises at a few points beside the stored run of this GPU: is a difference the GPU or the kernel?")
    p.add_argument("--solutions", action="store_true", help="with --compare: the solutions instead of your files")
    p.add_argument("--command-line", help=argparse.SUPPRESS)
    p.set_defaults(run=bench)

    p = sub.add_parser("results", help="README results table and plots from results/*.json (CPU)")
    p.add_argument("files", nargs="*", help="results JSON files (default: results/*.json; the newest makes the README table)")
    p.add_argument("--check", action="store_true", help="only check that README.md's table matches the JSON")
    p.add_argument("--fingerprint", action="store_true", help="print the digests of the code here (compare with a JSON's meta.fingerprint)")
    p.set_defaults(run=results)

    p = sub.add_parser("sass", help="compare every step's machine code with another commit's (nvcc, cuobjdump; CPU)")
    p.add_argument("--against", default="HEAD", help="the commit to compare with (default: HEAD)")
    p.set_defaults(run=sass)

    p = sub.add_parser("ab", help="one step as another commit had it beside this checkout's, checked then timed in one process (GPU)")
    p.add_argument("step", help="the step's number or name")
    p.add_argument("--against", required=True, metavar="REV", help="the commit to compare with (a hash, HEAD~1, a branch), "
                   "or, where the checkout has no history, a file holding the step's older source (git show REV:PATH > FILE)")
    p.add_argument("--points", nargs="+", metavar="POINT", help='sweep points such as "v2_lite@128 bf16" (default: few '
                   "tokens to prefill at the three real widths, in --dtype)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.set_defaults(run=ab)

    p = sub.add_parser("candidates", help="each prepared change in kernels/candidates/ beside its step, checked, timed and "
                       "kept or rejected by its own rule, and each probe timed (GPU; --list: CPU)")
    p.add_argument("names", nargs="*", metavar="NAME", help="candidates by file stem, such as 12_bf16_latent (default: all)")
    p.add_argument("--list", action="store_true", help="only read each candidate and apply it to its step (CPU)")
    p.add_argument("--round", action="store_true", help="the kept diffs and every kept candidate applied to this "
                   "working tree, copies kept in build/gpu-round/; replayed there if a sitting already played it (GPU)")
    p.add_argument("--replay", action="store_true", help="apply a round played elsewhere (build/gpu-round/) to this "
                   "checkout and delete what it landed from kernels/candidates/ (CPU)")
    p.set_defaults(run=candidates)

    p = sub.add_parser("gpu-check", help="the whole GPU validation, ending with a table (GPU; see mla_lab/gpu_check.py)")
    p.add_argument("parts", nargs="*", choices=["validate", "lane", "results", "round"],
                   help="default: validate, lane and results; round lands kernels/candidates/ (make gpu-round)")
    p.add_argument("--only", nargs="*", metavar="STAGE", help="only these stages (the names in the table)")
    p.add_argument("--sitting", type=float, metavar="SECONDS",
                   help="the time this machine is lent for: no stage starts that might not end in it, and a sweep "
                        "cut short goes on when the command runs again")
    p.set_defaults(run=gpu_check)

    p = sub.add_parser("kernelbench", help="evaluate a KernelBench-style ModelNew file against Model (GPU)")
    p.add_argument("file", help="a .py file defining ModelNew (e.g. kernels/kernelbench_mla.py)")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.set_defaults(run=kernelbench)

    p = sub.add_parser("notebooks", help="re-execute every notebook in place (on a GPU machine)")
    p.add_argument("--allow-cpu", action="store_true", help="run even without a GPU")
    p.set_defaults(run=notebooks)

    args = parser.parse_args(argv)
    if args.command == "grade" and not (args.all or args.exercises):
        parser.error("grade needs exercise ids (ex01, ex05, ...) or --all")
    from .ab import ABProblem
    from .build import SetupProblem

    try:
        return args.run(args)
    except (SetupProblem, ABProblem) as problem:
        print(f"mla_lab: {problem}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
