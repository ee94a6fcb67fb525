"""python -m mla_lab doctor | check | grade | exercises | bench | kernelbench | notebooks"""

from __future__ import annotations

import argparse
import sys

import torch


def doctor(_: argparse.Namespace) -> int:
    from .build import setup_report

    print(setup_report())
    return 0


def check_steps(args: argparse.Namespace) -> int:
    from . import build, check, steps

    build.require_gpu()
    failures = 0
    for key in args.steps or [s.number for s in steps.STEPS]:
        kernel = steps.load(key, args.variant)
        shapes, trials = (check.QUICK_SHAPES, 1) if args.quick else (check.SHAPE_MATRIX, 2)
        verdicts = check.check_matrix(kernel, "cuda", shapes, trials=trials)
        bad = [v for v in verdicts if not v.ok]
        failures += len(bad)
        worst = max(v.rel_error for v in verdicts)
        print(f"{kernel.step.label}: {len(verdicts) - len(bad)}/{len(verdicts)} checks passed, worst rel. error {worst:.1e}")
        for verdict in bad:
            print(f"  {verdict}")
    return 1 if failures else 0


def grade(args: argparse.Namespace) -> int:
    from . import steps
    from .grade import grade as grade_one

    names = [s.exercise for s in steps.exercises()] if args.all else args.exercises
    results = [grade_one(name, args.variant) for name in names]
    expected = "not implemented" if args.expect_stubs else "correct"
    return 0 if all(r.status == expected for r in results) else 1


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
    from . import bench as b, build, problem, steps

    build.require_gpu()
    shape = problem.preset(args.preset, args.batch, args.seq)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    kernels = {steps.get(k).label: steps.load(k) for k in args.steps or [s.number for s in steps.STEPS]}
    print(f"{shape.label()} {args.dtype}, {args.mode} mode, on {b.device_line()}")
    print(b.table(b.compare(kernels, shape, dtype, args.mode)))
    return 0


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mla_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="what this machine can build and run").set_defaults(run=doctor)

    p = sub.add_parser("check", help="check steps on the whole shape matrix (GPU)")
    p.add_argument("steps", nargs="*", help="step numbers or names (default: all)")
    p.add_argument("--variant", default="solution", choices=["solution", "exercise"])
    p.add_argument("--quick", action="store_true", help="small odd shapes, one trial (for sanitizers)")
    p.set_defaults(run=check_steps)

    p = sub.add_parser("grade", help="grade exercises")
    p.add_argument("exercises", nargs="*", help="e.g. ex01")
    p.add_argument("--all", action="store_true", help="every exercise")
    p.add_argument("--variant", choices=["exercise", "solution"], default=None)
    p.add_argument("--expect-stubs", action="store_true", help="succeed only if all are unfilled stubs")
    p.set_defaults(run=grade)

    p = sub.add_parser("exercises", help="make exercises/ from solutions/")
    p.add_argument("--check", action="store_true", help="only report whether they are in sync")
    p.add_argument("--force", action="store_true", help="overwrite edited exercises")
    p.set_defaults(run=exercises)

    p = sub.add_parser("bench", help="time steps beside eager and cuBLAS on one shape (GPU)")
    p.add_argument("steps", nargs="*")
    p.add_argument("--preset", default="toy")
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--mode", default="graph", choices=["graph", "stream"])
    p.set_defaults(run=bench)

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
        parser.error("grade needs exercise names (ex01 ...) or --all")
    from .build import SetupProblem

    try:
        return args.run(args)
    except SetupProblem as problem:
        print(f"mla_lab: {problem}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
