"""MLA Lab: support code for the course (problem, layout, build, check, bench, grade)."""

import os

# The profiler (notebook 01) logs from C++ to stderr: start and stop markers, and on a machine
# without a GPU "gpuGetDeviceCount failed" (torch 2.14). nbval compares stderr, and a learner
# should not read an error that is not one. Level 6 is above every message; set it to see them.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

from . import bench, build, check, dispatch, layout, plots, problem, steps  # noqa: E402
from .build import gpu_ready, setup_report
from .dispatch import prepare, project
from .grade import grade
from .hints import hint
from .problem import PRESETS, TOY, V2_LITE, V3, V3_TP8, Shape, make_inputs, oracle, preset, reference

__all__ = [
    "PRESETS", "TOY", "V2_LITE", "V3", "V3_TP8", "Shape", "bench", "build", "check", "grade",
    "dispatch", "gpu_ready", "hint", "layout", "make_inputs", "oracle", "plots", "prepare", "preset", "problem", "project", "reference",
    "setup_report", "steps",
]
